//! [`FusedOps`] for `CubeBackend` on any CubeCL runtime (CUDA, ROCm, wgpu): the fused
//! kernels of `liger-cubecl-kernels` launched on Burn's tensors.
//!
//! Inputs are made contiguous (a no-op for the usual row-major activations) and outputs
//! are allocated dense. Inputs arrive validated: the API entry checks them, and the dtypes
//! the kernels read ([`FusedOps::fused_dtype_supported`]), before anything reaches these
//! primitives (see [`FusedOps`]).

mod activation;
mod adamw;
mod attention;
#[cfg(feature = "cuda")]
mod context_events;
mod cross_entropy;
#[cfg(feature = "cuda")]
pub mod cublaslt;
#[cfg(feature = "cuda")]
pub mod cuda_pool;
#[cfg(feature = "cuda")]
mod cudnn;
#[cfg(feature = "cuda")]
mod cupti;
mod distill_rows;
mod embedding;
mod glu;
#[cfg(feature = "rocm")]
mod hipblaslt;
mod layer_norm;
mod linear;
mod lora;
mod matmul;
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
mod matmul_layout;
mod rms_norm;
mod rope;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod sequence;
mod softmax;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod vendor_engines;

pub use attention::{vendor_attention_calls, vendor_attention_queued};
pub use matmul::{MatmulCounts, matmul_counts};
#[cfg(feature = "cuda")]
pub use matmul::{cublaslt_matmul, cublaslt_repeated_products};

use crate::ops::FusedOps;
use crate::ops::validate;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use liger_cubecl_kernels::LaunchConfig;

