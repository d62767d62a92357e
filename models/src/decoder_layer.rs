//! One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.

use crate::attention::{Attention, AttentionInputs};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kernels;
use crate::liger_config::LigerConfig;
use crate::mlp::Mlp;
use crate::params::{self, ParamSource};
use burn::module::Module;
use burn::tensor::Tensor;
use liger_burn::nn::RmsNorm;
use liger_burn::ops::FusedOps;

/// A decoder layer (transformers' `LlamaDecoderLayer`). Record names follow transformers.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: FusedOps> {
    /// Attention.
    pub self_attn: Attention<B>,
    /// MLP.
    pub mlp: Mlp<B>,
    /// Norm before the attention, `[hidden]`.
    pub input_layernorm: RmsNorm<B>,
    /// Norm before the MLP, `[hidden]`.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Which of this layer's ops run fused (chosen when the model is built).
    #[module(skip)]
    pub kernels: LigerConfig,
}

impl<B: FusedOps> DecoderLayer<B> {
    /// Builds layer `index` (`model.layers.{index}`).
    pub fn build<S: ParamSource<B>>(
        config: &ModelConfig,
        kernels: LigerConfig,
        index: usize,
        src: &mut S,
    ) -> Result<Self, ModelError> {
        let prefix = format!("model.layers.{index}");
        let (h, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(DecoderLayer {
            self_attn: Attention::build(config, kernels, &format!("{prefix}.self_attn"), src)?,
            mlp: Mlp::build(config, kernels, &format!("{prefix}.mlp"), src)?,
            input_layernorm: params::rms_norm(src, &format!("{prefix}.input_layernorm"), h, eps)?,
            post_attention_layernorm: params::rms_norm(
                src,
                &format!("{prefix}.post_attention_layernorm"),
                h,
                eps,
            )?,
            kernels,
        })
    }

    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>, inputs: &AttentionInputs<B>) -> Tensor<B, 3> {
        let fused = self.kernels.rms_norm;
        let norm =
            |n: &RmsNorm<B>, x: Tensor<B, 3>| kernels::rms_norm(x, n.gamma.val(), n.epsilon, fused);
        let h = self
            .self_attn
            .forward(norm(&self.input_layernorm, x.clone()), inputs);
        let x = x + h;
        let h = self
            .mlp
            .forward(norm(&self.post_attention_layernorm, x.clone()));
        x + h
    }
}
