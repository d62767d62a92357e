//! Attention on CubeCL tensors: the flash kernels of `liger_cubecl_kernels::attention`
//! when [`plan`] finds one for the device, dtype and head dimension, else the blockwise
//! composition ([`compose::attention`](crate::ops::compose::attention)) on this backend.
//!
//! The choice ([`AttentionOptions::kernel`]): `Auto` takes the flash kernels on tensor
//! cores (devices with 16×16×16 `cmma` of the dtype into f32: CUDA f16/bf16; the forward
//! with register-resident `mma.sync` products where PTX's layouts hold: CUDA sm_80+) and head
//! dimensions that are multiples of 16 up to 256; `Flash` takes them everywhere (the FMA
//! variant without tensor cores); `Blockwise` never. A mask tensor, and a scale that is not
//! positive and finite (the kernels keep row maxima of unscaled scores), go blockwise.
//! [`AttentionOptions::deterministic`] takes the plan's dQ kernel over its atomic sums.
//!
//! On CUDA, `Auto` first offers the problem to cuDNN's fused attention ([`super::cudnn`],
//! the engines PyTorch's SDPA runs on Hopper): f16/bf16, head dimensions in 8s up to 128,
//! causal or unmasked self-attention without a window, document ids or mask tensor, and a
//! positive, finite scale; the backward also not `deterministic` (cuDNN sums dQ by atomic
//! adds). Where cuDNN is missing or refuses the graph, the flash kernels run, and the
//! reason is logged once (`liger -v`).
//!
//! cuDNN reads q, k, v and the output gradient through their strides (the transposed views
//! of `[batch, seq, heads, head_dim]` projections are not copied), writes the output as
//! `[batch, seq, heads, head_dim]` in memory (so the usual transpose back and reshape to
//! `[batch, seq, hidden]` is free, as with PyTorch's SDPA), and each gradient in its
//! input's layout. The flash kernels take contiguous tensors and write contiguous ones.

#[cfg(feature = "cuda")]
use super::{empty_in_layout_of, empty_in_order};
use super::{empty_like, launched};
use crate::ops::{
    AttentionGrads, AttentionKernel, AttentionOptions, AttentionOutput, compose, validate,
};
use burn::tensor::ops::{BoolTensor, IntTensorOps};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::ComputeClient;
use liger_cubecl_kernels::attention::{
    AttentionMask, FlashBackwardArgs, FlashForwardArgs, FlashPlan, FlashProblem, FlashVariant,
    flash_attention, flash_attention_backward_planned, flash_plan,
};
use std::sync::atomic::AtomicBool;

/// The flash kernels' plan for `head_dim`-wide heads of `dtype`, or `None` for the
/// blockwise path (see the module docs). Panics when `AttentionKernel::Flash` is asked for
/// and no variant runs here.
pub(crate) fn plan<R: CubeRuntime>(
    client: &ComputeClient<R>,
    dtype: DType,
    head_dim: usize,
    options: &AttentionOptions,
) -> Option<FlashPlan> {
    if !validate::kernel_dtype(dtype) {
        return None;
    }
    // The flash kernels keep row maxima of the unscaled scores: a positive, finite scale.
    let scale_ok = options.scale > 0.0 && options.scale.is_finite();
    let tensor_cores = || {
        let plan = flash_plan(client, head_dim, dtype.into(), FlashVariant::Mma)
            .or_else(|_| flash_plan(client, head_dim, dtype.into(), FlashVariant::TensorCores));
        if let Err(why) = &plan {
            log_without_tensor_cores(why);
        }
        plan
    };
    let plan = match options.kernel {
        AttentionKernel::Blockwise => None,
        AttentionKernel::Auto => tensor_cores().ok().filter(|_| scale_ok),
        AttentionKernel::Flash if !scale_ok => panic!(
            "attention: AttentionKernel::Flash asked for with scale {}; the flash kernels take \
             a positive, finite scale (AttentionKernel::Auto or Blockwise take any)",
            options.scale
        ),
        AttentionKernel::Flash => Some(
            tensor_cores()
                .or_else(|_| flash_plan(client, head_dim, dtype.into(), FlashVariant::Fma))
                .unwrap_or_else(|e| panic!("attention: AttentionKernel::Flash asked for: {e}")),
        ),
    };
    plan.map(|p| {
        if options.deterministic {
            p.deterministic()
        } else {
            p
        }
    })
}

