//! Options of the fused primitives, shared by every layer (kernels, autodiff, modules).

/// Where the RMSNorm computation is rounded back to the input dtype.
///
/// The two conventions the reference implementations use; they only differ for
/// half-precision inputs (for f32 inputs both give the same result).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum RmsNormCasting {
    /// Hugging Face Llama: `rstd` in f32, `x * rstd` cast back to the input dtype,
    /// then multiplied by the weight in the input dtype.
    #[default]
    Llama,
    /// Hugging Face Gemma: everything in f32 (`x * rstd * (offset + w)`), cast once at the end.
    Gemma,
}

/// Options of [`rms_norm`](crate::functional::rms_norm).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RmsNormOptions {
    /// Added to the mean square before the reciprocal square root.
    pub eps: f64,
    /// Added to the weight before the multiply (`0` for Llama, `1` for Gemma's `1 + w`).
    pub offset: f64,
    /// Rounding convention.
    pub casting: RmsNormCasting,
}

impl Default for RmsNormOptions {
    fn default() -> Self {
        Self::llama(1e-6)
    }
}

impl RmsNormOptions {
    /// Llama/Qwen/Mistral convention: no offset, Llama casting.
    pub fn llama(eps: f64) -> Self {
        Self {
            eps,
            offset: 0.0,
            casting: RmsNormCasting::Llama,
        }
    }
    /// Gemma convention: `1 + w`, all in f32.
    pub fn gemma(eps: f64) -> Self {
        Self {
            eps,
            offset: 1.0,
            casting: RmsNormCasting::Gemma,
        }
    }
}

/// The activation of a gated linear unit `act(gate) * up`
/// ([`swiglu`](crate::functional::swiglu), [`geglu`](crate::functional::geglu)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum GluActivation {
    /// SwiGLU (Llama, Qwen, Mistral): `silu(gate) * up`, `silu(x) = x * sigmoid(x)`.
    Silu,
    /// GeGLU (Gemma): `gelu_tanh(gate) * up` with PyTorch's `gelu(approximate="tanh")`,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

impl GluActivation {
    /// The op's name in messages and reports: `swiglu` or `geglu`.
    pub fn op_name(self) -> &'static str {
        match self {
            GluActivation::Silu => "swiglu",
            GluActivation::GeluTanh => "geglu",
        }
    }
}

/// Which elements [`rope`](crate::functional::rope) rotates together.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum RopeLayout {
    /// Hugging Face Llama/Qwen/Mistral: pairs `(j, j + d/2)`,
    /// `out = x·cos + rotate_half(x)·sin` with `rotate_half(x) = [-x[d/2..], x[..d/2]]`.
    /// Tables repeat the `d/2` frequencies: `cos[j] = cos[j + d/2]`.
    #[default]
    RotateHalf,
    /// Burn's `burn::nn::RotaryEncoding` (and the original RoFormer/Meta Llama code):
    /// pairs `(2i, 2i + 1)`, `rot(x)[2i] = -x[2i+1]`, `rot(x)[2i+1] = x[2i]`.
    /// Tables repeat each frequency for its pair: `cos[2i] = cos[2i + 1]`.
    Interleaved,
}

/// Llama 3.1 frequency scaling (`rope_scaling` with `rope_type = "llama3"` in a
/// Hugging Face config), as `transformers`' `_compute_llama3_parameters` applies it to
/// the inverse frequencies `1 / theta^(2i/d)`: wavelengths longer than
/// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, shorter
/// than `original_max_position_embeddings / high_freq_factor` are kept, and the band in
/// between is interpolated smoothly.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Llama3RopeScaling {
    /// Divisor of the low frequencies (`8` for Llama 3.1, `32` for Llama 3.2 1B/3B).
    pub factor: f64,
    /// `1` in Llama 3.1.
    pub low_freq_factor: f64,
    /// `4` in Llama 3.1.
    pub high_freq_factor: f64,
    /// Context length of pre-training (`8192` in Llama 3.1).
    pub original_max_position_embeddings: usize,
}

