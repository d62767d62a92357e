//! [`fused_linear_distill`]: distillation from a frozen teacher over linear heads, chunked.

use super::{TargetCheck, check_logits_dtype, prim, wrap};
use crate::ops::{DistillOptions, FusedOps, TeacherHead, validate};
use burn::tensor::{Int, Tensor, TensorMetadata};

/// Output of [`fused_linear_distill`]: every value `[1]` f32.
#[derive(Debug, Clone)]
pub struct DistillLossOutput<B: burn::tensor::backend::Backend> {
    /// `w_hard · hard_loss + w_soft · soft_loss`; its gradient reaches the student's `x`,
    /// weight and bias.
    pub loss: Tensor<B, 1>,
    /// The divergence to the teacher per non-ignored row (no gradient of its own).
    pub soft_loss: Tensor<B, 1>,
    /// The cross entropy against the targets per non-ignored row (no gradient of its own).
    pub hard_loss: Tensor<B, 1>,
}

/// Distillation of a student's linear head from a frozen teacher's, fused (Liger-Kernel's
/// `LigerFusedLinearJSDLoss`, with the divergences of [`Divergence`](crate::ops::Divergence)):
/// neither head's `[N, V]` logits exist whole (chunked over rows; see
/// [`compose::fused_linear_distill`](crate::ops::compose::fused_linear_distill)).
///
/// - `x`: `[N, H]`, the student's last hidden states (flattened `[batch · seq, H]`)
/// - `weight`: `[V, H]`, `bias`: `[V]`: the student's output head
/// - `teacher_x`: `[N, H_t]`, `teacher_weight`: `[V_t, H_t]`, `teacher_bias`: `[V_t]`: the
///   teacher's, in the same dtype, `V_t ≥ V` (a larger teacher vocabulary pads the
///   student's logits with zeros); no gradient reaches them
/// - `targets`: `[N]`, token ids in `[0, V)` or `options.ignore_index`
///
/// Panics before any work on mismatched shapes, dtypes or vocabularies and on bad
/// options, and, once the work is queued (one read of one number), on a target outside
/// `[0, V)`.
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_distill<B: FusedOps>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    teacher_x: Tensor<B, 2>,
    teacher_weight: Tensor<B, 2>,
    teacher_bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
    options: DistillOptions,
) -> DistillLossOutput<B> {
    const OP: &str = "fused_linear_distill";
    let teacher: TeacherHead<B> = TeacherHead {
        x: prim(teacher_x.detach()),
        weight: prim(teacher_weight.detach()),
        bias: teacher_bias.map(|b| prim(b.detach())),
    };
    validate::check(validate::distill(
        OP,
        &(x.shape(), x.dtype()),
        &(weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())).as_ref(),
        (
            &(teacher.x.shape(), teacher.x.dtype()),
            &(teacher.weight.shape(), teacher.weight.dtype()),
            teacher
                .bias
                .as_ref()
                .map(|b| (b.shape(), b.dtype()))
                .as_ref(),
        ),
        &(targets.shape(), targets.dtype()),
        &options,
    ));
    check_logits_dtype(OP, &x);
    let vocab = weight.dims()[0];
    let logits_shape = burn::tensor::Shape::new([x.dims()[0], vocab]);
    let check = TargetCheck::queue(&targets, vocab, options.ignore_index);
    let compute_grad = x.is_require_grad()
        || weight.is_require_grad()
        || bias.as_ref().is_some_and(|b| b.is_require_grad());
    let out = B::fused_linear_distill(
        prim(x),
        prim(weight),
        bias.map(prim),
        teacher,
        targets.into_primitive(),
        compute_grad,
        options,
    );
    check.finish(OP, &logits_shape);
    DistillLossOutput {
        loss: wrap(out.loss),
        soft_loss: wrap(out.soft_loss),
        hard_loss: wrap(out.hard_loss),
    }
}