/// Says once per process why the tensor-core flash kernels do not run (e.g. Vulkan through
/// wgpu: cooperative matrices, but less shared memory a cube than the kernels take), so a
/// user comparing vendors sees which kernels ran (`liger -v`).
fn log_without_tensor_cores(why: &liger_cubecl_kernels::KernelError) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    log_once(&LOGGED, || {
        format!("attention: the tensor-core flash kernels do not run on this device: {why}")
    });
}

/// Logs `message` at info level the first time `logged` is seen unset.
fn log_once(logged: &AtomicBool, message: impl FnOnce() -> String) {
    if !logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::info!("{}", message());
    }
}

/// Calls that ran on a vendor library's attention (cuDNN) in this process, forward and
/// backward: benchmarks read it before and after to say which implementation they timed.
pub fn vendor_attention_calls() -> u64 {
    VENDOR_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

static VENDOR_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Of the calls on a vendor library's attention, those queued on CubeCL's device thread
/// without the caller waiting (a problem planned before on the device), in the calling
/// thread's counting scope; counted with the `launch-counters` feature only.
#[doc(hidden)]
pub fn vendor_attention_queued() -> u64 {
    liger_cubecl_kernels::counters::get(liger_cubecl_kernels::counters::Kernel::vendor_work_queued)
}

/// Says once per process why cuDNN's attention does not run a problem it was offered.
#[cfg(feature = "cuda")]
fn log_without_vendor(why: &str) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    log_once(&LOGGED, || {
        format!("attention: the flash kernels run in place of cuDNN: {why}")
    });
}

/// The problem as cuDNN's graphs take it, when `Auto` offers it to cuDNN (see the module
/// docs); `None` otherwise.
#[cfg(feature = "cuda")]
fn vendor_shape(
    q: &Shape,
    k: &Shape,
    dtype: DType,
    options: &AttentionOptions,
    masked: bool,
    backward: bool,
) -> Option<super::cudnn::SdpaShape> {
    let offered = options.kernel == AttentionKernel::Auto
        && !masked
        && options.window.is_none()
        && options.scale > 0.0
        && options.scale.is_finite()
        && q[2] == k[2]
        && !(backward && options.deterministic);
    let shape = super::cudnn::SdpaShape {
        batch: q[0],
        q_heads: q[1],
        kv_heads: k[1],
        seq: q[2],
        head_dim: q[3],
        causal: options.causal,
        dtype,
    };
    (offered && shape.unsupported().is_none()).then_some(shape)
}

/// As a CUDA tensor, when `R` is CUDA.
#[cfg(feature = "cuda")]
fn as_cuda<R: CubeRuntime>(t: &CubeTensor<R>) -> Option<&CubeTensor<cubecl::cuda::CudaRuntime>> {
    (t as &dyn std::any::Any).downcast_ref::<CubeTensor<cubecl::cuda::CudaRuntime>>()
}

/// `t` as cuDNN reads it: as it is when its head dimension is dense and its other strides
/// keep every row 16-byte aligned (f16/bf16 rows in 8s), in whatever order batch, heads and
/// positions lie; otherwise a contiguous copy.
#[cfg(feature = "cuda")]
fn vendor_operand<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    let readable = strides[3] == 1
        && (0..3).all(|i| shape[i] == 1 || (strides[i] > 0 && strides[i].is_multiple_of(8)));
    if readable { t } else { into_contiguous(t) }
}

/// The forward on cuDNN into `output` and `lse`, when `R` is CUDA and cuDNN runs it.
#[cfg(feature = "cuda")]
fn vendor_forward<R: CubeRuntime>(
    (q, k, v): (&CubeTensor<R>, &CubeTensor<R>, &CubeTensor<R>),
    (output, lse): (&CubeTensor<R>, &CubeTensor<R>),
    shape: Option<super::cudnn::SdpaShape>,
    scale: f64,
) -> bool {
    let Some(shape) = shape else {
        return false;
    };
    let (Some(q), Some(k), Some(v), Some(output), Some(lse)) = (
        as_cuda(q),
        as_cuda(k),
        as_cuda(v),
        as_cuda(output),
        as_cuda(lse),
    ) else {
        return false;
    };
    let tensors = super::cudnn::SdpaForward {
        q,
        k,
        v,
        output,
        lse,
    };
    counted(super::cudnn::forward(shape, scale as f32, tensors))
}

