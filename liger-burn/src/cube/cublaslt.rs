//! Matrix products on CUDA through cuBLASLt, ordered against CubeCL's own stream. Other
//! vendor libraries' work (cuDNN's attention, `super::cudnn`) runs on the same stream under
//! the same ordering through [`run_ordered`].
//!
//! cubecl-cuda keeps its CUDA streams private. Liger owns, per device, a cuBLASLt handle, a
//! 32 MiB workspace, a non-blocking stream of its own and a small buffer of `u32` flags
//! (allocated through CubeCL, whose kernels can only bind its own buffers, and held for
//! the life of the process), and orders its products against CubeCL's work with one of
//! the protocols of [`MatmulOrdering`] (the device's default is the first of them that
//! runs; [`crate::cube::cublaslt_matmul`] takes any explicitly):
//!
//! **CubeCL's stream** (the default where CUPTI is found): the product is enqueued on the
//! very stream CubeCL launches the task's kernels on, which `super::cupti` finds once per
//! CubeCL stream by watching a marker launch. Asking CubeCL for the operands' addresses
//! already makes that stream wait for inputs produced on CubeCL's other streams, and
//! CubeCL orders later readers on other streams after it, as it does for its own kernels;
//! so nothing is added around the product. Work that moves to another stream waits for
//! the previous work's stream first (one event), as the workspace is shared.
//!
//! **Context events** (CUDA 12.5+, the default without CUPTI where the driver has them; the host never
//! waits): `cuCtxRecordEvent` captures all work issued so far on every stream of the
//! primary context and liger's stream waits for it; the product follows; an event
//! recorded after it is passed to `cuCtxWaitEvent`, which makes all work submitted to the
//! context from then on wait for it (`super::context_events`). No kernel takes part, so
//! nothing occupies a multiprocessor while the product runs and nothing spins; both waits
//! are CUDA dependencies, so the driver and the profilers see them. On the H200 a product
//! costs 14 µs of the device thread's time this way, against 41 µs under the flag kernels
//! (`liger bench --op matmul`, `matmul_call` rows).
//!
//! **Stream memory operations** (where context events are missing; the host never
//! waits). Per product, with a sequence number `s`:
//! 1. on CubeCL's stream (after the producers of the inputs, and after every reader of the
//!    memory the output reuses), a one-unit kernel publishes `s` in the `published` flag
//!    (`cube::sequence`: it first waits for `s - 1`, so the flag only moves forward even
//!    when the products are issued from several CubeCL streams);
//! 2. on liger's stream: `cuStreamWaitValue32(published ≥ s)`, the cuBLASLt product(s),
//!    then `cuStreamWriteValue32(completed = s)` (with the default memory barrier: the
//!    product's writes are visible before the flag is). The flag is written even when a
//!    product failed to launch, so nothing waits on it forever;
//! 3. on CubeCL's stream, a one-unit kernel spins until `completed ≥ s`: every later
//!    CubeCL operation, including one that reuses the inputs' memory once Burn frees
//!    them, runs after the product.
//!
//! All of it is issued from CubeCL's device thread in one task (CubeCL launches
//! asynchronously from that thread, so issuing from the caller's would let the driver see
//! our wait before the publish), so the driver sees every wait after the work that
//! satisfies it. That invariant is what
//! keeps the protocol free of deadlock: whatever the driver does at any point of the
//! issue order (serialize streams that share a hardware queue, or synchronize the
//! context to load a module lazily, as CUDA's lazy loading may), everything already
//! issued can complete on its own. CUDA's documentation also asks for stream waits to be
//! mirrored by CUDA-visible dependencies such as events; none can be recorded on a stream
//! we have no handle to, which is the flag protocols' residual risk (context events
//! record over the whole context instead).
//!
//! **Flag kernels** (where the driver refuses stream memory operations, as CUDA 13's does
//! on the H200 for CubeCL's stream-ordered allocations: `CUDA_ERROR_INVALID_VALUE`): the
//! same protocol with two one-thread kernels of liger's own on its stream in place of the
//! wait and the write ([`MatmulOrdering::FlagKernels`]).
//!
//! Under both flag protocols the await kernel occupies one multiprocessor while the
//! product runs, so products are planned for one multiprocessor fewer
//! (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`; see `Engine::sm_count_target`).
//!
//! **Host synchronization** (where neither works, and on request): synchronize CubeCL's stream, run the product on liger's stream, synchronize
//! liger's stream.
//!
//! **Queued or waited for.** Under the device-side protocols a product whose layout
//! cuBLASLt has planned before is queued on CubeCL's device thread ([`VendorQueue`], in
//! order with CubeCL's own launches, handed on at once unless the hand-off is
//! [`HandOff::Runtime`](crate::fusion::HandOff)) and the caller goes on at once: its layout has an
//! algorithm, and a new alignment of it that has none of its own takes the plan for the
//! elements' own alignment. A product with an epilogue vector (a bias, a bias gradient)
//! is queued only when its exact operand alignments were planned before and its vector
//! is 16-byte aligned, both read on the caller's thread from the handles' offsets (CubeCL
//! starts every buffer at a multiple of 512 bytes on CUDA): an epilogue has algorithms
//! for fewer alignments. Other libraries' work is queued the same way once its plan
//! exists ([`StreamWork::planned`]: cuDNN's attention graph of the same problem and
//! strides, its tensors 16-byte aligned). Everything else (a layout's first product or
//! graph, host synchronization) runs in a `ComputeClient::exclusive` task the caller
//! waits for, so that it can fall back to Burn's kernels when the library declines. The
//! wait is not only the work's own host time: CubeCL's device thread sleeps in 150 µs
//! steps when idle, so a caller that waits on it often pays up to that again.
//! Queued work that fails to launch, which nothing planned should, is logged as an error
//! when it happens and reported by a panic at the device's next vendor call, as CUDA
//! reports asynchronous errors.

use super::context_events::{ContextEvents, new_event};
use super::matmul_layout::{BlasMatrix, GemmLayout, alignment};
use super::sequence;
use super::vendor_engines::{PerDevice, as_ptr, panic_text};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl::device_handle::DeviceHandle;
use cubecl::prelude::{ComputeClient, Runtime};
use cubecl::server::Handle;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaContext, CudaStream, result as driver, sys as driver_sys};
use liger_cubecl_kernels::counters::{self, Kernel};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// cuBLASLt workspace per device: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Cached product plans per device; beyond this the cache starts over (a model has a few
/// dozen shapes, so this only bounds pathological shape churn).
const MAX_PLANS: usize = 1024;

/// Host time spent on CubeCL's device thread per phase of the ordered vendor work (the
/// products and [`run_ordered`]'s), summed since the engine was set up (see
/// [`host_times`]): where the fixed cost of a product goes. When a phase's share per
/// product comes near the product's own GPU time, the device thread, not the GPU, sets
/// the pace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// Products run under a device-side ordering (queued or waited for).
    pub products: u64,
    /// Seconds in queued tasks, from taking the engine's lock to the end.
    pub task: f64,
    /// Seconds reading device addresses and finding plans.
    pub prepare: f64,
    /// Seconds ordering the vendor stream after CubeCL's work: handing over from another
    /// stream (CubeCL's stream), launching the publish kernel on CubeCL's stream, or
    /// recording the context event and waiting for it.
    pub publish: f64,
    /// Seconds enqueueing the work (under the flag protocols, with the wait for the
    /// published flag and the completion flag).
    pub vendor: f64,
    /// Seconds ordering CubeCL's later work after liger's stream: launching the await
    /// kernel, or recording the completion event and the context's wait for it.
    pub await_kernel: f64,
}

impl HostTimes {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &HostTimes) -> HostTimes {
        HostTimes {
            products: self.products - earlier.products,
            task: self.task - earlier.task,
            prepare: self.prepare - earlier.prepare,
            publish: self.publish - earlier.publish,
            vendor: self.vendor - earlier.vendor,
            await_kernel: self.await_kernel - earlier.await_kernel,
        }
    }
}

/// How liger's cuBLASLt work is ordered against CubeCL's stream (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulOrdering {
    /// On the very stream CubeCL launches the task's kernels on, found once per CubeCL
    /// stream through CUPTI (`super::cupti`): the work is ordered like one of CubeCL's own
    /// kernels, with nothing added around it. Work on a stream other than the previous
    /// work's waits for that work first (one event), so the workspaces are never shared
    /// by two streams at once. Needs CUPTI and no other CUPTI subscriber (a profiler) when
    /// a stream is first found.
    CubeclStream,
    /// The driver's context-wide events (`cuCtxRecordEvent` / `cuCtxWaitEvent`, CUDA
    /// 12.5+): liger's stream waits for everything issued before in the context, and
    /// everything submitted after waits for liger's stream. No kernel takes part; the
    /// host never blocks.
    ContextEvents,
    /// Device-side waits on flags (`cuStreamWaitValue32` / `cuStreamWriteValue32` and
    /// two one-unit CubeCL kernels): the host never blocks.
    StreamMemoryOperations,
    /// The same protocol with two one-thread kernels of liger's own on its stream in
    /// place of the stream memory operations: one spins until `published ≥ s`, the other
    /// writes `completed = s` after a memory fence. For drivers that refuse stream memory
    /// operations on CubeCL's (stream-ordered) allocations; the host never blocks.
    FlagKernels,
    /// The host synchronizes CubeCL's stream before the product and liger's stream after.
    HostSynchronization,
}

impl MatmulOrdering {
    /// Every ordering, in the order a device's default is chosen.
    pub const ALL: [MatmulOrdering; 5] = [
        MatmulOrdering::CubeclStream,
        MatmulOrdering::ContextEvents,
        MatmulOrdering::StreamMemoryOperations,
        MatmulOrdering::FlagKernels,
        MatmulOrdering::HostSynchronization,
    ];

