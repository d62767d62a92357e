//! Attention on CUDA through cuDNN's fused flash-attention engines (those PyTorch's
//! `scaled_dot_product_attention` picks on Hopper), run on the stream and under the ordering
//! the cuBLASLt products use ([`super::cublaslt::run_ordered`]).
//!
//! cuDNN takes attention as an operation graph that its fusion engines recognize. The
//! graphs here are the ones cudnn-frontend 1.18 builds for causal (or unmasked) SDPA with
//! softmax statistics, as cuDNN 9.19's API log of PyTorch 2.11 shows them on the H200
//! (`scripts/device/cudnn_sdpa_log.py`):
//! - forward: `S = Q·Kᵀ·scale`, the causal mask (key index ≤ query index, else −∞),
//!   `M = max S`, `E = exp(S − M)`, `Z = Σ E`, `lse = M + ln Z` (written), `P = E / Z`
//!   rounded to the input dtype, `O = P·V`;
//! - backward: `D = Σ dO∘O`, `P = exp(S·scale − lse)` under the mask, `dV = Σ_group Pᵀ·dO`,
//!   `dS = P∘(dO·Vᵀ − D)·scale`, `dK = Σ_group dSᵀ·Q`, `dQ = dS·K` summed in f32.
//!
//! Grouped-query heads are cuDNN's own (`K` and `V` keep `kv_heads`). `lse` is the flash
//! kernels' (the natural log of the scaled, masked scores' softmax denominator, `[batch,
//! q_heads, seq]` f32), so either backward takes either forward's statistics.

use super::cublaslt::{self, StreamWork};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::ComputeClient;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{result as driver, sys as driver_sys};
use dnn::cudnnBackendAttributeName_t as A;
use dnn::cudnnBackendAttributeType_t as T;
use dnn::cudnnBackendDescriptorType_t as D;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// Plans kept per device; beyond this the cache starts over.
const MAX_PLANS: usize = 64;

/// One attention problem: `q, o: [batch, q_heads, seq, head_dim]`, `k, v: [batch,
/// kv_heads, seq, head_dim]`, `lse: [batch, q_heads, seq]` f32. The tensors are bound with
/// their own strides (the head dimension dense, rows 16-byte aligned), so the transposed
/// views of `[batch, seq, heads, head_dim]` projections need no copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SdpaShape {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub dtype: DType,
}

impl SdpaShape {
    /// Why cuDNN's engines are not asked for this problem, if they are not: f16/bf16, head
    /// dimensions in 8s up to 128 (the Hopper engines'), whole groups of query heads.
    pub(crate) fn unsupported(&self) -> Option<String> {
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Some(format!(
                "dtype {:?} (cuDNN attention takes f16 and bf16)",
                self.dtype
            ));
        }
        if !self.head_dim.is_multiple_of(8) || self.head_dim > 128 {
            return Some(format!(
                "head_dim {} (cuDNN attention takes multiples of 8 up to 128)",
                self.head_dim
            ));
        }
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) || self.seq == 0 {
            return Some(format!(
                "{} query heads over {} key/value heads, seq {}",
                self.q_heads, self.kv_heads, self.seq
            ));
        }
        None
    }

    fn data_type(&self) -> dnn::cudnnDataType_t {
        match self.dtype {
            DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
            _ => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        }
    }
}

/// The forward's tensors.
pub(crate) struct SdpaForward<'a> {
    pub q: &'a CubeTensor<CudaRuntime>,
    pub k: &'a CubeTensor<CudaRuntime>,
    pub v: &'a CubeTensor<CudaRuntime>,
    pub output: &'a CubeTensor<CudaRuntime>,
    pub lse: &'a CubeTensor<CudaRuntime>,
}

/// The backward's tensors. `dot` (`[batch, q_heads, seq]` f32) and `grad_q_sum` (`[batch,
/// q_heads, seq, head_dim]` f32) are scratch the graph writes: `Σ dO∘O` and dQ before its
/// rounding.
pub(crate) struct SdpaBackward<'a> {
    pub q: &'a CubeTensor<CudaRuntime>,
    pub k: &'a CubeTensor<CudaRuntime>,
    pub v: &'a CubeTensor<CudaRuntime>,
    pub output: &'a CubeTensor<CudaRuntime>,
    pub lse: &'a CubeTensor<CudaRuntime>,
    pub grad_output: &'a CubeTensor<CudaRuntime>,
    pub grad_q: &'a CubeTensor<CudaRuntime>,
    pub grad_k: &'a CubeTensor<CudaRuntime>,
    pub grad_v: &'a CubeTensor<CudaRuntime>,
    pub dot: &'a CubeTensor<CudaRuntime>,
    pub grad_q_sum: &'a CubeTensor<CudaRuntime>,
}

