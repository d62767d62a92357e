//! The CUDA stream CubeCL launches a task's kernels on, found through CUPTI's driver-API
//! callbacks, so that vendor libraries can run on that very stream
//! ([`super::cublaslt::MatmulOrdering::CubeclStream`]).
//!
//! cubecl-cuda 0.10 keeps its streams private. Its kernels reach the driver through
//! `cuLaunchKernel`, whose arguments name the stream; while a CUPTI subscriber listens to
//! the driver API on the launching thread, one marker kernel launched through CubeCL shows
//! which stream CubeCL picked for the current `StreamId`. CubeCL creates each stream once
//! and keeps it for the life of its server, so the handle stays valid. The subscription
//! lasts for that one launch: CUPTI admits one subscriber per process, which profilers
//! (Nsight Compute, torch.profiler) may need.
//!
//! CUPTI ships with the CUDA toolkit (`extras/CUPTI/lib64`) and with PyTorch's CUDA
//! wheels; it is loaded at run time, and without it the stream is simply not found.

use super::vendor_engines::{library_candidates, library_symbol, load_first};
use cudarc::driver::sys as driver_sys;
use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Mutex, OnceLock};

/// `CUPTI_CB_DOMAIN_DRIVER_API`.
const DOMAIN_DRIVER_API: u32 = 1;
/// `CUPTI_API_ENTER`.
const SITE_ENTER: u32 = 0;
/// `CUPTI_SUCCESS`.
const SUCCESS: i32 = 0;

/// `CUpti_CallbackData` (cupti_callbacks.h), as the callback receives it.
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const c_char,
    function_params: *const c_void,
    function_return_value: *mut c_void,
    symbol_name: *const c_char,
    context: driver_sys::CUcontext,
    context_uid: u32,
    correlation_data: *mut u64,
    correlation_id: u32,
}

/// `cuLaunchKernel_params` (generated_cuda_meta.h).
#[repr(C)]
struct LaunchKernelParams {
    function: driver_sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: driver_sys::CUstream,
}

/// `cuLaunchKernelEx_params`: the launch configuration comes first.
#[repr(C)]
struct LaunchKernelExParams {
    config: *const LaunchConfig,
}

/// `CUlaunchConfig` up to its stream.
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: driver_sys::CUstream,
}

type Subscriber = *mut c_void;
type CallbackFn = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// The library and the entry points used.
struct Library {
    _lib: libloading::Library,
    subscribe: unsafe extern "C" fn(*mut Subscriber, CallbackFn, *mut c_void) -> i32,
    unsubscribe: unsafe extern "C" fn(Subscriber) -> i32,
    enable_domain: unsafe extern "C" fn(u32, Subscriber, u32) -> i32,
}

// Safety: function pointers into a library loaded for the life of the process.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

/// Where the library is looked for: the CUDA toolkit's directories, then the loader's
/// search path.
fn candidates() -> Vec<String> {
    library_candidates(
        &["libcupti.so.13", "libcupti.so.12", "libcupti.so"],
        &["CUDA_HOME", "CUDA_PATH"],
        "extras/CUPTI/lib64",
        &["/usr/local/cuda/extras/CUPTI/lib64"],
    )
}

