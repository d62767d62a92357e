//! [`FusedOps`] for `Autodiff<B>`: each fused primitive runs `B`'s fused forward once and
//! records a backward node that calls `B`'s fused backward, so training uses the fused
//! backward kernels too. Nodes keep exactly what the backward kernel needs (the inputs
//! and the per-row statistics, or the softmax output), never a recomputed graph.

mod activation;
mod attention;
mod chunked_loss;
mod cross_entropy;
mod divergence;
mod embedding;
mod fused_linear_distill;
mod fused_linear_preference;
mod fused_linear_rl;
mod glu;
mod layer_norm;
mod linear;
mod linear_cross_entropy;
mod lora;
mod matmul;
mod memory_release;
mod rms_norm;
mod rope;
mod softmax;

use crate::ops::{
    AddRmsNormOutput, FusedOps, LayerNormOutput, NormGrads, RmsNormOptions, RmsNormOutput,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::Ops;

/// Registers the gradients of a weighted normalization's parents (`x`, weight, bias).
pub(crate) fn register_norm_grads<B: FusedOps, const N: usize>(
    ops: &Ops<impl Sized, N>,
    grads: &mut Gradients,
    g: NormGrads<B>,
) {
    let mut values = [Some(g.grad_input), Some(g.grad_weight), g.grad_bias].into_iter();
    for parent in ops.parents.iter() {
        let value = values.next().flatten();
        if let (Some(node), Some(value)) = (parent, value) {
            grads.register::<B>(node.id, value);
        }
    }
}

impl<B: FusedOps, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
    fn fused_dtype_supported(dtype: burn::tensor::DType) -> bool {
        B::fused_dtype_supported(dtype)
    }

    fn fused_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> RmsNormOutput<Self> {
        rms_norm::rms_norm::<B, C>(x, weight, options)
    }

    fn fused_rms_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> NormGrads<Self> {
        // Second-order gradients are not provided: the result is a constant of the graph.
        let g = B::fused_rms_norm_backward(
            grad_output.primitive,
            x.primitive,
            weight.primitive,
            rstd.primitive,
            options,
        );
        NormGrads {
            grad_input: Self::from_inner(g.grad_input),
            grad_weight: Self::from_inner(g.grad_weight),
            grad_bias: g.grad_bias.map(Self::from_inner),
        }
    }

    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> AddRmsNormOutput<Self> {
        rms_norm::add_rms_norm::<B, C>(x, residual, weight, options)
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> LayerNormOutput<Self> {
        layer_norm::layer_norm::<B, C>(x, gamma, beta, eps)
    }

    fn fused_layer_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        has_bias: bool,
    ) -> NormGrads<Self> {
        let g = B::fused_layer_norm_backward(
            grad_output.primitive,
            x.primitive,
            gamma.primitive,
            mean.primitive,
            rstd.primitive,
            has_bias,
        );
        NormGrads {
            grad_input: Self::from_inner(g.grad_input),
            grad_weight: Self::from_inner(g.grad_weight),
            grad_bias: g.grad_bias.map(Self::from_inner),
        }
    }

    fn fused_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        softmax::softmax::<B, C>(x, false)
    }

    fn fused_log_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        softmax::softmax::<B, C>(x, true)
    }

    fn fused_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_softmax_backward(
            grad_output.primitive,
            output.primitive,
        ))
    }

    fn fused_log_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_log_softmax_backward(
            grad_output.primitive,
            output.primitive,
        ))
    }

    fn fused_glu(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: crate::ops::GluActivation,
    ) -> FloatTensor<Self> {
        glu::glu::<B, C>(gate, up, activation)
    }

    fn fused_glu_backward(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: crate::ops::GluActivation,
    ) -> crate::ops::GluGrads<Self> {
        glu::glu_backward::<B, C>(grad_output, gate, up, activation)
    }

    fn fused_glu_backward_with_unit(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: crate::ops::GluActivation,
    ) -> (crate::ops::GluGrads<Self>, FloatTensor<Self>) {
        // A backward's own op: B's, untracked.
        let (g, unit) = B::fused_glu_backward_with_unit(
            grad_output.primitive,
            gate.primitive,
            up.primitive,
            activation,
        );
        let grads = crate::ops::GluGrads {
            grad_gate: Self::from_inner(g.grad_gate),
            grad_up: Self::from_inner(g.grad_up),
        };
        (grads, Self::from_inner(unit))
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        activation::gelu::<B, C>(x)
    }

    fn fused_gelu_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_gelu_backward(grad_output.primitive, x.primitive))
    }

    fn fused_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
        activation::sigmoid::<B, C>(x)
    }

    fn fused_sigmoid_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_sigmoid_backward(
            grad_output.primitive,
            output.primitive,
        ))
    }

    fn fused_embedding(
        weights: FloatTensor<Self>,
        indices: burn::tensor::ops::IntTensor<Self>,
    ) -> FloatTensor<Self> {
        embedding::embedding::<B, C>(weights, indices)
    }

    fn fused_embedding_backward(
        grad_output: FloatTensor<Self>,
        indices: burn::tensor::ops::IntTensor<Self>,
        num_embeddings: usize,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_embedding_backward(
            grad_output.primitive,
            indices,
            num_embeddings,
        ))
    }

    fn fused_rope(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeOutput<Self> {
        rope::forward::<B, C>(q, k, cos, sin, layout)
    }

    fn fused_rope_backward(
        grad_q: Option<FloatTensor<Self>>,
        grad_k: Option<FloatTensor<Self>>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeGrads<Self> {
        rope::backward::<B, C>(grad_q, grad_k, cos, sin, layout)
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        grad_scale: Option<FloatTensor<Self>>,
        z_loss_scale: Option<FloatTensor<Self>>,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::CrossEntropyRows<Self> {
        cross_entropy::forward::<B, C>(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        )
    }

    fn submit_queued(device: &B::Device) {
        B::submit_queued(device)
    }

    fn hand_off_queued(device: &B::Device) {
        B::hand_off_queued(device)
    }

    fn start_read(tensor: FloatTensor<Self>) -> crate::ops::PendingRead {
        B::start_read(tensor.primitive)
    }

    /// Not tracked (nothing differentiates a backward): `B`'s on the inner tensors.
    fn fused_cross_entropy_backward(
        grad: FloatTensor<Self>,
        grad_rows: FloatTensor<Self>,
        grad_scale: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_cross_entropy_backward(
            grad.primitive,
            grad_rows.primitive,
            grad_scale.primitive,
        ))
    }

    /// Not tracked: statistics of integer targets (class weights get no gradient).
    fn fused_target_stats(
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        vocab: usize,
        ignore_index: i64,
    ) -> crate::ops::TargetStats<Self> {
        B::fused_target_stats(
            targets,
            class_weight.map(|w| w.primitive),
            vocab,
            ignore_index,
        )
        .map(Self::from_inner)
    }

    fn fused_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        _compute_grad: bool,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::LinearCrossEntropyOutput<Self> {
        // Whether gradients are computed follows the graph: exactly for the tracked inputs.
        linear_cross_entropy::forward::<B, C>(x, weight, bias, None, targets, class_weight, options)
    }

    fn fused_lora_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter: Option<crate::ops::LoraHead<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        _wanted: crate::ops::LinearCrossEntropyGradsWanted,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::LinearCrossEntropyOutput<Self> {
        // Which gradients are computed follows the graph: exactly the tracked inputs'.
        linear_cross_entropy::forward::<B, C>(
            x,
            weight,
            bias,
            adapter,
            targets,
            class_weight,
            options,
        )
    }

    fn fused_linear_preference(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        reference: crate::ops::ReferenceInput<Self>,
        _compute_grad: bool,
        options: crate::ops::PreferenceOptions,
    ) -> crate::ops::PreferenceOutput<Self> {
        // Whether gradients are computed follows the graph (a tracked x, weight or bias).
        fused_linear_preference::forward::<B, C>(x, weight, bias, targets, reference, options)
    }

    fn fused_linear_distill(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        teacher: crate::ops::TeacherHead<Self>,
        targets: burn::tensor::ops::IntTensor<Self>,
        _compute_grad: bool,
        options: crate::ops::DistillOptions,
    ) -> crate::ops::DistillOutput<Self> {
        // Whether gradients are computed follows the graph (a tracked x, weight or bias).
        fused_linear_distill::forward::<B, C>(x, weight, bias, teacher, targets, options)
    }

    fn fused_divergence(
        input: FloatTensor<Self>,
        target: FloatTensor<Self>,
        labels: Option<burn::tensor::ops::IntTensor<Self>>,
        _compute_grad: bool,
        options: crate::ops::DivergenceOptions,
    ) -> crate::ops::DivergenceOutput<Self> {
        // Whether the gradient is computed follows the graph (a tracked input).
        divergence::forward::<B, C>(input, target, labels, options)
    }

    fn fused_linear_kto(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        labels: burn::tensor::ops::IntTensor<Self>,
        reference: crate::ops::ReferenceInput<Self>,
        kl: Option<FloatTensor<Self>>,
        _compute_grad: bool,
        options: crate::ops::KtoOptions,
    ) -> crate::ops::KtoOutput<Self> {
        // Whether gradients are computed follows the graph (a tracked x, weight or bias).
        fused_linear_rl::kto::<B, C>(x, weight, bias, targets, labels, reference, kl, options)
    }

    fn fused_linear_grpo(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        completion_ids: burn::tensor::ops::IntTensor<Self>,
        completion_mask: burn::tensor::ops::IntTensor<Self>,
        advantages: FloatTensor<Self>,
        reference: crate::ops::ReferenceInput<Self>,
        old_logps: Option<FloatTensor<Self>>,
        _compute_grad: bool,
        options: crate::ops::GrpoOptions,
    ) -> crate::ops::GrpoOutput<Self> {
        fused_linear_rl::grpo::<B, C>(
            x,
            weight,
            bias,
            completion_ids,
            completion_mask,
            advantages,
            reference,
            old_logps,
            options,
        )
    }

    fn fused_lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter_x: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        options: crate::ops::LoraOptions,
    ) -> crate::ops::LoraLinearOutput<Self> {
        lora::forward::<B, C>(x, weight, bias, adapter_x, a, b, options)
    }

    /// Not tracked (nothing differentiates a backward): `B`'s on the inner tensors.
    fn fused_lora_linear_backward(
        grad_output: FloatTensor<Self>,
        adapter_input: FloatTensor<Self>,
        separate: bool,
        weight: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        hidden: FloatTensor<Self>,
        options: crate::ops::LoraOptions,
        wanted: crate::ops::LoraLinearGradsWanted,
    ) -> crate::ops::LoraLinearGrads<Self> {
        let g = B::fused_lora_linear_backward(
            grad_output.primitive,
            adapter_input.primitive,
            separate,
            weight.primitive,
            a.primitive,
            b.primitive,
            hidden.primitive,
            options,
            wanted,
        );
        crate::ops::LoraLinearGrads {
            grad_x: g.grad_x.map(Self::from_inner),
            grad_adapter_x: g.grad_adapter_x.map(Self::from_inner),
            grad_a: g.grad_a.map(Self::from_inner),
            grad_b: g.grad_b.map(Self::from_inner),
        }
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<burn::tensor::ops::BoolTensor<Self>>,
        document_ids: Option<burn::tensor::ops::IntTensor<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionOutput<Self> {
        attention::forward::<B, C>(q, k, v, mask, document_ids, options)
    }

    fn fused_attention_backward(
        grad_output: FloatTensor<Self>,
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<burn::tensor::ops::BoolTensor<Self>>,
        document_ids: Option<burn::tensor::ops::IntTensor<Self>>,
        forward: Option<crate::ops::AttentionOutput<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionGrads<Self> {
        attention::backward::<B, C>(grad_output, q, k, v, mask, document_ids, forward, options)
    }

    fn fused_glu_linear(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        activation: crate::ops::GluActivation,
    ) -> FloatTensor<Self> {
        glu::glu_linear::<B, C>(gate, up, weight, activation)
    }

    fn memory_release_point(x: FloatTensor<Self>) -> FloatTensor<Self> {
        memory_release::release_point::<B, C>(x)
    }

    fn flash_attention_variant(
        device: &Self::Device,
        dtype: burn::tensor::DType,
        head_dim: usize,
        options: &crate::ops::AttentionOptions,
    ) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
        attention::flash_variant::<B>(device, dtype, head_dim, options)
    }

    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul::forward::<B, C>(lhs, rhs)
    }

    fn fused_matmul_uses_vendor_library(device: &B::Device, dtype: burn::tensor::DType) -> bool {
        B::fused_matmul_uses_vendor_library(device, dtype)
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        linear::linear::<B, C>(x, weight, bias)
    }

    fn fused_linear_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (weight, bias) = B::fused_linear_weight_backward(x.primitive, grad.primitive);
        (Self::from_inner(weight), Self::from_inner(bias))
    }

    fn fused_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<crate::ops::AdamWMoments<Self>>,
        options: crate::ops::AdamWStepOptions,
    ) -> crate::ops::AdamWStepOutput<Self> {
        // An optimizer update is not part of the graph: B's step on the primitives, the
        // results untracked.
        B::fused_adamw_step(
            param.primitive,
            grad.primitive,
            moments.map(|m| m.map(|t| t.primitive)),
            options,
        )
        .map(Self::from_inner)
    }
}
