//! RoPE for `Autodiff<B>`: one fused forward launch for q and k, and one fused backward
//! launch for both gradients.
//!
//! Burn's graph nodes have one output each, but the backward kernel wants both
//! gradients at once. So the forward records three nodes:
//!
//! ```text
//!   q ──┐                       ┌── RopeSlot(q) ── rotated q
//!       ├── RopeBackward (joint)┤
//!   k ──┘                       └── RopeSlot(k) ── rotated k
//! ```
//!
//! Each slot's backward stores its incoming gradient in a cell shared with the joint
//! node and registers a placeholder gradient for the joint node (the first slot only, so
//! it is registered once and never added to anything). The joint node is deeper in the
//! tape than both slots (its order is lower), so it runs after them; it takes whatever
//! gradients arrived and launches one fused backward. A rotated tensor that does not
//! reach the loss sends no gradient (its slot never runs): the backward then rotates only
//! the other one. An untracked parent gets no gradient computed for it.

use crate::ops::{FusedOps, RopeGrads, RopeLayout, RopeOutput};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use std::sync::{Arc, Mutex};

/// Gradients of the rotated q and k, handed from the slots to the joint node.
#[derive(Debug)]
struct Arrived<B: FusedOps> {
    grad_q: Option<FloatTensor<B>>,
    grad_k: Option<FloatTensor<B>>,
    /// Whether a slot already registered the joint node's placeholder gradient.
    announced: bool,
}

type Cell<B> = Arc<Mutex<Arrived<B>>>;

/// The joint node: parents q and k.
#[derive(Debug)]
struct RopeBackward;

impl<B: FusedOps> Backward<B, 2> for RopeBackward {
    /// cos, sin, layout, the cell the slots fill.
    type State = (FloatTensor<B>, FloatTensor<B>, RopeLayout, Cell<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        // The placeholder a slot registered: only its presence matters.
        let _ = grads.consume::<B>(&ops.node);
        let (cos, sin, layout, cell) = ops.state;
        let (grad_q, grad_k) = {
            let mut arrived = cell.lock().unwrap_or_else(|e| e.into_inner());
            arrived.announced = false;
            (arrived.grad_q.take(), arrived.grad_k.take())
        };
        let [q_node, k_node] = ops.parents;
        // Only the gradients of tracked parents are computed.
        let grad_q = grad_q.filter(|_| q_node.is_some());
        let grad_k = grad_k.filter(|_| k_node.is_some());
        let RopeGrads { grad_q, grad_k } = B::fused_rope_backward(grad_q, grad_k, cos, sin, layout);
        if let (Some(node), Some(g)) = (q_node, grad_q) {
            grads.register::<B>(node.id, g);
        }
        if let (Some(node), Some(g)) = (k_node, grad_k) {
            grads.register::<B>(node.id, g);
        }
    }
}

/// One output of the joint node (`is_k` picks which).
#[derive(Debug)]
struct RopeSlot {
    is_k: bool,
}

impl<B: FusedOps> Backward<B, 1> for RopeSlot {
    type State = Cell<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [joint] = ops.parents;
        let Some(joint) = joint else { return };
        let mut arrived = ops.state.lock().unwrap_or_else(|e| e.into_inner());
        if !arrived.announced {
            arrived.announced = true;
            // Any tensor will do (the joint node drops it); this one costs nothing.
            grads.register::<B>(joint.id, grad.clone());
        }
        let slot = if self.is_k {
            &mut arrived.grad_k
        } else {
            &mut arrived.grad_q
        };
        // A slot runs once per backward pass; accumulate anyway, for safety.
        *slot = Some(match slot.take() {
            Some(previous) => B::float_add(previous, grad),
            None => grad,
        });
    }
}

/// `fused_rope` for `Autodiff<B>`.
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    cos: FloatTensor<Autodiff<B, C>>,
    sin: FloatTensor<Autodiff<B, C>>,
    layout: RopeLayout,
) -> RopeOutput<Autodiff<B, C>> {
    let out = B::fused_rope(
        q.primitive.clone(),
        k.primitive.clone(),
        cos.primitive.clone(),
        sin.primitive.clone(),
        layout,
    );
    let cell: Cell<B> = Arc::new(Mutex::new(Arrived {
        grad_q: None,
        grad_k: None,
        announced: false,
    }));
    // The joint node's own tensor is never seen by the user; q's output stands in.
    let joint = match RopeBackward
        .prepare::<C>([q.node.clone(), k.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            (cos.primitive, sin.primitive, layout, cell.clone()),
            out.q.clone(),
        ),
        OpsKind::UnTracked(_) => {
            return RopeOutput {
                q: Autodiff::<B, C>::from_inner(out.q),
                k: Autodiff::<B, C>::from_inner(out.k),
            };
        }
    };
    let slot = |is_k: bool, output: FloatTensor<B>| match (RopeSlot { is_k })
        .prepare::<C>([joint.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(cell.clone(), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    RopeOutput {
        q: slot(false, out.q),
        k: slot(true, out.k),
    }
}

/// `fused_rope_backward` for `Autodiff<B>`: no second-order gradients (the result is a
/// constant of the graph).
pub(crate) fn backward<B: FusedOps, C: CheckpointStrategy>(
    grad_q: Option<FloatTensor<Autodiff<B, C>>>,
    grad_k: Option<FloatTensor<Autodiff<B, C>>>,
    cos: FloatTensor<Autodiff<B, C>>,
    sin: FloatTensor<Autodiff<B, C>>,
    layout: RopeLayout,
) -> RopeGrads<Autodiff<B, C>> {
    let g = B::fused_rope_backward(
        grad_q.map(|g| g.primitive),
        grad_k.map(|g| g.primitive),
        cos.primitive,
        sin.primitive,
        layout,
    );
    RopeGrads {
        grad_q: g.grad_q.map(Autodiff::<B, C>::from_inner),
        grad_k: g.grad_k.map(Autodiff::<B, C>::from_inner),
    }
}