impl Llama3RopeScaling {
    /// Llama 3.1's values: factor 8, low 1, high 4, original context 8192.
    pub fn llama3_1() -> Self {
        Self {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    /// What is wrong with these parameters, if anything: `factor` and `low_freq_factor`
    /// must be positive and finite, `high_freq_factor` finite and above `low_freq_factor`
    /// (the interpolated band lies between the two wavelengths they set), and
    /// `original_max_position_embeddings` positive. transformers only warns about these;
    /// each of them otherwise gives infinite, NaN or misordered frequencies.
    pub fn check(&self) -> Result<(), String> {
        let Self {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: original,
        } = *self;
        if !(factor.is_finite() && factor > 0.0) {
            return Err(format!(
                "rope scaling `factor` must be positive and finite, got {factor} (Llama 3.1 uses 8, Llama 3.2 32)"
            ));
        }
        if !(low.is_finite() && low > 0.0) {
            return Err(format!(
                "rope scaling `low_freq_factor` must be positive and finite, got {low} (Llama 3 uses 1)"
            ));
        }
        if !(high.is_finite() && high > low) {
            return Err(format!(
                "rope scaling `high_freq_factor` must be finite and greater than `low_freq_factor` ({low}), got {high} (Llama 3 uses 1 and 4)"
            ));
        }
        if original == 0 {
            return Err(
                "rope scaling `original_max_position_embeddings` must be positive, got 0 (Llama 3 uses 8192)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The scaled inverse frequency for an unscaled one.
    pub fn scale(&self, inv_freq: f64) -> f64 {
        let old = self.original_max_position_embeddings as f64;
        let low_freq_wavelen = old / self.low_freq_factor;
        let high_freq_wavelen = old / self.high_freq_factor;
        let wavelen = 2.0 * core::f64::consts::PI / inv_freq;
        if wavelen > low_freq_wavelen {
            inv_freq / self.factor
        } else if wavelen < high_freq_wavelen {
            inv_freq
        } else {
            let smooth = (old / wavelen - self.low_freq_factor)
                / (self.high_freq_factor - self.low_freq_factor);
            (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        }
    }
}
/// How [`cross_entropy`](crate::functional::cross_entropy) reduces its per-row losses.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Reduction {
    /// `Σ_i ce_i / W + Σ_i zl_i / n` with `W = Σ_{non-ignored i} w[y_i]` (PyTorch's
    /// denominator; the number of non-ignored rows `n` without class weights) and `n` for
    /// the z-loss (see [`CrossEntropyOptions`]). A `[1]` tensor.
    #[default]
    Mean,
    /// `Σ_i loss_i`. A `[1]` tensor.
    Sum,
    /// The per-row losses, `[N]` (ignored rows are 0).
    None,
}

/// Options of [`cross_entropy`](crate::functional::cross_entropy) and
/// [`fused_linear_cross_entropy`](crate::functional::fused_linear_cross_entropy).
///
/// For a row `i` whose target `y` is not `ignore_index`, with logits `x` (`[V]`):
///
/// - `z = softcap.map_or(x, |c| c · tanh(x / c))` (Gemma-2 style logit soft-capping),
/// - `lse = logsumexp(z)`, `w` the class weights (all 1 without weights),
/// - `ce_i = (1-ε) w[y] (lse - z_y) + (ε/V) Σ_c w_c (lse - z_c)` (PyTorch's
///   `F.cross_entropy` with `weight` and `label_smoothing = ε`),
/// - `zl_i = λ lse²` (Liger-Kernel's z-loss, `λ = lse_square_scale`),
/// - `loss_i = ce_i + zl_i`.
///
/// Ignored rows contribute 0 loss and 0 gradient. [`Reduction::Mean`] is
/// `Σ_i ce_i / W + Σ_i zl_i / n` with `W = Σ_{non-ignored} w[y_i]` and `n` the number of
/// non-ignored rows: the z-loss is divided by `n` whatever the class weights, as
/// Liger-Kernel's `cross_entropy.py` does (its z-loss is not weighted); without weights
/// `W = n`. When every row is ignored the mean is defined as 0 with zero gradients
/// (PyTorch gives NaN), so a batch of pure padding does not poison a training run.
///
/// Targets must lie in `[0, V)` unless they equal `ignore_index`. With `check_targets`
/// (the default) every call checks that and panics naming the op, the offending value
/// and `V`; this costs one device-to-host read of one number per call (the count of bad
/// targets, from [`FusedOps::fused_target_stats`](crate::ops::FusedOps::fused_target_stats),
/// one launch that also gives the mean's denominator), which the call waits for before it
/// returns. The read is queued right after that launch, ahead of the loss's kernels
/// ([`FusedOps::start_read`](crate::ops::FusedOps::start_read)), so the device computes the
/// loss while the host waits for the count; the kernels never use an out-of-range target
/// as an index, so the panic follows no out-of-bounds access. Without the check, such rows are treated exactly like
/// ignored rows (loss 0, zero gradient, not counted in `W`).
///
/// NaN/Inf, as PyTorch (`F.cross_entropy` on `z`, z-loss with `torch.logsumexp(z)`): a row
/// holding NaN or +∞, or only −∞, has a NaN loss and a NaN gradient (log-softmax is NaN
/// there); a −∞ logit elsewhere has probability 0 and a finite gradient, and makes the loss
/// +∞ when it is the target's (or under label smoothing); the z-loss of a row with +∞ and
/// no NaN, or with only −∞, is +∞. The softcap maps ±∞ to ±`softcap`, so only NaN remains.
/// The exception: an ignored row has loss 0 and a zero gradient whatever it holds, where
/// PyTorch gives a NaN gradient for an ignored row holding NaN or +∞ (its log-softmax
/// backward multiplies NaN by the zero upstream gradient); the kernels never read ignored
/// rows.
/// The dtype in which the fused linear losses sum the weight gradient over their chunks of
/// rows (see [`CrossEntropyOptions::weight_grad_accumulation`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum WeightGradAccumulation {
    /// An f32 `[V, H]` accumulator, each chunk's f32-accumulated product added in f32 and
    /// the sum rounded once to the weight's dtype at the end: the exact sum, at `4·V·H`
    /// bytes for the accumulator beside the gradient itself.
    #[default]
    F32,
    /// The gradient itself in the weight's dtype: the first chunk's product written, each
    /// later chunk's f32-accumulated product added to it and the sum rounded to that
    /// dtype, as Liger-Kernel's `addmm` into a bf16 `grad_weight` does. One rounding per
    /// chunk instead of one in all (never more than Liger-Kernel's, whose chunks are
    /// smaller: see `compose::linear_cross_entropy::chunk_rows`), and no f32 accumulator
    /// while the loss runs (1 GiB less then at Llama-3.2-1B's `128256 × 2048` head in
    /// bf16; a training step's peak may lie elsewhere). The same as [`F32`](Self::F32)
    /// for f32 weights.
    WeightDtype,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CrossEntropyOptions {
    /// Target value of rows to skip (default `-100`, PyTorch's).
    pub ignore_index: i64,
    /// Label smoothing `ε` in `[0, 1]` (default 0).
    pub label_smoothing: f64,
    /// z-loss scale `λ`: `λ · lse²` is added to each row's loss (default 0).
    pub lse_square_scale: f64,
    /// Also return the z-loss part of the loss (reduced like the loss), for logging.
    pub return_z_loss: bool,
    /// Logit soft-capping value `c > 0` (`c · tanh(x / c)`), if any.
    pub softcap: Option<f64>,
    /// How the per-row losses are reduced (default [`Reduction::Mean`]).
    pub reduction: Reduction,
    /// Check eagerly that every target is in `[0, V)` or `ignore_index` (default true;
    /// one small host read per call, see the type docs).
    pub check_targets: bool,
    /// Fused linear cross entropy only: the dtype the LM head's weight gradient is summed
    /// in over the chunks (default [`WeightGradAccumulation::F32`]).
    #[serde(default)]
    pub weight_grad_accumulation: WeightGradAccumulation,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        Self {
            ignore_index: -100,
            label_smoothing: 0.0,
            lse_square_scale: 0.0,
            return_z_loss: false,
            softcap: None,
            reduction: Reduction::Mean,
            check_targets: true,
            weight_grad_accumulation: WeightGradAccumulation::F32,
        }
    }
}

impl CrossEntropyOptions {
    /// Sets [`weight_grad_accumulation`](Self::weight_grad_accumulation).
    pub fn with_weight_grad_accumulation(mut self, accumulation: WeightGradAccumulation) -> Self {
        self.weight_grad_accumulation = accumulation;
        self
    }
    /// Sets [`ignore_index`](Self::ignore_index).
    pub fn with_ignore_index(mut self, ignore_index: i64) -> Self {
        self.ignore_index = ignore_index;
        self
    }
    /// Sets [`label_smoothing`](Self::label_smoothing).
    pub fn with_label_smoothing(mut self, label_smoothing: f64) -> Self {
        self.label_smoothing = label_smoothing;
        self
    }
    /// Sets [`lse_square_scale`](Self::lse_square_scale) (the z-loss scale).
    pub fn with_lse_square_scale(mut self, lse_square_scale: f64) -> Self {
        self.lse_square_scale = lse_square_scale;
        self
    }
    /// Sets [`return_z_loss`](Self::return_z_loss).
    pub fn with_return_z_loss(mut self, return_z_loss: bool) -> Self {
        self.return_z_loss = return_z_loss;
        self
    }
    /// Sets [`softcap`](Self::softcap).
    pub fn with_softcap(mut self, softcap: Option<f64>) -> Self {
        self.softcap = softcap;
        self
    }
    /// Sets [`reduction`](Self::reduction).
    pub fn with_reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    /// Sets [`check_targets`](Self::check_targets).
    pub fn with_check_targets(mut self, check_targets: bool) -> Self {
        self.check_targets = check_targets;
        self
    }
}

/// Options of [`attention`](crate::functional::attention).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionOptions {
    /// Factor of the scores `q·kᵀ` (transformers: `head_dim^-0.5`).
    pub scale: f64,
    /// Query `i` sees no key after it (`j > i`, as every causal language model): enforced
    /// on top of any given mask, and the blockwise path skips the keys after each block's
    /// last query, the flash kernels every key block above the diagonal.
    pub causal: bool,
    /// Sliding window (Mistral): query `i` also does not see keys `j <= i - window`
    /// (on top of any given mask). At least 1: a window of 0 would hide every key.
    pub window: Option<usize>,
    /// Which implementation runs (see [`AttentionKernel`]).
    #[serde(default)]
    pub kernel: AttentionKernel,
    /// Gradients that are the same bits on every run. The attention backward on CUDA
    /// (cuDNN's, and the flash kernels' on sm_90+) otherwise sums the query gradient by
    /// atomic adds, as FlashAttention-2 and PyTorch's SDPA do, whose order varies between
    /// runs; deterministic runs the flash kernels with a second kernel for it instead
    /// (slower). Nothing else changes.
    #[serde(default)]
    pub deterministic: bool,
}

/// Which implementation of [`FusedOps::fused_attention`](crate::ops::FusedOps::fused_attention)
/// runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AttentionKernel {
    /// On CUDA, cuDNN's fused attention where it takes the problem (f16/bf16, head
    /// dimensions in 8s up to 128, causal or unmasked self-attention without a window or
    /// document ids; the backward not [`AttentionOptions::deterministic`]); otherwise the
    /// flash kernels on tensor cores where the backend and device have them for the dtype
    /// and head dimension (CubeCL backends with `cmma`: CUDA, and Vulkan/ROCm with
    /// cooperative matrices), else the blockwise composition of stock ops. A `[seq, seq]`
    /// mask tensor always takes the blockwise path.
    #[default]
    Auto,
    /// The blockwise composition of stock ops everywhere
    /// ([`compose::attention`](crate::ops::compose::attention)).
    Blockwise,
    /// The flash kernels on every CubeCL backend (never cuDNN): on tensor cores where the
    /// device has them, else their FMA variant (slow; for devices without cooperative matrices and for
    /// testing the kernels there). Panics where no flash kernel can run (a backend without
    /// CubeCL, a head dimension that is not a multiple of 16 up to 256, a mask tensor).
    Flash,
}

impl AttentionOptions {
    /// Causal attention of `head_dim`-wide heads, scaled by `head_dim^-0.5`.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: (head_dim as f64).powf(-0.5),
            causal: true,
            window: None,
            kernel: AttentionKernel::Auto,
            deterministic: false,
        }
    }