/// Runs the forward on cuDNN. `Err` (nothing launched) says why it did not run.
pub(crate) fn forward(
    shape: SdpaShape,
    scale: f32,
    tensors: SdpaForward<'_>,
) -> Result<(), String> {
    let bound = attention_tensors(tensors.q, tensors.k, tensors.v, tensors.output, tensors.lse);
    run(Work::new(shape, false, scale, bound, None))
}

/// The tensors both graphs bind: `q, k, v`, the output and `lse`.
fn attention_tensors(
    q: &CubeTensor<CudaRuntime>,
    k: &CubeTensor<CudaRuntime>,
    v: &CubeTensor<CudaRuntime>,
    output: &CubeTensor<CudaRuntime>,
    lse: &CubeTensor<CudaRuntime>,
) -> Vec<(Uid, CubeTensor<CudaRuntime>)> {
    vec![
        (Uid::Q, q.clone()),
        (Uid::K, k.clone()),
        (Uid::V, v.clone()),
        (Uid::O, output.clone()),
        (Uid::Stats, lse.clone()),
    ]
}

/// Runs the backward on cuDNN. `Err` (nothing launched) says why it did not run.
pub(crate) fn backward(
    shape: SdpaShape,
    scale: f32,
    tensors: SdpaBackward<'_>,
) -> Result<(), String> {
    let mut bound = attention_tensors(tensors.q, tensors.k, tensors.v, tensors.output, tensors.lse);
    bound.extend(
        [
            (Uid::GradOutput, tensors.grad_output),
            (Uid::GradQ, tensors.grad_q),
            (Uid::GradK, tensors.grad_k),
            (Uid::GradV, tensors.grad_v),
            (Uid::Dot, tensors.dot),
            (Uid::GradQSum, tensors.grad_q_sum),
        ]
        .map(|(uid, t)| (uid, t.clone())),
    );
    // dQ's f32 sum is added to by the engine.
    run(Work::new(shape, true, scale, bound, Some(Uid::GradQSum)))
}

