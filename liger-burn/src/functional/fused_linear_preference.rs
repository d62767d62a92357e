//! [`fused_linear_preference`]: DPO, ORPO, CPO and SimPO over a linear head, chunked.

use super::sequences::{check_sequences, sequence_stats};
use super::{check_logits_dtype, prim, wrap};
use crate::ops::{FusedOps, PreferenceOptions, ReferenceInput, validate};
use burn::tensor::{DType, Int, Tensor};

/// Where [`fused_linear_preference`] gets the reference model's log-probabilities.
#[derive(Debug, Clone)]
pub enum Reference<B: burn::tensor::backend::Backend> {
    /// No reference model (ORPO, CPO, SimPO; for DPO, log-probabilities of 0).
    None,
    /// Precomputed sequence log-probabilities, `[2B]` (chosen first), computed with the
    /// same `average_log_prob`.
    LogProbs(Tensor<B, 1>),
    /// A frozen reference head, run chunk by chunk without gradients: `x: [2B, T, H_ref]`,
    /// `weight: [V, H_ref]`, `bias: [V]`.
    Model {
        /// The reference model's last hidden states, `[2B, T, H_ref]`.
        x: Tensor<B, 3>,
        /// Its output head, `[V, H_ref]`.
        weight: Tensor<B, 2>,
        /// Its output bias, `[V]`.
        bias: Option<Tensor<B, 1>>,
    },
}

/// TRL's metrics of a preference batch. Every tensor is f32 and carries no gradient.
#[derive(Debug, Clone)]
pub struct PreferenceMetrics<B: burn::tensor::backend::Backend> {
    /// The policy's log-probability of each chosen sequence, `[B]`.
    pub chosen_logps: Tensor<B, 1>,
    /// The policy's log-probability of each rejected sequence, `[B]`.
    pub rejected_logps: Tensor<B, 1>,
    /// The reward of each chosen sequence, `[B]` (TRL's `rewards/chosen` is its mean).
    pub chosen_rewards: Tensor<B, 1>,
    /// The reward of each rejected sequence, `[B]`.
    pub rejected_rewards: Tensor<B, 1>,
    /// Mean chosen logit over every position and class (`logits/chosen`), `[1]`.
    pub chosen_logits_mean: Tensor<B, 1>,
    /// Mean rejected logit (`logits/rejected`), `[1]`.
    pub rejected_logits_mean: Tensor<B, 1>,
    /// The chosen sequences' NLL (`nll_loss`), `[1]` (0 without the NLL term).
    pub nll_loss: Tensor<B, 1>,
    /// ORPO's `log_odds_ratio`, `[1]`.
    pub log_odds_ratio: Option<Tensor<B, 1>>,
    /// ORPO's `log_odds_chosen`, `[1]`.
    pub log_odds_chosen: Option<Tensor<B, 1>>,
}

impl<B: burn::tensor::backend::Backend> PreferenceMetrics<B> {
    /// `chosen_rewards − rejected_rewards`, `[B]` (TRL's `rewards/margins` is its mean).
    pub fn margins(&self) -> Tensor<B, 1> {
        self.chosen_rewards.clone() - self.rejected_rewards.clone()
    }

    /// The fraction of pairs whose chosen reward exceeds the rejected one
    /// (`rewards/accuracies`), `[1]`.
    pub fn accuracy(&self) -> Tensor<B, 1> {
        self.margins()
            .greater_elem(0.0)
            .float()
            .cast(DType::F32)
            .mean()
    }

    /// TRL's scalar metrics by name (one device read): `rewards/chosen`,
    /// `rewards/rejected`, `rewards/accuracies`, `rewards/margins`, `logps/chosen`,
    /// `logps/rejected`, `logits/chosen`, `logits/rejected`, `nll_loss`, and ORPO's
    /// `log_odds_ratio` and `log_odds_chosen`.
    pub fn to_trl(&self) -> Vec<(&'static str, f64)> {
        let mut names = vec![
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
            "logits/chosen",
            "logits/rejected",
            "nll_loss",
        ];
        let mut parts = vec![
            self.chosen_rewards.clone().mean(),
            self.rejected_rewards.clone().mean(),
            self.accuracy(),
            self.margins().mean(),
            self.chosen_logps.clone().mean(),
            self.rejected_logps.clone().mean(),
            self.chosen_logits_mean.clone(),
            self.rejected_logits_mean.clone(),
            self.nll_loss.clone(),
        ];
        if let (Some(r), Some(c)) = (&self.log_odds_ratio, &self.log_odds_chosen) {
            names.extend(["log_odds_ratio", "log_odds_chosen"]);
            parts.extend([r.clone(), c.clone()]);
        }
        let values = Tensor::cat(parts, 0).cast(DType::F32).into_data();
        names.into_iter().zip(values.iter::<f64>()).collect()
    }
}

