//! Matrix products on ROCm through hipBLASLt (cargo feature `rocm`), loaded at run time
//! like the HIP runtime itself (`cubecl-hip-sys`): building needs no ROCm install, and a
//! machine without `libhipblaslt.so` runs Burn's matmul after one warning.
//!
//! cubecl-hip keeps its HIP streams private, as cubecl-cuda does, so liger owns, per
//! device, a non-blocking stream, a hipBLASLt handle and a 32 MiB workspace. Products are
//! ordered against CubeCL's stream by host synchronization: inside one
//! `ComputeClient::exclusive` task, CubeCL's stream is synchronized, the products are
//! enqueued on liger's stream, and liger's stream is synchronized before CubeCL may issue
//! anything else. The device-side protocols of the CUDA path ([`super::cublaslt`]) rely on
//! stream memory operations or spinning kernels whose behaviour on AMD hardware has not
//! been run here; host synchronization is correct on any driver, at the cost of the GPU
//! idling while the host issues the next kernels.
//!
//! The same layouts as cuBLASLt ([`super::matmul_layout`]): hipBLASLt is column-major, so
//! BLAS `A` is `rhs` and `B` is `lhs`. f32 accumulation for every dtype (f32 products are
//! true f32, not TF32); 16-bit outputs are rounded once.

use super::matmul_layout::{BlasMatrix, GemmLayout};
use super::vendor_engines::{PerDevice, as_ptr};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::hip::{AmdDevice, HipRuntime};
use cubecl::prelude::ComputeClient;
use cubecl_hip_sys as hip;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// hipBLASLt workspace per device.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Cached product plans per device; beyond this the cache starts over.
const MAX_PLANS: usize = 1024;

/// Why a product does not run on hipBLASLt (nothing was launched).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// hipBLASLt is not used for this dtype (it is for f32, f16 and bf16).
    Dtype(DType),
    /// The library, the HIP runtime or the device resources could not be set up.
    Setup(String),
    /// hipBLASLt's heuristic has no algorithm for this product.
    NoAlgorithm(String),
}

impl core::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Unavailable::Dtype(d) => write!(f, "hipBLASLt is not used for dtype {d:?}"),
            Unavailable::Setup(why) => write!(f, "hipBLASLt could not be set up: {why}"),
            Unavailable::NoAlgorithm(why) => write!(f, "hipBLASLt has no algorithm: {why}"),
        }
    }
}

/// `out = alpha·(lhs · rhs)`, or `out += alpha·(lhs · rhs)` when `accumulate`, laid out
/// by [`super::matmul`] (which validates shapes and allocates `out`).
pub(crate) struct Product<'a> {
    pub lhs: &'a CubeTensor<HipRuntime>,
    pub rhs: &'a CubeTensor<HipRuntime>,
    /// Written in its own dtype: the inputs' (`accumulate` false) or f32.
    pub out: &'a CubeTensor<HipRuntime>,
    pub layout: &'a GemmLayout,
    pub accumulate: bool,
    pub alpha: f32,
}

/// hipBLASLt's data type (`hipDataType`) of a dtype it is used for.
pub(crate) fn data_type(dtype: DType) -> Result<u32, Unavailable> {
    match dtype {
        DType::F32 => Ok(ffi::HIP_R_32F),
        DType::F16 => Ok(ffi::HIP_R_16F),
        DType::BF16 => Ok(ffi::HIP_R_16BF),
        other => Err(Unavailable::Dtype(other)),
    }
}

/// Whether hipBLASLt runs on `device`, setting its resources up on first use.
pub(crate) fn device_support(device: &AmdDevice) -> Result<(), Unavailable> {
    engine(device).map(|_| ())
}

