//! When work liger-burn queues is handed to the device's threads.
//!
//! Burn's fusion client and CubeCL 0.10's device client queue tasks and hand them to their
//! device threads 32 at a time or at a blocking call. A fused kernel or a vendor library's
//! product is large and is often what the device waits for, so liger-burn can hand on the
//! queue it joins without waiting for the thread that takes it. Handing on costs the
//! calling thread little, but each hand-off fills the rest of the 32-task batch and wakes
//! the device thread for one task; left to the runtime, the device thread takes its tasks
//! in batches, later.

/// When queued work is handed on to the device's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOff {
    /// As the runtimes batch it: 32 tasks at a time or at a blocking call.
    Runtime,
    /// Its kernel's launch: when the fusion stream runs a fused operation, the inner
    /// backend's queue is handed on from the stream's thread; a vendor product queued on
    /// CubeCL's device thread is handed on as it is queued.
    Kernels,
    /// Also the fused operation itself: the fusion stream's queue is handed on from the
    /// caller's thread when it is registered; the caller's next task may then wait for
    /// the stream's thread to take the batch.
    Operations,
}

/// The hand-off liger-burn uses.
pub const HAND_OFF: HandOff = HandOff::Kernels;

/// The hand-off of work queued from the calling thread: [`HAND_OFF`], or the test hooks'
/// override of this thread.
pub(crate) fn current() -> HandOff {
    #[cfg(feature = "test-hooks")]
    if let Some(hand_off) = crate::test_hooks::hand_off_override() {
        return hand_off;
    }
    HAND_OFF
}