fn run(work: Work) -> Result<(), String> {
    let q = &work.tensors[0].1;
    let device = CudaDevice {
        index: q.device.index,
    };
    let client = q.client.clone();
    cublaslt::run_ordered(&device, &client, work, "attention: cuDNN")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The graphs' tensor ids: those bound to memory or values at execution, and the virtual
/// ones between the operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i64)]
enum Uid {
    Q = 0,
    K = 1,
    V = 2,
    O = 3,
    Scale = 5,
    Stats = 8,
    GradOutput = 9,
    GradQ = 10,
    GradK = 11,
    GradV = 12,
    Dot = 13,
    MaskValue = 20,
    One = 7,
    GradQSum = 32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    shape: SdpaShape,
    backward: bool,
    /// Every bound tensor's strides, as `[.., 1]`-padded 4-d strides.
    strides: Vec<(Uid, Dims)>,
}

/// `t`'s strides as the graph's 4-d tensors take them (`lse`'s `[batch, heads, seq]` read
/// as `[batch, heads, seq, 1]`).
fn strides_4d(t: &CubeTensor<CudaRuntime>) -> Dims {
    let mut out = [1i64; 4];
    for (o, s) in out.iter_mut().zip(t.meta.strides().iter()) {
        *o = *s as i64;
    }
    out
}

/// One call: the tensors to bind (owned, so that a queued call keeps their memory alive
/// until it runs), and what `prepare` found for `launch`.
struct Work {
    key: PlanKey,
    scale: f32,
    tensors: Vec<(Uid, CubeTensor<CudaRuntime>)>,
    zeroed: Option<Uid>,
    prepared: Option<Prepared>,
}

impl Work {
    fn new(
        shape: SdpaShape,
        backward: bool,
        scale: f32,
        tensors: Vec<(Uid, CubeTensor<CudaRuntime>)>,
        zeroed: Option<Uid>,
    ) -> Self {
        let strides = tensors.iter().map(|(u, t)| (*u, strides_4d(t))).collect();
        Work {
            key: PlanKey {
                shape,
                backward,
                strides,
            },
            scale,
            tensors,
            zeroed,
            prepared: None,
        }
    }
}

struct Prepared {
    handle: dnn::cudnnHandle_t,
    plan: dnn::cudnnBackendDescriptor_t,
    workspace: u64,
    uids: Vec<i64>,
    addresses: Vec<u64>,
    zeroed: Option<(u64, usize)>,
}

// Safety: the handle and plan are used under the states' lock or on CubeCL's device
// thread inside one `run_ordered` call, never from two threads at once.
unsafe impl Send for Prepared {}

impl StreamWork for Work {
    /// Its graph was planned before on this device, and every tensor starts 16-byte
    /// aligned (read from the handles' offsets, see [`cublaslt::handle_offset`]): `prepare`
    /// then finds the plan and accepts the addresses.
    fn planned(&self) -> bool {
        let aligned = self.tensors.iter().all(|(_, t)| {
            cublaslt::handle_offset(t).is_some_and(|offset| offset.is_multiple_of(16))
        });
        let index = self.tensors[0].1.device.index;
        let states = states().lock().unwrap_or_else(|e| e.into_inner());
        aligned
            && matches!(
                states.get(&index),
                Some(Ok(state)) if matches!(state.plans.get(&self.key), Some(Ok(_)))
            )
    }

    fn prepare(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        stream: driver_sys::CUstream,
    ) -> Result<(), String> {
        let mut addresses = Vec::with_capacity(self.tensors.len());
        for (uid, tensor) in &self.tensors {
            let address = client
                .get_resource(tensor.handle.clone())
                .map_err(|e| format!("device address of {uid:?}: {e:?}"))?
                .resource()
                .ptr;
            if address % 16 != 0 {
                return Err(format!(
                    "{uid:?} starts at {address:#x}, not 16-byte aligned as cuDNN's engines read it"
                ));
            }
            addresses.push(address);
        }
        let zeroed = self.zeroed.map(|uid| {
            let at = self.tensors.iter().position(|(u, _)| *u == uid).unwrap();
            let t = &self.tensors[at].1;
            (
                addresses[at],
                t.meta.shape().num_elements() * t.dtype.size(),
            )
        });
        let mut states = states().lock().unwrap_or_else(|e| e.into_inner());
        let index = self.tensors[0].1.device.index;
        let state = match states.entry(index).or_insert_with(|| State::new(stream)) {
            Ok(state) => state,
            Err(why) => return Err(why.clone()),
        };
        state.bind(stream)?;
        if !state.plans.contains_key(&self.key) {
            if state.plans.len() >= MAX_PLANS {
                state.plans.clear();
            }
            let plan = Plan::new(state.handle, &self.key);
            state.plans.insert(self.key.clone(), plan);
        }
        let (plan, workspace_bytes) = match &state.plans[&self.key] {
            Ok(plan) => (plan.plan.0, plan.workspace_bytes),
            Err(why) => return Err(why.clone()),
        };
        let workspace = state.workspace(workspace_bytes, stream)?;
        let mut uids: Vec<i64> = self.tensors.iter().map(|(u, _)| *u as i64).collect();
        uids.push(Uid::Scale as i64);
        if self.key.backward {
            uids.push(Uid::One as i64);
        }
        if self.key.shape.causal {
            uids.push(Uid::MaskValue as i64);
        }
        self.prepared = Some(Prepared {
            handle: state.handle,
            plan,
            workspace,
            uids,
            addresses,
            zeroed,
        });
        Ok(())
    }

    fn launch(&mut self, stream: driver_sys::CUstream) -> Result<(), String> {
        let p = self.prepared.take().expect("prepared before the launch");
        if let Some((address, bytes)) = p.zeroed {
            // Safety: `bytes` of a live CubeCL buffer, on liger's stream after the wait.
            unsafe { driver::memset_d8_async(address, 0, bytes, stream) }
                .map_err(|e| format!("zeroing dQ's sum: {e:?}"))?;
        }
        // By-value scalars, read by `cudnnBackendExecute` before it returns.
        let scale = self.scale;
        let one = 1.0f32;
        let mask_value = f32::NEG_INFINITY;
        let mut pointers: Vec<*mut c_void> =
            p.addresses.iter().map(|&a| a as *mut c_void).collect();
        pointers.push(&scale as *const f32 as *mut c_void);
        if self.key.backward {
            pointers.push(&one as *const f32 as *mut c_void);
        }
        if self.key.shape.causal {
            pointers.push(&mask_value as *const f32 as *mut c_void);
        }
        let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            &p.uids,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &pointers,
        )?;
        let workspace = p.workspace as *mut c_void;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        let pack = pack.finalize()?;
        // Safety: the handle is bound to `stream`; the plan and pack are finalized, their
        // pointers live device buffers and host scalars alive across the call.
        check(
            unsafe { dnn::cudnnBackendExecute(p.handle, p.plan, pack.0) },
            "cudnnBackendExecute",
        )
    }
}

