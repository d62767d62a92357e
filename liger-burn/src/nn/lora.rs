//! A LoRA adapter as a Burn module: the trainable `A` and `B` of one frozen linear layer,
//! applied with the fused LoRA primitives ([`functional::lora_linear`], and
//! [`functional::fused_linear_cross_entropy_lora`] on an LM head).

use crate::functional::{self, LoraHeadAdapter};
use crate::ops::{AdapterPrecision, FusedOps, LoraOptions, lora_scale};
use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};

/// Configuration of a [`LoraAdapter`] (PEFT's `LoraConfig` fields for one layer).
#[derive(Config, Debug)]
pub struct LoraAdapterConfig {
    /// Input features of the adapted layer.
    pub d_in: usize,
    /// Output features of the adapted layer.
    pub d_out: usize,
    /// Rank `r` (at least 1).
    pub rank: usize,
    /// `alpha`: the scale is `alpha / r` (`alpha / √r` with rsLoRA).
    pub alpha: f64,
    /// Dropout probability of the adapter's input while training, in `[0, 1)`.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// rsLoRA scaling (`alpha / √r`).
    #[config(default = false)]
    pub use_rslora: bool,
    /// Where the adapter path computes.
    #[config(default = "AdapterPrecision::F32")]
    pub precision: AdapterPrecision,
}

impl LoraAdapterConfig {
    /// Checks the values; the message names the field and the layer's shape.
    pub fn validate(&self) -> Result<(), String> {
        let shape = format!("[{} -> {}]", self.d_in, self.d_out);
        if self.rank == 0 {
            return Err(format!(
                "LoRA adapter {shape}: rank 0; the rank must be at least 1"
            ));
        }
        if !self.alpha.is_finite() {
            return Err(format!(
                "LoRA adapter {shape}: alpha must be finite, got {}",
                self.alpha
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "LoRA adapter {shape}: dropout must be in [0, 1), got {}",
                self.dropout
            ));
        }
        Ok(())
    }

    /// PEFT's initialization (`init_lora_weights=True`): `A` Kaiming-uniform with
    /// `a = √5` (PyTorch's `nn.Linear` default: uniform in `±1/√d_in`), `B` zeros, so the
    /// adapted layer starts as the base layer. Both in f32, whatever the base dtype (PEFT's
    /// `autocast_adapter_dtype`). Panics with [`validate`](Self::validate)'s message.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LoraAdapter<B> {
        self.validate().unwrap_or_else(|e| panic!("{e}"));
        let bound = 1.0 / (self.d_in as f64).sqrt();
        let a = Tensor::<B, 2>::random(
            [self.rank, self.d_in],
            Distribution::Uniform(-bound, bound),
            (device, DType::F32),
        );
        let b = Tensor::<B, 2>::zeros([self.d_out, self.rank], (device, DType::F32));
        LoraAdapter {
            lora_a: Param::from_tensor(a),
            lora_b: Param::from_tensor(b),
            scale: lora_scale(self.alpha, self.rank, self.use_rslora),
            dropout: self.dropout,
            precision: self.precision,
        }
    }
}

/// The trainable low-rank update of one frozen linear layer:
/// `y = base(x) + s·(dropout(x)·Aᵀ)·Bᵀ`. Record fields `lora_a`, `lora_b` (PEFT's
/// `lora_A.weight`, `lora_B.weight`, same layouts).
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// `A`, `[r, d_in]`.
    pub lora_a: Param<Tensor<B, 2>>,
    /// `B`, `[d_out, r]`.
    pub lora_b: Param<Tensor<B, 2>>,
    /// `s`: `alpha / r`, or `alpha / √r` with rsLoRA.
    #[module(skip)]
    pub scale: f64,
    /// Dropout probability of the adapter's input while training.
    #[module(skip)]
    pub dropout: f64,
    /// Where the adapter path computes.
    #[module(skip)]
    pub precision: AdapterPrecision,
}

impl<B: Backend> LoraAdapter<B> {
    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.lora_a.dims()[0]
    }

    /// Scale and precision.
    pub fn options(&self) -> LoraOptions {
        LoraOptions::new(self.scale).with_precision(self.precision)
    }

    /// The adapter's input: `dropout(x)` while training with a dropout, else `None` (the
    /// adapter reads `x` itself). Burn's `Dropout` semantics: active only on an autodiff
    /// backend, the kept values scaled by `1 / (1 - p)`.
    pub fn adapter_input<const D: usize>(&self, x: &Tensor<B, D>) -> Option<Tensor<B, D>> {
        (self.dropout > 0.0 && B::ad_enabled(&x.device())).then(|| {
            burn::nn::DropoutConfig::new(self.dropout)
                .init()
                .forward(x.clone())
        })
    }

    /// `s·(B·A)ᵀ`, `[d_in, d_out]` in f32: what merging adds to a Burn-layout weight.
    pub fn delta_weight(&self) -> Tensor<B, 2> {
        let a = self.lora_a.val().cast(DType::F32);
        let b = self.lora_b.val().cast(DType::F32);
        b.matmul(a).transpose().mul_scalar(self.scale)
    }
}

impl<B: FusedOps> LoraAdapter<B> {
    /// The adapted linear layer: `x·weight + bias + s·(x_a·Aᵀ)·Bᵀ` (see
    /// [`functional::lora_linear`]).
    ///
    /// - `x`: `[..., d_in]`; `weight`: `[d_in, d_out]` (Burn's layout); `bias`: `[d_out]`
    /// - returns `[..., d_out]`
    pub fn forward<const D: usize>(
        &self,
        x: Tensor<B, D>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
    ) -> Tensor<B, D> {
        let adapter_x = self.adapter_input(&x);
        functional::lora_linear(
            x,
            weight,
            bias,
            adapter_x,
            self.lora_a.val(),
            self.lora_b.val(),
            self.options(),
        )
    }

    /// The LM-head form for [`functional::fused_linear_cross_entropy_lora`], for the
    /// loss's input `x: [N, H]`.
    pub fn head(&self, x: &Tensor<B, 2>) -> LoraHeadAdapter<B> {
        LoraHeadAdapter {
            x: self.adapter_input(x),
            a: self.lora_a.val(),
            b: self.lora_b.val(),
            options: self.options(),
        }
    }
}
