//! Softmax and log-softmax under autodiff: the node keeps the forward's output, all the
//! fused backward needs.

use crate::ops::FusedOps;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

#[derive(Debug)]
struct SoftmaxBackward {
    log: bool,
}

impl<B: FusedOps> Backward<B, 1> for SoftmaxBackward {
    /// The forward's output.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let output = ops.state;
        let log = self.log;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            if log {
                B::fused_log_softmax_backward(grad, output)
            } else {
                B::fused_softmax_backward(grad, output)
            }
        });
    }
}

pub(crate) fn softmax<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    log: bool,
) -> FloatTensor<Autodiff<B, C>> {
    let output = if log {
        B::fused_log_softmax(x.primitive.clone())
    } else {
        B::fused_softmax(x.primitive.clone())
    };
    let node = SoftmaxBackward { log };
    match node
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(output.clone(), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
