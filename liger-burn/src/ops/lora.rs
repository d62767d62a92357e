//! LoRA (low-rank adaptation, Hu et al. 2021) on a frozen linear layer, and on the LM head
//! inside the fused linear cross entropy: the types shared by the primitives
//! ([`FusedOps::fused_lora_linear`](super::FusedOps::fused_lora_linear),
//! [`FusedOps::fused_lora_linear_cross_entropy`](super::FusedOps::fused_lora_linear_cross_entropy)),
//! their autodiff nodes and the functional API.
//!
//! # The math
//!
//! `y = x·W + b + s·((x_a·Aᵀ)·Bᵀ)` with `W: [d_in, d_out]` (Burn's `Linear` layout) or
//! `[V, H]` (the LM head, PyTorch's layout), `A: [r, d_in]` and `B: [d_out, r]` (PEFT's
//! `lora_A.weight` and `lora_B.weight`), `x_a` the adapter's input (`x`, or `dropout(x)`),
//! and the scale `s = alpha / r` (`alpha / √r` with rsLoRA). The merged weight
//! `W + s·(B·A)ᵀ` is never built. `W` and `b` are constants: they get no gradient (a frozen
//! base); the adapters and the inputs do.
//!
//! # Precision ([`AdapterPrecision`])
//!
//! PEFT (0.21, `LoraLayer.forward` without autocast), with a bf16/f16 base and its default
//! `autocast_adapter_dtype=True`, keeps `A` and `B` in f32, casts `x` to f32, runs both
//! adapter products in f32, adds the base layer's (bf16) output to the f32 adapter output
//! in f32 and rounds the sum once to bf16. [`AdapterPrecision::F32`], the default, is that
//! computation. Its backward keeps PEFT's numbers too (the upstream gradient widened
//! exactly to f32, every adapter product in f32), with two differences that only remove
//! roundings: the input gradient of the adapter path is added to the base path's in f32
//! and rounded once (PyTorch's autograd rounds both to bf16 and adds them in bf16), and
//! the adapter's input is kept for the backward in its own dtype and widened again there
//! (PyTorch keeps the f32 copy: the same values, twice the bytes). Where the products run
//! on cuBLASLt (CUDA), the backward's base path product also joins the f32 sum unrounded,
//! and the scale multiplies a product before its one rounding: fewer roundings again,
//! never more. The forward's base output is rounded before the sum, as PEFT's: without
//! that rounding, adapter outputs below half a step of the activation dtype would reach
//! the output where PEFT loses them, and training would follow another path.
//! [`AdapterPrecision::Activation`] is what PEFT computes under `torch.autocast` (Hugging
//! Face Trainer's `bf16=True`): `A` and `B` rounded to the activation dtype, each product
//! in it (f32 accumulation), the sum in it; about ten times less matmul time on GPUs whose
//! f32 products run without tensor cores.

use burn::tensor::{DType, backend::Backend, ops::FloatTensor};

/// Where the adapter path of a LoRA layer computes (see the module docs).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum AdapterPrecision {
    /// PEFT's default: the adapter's products in f32 (the input and the upstream gradient
    /// widened exactly), the base output added in f32, one rounding to the activation
    /// dtype.
    #[default]
    F32,
    /// PEFT under autocast: `A` and `B` rounded to the activation dtype, the products in
    /// it (f32 accumulation), each result stored in it.
    Activation,
}

impl AdapterPrecision {
    /// The dtype the adapter products read and write for activations of `dtype`.
    pub fn compute_dtype(self, dtype: DType) -> DType {
        match self {
            AdapterPrecision::F32 => DType::F32,
            AdapterPrecision::Activation => dtype,
        }
    }

    /// Name on the command line and in logs (`f32`, `activation`).
    pub fn name(self) -> &'static str {
        match self {
            AdapterPrecision::F32 => "f32",
            AdapterPrecision::Activation => "activation",
        }
    }
}

/// The scale `s` of a LoRA adapter: `alpha / r`, or `alpha / √r` with rsLoRA (Kalajdzievski
/// 2023; PEFT's `use_rslora`). `rank` must be at least 1.
pub fn lora_scale(alpha: f64, rank: usize, use_rslora: bool) -> f64 {
    let r = rank as f64;
    if use_rslora {
        alpha / r.sqrt()
    } else {
        alpha / r
    }
}

/// Options of a LoRA adapter's computation.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraOptions {
    /// `s`, multiplying the adapter's output (see [`lora_scale`]).
    pub scale: f64,
    /// Where the adapter path computes.
    pub precision: AdapterPrecision,
}

impl LoraOptions {
    /// PEFT's default precision with scale `scale`.
    pub fn new(scale: f64) -> Self {
        LoraOptions {
            scale,
            precision: AdapterPrecision::F32,
        }
    }

    /// Sets [`precision`](Self::precision).
    pub fn with_precision(mut self, precision: AdapterPrecision) -> Self {
        self.precision = precision;
        self
    }
}

