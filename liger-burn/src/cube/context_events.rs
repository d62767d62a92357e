//! Ordering work on liger's own CUDA stream against every stream of the device's primary
//! context, CubeCL's private ones included, with context-wide events (CUDA 12.5+:
//! `cuCtxRecordEvent`, `cuCtxWaitEvent`). No kernel of liger's or CubeCL's takes part: the
//! waits are the driver's, on the device.
//!
//! Per piece of work:
//! 1. `cuCtxRecordEvent(ctx, issued)` captures everything issued so far on any stream of
//!    the context (the producers of the inputs, the last readers of the memory the output
//!    reuses), and liger's stream waits for it (`cuStreamWaitEvent`);
//! 2. the work is enqueued on liger's stream;
//! 3. `done` is recorded on liger's stream, and `cuCtxWaitEvent(ctx, done)` makes all work
//!    submitted to the context from then on, on any stream, wait for it.
//!
//! Issued from CubeCL's device thread (which issues CubeCL's launches as it runs them),
//! step 1 sees every CubeCL launch that came before the work, and step 3 comes before
//! every one that follows. Both events are ordinary CUDA dependencies: unlike waits on
//! flags, nothing can spin forever on work issued later, whatever the driver serializes.
//!
//! The two entry points are looked up at run time (`cuGetProcAddress`), so a driver older
//! than CUDA 12.5 only makes this ordering unavailable.

use cudarc::driver::sys as driver_sys;
use std::ffi::{CStr, c_void};

/// `cuCtxRecordEvent` and `cuCtxWaitEvent` share this signature.
type ContextEventFn =
    unsafe extern "C" fn(driver_sys::CUcontext, driver_sys::CUevent) -> driver_sys::CUresult;

/// The CUDA version whose driver API has both entry points.
const ENTRY_POINTS_VERSION: i32 = 12050;

/// The driver's context-event entry points and the two events of the protocol, for one
/// context.
pub(crate) struct ContextEvents {
    ctx: driver_sys::CUcontext,
    record: ContextEventFn,
    wait: ContextEventFn,
    /// Recorded over the whole context before the work; liger's stream waits for it.
    issued: driver_sys::CUevent,
    /// Recorded on liger's stream after the work; the whole context waits for it.
    done: driver_sys::CUevent,
}

// Safety: the handles are used under the owning engine's lock, from one thread at a time;
// CUDA contexts and events are not tied to a thread.
unsafe impl Send for ContextEvents {}

impl ContextEvents {
    /// Looks the entry points up and creates the events in `ctx`, which the caller has
    /// bound to the thread; then runs the protocol once around nothing on `stream` and
    /// synchronizes, so that a driver that has the symbols but refuses the calls (on this
    /// kind of context) is found here.
    pub(crate) fn new(
        ctx: driver_sys::CUcontext,
        stream: driver_sys::CUstream,
    ) -> Result<Self, String> {
        let record = entry_point(c"cuCtxRecordEvent")?;
        let wait = entry_point(c"cuCtxWaitEvent")?;
        let issued = new_event().map_err(|e| format!("creating an event: {e:?}"))?;
        let done = match new_event() {
            Ok(done) => done,
            Err(e) => {
                // Safety: created above, destroyed once.
                unsafe { driver_sys::cuEventDestroy_v2(issued) };
                return Err(format!("creating an event: {e:?}"));
            }
        };
        let events = ContextEvents {
            ctx,
            record,
            wait,
            issued,
            done,
        };
        events.before(stream)?;
        events.after(stream)?;
        // Safety: liger's own stream; then every stream of the context (`cuCtxWaitEvent`
        // ordered them after `done`).
        unsafe { driver_sys::cuStreamSynchronize(stream) }
            .result()
            .map_err(|e| format!("synchronizing after the context events: {e:?}"))?;
        unsafe { driver_sys::cuCtxSynchronize() }
            .result()
            .map_err(|e| format!("synchronizing the context after its events: {e:?}"))?;
        Ok(events)
    }

    /// Step 1: `stream` waits for everything issued so far in the context. Nothing is
    /// enqueued when it fails.
    pub(crate) fn before(&self, stream: driver_sys::CUstream) -> Result<(), String> {
        // Safety: a live context and event of this context.
        unsafe { (self.record)(self.ctx, self.issued) }
            .result()
            .map_err(|e| format!("cuCtxRecordEvent: {e:?}"))?;
        // Safety: liger's stream and an event just recorded.
        unsafe { driver_sys::cuStreamWaitEvent(stream, self.issued, 0) }
            .result()
            .map_err(|e| format!("cuStreamWaitEvent: {e:?}"))
    }

    /// Step 3: everything submitted to the context from now on waits for what `stream`
    /// holds. When it fails, later work is not ordered after `stream`: the caller must
    /// synchronize `stream` before anything else runs.
    pub(crate) fn after(&self, stream: driver_sys::CUstream) -> Result<(), String> {
        // Safety: liger's stream and an event of this context.
        unsafe { driver_sys::cuEventRecord(self.done, stream) }
            .result()
            .map_err(|e| format!("cuEventRecord: {e:?}"))?;
        // Safety: a live context and an event just recorded.
        unsafe { (self.wait)(self.ctx, self.done) }
            .result()
            .map_err(|e| format!("cuCtxWaitEvent: {e:?}"))
    }
}

impl Drop for ContextEvents {
    fn drop(&mut self) {
        // Safety: created in `new`, destroyed once; CUDA defers the release of an event
        // that pending work still waits for.
        unsafe {
            driver_sys::cuEventDestroy_v2(self.issued);
            driver_sys::cuEventDestroy_v2(self.done);
        }
    }
}

/// An event without timing (the cheapest kind to record and wait for).
pub(crate) fn new_event() -> Result<driver_sys::CUevent, driver_sys::CUresult> {
    let mut event = std::ptr::null_mut();
    // Safety: writes one event handle.
    let status = unsafe {
        driver_sys::cuEventCreate(
            &mut event,
            driver_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    };
    match status {
        driver_sys::CUresult::CUDA_SUCCESS => Ok(event),
        e => Err(e),
    }
}

/// The driver's entry point `name` as of CUDA 12.5.
fn entry_point(name: &CStr) -> Result<ContextEventFn, String> {
    let mut function: *mut c_void = std::ptr::null_mut();
    let mut found =
        driver_sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    // Safety: a NUL-terminated name; the driver writes one pointer and one status.
    let status = unsafe {
        driver_sys::cuGetProcAddress_v2(
            name.as_ptr(),
            &mut function,
            ENTRY_POINTS_VERSION,
            driver_sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut found,
        )
    };
    if status != driver_sys::CUresult::CUDA_SUCCESS
        || found != driver_sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
        || function.is_null()
    {
        return Err(format!(
            "the driver has no {} (CUDA 12.5 or later): {status:?}, {found:?}",
            name.to_string_lossy()
        ));
    }
    // Safety: the driver's `name` of API version 12.5, whose signature is
    // `CUresult (CUcontext, CUevent)`.
    Ok(unsafe { std::mem::transmute::<*mut c_void, ContextEventFn>(function) })
}
