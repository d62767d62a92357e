//! Fused RMSNorm module.

use crate::functional;
use crate::ops::validate;
use crate::ops::{FusedOps, RmsNormCasting, RmsNormOptions};
use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::Tensor;

/// Configuration of [`RmsNorm`].
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// Size of the normalized (last) dimension.
    pub d_model: usize,
    /// Added to the mean square for stability.
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// Added to the weight (`1.0` for Gemma's `1 + w`).
    #[config(default = 0.0)]
    pub offset: f64,
    /// Rounding convention for half-precision inputs.
    #[config(default = "RmsNormCasting::Llama")]
    pub casting: RmsNormCasting,
}

impl RmsNormConfig {
    /// Initializes the weight to ones (zeros with an offset of one, as Gemma does).
    pub fn init<B: FusedOps>(&self, device: &B::Device) -> RmsNorm<B> {
        validate::check(validate::eps("rms_norm", self.epsilon, None));
        let init = if self.offset == 0.0 {
            Initializer::Ones
        } else {
            Initializer::Constant {
                value: 1.0 - self.offset,
            }
        };
        RmsNorm {
            gamma: init.init([self.d_model], device),
            epsilon: self.epsilon,
            offset: self.offset,
            casting: self.casting,
        }
    }
}

/// RMSNorm over the last dimension with the fused kernels.
///
/// Same record as `burn::nn::RmsNorm` (`gamma`, `epsilon`); `offset` and `casting` are
/// configuration, not state.
#[derive(Module, Debug)]
pub struct RmsNorm<B: FusedOps> {
    /// Scale, `[d_model]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Added to the mean square.
    pub epsilon: f64,
    /// Added to the weight.
    #[module(skip)]
    pub offset: f64,
    /// Rounding convention.
    #[module(skip)]
    pub casting: RmsNormCasting,
}

impl<B: FusedOps> RmsNorm<B> {
    /// The options this module applies.
    pub fn options(&self) -> RmsNormOptions {
        RmsNormOptions {
            eps: self.epsilon,
            offset: self.offset,
            casting: self.casting,
        }
    }

    /// `x: [..., d_model]` → `[..., d_model]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        functional::rms_norm(x, self.gamma.val(), self.options())
    }

    /// Residual add then norm: `x, residual: [..., d_model]` → `(norm(x + residual), x + residual)`.
    pub fn forward_add<const D: usize>(
        &self,
        x: Tensor<B, D>,
        residual: Tensor<B, D>,
    ) -> (Tensor<B, D>, Tensor<B, D>) {
        functional::fused_add_rms_norm(x, residual, self.gamma.val(), self.options())
    }
}
