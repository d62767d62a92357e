//! The tensors of [`FusedOps::fused_linear_preference`](crate::ops::FusedOps::fused_linear_preference).

use burn::tensor::{backend::Backend, ops::FloatTensor};

/// Where a loss gets the reference model's log-probabilities (DPO, KTO, GRPO).
#[derive(Debug, Clone)]
pub enum ReferenceInput<B: Backend> {
    /// No reference model: its log-probabilities count as 0 (DPO, KTO: Liger-Kernel's
    /// rule) or as the policy's own (GRPO: no KL penalty).
    None,
    /// Given, f32: per sequence for the preference losses (`[2B]`, chosen first, computed
    /// with the same `average_log_prob`) and KTO (`[B]`); per token for GRPO (`[B, T]`).
    LogProbs(FloatTensor<B>),
    /// Computed chunk by chunk from a frozen reference head, without gradients:
    /// `x: [S, T, H_ref]` (the reference model's last hidden states over the policy's
    /// sequences), `weight: [V, H_ref]`, `bias: [V]`, in the policy's dtype.
    Model {
        /// `[2B, T, H_ref]`.
        x: FloatTensor<B>,
        /// `[V, H_ref]`.
        weight: FloatTensor<B>,
        /// `[V]`.
        bias: Option<FloatTensor<B>>,
    },
}

impl<B: Backend> ReferenceInput<B> {
    /// The same reference as tensors of another backend.
    pub fn map<C: Backend>(
        self,
        f: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
    ) -> ReferenceInput<C> {
        match self {
            ReferenceInput::None => ReferenceInput::None,
            ReferenceInput::LogProbs(l) => ReferenceInput::LogProbs(f(l)),
            ReferenceInput::Model { x, weight, bias } => ReferenceInput::Model {
                x: f(x),
                weight: f(weight),
                bias: bias.map(&f),
            },
        }
    }
}

/// Output of [`FusedOps::fused_linear_preference`](crate::ops::FusedOps::fused_linear_preference):
/// the loss, TRL's metrics, and the gradients when asked for. Every metric is f32.
#[derive(Debug, Clone)]
pub struct PreferenceOutput<B: Backend> {
    /// The loss, `[1]`.
    pub loss: FloatTensor<B>,
    /// The policy's log-probability of each chosen sequence, `[B]`.
    pub chosen_logps: FloatTensor<B>,
    /// The policy's log-probability of each rejected sequence, `[B]`.
    pub rejected_logps: FloatTensor<B>,
    /// TRL's `rewards/chosen` per pair, `[B]` (see [`PreferenceLoss`](crate::ops::PreferenceLoss)).
    pub chosen_rewards: FloatTensor<B>,
    /// TRL's `rewards/rejected` per pair, `[B]`.
    pub rejected_rewards: FloatTensor<B>,
    /// The mean of the chosen sequences' logits over every position and class, `[1]`.
    pub chosen_logits_mean: FloatTensor<B>,
    /// The mean of the rejected sequences' logits, `[1]`.
    pub rejected_logits_mean: FloatTensor<B>,
    /// The chosen sequences' NLL (mean over their non-ignored positions), `[1]`; 0 without
    /// [`compute_nll_loss`](crate::ops::PreferenceOptions::compute_nll_loss).
    pub nll_loss: FloatTensor<B>,
    /// ORPO's `log_odds_ratio`, the mean of `log σ(log-odds difference)`, `[1]`.
    pub log_odds_ratio: Option<FloatTensor<B>>,
    /// ORPO's `log_odds_chosen`, the mean log-odds difference, `[1]`.
    pub log_odds_chosen: Option<FloatTensor<B>>,
    /// `∂loss/∂x`, `[2B, T, H]`, dtype of `x`.
    pub grad_x: Option<FloatTensor<B>>,
    /// `∂loss/∂weight`, `[V, H]`, dtype of the weight (accumulated in f32).
    pub grad_weight: Option<FloatTensor<B>>,
    /// `∂loss/∂bias`, `[V]`, when there is a bias.
    pub grad_bias: Option<FloatTensor<B>>,
}

impl<B: Backend> PreferenceOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(
        self,
        f: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
    ) -> PreferenceOutput<C> {
        PreferenceOutput {
            loss: f(self.loss),
            chosen_logps: f(self.chosen_logps),
            rejected_logps: f(self.rejected_logps),
            chosen_rewards: f(self.chosen_rewards),
            rejected_rewards: f(self.rejected_rewards),
            chosen_logits_mean: f(self.chosen_logits_mean),
            rejected_logits_mean: f(self.rejected_logits_mean),
            nll_loss: f(self.nll_loss),
            log_odds_ratio: self.log_odds_ratio.map(&f),
            log_odds_chosen: self.log_odds_chosen.map(&f),
            grad_x: self.grad_x.map(&f),
            grad_weight: self.grad_weight.map(&f),
            grad_bias: self.grad_bias.map(&f),
        }
    }
}