/// A device's cuDNN handle (bound to the stream the ordering runs the work on: liger's, or
/// CubeCL's), plans and workspace.
struct State {
    handle: dnn::cudnnHandle_t,
    /// The stream the handle is bound to.
    stream: driver_sys::CUstream,
    /// A key whose graph cuDNN refused keeps the reason, so it is not built again.
    plans: HashMap<PlanKey, Result<Plan, String>>,
    workspace: Option<(u64, usize)>,
}

// Safety: used only under the states' lock, from CubeCL's device thread.
unsafe impl Send for State {}

impl State {
    fn new(stream: driver_sys::CUstream) -> Result<Self, String> {
        let load = std::panic::catch_unwind(|| unsafe { dnn::is_culib_present() });
        if !matches!(load, Ok(true)) {
            return Err(format!(
                "the cuDNN library was not found (tried {})",
                cudarc::get_lib_name_candidates("cudnn").join(", ")
            ));
        }
        let mut handle = std::ptr::null_mut();
        check(unsafe { dnn::cudnnCreate(&mut handle) }, "cudnnCreate")?;
        check(
            unsafe { dnn::cudnnSetStream(handle, stream as dnn::cudaStream_t) },
            "cudnnSetStream",
        )?;
        let version = unsafe { dnn::cudnnGetVersion() };
        log::info!("liger attention: cuDNN {version}");
        Ok(Self {
            handle,
            stream,
            plans: HashMap::new(),
            workspace: None,
        })
    }

    /// Binds the handle to `stream` (the previous work's stream was made to precede it by
    /// the ordering, so the workspace is never used by two streams at once).
    fn bind(&mut self, stream: driver_sys::CUstream) -> Result<(), String> {
        if stream != self.stream {
            check(
                unsafe { dnn::cudnnSetStream(self.handle, stream as dnn::cudaStream_t) },
                "cudnnSetStream",
            )?;
            self.stream = stream;
        }
        Ok(())
    }

    /// A workspace of at least `bytes` (0: none), grown when needed: the old one is freed
    /// once `stream` (which follows every earlier use) has finished with it.
    fn workspace(&mut self, bytes: usize, stream: driver_sys::CUstream) -> Result<u64, String> {
        if bytes == 0 {
            return Ok(0);
        }
        if let Some((address, size)) = self.workspace
            && size >= bytes
        {
            return Ok(address);
        }
        if let Some((address, _)) = self.workspace.take() {
            // Safety: our own stream; then our own allocation, no longer used.
            unsafe { driver::stream::synchronize(stream) }
                .map_err(|e| format!("synchronizing the vendor stream: {e:?}"))?;
            let _ = unsafe { driver::free_sync(address) };
        }
        let size = bytes.next_power_of_two();
        // Safety: a plain allocation, kept for the life of the process.
        let address = unsafe { driver::malloc_sync(size) }
            .map_err(|e| format!("cuDNN workspace of {size} bytes: {e:?}"))?;
        self.workspace = Some((address, size));
        Ok(address)
    }
}

fn states() -> &'static Mutex<HashMap<usize, Result<State, String>>> {
    static STATES: OnceLock<Mutex<HashMap<usize, Result<State, String>>>> = OnceLock::new();
    STATES.get_or_init(Default::default)
}

fn check(status: dnn::cudnnStatus_t, what: &str) -> Result<(), String> {
    if status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // Safety: cuDNN returns a static NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(dnn::cudnnGetErrorString(status)) };
    Err(format!("{what}: {status:?} ({})", text.to_string_lossy()))
}

