//! [`FusedOps`] for `Fusion<B>`: each fused primitive is registered in the fusion stream
//! as one custom operation (`CustomOpIr`), so it is ordered with the surrounding lazily
//! fused ops and executes `B`'s fused kernel when the stream reaches it.
//!
//! Inputs arrive validated: the API entry checks them where the user called the op, before
//! anything is registered (the stream executes later, possibly on another thread).

pub use crate::hand_off::{HAND_OFF, HandOff};

mod activation;
mod adamw;
mod attention;
mod cross_entropy;
mod custom_op;
mod distill_rows;
mod embedding;
mod glu;
mod layer_norm;
mod linear;
mod lora;
mod matmul;
mod rms_norm;
mod rope;
mod softmax;

use crate::ops::{
    AddRmsNormOutput, FusedOps, LayerNormOutput, NormGrads, RmsNormOptions, RmsNormOutput,
};
use burn::tensor::DType;
use burn_fusion::{Fusion, FusionBackend, FusionTensor};

impl<B: FusionBackend + FusedOps> FusedOps for Fusion<B> {
    /// The custom operations run `B`'s fused primitives: `B`'s dtypes.
    fn fused_dtype_supported(dtype: DType) -> bool {
        B::fused_dtype_supported(dtype)
    }

    fn fused_rms_norm(
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> RmsNormOutput<Self> {
        rms_norm::rms_norm::<B>(x, weight, options)
    }

    fn fused_add_rms_norm(
        x: FusionTensor<B::FusionRuntime>,
        residual: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> AddRmsNormOutput<Self> {
        rms_norm::add_rms_norm::<B>(x, residual, weight, options)
    }

    fn fused_rms_norm_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        rstd: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> NormGrads<Self> {
        rms_norm::rms_norm_backward::<B>(grad_output, x, weight, rstd, options)
    }

    fn fused_layer_norm(
        x: FusionTensor<B::FusionRuntime>,
        gamma: FusionTensor<B::FusionRuntime>,
        beta: Option<FusionTensor<B::FusionRuntime>>,
        eps: f64,
    ) -> LayerNormOutput<Self> {
        layer_norm::layer_norm::<B>(x, gamma, beta, eps)
    }

    fn fused_layer_norm_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
        gamma: FusionTensor<B::FusionRuntime>,
        mean: FusionTensor<B::FusionRuntime>,
        rstd: FusionTensor<B::FusionRuntime>,
        has_bias: bool,
    ) -> NormGrads<Self> {
        layer_norm::layer_norm_backward::<B>(grad_output, x, gamma, mean, rstd, has_bias)
    }

    fn fused_softmax(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        softmax::softmax::<B>(x, false)
    }

    fn fused_log_softmax(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        softmax::softmax::<B>(x, true)
    }

    fn fused_softmax_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        softmax::softmax_backward::<B>(grad_output, output, false)
    }

