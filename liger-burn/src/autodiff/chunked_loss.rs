//! The backward node of the chunked post-training losses (preference, KTO, GRPO,
//! distillation): their forward computes every gradient of the scalar loss chunk by chunk
//! (inside `B`'s primitive), and the node only scales them by the upstream gradient, or
//! hands them over untouched when it is exactly 1 (Liger-Kernel's backward).

use crate::ops::FusedOps;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, ElementConversion, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// The stored gradients of the parents (x, weight, bias), for an upstream gradient of 1.
type State<B> = [Option<FloatTensor<B>>; 3];

#[derive(Debug)]
struct StoredGradientsBackward;

impl<B: FusedOps, const N: usize> Backward<B, N> for StoredGradientsBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<B>(&ops.node);
        // A scalar loss: its upstream gradient is one value (4 bytes read back).
        let g = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upstream))
            .into_data()
            .iter::<f64>()
            .next()
            .expect("a scalar upstream gradient");
        let values = if g == 1.0 {
            ops.state
        } else {
            ops.state.map(|t| t.map(|t| scale::<B>(t, g)))
        };
        for (parent, value) in ops.parents.iter().zip(values) {
            if let (Some(node), Some(value)) = (parent, value) {
                grads.register::<B>(node.id, value);
            }
        }
    }
}

/// `t · g` computed in f32, stored in `t`'s dtype (any rank).
fn scale<B: FusedOps>(t: FloatTensor<B>, g: f64) -> FloatTensor<B> {
    let dtype = t.dtype();
    let shape = t.shape();
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(
        t,
        [shape.num_elements()].into(),
    )));
    let scaled = (flat.cast(DType::F32) * g.elem::<f64>()).cast(dtype);
    B::float_reshape(scaled.into_primitive().tensor(), shape)
}

/// Runs a chunked loss on `B` and tracks its `[1]` loss with the stored-gradient node:
/// `parents` are the autodiff tensors of x, the weight and the bias (where there is one),
/// `run(compute_grad)` the inner forward returning the loss, the gradients of the parents
/// in order, and the rest of the output. Gradients are computed exactly when a parent is
/// tracked.
pub(crate) fn track<B: FusedOps, C: CheckpointStrategy, T>(
    parents: [Option<&FloatTensor<Autodiff<B, C>>>; 3],
    run: impl FnOnce(bool) -> (FloatTensor<B>, State<B>, T),
) -> (FloatTensor<Autodiff<B, C>>, T) {
    let nodes: Vec<_> = parents.iter().flatten().map(|p| p.node.clone()).collect();
    match nodes.len() {
        2 => finish::<B, C, 2, T>(
            StoredGradientsBackward
                .prepare::<C>([nodes[0].clone(), nodes[1].clone()])
                .compute_bound()
                .stateful(),
            run,
        ),
        3 => finish::<B, C, 3, T>(
            StoredGradientsBackward
                .prepare::<C>([nodes[0].clone(), nodes[1].clone(), nodes[2].clone()])
                .compute_bound()
                .stateful(),
            run,
        ),
        n => unreachable!("a linear head has 2 or 3 parameters, got {n}"),
    }
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize, T>(
    kind: OpsKind<StoredGradientsBackward, B, State<B>, C, N>,
    run: impl FnOnce(bool) -> (FloatTensor<B>, State<B>, T),
) -> (FloatTensor<Autodiff<B, C>>, T) {
    match kind {
        OpsKind::Tracked(prep) => {
            let (loss, stored, rest) = run(true);
            let mut kept: State<B> = [None, None, None];
            // The state lists only the parents the node has (x, weight, then the bias).
            for (k, g) in stored.into_iter().flatten().enumerate().take(N) {
                kept[k] = Some(g);
            }
            (prep.finish(kept, loss), rest)
        }
        OpsKind::UnTracked(prep) => {
            let (loss, _, rest) = run(false);
            (prep.finish(loss), rest)
        }
    }
}