/// A backend descriptor, destroyed on drop.
struct Desc(dnn::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // Safety: created by `cudnnBackendCreateDescriptor`, destroyed once.
        let _ = unsafe { dnn::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: D) -> Result<Self, String> {
        let mut d = std::ptr::null_mut();
        check(
            unsafe { dnn::cudnnBackendCreateDescriptor(kind, &mut d) },
            &format!("creating {kind:?}"),
        )?;
        Ok(Desc(d))
    }

    fn set<V>(&self, name: A, kind: T, values: &[V]) -> Result<(), String> {
        // Safety: `values` holds `values.len()` elements of the C type `kind` names.
        check(
            unsafe {
                dnn::cudnnBackendSetAttribute(
                    self.0,
                    name,
                    kind,
                    values.len() as i64,
                    values.as_ptr() as *const c_void,
                )
            },
            &format!("setting {name:?}"),
        )
    }

    fn set_descs(&self, name: A, descs: &[&Desc]) -> Result<(), String> {
        let raw: Vec<dnn::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    /// Up to `requested` elements of attribute `name` into `out` (null with 0 to count
    /// them); the number cuDNN has.
    fn get(
        &self,
        name: A,
        kind: T,
        requested: i64,
        out: *mut c_void,
        what: &str,
    ) -> Result<i64, String> {
        let mut count = 0i64;
        // Safety: `out` holds `requested` elements of the C type `kind` names (or is null
        // with `requested` 0).
        check(
            unsafe {
                dnn::cudnnBackendGetAttribute(self.0, name, kind, requested, &mut count, out)
            },
            what,
        )?;
        Ok(count)
    }

    fn finalize(self) -> Result<Self, String> {
        check(
            unsafe { dnn::cudnnBackendFinalize(self.0) },
            "cudnnBackendFinalize",
        )?;
        Ok(self)
    }
}

/// A finalized execution plan and its workspace.
struct Plan {
    plan: Desc,
    workspace_bytes: usize,
}

// Safety: see `State`.
unsafe impl Send for Plan {}

/// Builds the graph's descriptors, one tensor id at a time for the virtual ones.
struct Graph<'k> {
    dtype: dnn::cudnnDataType_t,
    ops: Vec<Desc>,
    next_virtual: i64,
    /// The bound tensors' strides.
    strides: &'k [(Uid, Dims)],
}

type Dims = [i64; 4];