    fn fused_log_softmax_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        softmax::softmax_backward::<B>(grad_output, output, true)
    }

    fn fused_glu(
        gate: FusionTensor<B::FusionRuntime>,
        up: FusionTensor<B::FusionRuntime>,
        activation: crate::ops::GluActivation,
    ) -> FusionTensor<B::FusionRuntime> {
        glu::glu::<B>(gate, up, activation)
    }

    fn fused_glu_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        gate: FusionTensor<B::FusionRuntime>,
        up: FusionTensor<B::FusionRuntime>,
        activation: crate::ops::GluActivation,
    ) -> crate::ops::GluGrads<Self> {
        glu::glu_backward::<B>(grad_output, gate, up, activation)
    }

    fn fused_glu_backward_with_unit(
        grad_output: FusionTensor<B::FusionRuntime>,
        gate: FusionTensor<B::FusionRuntime>,
        up: FusionTensor<B::FusionRuntime>,
        activation: crate::ops::GluActivation,
    ) -> (crate::ops::GluGrads<Self>, FusionTensor<B::FusionRuntime>) {
        glu::glu_backward_with_unit::<B>(grad_output, gate, up, activation)
    }

    fn fused_gelu(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        activation::gelu::<B>(x)
    }

    fn fused_gelu_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        activation::gelu_backward::<B>(grad_output, x)
    }

    fn fused_sigmoid(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        activation::sigmoid::<B>(x)
    }

    fn fused_sigmoid_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        activation::sigmoid_backward::<B>(grad_output, output)
    }

    fn fused_embedding_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        indices: FusionTensor<B::FusionRuntime>,
        num_embeddings: usize,
    ) -> FusionTensor<B::FusionRuntime> {
        embedding::backward::<B>(grad_output, indices, num_embeddings)
    }

    fn fused_rope(
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        cos: FusionTensor<B::FusionRuntime>,
        sin: FusionTensor<B::FusionRuntime>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeOutput<Self> {
        rope::forward::<B>(q, k, cos, sin, layout)
    }

    fn fused_rope_backward(
        grad_q: Option<FusionTensor<B::FusionRuntime>>,
        grad_k: Option<FusionTensor<B::FusionRuntime>>,
        cos: FusionTensor<B::FusionRuntime>,
        sin: FusionTensor<B::FusionRuntime>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeGrads<Self> {
        rope::backward::<B>(grad_q, grad_k, cos, sin, layout)
    }

    fn fused_cross_entropy(
        logits: FusionTensor<B::FusionRuntime>,
        targets: FusionTensor<B::FusionRuntime>,
        class_weight: Option<FusionTensor<B::FusionRuntime>>,
        grad_scale: Option<FusionTensor<B::FusionRuntime>>,
        z_loss_scale: Option<FusionTensor<B::FusionRuntime>>,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::CrossEntropyRows<Self> {
        cross_entropy::forward::<B>(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        )
    }

    fn fused_distill_rows(
        student: FusionTensor<B::FusionRuntime>,
        teacher: FusionTensor<B::FusionRuntime>,
        targets: FusionTensor<B::FusionRuntime>,
        grad_scale: Option<FusionTensor<B::FusionRuntime>>,
        options: crate::ops::DistillOptions,
    ) -> crate::ops::DistillRows<Self> {
        distill_rows::forward::<B>(student, teacher, targets, grad_scale, options)
    }

    fn submit_queued(device: &B::Device) {
        // The stream's thread runs what is queued, then submits the inner backend's queue.
        let inner = device.clone();
        burn_fusion::get_client::<B>(device).sync(move || B::submit_queued(&inner));
    }

    fn hand_off_queued(device: &B::Device) {
        // The stream's thread takes the operations queued so far; a fused operation hands
        // the inner backend's queue on when it runs there (`custom_op`).
        burn_fusion::get_client::<B>(device).flush_queue();
    }

    fn start_read(tensor: FusionTensor<B::FusionRuntime>) -> crate::ops::PendingRead {
        // The stream runs what produces the tensor, then `B` queues the copy.
        let client = tensor.client.clone();
        B::start_read(client.resolve_tensor_float::<B>(tensor))
    }

    fn fused_cross_entropy_backward(
        grad: FusionTensor<B::FusionRuntime>,
        grad_rows: FusionTensor<B::FusionRuntime>,
        grad_scale: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        cross_entropy::backward::<B>(grad, grad_rows, grad_scale)
    }

    fn fused_target_stats(
        targets: FusionTensor<B::FusionRuntime>,
        class_weight: Option<FusionTensor<B::FusionRuntime>>,
        vocab: usize,
        ignore_index: i64,
    ) -> crate::ops::TargetStats<Self> {
        cross_entropy::target_stats::<B>(targets, class_weight, vocab, ignore_index)
    }

    fn fused_lora_linear_parts(
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        bias: Option<FusionTensor<B::FusionRuntime>>,
        adapter_x: Option<FusionTensor<B::FusionRuntime>>,
        a: FusionTensor<B::FusionRuntime>,
        b: FusionTensor<B::FusionRuntime>,
        options: crate::ops::LoraOptions,
    ) -> crate::ops::LoraLinearParts<Self> {
        lora::parts::<B>(x, weight, bias, adapter_x, a, b, options)
    }

    fn fused_lora_linear_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        adapter_input: FusionTensor<B::FusionRuntime>,
        separate: bool,
        weight: FusionTensor<B::FusionRuntime>,
        a: FusionTensor<B::FusionRuntime>,
        b: FusionTensor<B::FusionRuntime>,
        hidden: FusionTensor<B::FusionRuntime>,
        options: crate::ops::LoraOptions,
        wanted: crate::ops::LoraLinearGradsWanted,
    ) -> crate::ops::LoraLinearGrads<Self> {
        lora::backward::<B>(
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

    fn fused_matmul(
        lhs: FusionTensor<B::FusionRuntime>,
        rhs: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        matmul::matmul::<B>(lhs, rhs)
    }

    fn fused_matmul_backward(
        lhs: FusionTensor<B::FusionRuntime>,
        rhs: FusionTensor<B::FusionRuntime>,
        grad: FusionTensor<B::FusionRuntime>,
    ) -> (
        FusionTensor<B::FusionRuntime>,
        FusionTensor<B::FusionRuntime>,
    ) {
        matmul::matmul_backward::<B>(lhs, rhs, grad)
    }

    fn fused_matmul_uses_vendor_library(device: &B::Device, dtype: DType) -> bool {
        B::fused_matmul_uses_vendor_library(device, dtype)
    }

    fn fused_linear(
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        bias: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        linear::linear::<B>(x, weight, bias)
    }

    fn fused_linear_weight_backward(
        x: FusionTensor<B::FusionRuntime>,
        grad: FusionTensor<B::FusionRuntime>,
    ) -> (
        FusionTensor<B::FusionRuntime>,
        FusionTensor<B::FusionRuntime>,
    ) {
        linear::weight_backward::<B>(x, grad)
    }

    fn fused_matmul_add(
        acc: FusionTensor<B::FusionRuntime>,
        lhs: FusionTensor<B::FusionRuntime>,
        rhs: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        matmul::matmul_add::<B>(acc, lhs, rhs)
    }

    fn fused_adamw_step(
        param: FusionTensor<B::FusionRuntime>,
        grad: FusionTensor<B::FusionRuntime>,
        moments: Option<crate::ops::AdamWMoments<Self>>,
        options: crate::ops::AdamWStepOptions,
    ) -> crate::ops::AdamWStepOutput<Self> {
        adamw::step::<B>(param, grad, moments, options)
    }

    fn fused_attention(
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        v: FusionTensor<B::FusionRuntime>,
        mask: Option<FusionTensor<B::FusionRuntime>>,
        document_ids: Option<FusionTensor<B::FusionRuntime>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionOutput<Self> {
        attention::forward::<B>(q, k, v, mask, document_ids, options)
    }

    fn fused_attention_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        v: FusionTensor<B::FusionRuntime>,
        mask: Option<FusionTensor<B::FusionRuntime>>,
        document_ids: Option<FusionTensor<B::FusionRuntime>>,
        forward: Option<crate::ops::AttentionOutput<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionGrads<Self> {
        attention::backward::<B>(grad_output, q, k, v, mask, document_ids, forward, options)
    }

    fn flash_attention_variant(
        device: &B::Device,
        dtype: DType,
        head_dim: usize,
        options: &crate::ops::AttentionOptions,
    ) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
        attention::variant::<B>(device, dtype, head_dim, options)
    }
}
