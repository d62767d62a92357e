//! Which of the model's ops run liger-burn's fused kernels, like Liger-Kernel's
//! `apply_liger_kernel_to_llama(rope=..., rms_norm=..., swiglu=..., cross_entropy=...,
//! fused_linear_cross_entropy=...)`.

use liger_burn::ops::WeightGradAccumulation;

/// Kernel switches of a model. Every switch off is the stock Burn computation.
///
/// `cross_entropy` and `fused_linear_cross_entropy` are exclusive (the fused linear cross
/// entropy already contains the cross entropy); [`LigerConfig::validate`] refuses both on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LigerConfig {
    /// Rotary position embedding of q and k.
    pub rope: bool,
    /// Every RMSNorm (the layers', the final one, and Qwen3's q/k norms).
    pub rms_norm: bool,
    /// `silu(gate) * up` in the MLP.
    pub swiglu: bool,
    /// Cross entropy over materialized logits (the loss when FLCE is off).
    pub cross_entropy: bool,
    /// LM head + cross entropy fused, chunked: the `[tokens, vocab]` logits never exist
    /// whole. Used by the loss (and per-token evaluation), not by `forward`.
    pub fused_linear_cross_entropy: bool,
    /// Attention that keeps nothing `[seq, seq]`-sized for the backward
    /// (`liger_burn::functional::attention`: the same math as eager attention, the
    /// probabilities recomputed block by block in the backward). Off: eager attention,
    /// whose saved probabilities grow with the square of the sequence. Liger-Kernel has no
    /// attention kernel (its models use PyTorch's SDPA in both modes); Burn's autodiff has
    /// only eager attention, so this switch is what lets long sequences train here.
    pub attention: bool,
    /// LoRA adapters through liger-burn's LoRA op (its node keeps each adapter's input in
    /// the activation dtype, widened again in the backward; no frozen-weight gradient) instead
    /// of the stock composition (PEFT's forward in Burn ops: autodiff keeps the widened f32
    /// input of every adapter). No effect on a model without adapters.
    pub lora: bool,
    /// Gradients that are the same bits on every run (like PyTorch's
    /// `torch.use_deterministic_algorithms`): the flash attention backward then computes dQ
    /// with its own kernel instead of summing it by atomic adds on CUDA (slower; see
    /// `liger_burn::ops::AttentionOptions::deterministic`).
    pub deterministic: bool,
    /// The dtype the fused linear cross entropy sums the LM head's weight gradient in over
    /// its chunks of tokens: `WeightDtype` (the default, Liger-Kernel's: one rounding per
    /// chunk, never more than Liger-Kernel's, and no f32 `[vocab, hidden]` accumulator
    /// beside the gradient, so the step's peak is lower at the same speed) or `F32` (one
    /// rounding in all). See `liger_burn::ops::WeightGradAccumulation`.
    pub head_grad_accumulation: WeightGradAccumulation,
    /// Whether the fused losses read the targets' range back from the device to name an
    /// out-of-range target (`liger_burn::ops::CrossEntropyOptions::check_targets`). The
    /// read waits for the forward to finish, and the GPU idles while the backward is then
    /// queued (about 3 ms of a 16K-token step on an H200). Turn it off only when the
    /// labels were checked on the host: `liger_train::train` checks every label of its
    /// dataset against the vocabulary before the first step, and turns it off.
    pub check_targets: bool,
}

impl Default for LigerConfig {
    /// Everything fused, the loss through fused linear cross entropy (Liger-Kernel's default).
    fn default() -> Self {
        Self::all()
    }
}

impl LigerConfig {
    /// Every kernel on; the loss through fused linear cross entropy (so plain cross
    /// entropy off, the two being exclusive).
    pub fn all() -> Self {
        LigerConfig {
            rope: true,
            rms_norm: true,
            swiglu: true,
            cross_entropy: false,
            fused_linear_cross_entropy: true,
            attention: true,
            lora: true,
            deterministic: false,
            head_grad_accumulation: WeightGradAccumulation::WeightDtype,
            check_targets: true,
        }
    }

    /// Every kernel off: the stock Burn computation.
    pub fn none() -> Self {
        LigerConfig {
            rope: false,
            rms_norm: false,
            swiglu: false,
            cross_entropy: false,
            fused_linear_cross_entropy: false,
            attention: false,
            lora: false,
            deterministic: false,
            head_grad_accumulation: WeightGradAccumulation::F32,
            check_targets: true,
        }
    }

    /// Only RMSNorm fused.
    pub fn rms_norm_only() -> Self {
        LigerConfig {
            rms_norm: true,
            ..Self::none()
        }
    }

    /// Whether any switch is on.
    pub fn any(&self) -> bool {
        self.rope
            || self.rms_norm
            || self.swiglu
            || self.cross_entropy
            || self.fused_linear_cross_entropy
            || self.attention
            || self.lora
    }

    /// Refuses inconsistent switches (cross entropy and fused linear cross entropy both on).
    pub fn validate(&self) -> Result<(), String> {
        if self.cross_entropy && self.fused_linear_cross_entropy {
            return Err(
                "LigerConfig: `cross_entropy` and `fused_linear_cross_entropy` are exclusive \
                 (the fused linear cross entropy computes the cross entropy itself); turn one off"
                    .into(),
            );
        }
        Ok(())
    }
}
