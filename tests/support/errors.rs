//! Checks of the errors bad input raises: the panic's message, and what it must name.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`; returns the message of its panic, if any, without printing it.
pub fn quiet_panic(f: impl FnOnce()) -> Option<String> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
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
