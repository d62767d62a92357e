//! The outputs of [`FusedOps::fused_linear_kto`](crate::ops::FusedOps::fused_linear_kto)
//! and [`FusedOps::fused_linear_grpo`](crate::ops::FusedOps::fused_linear_grpo).

use burn::tensor::{backend::Backend, ops::FloatTensor};

/// Output of [`FusedOps::fused_linear_kto`](crate::ops::FusedOps::fused_linear_kto); every
/// metric f32.
#[derive(Debug, Clone)]
pub struct KtoOutput<B: Backend> {
    /// The loss, `[1]`.
    pub loss: FloatTensor<B>,
    /// The policy's log-probability of each sequence, `[B]`.
    pub logps: FloatTensor<B>,
    /// `β (s_i − r_i)` per sequence, `[B]`.
    pub rewards: FloatTensor<B>,
    /// The sum of each sequence's logits over its positions and classes, `[B]`.
    pub logits_sum: FloatTensor<B>,
    /// `∂loss/∂x`, `[B, T, H]`.
    pub grad_x: Option<FloatTensor<B>>,
    /// `∂loss/∂weight`, `[V, H]` (accumulated in f32).
    pub grad_weight: Option<FloatTensor<B>>,
    /// `∂loss/∂bias`, `[V]`.
    pub grad_bias: Option<FloatTensor<B>>,
}

impl<B: Backend> KtoOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> KtoOutput<C> {
        KtoOutput {
            loss: f(self.loss),
            logps: f(self.logps),
            rewards: f(self.rewards),
            logits_sum: f(self.logits_sum),
            grad_x: self.grad_x.map(&f),
            grad_weight: self.grad_weight.map(&f),
            grad_bias: self.grad_bias.map(&f),
        }
    }
}

/// Output of [`FusedOps::fused_linear_grpo`](crate::ops::FusedOps::fused_linear_grpo); every
/// metric f32.
#[derive(Debug, Clone)]
pub struct GrpoOutput<B: Backend> {
    /// The loss, `[1]`.
    pub loss: FloatTensor<B>,
    /// The policy's log-probability of each completion token, `[B, T]` (0 outside the
    /// completion mask): the next step's old log-probabilities.
    pub per_token_logps: FloatTensor<B>,
    /// The mean k3 KL estimate over the completion tokens, `[1]` (0 when `β = 0`).
    pub kl: FloatTensor<B>,
    /// The fraction of completion tokens whose ratio was clipped in the direction of their
    /// advantage, `[1]` (TRL's `clip_ratio`).
    pub clip_ratio: FloatTensor<B>,
    /// `∂loss/∂x`, `[B, T, H]`.
    pub grad_x: Option<FloatTensor<B>>,
    /// `∂loss/∂weight`, `[V, H]` (accumulated in f32).
    pub grad_weight: Option<FloatTensor<B>>,
    /// `∂loss/∂bias`, `[V]`.
    pub grad_bias: Option<FloatTensor<B>>,
}

impl<B: Backend> GrpoOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> GrpoOutput<C> {
        GrpoOutput {
            loss: f(self.loss),
            per_token_logps: f(self.per_token_logps),
            kl: f(self.kl),
            clip_ratio: f(self.clip_ratio),
            grad_x: self.grad_x.map(&f),
            grad_weight: self.grad_weight.map(&f),
            grad_bias: self.grad_bias.map(&f),
        }
    }
}