    /// Short name for logs and benchmark rows.
    pub fn name(self) -> &'static str {
        match self {
            MatmulOrdering::CubeclStream => "cubecl-stream",
            MatmulOrdering::ContextEvents => "context-events",
            MatmulOrdering::StreamMemoryOperations => "stream-memory-operations",
            MatmulOrdering::FlagKernels => "flag-kernels",
            MatmulOrdering::HostSynchronization => "host-synchronization",
        }
    }
}

/// Why a product does not run on cuBLASLt (nothing was launched).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// cuBLASLt is not used for this dtype (it is for f32, f16 and bf16).
    Dtype(DType),
    /// The library, the driver or the device resources could not be set up.
    Setup(String),
    /// CubeCL's stream could not be found (no CUPTI, or another CUPTI subscriber).
    NoCubeclStream(String),
    /// Context events were asked for but the driver lacks them.
    NoContextEvents(String),
    /// Stream memory operations were asked for but the driver or device lacks them.
    NoStreamMemoryOperations(String),
    /// The flag kernels were asked for but could not be loaded or run.
    NoFlagKernels(String),
    /// cuBLASLt's heuristic has no algorithm for this product.
    NoAlgorithm(String),
    /// Another library's work ([`run_ordered`]) could not be prepared.
    Library(String),
}

impl core::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Unavailable::Dtype(d) => write!(f, "cuBLASLt is not used for dtype {d:?}"),
            Unavailable::Setup(why) => write!(f, "cuBLASLt could not be set up: {why}"),
            Unavailable::NoCubeclStream(why) => {
                write!(f, "CubeCL's stream was not found: {why}")
            }
            Unavailable::NoContextEvents(why) => {
                write!(f, "no context events on this device: {why}")
            }
            Unavailable::NoStreamMemoryOperations(why) => {
                write!(f, "no stream memory operations on this device: {why}")
            }
            Unavailable::NoFlagKernels(why) => {
                write!(
                    f,
                    "the ordering flag kernels do not run on this device: {why}"
                )
            }
            Unavailable::NoAlgorithm(why) => write!(f, "cuBLASLt has no algorithm: {why}"),
            Unavailable::Library(why) => write!(f, "{why}"),
        }
    }
}

/// What a device offers, for logs and benchmarks.
#[derive(Clone, Debug)]
pub struct DeviceSupport {
    /// The CUDA device ordinal.
    pub ordinal: usize,
    /// The driver's CUDA version, e.g. 13000.
    pub driver_version: i32,
    /// The ordering `fused_matmul` uses on this device.
    pub default_ordering: MatmulOrdering,
    /// Why CubeCL's own stream is not used, when it is not.
    pub no_cubecl_stream: Option<String>,
    /// Why context events are not used, when they are not.
    pub no_context_events: Option<String>,
    /// Why stream memory operations are not used, when they are not.
    pub no_stream_memory_operations: Option<String>,
    /// Why the flag kernels are not used, when they are not.
    pub no_flag_kernels: Option<String>,
}

impl DeviceSupport {
    /// Why the device cannot run `ordering` (`None`: it can).
    pub fn lacks(&self, ordering: MatmulOrdering) -> Option<&str> {
        match ordering {
            MatmulOrdering::CubeclStream => self.no_cubecl_stream.as_deref(),
            MatmulOrdering::ContextEvents => self.no_context_events.as_deref(),
            MatmulOrdering::StreamMemoryOperations => self.no_stream_memory_operations.as_deref(),
            MatmulOrdering::FlagKernels => self.no_flag_kernels.as_deref(),
            MatmulOrdering::HostSynchronization => None,
        }
    }
}

/// The product `lhs [..., m, k] · rhs [..., k, n]` on cuBLASLt, laid out by
/// [`super::matmul`] (which picks layouts and allocates `out` for validated shapes).
pub(crate) struct Product<'a> {
    pub lhs: &'a CubeTensor<CudaRuntime>,
    pub rhs: &'a CubeTensor<CudaRuntime>,
    /// Written in its own dtype: the inputs' (`accumulate` false) or f32.
    pub out: &'a CubeTensor<CudaRuntime>,
    pub layout: &'a GemmLayout,
    /// `out += lhs · rhs` (BLAS `beta = 1`, `out` read as `C`) instead of `out = lhs · rhs`.
    pub accumulate: bool,
    /// Multiplies the product before it is stored or added (BLAS `alpha`), in f32.
    pub alpha: f32,
    /// What the product's epilogue does besides storing it.
    pub epilogue: Epilogue<'a>,
}

/// A cuBLASLt epilogue on a vector along the output's columns (BLAS `M`: `n` of the
/// row-major `[m, n]` output), contiguous, in the inputs' dtype, `n` long.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    /// The product alone.
    None,
    /// The vector is added to every row of the output in f32, before the one rounding
    /// (`CUBLASLT_EPILOGUE_BIAS`). Not with `accumulate`.
    Bias(&'a CubeTensor<CudaRuntime>),
    /// The vector is written with the sums of `rhs` over its rows (`k`), accumulated in
    /// f32 while the product reads them (`CUBLASLT_EPILOGUE_BGRADA`: BLAS `A` is `rhs`).
    /// Not with `accumulate`.
    RhsRowSums(&'a CubeTensor<CudaRuntime>),
}

impl<'a> Epilogue<'a> {
    fn kind(self) -> EpilogueKind {
        match self {
            Epilogue::None => EpilogueKind::None,
            Epilogue::Bias(_) => EpilogueKind::Bias,
            Epilogue::RhsRowSums(_) => EpilogueKind::RhsRowSums,
        }
    }

    fn vector(self) -> Option<&'a CubeTensor<CudaRuntime>> {
        match self {
            Epilogue::None => None,
            Epilogue::Bias(v) | Epilogue::RhsRowSums(v) => Some(v),
        }
    }
}

/// [`Epilogue`] without its vector, as plans are keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum EpilogueKind {
    None,
    Bias,
    RhsRowSums,
}

impl EpilogueKind {
    fn cublaslt(self) -> lt_sys::cublasLtEpilogue_t {
        use lt_sys::cublasLtEpilogue_t as E;
        match self {
            EpilogueKind::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            EpilogueKind::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            EpilogueKind::RhsRowSums => E::CUBLASLT_EPILOGUE_BGRADA,
        }
    }
}

/// cuBLASLt reads and writes epilogue vectors with 16-byte accesses.
const EPILOGUE_VECTOR_ALIGN: u64 = 16;

impl Product<'_> {
    /// Bytes per element of BLAS `A` (rhs), `B` (lhs) and the output.
    fn element_sizes(&self) -> [u64; 3] {
        let input = self.lhs.dtype.size() as u64;
        [input, input, self.out.dtype.size() as u64]
    }
}

/// The CUDA data type of a dtype cuBLASLt is used for.
pub(crate) fn data_type(dtype: DType) -> Result<lt_sys::cudaDataType, Unavailable> {
    match dtype {
        DType::F32 => Ok(lt_sys::cudaDataType::CUDA_R_32F),
        DType::F16 => Ok(lt_sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Ok(lt_sys::cudaDataType::CUDA_R_16BF),
        other => Err(Unavailable::Dtype(other)),
    }
}

/// The device's support, setting its resources up on first use.
pub fn device_support(device: &CudaDevice) -> Result<DeviceSupport, Unavailable> {
    let engine = engine(device)?;
    let engine = engine.lock().unwrap_or_else(|e| e.into_inner());
    Ok(DeviceSupport {
        ordinal: engine.ordinal,
        driver_version: engine.driver_version,
        default_ordering: engine.default_ordering(),
        no_cubecl_stream: engine.cubecl_streams.broken.clone(),
        no_context_events: engine.context_events.as_ref().err().cloned(),
        no_stream_memory_operations: engine.stream_memory_operations.clone().err(),
        no_flag_kernels: engine.flag_kernels.as_ref().err().cloned(),
    })
}

/// Makes `ordering` the one `fused_matmul` uses on `device` from now on (`None`: the
/// device's own default again). For tools that cannot run device-side waits: Nsight
/// Compute serializes launches, so a kernel waiting for a flag that a later launch sets
/// never returns; [`MatmulOrdering::HostSynchronization`] runs under it. `Err` when the
/// device cannot do the ordering asked for.
pub fn set_ordering(
    device: &CudaDevice,
    ordering: Option<MatmulOrdering>,
) -> Result<(), Unavailable> {
    let engine = engine(device)?;
    let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ordering) = ordering {
        engine.check_available(ordering)?;
    }
    engine.chosen = ordering;
    Ok(())
}

/// The device thread's host time per phase of the vendor work so far (see
/// [`HostTimes`]).
pub fn host_times(device: &CudaDevice) -> Result<HostTimes, Unavailable> {
    let engine = engine(device)?;
    let engine = engine.lock().unwrap_or_else(|e| e.into_inner());
    Ok(engine.host)
}

/// Runs `product` with `ordering` (`None`: the device's default). `Err` means nothing
/// was launched; a launch failure after the ordering started panics with the error (the
/// flags are written first, so no kernel waits forever).
pub(crate) fn run(
    device: &CudaDevice,
    product: Product<'_>,
    ordering: Option<MatmulOrdering>,
) -> Result<MatmulOrdering, Unavailable> {
    run_chain(device, &[product], ordering)
}