fn library() -> Result<&'static Library, String> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let lib = load_first(&candidates(), "libcupti")?;
            // Safety: each symbol is declared with its C signature from `cupti_callbacks.h`.
            unsafe {
                Ok(Library {
                    subscribe: library_symbol!(lib, "CUPTI", b"cuptiSubscribe\0"),
                    unsubscribe: library_symbol!(lib, "CUPTI", b"cuptiUnsubscribe\0"),
                    enable_domain: library_symbol!(lib, "CUPTI", b"cuptiEnableDomain\0"),
                    _lib: lib,
                })
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

thread_local! {
    /// Set while this thread's launches are being watched.
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// The streams of the launches seen on this thread while watching.
    static SEEN: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}

/// The driver-API callback: records the stream of each kernel launch made on a watching
/// thread (CUPTI calls back on the thread making the call).
unsafe extern "C" fn on_driver_call(
    _user: *mut c_void,
    domain: u32,
    _callback_id: u32,
    data: *const c_void,
) {
    if domain != DOMAIN_DRIVER_API || data.is_null() || !WATCHING.with(Cell::get) {
        return;
    }
    // Safety: CUPTI passes a `CUpti_CallbackData` for the driver-API domain, valid for
    // the callback's duration, with the named function's parameter struct.
    let data = unsafe { &*(data as *const CallbackData) };
    if data.callback_site != SITE_ENTER
        || data.function_name.is_null()
        || data.function_params.is_null()
    {
        return;
    }
    let name = unsafe { CStr::from_ptr(data.function_name) }.to_bytes();
    let stream = match name {
        b"cuLaunchKernel" | b"cuLaunchKernel_ptsz" => unsafe {
            (*(data.function_params as *const LaunchKernelParams)).stream
        },
        b"cuLaunchKernelEx" | b"cuLaunchKernelEx_ptsz" => {
            let config = unsafe { (*(data.function_params as *const LaunchKernelExParams)).config };
            if config.is_null() {
                return;
            }
            unsafe { (*config).stream }
        }
        _ => return,
    };
    SEEN.with(|seen| {
        let (first, count) = seen.get();
        let first = if count == 0 { stream as usize } else { first };
        // Two different streams leave the count at `u32::MAX`: no answer.
        let count = if count > 0 && first != stream as usize {
            u32::MAX
        } else {
            count.saturating_add(1)
        };
        seen.set((first, count));
    });
}

/// The stream of the kernel launches `launch` makes on this thread (at least one, all on
/// one stream), watched through a CUPTI subscription that lasts for the call. CUPTI admits
/// one subscriber per process: under a profiler this fails, and the caller orders its work
/// another way.
pub(crate) fn stream_of_launches(launch: impl FnOnce()) -> Result<driver_sys::CUstream, String> {
    let lib = library()?;
    // One subscription at a time within the process.
    static SUBSCRIBING: Mutex<()> = Mutex::new(());
    let _one = SUBSCRIBING.lock().unwrap_or_else(|e| e.into_inner());
    let mut subscriber: Subscriber = std::ptr::null_mut();
    // Safety: writes one handle; the callback stays valid for the process.
    let status = unsafe { (lib.subscribe)(&mut subscriber, on_driver_call, std::ptr::null_mut()) };
    if status != SUCCESS {
        return Err(format!(
            "cuptiSubscribe returned {status} (another CUPTI subscriber, such as a profiler?)"
        ));
    }
    // Safety: the subscriber just created.
    let enabled = unsafe { (lib.enable_domain)(1, subscriber, DOMAIN_DRIVER_API) };
    let seen = if enabled == SUCCESS {
        SEEN.with(|seen| seen.set((0, 0)));
        WATCHING.with(|w| w.set(true));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(launch));
        WATCHING.with(|w| w.set(false));
        // Safety: the same subscriber.
        unsafe { (lib.enable_domain)(0, subscriber, DOMAIN_DRIVER_API) };
        outcome.map(|()| SEEN.with(Cell::get)).map_err(|p| {
            format!(
                "the marker launch panicked: {}",
                super::vendor_engines::panic_text(p.as_ref())
            )
        })
    } else {
        Err(format!("cuptiEnableDomain returned {enabled}"))
    };
    // Safety: the subscriber created above, released once.
    unsafe { (lib.unsubscribe)(subscriber) };
    match seen? {
        (_, 0) => Err("no kernel launch was seen on this thread".into()),
        (_, u32::MAX) => Err("the launches went to more than one stream".into()),
        (0, _) => {
            Err("the launch went to the legacy default stream, not a stream of CubeCL's".into())
        }
        (stream, _) => Ok(stream as driver_sys::CUstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layouts CUPTI and the driver's generated headers define on 64-bit targets.
    #[test]
    fn callback_structs_match_the_c_layouts() {
        assert_eq!(offset_of!(CallbackData, function_name), 8);
        assert_eq!(offset_of!(CallbackData, function_params), 16);
        assert_eq!(offset_of!(CallbackData, context), 40);
        assert_eq!(offset_of!(CallbackData, correlation_id), 64);
        assert_eq!(offset_of!(LaunchKernelParams, grid), 8);
        assert_eq!(offset_of!(LaunchKernelParams, stream), 40);
        assert_eq!(offset_of!(LaunchConfig, stream), 32);
    }

    /// The callback keeps one stream, or none when launches disagree, and ignores
    /// launches off a watching thread and other calls.
    #[test]
    fn callback_records_the_launch_stream() {
        let call = |name: &CStr, stream: usize| {
            let params = LaunchKernelParams {
                function: std::ptr::null_mut(),
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
                stream: stream as driver_sys::CUstream,
            };
            let data = CallbackData {
                callback_site: SITE_ENTER,
                function_name: name.as_ptr(),
                function_params: &params as *const _ as *const c_void,
                function_return_value: std::ptr::null_mut(),
                symbol_name: std::ptr::null(),
                context: std::ptr::null_mut(),
                context_uid: 0,
                correlation_data: std::ptr::null_mut(),
                correlation_id: 0,
            };
            unsafe {
                on_driver_call(
                    std::ptr::null_mut(),
                    DOMAIN_DRIVER_API,
                    0,
                    &data as *const _ as *const c_void,
                )
            };
        };
        SEEN.with(|s| s.set((0, 0)));
        call(c"cuLaunchKernel", 0x10);
        assert_eq!(SEEN.with(Cell::get), (0, 0), "not watching: ignored");
        WATCHING.with(|w| w.set(true));
        call(c"cuMemAlloc_v2", 0x20);
        call(c"cuLaunchKernel", 0x10);
        call(c"cuLaunchKernel", 0x10);
        assert_eq!(SEEN.with(Cell::get), (0x10, 2));
        call(c"cuLaunchKernel", 0x30);
        assert_eq!(SEEN.with(Cell::get).1, u32::MAX, "two streams: no answer");
        WATCHING.with(|w| w.set(false));
    }
}
