//! [`fused_linear_kto`] and [`fused_linear_grpo`]: KTO and GRPO over a linear head,
//! chunked.

use super::fused_linear_preference::Reference;
use super::sequences::{check_sequences, sequence_stats};
use super::{check_logits_dtype, prim, wrap};
use crate::ops::{FusedOps, GrpoOptions, KtoOptions, ReferenceInput, validate};
use burn::tensor::{DType, Int, Tensor};

fn reference_input<B: FusedOps>(reference: Reference<B>) -> ReferenceInput<B> {
    match reference {
        Reference::None => ReferenceInput::None,
        Reference::LogProbs(l) => ReferenceInput::LogProbs(prim(l.detach())),
        Reference::Model { x, weight, bias } => ReferenceInput::Model {
            x: prim(x.detach()),
            weight: prim(weight.detach()),
            bias: bias.map(|b| prim(b.detach())),
        },
    }
}

/// TRL's metrics of a KTO batch. Every tensor is f32 and carries no gradient.
#[derive(Debug, Clone)]
pub struct KtoMetrics<B: burn::tensor::backend::Backend> {
    /// The policy's log-probability of each sequence, `[B]`.
    pub logps: Tensor<B, 1>,
    /// `β (s_i − r_i)` per sequence, `[B]`.
    pub rewards: Tensor<B, 1>,
    /// The sum of each sequence's logits over its positions and classes, `[B]`.
    pub logits_sum: Tensor<B, 1>,
    /// 1 for the desirable sequences, 0 for the others, `[B]`.
    pub desirable: Tensor<B, 1>,
}

impl<B: burn::tensor::backend::Backend> KtoMetrics<B> {
    /// TRL's scalar metrics by name (one device read): `rewards/chosen`,
    /// `rewards/rejected`, `rewards/margins`, `logps/chosen`, `logps/rejected`,
    /// `logits/chosen`, `logits/rejected` (each over the sequences of its side; NaN for a
    /// side the batch does not have, as TRL).
    pub fn to_trl(&self) -> Vec<(&'static str, f64)> {
        let d = self.desirable.clone();
        let u = d.clone().neg() + 1.0;
        let (nd, nu) = (d.clone().sum(), u.clone().sum());
        let side = |t: &Tensor<B, 1>, m: &Tensor<B, 1>, n: &Tensor<B, 1>| {
            (t.clone() * m.clone()).sum() / n.clone()
        };
        let rc = side(&self.rewards, &d, &nd);
        let rr = side(&self.rewards, &u, &nu);
        let parts = vec![
            rc.clone(),
            rr.clone(),
            rc - rr,
            side(&self.logps, &d, &nd),
            side(&self.logps, &u, &nu),
            side(&self.logits_sum, &d, &nd),
            side(&self.logits_sum, &u, &nu),
        ];
        let names = [
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
            "logits/chosen",
            "logits/rejected",
        ];
        let values = Tensor::cat(parts, 0).cast(DType::F32).into_data();
        names.into_iter().zip(values.iter::<f64>()).collect()
    }
}

/// Output of [`fused_linear_kto`].
#[derive(Debug, Clone)]
pub struct KtoLossOutput<B: burn::tensor::backend::Backend> {
    /// The loss, `[1]` f32; its gradient reaches `x`, the weight and the bias.
    pub loss: Tensor<B, 1>,
    /// TRL's metrics.
    pub metrics: KtoMetrics<B>,
}

/// KTO (see [`KtoOptions`](crate::ops::KtoOptions)) of a linear head, fused: the logits
/// never exist whole (chunked over sequences).
///
/// - `x`: `[B, T, H]`, the policy's last hidden states of `B` completions (unpaired)
/// - `weight`: `[V, H]`, `bias`: `[V]`
/// - `targets`: `[B, T]`, token ids or `options.ignore_index` (prompt, padding)
/// - `labels`: `[B]`, 1 for a desirable completion, 0 for an undesirable one
/// - `reference`: the reference model's log-probabilities (`[B]` when given)
/// - `kl`: TRL's KL estimate `[1]` (detached; 0 when `None`)
///
/// Panics before any work on mismatched shapes or dtypes and bad options, and once the
/// work is queued on a target outside `[0, V)` or a completion with no scored position.
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_kto<B: FusedOps>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 2, Int>,
    labels: Tensor<B, 1, Int>,
    reference: Reference<B>,
    kl: Option<Tensor<B, 1>>,
    options: KtoOptions,
) -> KtoLossOutput<B> {
    const OP: &str = "fused_linear_kto";
    let reference = reference_input(reference);
    let kl = kl.map(|k| prim(k.detach()));
    validate::check(validate::kto(
        OP,
        &(x.shape(), x.dtype()),
        &(weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())).as_ref(),
        &(targets.shape(), targets.dtype()),
        &(labels.shape(), labels.dtype()),
        &validate::ReferenceMeta::of(&reference),
        kl.as_ref()
            .map(|k| {
                use burn::tensor::TensorMetadata;
                (k.shape(), k.dtype())
            })
            .as_ref(),
        &options,
    ));
    check_logits_dtype(OP, &x);
    let vocab = weight.dims()[0];
    let shape = targets.dims();
    let stats = sequence_stats(&targets, options.ignore_index);
    let desirable = labels.clone().equal_elem(1).float().cast(DType::F32);
    let compute_grad = x.is_require_grad()
        || weight.is_require_grad()
        || bias.as_ref().is_some_and(|b| b.is_require_grad());
    let out = B::fused_linear_kto(
        prim(x),
        prim(weight),
        bias.map(prim),
        targets.into_primitive(),
        labels.into_primitive(),
        reference,
        kl,
        compute_grad,
        options,
    );
    check_sequences(OP, "targets", stats, vocab, options.ignore_index, shape);
    KtoLossOutput {
        loss: wrap(out.loss),
        metrics: KtoMetrics {
            logps: wrap(out.logps),
            rewards: wrap(out.rewards),
            logits_sum: wrap(out.logits_sum),
            desirable,
        },
    }
}

