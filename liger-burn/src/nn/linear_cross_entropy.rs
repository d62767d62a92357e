//! Fused linear cross-entropy loss module: the language-model head's matmul and the loss
//! in one chunked op, so the `[N, V]` logits never exist.

use crate::functional::{self, CrossEntropyOutput};
use crate::ops::{CrossEntropyOptions, FusedOps, Reduction, WeightGradAccumulation};
use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Int, Tensor};

/// Configuration of [`LinearCrossEntropyLoss`] (the options of
/// [`CrossEntropyOptions`], with PyTorch's and Liger's names).
#[derive(Config, Debug)]
pub struct LinearCrossEntropyLossConfig {
    /// Per-class weights `[V]`.
    pub class_weights: Option<Vec<f32>>,
    /// Rows with this target are skipped and not counted in the mean.
    #[config(default = -100)]
    pub ignore_index: i64,
    /// Label smoothing `ε` in `[0, 1]`.
    #[config(default = 0.0)]
    pub label_smoothing: f64,
    /// z-loss scale `λ`.
    #[config(default = 0.0)]
    pub lse_square_scale: f64,
    /// Logit soft-capping `c · tanh(x / c)`.
    pub softcap: Option<f64>,
    /// Reduction.
    #[config(default = "Reduction::Mean")]
    pub reduction: Reduction,
    /// Check eagerly that targets are in range (one small host read per call).
    #[config(default = true)]
    pub check_targets: bool,
    /// The dtype the head's weight gradient is summed in over the chunks (f32 by
    /// default; `WeightDtype` is Liger-Kernel's, without the f32 `[V, H]` accumulator).
    #[config(default = "WeightGradAccumulation::F32")]
    pub weight_grad_accumulation: WeightGradAccumulation,
}

impl LinearCrossEntropyLossConfig {
    /// Builds the module (class weights become a `[V]` tensor on `device`).
    pub fn init<B: FusedOps>(&self, device: &B::Device) -> LinearCrossEntropyLoss<B> {
        LinearCrossEntropyLoss {
            class_weights: self
                .class_weights
                .as_ref()
                .map(|w| Tensor::<B, 1>::from_floats(w.as_slice(), device)),
            options: CrossEntropyOptions {
                ignore_index: self.ignore_index,
                label_smoothing: self.label_smoothing,
                lse_square_scale: self.lse_square_scale,
                return_z_loss: false,
                softcap: self.softcap,
                reduction: self.reduction,
                check_targets: self.check_targets,
                weight_grad_accumulation: self.weight_grad_accumulation,
            },
        }
    }
}

/// `cross_entropy(lm_head(x), targets)` fused and chunked (see
/// [`functional::fused_linear_cross_entropy`]).
#[derive(Module, Debug)]
pub struct LinearCrossEntropyLoss<B: FusedOps> {
    /// Per-class weights, `[V]` (constants: no gradient).
    pub class_weights: Option<Tensor<B, 1>>,
    /// The loss options.
    #[module(skip)]
    pub options: CrossEntropyOptions,
}

impl<B: FusedOps> LinearCrossEntropyLoss<B> {
    /// The loss of `lm_head(x)`: `x: [N, H]`, a `burn::nn::Linear` with `d_input = H`,
    /// `d_output = V` (its weight is stored `[H, V]`), `targets: [N]` → `[1]` or `[N]`.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        lm_head: &Linear<B>,
        targets: Tensor<B, 1, Int>,
    ) -> Tensor<B, 1> {
        self.forward_weight(
            x,
            lm_head.weight.val().transpose(),
            lm_head.bias.as_ref().map(|b| b.val()),
            targets,
            false,
        )
        .loss
    }

    /// The loss (and the z-loss when `return_z_loss`) with a PyTorch-layout weight:
    /// `x: [N, H]`, `weight: [V, H]`, `bias: [V]`, `targets: [N]`.
    pub fn forward_weight(
        &self,
        x: Tensor<B, 2>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        targets: Tensor<B, 1, Int>,
        return_z_loss: bool,
    ) -> CrossEntropyOutput<B> {
        functional::fused_linear_cross_entropy(
            x,
            weight,
            bias,
            targets,
            self.class_weights.clone(),
            self.options.with_return_z_loss(return_z_loss),
        )
    }
}
