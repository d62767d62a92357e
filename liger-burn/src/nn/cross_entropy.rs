//! Fused cross-entropy loss module: a drop-in for `burn::nn::loss::CrossEntropyLoss`
//! (same configuration, same values) plus Liger-Kernel's options.

use crate::functional::{self, CrossEntropyOutput};
use crate::ops::compose::cross_entropy::{mask_f32, valid_rows};
use crate::ops::{CrossEntropyOptions, FusedOps, Reduction};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Bool, DType, Int, Tensor};

/// Configuration of [`CrossEntropyLoss`]: everything `burn::nn::loss::CrossEntropyLossConfig`
/// takes (same names, same meaning), plus Liger's options.
#[derive(Config, Debug)]
pub struct CrossEntropyLossConfig {
    /// Target values whose rows are left out of the loss (Burn's padding). Unlike
    /// `ignore_index` they still count in the mean's denominator, as in Burn.
    pub pad_tokens: Option<Vec<usize>>,
    /// Per-class weights `[V]` (positive).
    pub weights: Option<Vec<f32>>,
    /// Label smoothing `α` in `[0, 1]`.
    pub smoothing: Option<f32>,
    /// Whether the inputs are logits (`true`, fused) or probabilities (`false`: Burn's own
    /// stock composition, `log(p)`, since there is nothing to fuse).
    #[config(default = true)]
    pub logits: bool,
    /// Liger: target value of rows that are skipped *and* left out of the denominator
    /// (PyTorch's `ignore_index`).
    #[config(default = -100)]
    pub ignore_index: i64,
    /// Liger: z-loss scale `λ` (adds `λ · logsumexp²` per row).
    #[config(default = 0.0)]
    pub lse_square_scale: f64,
    /// Liger: logit soft-capping `c · tanh(x / c)`.
    pub softcap: Option<f64>,
    /// Liger: reduction (Burn's module always takes the mean).
    #[config(default = "Reduction::Mean")]
    pub reduction: Reduction,
    /// Liger: check eagerly that targets are in range (one small host read per call).
    #[config(default = true)]
    pub check_targets: bool,
}

impl CrossEntropyLossConfig {
    /// Builds the module (`weights` become a `[V]` tensor on `device`).
    pub fn init<B: FusedOps>(&self, device: &B::Device) -> CrossEntropyLoss<B> {
        if let Some(alpha) = self.smoothing {
            assert!(
                (0.0..=1.0).contains(&alpha),
                "cross_entropy: smoothing must be in [0, 1], got {alpha}"
            );
        }
        if let Some(weights) = &self.weights {
            assert!(
                weights.iter().all(|w| *w > 0.0),
                "cross_entropy: weights must be positive, got {weights:?}"
            );
        }
        if !self.logits {
            assert!(
                self.lse_square_scale == 0.0
                    && self.softcap.is_none()
                    && self.reduction == Reduction::Mean,
                "cross_entropy: with logits = false (probability inputs) only Burn's options are supported (no z-loss, softcap or reduction other than mean)"
            );
        }
        CrossEntropyLoss {
            pad_tokens: self.pad_tokens.clone(),
            weights: self
                .weights
                .as_ref()
                .map(|w| Tensor::<B, 1>::from_floats(w.as_slice(), device)),
            smoothing: self.smoothing,
            logits: self.logits,
            ignore_index: self.ignore_index,
            lse_square_scale: self.lse_square_scale,
            softcap: self.softcap,
            reduction: self.reduction,
            check_targets: self.check_targets,
        }
    }
}

/// Cross-entropy loss on logits with the fused kernel.
///
/// With Burn's options it returns the same values as `burn::nn::loss::CrossEntropyLoss`,
/// including its denominators, which differ from PyTorch's: the mean divides by the
/// number of rows *including* pad rows, or, with weights, by `Σ w[y_i]` over all rows
/// (pads included; a pad token outside `[0, V)` contributes 0). Rows whose target is
/// `ignore_index` are excluded from both the loss and the denominator (PyTorch's
/// semantics). The denominator only enters the device-side gradient scale, so the
/// backward stays free.
#[derive(Module, Debug)]
pub struct CrossEntropyLoss<B: FusedOps> {
    /// Pad tokens left out of the loss (but counted in the mean).
    pub pad_tokens: Option<Vec<usize>>,
    /// Per-class weights, `[V]`.
    pub weights: Option<Tensor<B, 1>>,
    /// Label smoothing.
    pub smoothing: Option<f32>,
    /// Logits (`true`) or probabilities (`false`) as input.
    pub logits: bool,
    /// Rows with this target are skipped and not counted.
    #[module(skip)]
    pub ignore_index: i64,
    /// z-loss scale.
    #[module(skip)]
    pub lse_square_scale: f64,
    /// Logit soft-capping.
    #[module(skip)]
    pub softcap: Option<f64>,
    /// Reduction.
    #[module(skip)]
    pub reduction: Reduction,
    /// Eager target check.
    #[module(skip)]
    pub check_targets: bool,
}