/// Runs `products` (at least one) in order on one stream under one ordering against
/// CubeCL's work (one publish before the first, one completion after the last): a later
/// product may read an earlier one's output. Every plan is found before anything is
/// launched, so `Err` means nothing was launched; a launch failure after the ordering
/// started panics with the error.
pub(crate) fn run_chain(
    device: &CudaDevice,
    products: &[Product<'_>],
    ordering: Option<MatmulOrdering>,
) -> Result<MatmulOrdering, Unavailable> {
    let first = products.first().expect("a chain of at least one product");
    let engine = engine(device)?;
    let client = first.out.client.clone();
    // The lock is never held while waiting for the device thread: queued tasks take it.
    let (ordering, queue) = {
        let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
        state.raise_fault();
        let ordering = ordering.unwrap_or_else(|| state.default_ordering());
        state.check_available(ordering)?;
        let queue = state
            .queueable(products, ordering)
            .then(|| state.queue.clone());
        (ordering, queue)
    };
    if let Some(queue) = queue {
        let owned = products.iter().map(QueuedProduct::new).collect::<Vec<_>>();
        let engine = engine.clone();
        queue.submit(move |_: &mut VendorQueue| {
            let start = Instant::now();
            let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
            let products = owned.iter().map(QueuedProduct::product).collect::<Vec<_>>();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                state.run(&client, &products, ordering)
            }));
            state.host.task += start.elapsed().as_secs_f64();
            let Some(why) = queued_failure(outcome) else {
                return;
            };
            let first = &owned[0];
            state.record_fault(format!(
                "a queued cuBLASLt product failed ({} product(s), the first lhs {:?}, rhs {:?}, {:?}, ordering {}): {why}",
                owned.len(),
                first.lhs.meta.shape(),
                first.rhs.meta.shape(),
                first.lhs.dtype,
                ordering.name()
            ));
        });
        hand_on(&queue);
        counters::record(Kernel::matmul_vendor_queued);
        return Ok(ordering);
    }
    let outcome = client
        .exclusive(|| {
            let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
            state.run(&client, products, ordering)
        })
        .map_err(|e| Unavailable::Setup(format!("CubeCL's device thread: {e:?}")))?;
    match outcome {
        Ok(()) => Ok(ordering),
        Err(Failure::Unavailable(why)) => Err(why),
        Err(Failure::Launch(why)) => panic!(
            "matmul: cuBLASLt failed on CUDA device {} ({} product(s), the first lhs {:?}, rhs {:?}, {:?}, ordering {}): {why}",
            device.index,
            products.len(),
            first.lhs.meta.shape(),
            first.rhs.meta.shape(),
            first.lhs.dtype,
            ordering.name()
        ),
    }
}

/// A [`Product`] owning its tensors, for a queued task.
struct QueuedProduct {
    lhs: CubeTensor<CudaRuntime>,
    rhs: CubeTensor<CudaRuntime>,
    out: CubeTensor<CudaRuntime>,
    layout: GemmLayout,
    accumulate: bool,
    alpha: f32,
    epilogue: QueuedEpilogue,
}

/// An [`Epilogue`] owning its vector.
enum QueuedEpilogue {
    None,
    Bias(CubeTensor<CudaRuntime>),
    RhsRowSums(CubeTensor<CudaRuntime>),
}

impl QueuedProduct {
    fn new(product: &Product<'_>) -> Self {
        Self {
            lhs: product.lhs.clone(),
            rhs: product.rhs.clone(),
            out: product.out.clone(),
            layout: product.layout.clone(),
            accumulate: product.accumulate,
            alpha: product.alpha,
            epilogue: match product.epilogue {
                Epilogue::None => QueuedEpilogue::None,
                Epilogue::Bias(v) => QueuedEpilogue::Bias(v.clone()),
                Epilogue::RhsRowSums(v) => QueuedEpilogue::RhsRowSums(v.clone()),
            },
        }
    }

    fn product(&self) -> Product<'_> {
        Product {
            lhs: &self.lhs,
            rhs: &self.rhs,
            out: &self.out,
            layout: &self.layout,
            accumulate: self.accumulate,
            alpha: self.alpha,
            epilogue: match &self.epilogue {
                QueuedEpilogue::None => Epilogue::None,
                QueuedEpilogue::Bias(v) => Epilogue::Bias(v),
                QueuedEpilogue::RhsRowSums(v) => Epilogue::RhsRowSums(v),
            },
        }
    }
}

/// A service on CubeCL's device thread of each CUDA device (a service of the default
/// stage shares the thread and the queue of CubeCL's server), so that vendor work can be
/// queued there in order with CubeCL's launches without the caller waiting. It holds
/// nothing: a task owns what it needs, and CubeCL's server stays free for the task's own
/// CubeCL calls, which a task queued on the server itself would find borrowed.
struct VendorQueue;

impl DeviceService for VendorQueue {
    fn init(_: DeviceId) -> Self {
        VendorQueue
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        Arc::new(())
    }
}

/// `repeats` copies of `product` back to back on liger's stream, between one host
/// synchronization before and one after: cuBLASLt's cost per call without a per-call
/// ordering, the baseline the ordering protocols are measured against. Seconds per call.
pub(crate) fn run_repeated(
    device: &CudaDevice,
    product: Product<'_>,
    repeats: usize,
) -> Result<f64, Unavailable> {
    let engine = engine(device)?;
    engine
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .raise_fault();
    let client = product.out.client.clone();
    let outcome = client
        .exclusive(|| {
            let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
            state.repeated(&client, &product, repeats)
        })
        .map_err(|e| Unavailable::Setup(format!("CubeCL's device thread: {e:?}")))?;
    match outcome {
        Ok(seconds) => Ok(seconds),
        Err(Failure::Unavailable(why)) => Err(why),
        Err(Failure::Launch(why)) => panic!("matmul: cuBLASLt failed: {why}"),
    }
}

/// Work of another vendor library (cuDNN), on the stream and under the ordering the
/// products use ([`run_ordered`]).
pub(crate) trait StreamWork: Send + 'static {
    /// Whether `prepare` is known to succeed, read on the caller's thread (the work was
    /// planned before and its operands are aligned as then): such work is queued on the
    /// device thread like a planned product, and the caller does not wait for it.
    fn planned(&self) -> bool;
    /// Everything before a launch (device addresses, plans), on CubeCL's device thread with
    /// the device's context bound; `Err` means nothing was launched.
    fn prepare(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        stream: driver_sys::CUstream,
    ) -> Result<(), String>;
    /// Enqueues the work on `stream` (the one `prepare` was given), after `prepare`
    /// succeeded.
    fn launch(&mut self, stream: driver_sys::CUstream) -> Result<(), String>;
}

/// Runs `work` under the device's default ordering (see the module docs) on CubeCL's
/// device thread: queued without the caller waiting when it is [`StreamWork::planned`]
/// (a failure then is reported by the device's next vendor call, as for a queued
/// product), otherwise waited for. `Err` means nothing was launched; a launch failure
/// after the ordering started panics with the error, naming `what`.
pub(crate) fn run_ordered<W: StreamWork>(
    device: &CudaDevice,
    client: &ComputeClient<CudaRuntime>,
    mut work: W,
    what: &'static str,
) -> Result<MatmulOrdering, Unavailable> {
    let engine = engine(device)?;
    let (ordering, queue) = {
        let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
        state.raise_fault();
        let ordering = state.default_ordering();
        let queue = (ordering != MatmulOrdering::HostSynchronization && work.planned())
            .then(|| state.queue.clone());
        (ordering, queue)
    };
    if let Some(queue) = queue {
        let engine = engine.clone();
        let client = client.clone();
        queue.submit(move |_: &mut VendorQueue| {
            let start = Instant::now();
            let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                state.run_work(&client, &mut work, ordering)
            }));
            state.host.task += start.elapsed().as_secs_f64();
            if let Some(why) = queued_failure(outcome) {
                state.record_fault(format!(
                    "a queued {what} failed (ordering {}): {why}",
                    ordering.name()
                ));
            }
        });
        hand_on(&queue);
        counters::record(Kernel::vendor_work_queued);
        return Ok(ordering);
    }
    // The lock is taken on the device thread: queued tasks ahead of this one take it too.
    let outcome = client
        .exclusive(|| {
            let mut state = engine.lock().unwrap_or_else(|e| e.into_inner());
            state.run_work(client, &mut work, ordering)
        })
        .map_err(|e| Unavailable::Setup(format!("CubeCL's device thread: {e:?}")))?;
    match outcome {
        Ok(()) => Ok(ordering),
        Err(Failure::Unavailable(why)) => Err(why),
        Err(Failure::Launch(why)) => panic!(
            "{what} failed on CUDA device {} (ordering {}): {why}",
            device.index,
            ordering.name()
        ),
    }
}

/// Hands the device thread's queue on at once, unless the calling thread's hand-off
/// leaves batching to the runtime ([`crate::hand_off`]).
fn hand_on(queue: &DeviceHandle<VendorQueue>) {
    if crate::hand_off::current() != crate::hand_off::HandOff::Runtime {
        queue.flush_queue();
    }
}

/// Why a queued task's work failed (`None`: it ran), whether it declined, failed to
/// launch or panicked.
fn queued_failure(outcome: std::thread::Result<Result<(), Failure>>) -> Option<String> {
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(Failure::Unavailable(why))) => Some(why.to_string()),
        Ok(Err(Failure::Launch(why))) => Some(why),
        Err(panic) => Some(panic_text(panic.as_ref())),
    }
}

