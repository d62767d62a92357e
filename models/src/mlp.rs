//! The gated MLP of every decoder layer: `down(silu(gate(x)) * up(x))`.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kernels;
use crate::liger_config::LigerConfig;
use crate::params::{self, ParamSource};
use crate::projection::Projection;
use burn::module::Module;
use burn::tensor::Tensor;
use liger_burn::ops::FusedOps;

/// Gated MLP (transformers' `LlamaMLP`). Record names follow transformers.
#[derive(Module, Debug)]
pub struct Mlp<B: FusedOps> {
    /// `[hidden] → [intermediate]`.
    pub gate_proj: Projection<B>,
    /// `[hidden] → [intermediate]`.
    pub up_proj: Projection<B>,
    /// `[intermediate] → [hidden]`.
    pub down_proj: Projection<B>,
    /// Which of this layer's ops run fused (chosen when the model is built).
    #[module(skip)]
    pub kernels: LigerConfig,
}

impl<B: FusedOps> Mlp<B> {
    /// Builds the MLP of layer `prefix` (e.g. `model.layers.3.mlp`).
    pub fn build<S: ParamSource<B>>(
        config: &ModelConfig,
        kernels: LigerConfig,
        prefix: &str,
        src: &mut S,
    ) -> Result<Self, ModelError> {
        let (h, i, bias) = (
            config.hidden_size,
            config.intermediate_size,
            config.mlp_has_bias(),
        );
        Ok(Mlp {
            gate_proj: params::projection(src, &format!("{prefix}.gate_proj"), h, i, bias)?,
            up_proj: params::projection(src, &format!("{prefix}.up_proj"), h, i, bias)?,
            down_proj: params::projection(src, &format!("{prefix}.down_proj"), i, h, bias)?,
            kernels,
        })
    }

    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`.
    ///
    /// With the fused SwiGLU on and no adapter on `down_proj`, the down projection and the
    /// gated unit are one op (`liger_burn::functional::swiglu_linear`) whose backward
    /// recomputes `silu(gate) * up` rather than keeping it: one `[batch, seq,
    /// intermediate]` tensor less per layer for the backward.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let lora = self.kernels.lora;
        let gate = self.gate_proj.forward(x.clone(), lora);
        let up = self.up_proj.forward(x, lora);
        let down = &self.down_proj;
        if self.kernels.swiglu && down.lora.is_none() {
            let y = liger_burn::functional::swiglu_linear(gate, up, down.weight.val());
            match &down.bias {
                Some(b) => y + b.val().unsqueeze(),
                None => y,
            }
        } else {
            down.forward(kernels::swiglu(gate, up, self.kernels.swiglu), lora)
        }
    }
}
