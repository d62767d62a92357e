//! Test-only controls (feature `test-hooks`) that let the suites reach, at small shapes,
//! the paths only large inputs take otherwise:
//!
//! - the kernels' launch geometry: every op on both reduction paths, the elementwise
//!   kernel's grid-striding and multi-launch paths;
//! - the blockwise attention's block size: several blocks and a partial last one;
//! - the fused linear cross entropy's chunk rows: several chunks and a partial last one;
//! - a count of the memory releases the backward made (`memory_release_point`);
//! - why products with a cuBLASLt epilogue were waited for instead of queued (CUDA).
//!
//! Each override belongs to the calling thread (Burn's fusion and CubeCL backends launch
//! on the calling thread) and lasts as long as its guard, so concurrent tests do not see
//! each other's. Without the feature none of this exists.

use crate::hand_off::HandOff;
use liger_cubecl_kernels::LaunchConfig;
use std::cell::Cell;
use std::sync::Mutex;
use std::thread::LocalKey;

/// Process-wide: the decision is made on whichever thread runs the op (Fusion's or the
/// caller's).
static EPILOGUE_NOT_QUEUED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Why each product with a cuBLASLt epilogue was waited for instead of queued since the
/// last call, oldest first (every thread's).
pub fn take_epilogue_not_queued() -> Vec<String> {
    std::mem::take(
        &mut *EPILOGUE_NOT_QUEUED
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    )
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_epilogue_not_queued(why: String) {
    EPILOGUE_NOT_QUEUED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(why);
}

std::thread_local! {
    static LAUNCH_CONFIG: Cell<Option<LaunchConfig>> = const { Cell::new(None) };
    static ATTENTION_BLOCK: Cell<Option<usize>> = const { Cell::new(None) };
    static CHUNK_ROWS: Cell<Option<usize>> = const { Cell::new(None) };
    static HAND_OFF: Cell<Option<HandOff>> = const { Cell::new(None) };
    static MEMORY_RELEASES: Cell<u64> = const { Cell::new(0) };
}

/// How many memory releases (`memory_release_point` backwards) this thread has made.
pub fn memory_releases() -> u64 {
    MEMORY_RELEASES.with(|c| c.get())
}

pub(crate) fn count_memory_release() {
    MEMORY_RELEASES.with(|c| c.set(c.get() + 1));
}

/// Restores a thread-local override's previous value when dropped.
#[must_use = "the override ends when the guard is dropped"]
pub struct OverrideGuard<T: Copy + 'static> {
    slot: &'static LocalKey<Cell<Option<T>>>,
    previous: Option<T>,
}

impl<T: Copy + 'static> Drop for OverrideGuard<T> {
    fn drop(&mut self) {
        self.slot.with(|s| s.set(self.previous));
    }
}

/// Sets the thread-local `slot` to `value` until the guard is dropped (for crates that
/// keep their own test overrides, such as liger-models).
pub fn scoped_override<T: Copy + 'static>(
    slot: &'static LocalKey<Cell<Option<T>>>,
    value: T,
) -> OverrideGuard<T> {
    let previous = slot.with(|s| s.replace(Some(value)));
    OverrideGuard { slot, previous }
}

/// Every kernel this thread launches uses `config` instead of the device's table.
pub fn override_launch_config(config: LaunchConfig) -> OverrideGuard<LaunchConfig> {
    scoped_override(&LAUNCH_CONFIG, config)
}

/// Runs `f` with [`override_launch_config`]`(config)` in force.
pub fn with_launch_config<T>(config: LaunchConfig, f: impl FnOnce() -> T) -> T {
    let _guard = override_launch_config(config);
    f()
}

/// The calling thread's launch-geometry override, if any.
pub fn launch_config_override() -> Option<LaunchConfig> {
    LAUNCH_CONFIG.with(|s| s.get())
}

/// The blockwise attention on this thread holds at most `elements` score elements per
/// block (instead of [`BLOCK_SCORE_ELEMENTS`](crate::ops::compose::attention::BLOCK_SCORE_ELEMENTS)).
pub fn override_attention_block(elements: usize) -> OverrideGuard<usize> {
    scoped_override(&ATTENTION_BLOCK, elements)
}

/// The calling thread's attention block override, if any.
pub fn attention_block_override() -> Option<usize> {
    ATTENTION_BLOCK.with(|s| s.get())
}

/// The fused linear cross entropy on this thread takes `rows` rows per chunk (instead of
/// [`chunk_rows`](crate::ops::compose::linear_cross_entropy::chunk_rows)'s size).
pub fn override_chunk_rows(rows: usize) -> OverrideGuard<usize> {
    scoped_override(&CHUNK_ROWS, rows)
}

/// The calling thread's chunk-rows override, if any.
pub fn chunk_rows_override() -> Option<usize> {
    CHUNK_ROWS.with(|s| s.get())
}

/// Fused operations and vendor products this thread queues use `hand_off` (instead of
/// [`HAND_OFF`](crate::fusion::HAND_OFF)), to measure each.
pub fn override_hand_off(hand_off: HandOff) -> OverrideGuard<HandOff> {
    scoped_override(&HAND_OFF, hand_off)
}

/// The calling thread's hand-off override, if any.
pub fn hand_off_override() -> Option<HandOff> {
    HAND_OFF.with(|s| s.get())
}

/// Everything above as the calling thread has it, for work that runs on another thread on
/// its behalf: Burn's fusion stream executes its operations on the device's runner thread,
/// so a custom operation captures this when it is registered and runs [`within`] it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Captured {
    launch_config: Option<LaunchConfig>,
    attention_block: Option<usize>,
    chunk_rows: Option<usize>,
    counter_scope: u64,
}

/// The calling thread's overrides and launch-counting scope.
pub(crate) fn capture() -> Captured {
    Captured {
        launch_config: launch_config_override(),
        attention_block: attention_block_override(),
        chunk_rows: chunk_rows_override(),
        counter_scope: liger_cubecl_kernels::counters::scope(),
    }
}

/// Runs `f` with `captured`'s overrides and counting scope on this thread.
pub(crate) fn within<T>(captured: &Captured, f: impl FnOnce() -> T) -> T {
    fn set<V: Copy + 'static>(
        slot: &'static LocalKey<Cell<Option<V>>>,
        value: Option<V>,
    ) -> OverrideGuard<V> {
        let previous = slot.with(|s| s.replace(value));
        OverrideGuard { slot, previous }
    }
    let _launch = set(&LAUNCH_CONFIG, captured.launch_config);
    let _attention = set(&ATTENTION_BLOCK, captured.attention_block);
    let _chunks = set(&CHUNK_ROWS, captured.chunk_rows);
    let _scope = liger_cubecl_kernels::counters::enter_scope(captured.counter_scope);
    f()
}