/// Output of [`fused_linear_preference`].
#[derive(Debug, Clone)]
pub struct PreferenceLossOutput<B: burn::tensor::backend::Backend> {
    /// The loss, `[1]` f32; its gradient reaches `x`, the weight and the bias.
    pub loss: Tensor<B, 1>,
    /// TRL's metrics.
    pub metrics: PreferenceMetrics<B>,
}

/// A preference loss (DPO, ORPO, CPO or SimPO, see
/// [`PreferenceOptions`](crate::ops::PreferenceOptions)) of a linear head, fused: the
/// `[2B·T, V]` logits never exist whole (chunked over pairs; see
/// [`compose::fused_linear_preference`](crate::ops::compose::fused_linear_preference)).
///
/// - `x`: `[2B, T, H]`, the policy's last hidden states of the `B` chosen sequences then
///   the `B` rejected ones (pair `i` is sequences `i` and `B + i`), aligned with `targets`
///   (shifted by the caller, as for a causal LM loss)
/// - `weight`: `[V, H]` (PyTorch's `lm_head.weight` layout), `bias`: `[V]`
/// - `targets`: `[2B, T]`, token ids in `[0, V)` or `options.ignore_index` (prompt,
///   padding)
/// - `reference`: the reference model's log-probabilities ([`Reference`])
///
/// The gradients of `x`, `weight` and `bias` (when autodiff tracks them) are computed in
/// the forward pass; the backward only scales them. The reference's tensors get no
/// gradient.
///
/// Panics before any work on mismatched shapes or dtypes (an odd number of sequences: a
/// chosen batch without its rejected half), on bad options, and, after queuing the work
/// (one read of four integers), on a target outside `[0, V)` or a sequence with no scored
/// position.
pub fn fused_linear_preference<B: FusedOps>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 2, Int>,
    reference: Reference<B>,
    options: PreferenceOptions,
) -> PreferenceLossOutput<B> {
    const OP: &str = "fused_linear_preference";
    let reference = match reference {
        Reference::None => ReferenceInput::None,
        Reference::LogProbs(l) => ReferenceInput::LogProbs(prim(l.detach())),
        Reference::Model { x, weight, bias } => ReferenceInput::Model {
            x: prim(x.detach()),
            weight: prim(weight.detach()),
            bias: bias.map(|b| prim(b.detach())),
        },
    };
    validate::check(validate::preference(
        OP,
        &(x.shape(), x.dtype()),
        &(weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())).as_ref(),
        &(targets.shape(), targets.dtype()),
        &validate::ReferenceMeta::of(&reference),
        &options,
    ));
    check_logits_dtype(OP, &x);
    let vocab = weight.dims()[0];
    let shape = targets.dims();
    let stats = sequence_stats(&targets, options.ignore_index);
    let compute_grad = x.is_require_grad()
        || weight.is_require_grad()
        || bias.as_ref().is_some_and(|b| b.is_require_grad());
    let out = B::fused_linear_preference(
        prim(x),
        prim(weight),
        bias.map(prim),
        targets.into_primitive(),
        reference,
        compute_grad,
        options,
    );
    check_sequences(OP, "targets", stats, vocab, options.ignore_index, shape);
    PreferenceLossOutput {
        loss: wrap(out.loss),
        metrics: PreferenceMetrics {
            chosen_logps: wrap(out.chosen_logps),
            rejected_logps: wrap(out.rejected_logps),
            chosen_rewards: wrap(out.chosen_rewards),
            rejected_rewards: wrap(out.rejected_rewards),
            chosen_logits_mean: wrap(out.chosen_logits_mean),
            rejected_logits_mean: wrap(out.rejected_logits_mean),
            nll_loss: wrap(out.nll_loss),
            log_odds_ratio: out.log_odds_ratio.map(wrap),
            log_odds_chosen: out.log_odds_chosen.map(wrap),
        },
    }
}