    /// With bitwise-reproducible gradients or not (see [`Self::deterministic`]).
    pub fn with_deterministic(self, deterministic: bool) -> Self {
        Self {
            deterministic,
            ..self
        }
    }

    /// With another implementation choice.
    pub fn with_kernel(self, kernel: AttentionKernel) -> Self {
        Self { kernel, ..self }
    }

    /// With a sliding window of `window` keys (`None`: none).
    pub fn with_window(self, window: Option<usize>) -> Self {
        Self { window, ..self }
    }
}

/// The DPO variants of Liger-Kernel's `LigerFusedLinearDPOLoss` (TRL's `DPOConfig.loss_type`),
/// as functions of the policy-to-reference log-ratios of a pair, `c = log π(y_w|x) −
/// log π_ref(y_w|x)` (chosen) and `r` (rejected), with `d = β (c − r)`, `ε` the
/// [`label_smoothing`](PreferenceOptions::label_smoothing) and `σ` the sigmoid.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DpoLossType {
    /// `−(1−ε) log σ(d) − ε log σ(−d)` (the DPO paper; TRL's conservative DPO for `ε > 0`,
    /// where Liger-Kernel ignores `ε`: the two agree at the default `ε = 0`).
    Sigmoid,
    /// `max(0, 1 − d)` (RSO's hinge).
    Hinge,
    /// `(−(1−ε) log σ(d) + ε log σ(−d)) / (1 − 2ε)`, `ε` in `[0, 0.5)` (robust DPO).
    Robust,
    /// `σ(d)(log σ(d) − log(1−ε)) + σ(−d)(log σ(−d) − log ε)`, `ε > 0` (EXO, K = 2).
    ExoPair,
    /// `−log σ(βc) − ½ log σ(−βc) − ½ log σ(−βr)` (NCA).
    NcaPair,
    /// `−log σ(βc) − log σ(−βr)` (BCO, pairwise).
    BcoPair,
    /// `(c − 1/(2β))² + (r + 1/(2β))²` (SPPO, hard probabilities).
    SppoHard,
    /// `1 − σ(βc) + σ(βr)` (APO-zero).
    ApoZero,
    /// `σ(βc) + 1 − σ(d)` (APO-down).
    ApoDown,
    /// `−log σ(d)(1 − m) + e^(−d) m` with `m = σ(d/τ)` (DiscoPOP; Liger-Kernel's default
    /// `τ = 0.05`).
    Discopop {
        /// The modulation temperature `τ > 0`.
        tau: f64,
    },
}