fn engine(device: &CudaDevice) -> Result<Arc<Mutex<Engine>>, Unavailable> {
    static ENGINES: PerDevice<Engine> = PerDevice::new();
    ENGINES
        .get(
            device.index,
            || Engine::new(device),
            |why| {
                format!(
                    "liger matmul: cuBLASLt is unavailable on CUDA device {}, so matmuls run on \
                     Burn's own kernels ({why}); install CUDA's libcublasLt to use it",
                    device.index
                )
            },
        )
        .map_err(Unavailable::Setup)
}

/// Why a product failed, before (nothing launched) or after the ordering started.
type Failure = super::vendor_engines::Failure<Unavailable>;

/// The resources of one device.
struct Engine {
    ordinal: usize,
    driver_version: i32,
    ctx: Arc<CudaContext>,
    /// Streaming multiprocessors of the device.
    sm_count: u32,
    stream: Arc<CudaStream>,
    handle: LtHandle,
    workspace: DeviceMemory,
    /// `u32` flags (`cube::sequence` slots), a CubeCL buffer so CubeCL kernels can bind
    /// it; held for the life of the process, so its address never changes.
    flags: Handle,
    flags_address: u64,
    /// The last sequence number published.
    sequence: u32,
    /// `Err(why)` when the driver or device cannot do stream memory operations.
    stream_memory_operations: Result<(), String>,
    /// The flag kernels, or why they could not be loaded and run.
    flag_kernels: Result<FlagKernels, String>,
    /// The context-event ordering, or why the driver cannot run it.
    context_events: Result<ContextEvents, String>,
    /// CubeCL's streams found so far, for [`MatmulOrdering::CubeclStream`].
    cubecl_streams: CubeclStreams,
    /// The ordering asked for by [`set_ordering`], in place of the device's default.
    chosen: Option<MatmulOrdering>,
    plans: HashMap<PlanKey, Plan>,
    /// Plan keys without their alignments ([`PlanKey::layout_only`]) that cuBLASLt has
    /// planned: products of these layouts are queued.
    planned: HashSet<PlanKey>,
    /// Where products are queued on CubeCL's device thread.
    queue: DeviceHandle<VendorQueue>,
    /// Why a queued product failed, until the next call reports it.
    fault: Option<String>,
    /// Host time per phase (see [`HostTimes`]).
    host: HostTimes,
}

// Safety: the raw cuBLASLt and driver handles are used only under the engine's lock,
// from one thread at a time; the CUDA objects themselves are not tied to a thread.
unsafe impl Send for Engine {}

impl Engine {
    fn new(device: &CudaDevice) -> Result<Self, String> {
        // cudarc would panic on first use; this names the library instead.
        if !unsafe { lt_sys::is_culib_present() } {
            return Err(format!(
                "the cuBLASLt library was not found (tried {})",
                cudarc::get_lib_name_candidates("cublasLt").join(", ")
            ));
        }
        let cuda = |what: &str, e: driver::DriverError| format!("{what}: {e:?}");
        // CubeCL runs on the device's primary context; so do we.
        let ctx = CudaContext::new(device.index).map_err(|e| cuda("CUDA context", e))?;
        let mut driver_version = 0;
        unsafe { driver_sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| cuda("driver version", e))?;
        let sm_count = ctx
            .attribute(driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| cuda("multiprocessor count", e))? as u32;
        let stream = ctx.new_stream().map_err(|e| cuda("CUDA stream", e))?;
        let handle = LtHandle(lt::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?);
        let workspace = DeviceMemory::new(WORKSPACE_BYTES).map_err(|e| cuda("workspace", e))?;

        let client = CudaRuntime::client(device);
        let flags = sequence::new_flags(&client);
        let flags_address = client
            .get_resource(flags.clone())
            .map_err(|e| format!("flag buffer: {e:?}"))?
            .resource()
            .ptr;
        // The flags' initial zeros are written on CubeCL's stream; our stream reads them.
        cubecl::future::block_on(client.sync()).map_err(|e| format!("CubeCL sync: {e:?}"))?;

        let stream_memory_operations = probe_stream_memory_operations(
            &ctx,
            &stream,
            flags_address + (sequence::PROBE * 4) as u64,
        )
        .and_then(|()| {
            // Compiles and launches the ordering kernels once (publish 0 over the initial
            // 0, await 0), so that a failure shows here rather than as a wait that never
            // ends; CubeCL reports launch failures at the synchronization.
            sequence::launch_publish(&client, &flags, 0);
            sequence::launch_await(&client, &flags, 0);
            cubecl::future::block_on(client.sync())
                .map_err(|e| format!("the ordering kernels failed on CubeCL's stream: {e:?}"))
        });
        let context_events = ctx
            .bind_to_thread()
            .map_err(|e| cuda("binding the CUDA context", e))
            .and_then(|()| {
                // cudarc's loader panics on a symbol the driver lacks (`cuGetProcAddress_v2`
                // before CUDA 12).
                std::panic::catch_unwind(|| ContextEvents::new(ctx.cu_ctx(), stream.cu_stream()))
                    .unwrap_or_else(|p| Err(panic_text(p.as_ref())))
            });
        let flag_kernels = match &stream_memory_operations {
            // Not needed: nothing is loaded.
            Ok(()) => Err("stream memory operations are used instead".to_string()),
            Err(_) => FlagKernels::load().and_then(|kernels| {
                kernels.probe(&stream, flags_address + (sequence::PROBE * 4) as u64)?;
                // The ordering kernels on CubeCL's side, as above.
                sequence::launch_publish(&client, &flags, 0);
                sequence::launch_await(&client, &flags, 0);
                cubecl::future::block_on(client.sync()).map_err(|e| {
                    format!("the ordering kernels failed on CubeCL's stream: {e:?}")
                })?;
                Ok(kernels)
            }),
        };
        let cubecl_streams = CubeclStreams::new(&client, &flags)?;
        let engine = Engine {
            ordinal: device.index,
            driver_version,
            ctx,
            sm_count,
            stream,
            handle,
            workspace,
            flags,
            flags_address,
            sequence: 0,
            stream_memory_operations,
            flag_kernels,
            context_events,
            cubecl_streams,
            chosen: None,
            plans: HashMap::new(),
            planned: HashSet::new(),
            queue: DeviceHandle::new(device.to_id()),
            fault: None,
            host: HostTimes::default(),
        };
        log::info!(
            "liger matmul: cuBLASLt on CUDA device {} (driver {}), ordering by {}{}",
            engine.ordinal,
            engine.driver_version,
            engine.default_ordering().name(),
            match (
                &engine.cubecl_streams.broken,
                &engine.context_events,
                &engine.stream_memory_operations
            ) {
                (None, _, _) => String::new(),
                (Some(stream), Ok(_), _) | (Some(stream), _, Ok(())) => format!(" ({stream})"),
                (Some(stream), Err(events), Err(memory_operations)) => {
                    format!(" ({stream}; {events}; {memory_operations})")
                }
            }
        );
        Ok(engine)
    }