/// Output of [`FusedOps::fused_lora_linear`](super::FusedOps::fused_lora_linear).
#[derive(Debug, Clone)]
pub struct LoraLinearOutput<B: Backend> {
    /// `x·W + b + s·(x_a·Aᵀ)·Bᵀ`, `[..., d_out]`, dtype of `x`.
    pub output: FloatTensor<B>,
    /// `x_a·Aᵀ` flattened to `[rows, r]`, in the compute dtype of
    /// [`AdapterPrecision::compute_dtype`]: the backward's `B` gradient needs it, and it
    /// is `d_in / r` times smaller than `x_a`.
    pub hidden: FloatTensor<B>,
}

/// The forward of a LoRA linear layer before its two paths are summed (see
/// [`FusedOps::fused_lora_linear_parts`](super::FusedOps::fused_lora_linear_parts)).
#[derive(Debug, Clone)]
pub struct LoraLinearParts<B: Backend> {
    /// The base path `x·W + b`, `[rows, d_out]`, dtype of `x` (rounded to it, as the
    /// frozen base layer's output).
    pub base: FloatTensor<B>,
    /// The adapter path `h·Bᵀ`, `[rows, d_out]`, in the compute dtype.
    pub adapter: FloatTensor<B>,
    /// `s·(x_a·Aᵀ)`, `[rows, r]`, in the compute dtype (see [`LoraLinearOutput::hidden`]).
    pub hidden: FloatTensor<B>,
}

/// Which gradients of a LoRA linear layer a backward computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoraLinearGradsWanted {
    /// Of `x` (through the base weight, plus the adapter path when `x_a` is `x`).
    pub x: bool,
    /// Of a separate adapter input `x_a` (the dropout's output).
    pub adapter_x: bool,
    /// Of `A`.
    pub a: bool,
    /// Of `B`.
    pub b: bool,
}

/// Gradients of [`FusedOps::fused_lora_linear`](super::FusedOps::fused_lora_linear), shaped
/// and typed like their inputs; `None` where not asked for.
#[derive(Debug, Clone)]
pub struct LoraLinearGrads<B: Backend> {
    /// `[..., d_in]`.
    pub grad_x: Option<FloatTensor<B>>,
    /// `[..., d_in]`, when the adapter's input is a separate tensor.
    pub grad_adapter_x: Option<FloatTensor<B>>,
    /// `[r, d_in]`, dtype of `A` (accumulated in f32).
    pub grad_a: Option<FloatTensor<B>>,
    /// `[d_out, r]`, dtype of `B` (accumulated in f32).
    pub grad_b: Option<FloatTensor<B>>,
}

/// A LoRA adapter on the LM head of a fused linear cross entropy:
/// `logits = x·Wᵀ + b + s·(x_a·Aᵀ)·Bᵀ`.
#[derive(Debug, Clone)]
pub struct LoraHead<B: Backend> {
    /// The adapter's input when it is not `x` (`dropout(x)`), `[N, H]`, dtype of `x`.
    pub x: Option<FloatTensor<B>>,
    /// `A`, `[r, H]`.
    pub a: FloatTensor<B>,
    /// `B`, `[V, r]`, dtype of `A`.
    pub b: FloatTensor<B>,
    /// Scale and precision.
    pub options: LoraOptions,
}

/// Which gradients a (LoRA) fused linear cross entropy computes: only those asked for, so a
/// frozen LM head costs no `[V, H]` weight gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LinearCrossEntropyGradsWanted {
    /// Of `x`.
    pub x: bool,
    /// Of the LM head weight.
    pub weight: bool,
    /// Of its bias.
    pub bias: bool,
    /// Of the adapter's separate input.
    pub adapter_x: bool,
    /// Of the adapter's `A`.
    pub a: bool,
    /// Of the adapter's `B`.
    pub b: bool,
}

impl LinearCrossEntropyGradsWanted {
    /// Every gradient (of the inputs that exist).
    pub fn all() -> Self {
        LinearCrossEntropyGradsWanted {
            x: true,
            weight: true,
            bias: true,
            adapter_x: true,
            a: true,
            b: true,
        }
    }

    /// No gradient: the loss only.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether any gradient is asked for.
    pub fn any(&self) -> bool {
        self.x || self.weight || self.bias || self.adapter_x || self.a || self.b
    }
}

/// Gradients of the LM head's adapter in a fused linear cross entropy.
#[derive(Debug, Clone)]
pub struct LoraHeadGrads<B: Backend> {
    /// Of the adapter's separate input, `[N, H]`.
    pub grad_x: Option<FloatTensor<B>>,
    /// Of `A`, `[r, H]`, dtype of `A` (accumulated in f32 over the chunks).
    pub grad_a: Option<FloatTensor<B>>,
    /// Of `B`, `[V, r]`, dtype of `B` (accumulated in f32 over the chunks).
    pub grad_b: Option<FloatTensor<B>>,
}