impl DpoLossType {
    /// Every variant (DiscoPOP at Liger-Kernel's `τ = 0.05`).
    pub const ALL: [DpoLossType; 10] = [
        DpoLossType::Sigmoid,
        DpoLossType::Hinge,
        DpoLossType::Robust,
        DpoLossType::ExoPair,
        DpoLossType::NcaPair,
        DpoLossType::BcoPair,
        DpoLossType::SppoHard,
        DpoLossType::ApoZero,
        DpoLossType::ApoDown,
        DpoLossType::Discopop { tau: 0.05 },
    ];

    /// TRL's name of the variant (`sigmoid`, `hinge`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DpoLossType::Sigmoid => "sigmoid",
            DpoLossType::Hinge => "hinge",
            DpoLossType::Robust => "robust",
            DpoLossType::ExoPair => "exo_pair",
            DpoLossType::NcaPair => "nca_pair",
            DpoLossType::BcoPair => "bco_pair",
            DpoLossType::SppoHard => "sppo_hard",
            DpoLossType::ApoZero => "apo_zero",
            DpoLossType::ApoDown => "apo_down",
            DpoLossType::Discopop { .. } => "discopop",
        }
    }

    /// The variant named `name` (TRL's names; DiscoPOP at `τ = 0.05`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Which preference loss [`fused_linear_preference`](crate::functional::fused_linear_preference)
/// computes from the sequence log-probabilities `c` (chosen) and `r` (rejected) of each pair
/// (minus the reference model's, where the loss has one), `β` its
/// [`beta`](PreferenceOptions::beta) and `ε` its
/// [`label_smoothing`](PreferenceOptions::label_smoothing). Liger-Kernel's
/// `chunked_loss` definitions.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PreferenceLoss {
    /// DPO (`LigerFusedLinearDPOLoss`), on the log-ratios to the reference model (a missing
    /// reference counts as log-probabilities 0); see [`DpoLossType`]. Rewards `β c`,
    /// `β r` of the log-ratios.
    Dpo(DpoLossType),
    /// ORPO (`LigerFusedLinearORPOLoss`): `−β log σ(log odds(c) − log odds(r))` with
    /// `log odds(p) = p − log(1 − eᵖ)`, no reference model. Rewards `β c`, `β r`.
    Orpo,
    /// CPO (`LigerFusedLinearCPOLoss`): `−(1−ε) log σ(β(c − r)) − ε log σ(−β(c − r))`, no
    /// reference model. Rewards `β c`, `β r`.
    Cpo,
    /// SimPO (`LigerFusedLinearSimPOLoss`): CPO's loss on `β(c − r) − γ`.
    Simpo {
        /// The target reward margin `γ` (Liger-Kernel's default 0.5).
        gamma: f64,
    },
}

impl PreferenceLoss {
    /// The loss's name: `dpo`, `orpo`, `cpo` or `simpo`.
    pub fn name(self) -> &'static str {
        match self {
            PreferenceLoss::Dpo(_) => "dpo",
            PreferenceLoss::Orpo => "orpo",
            PreferenceLoss::Cpo => "cpo",
            PreferenceLoss::Simpo { .. } => "simpo",
        }
    }

    /// Whether the loss compares against a reference model (DPO).
    pub fn uses_reference(self) -> bool {
        matches!(self, PreferenceLoss::Dpo(_))
    }
}

