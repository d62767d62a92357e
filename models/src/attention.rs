//! Causal self-attention with grouped-query heads (transformers' `LlamaAttention`,
//! `Qwen2Attention`, `Qwen3Attention`, `MistralAttention` with eager attention).

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kernels;
use crate::liger_config::LigerConfig;
use crate::params::{self, ParamSource};
use crate::projection::Projection;
use burn::module::Module;
use burn::tensor::{Bool, Int, Tensor};
use liger_burn::nn::RmsNorm;
use liger_burn::ops::FusedOps;

/// Self-attention of one decoder layer. Record names follow transformers
/// (`q_proj`, `k_proj`, `v_proj`, `o_proj`, Qwen3's `q_norm`, `k_norm`).
#[derive(Module, Debug)]
pub struct Attention<B: FusedOps> {
    /// `[hidden] → [q_heads · head_dim]` (bias on Qwen2, or with `attention_bias`).
    pub q_proj: Projection<B>,
    /// `[hidden] → [kv_heads · head_dim]`.
    pub k_proj: Projection<B>,
    /// `[hidden] → [kv_heads · head_dim]`.
    pub v_proj: Projection<B>,
    /// `[q_heads · head_dim] → [hidden]`.
    pub o_proj: Projection<B>,
    /// Qwen3: RMSNorm over each query head, `[head_dim]`, before RoPE.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3: RMSNorm over each key head, `[head_dim]`, before RoPE.
    pub k_norm: Option<RmsNorm<B>>,
    /// Query heads.
    #[module(skip)]
    pub num_heads: usize,
    /// Key/value heads.
    #[module(skip)]
    pub num_kv_heads: usize,
    /// Width of a head.
    #[module(skip)]
    pub head_dim: usize,
    /// Which of this layer's ops run fused (chosen when the model is built).
    #[module(skip)]
    pub kernels: LigerConfig,
}

/// What every layer's attention shares in one forward pass.
#[derive(Clone, Debug)]
pub struct AttentionInputs<B: FusedOps> {
    /// RoPE cosines, `[1 or batch, seq, head_dim]`, activation dtype (per row when packed
    /// documents restart their positions).
    pub cos: Tensor<B, 3>,
    /// RoPE sines, same shape as `cos`.
    pub sin: Tensor<B, 3>,
    /// `true` where query `i` must not see key `j` (`j > i`, outside the sliding window,
    /// or another packed document), `[1 or batch, seq, seq]`: eager attention's
    /// (liger-burn's attention builds each block's part from positions and document ids
    /// instead, so this is `None` when it is on).
    pub mask: Option<Tensor<B, 3, Bool>>,
    /// The document of each token in packed rows, `[batch, seq]` (liger-burn's attention).
    pub document_ids: Option<Tensor<B, 2, Int>>,
    /// The sliding window (Mistral), for the mask built from positions.
    pub window: Option<usize>,
}

impl<B: FusedOps> Attention<B> {
    /// Builds the attention of layer `prefix` (e.g. `model.layers.3.self_attn`).
    pub fn build<S: ParamSource<B>>(
        config: &ModelConfig,
        kernels: LigerConfig,
        prefix: &str,
        src: &mut S,
    ) -> Result<Self, ModelError> {
        let (h, d) = (config.hidden_size, config.head_dim);
        let q = config.num_attention_heads * d;
        let kv = config.num_key_value_heads * d;
        let qkv_bias = config.qkv_bias();
        let norm = |src: &mut S, name: &str| -> Result<Option<RmsNorm<B>>, ModelError> {
            if config.qk_norm() {
                params::rms_norm(src, &format!("{prefix}.{name}"), d, config.rms_norm_eps).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Attention {
            q_proj: params::projection(src, &format!("{prefix}.q_proj"), h, q, qkv_bias)?,
            k_proj: params::projection(src, &format!("{prefix}.k_proj"), h, kv, qkv_bias)?,
            v_proj: params::projection(src, &format!("{prefix}.v_proj"), h, kv, qkv_bias)?,
            o_proj: params::projection(src, &format!("{prefix}.o_proj"), q, h, config.o_bias())?,
            q_norm: norm(src, "q_norm")?,
            k_norm: norm(src, "k_norm")?,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: d,
            kernels,
        })
    }

    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>, inputs: &AttentionInputs<B>) -> Tensor<B, 3> {
        let liger = &self.kernels;
        let [b, s, _] = x.dims();
        let (hq, hk, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let dtype = x.dtype();

        // [batch, seq, heads, head_dim]
        let lora = liger.lora;
        let q = self.q_proj.forward(x.clone(), lora).reshape([b, s, hq, d]);
        let k = self.k_proj.forward(x.clone(), lora).reshape([b, s, hk, d]);
        let v = self.v_proj.forward(x, lora).reshape([b, s, hk, d]);
        // Qwen3 normalizes each head before RoPE.
        let q = match &self.q_norm {
            Some(n) => kernels::rms_norm(q, n.gamma.val(), n.epsilon, liger.rms_norm),
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => kernels::rms_norm(k, n.gamma.val(), n.epsilon, liger.rms_norm),
            None => k,
        };
        // [batch, heads, seq, head_dim]
        let (q, k) = kernels::rope(
            q.swap_dims(1, 2),
            k.swap_dims(1, 2),
            inputs.cos.clone(),
            inputs.sin.clone(),
            liger.rope,
        );
        let v = v.swap_dims(1, 2);
        // [batch, q_heads, seq, head_dim]
        let out = kernels::attention(
            q,
            k,
            v,
            inputs.mask.clone(),
            inputs.document_ids.clone(),
            inputs.window,
            dtype,
            liger.attention,
            liger.deterministic,
        );
        let out = out.swap_dims(1, 2).reshape([b, s, hq * d]);
        self.o_proj.forward(out, lora)
    }
}
