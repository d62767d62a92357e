//! Checks of the errors bad input raises: the panic's message, and what it must name.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Whether this thread is inside [`quiet_panic`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; returns the message of its panic, if any, without printing it.
///
/// The panic hook is process-wide and tests run on many threads at once: swapping it in
/// and out here would also silence a failing test on another thread (its assertion
/// message lost). One hook, installed once, stays quiet only for the threads inside.
pub fn quiet_panic(f: impl FnOnce()) -> Option<String> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.err().map(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// Runs `f`, expecting a panic; returns its message.
pub fn panic_message(f: impl FnOnce()) -> String {
    quiet_panic(f).expect("expected a panic, the call succeeded")
}

/// Asserts that `msg` contains every one of `parts`.
pub fn assert_mentions(label: &str, msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(
            msg.contains(p),
            "{label}: error message {msg:?} should mention {p:?}"
        );
    }
}
