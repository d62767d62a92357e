//! Fused linear distillation on `Autodiff<B>`: `B`'s chunked forward computes the
//! gradients, the stored-gradient node hands them over (see [`super::chunked_loss`]). The
//! teacher gets no gradient.

use super::chunked_loss::track;
use crate::ops::{DistillOptions, DistillOutput, FusedOps, TeacherHead};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    teacher: TeacherHead<Autodiff<B, C>>,
    targets: IntTensor<B>,
    options: DistillOptions,
) -> DistillOutput<Autodiff<B, C>> {
    let teacher = teacher.map(|t| t.primitive);
    track::<B, C, _>(&x, &weight, bias.as_ref(), |grad| {
        B::fused_linear_distill(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            teacher,
            targets,
            grad,
            options,
        )
    })
}
