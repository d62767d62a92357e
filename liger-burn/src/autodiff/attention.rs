//! Attention for `Autodiff<B>`: the node keeps q, k, v, the mask and the document ids if
//! given (all linear in the sequence but the mask) and, after the flash kernels, the
//! output and `lse` (`[batch, q_heads, seq]`): never probabilities. The backward is the
//! flash backward from `lse`, or the blockwise recomputation (see
//! [`compose::attention`](crate::ops::compose::attention)).

use crate::ops::{AttentionGrads, AttentionOptions, AttentionOutput, FusedOps};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct AttentionBackward {
    options: AttentionOptions,
}

/// What the node keeps.
#[derive(Debug, Clone)]
struct Saved<B: FusedOps> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: Option<BoolTensor<B>>,
    document_ids: Option<IntTensor<B>>,
    /// The output and `lse`, when the forward ran the flash kernels.
    forward: Option<AttentionOutput<B>>,
}

impl<B: FusedOps> Backward<B, 3> for AttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let AttentionGrads {
            grad_q,
            grad_k,
            grad_v,
        } = B::fused_attention_backward(
            grad,
            s.q,
            s.k,
            s.v,
            s.mask,
            s.document_ids,
            s.forward,
            self.options,
        );
        for (parent, g) in ops.parents.iter().zip([grad_q, grad_k, grad_v]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

/// `fused_attention` for `Autodiff<B>`.
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    mask: Option<BoolTensor<Autodiff<B, C>>>,
    document_ids: Option<IntTensor<Autodiff<B, C>>>,
    options: AttentionOptions,
) -> AttentionOutput<Autodiff<B, C>> {
    let out = B::fused_attention(
        q.primitive.clone(),
        k.primitive.clone(),
        v.primitive.clone(),
        mask.clone(),
        document_ids.clone(),
        options,
    );
    let lse = out.lse.clone();
    let node = AttentionBackward { options };
    let output = match node
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let output = out.output.clone();
            let forward = out.lse.is_some().then_some(out);
            let saved = Saved {
                q: q.primitive,
                k: k.primitive,
                v: v.primitive,
                mask,
                document_ids,
                forward,
            };
            prep.finish(saved, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(out.output),
    };
    AttentionOutput {
        output,
        lse: lse.map(Autodiff::<B, C>::from_inner),
    }
}

/// Second-order gradients are not provided: the result is a constant of the graph.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<B: FusedOps, C: CheckpointStrategy>(
    grad_output: FloatTensor<Autodiff<B, C>>,
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    mask: Option<BoolTensor<Autodiff<B, C>>>,
    document_ids: Option<IntTensor<Autodiff<B, C>>>,
    forward: Option<AttentionOutput<Autodiff<B, C>>>,
    options: AttentionOptions,
) -> AttentionGrads<Autodiff<B, C>> {
    let forward = forward.map(|f| AttentionOutput {
        output: f.output.primitive,
        lse: f.lse.map(|l| l.primitive),
    });
    let g = B::fused_attention_backward(
        grad_output.primitive,
        q.primitive,
        k.primitive,
        v.primitive,
        mask,
        document_ids,
        forward,
        options,
    );
    AttentionGrads {
        grad_q: Autodiff::<B, C>::from_inner(g.grad_q),
        grad_k: Autodiff::<B, C>::from_inner(g.grad_k),
        grad_v: Autodiff::<B, C>::from_inner(g.grad_v),
    }
}

/// `flash_attention_variant` for `Autodiff<B>`: `B`'s.
pub(crate) fn flash_variant<B: FusedOps>(
    device: &B::Device,
    dtype: burn::tensor::DType,
    head_dim: usize,
    options: &AttentionOptions,
) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
    B::flash_attention_variant(device, dtype, head_dim, options)
}
