//! Backward nodes of the gated linear units.
//!
//! The GLU node keeps `gate` and `up` (the tensors the forward read anyway) and recomputes
//! the activation in the backward kernel. When only `up` is tracked its gradient
//! `grad * act(gate)` is the forward kernel applied to `(gate, grad)`, one output instead
//! of two; when only `gate` is tracked the fused backward runs and `grad_up` is dropped.

use crate::ops::{FusedOps, GluActivation, GluGrads};
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