/// Runs `products` (at least one) in order on liger's stream between one synchronization
/// of CubeCL's stream before and one of liger's after: a later product may read an
/// earlier one's output. Every plan is found before anything is launched, so `Err` means
/// nothing was launched; a launch failure after that panics with the error.
pub(crate) fn run_chain(device: &AmdDevice, products: &[Product<'_>]) -> Result<(), Unavailable> {
    let first = products.first().expect("a chain of at least one product");
    let engine = engine(device)?;
    let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
    let client = first.out.client.clone();
    let state: &mut Engine = &mut engine;
    let outcome = client
        .exclusive(|| state.run(&client, products))
        .map_err(|e| Unavailable::Setup(format!("CubeCL's device thread: {e:?}")))?;
    match outcome {
        Ok(()) => Ok(()),
        Err(Failure::Unavailable(why)) => Err(why),
        Err(Failure::Launch(why)) => panic!(
            "matmul: hipBLASLt failed on ROCm device {} ({} product(s), the first lhs {:?}, rhs {:?}, {:?}): {why}",
            device.index,
            products.len(),
            first.lhs.meta.shape(),
            first.rhs.meta.shape(),
            first.lhs.dtype,
        ),
    }
}

fn engine(device: &AmdDevice) -> Result<Arc<Mutex<Engine>>, Unavailable> {
    static ENGINES: PerDevice<Engine> = PerDevice::new();
    ENGINES
        .get(
            device.index,
            || Engine::new(device),
            |why| {
                format!(
                    "liger matmul: hipBLASLt is unavailable on ROCm device {}, so matmuls run on \
                     Burn's own kernels ({why}); install ROCm's hipBLASLt (libhipblaslt.so) to use it",
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
    index: usize,
    lib: &'static ffi::Library,
    stream: hip::hipStream_t,
    handle: ffi::Handle,
    workspace: *mut c_void,
    plans: HashMap<PlanKey, Plan>,
}

// Safety: the raw HIP and hipBLASLt handles are used only under the engine's lock, from
// one thread at a time; the objects themselves are not tied to a thread.
unsafe impl Send for Engine {}

impl Engine {
    fn new(device: &AmdDevice) -> Result<Self, String> {
        let lib = ffi::library()?;
        let hip_call = |what: &str, status: hip::hipError_t| {
            if status == hip::HIP_SUCCESS {
                Ok(())
            } else {
                Err(format!("{what}: HIP error {status}"))
            }
        };
        let index = device.index;
        // Safety: plain HIP runtime calls on out-pointers to locals; what they create is
        // owned by the engine and released in `drop`.
        unsafe {
            hip_call("hipSetDevice", hip::hipSetDevice(index as i32))?;
            let mut stream: hip::hipStream_t = std::ptr::null_mut();
            hip_call(
                "hipStreamCreateWithFlags",
                hip::hipStreamCreateWithFlags(&mut stream, hip::hipStreamNonBlocking),
            )?;
            let mut handle: ffi::Handle = std::ptr::null_mut();
            if let Err(e) = ffi::check("hipblasLtCreate", (lib.create)(&mut handle)) {
                hip::hipStreamDestroy(stream);
                return Err(e);
            }
            let mut workspace: *mut c_void = std::ptr::null_mut();
            if let Err(e) = hip_call("workspace", hip::hipMalloc(&mut workspace, WORKSPACE_BYTES)) {
                (lib.destroy)(handle);
                hip::hipStreamDestroy(stream);
                return Err(e);
            }
            log::info!(
                "liger matmul: hipBLASLt on ROCm device {index}, ordered by host synchronization"
            );
            Ok(Engine {
                index,
                lib,
                stream,
                handle,
                workspace,
                plans: HashMap::new(),
            })
        }
    }

    /// Runs on CubeCL's device thread (inside `ComputeClient::exclusive`).
    fn run(
        &mut self,
        client: &ComputeClient<HipRuntime>,
        products: &[Product<'_>],
    ) -> Result<(), Failure> {
        let unavailable = |why: String| Failure::Unavailable(Unavailable::Setup(why));
        // Safety: selects the device for this thread's HIP calls.
        let status = unsafe { hip::hipSetDevice(self.index as i32) };
        if status != hip::HIP_SUCCESS {
            return Err(unavailable(format!("hipSetDevice: HIP error {status}")));
        }
        if self.plans.len() + products.len() > MAX_PLANS {
            self.plans.clear();
        }
        let mut prepared = Vec::with_capacity(products.len());
        for product in products {
            let address = |t: &CubeTensor<HipRuntime>| {
                client
                    .get_resource(t.handle.clone())
                    .map(|r| r.resource().ptr as u64)
                    .map_err(|e| unavailable(format!("device address of a tensor: {e:?}")))
            };
            let addresses = [
                address(product.rhs)?,
                address(product.lhs)?,
                address(product.out)?,
            ];
            let key = PlanKey::of(product).map_err(Failure::Unavailable)?;
            if !self.plans.contains_key(&key) {
                let plan = Plan::new(self.lib, self.handle, &key).map_err(Failure::Unavailable)?;
                self.plans.insert(key, plan);
            }
            prepared.push((addresses, key));
        }
        cubecl::future::block_on(client.sync())
            .map_err(|e| Failure::Launch(format!("synchronizing CubeCL's stream: {e:?}")))?;
        let mut launched = Ok(());
        for (product, (addresses, key)) in products.iter().zip(&prepared) {
            let plan = &self.plans[key];
            let elements = [
                product.rhs.dtype.size() as u64,
                product.lhs.dtype.size() as u64,
                product.out.dtype.size() as u64,
            ];
            for call in &product.layout.calls {
                let at = |x: usize| addresses[x] + call[x] * elements[x];
                launched =
                    launched.and_then(|()| plan.launch(self, product.alpha, [at(0), at(1), at(2)]));
            }
        }
        // Synchronized even after a failed launch: earlier products may be running.
        // Safety: liger's own stream.
        let status = unsafe { hip::hipStreamSynchronize(self.stream) };
        let synced = if status == hip::HIP_SUCCESS {
            Ok(())
        } else {
            Err(format!("synchronizing liger's stream: HIP error {status}"))
        };
        launched.and(synced).map_err(Failure::Launch)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.plans.clear();
        // Safety: created in `Engine::new`, released once, after the plans that use them.
        unsafe {
            hip::hipSetDevice(self.index as i32);
            hip::hipFree(self.workspace);
            (self.lib.destroy)(self.handle);
            hip::hipStreamDestroy(self.stream);
        }
    }
}

/// What selects a cached plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    /// `hipDataType` of both inputs.
    dtype: u32,
    /// `hipDataType` of the output (and of `C` when accumulating).
    out_dtype: u32,
    accumulate: bool,
    m: u64,
    n: u64,
    k: u64,
    a: BlasMatrix,
    b: BlasMatrix,
    ld_out: i64,
    batch: u64,
    batch_strides: [i64; 3],
}

impl PlanKey {
    fn of(product: &Product<'_>) -> Result<Self, Unavailable> {
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
        })
    }
}

/// The hipBLASLt descriptors and the algorithm of one [`PlanKey`].
struct Plan {
    lib: &'static ffi::Library,
    desc: ffi::MatmulDesc,
    /// Layouts of BLAS `A`, `B` and the output (also `C`, read when accumulating).
    layouts: [ffi::MatrixLayout; 3],
    algo: ffi::Algo,
    beta: f32,
}

impl Plan {
    fn new(
        lib: &'static ffi::Library,
        handle: ffi::Handle,
        key: &PlanKey,
    ) -> Result<Self, Unavailable> {
        let setup = |e: String| Unavailable::Setup(e);
        let mut desc: ffi::MatmulDesc = std::ptr::null_mut();
        // Safety: out-pointer to a local; the descriptor is owned by the plan from here.
        unsafe {
            ffi::check(
                "hipblasLtMatmulDescCreate",
                (lib.matmul_desc_create)(&mut desc, ffi::HIPBLAS_COMPUTE_32F, ffi::HIP_R_32F),
            )
        }
        .map_err(setup)?;
        let mut plan = Plan {
            lib,
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: ffi::Algo::default(),
            beta: if key.accumulate { 1.0 } else { 0.0 },
        };
        for (attr, matrix) in [
            (ffi::MATMUL_DESC_TRANSA, key.a),
            (ffi::MATMUL_DESC_TRANSB, key.b),
        ] {
            let op: i32 = if matrix.transposed {
                ffi::HIPBLAS_OP_T
            } else {
                ffi::HIPBLAS_OP_N
            };
            // Safety: the attribute's documented type (int32) and size.
            unsafe {
                ffi::check(
                    "hipblasLtMatmulDescSetAttribute",
                    (lib.matmul_desc_set_attribute)(desc, attr, as_ptr(&op), size_of::<i32>()),
                )
            }
            .map_err(setup)?;
        }
        let stored = [
            (key.a.rows, key.a.cols, key.a.ld),
            (key.b.rows, key.b.cols, key.b.ld),
            (key.m, key.n, key.ld_out),
        ];
        for (x, (rows, cols, ld)) in stored.into_iter().enumerate() {
            let dtype = if x == 2 { key.out_dtype } else { key.dtype };
            // Safety: out-pointer into the plan, destroyed in `drop`; the batch attributes
            // with their documented types (int32 count, int64 stride).
            unsafe {
                ffi::check(
                    "hipblasLtMatrixLayoutCreate",
                    (lib.matrix_layout_create)(&mut plan.layouts[x], dtype, rows, cols, ld),
                )
                .map_err(setup)?;
                if key.batch > 1 {
                    let count = key.batch as i32;
                    let stride = key.batch_strides[x];
                    ffi::check(
                        "hipblasLtMatrixLayoutSetAttribute",
                        (lib.matrix_layout_set_attribute)(
                            plan.layouts[x],
                            ffi::MATRIX_LAYOUT_BATCH_COUNT,
                            as_ptr(&count),
                            size_of::<i32>(),
                        ),
                    )
                    .and_then(|()| {
                        ffi::check(
                            "hipblasLtMatrixLayoutSetAttribute",
                            (lib.matrix_layout_set_attribute)(
                                plan.layouts[x],
                                ffi::MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                as_ptr(&stride),
                                size_of::<i64>(),
                            ),
                        )
                    })
                    .map_err(setup)?;
                }
            }
        }
        let mut pref: ffi::Preference = std::ptr::null_mut();
        // Safety: out-pointer to a local, destroyed below; the workspace attribute is a
        // uint64.
        let found = unsafe {
            ffi::check(
                "hipblasLtMatmulPreferenceCreate",
                (lib.preference_create)(&mut pref),
            )
            .map_err(setup)?;
            let workspace = WORKSPACE_BYTES as u64;
            let searched = ffi::check(
                "hipblasLtMatmulPreferenceSetAttribute",
                (lib.preference_set_attribute)(
                    pref,
                    ffi::MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    as_ptr(&workspace),
                    size_of::<u64>(),
                ),
            )
            .map_err(setup)
            .and_then(|()| {
                let [la, lb, lo] = plan.layouts;
                let mut result = ffi::HeuristicResult::default();
                let mut returned = 0i32;
                let status = (lib.algo_get_heuristic)(
                    handle,
                    desc,
                    la,
                    lb,
                    lo,
                    lo,
                    pref,
                    1,
                    &mut result,
                    &mut returned,
                );
                if status != ffi::HIPBLAS_STATUS_SUCCESS
                    || returned < 1
                    || result.state != ffi::HIPBLAS_STATUS_SUCCESS
                {
                    return Err(Unavailable::NoAlgorithm(format!(
                        "status {status}, {returned} result(s) for {key:?}"
                    )));
                }
                Ok(result.algo)
            });
            (lib.preference_destroy)(pref);
            searched
        }?;
        plan.algo = found;
        Ok(plan)
    }

    /// Enqueues the product at `[A, B, out]` device addresses on the engine's stream.
    fn launch(&self, engine: &Engine, alpha: f32, addresses: [u64; 3]) -> Result<(), String> {
        let [la, lb, lo] = self.layouts;
        let [a, b, out] = addresses.map(|p| p as *mut c_void);
        // Safety: the descriptors describe the tensors behind the addresses (laid out by
        // `matmul_layout`, checked against their shapes and strides), which stay allocated
        // until the stream is synchronized.
        unsafe {
            ffi::check(
                "hipblasLtMatmul",
                (self.lib.matmul)(
                    engine.handle,
                    self.desc,
                    as_ptr(&alpha),
                    a,
                    la,
                    b,
                    lb,
                    as_ptr(&self.beta),
                    out,
                    lo,
                    out,
                    lo,
                    &self.algo,
                    engine.workspace,
                    WORKSPACE_BYTES,
                    engine.stream,
                ),
            )
        }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // Safety: created in `Plan::new`, destroyed once (null layouts were never made).
        unsafe {
            for layout in self.layouts {
                if !layout.is_null() {
                    (self.lib.matrix_layout_destroy)(layout);
                }
            }
            (self.lib.matmul_desc_destroy)(self.desc);
        }
    }
}

/// The part of hipBLASLt's C API (`hipblaslt.h`, ROCm 6 and 7) the products use, resolved
/// from the shared library at run time.
mod ffi {
    use super::hip::hipStream_t;
    use crate::cube::vendor_engines::{library_candidates, library_symbol, load_first};
    use std::ffi::c_void;
    use std::sync::OnceLock;

    pub type Status = i32;
    pub type Handle = *mut c_void;
    pub type MatmulDesc = *mut c_void;
    pub type MatrixLayout = *mut c_void;
    pub type Preference = *mut c_void;

    pub const HIPBLAS_STATUS_SUCCESS: Status = 0;
    /// `hipblasOperation_t` (hipBLAS numbers them from 111, unlike cuBLAS).
    pub const HIPBLAS_OP_N: i32 = 111;
    pub const HIPBLAS_OP_T: i32 = 112;
    /// `hipblasComputeType_t`.
    pub const HIPBLAS_COMPUTE_32F: u32 = 2;
    /// `hipDataType`.
    pub const HIP_R_32F: u32 = 0;
    pub const HIP_R_16F: u32 = 2;
    pub const HIP_R_16BF: u32 = 14;
    /// `hipblasLtMatmulDescAttributes_t`.
    pub const MATMUL_DESC_TRANSA: u32 = 0;
    pub const MATMUL_DESC_TRANSB: u32 = 1;
    /// `hipblasLtMatrixLayoutAttribute_t`.
    pub const MATRIX_LAYOUT_BATCH_COUNT: u32 = 0;
    pub const MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: u32 = 1;
    /// `hipblasLtMatmulPreferenceAttributes_t`.
    pub const MATMUL_PREF_MAX_WORKSPACE_BYTES: u32 = 1;

    /// `hipblasLtMatmulAlgo_t`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Algo {
        pub data: [u8; 16],
        pub max_workspace_bytes: usize,
    }

    /// `hipblasLtMatmulHeuristicResult_t`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HeuristicResult {
        pub algo: Algo,
        pub workspace_size: usize,
        pub state: Status,
        pub waves_count: f32,
        pub reserved: [i32; 4],
    }

    /// The library and its entry points.
    pub struct Library {
        _lib: libloading::Library,
        pub create: unsafe extern "C" fn(*mut Handle) -> Status,
        pub destroy: unsafe extern "C" fn(Handle) -> Status,
        pub matmul_desc_create: unsafe extern "C" fn(*mut MatmulDesc, u32, u32) -> Status,
        pub matmul_desc_destroy: unsafe extern "C" fn(MatmulDesc) -> Status,
        pub matmul_desc_set_attribute:
            unsafe extern "C" fn(MatmulDesc, u32, *const c_void, usize) -> Status,
        pub matrix_layout_create:
            unsafe extern "C" fn(*mut MatrixLayout, u32, u64, u64, i64) -> Status,
        pub matrix_layout_destroy: unsafe extern "C" fn(MatrixLayout) -> Status,
        pub matrix_layout_set_attribute:
            unsafe extern "C" fn(MatrixLayout, u32, *const c_void, usize) -> Status,
        pub preference_create: unsafe extern "C" fn(*mut Preference) -> Status,
        pub preference_destroy: unsafe extern "C" fn(Preference) -> Status,
        pub preference_set_attribute:
            unsafe extern "C" fn(Preference, u32, *const c_void, usize) -> Status,
        #[allow(clippy::type_complexity)]
        pub algo_get_heuristic: unsafe extern "C" fn(
            Handle,
            MatmulDesc,
            MatrixLayout,
            MatrixLayout,
            MatrixLayout,
            MatrixLayout,
            Preference,
            i32,
            *mut HeuristicResult,
            *mut i32,
        ) -> Status,
        #[allow(clippy::type_complexity)]
        pub matmul: unsafe extern "C" fn(
            Handle,
            MatmulDesc,
            *const c_void,
            *const c_void,
            MatrixLayout,
            *const c_void,
            MatrixLayout,
            *const c_void,
            *const c_void,
            MatrixLayout,
            *mut c_void,
            MatrixLayout,
            *const Algo,
            *mut c_void,
            usize,
            hipStream_t,
        ) -> Status,
    }

    // Safety: function pointers into a library that stays loaded for the process.
    unsafe impl Send for Library {}
    unsafe impl Sync for Library {}

    /// `Err` naming the call and its status unless it succeeded.
    pub fn check(what: &str, status: Status) -> Result<(), String> {
        if status == HIPBLAS_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: hipBLAS status {status}"))
        }
    }

    /// Where the library is looked for: ROCm's install directories, then the loader's
    /// search path.
    fn candidates() -> Vec<String> {
        library_candidates(
            &["libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"],
            &["ROCM_PATH", "HIP_PATH"],
            "lib",
            &["/opt/rocm/lib"],
        )
    }

    /// The library, loaded once per process.
    pub fn library() -> Result<&'static Library, String> {
        static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
        LIBRARY
            .get_or_init(|| load_from(&candidates()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The library from the first of `tried` that loads, or why none did.
    pub(super) fn load_from(tried: &[String]) -> Result<Library, String> {
        let lib = load_first(tried, "libhipblaslt")?;
        // Safety: each symbol is declared with its C signature from `hipblaslt.h`.
        unsafe {
            Ok(Library {
                create: library_symbol!(lib, "hipBLASLt", b"hipblasLtCreate\0"),
                destroy: library_symbol!(lib, "hipBLASLt", b"hipblasLtDestroy\0"),
                matmul_desc_create: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulDescCreate\0"
                ),
                matmul_desc_destroy: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulDescDestroy\0"
                ),
                matmul_desc_set_attribute: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulDescSetAttribute\0"
                ),
                matrix_layout_create: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatrixLayoutCreate\0"
                ),
                matrix_layout_destroy: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatrixLayoutDestroy\0"
                ),
                matrix_layout_set_attribute: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatrixLayoutSetAttribute\0"
                ),
                preference_create: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulPreferenceCreate\0"
                ),
                preference_destroy: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulPreferenceDestroy\0"
                ),
                preference_set_attribute: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulPreferenceSetAttribute\0"
                ),
                algo_get_heuristic: library_symbol!(
                    lib,
                    "hipBLASLt",
                    b"hipblasLtMatmulAlgoGetHeuristic\0"
                ),
                matmul: library_symbol!(lib, "hipBLASLt", b"hipblasLtMatmul\0"),
                _lib: lib,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ffi;

    /// The C structs hipBLASLt fills in: a size mismatch would let the heuristic write past
    /// the Rust value.
    #[test]
    fn ffi_struct_sizes_match_the_header() {
        // `uint8_t data[16]; size_t max_workspace_bytes;`
        assert_eq!(size_of::<ffi::Algo>(), 24);
        // `algo; size_t workspaceSize; hipblasStatus_t state; float wavesCount; int reserved[4];`
        assert_eq!(size_of::<ffi::HeuristicResult>(), 24 + 8 + 4 + 4 + 16);
    }

    /// A library that is not there is an error naming it and where it was looked for,
    /// not a panic.
    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let tried = ["/nonexistent/rocm/lib/libhipblaslt.so".to_string()];
        let why = ffi::load_from(&tried)
            .err()
            .expect("no library at a path that does not exist");
        assert!(why.contains("libhipblaslt was not found"), "{why}");
        assert!(why.contains(&tried[0]), "{why}");
    }
}
