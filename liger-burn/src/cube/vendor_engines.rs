//! What the vendor libraries' engines share (cuBLASLt on CUDA, hipBLASLt on ROCm): one
//! engine per device, set up on first use (a failed setup is remembered, logged once as a
//! warning, and answered from then on without trying again), and how their failures and
//! attribute pointers are passed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A device's engine, or why it could not be set up.
type Entry<E> = Result<Arc<Mutex<E>>, String>;

/// The engines of one library, by device index.
pub(crate) struct PerDevice<E>(OnceLock<Mutex<HashMap<usize, Entry<E>>>>);

impl<E> PerDevice<E> {
    pub(crate) const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The engine of device `index`, made by `setup` on first use. A panic in `setup` (the
    /// libraries' loaders panic on a library or symbol they cannot load) is a failed
    /// setup; a failure is logged once with the message `warning` makes of it.
    pub(crate) fn get(
        &self,
        index: usize,
        setup: impl FnOnce() -> Result<E, String>,
        warning: impl FnOnce(&str) -> String,
    ) -> Entry<E> {
        let mut engines = self
            .0
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        engines
            .entry(index)
            .or_insert_with(|| {
                // Nothing `setup` touched is used after it panicked: only the message.
                let engine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(setup))
                    .unwrap_or_else(|p| Err(panic_text(p.as_ref())))
                    .map(|e| Arc::new(Mutex::new(e)));
                if let Err(why) = &engine {
                    log::warn!("{}", warning(why));
                }
                engine
            })
            .clone()
    }
}

/// Why a vendor library's work failed: before anything was launched (`Unavailable`, and
/// the caller falls back) or after (`Launch`, and the caller panics with it).
pub(crate) enum Failure<U> {
    Unavailable(U),
    Launch(String),
}

/// `value` as the `const void*` the libraries' attribute setters take.
pub(crate) fn as_ptr<T>(value: &T) -> *const std::ffi::c_void {
    value as *const T as *const std::ffi::c_void
}

/// The message of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
