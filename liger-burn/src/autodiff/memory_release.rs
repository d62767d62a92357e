//! Backward node of [`FusedOps::memory_release_point`]: passes the gradient through and,
//! first, hands the device pool's free buffers back to the device.

use crate::ops::FusedOps;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};

#[derive(Debug)]
struct MemoryReleaseBackward;

impl<B: FusedOps> Backward<B, 1> for MemoryReleaseBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        // The backwards of the ops between this point and the next one have run: what they
        // kept is free now.
        B::memory_cleanup(&B::float_device(&grad));
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::count_memory_release();
        if let [Some(parent)] = ops.parents {
            grads.register::<B>(parent.id, grad);
        }
    }
}

pub(crate) fn release_point<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    MemoryReleaseBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateless(x.primitive)
}