/// Options of [`fused_linear_preference`](crate::functional::fused_linear_preference).
///
/// The batch holds `B` pairs: sequences `0..B` are the chosen completions, `B..2B` the
/// rejected ones, pair `i` being sequences `i` and `B + i` (Liger-Kernel's and TRL's
/// concatenated layout). A sequence's log-probability is the sum (or, with
/// [`average_log_prob`](Self::average_log_prob), the mean) of `log softmax(h Wᵀ + b)[y_t]`
/// over its positions `t` whose target `y_t` is not [`ignore_index`](Self::ignore_index).
/// The loss is the mean of the pairs' losses plus, with
/// [`compute_nll_loss`](Self::compute_nll_loss), `α` times the cross entropy of the chosen
/// sequences (summed over their non-ignored positions, divided by their count).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreferenceOptions {
    /// The loss.
    pub loss: PreferenceLoss,
    /// `β`: the scale of the log-ratios (DPO, CPO, SimPO) or of the odds-ratio term (ORPO).
    pub beta: f64,
    /// `α`: the weight of the chosen sequences' NLL term.
    pub alpha: f64,
    /// Add `α` times the chosen sequences' NLL (ORPO, CPO and SimPO by default).
    pub compute_nll_loss: bool,
    /// `ε`: label smoothing of DPO's `sigmoid`, `robust` and `exo_pair`, of CPO and SimPO.
    pub label_smoothing: f64,
    /// Mean instead of sum of a sequence's token log-probabilities (ORPO and SimPO by
    /// default).
    pub average_log_prob: bool,
    /// Target value of positions outside the completion (prompt, padding).
    pub ignore_index: i64,
}

impl PreferenceOptions {
    /// Liger-Kernel's `LigerFusedLinearDPOLoss` defaults: `β = 0.1`, sigmoid, summed
    /// log-probabilities, no NLL term.
    pub fn dpo() -> Self {
        Self {
            loss: PreferenceLoss::Dpo(DpoLossType::Sigmoid),
            beta: 0.1,
            alpha: 1.0,
            compute_nll_loss: false,
            label_smoothing: 0.0,
            average_log_prob: false,
            ignore_index: -100,
        }
    }

    /// `LigerFusedLinearORPOLoss`'s defaults: `β = 0.1`, averaged log-probabilities, NLL
    /// term with `α = 1`.
    pub fn orpo() -> Self {
        Self {
            loss: PreferenceLoss::Orpo,
            compute_nll_loss: true,
            average_log_prob: true,
            ..Self::dpo()
        }
    }

    /// `LigerFusedLinearCPOLoss`'s defaults: `β = 0.1`, summed log-probabilities, NLL term
    /// with `α = 1`.
    pub fn cpo() -> Self {
        Self {
            loss: PreferenceLoss::Cpo,
            compute_nll_loss: true,
            ..Self::dpo()
        }
    }

    /// `LigerFusedLinearSimPOLoss`'s defaults: `β = 0.1`, `γ = 0.5`, averaged
    /// log-probabilities, NLL term with `α = 1`.
    pub fn simpo() -> Self {
        Self {
            loss: PreferenceLoss::Simpo { gamma: 0.5 },
            compute_nll_loss: true,
            average_log_prob: true,
            ..Self::dpo()
        }
    }

    /// Sets [`loss`](Self::loss).
    pub fn with_loss(self, loss: PreferenceLoss) -> Self {
        Self { loss, ..self }
    }
    /// Sets [`beta`](Self::beta).
    pub fn with_beta(self, beta: f64) -> Self {
        Self { beta, ..self }
    }
    /// Sets [`alpha`](Self::alpha).
    pub fn with_alpha(self, alpha: f64) -> Self {
        Self { alpha, ..self }
    }
    /// Sets [`compute_nll_loss`](Self::compute_nll_loss).
    pub fn with_compute_nll_loss(self, compute_nll_loss: bool) -> Self {
        Self {
            compute_nll_loss,
            ..self
        }
    }
    /// Sets [`label_smoothing`](Self::label_smoothing).
    pub fn with_label_smoothing(self, label_smoothing: f64) -> Self {
        Self {
            label_smoothing,
            ..self
        }
    }
    /// Sets [`average_log_prob`](Self::average_log_prob).
    pub fn with_average_log_prob(self, average_log_prob: bool) -> Self {
        Self {
            average_log_prob,
            ..self
        }
    }
    /// Sets [`ignore_index`](Self::ignore_index).
    pub fn with_ignore_index(self, ignore_index: i64) -> Self {
        Self {
            ignore_index,
            ..self
        }
    }

