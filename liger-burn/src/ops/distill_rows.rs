//! The tensors of [`FusedOps::fused_distill_rows`](crate::ops::FusedOps::fused_distill_rows).

use burn::tensor::{backend::Backend, ops::FloatTensor};

/// Output of [`FusedOps::fused_distill_rows`](crate::ops::FusedOps::fused_distill_rows).
#[derive(Debug, Clone)]
pub struct DistillRows<B: Backend> {
    /// Each row's divergence to the teacher, `[m]` f32 (0 on ignored rows).
    pub soft_loss: FloatTensor<B>,
    /// Each row's cross entropy against its target, `[m]` f32 (0 on ignored rows).
    pub hard_loss: FloatTensor<B>,
    /// `∂(σ Σ_i (w_soft soft_i + w_hard hard_i))/∂student`, `[m, V]`, dtype of the student's
    /// logits, when a scale `σ` was given.
    pub grad_logits: Option<FloatTensor<B>>,
}

impl<B: Backend> DistillRows<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> DistillRows<C> {
        DistillRows {
            soft_loss: f(self.soft_loss),
            hard_loss: f(self.hard_loss),
            grad_logits: self.grad_logits.map(&f),
        }
    }
}