fn contiguous(dims: Dims) -> Dims {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

/// `dims` laid out with the last two axes swapped in memory (a row-major `[.., b, a]`
/// matrix read as `[.., a, b]`).
fn transposed(dims: Dims) -> Dims {
    let mut s = contiguous([dims[0], dims[1], dims[3], dims[2]]);
    s.swap(2, 3);
    s
}

impl Graph<'_> {
    /// The strides `uid` was bound with.
    fn bound_strides(&self, uid: Uid) -> Dims {
        self.strides
            .iter()
            .find(|(u, _)| *u == uid)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("cuDNN graph: {uid:?} is not bound"))
    }

    fn tensor(
        &mut self,
        uid: Option<Uid>,
        dtype: dnn::cudnnDataType_t,
        dims: Dims,
        strides: Dims,
        by_value: bool,
    ) -> Result<Desc, String> {
        let (id, is_virtual) = match uid {
            Some(u) => (u as i64, false),
            None => {
                self.next_virtual += 1;
                (self.next_virtual, true)
            }
        };
        let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        t.set(
            A::CUDNN_ATTR_TENSOR_DATA_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[dtype],
        )?;
        t.set(A::CUDNN_ATTR_TENSOR_DIMENSIONS, T::CUDNN_TYPE_INT64, &dims)?;
        t.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?;
        t.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[id])?;
        t.set(
            A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            T::CUDNN_TYPE_INT64,
            &[16i64],
        )?;
        t.set(
            A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            T::CUDNN_TYPE_BOOLEAN,
            &[is_virtual],
        )?;
        if by_value {
            t.set(
                A::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                T::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        t.finalize()
    }

    /// An f32 virtual tensor.
    fn float(&mut self, dims: Dims) -> Result<Desc, String> {
        self.float_strided(dims, contiguous(dims))
    }

    fn float_strided(&mut self, dims: Dims, strides: Dims) -> Result<Desc, String> {
        self.tensor(None, FLOAT, dims, strides, false)
    }

    fn scalar(&mut self, uid: Uid) -> Result<Desc, String> {
        self.tensor(Some(uid), FLOAT, [1, 1, 1, 1], [1, 1, 1, 1], true)
    }

    fn pointwise(
        &mut self,
        mode: dnn::cudnnPointwiseMode_t,
        x: &Desc,
        b: Option<&Desc>,
        t: Option<&Desc>,
        y: &Desc,
        axis: Option<i64>,
    ) -> Result<(), String> {
        let prec = if mode == dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_CMP_GE {
            dnn::cudnnDataType_t::CUDNN_DATA_BOOLEAN
        } else {
            FLOAT
        };
        let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(
            A::CUDNN_ATTR_POINTWISE_MODE,
            T::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        pw.set(
            A::CUDNN_ATTR_POINTWISE_MATH_PREC,
            T::CUDNN_TYPE_DATA_TYPE,
            &[prec],
        )?;
        if let Some(axis) = axis {
            pw.set(A::CUDNN_ATTR_POINTWISE_AXIS, T::CUDNN_TYPE_INT64, &[axis])?;
        }
        let pw = pw.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
        if let Some(b) = b {
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
        }
        if let Some(t) = t {
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[t])?;
        }
        self.ops.push(op.finalize()?);
        Ok(())
    }

    fn matmul(&mut self, a: &Desc, b: &Desc, c: &Desc) -> Result<(), String> {
        let mm = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set(
            A::CUDNN_ATTR_MATMUL_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[FLOAT],
        )?;
        let mm = mm.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[a])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[b])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[c])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        self.ops.push(op.finalize()?);
        Ok(())
    }

    fn reduce(
        &mut self,
        operator: dnn::cudnnReduceTensorOp_t,
        x: &Desc,
        y: &Desc,
    ) -> Result<(), String> {
        let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        r.set(
            A::CUDNN_ATTR_REDUCTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[FLOAT],
        )?;
        r.set(
            A::CUDNN_ATTR_REDUCTION_OPERATOR,
            T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[operator],
        )?;
        let r = r.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&r])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[x])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[y])?;
        self.ops.push(op.finalize()?);
        Ok(())
    }

    fn reshape(&mut self, x: &Desc, y: &Desc) -> Result<(), String> {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[x])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[y])?;
        self.ops.push(op.finalize()?);
        Ok(())
    }

    /// `scores` with keys after the query set to −∞ (by value `Uid::MaskValue`), or as it
    /// is without a causal mask.
    fn causal(&mut self, scores: Desc, causal: bool, dims: Dims) -> Result<Desc, String> {
        if !causal {
            return Ok(scores);
        }
        let int32 = dnn::cudnnDataType_t::CUDNN_DATA_INT32;
        let row = self.tensor(None, int32, dims, contiguous(dims), false)?;
        self.pointwise(GEN_INDEX, &scores, None, None, &row, Some(2))?;
        let col = self.tensor(None, int32, dims, contiguous(dims), false)?;
        self.pointwise(GEN_INDEX, &scores, None, None, &col, Some(3))?;
        let boolean = dnn::cudnnDataType_t::CUDNN_DATA_BOOLEAN;
        let visible = self.tensor(None, boolean, dims, contiguous(dims), false)?;
        self.pointwise(
            dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_CMP_GE,
            &row,
            Some(&col),
            None,
            &visible,
            None,
        )?;
        let masked_value = self.scalar(Uid::MaskValue)?;
        let masked = self.float(dims)?;
        self.pointwise(
            dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_BINARY_SELECT,
            &scores,
            Some(&masked_value),
            Some(&visible),
            &masked,
            None,
        )?;
        Ok(masked)
    }

    /// A bound tensor of the input dtype.
    fn input(&mut self, uid: Uid, dims: Dims) -> Result<Desc, String> {
        let strides = self.bound_strides(uid);
        self.tensor(Some(uid), self.dtype, dims, strides, false)
    }

    /// A bound `[.., n, d]` tensor of the input dtype read as `[.., d, n]` (`dims`).
    fn input_transposed(&mut self, uid: Uid, dims: Dims) -> Result<Desc, String> {
        let mut strides = self.bound_strides(uid);
        strides.swap(2, 3);
        self.tensor(Some(uid), self.dtype, dims, strides, false)
    }

    /// A bound f32 tensor.
    fn bound_float(&mut self, uid: Uid, dims: Dims) -> Result<Desc, String> {
        let strides = self.bound_strides(uid);
        self.tensor(Some(uid), FLOAT, dims, strides, false)
    }

    /// A virtual row-major tensor of the input dtype.
    fn rounded(&mut self, dims: Dims) -> Result<Desc, String> {
        self.tensor(None, self.dtype, dims, contiguous(dims), false)
    }

    /// `S = Q·Kᵀ` and `S·scale`, both f32: the start of both graphs.
    fn scaled_scores(
        &mut self,
        q: &Desc,
        kt: &Desc,
        scale: &Desc,
        square: Dims,
    ) -> Result<Desc, String> {
        let scores = self.float(square)?;
        self.matmul(q, kt, &scores)?;
        let scaled = self.float(square)?;
        self.pointwise(MUL, &scores, Some(scale), None, &scaled, None)?;
        Ok(scaled)
    }

    /// `out = Σ_group Xᵀ·Y` for an f32 `X: [.., n, n]` (rounded to the input dtype as it
    /// is read transposed) and `Y` of `heads` dims: a product per query head, then their
    /// sum over each group into the key/value heads of `out`.
    fn grouped_transposed_product(
        &mut self,
        x: &Desc,
        y: &Desc,
        out: &Desc,
        square: Dims,
        heads: Dims,
    ) -> Result<(), String> {
        let xt = self.tensor(None, self.dtype, square, transposed(square), false)?;
        self.reshape(x, &xt)?;
        let per_head = self.rounded(heads)?;
        self.matmul(&xt, y, &per_head)?;
        self.reduce(ADD, &per_head, out)
    }

    /// The forward's operations (see the module docs).
    fn forward(&mut self, s: &SdpaShape) -> Result<(), String> {
        let (b, hq, hk, n, d) = dims(s);
        let q = self.input(Uid::Q, [b, hq, n, d])?;
        let kt = self.input_transposed(Uid::K, [b, hk, d, n])?;
        let v = self.input(Uid::V, [b, hk, n, d])?;
        let o = self.input(Uid::O, [b, hq, n, d])?;
        let rows = [b, hq, n, 1];
        let stats = self.bound_float(Uid::Stats, rows)?;
        let scale = self.scalar(Uid::Scale)?;
        let square = [b, hq, n, n];
        let scaled = self.scaled_scores(&q, &kt, &scale, square)?;
        let masked = self.causal(scaled, s.causal, square)?;
        let max = self.float(rows)?;
        self.reduce(MAX, &masked, &max)?;
        let shifted = self.float(square)?;
        self.pointwise(SUB, &masked, Some(&max), None, &shifted, None)?;
        let exp = self.float(square)?;
        self.pointwise(EXP, &shifted, None, None, &exp, None)?;
        let sum = self.float(rows)?;
        self.reduce(ADD, &exp, &sum)?;
        let log = self.float(rows)?;
        self.pointwise(LOG, &sum, None, None, &log, None)?;
        self.pointwise(ADD_PW, &max, Some(&log), None, &stats, None)?;
        let p = self.rounded(square)?;
        self.pointwise(DIV, &exp, Some(&sum), None, &p, None)?;
        self.matmul(&p, &v, &o)
    }

    /// The backward's operations (see the module docs).
    fn backward(&mut self, s: &SdpaShape) -> Result<(), String> {
        let (b, hq, hk, n, d) = dims(s);
        let q_dims = [b, hq, n, d];
        let kv_dims = [b, hk, n, d];
        let q = self.input(Uid::Q, q_dims)?;
        let kt = self.input_transposed(Uid::K, [b, hk, d, n])?;
        let vt = self.input_transposed(Uid::V, [b, hk, d, n])?;
        let o = self.input(Uid::O, q_dims)?;
        let rows = [b, hq, n, 1];
        let stats = self.bound_float(Uid::Stats, rows)?;
        let d_o = self.input(Uid::GradOutput, q_dims)?;
        let dq = self.input(Uid::GradQ, q_dims)?;
        let dk = self.input(Uid::GradK, kv_dims)?;
        let dv = self.input(Uid::GradV, kv_dims)?;
        let dot = self.bound_float(Uid::Dot, rows)?;
        let dq_sum = self.bound_float(Uid::GradQSum, q_dims)?;
        let scale = self.scalar(Uid::Scale)?;
        let one = self.scalar(Uid::One)?;

        // D = Σ dO∘O (times the dropout scale, 1).
        let product = self.float_strided(q_dims, [hq * n * d, n * d, hq * d, 1])?;
        self.pointwise(MUL, &d_o, Some(&o), None, &product, None)?;
        let dot_sum = self.float(rows)?;
        self.reduce(ADD, &product, &dot_sum)?;
        self.pointwise(MUL, &dot_sum, Some(&one), None, &dot, None)?;

        // P = exp(S·scale − lse) under the mask.
        let square = [b, hq, n, n];
        let scaled = self.scaled_scores(&q, &kt, &scale, square)?;
        let shifted = self.float(square)?;
        self.pointwise(SUB, &scaled, Some(&stats), None, &shifted, None)?;
        let masked = self.causal(shifted, s.causal, square)?;
        let p = self.float(square)?;
        self.pointwise(EXP, &masked, None, None, &p, None)?;

        // dV = Σ_group Pᵀ·dO.
        self.grouped_transposed_product(&p, &d_o, &dv, square, q_dims)?;

        // dS = P∘(dO·Vᵀ − D)·scale.
        let dp = self.float(square)?;
        self.matmul(&d_o, &vt, &dp)?;
        let dp_centered = self.float(square)?;
        self.pointwise(SUB, &dp, Some(&dot), None, &dp_centered, None)?;
        let ds_unscaled = self.float(square)?;
        self.pointwise(MUL, &dp_centered, Some(&p), None, &ds_unscaled, None)?;
        let ds = self.float(square)?;
        self.pointwise(MUL, &ds_unscaled, Some(&scale), None, &ds, None)?;

        // dK = Σ_group dSᵀ·Q.
        self.grouped_transposed_product(&ds, &q, &dk, square, q_dims)?;

        // dQ = dS·K, summed in f32, then rounded.
        let k = self.float(kv_dims)?;
        self.reshape(&kt, &k)?;
        self.matmul(&ds, &k, &dq_sum)?;
        self.pointwise(IDENTITY, &dq_sum, None, None, &dq, None)
    }
}

