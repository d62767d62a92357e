//! Gated MLPs (`down_proj(act(gate_proj(x)) * up_proj(x))`) with the fused gated unit:
//! [`SwiGluMlp`] (Llama, Qwen, Mistral) and [`GeGluMlp`] (Gemma). The projections stay
//! matmuls (burn `Linear`); the activation and the product are one kernel, forward and
//! backward, and the `[..., d_ff]` activation is never materialised on its own. The down
//! projection and the gated unit are one op ([`functional::swiglu_linear`]): its backward
//! recomputes the `[..., d_ff]` unit instead of keeping it.
//!
//! Records have the Hugging Face layout, `gate_proj.weight`, `up_proj.weight`,
//! `down_proj.weight` (plus `.bias` when configured), so a record of any struct with those
//! three burn `Linear` fields loads. Burn's `Linear` stores its weight `[d_input, d_output]`
//! (the transpose of PyTorch's), which burn-store's PyTorch adapter handles.

use crate::functional;
use crate::ops::FusedOps;
use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;

macro_rules! glu_mlp {
    ($module:ident, $config:ident, $op:ident, $op_linear:ident, $what:literal) => {
        #[doc = concat!("Configuration of [`", stringify!($module), "`].")]
        #[derive(Config, Debug)]
        pub struct $config {
            /// Model width: input and output features.
            pub d_model: usize,
            /// Hidden width of the MLP (`intermediate_size` in Hugging Face configs).
            pub d_ff: usize,
            /// Whether the three projections have a bias (Llama, Qwen2 MLPs and Gemma: no).
            #[config(default = false)]
            pub bias: bool,
            /// Initializer of the projections (burn `Linear`'s default).
            #[config(
                default = "Initializer::KaimingUniform { gain: 0.577_350_269_189_625_8, fan_out_only: false }"
            )]
            pub initializer: Initializer,
        }

        impl $config {
            #[doc = concat!("Initializes a [`", stringify!($module), "`] on `device`.")]
            pub fn init<B: FusedOps>(&self, device: &B::Device) -> $module<B> {
                let linear = |d_input, d_output| {
                    LinearConfig::new(d_input, d_output)
                        .with_bias(self.bias)
                        .with_initializer(self.initializer.clone())
                        .init(device)
                };
                $module {
                    gate_proj: linear(self.d_model, self.d_ff),
                    up_proj: linear(self.d_model, self.d_ff),
                    down_proj: linear(self.d_ff, self.d_model),
                }
            }
        }

        #[doc = concat!(
            "Gated MLP with ", $what, ": `down_proj(", stringify!($op),
            "(gate_proj(x), up_proj(x)))`, the gated unit fused and the down projection \
             taken with it ([`functional::", stringify!($op_linear), "`]).\n\n\
             Record layout: `gate_proj`, `up_proj`, `down_proj` (burn `Linear`s)."
        )]
        #[derive(Module, Debug)]
        pub struct $module<B: FusedOps> {
            /// `d_model → d_ff`, the activated branch.
            pub gate_proj: Linear<B>,
            /// `d_model → d_ff`, the linear branch.
            pub up_proj: Linear<B>,
            /// `d_ff → d_model`.
            pub down_proj: Linear<B>,
        }

        impl<B: FusedOps> $module<B> {
            /// `x: [..., d_model]` (e.g. `[batch, seq, d_model]`) → `[..., d_model]`.
            pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
                let y = functional::$op_linear(
                    self.gate_proj.forward(x.clone()),
                    self.up_proj.forward(x),
                    self.down_proj.weight.val(),
                );
                match &self.down_proj.bias {
                    Some(b) => y + b.val().unsqueeze(),
                    None => y,
                }
            }
        }
    };
}

glu_mlp!(
    SwiGluMlp,
    SwiGluMlpConfig,
    swiglu,
    swiglu_linear,
    "SwiGLU (`silu(gate) * up`)"
);
glu_mlp!(
    GeGluMlp,
    GeGluMlpConfig,
    geglu,
    geglu_linear,
    "GeGLU (`gelu_tanh(gate) * up`)"
);
