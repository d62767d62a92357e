//! Fused linear KTO and GRPO on `Autodiff<B>`: `B`'s chunked forward computes the
//! gradients, the stored-gradient node hands them over (see [`super::chunked_loss`]). The
//! reference, the labels, the advantages and the old log-probabilities get no gradient.

use super::chunked_loss::track;
use crate::ops::{FusedOps, GrpoOptions, GrpoOutput, KtoOptions, KtoOutput, ReferenceInput};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

#[allow(clippy::too_many_arguments)]
pub(crate) fn kto<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    targets: IntTensor<B>,
    labels: IntTensor<B>,
    reference: ReferenceInput<Autodiff<B, C>>,
    kl: Option<FloatTensor<Autodiff<B, C>>>,
    options: KtoOptions,
) -> KtoOutput<Autodiff<B, C>> {
    let reference = reference.map(|t| t.primitive);
    let kl = kl.map(|k| k.primitive);
    track::<B, C, _>(&x, &weight, bias.as_ref(), |grad| {
        B::fused_linear_kto(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            targets,
            labels,
            reference,
            kl,
            grad,
            options,
        )
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn grpo<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    completion_ids: IntTensor<B>,
    completion_mask: IntTensor<B>,
    advantages: FloatTensor<Autodiff<B, C>>,
    reference: ReferenceInput<Autodiff<B, C>>,
    old_logps: Option<FloatTensor<Autodiff<B, C>>>,
    options: GrpoOptions,
) -> GrpoOutput<Autodiff<B, C>> {
    let reference = reference.map(|t| t.primitive);
    let old_logps = old_logps.map(|o| o.primitive);
    let advantages = advantages.primitive;
    track::<B, C, _>(&x, &weight, bias.as_ref(), |grad| {
        B::fused_linear_grpo(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            completion_ids,
            completion_mask,
            advantages,
            reference,
            old_logps,
            grad,
            options,
        )
    })
}
