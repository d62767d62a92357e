//! A read of a device tensor started ahead of the work that follows it.

use burn::tensor::TensorData;

/// A read of a device tensor that [`FusedOps::start_read`](super::FusedOps::start_read)
/// started: its copy to the host is queued behind the work queued before it, and
/// [`wait`](Self::wait) waits for that copy alone, not for what was queued after it.
#[must_use = "a started read is only useful when waited for"]
pub struct PendingRead(Box<dyn FnOnce() -> TensorData + Send>);

impl PendingRead {
    /// A read whose data `wait` produces (blocking until the copy is done).
    pub fn new(wait: impl FnOnce() -> TensorData + Send + 'static) -> Self {
        Self(Box::new(wait))
    }

    /// A read already done.
    pub fn ready(data: TensorData) -> Self {
        Self::new(move || data)
    }

    /// The tensor's data, once its copy is done.
    pub fn wait(self) -> TensorData {
        (self.0)()
    }
}

impl core::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PendingRead")
    }
}
