//! Backward nodes of the gated linear units.
//!
//! The GLU node keeps `gate` and `up` (the tensors the forward read anyway) and recomputes
//! the activation in the backward kernel. When only `up` is tracked its gradient
//! `grad * act(gate)` is the forward kernel applied to `(gate, grad)`, one output instead
//! of two; when only `gate` is tracked the fused backward runs and `grad_up` is dropped.
//!
//! The GLU-linear node (the MLP's down projection on the gated unit) keeps `gate`, `up`
//! and the weight, not the gated unit's output: the backward recomputes it (one more
//! elementwise pass over `[rows, d_ff]`) for the weight's gradient, which saves the
//! `[rows, d_ff]` tensor per layer that a linear node after the GLU node would keep.

use super::matmul::transposed;
use crate::ops::compose::glu::as_rows;
use crate::ops::{FusedOps, GluActivation, GluGrads};
use burn::tensor::Shape;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct GluBackward {
    activation: GluActivation,
}

impl<B: FusedOps> Backward<B, 2> for GluBackward {
    /// `gate`, `up`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        match ops.parents {
            [Some(gate_node), up_node] => {
                let g = B::fused_glu_backward(grad, gate, up, self.activation);
                grads.register::<B>(gate_node.id, g.grad_gate);
                if let Some(up_node) = up_node {
                    grads.register::<B>(up_node.id, g.grad_up);
                }
            }
            [None, Some(up_node)] => {
                grads.register::<B>(up_node.id, B::fused_glu(gate, grad, self.activation));
            }
            [None, None] => {}
        }
    }
}

pub(crate) fn glu<B: FusedOps, C: CheckpointStrategy>(
    gate: FloatTensor<Autodiff<B, C>>,
    up: FloatTensor<Autodiff<B, C>>,
    activation: GluActivation,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_glu(gate.primitive.clone(), up.primitive.clone(), activation);
    let node = GluBackward { activation };
    match node
        .prepare::<C>([gate.node.clone(), up.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((gate.primitive, up.primitive), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Second-order gradients are not provided: the result is a constant of the graph.
pub(crate) fn glu_backward<B: FusedOps, C: CheckpointStrategy>(
    grad_output: FloatTensor<Autodiff<B, C>>,
    gate: FloatTensor<Autodiff<B, C>>,
    up: FloatTensor<Autodiff<B, C>>,
    activation: GluActivation,
) -> GluGrads<Autodiff<B, C>> {
    let g = B::fused_glu_backward(
        grad_output.primitive,
        gate.primitive,
        up.primitive,
        activation,
    );
    GluGrads {
        grad_gate: Autodiff::<B, C>::from_inner(g.grad_gate),
        grad_up: Autodiff::<B, C>::from_inner(g.grad_up),
    }
}

#[derive(Debug)]
struct GluLinearBackward {
    activation: GluActivation,
}

impl<B: FusedOps> Backward<B, 3> for GluLinearBackward {
    /// `gate`, `up`, and the weight when `gate` or `up` is tracked.
    type State = (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (gate, up, weight) = ops.state;
        let [gate_node, up_node, weight_node] = ops.parents;
        let (grad, _) = as_rows::<B>(grad);
        let (gate, dims) = as_rows::<B>(gate);
        let (up, _) = as_rows::<B>(up);
        let back = |x: FloatTensor<B>| B::float_reshape(x, Shape::from(dims.clone()));
        // The weight's gradient `unitᵀ · grad` reads the unit, recomputed: with the gate's
        // gradient in the same pass over `gate` and `up` when both are wanted.
        let weight_grad = |unit: FloatTensor<B>, grad: FloatTensor<B>, grads: &mut Gradients| {
            if let Some(node) = &weight_node {
                grads.register::<B>(node.id, B::fused_matmul(transposed::<B>(unit), grad));
            }
        };
        if gate_node.is_none() && up_node.is_none() {
            let unit = B::fused_glu(gate, up, self.activation);
            weight_grad(unit, grad, grads);
            return;
        }
        let weight = weight.expect("the weight is kept when gate or up is tracked");
        let grad_unit = B::fused_matmul(grad.clone(), transposed::<B>(weight));
        match (gate_node, up_node) {
            (Some(gate_node), up_node) => {
                let g = if weight_node.is_some() {
                    let (g, unit) =
                        B::fused_glu_backward_with_unit(grad_unit, gate, up, self.activation);
                    weight_grad(unit, grad, grads);
                    g
                } else {
                    B::fused_glu_backward(grad_unit, gate, up, self.activation)
                };
                grads.register::<B>(gate_node.id, back(g.grad_gate));
                if let Some(up_node) = up_node {
                    grads.register::<B>(up_node.id, back(g.grad_up));
                }
            }
            (None, Some(up_node)) => {
                if weight_node.is_some() {
                    let unit = B::fused_glu(gate.clone(), up, self.activation);
                    weight_grad(unit, grad, grads);
                }
                let g = B::fused_glu(gate, grad_unit, self.activation);
                grads.register::<B>(up_node.id, back(g));
            }
            (None, None) => {}
        }
    }
}

pub(crate) fn glu_linear<B: FusedOps, C: CheckpointStrategy>(
    gate: FloatTensor<Autodiff<B, C>>,
    up: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    activation: GluActivation,
) -> FloatTensor<Autodiff<B, C>> {
    let output = B::fused_glu_linear(
        gate.primitive.clone(),
        up.primitive.clone(),
        weight.primitive.clone(),
        activation,
    );
    let input_tracked = gate.is_tracked() || up.is_tracked();
    let node = GluLinearBackward { activation };
    match node
        .prepare::<C>([gate.node.clone(), up.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            (
                gate.primitive,
                up.primitive,
                input_tracked.then_some(weight.primitive),
            ),
            output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
