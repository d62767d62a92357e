//! Divergences on `Autodiff<B>`: `B`'s forward computes the gradient of the input with the
//! loss (Liger-Kernel's kernels do the same), and the node scales it by the upstream
//! gradient: a scalar for a reduced loss (handed over untouched when it is exactly 1),
//! elementwise otherwise (each value depends on its own element only).

use crate::ops::{DivergenceOptions, DivergenceOutput, DivergenceReduction, FusedOps};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct DivergenceBackward;

impl<B: FusedOps> Backward<B, 1> for DivergenceBackward {
    /// The gradient for an upstream gradient of 1, and whether the loss was reduced.
    type State = (FloatTensor<B>, bool);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<B>(&ops.node);
        let (stored, reduced) = ops.state;
        let dtype = stored.dtype();
        let stored = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(stored));
        let value = if reduced {
            let g = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upstream))
                .into_data()
                .iter::<f64>()
                .next()
                .expect("a scalar upstream gradient");
            if g == 1.0 {
                stored
            } else {
                (stored.cast(DType::F32) * g).cast(dtype)
            }
        } else {
            let g = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(upstream));
            (stored.cast(DType::F32) * g.cast(DType::F32)).cast(dtype)
        };
        if let Some(node) = &ops.parents[0] {
            grads.register::<B>(node.id, value.into_primitive().tensor());
        }
    }
}

pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    input: FloatTensor<Autodiff<B, C>>,
    target: FloatTensor<Autodiff<B, C>>,
    labels: Option<IntTensor<B>>,
    options: DivergenceOptions,
) -> DivergenceOutput<Autodiff<B, C>> {
    let reduced = options.reduction != DivergenceReduction::None;
    match DivergenceBackward
        .prepare::<C>([input.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = B::fused_divergence(input.primitive, target.primitive, labels, true, options);
            let grad = out.grad.clone().expect("a gradient was asked for");
            DivergenceOutput {
                loss: prep.finish((grad, reduced), out.loss),
                grad: out.grad.map(Autodiff::<B, C>::from_inner),
            }
        }
        OpsKind::UnTracked(prep) => {
            let out =
                B::fused_divergence(input.primitive, target.primitive, labels, false, options);
            DivergenceOutput {
                loss: prep.finish(out.loss),
                grad: None,
            }
        }
    }
}
