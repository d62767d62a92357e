//! Two one-unit CubeCL kernels that order work on a stream CubeCL keeps private against
//! work on a stream of our own, through sequence numbers in a small `u32` flag buffer
//! (see `cube::cublaslt` for the protocol that uses them).
//!
//! - [`launch_publish`]: on CubeCL's stream, waits until the `published` flag has reached
//!   `s - 1`, then writes `s` into it. Kernels of different CubeCL streams can run in any
//!   order, so without the wait a later publish could overwrite an earlier, still
//!   pending one; with it the flag only ever moves forward, one step at a time, and
//!   `published ≥ s` proves that publish `s` ran (after everything before it on its
//!   stream).
//! - [`launch_await`]: on CubeCL's stream, spins until the `completed` flag has reached
//!   `s`; everything CubeCL enqueues after it waits for the work that writes `s` there.
//!
//! - [`launch_mark`]: writes the `probe` slot, and nothing waits on it: a launch whose
//!   only purpose is to be seen on the client's stream (`cube::cupti`).
//!
//! Comparisons are cyclic (`value - target < 2³¹` in wrapping `u32` arithmetic), as the
//! driver's own `CU_STREAM_WAIT_VALUE_GEQ` is, so the counters may wrap. Atomic loads
//! re-read memory on every iteration (CUDA compiles them to `atomicAdd(p, 0)`).

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Slot of the flag written by [`launch_publish`].
pub(crate) const PUBLISHED: usize = 0;
/// Slot of the flag [`launch_await`] waits on.
pub(crate) const COMPLETED: usize = 1;
/// A slot nothing waits on, for probing the driver's stream memory operations and for
/// [`launch_mark`].
pub(crate) const PROBE: usize = 2;
/// `u32` slots in a flag buffer.
pub(crate) const FLAG_SLOTS: usize = 4;

/// Whether the cyclic counter `value` is at or past `target`.
#[cube]
fn reached(value: u32, target: u32) -> bool {
    value - target < 0x8000_0000u32
}

#[cube(launch)]
fn publish_kernel(flags: &mut Array<Atomic<u32>>, sequence: u32) {
    let previous = sequence - 1u32;
    let mut seen = flags[PUBLISHED].load();
    while !reached(seen, previous) {
        seen = flags[PUBLISHED].load();
    }
    flags[PUBLISHED].store(sequence);
}

#[cube(launch)]
fn await_kernel(flags: &mut Array<Atomic<u32>>, sequence: u32) {
    let mut seen = flags[COMPLETED].load();
    while !reached(seen, sequence) {
        seen = flags[COMPLETED].load();
    }
}

#[cube(launch)]
fn mark_kernel(flags: &mut Array<u32>) {
    flags[PROBE] = 1u32;
}

fn flags_arg<R: Runtime>(flags: &Handle) -> ArrayArg<R> {
    // Safety: `flags` is a buffer of `FLAG_SLOTS` u32 (checked by the callers' allocation,
    // `new_flags`), and the kernels index slots below that.
    unsafe { ArrayArg::from_raw_parts(flags.clone(), FLAG_SLOTS) }
}

/// A zeroed flag buffer of [`FLAG_SLOTS`] `u32`.
pub(crate) fn new_flags<R: Runtime>(client: &ComputeClient<R>) -> Handle {
    client.create_from_slice(u32::as_bytes(&[0u32; FLAG_SLOTS]))
}

/// Enqueues on the client's stream: wait for `published ≥ sequence - 1`, then
/// `published = sequence`.
pub(crate) fn launch_publish<R: Runtime>(client: &ComputeClient<R>, flags: &Handle, sequence: u32) {
    publish_kernel::launch::<R>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(1),
        flags_arg::<R>(flags),
        sequence,
    );
}

/// Enqueues on the client's stream: wait for `completed ≥ sequence`.
pub(crate) fn launch_await<R: Runtime>(client: &ComputeClient<R>, flags: &Handle, sequence: u32) {
    await_kernel::launch::<R>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(1),
        flags_arg::<R>(flags),
        sequence,
    );
}

/// Enqueues on the client's stream a one-unit kernel that writes the `probe` slot.
pub(crate) fn launch_mark<R: Runtime>(client: &ComputeClient<R>, flags: &Handle) {
    mark_kernel::launch::<R>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(1),
        flags_arg::<R>(flags),
    );
}

#[cfg(all(test, feature = "vulkan"))]
mod tests {
    //! The kernels on lavapipe (or the default Vulkan adapter): with every wait already
    //! satisfied they return, and publish writes its number, across a wrap of the counter.
    use super::*;
    use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};

    fn read(client: &ComputeClient<WgpuRuntime>, flags: &Handle) -> Vec<u32> {
        let bytes = client.read_one(flags.clone()).expect("reading the flags");
        u32::from_bytes(&bytes).to_vec()
    }

    #[test]
    fn publish_and_await_step_through_a_wrap() {
        let client = WgpuRuntime::client(&WgpuDevice::Cpu);
        let init = [u32::MAX - 1, u32::MAX - 1, 0, 0];
        let flags = client.create_from_slice(u32::as_bytes(&init));
        // u32::MAX - 1 → u32::MAX → 0 → 1: each publish waits for the one before.
        for sequence in [u32::MAX, 0, 1] {
            launch_publish::<WgpuRuntime>(&client, &flags, sequence);
            // `completed` is still u32::MAX - 1, which is at or past u32::MAX - 1 only.
            launch_await::<WgpuRuntime>(&client, &flags, u32::MAX - 1);
        }
        assert_eq!(read(&client, &flags)[PUBLISHED], 1);
        assert_eq!(read(&client, &flags)[COMPLETED], u32::MAX - 1);
    }
}
