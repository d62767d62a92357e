//! The matrix product for `Autodiff<B>`: `B`'s `fused_matmul` forward and a node whose
//! two products are `B::fused_matmul` too, `grad_lhs = g · rhsᵀ` and
//! `grad_rhs = lhsᵀ · g` (transposes are views, which the CUDA path reads through
//! cuBLASLt's transpose flags), each summed over the batch dimensions its operand was
//! broadcast in, as Burn's own matmul node does. When both operands are 2-D and both
//! need a gradient, the two products are one `B::fused_matmul_backward` call. The node
//! keeps `rhs` only when `lhs` needs a gradient and `lhs` only when `rhs` does.

use crate::ops::FusedOps;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, broadcast_shape};

#[derive(Debug)]
struct MatmulBackward;

/// `[..., a, b]` → `[..., b, a]`, a view.
pub(crate) fn transposed<B: FusedOps>(x: FloatTensor<B>) -> FloatTensor<B> {
    let rank = x.shape().num_dims();
    B::float_swap_dims(x, rank - 2, rank - 1)
}

/// Sums `grad` over the batch dimensions in which `shape` is 1 and `grad` is not.
fn unbroadcast<B: FusedOps>(grad: FloatTensor<B>, shape: &Shape) -> FloatTensor<B> {
    if grad.shape() == *shape {
        grad
    } else {
        broadcast_shape::<B>(grad, shape)
    }
}

impl<B: FusedOps> Backward<B, 2> for MatmulBackward {
    /// `lhs` (kept when `rhs` is tracked), `rhs` (kept when `lhs` is tracked), and both
    /// input shapes.
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, Shape, Shape);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (lhs, rhs, lhs_shape, rhs_shape) = ops.state;
        let [lhs_node, rhs_node] = ops.parents;
        // Both gradients of a 2-D product (a linear layer's folded rows) in one call: on
        // CUDA one chain of cuBLASLt products under one ordering.
        if let (Some(lhs_node), Some(rhs_node), Some(lhs), Some(rhs)) =
            (&lhs_node, &rhs_node, &lhs, &rhs)
            && lhs_shape.num_dims() == 2
            && rhs_shape.num_dims() == 2
        {
            let (grad_lhs, grad_rhs) = B::fused_matmul_backward(lhs.clone(), rhs.clone(), grad);
            grads.register::<B>(lhs_node.id, grad_lhs);
            grads.register::<B>(rhs_node.id, grad_rhs);
            return;
        }
        if let Some(node) = rhs_node {
            let lhs = lhs.expect("lhs is kept when rhs is tracked");
            let g = B::fused_matmul(transposed::<B>(lhs), grad.clone());
            grads.register::<B>(node.id, unbroadcast::<B>(g, &rhs_shape));
        }
        if let Some(node) = lhs_node {
            let rhs = rhs.expect("rhs is kept when lhs is tracked");
            let g = B::fused_matmul(grad, transposed::<B>(rhs));
            grads.register::<B>(node.id, unbroadcast::<B>(g, &lhs_shape));
        }
    }
}

/// `fused_matmul` for `Autodiff<B>`.
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    lhs: FloatTensor<Autodiff<B, C>>,
    rhs: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_matmul(lhs.primitive.clone(), rhs.primitive.clone());
    let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
    match MatmulBackward
        .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = (
                rhs_tracked.then(|| lhs.primitive.clone()),
                lhs_tracked.then(|| rhs.primitive.clone()),
                lhs.primitive.shape(),
                rhs.primitive.shape(),
            );
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
