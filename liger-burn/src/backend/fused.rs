//! `FusedOps` for `Liger<B>`: every fused primitive is `B`'s.
//!
//! This lets `liger_burn`'s functional API and modules be used with a `Liger<_>` backend too
//! (they call `FusedOps` directly, so they do not need the decorator). The output structs are
//! generic over the backend, hence the field moves.

use super::Liger;
use crate::ops::{
    AddRmsNormOutput, FusedOps, LayerNormOutput, NormGrads, RmsNormOptions, RmsNormOutput,
};
use crate::ops::{GluActivation, GluGrads};
use burn::tensor::ops::FloatTensor;

impl<B: FusedOps> FusedOps for Liger<B> {
    fn fused_dtype_supported(dtype: burn::tensor::DType) -> bool {
        B::fused_dtype_supported(dtype)
    }

    fn fused_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> RmsNormOutput<Self> {
        let RmsNormOutput { output, rstd } = B::fused_rms_norm(x, weight, options);
        RmsNormOutput { output, rstd }
    }

    fn fused_rms_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> NormGrads<Self> {
        lift_grads(B::fused_rms_norm_backward(
            grad_output,
            x,
            weight,
            rstd,
            options,
        ))
    }

    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> AddRmsNormOutput<Self> {
        let AddRmsNormOutput { output, sum, rstd } =
            B::fused_add_rms_norm(x, residual, weight, options);
        AddRmsNormOutput { output, sum, rstd }
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> LayerNormOutput<Self> {
        let LayerNormOutput { output, mean, rstd } = B::fused_layer_norm(x, gamma, beta, eps);
        LayerNormOutput { output, mean, rstd }
    }

    fn fused_layer_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        has_bias: bool,
    ) -> NormGrads<Self> {
        lift_grads(B::fused_layer_norm_backward(
            grad_output,
            x,
            gamma,
            mean,
            rstd,
            has_bias,
        ))
    }