    /// What is wrong with these options, if anything (Liger-Kernel's and TRL's own checks):
    /// finite `β` (positive for SPPO, whose targets are `±1/(2β)`), finite `α`, `ε` in
    /// `[0, 0.5)` for `robust`, in `(0, 1)` for `exo_pair` and in `[0, 1]` elsewhere, a
    /// positive DiscoPOP `τ`, a finite SimPO `γ`.
    pub fn check(&self) -> Result<(), String> {
        let eps = self.label_smoothing;
        if !self.beta.is_finite() {
            return Err(format!("beta must be finite, got {}", self.beta));
        }
        if !self.alpha.is_finite() {
            return Err(format!("alpha must be finite, got {}", self.alpha));
        }
        if !(0.0..=1.0).contains(&eps) {
            return Err(format!("label_smoothing must lie in [0, 1], got {eps}"));
        }
        match self.loss {
            PreferenceLoss::Dpo(DpoLossType::Robust) if eps >= 0.5 => Err(format!(
                "label_smoothing must lie in [0, 0.5) for loss_type 'robust', got {eps}"
            )),
            PreferenceLoss::Dpo(DpoLossType::ExoPair) if !(eps > 0.0 && eps < 1.0) => Err(format!(
                "label_smoothing must lie in (0, 1) for loss_type 'exo_pair' (the EXO paper recommends 1e-3), got {eps}"
            )),
            PreferenceLoss::Dpo(DpoLossType::SppoHard) if self.beta == 0.0 => {
                Err("beta must not be 0 for loss_type 'sppo_hard' (its targets are ±1/(2β))".into())
            }
            PreferenceLoss::Dpo(DpoLossType::Discopop { tau })
                if !(tau.is_finite() && tau > 0.0) =>
            {
                Err(format!(
                    "discopop tau must be positive and finite, got {tau}"
                ))
            }
            PreferenceLoss::Simpo { gamma } if !gamma.is_finite() => {
                Err(format!("simpo gamma must be finite, got {gamma}"))
            }
            _ => Ok(()),
        }
    }
}

/// The divergence of a distillation between the teacher's distribution `P` and the
/// student's `Q` over the vocabulary (Liger-Kernel's `LigerFusedLinearJSDLoss` and
/// `LigerJSD`, `LigerKLDIVLoss`, `LigerTVDLoss`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Divergence {
    /// The generalized Jensen-Shannon divergence
    /// `β KL(P ‖ M) + (1−β) KL(Q ‖ M)`, `M = βP + (1−β)Q`, `β` in `[0, 1]`; as
    /// Liger-Kernel, `β = 0` is the forward KL `KL(P ‖ Q)` and `β = 1` the reverse KL
    /// `KL(Q ‖ P)` (the mixture formula would give 0 there).
    Jsd {
        /// `β` in `[0, 1]` (Liger-Kernel's default 0.5).
        beta: f64,
    },
    /// `KL(P ‖ Q)`, the same as `Jsd { beta: 0.0 }`.
    ForwardKl,
    /// `KL(Q ‖ P)`, the same as `Jsd { beta: 1.0 }`.
    ReverseKl,
    /// The total variation distance `½ Σ |Q − P|`.
    Tvd,
}

impl Divergence {
    /// `β` of the JSD form, or `None` for the TVD.
    pub fn jsd_beta(self) -> Option<f64> {
        match self {
            Divergence::Jsd { beta } => Some(beta),
            Divergence::ForwardKl => Some(0.0),
            Divergence::ReverseKl => Some(1.0),
            Divergence::Tvd => None,
        }
    }

    /// The divergence's name: `jsd`, `forward_kl`, `reverse_kl` or `tvd`.
    pub fn name(self) -> &'static str {
        match self {
            Divergence::Jsd { .. } => "jsd",
            Divergence::ForwardKl => "forward_kl",
            Divergence::ReverseKl => "reverse_kl",
            Divergence::Tvd => "tvd",
        }
    }
}

/// Options of [`fused_linear_distill`](crate::functional::fused_linear_distill):
/// Liger-Kernel's `LigerFusedLinearJSDLoss` generalized to [`Divergence`].
///
/// Over the `N` rows whose target is not [`ignore_index`](Self::ignore_index) (`n` of
/// them, at least 1 in the division), with student logits `s` and teacher logits `t`:
///
/// `loss = w_hard · Σ CE(s, y) / n + w_soft · Σ D(softmax(t/τ), softmax(s/τ)) / n`
///
/// (`τ` the [`temperature`](Self::temperature); the hard loss uses the unscaled student
/// logits, as Liger-Kernel; no `τ²` factor). Ignored rows add nothing to either term.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DistillOptions {
    /// The soft loss's divergence.
    pub divergence: Divergence,
    /// `τ > 0`, dividing both heads' logits in the soft loss.
    pub temperature: f64,
    /// `w_hard`: the weight of the cross entropy against the targets.
    pub weight_hard_loss: f64,
    /// `w_soft`: the weight of the divergence to the teacher.
    pub weight_soft_loss: f64,
    /// Target value of rows to skip (prompt, padding).
    pub ignore_index: i64,
}

impl Default for DistillOptions {
    /// Liger-Kernel's `LigerFusedLinearJSDLoss` defaults: JSD with `β = 0.5`, `τ = 1`,
    /// `w_hard = w_soft = 0.5`.
    fn default() -> Self {
        Self {
            divergence: Divergence::Jsd { beta: 0.5 },
            temperature: 1.0,
            weight_hard_loss: 0.5,
            weight_soft_loss: 0.5,
            ignore_index: -100,
        }
    }
}

impl DistillOptions {
    /// Sets [`divergence`](Self::divergence).
    pub fn with_divergence(self, divergence: Divergence) -> Self {
        Self { divergence, ..self }
    }
    /// Sets [`temperature`](Self::temperature).
    pub fn with_temperature(self, temperature: f64) -> Self {
        Self {
            temperature,
            ..self
        }
    }
    /// Sets the weights of the hard and the soft loss.
    pub fn with_weights(self, weight_hard_loss: f64, weight_soft_loss: f64) -> Self {
        Self {
            weight_hard_loss,
            weight_soft_loss,
            ..self
        }
    }
    /// Sets [`ignore_index`](Self::ignore_index).
    pub fn with_ignore_index(self, ignore_index: i64) -> Self {
        Self {
            ignore_index,
            ..self
        }
    }

