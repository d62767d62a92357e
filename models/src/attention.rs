//! Causal self-attention with grouped-query heads (transformers' `LlamaAttention`,
//! `Qwen2Attention`, `Qwen3Attention`, `MistralAttention` with eager attention).

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kernels;
use crate::liger_config::LigerConfig;
use crate::params::{self, ParamSource};
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Tensor};
use liger_burn::nn::RmsNorm;
use liger_burn::ops::FusedOps;
use liger_burn::ops::compose::attention::repeat_kv;

/// Self-attention of one decoder layer. Record names follow transformers
/// (`q_proj`, `k_proj`, `v_proj`, `o_proj`, Qwen3's `q_norm`, `k_norm`).
#[derive(Module, Debug)]
pub struct Attention<B: FusedOps> {
    /// `[hidden] → [q_heads · head_dim]` (bias on Qwen2, or with `attention_bias`).
    pub q_proj: Linear<B>,
    /// `[hidden] → [kv_heads · head_dim]`.
    pub k_proj: Linear<B>,
    /// `[hidden] → [kv_heads · head_dim]`.
    pub v_proj: Linear<B>,
    /// `[q_heads · head_dim] → [hidden]`.
    pub o_proj: Linear<B>,
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
}

/// What every layer's attention shares in one forward pass.
#[derive(Clone, Debug)]
pub struct AttentionInputs<B: FusedOps> {
    /// RoPE cosines, `[1, seq, head_dim]`, activation dtype.
    pub cos: Tensor<B, 3>,
    /// RoPE sines, `[1, seq, head_dim]`, activation dtype.
    pub sin: Tensor<B, 3>,
    /// `true` where query `i` must not see key `j` (`j > i`, or outside the sliding
    /// window), `[seq, seq]`: eager attention's (liger-burn's attention builds each
    /// block's part from positions instead, so this is `None` when it is on).
    pub mask: Option<Tensor<B, 2, Bool>>,
    /// The sliding window (Mistral), for the mask built from positions.
    pub window: Option<usize>,
}

impl<B: FusedOps> Attention<B> {
    /// Builds the attention of layer `prefix` (e.g. `model.layers.3.self_attn`).
    pub fn build<S: ParamSource<B>>(
        config: &ModelConfig,
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
            q_proj: params::linear(src, &format!("{prefix}.q_proj"), h, q, qkv_bias)?,
            k_proj: params::linear(src, &format!("{prefix}.k_proj"), h, kv, qkv_bias)?,
            v_proj: params::linear(src, &format!("{prefix}.v_proj"), h, kv, qkv_bias)?,
            o_proj: params::linear(src, &format!("{prefix}.o_proj"), q, h, config.o_bias())?,
            q_norm: norm(src, "q_norm")?,
            k_norm: norm(src, "k_norm")?,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: d,
        })
    }

    /// `x: [batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        inputs: &AttentionInputs<B>,
        liger: &LigerConfig,
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (hq, hk, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let dtype = x.dtype();

        // [batch, seq, heads, head_dim]
        let q = self.q_proj.forward(x.clone()).reshape([b, s, hq, d]);
        let k = self.k_proj.forward(x.clone()).reshape([b, s, hk, d]);
        let v = self.v_proj.forward(x).reshape([b, s, hk, d]);
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
            inputs.window,
            dtype,
            liger.attention,
        );
        let out = out.swap_dims(1, 2).reshape([b, s, hq * d]);
        self.o_proj.forward(out)
    }
}

/// Eager attention as transformers (the stock path): k and v repeated for their query
/// heads, then the heads in groups whose scores stay indexable (see [`heads_per_group`]).
/// `q`: `[batch, q_heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`,
/// `mask`: `[seq, seq]`; returns `[batch, q_heads, seq, head_dim]`.
pub(crate) fn eager_attention_grouped<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &Tensor<B, 2, Bool>,
    dtype: DType,
) -> Tensor<B, 4> {
    let [b, hq, s, _] = q.dims();
    let hk = k.dims()[1];
    let k = repeat_kv(k, hq / hk);
    let v = repeat_kv(v, hq / hk);
    let group = heads_per_group(b, hq, s);
    if group >= hq {
        return eager_attention(q, k, v, mask, dtype);
    }
    let groups = (0..hq)
        .step_by(group)
        .map(|start| {
            let n = group.min(hq - start);
            eager_attention(
                q.clone().narrow(1, start, n),
                k.clone().narrow(1, start, n),
                v.clone().narrow(1, start, n),
                mask,
                dtype,
            )
        })
        .collect();
    Tensor::cat(groups, 1)
}

/// Eager attention as transformers: scores in the activation dtype, the masked softmax in
/// f32, the probabilities cast back. `q`, `k`, `v`: `[batch, heads, seq, head_dim]`;
/// `mask`: `[seq, seq]`; returns `[batch, heads, seq, head_dim]`.
fn eager_attention<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &Tensor<B, 2, Bool>,
    dtype: DType,
) -> Tensor<B, 4> {
    let [b, h, s, d] = q.dims();
    let scale = (d as f64).powf(-0.5);
    let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
    let mask = mask.clone().unsqueeze::<4>().expand([b, h, s, s]);
    let scores = scores.cast(DType::F32).mask_fill(mask, f32::NEG_INFINITY);
    softmax(scores, 3).cast(dtype).matmul(v)
}

/// Most elements one `[batch, heads, seq, seq]` score tensor may have: CubeCL kernels
/// index with 32-bit integers. On the H200, Llama-3.2-1B's eager attention at 8K tokens
/// and more (32·S² ≥ 2³¹ elements per layer, in one tensor) ran in a fraction of the
/// time its FLOPs take and held less memory than its saved probabilities alone need, so
/// it cannot have computed them all; the heads are therefore taken in groups below this.
pub const MAX_SCORE_ELEMENTS: usize = (1 << 31) - 1;

#[cfg(feature = "test-hooks")]
std::thread_local! {
    static SCORE_LIMIT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Test-only (feature `test-hooks`): [`MAX_SCORE_ELEMENTS`] is `limit` on this thread until
/// the guard is dropped, so tests reach the grouped path at small shapes.
#[cfg(feature = "test-hooks")]
pub fn override_max_score_elements(limit: usize) -> liger_burn::test_hooks::OverrideGuard<usize> {
    liger_burn::test_hooks::scoped_override(&SCORE_LIMIT, limit)
}

/// Query heads per group so that `[batch, group, seq, seq]` stays within the limit: the
/// fewest groups that fit, their sizes balanced (32 heads at 8K: two groups of 16, not
/// 31 + 1).
///
/// # Panics
/// When even one head's scores (`batch · seq²` elements) exceed it, naming the shapes.
pub fn heads_per_group(batch: usize, heads: usize, seq: usize) -> usize {
    #[cfg(feature = "test-hooks")]
    let limit = SCORE_LIMIT.with(|s| s.get()).unwrap_or(MAX_SCORE_ELEMENTS);
    #[cfg(not(feature = "test-hooks"))]
    let limit = MAX_SCORE_ELEMENTS;
    let per_head = batch.saturating_mul(seq).saturating_mul(seq);
    assert!(
        per_head <= limit,
        "attention: the scores of one head, [batch {batch}, 1, seq {seq}, seq {seq}] = \
         {per_head} elements, exceed the {limit} a CubeCL kernel can index; use a shorter \
         sequence or a smaller batch"
    );
    let heads = heads.max(1);
    let most = (limit / per_head.max(1)).clamp(1, heads);
    heads.div_ceil(heads.div_ceil(most))
}
