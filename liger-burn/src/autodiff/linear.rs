//! Backward node of the linear layer with a bias: `grad_x = g · weightᵀ` by
//! `B::fused_matmul`, and the weight's and the bias's gradients together by
//! `B::fused_linear_weight_backward` (one product that also reduces `g`). The node keeps
//! `weight` only when `x` needs a gradient and `x` only when the weight does.

use super::matmul::transposed;
use crate::ops::FusedOps;
use crate::ops::compose::linear::bias_grad;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct LinearBackward;

impl<B: FusedOps> Backward<B, 3> for LinearBackward {
    /// `x` (kept when the weight is tracked) and `weight` (kept when `x` is).
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight) = ops.state;
        let [x_node, weight_node, bias_node] = ops.parents;
        if let Some(node) = x_node {
            let weight = weight.expect("the weight is kept when x is tracked");
            let g = B::fused_matmul(grad.clone(), transposed::<B>(weight));
            grads.register::<B>(node.id, g);
        }
        match (weight_node, bias_node) {
            (Some(weight_node), bias_node) => {
                let x = x.expect("x is kept when the weight is tracked");
                let (g_weight, g_bias) = B::fused_linear_weight_backward(x, grad);
                grads.register::<B>(weight_node.id, g_weight);
                if let Some(node) = bias_node {
                    grads.register::<B>(node.id, g_bias);
                }
            }
            (None, Some(bias_node)) => grads.register::<B>(bias_node.id, bias_grad::<B>(grad)),
            (None, None) => {}
        }
    }
}

/// `fused_linear` for `Autodiff<B>`.
pub(crate) fn linear<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_linear(
        x.primitive.clone(),
        weight.primitive.clone(),
        bias.primitive.clone(),
    );
    let (x_tracked, weight_tracked) = (x.is_tracked(), weight.is_tracked());
    match LinearBackward
        .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = (
                weight_tracked.then(|| x.primitive.clone()),
                x_tracked.then(|| weight.primitive.clone()),
            );
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