/// Where [`fused_linear_grpo`] gets the reference model's per-token log-probabilities.
#[derive(Debug, Clone)]
pub enum TokenReference<B: burn::tensor::backend::Backend> {
    /// None: allowed only with `β = 0` (no KL penalty).
    None,
    /// Precomputed, `[B, T]` (at the temperature of the options).
    LogProbs(Tensor<B, 2>),
    /// A frozen reference head: `x: [B, T, H_ref]`, `weight: [V, H_ref]`, `bias: [V]`.
    Model {
        /// The reference model's last hidden states, `[B, T, H_ref]`.
        x: Tensor<B, 3>,
        /// Its output head, `[V, H_ref]`.
        weight: Tensor<B, 2>,
        /// Its output bias, `[V]`.
        bias: Option<Tensor<B, 1>>,
    },
}

/// Output of [`fused_linear_grpo`]: every metric f32 without gradient.
#[derive(Debug, Clone)]
pub struct GrpoLossOutput<B: burn::tensor::backend::Backend> {
    /// The loss, `[1]`; its gradient reaches `x`, the weight and the bias.
    pub loss: Tensor<B, 1>,
    /// The policy's log-probability of each completion token, `[B, T]` (0 outside the
    /// mask).
    pub per_token_logps: Tensor<B, 2>,
    /// The mean k3 KL to the reference over the completion tokens (TRL's `kl`), `[1]`.
    pub kl: Tensor<B, 1>,
    /// TRL's `clip_ratio`, `[1]`.
    pub clip_ratio: Tensor<B, 1>,
}

/// GRPO (see [`GrpoOptions`](crate::ops::GrpoOptions)) of a linear head, fused: the logits
/// never exist whole (chunked over sequences).
///
/// - `x`: `[B, T, H]`, the policy's last hidden states over the sampled completions
/// - `weight`: `[V, H]`, `bias`: `[V]`
/// - `completion_ids`: `[B, T]`, the sampled tokens; `completion_mask`: `[B, T]`, 1 on
///   completion tokens, 0 elsewhere (prompt, padding)
/// - `advantages`: `[B]`, one per completion
/// - `reference`: the reference model's per-token log-probabilities (needed when `β ≠ 0`)
/// - `old_logps`: `[B, T]`, the sampling policy's log-probabilities (the current ones,
///   without gradient, when `None`: one update per generation)
///
/// Panics before any work on mismatched shapes or dtypes and bad options (a `β ≠ 0`
/// without a reference), and once the work is queued on a completion token outside
/// `[0, V)` or a completion with no token.
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_grpo<B: FusedOps>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    completion_ids: Tensor<B, 2, Int>,
    completion_mask: Tensor<B, 2, Int>,
    advantages: Tensor<B, 1>,
    reference: TokenReference<B>,
    old_logps: Option<Tensor<B, 2>>,
    options: GrpoOptions,
) -> GrpoLossOutput<B> {
    use burn::tensor::TensorMetadata;
    const OP: &str = "fused_linear_grpo";
    let reference = match reference {
        TokenReference::None => ReferenceInput::None,
        TokenReference::LogProbs(l) => ReferenceInput::LogProbs(prim(l.detach())),
        TokenReference::Model { x, weight, bias } => ReferenceInput::Model {
            x: prim(x.detach()),
            weight: prim(weight.detach()),
            bias: bias.map(|b| prim(b.detach())),
        },
    };
    let old_logps = old_logps.map(|o| prim(o.detach()));
    let advantages = prim(advantages.detach());
    validate::check(validate::grpo(
        OP,
        &(x.shape(), x.dtype()),
        &(weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())).as_ref(),
        &(completion_ids.shape(), completion_ids.dtype()),
        &(completion_mask.shape(), completion_mask.dtype()),
        &(advantages.shape(), advantages.dtype()),
        &validate::ReferenceMeta::of(&reference),
        old_logps.as_ref().map(|o| (o.shape(), o.dtype())).as_ref(),
        &options,
    ));
    // At another temperature the chunks' logits reach the cross entropy in f32.
    if options.temperature == 1.0 {
        check_logits_dtype(OP, &x);
    }
    let vocab = weight.dims()[0];
    let shape = completion_ids.dims();
    // The ids outside the mask are never read: check the masked ids only.
    const OUTSIDE: i64 = -1;
    let masked_ids = completion_ids
        .clone()
        .mask_fill(completion_mask.clone().equal_elem(0), OUTSIDE);
    let stats = sequence_stats(&masked_ids, OUTSIDE);
    let compute_grad = x.is_require_grad()
        || weight.is_require_grad()
        || bias.as_ref().is_some_and(|b| b.is_require_grad());
    let out = B::fused_linear_grpo(
        prim(x),
        prim(weight),
        bias.map(prim),
        completion_ids.into_primitive(),
        completion_mask.into_primitive(),
        advantages,
        reference,
        old_logps,
        compute_grad,
        options,
    );
    check_sequences(OP, "completion_ids", stats, vocab, OUTSIDE, shape);
    GrpoLossOutput {
        loss: wrap(out.loss),
        per_token_logps: wrap(out.per_token_logps),
        kl: wrap(out.kl),
        clip_ratio: wrap(out.clip_ratio),
    }
}
