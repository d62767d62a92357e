//! What the vendor libraries' engines share (cuBLASLt on CUDA, hipBLASLt on ROCm): one
//! engine per device, set up on first use (a failed setup is remembered, logged once as a
//! warning, and answered from then on without trying again), how their failures and
//! attribute pointers are passed, and how a library loaded by path (hipBLASLt, CUPTI) is
//! found.

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

/// Where a library loaded at run time is looked for, each of `names` in turn in: `subdir`
/// of each install root named by the environment variables `root_vars`, `dirs`, then the
/// loader's search path.
pub(crate) fn library_candidates(
    names: &[&str],
    root_vars: &[&str],
    subdir: &str,
    dirs: &[&str],
) -> Vec<String> {
    let mut all: Vec<String> = root_vars
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .map(|root| format!("{root}/{subdir}/"))
        .collect();
    all.extend(dirs.iter().map(|dir| format!("{dir}/")));
    all.push(String::new());
    all.iter()
        .flat_map(|dir| names.iter().map(move |name| format!("{dir}{name}")))
        .collect()
}

/// The first of `tried` that loads, or why none did (`what` names the library).
pub(crate) fn load_first(tried: &[String], what: &str) -> Result<libloading::Library, String> {
    // Safety: loading a library runs its initializers, as linking it would.
    tried
        .iter()
        .find_map(|path| unsafe { libloading::Library::new(path) }.ok())
        .ok_or_else(|| format!("{what} was not found (tried {})", tried.join(", ")))
}

/// Symbol `$name` (a NUL-terminated byte string) of the library `$lib`, as the type the
/// field it initializes declares, or an `Err` naming `$what` and the symbol, returned from
/// the enclosing function. Inside an `unsafe` block whose safety comment says the fields
/// are declared with the symbols' C signatures.
macro_rules! library_symbol {
    ($lib:expr, $what:literal, $name:literal) => {
        *$lib
            .get($name)
            .map_err(|e| format!("{} symbol {}: {e}", $what, stringify!($name)))?
    };
}
pub(crate) use library_symbol;