    fn fused_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::fused_softmax(x)
    }

    fn fused_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_softmax_backward(grad_output, output)
    }

    fn fused_log_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::fused_log_softmax(x)
    }

    fn fused_log_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_log_softmax_backward(grad_output, output)
    }

    fn fused_glu(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> FloatTensor<Self> {
        B::fused_glu(gate, up, activation)
    }

    fn fused_glu_backward(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> GluGrads<Self> {
        let GluGrads { grad_gate, grad_up } =
            B::fused_glu_backward(grad_output, gate, up, activation);
        GluGrads { grad_gate, grad_up }
    }

    fn fused_glu_backward_with_unit(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> (GluGrads<Self>, FloatTensor<Self>) {
        let (GluGrads { grad_gate, grad_up }, unit) =
            B::fused_glu_backward_with_unit(grad_output, gate, up, activation);
        (GluGrads { grad_gate, grad_up }, unit)
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::fused_gelu(x)
    }

    fn fused_gelu_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_gelu_backward(grad_output, x)
    }

    fn fused_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::fused_sigmoid(x)
    }

    fn fused_sigmoid_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_sigmoid_backward(grad_output, output)
    }

    fn fused_rope(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeOutput<Self> {
        let crate::ops::RopeOutput { q, k } = B::fused_rope(q, k, cos, sin, layout);
        crate::ops::RopeOutput { q, k }
    }

    fn fused_rope_backward(
        grad_q: Option<FloatTensor<Self>>,
        grad_k: Option<FloatTensor<Self>>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeGrads<Self> {
        let crate::ops::RopeGrads { grad_q, grad_k } =
            B::fused_rope_backward(grad_q, grad_k, cos, sin, layout);
        crate::ops::RopeGrads { grad_q, grad_k }
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        grad_scale: Option<FloatTensor<Self>>,
        z_loss_scale: Option<FloatTensor<Self>>,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::CrossEntropyRows<Self> {
        let crate::ops::CrossEntropyRows {
            loss,
            z_loss,
            grad_logits,
        } = B::fused_cross_entropy(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        );
        crate::ops::CrossEntropyRows {
            loss,
            z_loss,
            grad_logits,
        }
    }

    fn submit_queued(device: &B::Device) {
        B::submit_queued(device)
    }

    fn hand_off_queued(device: &B::Device) {
        B::hand_off_queued(device)
    }

    fn start_read(tensor: FloatTensor<Self>) -> crate::ops::PendingRead {
        B::start_read(tensor)
    }

    fn fused_cross_entropy_backward(
        grad: FloatTensor<Self>,
        grad_rows: FloatTensor<Self>,
        grad_scale: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_cross_entropy_backward(grad, grad_rows, grad_scale)
    }

    fn fused_target_stats(
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        vocab: usize,
        ignore_index: i64,
    ) -> crate::ops::TargetStats<Self> {
        B::fused_target_stats(targets, class_weight, vocab, ignore_index).map(|t| t)
    }

    fn fused_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        compute_grad: bool,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::LinearCrossEntropyOutput<Self> {
        lift_lce(B::fused_linear_cross_entropy(
            x,
            weight,
            bias,
            targets,
            class_weight,
            compute_grad,
            options,
        ))
    }

    fn fused_lora_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter: Option<crate::ops::LoraHead<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        wanted: crate::ops::LinearCrossEntropyGradsWanted,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::LinearCrossEntropyOutput<Self> {
        let adapter = adapter.map(|h| crate::ops::LoraHead {
            x: h.x,
            a: h.a,
            b: h.b,
            options: h.options,
        });
        lift_lce(B::fused_lora_linear_cross_entropy(
            x,
            weight,
            bias,
            adapter,
            targets,
            class_weight,
            wanted,
            options,
        ))
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
        let crate::ops::LoraLinearOutput { output, hidden } =
            B::fused_lora_linear(x, weight, bias, adapter_x, a, b, options);
        crate::ops::LoraLinearOutput { output, hidden }
    }

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
        let crate::ops::LoraLinearGrads {
            grad_x,
            grad_adapter_x,
            grad_a,
            grad_b,
        } = B::fused_lora_linear_backward(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        );
        crate::ops::LoraLinearGrads {
            grad_x,
            grad_adapter_x,
            grad_a,
            grad_b,
        }
    }

    fn fused_linear_preference(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        reference: crate::ops::ReferenceInput<Self>,
        compute_grad: bool,
        options: crate::ops::PreferenceOptions,
    ) -> crate::ops::PreferenceOutput<Self> {
        B::fused_linear_preference(
            x,
            weight,
            bias,
            targets,
            reference.map(|t| t),
            compute_grad,
            options,
        )
        .map(|t| t)
    }

    fn fused_linear_distill(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        teacher: crate::ops::TeacherHead<Self>,
        targets: burn::tensor::ops::IntTensor<Self>,
        compute_grad: bool,
        options: crate::ops::DistillOptions,
    ) -> crate::ops::DistillOutput<Self> {
        B::fused_linear_distill(
            x,
            weight,
            bias,
            teacher.map(|t| t),
            targets,
            compute_grad,
            options,
        )
        .map(|t| t)
    }

    fn fused_distill_rows(
        student: FloatTensor<Self>,
        teacher: FloatTensor<Self>,
        targets: burn::tensor::ops::IntTensor<Self>,
        grad_scale: Option<FloatTensor<Self>>,
        options: crate::ops::DistillOptions,
    ) -> crate::ops::DistillRows<Self> {
        B::fused_distill_rows(student, teacher, targets, grad_scale, options).map(|t| t)
    }

    fn fused_divergence(
        input: FloatTensor<Self>,
        target: FloatTensor<Self>,
        labels: Option<burn::tensor::ops::IntTensor<Self>>,
        compute_grad: bool,
        options: crate::ops::DivergenceOptions,
    ) -> crate::ops::DivergenceOutput<Self> {
        B::fused_divergence(input, target, labels, compute_grad, options).map(|t| t)
    }

    fn fused_linear_kto(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: burn::tensor::ops::IntTensor<Self>,
        labels: burn::tensor::ops::IntTensor<Self>,
        reference: crate::ops::ReferenceInput<Self>,
        kl: Option<FloatTensor<Self>>,
        compute_grad: bool,
        options: crate::ops::KtoOptions,
    ) -> crate::ops::KtoOutput<Self> {
        B::fused_linear_kto(
            x,
            weight,
            bias,
            targets,
            labels,
            reference.map(|t| t),
            kl,
            compute_grad,
            options,
        )
        .map(|t| t)
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
        compute_grad: bool,
        options: crate::ops::GrpoOptions,
    ) -> crate::ops::GrpoOutput<Self> {
        B::fused_linear_grpo(
            x,
            weight,
            bias,
            completion_ids,
            completion_mask,
            advantages,
            reference.map(|t| t),
            old_logps,
            compute_grad,
            options,
        )
        .map(|t| t)
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<burn::tensor::ops::BoolTensor<Self>>,
        document_ids: Option<burn::tensor::ops::IntTensor<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionOutput<Self> {
        // B's, so that `Liger<Autodiff<_>>` reaches Autodiff's node.
        let out = B::fused_attention(q, k, v, mask, document_ids, options);
        crate::ops::AttentionOutput {
            output: out.output,
            lse: out.lse,
        }
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
        let forward = forward.map(|f| crate::ops::AttentionOutput {
            output: f.output,
            lse: f.lse,
        });
        let crate::ops::AttentionGrads {
            grad_q,
            grad_k,
            grad_v,
        } = B::fused_attention_backward(grad_output, q, k, v, mask, document_ids, forward, options);
        crate::ops::AttentionGrads {
            grad_q,
            grad_k,
            grad_v,
        }
    }

    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        // B's, so that `Liger<Autodiff<_>>` reaches Autodiff's node.
        B::fused_matmul(lhs, rhs)
    }

    fn fused_matmul_backward(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        B::fused_matmul_backward(lhs, rhs, grad)
    }

    fn fused_matmul_uses_vendor_library(
        device: &burn::tensor::ops::Device<Self>,
        dtype: burn::tensor::DType,
    ) -> bool {
        B::fused_matmul_uses_vendor_library(device, dtype)
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_linear(x, weight, bias)
    }

    fn fused_linear_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        B::fused_linear_weight_backward(x, grad)
    }

    fn fused_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<crate::ops::AdamWMoments<Self>>,
        options: crate::ops::AdamWStepOptions,
    ) -> crate::ops::AdamWStepOutput<Self> {
        B::fused_adamw_step(param, grad, moments.map(|m| m.map(|t| t)), options).map(|t| t)
    }

    fn fused_glu_linear(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        activation: GluActivation,
    ) -> FloatTensor<Self> {
        B::fused_glu_linear(gate, up, weight, activation)
    }

    fn fused_matmul_add(
        acc: FloatTensor<Self>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        B::fused_matmul_add(acc, lhs, rhs)
    }

    fn memory_release_point(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::memory_release_point(x)
    }

    fn flash_attention_variant(
        device: &Self::Device,
        dtype: burn::tensor::DType,
        head_dim: usize,
        options: &crate::ops::AttentionOptions,
    ) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
        B::flash_attention_variant(device, dtype, head_dim, options)
    }
}

fn lift_grads<B: FusedOps>(grads: NormGrads<B>) -> NormGrads<Liger<B>> {
    let NormGrads {
        grad_input,
        grad_weight,
        grad_bias,
    } = grads;
    NormGrads {
        grad_input,
        grad_weight,
        grad_bias,
    }
}

/// `B`'s linear cross entropy output as `Liger<B>`'s (the same primitives).
fn lift_lce<B: FusedOps>(
    out: crate::ops::LinearCrossEntropyOutput<B>,
) -> crate::ops::LinearCrossEntropyOutput<Liger<B>> {
    crate::ops::LinearCrossEntropyOutput {
        loss: out.loss,
        z_loss: out.z_loss,
        grad_x: out.grad_x,
        grad_weight: out.grad_weight,
        grad_bias: out.grad_bias,
        adapter: out.adapter.map(|g| crate::ops::LoraHeadGrads {
            grad_x: g.grad_x,
            grad_a: g.grad_a,
            grad_b: g.grad_b,
        }),
    }
}
