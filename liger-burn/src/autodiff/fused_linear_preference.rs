//! Fused linear preference losses on `Autodiff<B>`: `B`'s chunked forward computes the
//! gradients, the stored-gradient node hands them over (see [`super::chunked_loss`]). The
//! reference model's tensors get no gradient.

use super::chunked_loss::track;
use crate::ops::{FusedOps, PreferenceOptions, PreferenceOutput, ReferenceInput};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    targets: IntTensor<B>,
    reference: ReferenceInput<Autodiff<B, C>>,
    options: PreferenceOptions,
) -> PreferenceOutput<Autodiff<B, C>> {
    let reference = reference.map(|t| t.primitive);
    track::<B, C, _>(&x, &weight, bias.as_ref(), |grad| {
        B::fused_linear_preference(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            targets,
            reference,
            grad,
            options,
        )
    })
}