impl<R, F, I, BT> FusedOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fused_dtype_supported(dtype: DType) -> bool {
        validate::kernel_dtype(dtype)
    }

    fn submit_queued(device: &R::Device) {
        // A flush is a blocking call on the device thread: it runs every queued task.
        if let Err(e) = R::client(device).flush() {
            panic!("liger: submitting the queued device work failed: {e:?}");
        }
    }

    fn hand_off_queued(device: &R::Device) {
        use cubecl::device::Device as _;
        // The device thread runs the partial batch now: its queue is the one `R::client`
        // uses (one per device and server type).
        cubecl::device_handle::DeviceHandle::<R::Server>::new(device.to_id()).flush_queue();
    }

    fn start_read(tensor: CubeTensor<R>) -> crate::ops::PendingRead {
        use burn_cubecl::kernel::into_contiguous_aligned;
        use cubecl::device::Device as _;
        use cubecl::server::{ComputeServer, CopyDescriptor};
        let tensor = into_contiguous_aligned(tensor);
        let (shape, dtype) = (tensor.meta.shape().clone(), tensor.dtype);
        let descriptor = CopyDescriptor::new(
            tensor.handle.clone().binding(),
            shape.clone(),
            tensor.meta.strides().clone(),
            tensor.elem_size(),
        );
        // The device thread queues the copy and its fence now, on this thread's stream
        // (as the tensor's client reads; it waits for the stream that wrote the tensor).
        // Burn's `float_into_data` is an async fn, which queues nothing until polled.
        let stream = cubecl::stream_id::StreamId::current();
        let copy = cubecl::device_handle::DeviceHandle::<R::Server>::new(tensor.device.to_id())
            .submit_blocking(move |server| server.read(vec![descriptor], stream))
            .unwrap_or_else(|e| {
                panic!("liger: queuing a read of a tensor {shape:?} failed: {e:?}")
            });
        crate::ops::PendingRead::new(move || {
            let mut bytes = cubecl::future::block_on(copy)
                .unwrap_or_else(|e| panic!("liger: reading a tensor {shape:?} back failed: {e}"));
            burn::tensor::TensorData::from_bytes(bytes.remove(0), shape, dtype)
        })
    }

    fn fused_rms_norm(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        options: crate::ops::RmsNormOptions,
    ) -> crate::ops::RmsNormOutput<Self> {
        rms_norm::forward::<Self, R>(x, None, weight, options).0
    }

    fn fused_rms_norm_backward(
        grad_output: CubeTensor<R>,
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        rstd: CubeTensor<R>,
        options: crate::ops::RmsNormOptions,
    ) -> crate::ops::NormGrads<Self> {
        rms_norm::backward::<Self, R>(grad_output, x, weight, rstd, options)
    }

    fn fused_add_rms_norm(
        x: CubeTensor<R>,
        residual: CubeTensor<R>,
        weight: CubeTensor<R>,
        options: crate::ops::RmsNormOptions,
    ) -> crate::ops::AddRmsNormOutput<Self> {
        let (out, sum) = rms_norm::forward::<Self, R>(x, Some(residual), weight, options);
        crate::ops::AddRmsNormOutput {
            output: out.output,
            sum: sum.expect("the residual variant returns the sum"),
            rstd: out.rstd,
        }
    }

    fn fused_layer_norm(
        x: CubeTensor<R>,
        gamma: CubeTensor<R>,
        beta: Option<CubeTensor<R>>,
        eps: f64,
    ) -> crate::ops::LayerNormOutput<Self> {
        layer_norm::forward::<Self, R>(x, gamma, beta, eps)
    }

    fn fused_layer_norm_backward(
        grad_output: CubeTensor<R>,
        x: CubeTensor<R>,
        gamma: CubeTensor<R>,
        mean: CubeTensor<R>,
        rstd: CubeTensor<R>,
        has_bias: bool,
    ) -> crate::ops::NormGrads<Self> {
        layer_norm::backward::<Self, R>(grad_output, x, gamma, mean, rstd, has_bias)
    }

    fn fused_softmax(x: CubeTensor<R>) -> CubeTensor<R> {
        softmax::forward(x, false)
    }

    fn fused_softmax_backward(grad_output: CubeTensor<R>, output: CubeTensor<R>) -> CubeTensor<R> {
        softmax::backward(grad_output, output, false)
    }

    fn fused_log_softmax(x: CubeTensor<R>) -> CubeTensor<R> {
        softmax::forward(x, true)
    }

    fn fused_log_softmax_backward(
        grad_output: CubeTensor<R>,
        output: CubeTensor<R>,
    ) -> CubeTensor<R> {
        softmax::backward(grad_output, output, true)
    }

    fn fused_glu(
        gate: CubeTensor<R>,
        up: CubeTensor<R>,
        activation: crate::ops::GluActivation,
    ) -> CubeTensor<R> {
        glu::forward(gate, up, activation)
    }

    fn fused_glu_backward(
        grad_output: CubeTensor<R>,
        gate: CubeTensor<R>,
        up: CubeTensor<R>,
        activation: crate::ops::GluActivation,
    ) -> crate::ops::GluGrads<Self> {
        let (grad_gate, grad_up, _) = glu::backward(grad_output, gate, up, activation, false);
        crate::ops::GluGrads { grad_gate, grad_up }
    }

    fn fused_glu_backward_with_unit(
        grad_output: CubeTensor<R>,
        gate: CubeTensor<R>,
        up: CubeTensor<R>,
        activation: crate::ops::GluActivation,
    ) -> (crate::ops::GluGrads<Self>, CubeTensor<R>) {
        let (grad_gate, grad_up, unit) = glu::backward(grad_output, gate, up, activation, true);
        let unit = unit.expect("the unit was asked for");
        (crate::ops::GluGrads { grad_gate, grad_up }, unit)
    }

    fn fused_gelu(x: CubeTensor<R>) -> CubeTensor<R> {
        activation::forward(x, activation::Unary::Gelu)
    }

    fn fused_gelu_backward(grad_output: CubeTensor<R>, x: CubeTensor<R>) -> CubeTensor<R> {
        activation::backward(grad_output, x, activation::Unary::Gelu)
    }

    fn fused_sigmoid(x: CubeTensor<R>) -> CubeTensor<R> {
        activation::forward(x, activation::Unary::Sigmoid)
    }

    fn fused_sigmoid_backward(grad_output: CubeTensor<R>, output: CubeTensor<R>) -> CubeTensor<R> {
        activation::backward(grad_output, output, activation::Unary::Sigmoid)
    }

    fn fused_embedding_backward(
        grad_output: CubeTensor<R>,
        indices: CubeTensor<R>,
        num_embeddings: usize,
    ) -> CubeTensor<R> {
        embedding::backward::<Self, R>(grad_output, indices, num_embeddings)
    }

    fn fused_rope(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        cos: CubeTensor<R>,
        sin: CubeTensor<R>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeOutput<Self> {
        let (q, k) = rope::rope(Some(q), Some(k), cos, sin, layout, false);
        crate::ops::RopeOutput {
            q: q.expect("q was given"),
            k: k.expect("k was given"),
        }
    }

    fn fused_rope_backward(
        grad_q: Option<CubeTensor<R>>,
        grad_k: Option<CubeTensor<R>>,
        cos: CubeTensor<R>,
        sin: CubeTensor<R>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeGrads<Self> {
        let (grad_q, grad_k) = rope::rope(grad_q, grad_k, cos, sin, layout, true);
        crate::ops::RopeGrads { grad_q, grad_k }
    }

    fn fused_cross_entropy(
        logits: CubeTensor<R>,
        targets: CubeTensor<R>,
        class_weight: Option<CubeTensor<R>>,
        grad_scale: Option<CubeTensor<R>>,
        z_loss_scale: Option<CubeTensor<R>>,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::CrossEntropyRows<Self> {
        cross_entropy::forward::<Self, R>(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        )
    }

    fn fused_cross_entropy_backward(
        grad: CubeTensor<R>,
        grad_rows: CubeTensor<R>,
        grad_scale: CubeTensor<R>,
    ) -> CubeTensor<R> {
        cross_entropy::backward::<Self, R>(grad, grad_rows, grad_scale)
    }

    fn fused_target_stats(
        targets: CubeTensor<R>,
        class_weight: Option<CubeTensor<R>>,
        vocab: usize,
        ignore_index: i64,
    ) -> crate::ops::TargetStats<Self> {
        cross_entropy::stats::<Self, R>(targets, class_weight, vocab, ignore_index)
    }

    fn fused_distill_rows(
        student: CubeTensor<R>,
        teacher: CubeTensor<R>,
        targets: CubeTensor<R>,
        grad_scale: Option<CubeTensor<R>>,
        options: crate::ops::DistillOptions,
    ) -> crate::ops::DistillRows<Self> {
        distill_rows::forward::<Self, R>(student, teacher, targets, grad_scale, options)
    }

    fn fused_lora_linear_parts(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        bias: Option<CubeTensor<R>>,
        adapter_x: Option<CubeTensor<R>>,
        a: CubeTensor<R>,
        b: CubeTensor<R>,
        options: crate::ops::LoraOptions,
    ) -> crate::ops::LoraLinearParts<Self> {
        lora::parts::<R, F, I, BT>(x, weight, bias, adapter_x, a, b, options)
    }

    fn fused_lora_linear_backward(
        grad_output: CubeTensor<R>,
        adapter_input: CubeTensor<R>,
        separate: bool,
        weight: CubeTensor<R>,
        a: CubeTensor<R>,
        b: CubeTensor<R>,
        hidden: CubeTensor<R>,
        options: crate::ops::LoraOptions,
        wanted: crate::ops::LoraLinearGradsWanted,
    ) -> crate::ops::LoraLinearGrads<Self> {
        lora::backward::<R, F, I, BT>(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        )
    }

    fn fused_matmul(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
        matmul::matmul::<R, F, I, BT>(lhs, rhs)
    }

    fn fused_matmul_uses_vendor_library(device: &R::Device, dtype: DType) -> bool {
        matmul::uses_vendor_library::<R>(device, dtype)
    }

    fn fused_matmul_backward(
        lhs: CubeTensor<R>,
        rhs: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        matmul::matmul_backward::<R, F, I, BT>(lhs, rhs, grad)
    }

    fn fused_linear(x: CubeTensor<R>, weight: CubeTensor<R>, bias: CubeTensor<R>) -> CubeTensor<R> {
        linear::linear::<R, F, I, BT>(x, weight, bias)
    }

    fn fused_linear_weight_backward(
        x: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        linear::weight_backward::<R, F, I, BT>(x, grad)
    }

    fn fused_matmul_add(
        acc: CubeTensor<R>,
        lhs: CubeTensor<R>,
        rhs: CubeTensor<R>,
    ) -> CubeTensor<R> {
        matmul::matmul_add::<R, F, I, BT>(acc, lhs, rhs)
    }

    fn fused_adamw_step(
        param: CubeTensor<R>,
        grad: CubeTensor<R>,
        moments: Option<crate::ops::AdamWMoments<Self>>,
        options: crate::ops::AdamWStepOptions,
    ) -> crate::ops::AdamWStepOutput<Self> {
        adamw::step::<Self, R>(param, grad, moments, options)
    }

    fn fused_attention(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        mask: Option<burn::tensor::ops::BoolTensor<Self>>,
        document_ids: Option<CubeTensor<R>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionOutput<Self> {
        attention::forward(q, k, v, mask, document_ids, options)
    }

    fn fused_attention_backward(
        grad_output: CubeTensor<R>,
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        mask: Option<burn::tensor::ops::BoolTensor<Self>>,
        document_ids: Option<CubeTensor<R>>,
        forward: Option<crate::ops::AttentionOutput<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionGrads<Self> {
        attention::backward(grad_output, q, k, v, mask, document_ids, forward, options)
    }

    fn flash_attention_variant(
        device: &R::Device,
        dtype: DType,
        head_dim: usize,
        options: &crate::ops::AttentionOptions,
    ) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
        attention::variant::<R>(device, dtype, head_dim, options)
    }
}

/// `[..., d]` → `(rows, d)`.
pub(crate) fn rows_width(shape: &Shape) -> (usize, usize) {
    let width = shape[shape.num_dims() - 1];
    (shape.num_elements() / width.max(1), width)
}

/// A dense output like `like` with another shape and dtype.
pub(crate) fn empty_like<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Shape,
    dtype: DType,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// An uninitialized tensor of `shape` and `dtype` on `like`'s device whose dimensions lie
/// in memory in `order` (outermost first: a permutation of the dimensions).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn empty_in_order<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Shape,
    dtype: DType,
    order: &[usize],
) -> CubeTensor<R> {
    let mut out = empty_like(like, shape.clone(), dtype);
    let mut stride = 1;
    for &i in order.iter().rev() {
        out.meta.strides_mut()[i] = stride;
        stride *= shape[i];
    }
    out
}

/// An uninitialized tensor of `like`'s shape and dtype whose dimensions lie in memory in
/// the order of `like`'s strides (largest first, ties in dimension order, the last
/// dimension innermost), as `torch.empty_like` keeps a dense tensor's layout.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn empty_in_layout_of<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let last = like.meta.num_dims() - 1;
    let mut order: Vec<usize> = (0..last).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(like.meta.strides()[i]));
    order.push(last);
    empty_in_order(like, like.meta.shape().clone(), like.dtype, &order)
}

/// A normalization's input and weight, dense.
pub(crate) fn prepare_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    (into_contiguous(x), into_contiguous(weight))
}

/// The launch geometry of every kernel on this client: the kernels' per-device table
/// ([`LaunchConfig::for_device`]), or the calling thread's override in test builds
/// ([`crate::test_hooks::with_launch_config`], feature `test-hooks`).
pub(crate) fn launch_config<R: cubecl::Runtime>(
    client: &cubecl::client::ComputeClient<R>,
) -> LaunchConfig {
    #[cfg(feature = "test-hooks")]
    if let Some(config) = crate::test_hooks::launch_config_override() {
        return config;
    }
    LaunchConfig::for_device(client.properties())
}

/// Panics with the kernel's own message (it names the op) if a launch was refused.
pub(crate) fn launched(result: Result<(), liger_cubecl_kernels::KernelError>) {
    if let Err(e) = result {
        panic!("{e}");
    }
}
