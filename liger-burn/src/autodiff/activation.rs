//! Backward nodes of exact GELU (keeps the input) and sigmoid (keeps the output).

use crate::ops::FusedOps;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

#[derive(Debug)]
struct GeluBackward;

impl<B: FusedOps> Backward<B, 1> for GeluBackward {
    /// The forward's input.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fused_gelu_backward(grad, x)
        });
    }
}

#[derive(Debug)]
struct SigmoidBackward;

impl<B: FusedOps> Backward<B, 1> for SigmoidBackward {
    /// The forward's output.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fused_sigmoid_backward(grad, y)
        });
    }
}

pub(crate) fn gelu<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_gelu(x.primitive.clone());
    match GeluBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(x.primitive, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

pub(crate) fn sigmoid<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_sigmoid(x.primitive.clone());
    match SigmoidBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(output.clone(), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