/// Whether cuDNN ran a call (counted), or why not (logged once).
#[cfg(feature = "cuda")]
fn counted(ran: Result<(), String>) -> bool {
    match ran {
        Ok(()) => {
            VENDOR_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Err(why) => {
            log_without_vendor(&why);
            false
        }
    }
}

/// The backward on cuDNN into the gradients, when `R` is CUDA and cuDNN runs it:
/// `[q, k, v, output, lse, grad_output, grad_q, grad_k, grad_v, dot, grad_q_sum]` (see
/// [`super::cudnn::SdpaBackward`]).
#[cfg(feature = "cuda")]
fn vendor_backward<R: CubeRuntime>(
    tensors: [&CubeTensor<R>; 11],
    shape: super::cudnn::SdpaShape,
    scale: f64,
) -> bool {
    let [
        Some(q),
        Some(k),
        Some(v),
        Some(output),
        Some(lse),
        Some(grad_output),
        Some(grad_q),
        Some(grad_k),
        Some(grad_v),
        Some(dot),
        Some(grad_q_sum),
    ] = tensors.map(as_cuda)
    else {
        return false;
    };
    let tensors = super::cudnn::SdpaBackward {
        q,
        k,
        v,
        output,
        lse,
        grad_output,
        grad_q,
        grad_k,
        grad_v,
        dot,
        grad_q_sum,
    };
    counted(super::cudnn::backward(shape, scale as f32, tensors))
}

/// Which flash kernels run these inputs (no mask tensor) on `device`, if any.
pub(crate) fn variant<R: CubeRuntime>(
    device: &R::Device,
    dtype: DType,
    head_dim: usize,
    options: &AttentionOptions,
) -> Option<FlashVariant> {
    plan(&R::client(device), dtype, head_dim, options).map(|p| p.variant)
}

fn problem(q: &Shape, k: &Shape, options: &AttentionOptions, documents: bool) -> FlashProblem {
    FlashProblem {
        batch: q[0],
        q_heads: q[1],
        kv_heads: k[1],
        seq: q[2],
        head_dim: q[3],
        scale: options.scale,
        mask: AttentionMask {
            causal: options.causal,
            window: options.window.is_some(),
            documents,
        },
        window: options.window.unwrap_or(0),
    }
}

/// Document ids as the kernels read them: dense i32.
fn ids_i32<R, F, I, BT>(ids: CubeTensor<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let ids = if ids.dtype == DType::I32 {
        ids
    } else {
        <CubeBackend<R, F, I, BT> as IntTensorOps<CubeBackend<R, F, I, BT>>>::int_cast(
            ids,
            IntDType::I32,
        )
    };
    into_contiguous(ids)
}

/// `fused_attention` for `CubeBackend`.
pub(crate) fn forward<R, F, I, BT>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    mask: Option<BoolTensor<CubeBackend<R, F, I, BT>>>,
    document_ids: Option<CubeTensor<R>>,
    options: AttentionOptions,
) -> AttentionOutput<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let plan = match &mask {
        None => plan(&q.client, q.dtype, q.shape()[3], &options),
        Some(_) if options.kernel == AttentionKernel::Flash => {
            panic!(
                "attention: AttentionKernel::Flash cannot take a mask tensor (the flash kernels build causal, window and document masks from positions and ids)"
            )
        }
        Some(_) => None,
    };
    // cuDNN is offered what the flash kernels would run (see the module docs).
    let Some(plan) = plan else {
        return compose::attention::forward::<CubeBackend<R, F, I, BT>>(
            q,
            k,
            v,
            mask,
            document_ids,
            options,
        );
    };
    #[cfg(feature = "cuda")]
    let vendor = vendor_shape(
        &q.shape(),
        &k.shape(),
        q.dtype,
        &options,
        document_ids.is_some(),
        false,
    );
    let lse_shape = |q: &CubeTensor<R>| Shape::new([q.shape()[0], q.shape()[1], q.shape()[2]]);
    #[cfg(feature = "cuda")]
    let (q, k, v) = match vendor {
        Some(shape) => {
            let (q, k, v) = (vendor_operand(q), vendor_operand(k), vendor_operand(v));
            // Sequence-major, `[batch, seq, heads, head_dim]` in memory.
            let output = empty_in_order(&q, q.shape(), q.dtype, &[0, 2, 1, 3]);
            let lse = empty_like(&q, lse_shape(&q), DType::F32);
            if vendor_forward((&q, &k, &v), (&output, &lse), Some(shape), options.scale) {
                return AttentionOutput {
                    output,
                    lse: Some(lse),
                };
            }
            (q, k, v)
        }
        None => (q, k, v),
    };
    let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
    let ids = document_ids.map(ids_i32::<R, F, I, BT>);
    let (q_shape, k_shape) = (q.shape(), k.shape());
    let output = empty_like(&q, q_shape.clone(), q.dtype);
    let lse = empty_like(&q, lse_shape(&q), DType::F32);
    launched(flash_attention::<R>(
        &q.client,
        FlashForwardArgs {
            q: &q.handle,
            k: &k.handle,
            v: &v.handle,
            document_ids: ids.as_ref().map(|t| &t.handle),
            output: &output.handle,
            lse: &lse.handle,
        },
        problem(&q_shape, &k_shape, &options, ids.is_some()),
        plan.variant,
        q.dtype.into(),
    ));
    AttentionOutput {
        output,
        lse: Some(lse),
    }
}

