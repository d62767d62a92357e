//! Eager attention as transformers computes it: the stock path of the models' attention
//! (liger-burn's blockwise attention is the fused one). It keeps every layer's
//! `[batch, heads, seq, seq]` probabilities for the backward, so its heads are taken in
//! groups whose scores stay indexable by CubeCL's 32-bit kernels.

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Tensor};
use liger_burn::ops::FusedOps;
use liger_burn::ops::compose::attention::repeat_kv;

/// Eager attention as transformers (the stock path): k and v repeated for their query
/// heads, then the heads in groups whose scores stay indexable (see [`heads_per_group`]).
/// `q`: `[batch, q_heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`,
/// `mask`: `[1 or batch, seq, seq]`; returns `[batch, q_heads, seq, head_dim]`.
pub(crate) fn eager_attention_grouped<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &Tensor<B, 3, Bool>,
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
/// `mask`: `[1 or batch, seq, seq]`; returns `[batch, heads, seq, head_dim]`.
fn eager_attention<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &Tensor<B, 3, Bool>,
    dtype: DType,
) -> Tensor<B, 4> {
    let [b, h, s, d] = q.dims();
    let scale = (d as f64).powf(-0.5);
    let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
    let mask = mask.clone().unsqueeze_dim::<4>(1).expand([b, h, s, s]);
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
