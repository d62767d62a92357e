//! Attention for `Autodiff<B>`: the node keeps q, k, v and the mask if one was given (q, k, v linear in the
//! sequence), never the probabilities; its backward recomputes them block by block
//! (see [`compose::attention`](crate::ops::compose::attention)).

use crate::ops::{AttentionGrads, AttentionOptions, FusedOps};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{BoolTensor, FloatTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct AttentionBackward {
    options: AttentionOptions,
}

impl<B: FusedOps> Backward<B, 3> for AttentionBackward {
    /// q, k, v, mask.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        Option<BoolTensor<B>>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (q, k, v, mask) = ops.state;
        let AttentionGrads {
            grad_q,
            grad_k,
            grad_v,
        } = B::fused_attention_backward(grad, q, k, v, mask, self.options);
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
    options: AttentionOptions,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_attention(
        q.primitive.clone(),
        k.primitive.clone(),
        v.primitive.clone(),
        mask.clone(),
        options,
    );
    let node = AttentionBackward { options };
    match node
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            prep.finish((q.primitive, k.primitive, v.primitive, mask), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Second-order gradients are not provided: the result is a constant of the graph.
pub(crate) fn backward<B: FusedOps, C: CheckpointStrategy>(
    grad_output: FloatTensor<Autodiff<B, C>>,
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    mask: Option<BoolTensor<Autodiff<B, C>>>,
    options: AttentionOptions,
) -> AttentionGrads<Autodiff<B, C>> {
    let g = B::fused_attention_backward(
        grad_output.primitive,
        q.primitive,
        k.primitive,
        v.primitive,
        mask,
        options,
    );
    AttentionGrads {
        grad_q: Autodiff::<B, C>::from_inner(g.grad_q),
        grad_k: Autodiff::<B, C>::from_inner(g.grad_k),
        grad_v: Autodiff::<B, C>::from_inner(g.grad_v),
    }
}