const FLOAT: dnn::cudnnDataType_t = dnn::cudnnDataType_t::CUDNN_DATA_FLOAT;
const MUL: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_MUL;
const SUB: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_SUB;
const ADD_PW: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD;
const DIV: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_DIV;
const EXP: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_EXP;
const LOG: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_LOG;
const IDENTITY: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_IDENTITY;
const GEN_INDEX: dnn::cudnnPointwiseMode_t = dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_GEN_INDEX;
const MAX: dnn::cudnnReduceTensorOp_t = dnn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX;
const ADD: dnn::cudnnReduceTensorOp_t = dnn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD;

fn dims(s: &SdpaShape) -> (i64, i64, i64, i64, i64) {
    (
        s.batch as i64,
        s.q_heads as i64,
        s.kv_heads as i64,
        s.seq as i64,
        s.head_dim as i64,
    )
}

impl Plan {
    /// The graph of `key`, its engines by cuDNN's heuristic (mode A, as cudnn-frontend asks),
    /// and the first whose plan finalizes.
    fn new(handle: dnn::cudnnHandle_t, key: &PlanKey) -> Result<Self, String> {
        let mut graph = Graph {
            dtype: key.shape.data_type(),
            ops: Vec::new(),
            next_virtual: 100,
            strides: &key.strides,
        };
        if key.backward {
            graph.backward(&key.shape)?;
        } else {
            graph.forward(&key.shape)?;
        }
        let what = if key.backward { "backward" } else { "forward" };
        let op_graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        let ops: Vec<&Desc> = graph.ops.iter().collect();
        op_graph.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
        op_graph.set(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        let op_graph = op_graph
            .finalize()
            .map_err(|e| format!("cuDNN took no {what} attention graph of {key:?}: {e}"))?;

        let heuristic = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heuristic.set_descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&op_graph])?;
        heuristic.set(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
        )?;
        let heuristic = heuristic.finalize()?;
        let count = heuristic.get(
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            std::ptr::null_mut(),
            "counting the heuristic's engine configurations",
        )?;
        let configs = (0..count.max(0))
            .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw: Vec<dnn::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.0).collect();
        let returned = heuristic.get(
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            raw.as_mut_ptr() as *mut c_void,
            "reading the heuristic's engine configurations",
        )?;
        let mut failures = Vec::new();
        for config in configs.iter().take(returned.max(0) as usize) {
            let attempt = (|| {
                let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
                plan.set(
                    A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                    T::CUDNN_TYPE_HANDLE,
                    &[handle],
                )?;
                plan.set_descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
                let plan = plan.finalize()?;
                let mut bytes = 0i64;
                plan.get(
                    A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                    T::CUDNN_TYPE_INT64,
                    1,
                    &mut bytes as *mut i64 as *mut c_void,
                    "reading the plan's workspace size",
                )?;
                Ok::<_, String>(Plan {
                    plan,
                    workspace_bytes: bytes.max(0) as usize,
                })
            })();
            match attempt {
                Ok(plan) => {
                    log::debug!(
                        "liger attention: cuDNN {what} plan for {key:?}, workspace {} bytes",
                        plan.workspace_bytes
                    );
                    return Ok(plan);
                }
                Err(why) => failures.push(why),
            }
        }
        Err(format!(
            "cuDNN has no engine for the {what} attention graph of {key:?} ({} configurations tried: {})",
            returned,
            failures.join("; ")
        ))
    }
}