/// `fused_attention_backward` for `CubeBackend`: the flash backward when the forward
/// returned `lse`, else the blockwise one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<R, F, I, BT>(
    grad_output: CubeTensor<R>,
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    mask: Option<BoolTensor<CubeBackend<R, F, I, BT>>>,
    document_ids: Option<CubeTensor<R>>,
    forward: Option<AttentionOutput<CubeBackend<R, F, I, BT>>>,
    options: AttentionOptions,
) -> AttentionGrads<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let saved = forward.and_then(|f| Some((f.output, f.lse?)));
    let (Some((output, lse)), None) = (saved, &mask) else {
        return compose::attention::backward::<CubeBackend<R, F, I, BT>>(
            grad_output,
            q,
            k,
            v,
            mask,
            document_ids,
            options,
        );
    };
    #[cfg(feature = "cuda")]
    let vendor = vendor_shape(
        &q.shape(),
        &k.shape(),
        q.dtype,
        &options,
        document_ids.is_some(),
        true,
    );
    let q_shape = q.shape();
    // The forward's plan, or any this device runs: the backward only needs lse. Its dQ as
    // `options` asks (atomic sums, or the dQ kernel when deterministic).
    let backward_plan = plan(&q.client, q.dtype, q_shape[3], &options)
        .or_else(|| {
            plan(
                &q.client,
                q.dtype,
                q_shape[3],
                &options.with_kernel(AttentionKernel::Flash),
            )
        })
        .expect("attention_backward: the flash forward ran, so a flash variant runs here");
    #[cfg(feature = "cuda")]
    let (grad_output, q, k, v, output) = match vendor {
        Some(shape) => {
            let [grad_output, q, k, v, output] = [grad_output, q, k, v, output].map(vendor_operand);
            let rows = Shape::new([q_shape[0], q_shape[1], q_shape[2]]);
            let dot = empty_like(&q, rows, DType::F32);
            let grad_q_sum = empty_like(&q, q_shape.clone(), DType::F32);
            let grads = [&q, &k, &v].map(empty_in_layout_of);
            let [grad_q, grad_k, grad_v] = &grads;
            let bound = [
                &q,
                &k,
                &v,
                &output,
                &lse,
                &grad_output,
                grad_q,
                grad_k,
                grad_v,
                &dot,
                &grad_q_sum,
            ];
            if vendor_backward(bound, shape, options.scale) {
                let [grad_q, grad_k, grad_v] = grads;
                return AttentionGrads {
                    grad_q,
                    grad_k,
                    grad_v,
                };
            }
            (grad_output, q, k, v, output)
        }
        None => (grad_output, q, k, v, output),
    };
    let contiguous = into_contiguous::<R>;
    let (grad_output, q, k, v) = (
        contiguous(grad_output),
        contiguous(q),
        contiguous(k),
        contiguous(v),
    );
    let (output, lse) = (contiguous(output), contiguous(lse));
    let ids = document_ids.map(ids_i32::<R, F, I, BT>);
    let k_shape = k.shape();
    let grad_q = empty_like(&q, q_shape.clone(), q.dtype);
    let grad_k = empty_like(&k, k_shape.clone(), k.dtype);
    let grad_v = empty_like(&v, k_shape.clone(), v.dtype);
    launched(flash_attention_backward_planned::<R>(
        &q.client,
        FlashBackwardArgs {
            grad_output: &grad_output.handle,
            q: &q.handle,
            k: &k.handle,
            v: &v.handle,
            output: &output.handle,
            lse: &lse.handle,
            document_ids: ids.as_ref().map(|t| &t.handle),
            grad_q: &grad_q.handle,
            grad_k: &grad_k.handle,
            grad_v: &grad_v.handle,
        },
        problem(&q_shape, &k_shape, &options, ids.is_some()),
        &backward_plan,
        q.dtype.into(),
    ));
    AttentionGrads {
        grad_q,
        grad_k,
        grad_v,
    }
}