    /// What is wrong with these options, if anything: a positive finite temperature,
    /// finite weights, a JSD `β` in `[0, 1]`.
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(format!(
                "temperature must be positive and finite, got {}",
                self.temperature
            ));
        }
        if !(self.weight_hard_loss.is_finite() && self.weight_soft_loss.is_finite()) {
            return Err(format!(
                "weight_hard_loss and weight_soft_loss must be finite, got {} and {}",
                self.weight_hard_loss, self.weight_soft_loss
            ));
        }
        if let Some(beta) = self.divergence.jsd_beta()
            && !(0.0..=1.0).contains(&beta)
        {
            return Err(format!("the JSD beta must lie in [0, 1], got {beta}"));
        }
        Ok(())
    }
}

/// How [`divergence`](crate::functional::divergence) reduces its elementwise values
/// (PyTorch's `KLDivLoss` reductions; `n` the rows whose label is not ignored, all rows
/// without labels).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum DivergenceReduction {
    /// The elementwise values, `[N, V]` (0 on ignored rows).
    None,
    /// Their sum, `[1]`.
    Sum,
    /// Their sum over `n · V`, `[1]`.
    Mean,
    /// Their sum over `n`, `[1]` (the divergence per row; PyTorch's recommended reduction
    /// and Liger-Kernel's default).
    #[default]
    BatchMean,
}

/// Options of [`divergence`](crate::functional::divergence): Liger-Kernel's `LigerJSD`,
/// `LigerKLDIVLoss` and `LigerTVDLoss` on `[N, V]` distributions.
///
/// With `X` the input (the student) and `Y` the target (the teacher), elementwise:
///
/// - [`Divergence::ForwardKl`] (PyTorch's `kl_div`): `P (log P − X)`, `X` log-probabilities,
///   `P = e^Y` with [`log_target`](Self::log_target), else `P = Y` (`log max(Y, eps)`);
/// - [`Divergence::ReverseKl`]: `Q (X − log P)`, `Q = e^X`;
/// - [`Divergence::Jsd`]: `β P (log P − log M) + (1−β) Q (X − log M)`, `M = βP + (1−β)Q`
///   (`β` 0 and 1 as the two KLs);
/// - [`Divergence::Tvd`]: `½ |X − Y|`, both probabilities (`log_target` must be false).
///
/// The gradient reaches the input only; rows whose label is `ignore_index` give 0.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DivergenceOptions {
    /// Which divergence.
    pub divergence: Divergence,
    /// The reduction.
    pub reduction: DivergenceReduction,
    /// The target holds log-probabilities (the KLs and the JSD).
    pub log_target: bool,
    /// Label of rows to skip (with labels).
    pub ignore_index: i64,
    /// The floor of a probability target under the log (`LigerKLDIVLoss`'s `eps`).
    pub eps: f64,
}

impl DivergenceOptions {
    /// `divergence` with Liger-Kernel's defaults: batch mean, a log-space target for the
    /// KLs and the JSD, `ignore_index = −100`, `eps = 1e-10`.
    pub fn new(divergence: Divergence) -> Self {
        Self {
            divergence,
            reduction: DivergenceReduction::BatchMean,
            log_target: divergence != Divergence::Tvd,
            ignore_index: -100,
            eps: 1e-10,
        }
    }
    /// Sets [`reduction`](Self::reduction).
    pub fn with_reduction(self, reduction: DivergenceReduction) -> Self {
        Self { reduction, ..self }
    }
    /// Sets [`log_target`](Self::log_target).
    pub fn with_log_target(self, log_target: bool) -> Self {
        Self { log_target, ..self }
    }
    /// Sets [`ignore_index`](Self::ignore_index).
    pub fn with_ignore_index(self, ignore_index: i64) -> Self {
        Self {
            ignore_index,
            ..self
        }
    }

    /// What is wrong with these options, if anything: a JSD `β` in `[0, 1]`, a
    /// probability-space target for the TVD, a positive `eps`.
    pub fn check(&self) -> Result<(), String> {
        if let Some(beta) = self.divergence.jsd_beta()
            && !(0.0..=1.0).contains(&beta)
        {
            return Err(format!("the JSD beta must lie in [0, 1], got {beta}"));
        }
        if self.divergence == Divergence::Tvd && self.log_target {
            return Err("the TVD compares probabilities: log_target must be false".into());
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(format!("eps must be positive and finite, got {}", self.eps));
        }
        Ok(())
    }
}

/// Options of [`fused_linear_kto`](crate::functional::fused_linear_kto): Liger-Kernel's
/// `LigerFusedLinearKTOLoss` with TRL's desirable and undesirable weights.
///
/// For sequence `i` with log-probability `s_i` (sum, or mean with
/// [`average_log_prob`](Self::average_log_prob), over its non-ignored positions), the
/// reference's `r_i` and the given KL estimate `z` (TRL's `(policy_KL_logps −
/// reference_KL_logps).mean().clamp(min=0)`, 0 when absent):
///
/// - desirable: `w_d (1 − σ(β (s_i − r_i − z)))`;
/// - undesirable: `w_u (1 − σ(β (z − s_i + r_i)))`;
///
/// summed over the batch and divided by its size `B`. Rewards `β (s_i − r_i)`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KtoOptions {
    /// `β` (Liger-Kernel's default 0.1).
    pub beta: f64,
    /// `w_d`, TRL's `desirable_weight` (default 1).
    pub desirable_weight: f64,
    /// `w_u`, TRL's `undesirable_weight` (default 1).
    pub undesirable_weight: f64,
    /// Mean instead of sum of a sequence's token log-probabilities (default false).
    pub average_log_prob: bool,
    /// Target value of positions outside the completion.
    pub ignore_index: i64,
}