impl<B: FusedOps> CrossEntropyLoss<B> {
    /// The loss. `logits: [N, V]`, `targets: [N]` → `[1]` (mean, sum) or `[N]` (none).
    pub fn forward(&self, logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        self.forward_output(logits, targets, false).loss
    }

    /// The loss and its z-loss part (reduced the same way; no gradient of its own).
    pub fn forward_with_z_loss(
        &self,
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 1>, Tensor<B, 1>) {
        let out = self.forward_output(logits, targets, true);
        (out.loss, out.z_loss.expect("z-loss was asked for"))
    }

    /// The functional options this module applies (the pad tokens and Burn's
    /// denominators are handled by [`forward`](Self::forward)).
    pub fn options(&self) -> CrossEntropyOptions {
        CrossEntropyOptions {
            ignore_index: self.ignore_index,
            label_smoothing: self.smoothing.map_or(0.0, f64::from),
            lse_square_scale: self.lse_square_scale,
            return_z_loss: false,
            softcap: self.softcap,
            reduction: self.reduction,
            check_targets: self.check_targets,
            ..Default::default()
        }
    }

    fn forward_output(
        &self,
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
        return_z_loss: bool,
    ) -> CrossEntropyOutput<B> {
        let [n, v] = logits.dims();
        assert!(
            targets.dims()[0] == n,
            "cross_entropy: targets must have shape [{n}] to match logits {:?}, got {:?}",
            logits.shape(),
            targets.shape()
        );
        if !self.logits {
            assert!(
                !return_z_loss,
                "cross_entropy: no z-loss with logits = false (probability inputs)"
            );
            // Probabilities: Burn's own composition (the fused kernel works on logits).
            let stock = burn::nn::loss::CrossEntropyLoss {
                pad_tokens: self.pad_tokens.clone(),
                weights: self.weights.clone(),
                smoothing: self.smoothing,
                logits: false,
            };
            return CrossEntropyOutput {
                loss: stock.forward(logits, targets),
                z_loss: None,
            };
        }
        let mut options = self.options();
        options.return_z_loss = return_z_loss;
        // Pad rows become ignored rows for the kernel ...
        let pad = self.pad_mask(&targets);
        let kernel_targets = match &pad {
            Some(mask) => targets.clone().mask_fill(mask.clone(), self.ignore_index),
            None => targets.clone(),
        };
        // ... but, as in Burn, still count in the mean's denominator.
        let denominator = (self.reduction == Reduction::Mean && pad.is_some()).then(|| {
            let counted = targets.clone().not_equal_elem(self.ignore_index);
            match &self.weights {
                Some(w) => {
                    let in_range = valid_rows(targets.clone(), v, self.ignore_index);
                    let safe = targets.clone().mask_fill(in_range.clone().bool_not(), 0);
                    let w_y = w.clone().cast(DType::F32).gather(0, safe);
                    (w_y * mask_f32(counted.bool_and(in_range))).sum()
                }
                None => mask_f32(counted).sum(),
            }
        });
        functional::cross_entropy_with_denominator(
            logits,
            kernel_targets,
            self.weights.clone(),
            options,
            denominator,
        )
    }

    /// Rows whose target is one of the pad tokens.
    fn pad_mask(&self, targets: &Tensor<B, 1, Int>) -> Option<Tensor<B, 1, Bool>> {
        let pads = self.pad_tokens.as_ref().filter(|p| !p.is_empty())?;
        let mut mask = targets.clone().equal_elem(pads[0] as i64);
        for &p in &pads[1..] {
            mask = mask.bool_or(targets.clone().equal_elem(p as i64));
        }
        Some(mask)
    }
}
