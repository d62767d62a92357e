//! Fused LayerNorm module.

use crate::functional;
use crate::ops::FusedOps;
use crate::ops::validate;
use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::Tensor;

/// Configuration of [`LayerNorm`] (same fields and defaults as `burn::nn::LayerNormConfig`).
#[derive(Config, Debug)]
pub struct LayerNormConfig {
    /// Size of the normalized (last) dimension.
    pub d_model: usize,
    /// Added to the variance for stability.
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// Whether the norm has a learned bias.
    #[config(default = true)]
    pub bias: bool,
}

impl LayerNormConfig {
    /// Weight ones, bias zeros.
    pub fn init<B: FusedOps>(&self, device: &B::Device) -> LayerNorm<B> {
        validate::check(validate::eps("layer_norm", self.epsilon, None));
        LayerNorm {
            gamma: Initializer::Ones.init([self.d_model], device),
            beta: self
                .bias
                .then(|| Initializer::Zeros.init([self.d_model], device)),
            epsilon: self.epsilon,
        }
    }
}

/// LayerNorm over the last dimension with the fused kernels; same record as
/// `burn::nn::LayerNorm` (`gamma`, `beta`, `epsilon`).
#[derive(Module, Debug)]
pub struct LayerNorm<B: FusedOps> {
    /// Scale, `[d_model]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift, `[d_model]`.
    pub beta: Option<Param<Tensor<B, 1>>>,
    /// Added to the variance.
    pub epsilon: f64,
}

impl<B: FusedOps> LayerNorm<B> {
    /// `x: [..., d_model]` → `[..., d_model]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        functional::layer_norm(
            x,
            self.gamma.val(),
            self.beta.as_ref().map(|b| b.val()),
            self.epsilon,
        )
    }
}