impl Default for KtoOptions {
    fn default() -> Self {
        Self {
            beta: 0.1,
            desirable_weight: 1.0,
            undesirable_weight: 1.0,
            average_log_prob: false,
            ignore_index: -100,
        }
    }
}

impl KtoOptions {
    /// Sets [`beta`](Self::beta).
    pub fn with_beta(self, beta: f64) -> Self {
        Self { beta, ..self }
    }
    /// Sets the desirable and undesirable weights.
    pub fn with_weights(self, desirable_weight: f64, undesirable_weight: f64) -> Self {
        Self {
            desirable_weight,
            undesirable_weight,
            ..self
        }
    }
    /// Sets [`average_log_prob`](Self::average_log_prob).
    pub fn with_average_log_prob(self, average_log_prob: bool) -> Self {
        Self {
            average_log_prob,
            ..self
        }
    }
    /// Sets [`ignore_index`](Self::ignore_index).
    pub fn with_ignore_index(self, ignore_index: i64) -> Self {
        Self {
            ignore_index,
            ..self
        }
    }

    /// What is wrong with these options, if anything: finite `β` and weights.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("beta", self.beta),
            ("desirable_weight", self.desirable_weight),
            ("undesirable_weight", self.undesirable_weight),
        ] {
            if !v.is_finite() {
                return Err(format!("{name} must be finite, got {v}"));
            }
        }
        Ok(())
    }
}

/// How [`fused_linear_grpo`](crate::functional::fused_linear_grpo) normalizes the summed
/// per-token losses (TRL's `GRPOConfig.loss_type`, Liger-Kernel's names).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum GrpoLossType {
    /// Each sequence's mean over its completion tokens, then the mean over sequences.
    Grpo,
    /// The sum over every completion token of the batch, divided by their count.
    Bnpo,
    /// The sum divided by `B · max_completion_length` (Dr. GRPO).
    DrGrpo {
        /// The normalizer's completion length.
        max_completion_length: usize,
    },
    /// As `Bnpo` on one process (DAPO's token-level normalization; Liger-Kernel's default).
    Dapo,
}

impl GrpoLossType {
    /// TRL's name of the loss type.
    pub fn name(self) -> &'static str {
        match self {
            GrpoLossType::Grpo => "grpo",
            GrpoLossType::Bnpo => "bnpo",
            GrpoLossType::DrGrpo { .. } => "dr_grpo",
            GrpoLossType::Dapo => "dapo",
        }
    }
}

/// Options of [`fused_linear_grpo`](crate::functional::fused_linear_grpo): Liger-Kernel's
/// `LigerFusedLinearGRPOLoss` (token-level importance sampling).
///
/// Per completion token, with `ℓ = log softmax(logits / temperature)[y]`, the old policy's
/// `ℓ_old` (ℓ itself, without gradient, when not given), the advantage `A` of its sequence:
/// `c = e^(ℓ − ℓ_old)`, `loss_t = −min(c A, clip(c, 1 − ε_low, 1 + ε_high) A)
/// + β (e^(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1)` (the k3 estimate of the KL to the reference),
/// normalized by [`loss_type`](Self::loss_type).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GrpoOptions {
    /// `β`, the KL penalty's weight (Liger-Kernel's default 0.04; 0 needs no reference).
    pub beta: f64,
    /// `ε_low` (default 0.2).
    pub epsilon_low: f64,
    /// `ε_high` (default 0.2; DAPO uses 0.28).
    pub epsilon_high: f64,
    /// The normalization (default [`GrpoLossType::Dapo`]).
    pub loss_type: GrpoLossType,
    /// Divides the logits (default 1).
    pub temperature: f64,
}

impl Default for GrpoOptions {
    fn default() -> Self {
        Self {
            beta: 0.04,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            loss_type: GrpoLossType::Dapo,
            temperature: 1.0,
        }
    }
}

impl GrpoOptions {
    /// Sets [`beta`](Self::beta).
    pub fn with_beta(self, beta: f64) -> Self {
        Self { beta, ..self }
    }
    /// Sets the clipping range.
    pub fn with_epsilon(self, epsilon_low: f64, epsilon_high: f64) -> Self {
        Self {
            epsilon_low,
            epsilon_high,
            ..self
        }
    }
    /// Sets [`loss_type`](Self::loss_type).
    pub fn with_loss_type(self, loss_type: GrpoLossType) -> Self {
        Self { loss_type, ..self }
    }
    /// Sets [`temperature`](Self::temperature).
    pub fn with_temperature(self, temperature: f64) -> Self {
        Self {
            temperature,
            ..self
        }
    }

    /// What is wrong with these options, if anything: finite `β`, `ε_low` in `[0, 1]`,
    /// `ε_high ≥ 0`, a positive temperature and Dr. GRPO length.
    pub fn check(&self) -> Result<(), String> {
        if !self.beta.is_finite() {
            return Err(format!("beta must be finite, got {}", self.beta));
        }
        let high_ok = self.epsilon_high >= 0.0 && self.epsilon_high.is_finite();
        if !(0.0..=1.0).contains(&self.epsilon_low) || !high_ok {
            return Err(format!(
                "epsilon_low must lie in [0, 1] and epsilon_high be non-negative, got {} and {}",
                self.epsilon_low, self.epsilon_high
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(format!(
                "temperature must be positive and finite, got {}",
                self.temperature
            ));
        }
        if let GrpoLossType::DrGrpo {
            max_completion_length: 0,
        } = self.loss_type
        {
            return Err("dr_grpo needs a positive max_completion_length".into());
        }
        Ok(())
    }
}
