//! The tensors of [`FusedOps::fused_linear_distill`](crate::ops::FusedOps::fused_linear_distill).

use burn::tensor::{backend::Backend, ops::FloatTensor};

/// A frozen teacher's last hidden states and output head: `x: [N, H_t]`,
/// `weight: [V_t, H_t]`, `bias: [V_t]`, in the student's dtype. No gradient reaches them.
#[derive(Debug, Clone)]
pub struct TeacherHead<B: Backend> {
    /// `[N, H_t]`.
    pub x: FloatTensor<B>,
    /// `[V_t, H_t]`.
    pub weight: FloatTensor<B>,
    /// `[V_t]`.
    pub bias: Option<FloatTensor<B>>,
}

impl<B: Backend> TeacherHead<B> {
    /// The same head as tensors of another backend.
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> TeacherHead<C> {
        TeacherHead {
            x: f(self.x),
            weight: f(self.weight),
            bias: self.bias.map(&f),
        }
    }
}

/// Output of [`FusedOps::fused_linear_distill`](crate::ops::FusedOps::fused_linear_distill).
#[derive(Debug, Clone)]
pub struct DistillOutput<B: Backend> {
    /// `w_hard · hard + w_soft · soft`, `[1]` f32.
    pub loss: FloatTensor<B>,
    /// The divergence to the teacher, per non-ignored row, `[1]` f32.
    pub soft_loss: FloatTensor<B>,
    /// The cross entropy against the targets, per non-ignored row, `[1]` f32.
    pub hard_loss: FloatTensor<B>,
    /// `∂loss/∂x`, `[N, H]`, dtype of `x`.
    pub grad_x: Option<FloatTensor<B>>,
    /// `∂loss/∂weight`, `[V, H]` (accumulated in f32).
    pub grad_weight: Option<FloatTensor<B>>,
    /// `∂loss/∂bias`, `[V]`.
    pub grad_bias: Option<FloatTensor<B>>,
}

impl<B: Backend> DistillOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> DistillOutput<C> {
        DistillOutput {
            loss: f(self.loss),
            soft_loss: f(self.soft_loss),
            hard_loss: f(self.hard_loss),
            grad_x: self.grad_x.map(&f),
            grad_weight: self.grad_weight.map(&f),
            grad_bias: self.grad_bias.map(&f),
        }
    }
}
