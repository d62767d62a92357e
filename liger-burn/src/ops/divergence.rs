//! The tensors of [`FusedOps::fused_divergence`](crate::ops::FusedOps::fused_divergence).

use burn::tensor::{backend::Backend, ops::FloatTensor};

/// Output of [`FusedOps::fused_divergence`](crate::ops::FusedOps::fused_divergence).
#[derive(Debug, Clone)]
pub struct DivergenceOutput<B: Backend> {
    /// The reduced loss, `[1]`, or the elementwise values, `[N, V]`, f32.
    pub loss: FloatTensor<B>,
    /// `∂loss/∂input` for an upstream gradient of 1 (elementwise under no reduction),
    /// `[N, V]`, dtype of the input, when asked for.
    pub grad: Option<FloatTensor<B>>,
}

impl<B: Backend> DivergenceOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(
        self,
        f: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
    ) -> DivergenceOutput<C> {
        DivergenceOutput {
            loss: f(self.loss),
            grad: self.grad.map(&f),
        }
    }
}