    /// Whether `products` are queued rather than waited for (see the module docs).
    fn queueable(&self, products: &[Product<'_>], ordering: MatmulOrdering) -> bool {
        ordering != MatmulOrdering::HostSynchronization
            && products
                .iter()
                .all(|product| match product.epilogue.vector() {
                    None => self
                        .plan_key(product, [0; 3], ordering)
                        .is_ok_and(|key| self.planned.contains(&key)),
                    Some(vector) => match self.epilogue_not_queueable(product, vector, ordering) {
                        None => true,
                        Some(why) => {
                            log::debug!(
                                "cuBLASLt: a product with an epilogue is waited for: {why}"
                            );
                            #[cfg(feature = "test-hooks")]
                            crate::test_hooks::record_epilogue_not_queued(why);
                            false
                        }
                    },
                })
    }

    /// Why `product`, with epilogue vector `vector`, cannot be queued (`None`: it can). An
    /// epilogue runs only on a plan made for its operands' own alignments, and only with
    /// an aligned vector: both are read from the handles here, and a queued task cannot
    /// fall back.
    fn epilogue_not_queueable(
        &self,
        product: &Product<'_>,
        vector: &CubeTensor<CudaRuntime>,
        ordering: MatmulOrdering,
    ) -> Option<String> {
        if product.accumulate || is_batched(product) {
            return Some("it accumulates or takes more than one BLAS call".into());
        }
        let offsets = [product.rhs, product.lhs, product.out, vector].map(handle_offset);
        if !offsets[3].is_some_and(|at| at.is_multiple_of(EPILOGUE_VECTOR_ALIGN)) {
            return Some(format!(
                "its vector's offset {:?} is not {EPILOGUE_VECTOR_ALIGN}-byte aligned",
                offsets[3]
            ));
        }
        let Some(aligns) = caller_aligns(product) else {
            return Some("the memory alignment does not tell the operands' alignments".into());
        };
        let key = match self.plan_key(product, aligns, ordering) {
            Ok(key) => key,
            Err(why) => return Some(why.to_string()),
        };
        if self.plans.contains_key(&key) {
            return None;
        }
        let planned = self
            .plans
            .keys()
            .filter(|k| k.layout_only() == key.layout_only())
            .map(|k| k.aligns)
            .collect::<Vec<_>>();
        Some(format!(
            "no plan for its predicted alignments {aligns:?} (A, B, out; handle offsets {offsets:?},              m {} n {} k {}); its layout is planned for {planned:?}",
            key.m, key.n, key.k
        ))
    }

    /// Logs a queued product's failure, to be reported by the next call.
    fn record_fault(&mut self, why: String) {
        log::error!("CUDA device {}: {why}", self.ordinal);
        self.fault.get_or_insert(why);
    }

    /// Panics with a queued product's failure, once.
    fn raise_fault(&mut self) {
        if let Some(why) = self.fault.take() {
            panic!(
                "vendor work on CUDA device {}: {why}; the outputs of that work are wrong",
                self.ordinal
            );
        }
    }

    /// The multiprocessors a product may plan for under `ordering` (0: all of them). While
    /// a product runs under the flag protocols, CubeCL's await kernel spins on one
    /// multiprocessor; cuBLASLt's persistent kernels launch one block per multiprocessor
    /// with nearly all of its shared memory, so the block that cannot share the spinner's
    /// multiprocessor would wait for another to finish and stretch the product (15-22%
    /// on the H200's largest products). Planning for one fewer leaves that one to the
    /// spinner at the cost of 1/`sm_count` of the product's throughput.
    fn sm_count_target(&self, ordering: MatmulOrdering) -> u32 {
        match ordering {
            MatmulOrdering::StreamMemoryOperations | MatmulOrdering::FlagKernels => {
                self.sm_count.saturating_sub(1)
            }
            MatmulOrdering::CubeclStream
            | MatmulOrdering::ContextEvents
            | MatmulOrdering::HostSynchronization => 0,
        }
    }

    fn default_ordering(&self) -> MatmulOrdering {
        if let Some(chosen) = self.chosen {
            return chosen;
        }
        MatmulOrdering::ALL
            .into_iter()
            .find(|&ordering| self.check_available(ordering).is_ok())
            .unwrap_or(MatmulOrdering::HostSynchronization)
    }

    /// `Err` when this device cannot run `ordering`.
    fn check_available(&self, ordering: MatmulOrdering) -> Result<(), Unavailable> {
        match ordering {
            MatmulOrdering::CubeclStream => match &self.cubecl_streams.broken {
                None => Ok(()),
                Some(why) => Err(Unavailable::NoCubeclStream(why.clone())),
            },
            MatmulOrdering::ContextEvents => match &self.context_events {
                Ok(_) => Ok(()),
                Err(why) => Err(Unavailable::NoContextEvents(why.clone())),
            },
            MatmulOrdering::StreamMemoryOperations => self
                .stream_memory_operations
                .clone()
                .map_err(Unavailable::NoStreamMemoryOperations),
            MatmulOrdering::FlagKernels => match &self.flag_kernels {
                Ok(_) => Ok(()),
                Err(why) => Err(Unavailable::NoFlagKernels(why.clone())),
            },
            MatmulOrdering::HostSynchronization => Ok(()),
        }
    }

    /// Binds the context, reads the tensors' device addresses and finds (or builds) the
    /// plan: everything before a launch. Runs on CubeCL's device thread.
    fn prepare(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        product: &Product<'_>,
        ordering: MatmulOrdering,
    ) -> Result<Prepared, Failure> {
        let unavailable = |why: String| Failure::Unavailable(Unavailable::Setup(why));
        self.ctx
            .bind_to_thread()
            .map_err(|e| unavailable(format!("binding the CUDA context: {e:?}")))?;
        // Device addresses; asking for them also makes CubeCL's stream wait for inputs
        // produced on its other streams.
        let address = |t: &CubeTensor<CudaRuntime>| {
            client
                .get_resource(t.handle.clone())
                .map(|r| r.resource().ptr)
                .map_err(|e| unavailable(format!("device address of a tensor: {e:?}")))
        };
        let addresses = [
            address(product.rhs)?,
            address(product.lhs)?,
            address(product.out)?,
        ];
        let vector = match product.epilogue.vector() {
            Some(v) => {
                let at = address(v)?;
                if at % EPILOGUE_VECTOR_ALIGN != 0 || product.accumulate || is_batched(product) {
                    return Err(Failure::Unavailable(Unavailable::NoAlgorithm(format!(
                        "an epilogue vector needs a {EPILOGUE_VECTOR_ALIGN}-byte aligned address \
                         (this one: {at:#x}), no accumulation and a single BLAS call"
                    ))));
                }
                at
            }
            None => 0,
        };
        let elements = product.element_sizes();
        let aligns = operand_aligns(product, addresses);
        let key = self
            .plan_key(product, aligns, ordering)
            .map_err(Failure::Unavailable)?;
        if !self.plans.contains_key(&key) {
            if self.plans.len() >= MAX_PLANS {
                self.plans.clear();
                self.planned.clear();
            }
            // cuBLASLt's kernels for the elements' own alignment take any address of
            // them: the plan for an alignment that has no algorithm of its own.
            let plan = Plan::new(self.handle.0, &key)
                .or_else(|_| Plan::new(self.handle.0, &key.element_aligned(elements)))
                .map_err(Failure::Unavailable)?;
            self.plans.insert(key, plan);
            self.planned.insert(key.layout_only());
        }
        Ok(Prepared {
            addresses,
            vector,
            key,
        })
    }

    /// The plan key of `product` with operand alignments `aligns` under `ordering`.
    fn plan_key(
        &self,
        product: &Product<'_>,
        aligns: [u32; 3],
        ordering: MatmulOrdering,
    ) -> Result<PlanKey, Unavailable> {
        let layout = product.layout;
        Ok(PlanKey {
            dtype: data_type(product.lhs.dtype)?,
            out_dtype: data_type(product.out.dtype)?,
            accumulate: product.accumulate,
            m: layout.m,
            n: layout.n,
            k: layout.k,
            a: layout.a,
            b: layout.b,
            ld_out: layout.ld_out,
            batch: layout.batch,
            batch_strides: layout.batch_strides,
            aligns,
            sm_count_target: self.sm_count_target(ordering),
            epilogue: product.epilogue.kind(),
        })
    }

    /// Enqueues the product's BLAS calls on `stream` (no ordering).
    fn enqueue(
        &self,
        product: &Product<'_>,
        prepared: &Prepared,
        stream: driver_sys::CUstream,
    ) -> Result<(), String> {
        let plan = &self.plans[&prepared.key];
        let elements = product.element_sizes();
        for call in &product.layout.calls {
            let at = |x: usize| prepared.addresses[x] + call[x] * elements[x];
            plan.launch(
                self.handle.0,
                product.alpha,
                [at(0), at(1), at(2)],
                prepared.vector,
                &self.workspace,
                stream as lt_sys::cudaStream_t,
            )?;
        }
        Ok(())
    }

    /// `repeats` products back to back between one synchronization of CubeCL's stream
    /// before and one of liger's after; seconds per product. Runs on CubeCL's device
    /// thread.
    fn repeated(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        product: &Product<'_>,
        repeats: usize,
    ) -> Result<f64, Failure> {
        let prepared = self.prepare(client, product, MatmulOrdering::HostSynchronization)?;
        cubecl::future::block_on(client.sync())
            .map_err(|e| Failure::Launch(format!("synchronizing CubeCL's stream: {e:?}")))?;
        let start = std::time::Instant::now();
        let mut result = Ok(());
        for _ in 0..repeats.max(1) {
            result =
                result.and_then(|()| self.enqueue(product, &prepared, self.stream.cu_stream()));
        }
        let sync = unsafe { driver::stream::synchronize(self.stream.cu_stream()) }
            .map_err(|e| format!("synchronizing liger's stream: {e:?}"));
        result.and(sync).map_err(Failure::Launch)?;
        Ok(start.elapsed().as_secs_f64() / repeats.max(1) as f64)
    }

    /// Enqueues `products` in order on `stream` (no ordering); stops at the first failure.
    fn enqueue_all(
        &self,
        products: &[Product<'_>],
        prepared: &[Prepared],
        stream: driver_sys::CUstream,
    ) -> Result<(), String> {
        products
            .iter()
            .zip(prepared)
            .try_for_each(|(product, prepared)| self.enqueue(product, prepared, stream))
    }

    /// The ordering that actually runs for `ordering` and the stream the work goes on:
    /// CubeCL's stream of the task for [`MatmulOrdering::CubeclStream`] (found on first
    /// use; when it cannot be found, that ordering is given up for the process and the
    /// next available one runs instead), liger's stream otherwise. Runs on CubeCL's device
    /// thread.
    fn resolve(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        ordering: MatmulOrdering,
    ) -> (MatmulOrdering, driver_sys::CUstream) {
        if ordering == MatmulOrdering::CubeclStream {
            match self.cubecl_streams.current(client, &self.flags) {
                Ok(stream) => return (ordering, stream),
                Err(why) => {
                    let fallback = self.default_ordering_after(ordering);
                    log::warn!(
                        "liger matmul: CubeCL's stream was not found on CUDA device {} ({why}); \
                         products are ordered by {} from now on",
                        self.ordinal,
                        fallback.name()
                    );
                    self.cubecl_streams.broken = Some(why);
                    return (fallback, self.stream.cu_stream());
                }
            }
        }
        (ordering, self.stream.cu_stream())
    }

    /// The first ordering after `ordering` in [`MatmulOrdering::ALL`] this device runs.
    fn default_ordering_after(&self, ordering: MatmulOrdering) -> MatmulOrdering {
        MatmulOrdering::ALL
            .into_iter()
            .skip_while(|&o| o != ordering)
            .skip(1)
            .find(|&o| self.check_available(o).is_ok())
            .unwrap_or(MatmulOrdering::HostSynchronization)
    }

    /// Runs on CubeCL's device thread (in a queued task or `ComputeClient::exclusive`).
    fn run(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        products: &[Product<'_>],
        ordering: MatmulOrdering,
    ) -> Result<(), Failure> {
        // A chain's plans must all stay cached until it is enqueued.
        if self.plans.len() + products.len() > MAX_PLANS {
            self.plans.clear();
        }
        let start = Instant::now();
        let (ordering, stream) = self.resolve(client, ordering);
        let prepared = products
            .iter()
            .map(|product| self.prepare(client, product, ordering))
            .collect::<Result<Vec<_>, _>>()?;
        self.host.prepare += start.elapsed().as_secs_f64();
        if ordering != MatmulOrdering::HostSynchronization {
            self.host.products += products.len() as u64;
        }
        self.ordered(client, ordering, stream, &mut |engine: &Engine| {
            engine.enqueue_all(products, &prepared, stream)
        })
    }

    /// Another library's `work` under `ordering`. Runs on CubeCL's device thread.
    fn run_work(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        work: &mut dyn StreamWork,
        ordering: MatmulOrdering,
    ) -> Result<(), Failure> {
        self.ctx.bind_to_thread().map_err(|e| {
            Failure::Unavailable(Unavailable::Setup(format!(
                "binding the CUDA context: {e:?}"
            )))
        })?;
        let (ordering, stream) = self.resolve(client, ordering);
        work.prepare(client, stream)
            .map_err(|why| Failure::Unavailable(Unavailable::Library(why)))?;
        self.ordered(client, ordering, stream, &mut |_: &Engine| {
            work.launch(stream)
        })
    }

    /// Enqueues `launch` on `stream` (from [`Engine::resolve`]) between the ordering of
    /// `ordering` (see the module docs). Runs on CubeCL's device thread, after everything
    /// `launch` needs was prepared: a failure from here on is a [`Failure::Launch`].
    fn ordered(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        ordering: MatmulOrdering,
        stream: driver_sys::CUstream,
        launch: &mut dyn FnMut(&Engine) -> Result<(), String>,
    ) -> Result<(), Failure> {
        let outcome = self.ordered_on(client, ordering, stream, launch);
        // `Unavailable`: nothing was enqueued, the last vendor work is still where it was.
        if !matches!(outcome, Err(Failure::Unavailable(_))) {
            self.cubecl_streams.last = Some(stream as usize);
        }
        outcome
    }

    fn ordered_on(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        ordering: MatmulOrdering,
        stream: driver_sys::CUstream,
        launch: &mut dyn FnMut(&Engine) -> Result<(), String>,
    ) -> Result<(), Failure> {
        match ordering {
            MatmulOrdering::CubeclStream => {
                let start = Instant::now();
                // Nothing was enqueued when this fails.
                self.cubecl_streams
                    .hand_over(stream)
                    .map_err(|why| Failure::Unavailable(Unavailable::NoCubeclStream(why)))?;
                let ordered_at = Instant::now();
                let work = launch(self);
                self.host.publish += (ordered_at - start).as_secs_f64();
                self.host.vendor += ordered_at.elapsed().as_secs_f64();
                work.map_err(Failure::Launch)
            }
            MatmulOrdering::ContextEvents => {
                let events = self.context_events.as_ref().map_err(|why| {
                    Failure::Unavailable(Unavailable::NoContextEvents(why.clone()))
                })?;
                let start = Instant::now();
                // Nothing was enqueued when this fails.
                events
                    .before(stream)
                    .map_err(|why| Failure::Unavailable(Unavailable::NoContextEvents(why)))?;
                let ordered_at = Instant::now();
                let work = launch(self);
                let vendor_done = Instant::now();
                // Recorded even when the work failed to launch: the event then covers what
                // did, and later work waits for that.
                let after = events.after(stream);
                let host = &mut self.host;
                host.publish += (ordered_at - start).as_secs_f64();
                host.vendor += (vendor_done - ordered_at).as_secs_f64();
                host.await_kernel += vendor_done.elapsed().as_secs_f64();
                if let Err(e) = after {
                    // Later work would not wait for ours: the host does instead.
                    let sync = unsafe { driver::stream::synchronize(stream) };
                    return Err(Failure::Launch(format!(
                        "{e} (then synchronizing liger's stream: {sync:?}); {}",
                        work.err().unwrap_or_default()
                    )));
                }
                work.map_err(Failure::Launch)
            }
            MatmulOrdering::StreamMemoryOperations | MatmulOrdering::FlagKernels => {
                let published = self.flags_address + (sequence::PUBLISHED * 4) as u64;
                let completed = self.flags_address + (sequence::COMPLETED * 4) as u64;
                let s = self.sequence.wrapping_add(1);
                if ordering == MatmulOrdering::FlagKernels
                    && let Err(why) = &self.flag_kernels
                {
                    return Err(Failure::Unavailable(Unavailable::NoFlagKernels(
                        why.clone(),
                    )));
                }
                // Both CubeCL kernels were launched once when the engine was set up: CubeCL
                // only reports a launch failure at its next flush, and flushing here would
                // block the host on the previous call's fence.
                let start = Instant::now();
                sequence::launch_publish(client, &self.flags, s);
                let published_at = Instant::now();
                self.host.publish += (published_at - start).as_secs_f64();
                self.sequence = s;
                let engine = &*self;
                let flags = match (ordering, &engine.flag_kernels) {
                    (MatmulOrdering::FlagKernels, Ok(kernels)) => DeviceFlags::Kernels(kernels),
                    _ => DeviceFlags::MemoryOperations,
                };
                // Without the wait the work would not be ordered after its inputs.
                let work = flags
                    .wait_geq(stream, published, s)
                    .and_then(|()| launch(engine));
                let written = flags.write(stream, completed, s);
                let vendor_done = Instant::now();
                self.host.vendor += (vendor_done - published_at).as_secs_f64();
                match written {
                    Ok(()) => {
                        sequence::launch_await(client, &self.flags, s);
                        self.host.await_kernel += vendor_done.elapsed().as_secs_f64();
                    }
                    // No await kernel may wait for a flag that will not come: order the
                    // host after our stream instead (its wait is satisfied by the
                    // publish kernel already issued).
                    Err(e) => {
                        let sync = unsafe { driver::stream::synchronize(stream) };
                        return Err(Failure::Launch(format!(
                            "{e} (then synchronizing liger's stream: {sync:?}); {}",
                            work.err().unwrap_or_default()
                        )));
                    }
                }
                work.map_err(Failure::Launch)
            }
            MatmulOrdering::HostSynchronization => {
                cubecl::future::block_on(client.sync()).map_err(|e| {
                    Failure::Launch(format!("synchronizing CubeCL's stream: {e:?}"))
                })?;
                let work = launch(self);
                let sync = unsafe { driver::stream::synchronize(stream) }
                    .map_err(|e| format!("synchronizing liger's stream: {e:?}"));
                work.and(sync).map_err(Failure::Launch)
            }
        }
    }
}

/// CubeCL's streams found so far ([`MatmulOrdering::CubeclStream`]), by the `StreamId`
/// whose kernels CubeCL launches on them.
struct CubeclStreams {
    found: HashMap<u64, usize>,
    /// Why the ordering is given up, once a search failed.
    broken: Option<String>,
    /// The stream the last vendor work was enqueued on (liger's or one of CubeCL's).
    last: Option<usize>,
    /// Recorded on `last` when work moves to another stream, which waits for it.
    handover: driver_sys::CUevent,
}

// Safety: used under the owning engine's lock, from one thread at a time; CUDA streams
// and events are not tied to a thread.
unsafe impl Send for CubeclStreams {}

impl CubeclStreams {
    /// Finds the stream of the calling thread's `StreamId` on CubeCL's device thread: a
    /// failure only disables the ordering (`broken`); `Err` when no event can be created.
    fn new(client: &ComputeClient<CudaRuntime>, flags: &Handle) -> Result<Self, String> {
        let handover = new_event().map_err(|e| format!("creating an event: {e:?}"))?;
        let mut streams = CubeclStreams {
            found: HashMap::new(),
            broken: None,
            last: None,
            handover,
        };
        let found = client
            .exclusive(|| streams.current(client, flags).map(|_| ()))
            .unwrap_or_else(|e| Err(format!("CubeCL's device thread: {e:?}")));
        if let Err(why) = found {
            streams.broken = Some(why);
        }
        Ok(streams)
    }

    /// The stream CubeCL launches the current task's kernels on, found on first use by
    /// watching a marker launch (`super::cupti`). Runs on CubeCL's device thread, where
    /// the task's `StreamId` is the caller's.
    fn current(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        flags: &Handle,
    ) -> Result<driver_sys::CUstream, String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        let id = cubecl_common::stream_id::StreamId::current().value;
        if let Some(&stream) = self.found.get(&id) {
            return Ok(stream as driver_sys::CUstream);
        }
        let stream = super::cupti::stream_of_launches(|| sequence::launch_mark(client, flags))?;
        log::debug!("liger matmul: CubeCL stream {stream:?} for stream id {id}");
        self.found.insert(id, stream as usize);
        Ok(stream)
    }

    /// Makes `stream` wait for the vendor work enqueued last, when that went to another
    /// stream: the cuBLASLt and cuDNN workspaces then serve one stream at a time. Nothing
    /// is enqueued when it fails.
    fn hand_over(&mut self, stream: driver_sys::CUstream) -> Result<(), String> {
        let Some(last) = self.last.filter(|&last| last != stream as usize) else {
            return Ok(());
        };
        // Safety: a stream of this context that is still alive (CubeCL's streams live as
        // long as its server, liger's as long as the engine) and our own event.
        unsafe { driver_sys::cuEventRecord(self.handover, last as driver_sys::CUstream) }
            .result()
            .map_err(|e| format!("cuEventRecord: {e:?}"))?;
        unsafe { driver_sys::cuStreamWaitEvent(stream, self.handover, 0) }
            .result()
            .map_err(|e| format!("cuStreamWaitEvent: {e:?}"))
    }
}

impl Drop for CubeclStreams {
    fn drop(&mut self) {
        // Safety: created in `new`, destroyed once; CUDA defers the release of an event
        // that pending work still waits for.
        unsafe { driver_sys::cuEventDestroy_v2(self.handover) };
    }
}

/// Whether the driver takes 32-bit stream memory operations on this device: the
/// documented attribute, then a real wait and write on a scratch flag (the driver returns
/// `CUDA_ERROR_NOT_SUPPORTED` where they are unavailable).
fn probe_stream_memory_operations(
    ctx: &CudaContext,
    stream: &CudaStream,
    scratch: u64,
) -> Result<(), String> {
    // Up to CUDA 11 the operations were optional (a kernel module parameter) and reported
    // by CAN_USE_STREAM_MEM_OPS; since CUDA 12 the 32-bit ones are always present and
    // that attribute is deprecated, so the probe below decides.
    let nor = ctx
        .attribute(
            driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR,
        )
        .map_err(|e| format!("querying CAN_USE_STREAM_WAIT_VALUE_NOR: {e:?}"))?;
    let probe = std::panic::catch_unwind(|| unsafe {
        let s = stream.cu_stream();
        driver_sys::cuStreamWriteValue32_v2(s, scratch, 1, 0).result()?;
        driver_sys::cuStreamWaitValue32_v2(
            s,
            scratch,
            1,
            driver_sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
        .result()?;
        driver::stream::synchronize(s)
    });
    match probe {
        Ok(Ok(())) => {
            log::debug!(
                "liger matmul: stream memory operations work (CAN_USE_STREAM_WAIT_VALUE_NOR = {nor})"
            );
            Ok(())
        }
        Ok(Err(e)) => Err(format!(
            "cuStreamWaitValue32/cuStreamWriteValue32 failed: {e:?} (CAN_USE_STREAM_WAIT_VALUE_NOR = {nor})"
        )),
        Err(p) => Err(format!(
            "the driver has no stream memory operations: {}",
            panic_text(p.as_ref())
        )),
    }
}

/// PTX of the flag kernels (one thread each; PTX ISA 7.0, sm_70 and later, JIT-compiled
/// by the driver). `liger_wait_geq` spins until `(int)(*flag - value) >= 0` (the cyclic
/// comparison of `cuStreamWaitValue32`'s `GEQ`) with acquire loads at GPU scope;
/// `liger_write` fences, then stores `value` with release semantics, so everything the
/// stream wrote before (the products) is visible before the flag.
const FLAG_KERNELS_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry liger_wait_geq(
    .param .u64 flag,
    .param .u32 value
)
{
    .reg .pred %p;
    .reg .b32 %v, %x, %d;
    .reg .b64 %a;
    ld.param.u64 %a, [flag];
    ld.param.u32 %v, [value];
    cvta.to.global.u64 %a, %a;
SPIN:
    ld.acquire.gpu.global.u32 %x, [%a];
    sub.s32 %d, %x, %v;
    setp.lt.s32 %p, %d, 0;
    @%p bra SPIN;
    ret;
}

.visible .entry liger_write(
    .param .u64 flag,
    .param .u32 value
)
{
    .reg .b32 %v;
    .reg .b64 %a;
    ld.param.u64 %a, [flag];
    ld.param.u32 %v, [value];
    cvta.to.global.u64 %a, %a;
    fence.sc.gpu;
    st.release.gpu.global.u32 [%a], %v;
    ret;
}
"#;

/// The flag kernels, loaded into the device's primary context (CubeCL's too).
struct FlagKernels {
    module: driver_sys::CUmodule,
    wait: driver_sys::CUfunction,
    write: driver_sys::CUfunction,
}

impl FlagKernels {
    /// Loads the module; the caller has bound the context.
    fn load() -> Result<Self, String> {
        let ptx = std::ffi::CString::new(FLAG_KERNELS_PTX).expect("PTX without NUL bytes");
        // Safety: a NUL-terminated PTX image; the module is unloaded in `drop`.
        let module = unsafe { driver::module::load_data(ptx.as_ptr() as *const c_void) }
            .map_err(|e| format!("loading the flag kernels' PTX: {e:?}"))?;
        let function = |name: &str| {
            // Safety: `module` is loaded; the name is one of its entries.
            unsafe { driver::module::get_function(module, std::ffi::CString::new(name).unwrap()) }
                .map_err(|e| format!("flag kernel {name}: {e:?}"))
        };
        let kernels = FlagKernels {
            module,
            wait: function("liger_wait_geq")?,
            write: function("liger_write")?,
        };
        Ok(kernels)
    }

    fn launch(
        &self,
        function: driver_sys::CUfunction,
        stream: driver_sys::CUstream,
        flag: u64,
        value: u32,
    ) -> Result<(), String> {
        let (mut flag, mut value) = (flag, value);
        let mut params = [
            &mut flag as *mut u64 as *mut c_void,
            &mut value as *mut u32 as *mut c_void,
        ];
        // Safety: the two parameters match the entries' signatures (u64, u32); `flag` is
        // a device address of a live `u32`.
        unsafe { driver::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream, &mut params) }
            .map_err(|e| format!("{e:?}"))
    }

    /// Enqueues a wait until `flag ≥ value` (cyclic) on `stream`.
    fn wait_geq(&self, stream: driver_sys::CUstream, flag: u64, value: u32) -> Result<(), String> {
        self.launch(self.wait, stream, flag, value)
            .map_err(|e| format!("the flag wait kernel: {e}"))
    }

    /// Enqueues `flag = value` on `stream`, after everything before it.
    fn write(&self, stream: driver_sys::CUstream, flag: u64, value: u32) -> Result<(), String> {
        self.launch(self.write, stream, flag, value)
    }

    /// A write and a wait on a scratch flag, synchronized: the kernels load and run.
    fn probe(&self, stream: &CudaStream, scratch: u64) -> Result<(), String> {
        let s = stream.cu_stream();
        self.write(s, scratch, 2)?;
        self.wait_geq(s, scratch, 2)?;
        // Safety: synchronizing our own stream.
        unsafe { driver::stream::synchronize(s) }
            .map_err(|e| format!("running the flag kernels: {e:?}"))
    }
}

impl Drop for FlagKernels {
    fn drop(&mut self) {
        // Safety: loaded by `cuModuleLoadData`, unloaded once.
        let _ = unsafe { driver::module::unload(self.module) };
    }
}

/// How liger's stream waits for and writes the ordering flags on the device.
enum DeviceFlags<'a> {
    /// `cuStreamWaitValue32` / `cuStreamWriteValue32`.
    MemoryOperations,
    /// liger's one-thread kernels.
    Kernels(&'a FlagKernels),
}

impl DeviceFlags<'_> {
    /// Enqueues a wait until `flag ≥ value` (cyclic) on `stream`.
    fn wait_geq(&self, stream: driver_sys::CUstream, flag: u64, value: u32) -> Result<(), String> {
        match self {
            DeviceFlags::MemoryOperations => unsafe {
                driver_sys::cuStreamWaitValue32_v2(
                    stream,
                    flag,
                    value,
                    driver_sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            }
            .result()
            .map_err(|e| format!("cuStreamWaitValue32: {e:?}")),
            DeviceFlags::Kernels(k) => k.wait_geq(stream, flag, value),
        }
    }

    /// Enqueues `flag = value` on `stream`, after everything before it (the default
    /// memory barrier of the write, or the kernel's fence).
    fn write(&self, stream: driver_sys::CUstream, flag: u64, value: u32) -> Result<(), String> {
        match self {
            DeviceFlags::MemoryOperations => unsafe {
                driver_sys::cuStreamWriteValue32_v2(
                    stream,
                    flag,
                    value,
                    driver_sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
            }
            .result()
            .map_err(|e| format!("cuStreamWriteValue32: {e:?}")),
            DeviceFlags::Kernels(k) => k
                .write(stream, flag, value)
                .map_err(|e| format!("the flag write kernel: {e}")),
        }
    }
}

/// A cuBLASLt handle.
struct LtHandle(lt_sys::cublasLtHandle_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // Safety: created by `cublasLtCreate`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// Device memory from `cuMemAlloc`.
struct DeviceMemory {
    address: driver_sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    fn new(bytes: usize) -> Result<Self, driver::DriverError> {
        // Safety: a plain allocation, freed in `drop`.
        let address = unsafe { driver::malloc_sync(bytes) }?;
        Ok(Self { address, bytes })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Safety: allocated by `cuMemAlloc`, freed once.
        let _ = unsafe { driver::free_sync(self.address) };
    }
}

/// What selects a cached plan: the problem, the layouts and the operands' alignments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    /// Of both inputs.
    dtype: lt_sys::cudaDataType,
    /// Of the output (and of `C` when accumulating).
    out_dtype: lt_sys::cudaDataType,
    /// `beta = 1`: the output is read as `C` and the product added to it.
    accumulate: bool,
    m: u64,
    n: u64,
    k: u64,
    a: BlasMatrix,
    b: BlasMatrix,
    ld_out: i64,
    batch: u64,
    batch_strides: [i64; 3],
    /// Byte alignments of BLAS `A`, `B` and the output, at most 256.
    aligns: [u32; 3],
    /// Multiprocessors to plan for (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`); 0: all.
    sm_count_target: u32,
    /// The epilogue (its vector in the inputs' dtype).
    epilogue: EpilogueKind,
}

impl PlanKey {
    /// The key with no alignment: what decides whether cuBLASLt plans the layout at all.
    fn layout_only(self) -> Self {
        Self {
            aligns: [0; 3],
            ..self
        }
    }

    /// The key with each operand aligned only to its element size in bytes.
    fn element_aligned(self, element_sizes: [u64; 3]) -> Self {
        Self {
            aligns: element_sizes.map(|e| e as u32),
            ..self
        }
    }
}

/// A product ready to enqueue: the device addresses of BLAS `A`, `B` and the output, of
/// the epilogue's vector (0 without one), and its plan's key.
struct Prepared {
    addresses: [u64; 3],
    vector: u64,
    key: PlanKey,
}

/// Whether `product` takes more than one BLAS call or a strided batch (no epilogue
/// vector then: one vector per call would be needed).
fn is_batched(product: &Product<'_>) -> bool {
    product.layout.calls.len() != 1 || product.layout.batch > 1
}

/// The byte alignments (at most 256) of BLAS `A`, `B` and the output of `product` whose
/// buffers start at `addresses`, over every matrix its calls read.
fn operand_aligns(product: &Product<'_>, addresses: [u64; 3]) -> [u32; 3] {
    let layout = product.layout;
    let elements = product.element_sizes();
    [0, 1, 2].map(|x| {
        let element = elements[x];
        let steps = layout
            .calls
            .iter()
            .map(|c| c[x] * element)
            .chain((layout.batch > 1).then(|| layout.batch_strides[x] as u64 * element));
        alignment(addresses[x], steps)
    })
}

/// A tensor's byte offset within its buffer, standing for its device address's alignment
/// up to 256 bytes: CubeCL starts every buffer at a multiple of its memory alignment (512
/// bytes on CUDA). `None` where that alignment is under 256.
///
/// Where the prediction is wrong, a product is waited for instead of queued (its key
/// matches no plan), or a queued task computes another key from the device addresses and
/// builds its plan there, failing (a fault reported at the next call) only if cuBLASLt has
/// no algorithm for that epilogue at the operands' own alignment either.
pub(crate) fn handle_offset(t: &CubeTensor<CudaRuntime>) -> Option<u64> {
    t.client
        .properties()
        .memory
        .alignment
        .is_multiple_of(256)
        .then(|| t.handle.offset_start.unwrap_or(0))
}

/// [`operand_aligns`] read from the handles on the caller's thread, without the device
/// addresses (see [`handle_offset`]).
fn caller_aligns(product: &Product<'_>) -> Option<[u32; 3]> {
    Some(operand_aligns(
        product,
        [
            handle_offset(product.rhs)?,
            handle_offset(product.lhs)?,
            handle_offset(product.out)?,
        ],
    ))
}

/// The cuBLASLt descriptors and the algorithm of one [`PlanKey`].
struct Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    /// Layouts of BLAS `A`, `B` and the output (also used as `C`, with `beta = 0`, or 1
    /// when accumulating).
    layouts: [lt_sys::cublasLtMatrixLayout_t; 3],
    algo: lt_sys::cublasLtMatmulAlgo_t,
    beta: f32,
    /// Whether the plan has an epilogue vector (set per launch).
    epilogue: bool,
}

impl Plan {
    fn new(handle: lt_sys::cublasLtHandle_t, key: &PlanKey) -> Result<Self, Unavailable> {
        let failed = |what: &str, e: lt::CublasError| Unavailable::Setup(format!("{what}: {e:?}"));
        // f32 accumulation for every dtype; for f32 that is true f32 (not TF32), as
        // PyTorch's matmul by default.
        let desc = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| failed("cublasLtMatmulDescCreate", e))?;
        let mut plan = Plan {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: lt_sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            beta: if key.accumulate { 1.0 } else { 0.0 },
            epilogue: key.epilogue != EpilogueKind::None,
        };
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        for (attr, matrix) in [
            (
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                key.a,
            ),
            (
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                key.b,
            ),
        ] {
            let op = matrix.transposed as i32;
            unsafe { lt::set_matmul_desc_attribute(desc, attr, as_ptr(&op), size_of::<i32>()) }
                .map_err(|e| failed("cublasLtMatmulDescSetAttribute", e))?;
        }
        if key.sm_count_target > 0 {
            let target = key.sm_count_target as i32;
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                    as_ptr(&target),
                    size_of::<i32>(),
                )
            }
            .map_err(|e| failed("cublasLtMatmulDescSetAttribute (SM count target)", e))?;
        }
        if key.epilogue != EpilogueKind::None {
            let epilogue = key.epilogue.cublaslt() as u32;
            let vector_type = key.dtype as u32;
            use lt_sys::cublasLtMatmulDescAttributes_t as Desc;
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    Desc::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    as_ptr(&epilogue),
                    size_of::<u32>(),
                )
                .and_then(|()| {
                    lt::set_matmul_desc_attribute(
                        desc,
                        Desc::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                        as_ptr(&vector_type),
                        size_of::<u32>(),
                    )
                })
            }
            .map_err(|e| failed("cublasLtMatmulDescSetAttribute (epilogue)", e))?;
        }
        let stored = [
            (key.a.rows, key.a.cols, key.a.ld),
            (key.b.rows, key.b.cols, key.b.ld),
            (key.m, key.n, key.ld_out),
        ];
        for (x, (rows, cols, ld)) in stored.into_iter().enumerate() {
            let dtype = if x == 2 { key.out_dtype } else { key.dtype };
            let layout = lt::create_matrix_layout(dtype, rows, cols, ld)
                .map_err(|e| failed("cublasLtMatrixLayoutCreate", e))?;
            plan.layouts[x] = layout;
            if key.batch > 1 {
                let count = key.batch as i32;
                let stride = key.batch_strides[x];
                use lt_sys::cublasLtMatrixLayoutAttribute_t as Attr;
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout,
                        Attr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        as_ptr(&count),
                        size_of::<i32>(),
                    )
                    .and_then(|()| {
                        lt::set_matrix_layout_attribute(
                            layout,
                            Attr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            as_ptr(&stride),
                            size_of::<i64>(),
                        )
                    })
                }
                .map_err(|e| failed("cublasLtMatrixLayoutSetAttribute", e))?;
            }
        }

        let pref = Preference(
            lt::create_matmul_pref().map_err(|e| failed("cublasLtMatmulPreferenceCreate", e))?,
        );
        use lt_sys::cublasLtMatmulPreferenceAttributes_t as Pref;
        let workspace = WORKSPACE_BYTES as u64;
        // With 16-bit outputs, split-K partial sums must be reduced in the f32 compute
        // type, never in place or in the output type (bf16 partial sums).
        let reduction = lt_sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
            as u32
            | lt_sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        let sixteen_bit = key.out_dtype != lt_sys::cudaDataType::CUDA_R_32F;
        let [align_a, align_b, align_out] = key.aligns;
        let mut prefs: Vec<(Pref, *const c_void, usize)> = vec![
            (
                Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                as_ptr(&workspace),
                8,
            ),
            // The heuristic assumes 256-byte alignment unless told otherwise.
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                as_ptr(&align_a),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                as_ptr(&align_b),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                as_ptr(&align_out),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                as_ptr(&align_out),
                4,
            ),
        ];
        if sixteen_bit {
            prefs.push((
                Pref::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                as_ptr(&reduction),
                4,
            ));
        }
        for (attr, value, size) in prefs {
            unsafe { lt::set_matmul_pref_attribute(pref.0, attr, value, size) }
                .map_err(|e| failed("cublasLtMatmulPreferenceSetAttribute", e))?;
        }
        let [la, lb, lo] = plan.layouts;
        let heuristic =
            unsafe { lt::get_matmul_algo_heuristic(handle, desc, la, lb, lo, lo, pref.0) }
                .map_err(|e| Unavailable::NoAlgorithm(format!("{e:?} for {key:?}")))?;
        plan.algo = heuristic.algo;
        Ok(plan)
    }

    /// Enqueues the product at `[A, B, out]` device addresses on `stream`, with the
    /// epilogue's vector at `vector` when the plan has an epilogue.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        handle: lt_sys::cublasLtHandle_t,
        alpha: f32,
        addresses: [u64; 3],
        vector: u64,
        workspace: &DeviceMemory,
        stream: lt_sys::cudaStream_t,
    ) -> Result<(), String> {
        let beta = self.beta;
        if self.epilogue {
            let pointer = vector as *const c_void;
            // Safety: the descriptor is this plan's, used from one thread at a time (the
            // engine's lock); cuBLASLt reads the pointer when the matmul is enqueued.
            unsafe {
                lt::set_matmul_desc_attribute(
                    self.desc,
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    as_ptr(&pointer),
                    size_of::<*const c_void>(),
                )
            }
            .map_err(|e| format!("cublasLtMatmulDescSetAttribute (bias pointer): {e:?}"))?;
        }
        let [la, lb, lo] = self.layouts;
        let [a, b, out] = addresses.map(|p| p as *mut c_void);
        // Safety: the descriptors describe the tensors behind the addresses (laid out by
        // `matmul_layout`, checked against their shapes and strides), which stay
        // allocated until the ordering protocol has let CubeCL reuse them.
        unsafe {
            lt::matmul(
                handle,
                self.desc,
                as_ptr(&alpha),
                as_ptr(&beta),
                a,
                la,
                b,
                lb,
                out,
                lo,
                out,
                lo,
                &self.algo,
                workspace.address as *mut c_void,
                workspace.bytes,
                stream,
            )
        }
        .map_err(|e| format!("cublasLtMatmul: {e:?}"))
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // Safety: created in `Plan::new`, destroyed once (null layouts were never made).
        unsafe {
            for layout in self.layouts {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A heuristic preference descriptor, destroyed after the search.
struct Preference(lt_sys::cublasLtMatmulPreference_t);

impl Drop for Preference {
    fn drop(&mut self) {
        // Safety: created by `cublasLtMatmulPreferenceCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}
