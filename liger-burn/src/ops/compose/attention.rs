//! Exact attention in blocks of query rows, keeping nothing `[seq, seq]`-sized for
//! the backward: the default bodies of
//! [`FusedOps::fused_attention`](crate::ops::FusedOps::fused_attention) and its backward,
//! built from `matmul`, slicing and [`FusedOps::fused_softmax`] (so every backend runs
//! them, with its fused softmax kernel where it has one).
//!
//! # Why
//!
//! Eager attention keeps each layer's probabilities for the backward (`[batch, heads, seq,
//! seq]`, in f32 and in the input dtype: 6 bytes per score in bf16). That is quadratic in
//! the sequence and dominates training memory from a few thousand tokens on: 48 GiB of the
//! 99 GB in use when Llama-3.2-1B trains on 4K tokens on the H200. Here the forward keeps
//! only its inputs, and the backward recomputes one block of probabilities at a time
//! (one more `q·kᵀ` product and softmax per block: about a sixth more attention FLOPs).
//!
//! # Blocks
//!
//! Each block builds its own `[rows, keys]` mask from positions (causal, the sliding window
//! of [`AttentionOptions::window`]) and from the document ids (`[batch, rows, keys]`), and
//! combines them with its slice of a given `[seq, seq]` mask tensor: without a mask tensor
//! nothing `[seq, seq]`-sized exists at all.
//!
//! A block is `rows` queries of every head against the keys they can see: all of them,
//! or under [`AttentionOptions::causal`] only those up to the block's last query (the
//! causal mask is applied on top of any given mask, so dropping those keys never changes
//! the result, whatever the block size). `rows`
//! is the most that keeps a block's scores within [`BLOCK_SCORE_ELEMENTS`], a multiple of
//! 64 when above it (matmul tiles), the last block partial. Below that size the whole
//! sequence is one block, computed exactly as eager attention computes it.
//!
//! # Numerics
//!
//! The same operations as transformers' eager attention, in the same dtypes: scores
//! `(q·kᵀ)·scale` in the input dtype, mask and softmax in f32, probabilities cast to the
//! input dtype, `p·v`. The backward follows the chain rule of those same steps (softmax's
//! backward in f32); with several blocks, the gradients of k and v are summed over the
//! query heads sharing a key/value head and over the blocks in f32, cast once at the end.
//!
//! A query that sees no key (possible only through a given mask) has probabilities 0, so
//! output 0 and no gradient, as Burn's own attention defines it (a plain softmax of
//! nothing but `-inf` would be NaN).

use crate::ops::{AttentionGrads, AttentionOptions, AttentionOutput, FusedOps};
use burn::tensor::{
    Bool, DType, Int, Tensor, TensorPrimitive,
    ops::{BoolTensor, FloatTensor, IntTensor},
};

/// Most score elements one block may hold (`[batch, heads, rows, keys]`): 2²⁷, 0.5 GiB in
/// f32. A block's transients are a few times that (scores in two dtypes, probabilities,
/// their gradient), so the attention of one layer needs a few GiB at any length, while
/// blocks stay large enough for the matmuls to fill the GPU.
pub const BLOCK_SCORE_ELEMENTS: usize = 1 << 27;

/// Query rows per block for `[batch, heads, seq, ·]` (see the module docs).
pub fn block_rows(batch: usize, heads: usize, seq: usize) -> usize {
    #[cfg(feature = "test-hooks")]
    let budget = crate::test_hooks::attention_block_override().unwrap_or(BLOCK_SCORE_ELEMENTS);
    #[cfg(not(feature = "test-hooks"))]
    let budget = BLOCK_SCORE_ELEMENTS;
    let per_row = batch.saturating_mul(heads).saturating_mul(seq).max(1);
    let rows = (budget / per_row).max(1);
    if rows >= seq {
        seq.max(1)
    } else if rows >= 64 {
        rows / 64 * 64
    } else {
        rows
    }
}

fn float<B: FusedOps, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn prim<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// The inputs as tensors, k and v repeated for every query head of their group.
struct Inputs<B: FusedOps> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 2, Bool>>,
    document_ids: Option<Tensor<B, 2, Int>>,
    kv_heads: usize,
    dtype: DType,
}

impl<B: FusedOps> Inputs<B> {
    fn new(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        mask: Option<BoolTensor<B>>,
        document_ids: Option<IntTensor<B>>,
    ) -> Self {
        let q: Tensor<B, 4> = float(q);
        let (k, v): (Tensor<B, 4>, Tensor<B, 4>) = (float(k), float(v));
        let kv_heads = k.dims()[1];
        let repeats = q.dims()[1] / kv_heads.max(1);
        let dtype = q.dtype();
        Self {
            q,
            k: repeat_kv(k, repeats),
            v: repeat_kv(v, repeats),
            mask: mask.map(Tensor::from_primitive),
            document_ids: document_ids.map(Tensor::from_primitive),
            kv_heads,
            dtype,
        }
    }

    /// `(start, end, keys)` of every block: queries `start..end` against keys `0..keys`.
    fn blocks(&self, options: &AttentionOptions) -> Vec<(usize, usize, usize)> {
        let [b, h, s, _] = self.q.dims();
        let rows = block_rows(b, h, s);
        (0..s)
            .step_by(rows)
            .map(|start| {
                let end = (start + rows).min(s);
                (start, end, if options.causal { end } else { s })
            })
            .collect()
    }

    /// The block's mask, `[1 or batch, 1, rows, keys]` (`true`: hidden): the given mask's
    /// slice, the causal and window masks built from positions (`j > i`, `i - j >= window`)
    /// and the documents' (`doc[i] != doc[j]`), combined; or none at all.
    fn block_mask(
        &self,
        (start, end, keys): (usize, usize, usize),
        options: &AttentionOptions,
    ) -> Option<Tensor<B, 4, Bool>> {
        let rows = end - start;
        let batch = self.q.dims()[0];
        let device = self.q.device();
        let mut parts: Vec<Tensor<B, 4, Bool>> = Vec::new();
        if let Some(mask) = &self.mask {
            parts.push(
                mask.clone()
                    .slice([start..end, 0..keys])
                    .reshape([1, 1, rows, keys]),
            );
        }
        if options.causal || options.window.is_some() {
            // i - j for every (query i, key j) of the block.
            let i = Tensor::<B, 1, Int>::arange(start as i64..end as i64, &device)
                .reshape([rows, 1])
                .expand([rows, keys]);
            let j = Tensor::<B, 1, Int>::arange(0..keys as i64, &device)
                .reshape([1, keys])
                .expand([rows, keys]);
            let offset = i - j;
            if options.causal {
                parts.push(offset.clone().lower_elem(0).reshape([1, 1, rows, keys]));
            }
            if let Some(w) = options.window {
                parts.push(
                    offset
                        .greater_equal_elem(w as i64)
                        .reshape([1, 1, rows, keys]),
                );
            }
        }
        if let Some(ids) = &self.document_ids {
            let queries = ids
                .clone()
                .slice([0..batch, start..end])
                .reshape([batch, rows, 1])
                .expand([batch, rows, keys]);
            let seen = ids
                .clone()
                .slice([0..batch, 0..keys])
                .reshape([batch, 1, keys])
                .expand([batch, rows, keys]);
            parts.push(queries.not_equal(seen).reshape([batch, 1, rows, keys]));
        }
        let wide = if self.document_ids.is_some() {
            batch
        } else {
            1
        };
        parts
            .into_iter()
            .map(|m| m.expand([wide, 1, rows, keys]))
            .reduce(|a, b| a.bool_or(b))
    }

    /// The block's probabilities in f32 and in the input dtype, `[b, h, end - start, keys]`.
    fn probabilities(
        &self,
        (start, end, keys): (usize, usize, usize),
        options: &AttentionOptions,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let scale = options.scale;
        let [b, h, _, _] = self.q.dims();
        let q = self.q.clone().narrow(2, start, end - start);
        let k = self.k.clone().narrow(2, 0, keys);
        let scores = mm(q, k.swap_dims(2, 3)).mul_scalar(scale);
        let scores = scores.cast(DType::F32);
        let scores = match self.block_mask((start, end, keys), options) {
            Some(mask) => {
                let mask = mask.expand([b, h, end - start, keys]);
                scores.mask_fill(mask, f32::NEG_INFINITY)
            }
            None => scores,
        };
        let p32: Tensor<B, 4> = float(B::fused_softmax(prim(scores)));
        // Only a given mask can hide every key of a query (the masks built here always show
        // a query itself): such a row's softmax is NaN; its probabilities are 0.
        let p32 = match &self.mask {
            Some(_) => p32.clone().mask_fill(p32.is_nan(), 0.0),
            None => p32,
        };
        let p = p32.clone().cast(self.dtype);
        (p32, p)
    }
}

/// `a · b` through [`FusedOps::fused_matmul`]: the vendor library where the backend has
/// one (cuBLASLt on CUDA: true f32 products for f32, where Burn's matmul rounds operands
/// to TF32), the backend's matmul elsewhere.
fn mm<B: FusedOps>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> Tensor<B, 4> {
    float(B::fused_matmul(prim(a), prim(b)))
}

/// See [`FusedOps::fused_attention`](crate::ops::FusedOps::fused_attention).
pub fn forward<B: FusedOps>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: Option<BoolTensor<B>>,
    document_ids: Option<IntTensor<B>>,
    options: AttentionOptions,
) -> AttentionOutput<B> {
    let inputs = Inputs::<B>::new(q, k, v, mask, document_ids);
    let outputs: Vec<Tensor<B, 4>> = inputs
        .blocks(&options)
        .into_iter()
        .map(|block| {
            let (_, p) = inputs.probabilities(block, &options);
            mm(p, inputs.v.clone().narrow(2, 0, block.2))
        })
        .collect();
    let output = prim(if outputs.len() == 1 {
        outputs.into_iter().next().unwrap()
    } else {
        Tensor::cat(outputs, 2)
    });
    AttentionOutput { output, lse: None }
}

/// See [`FusedOps::fused_attention_backward`](crate::ops::FusedOps::fused_attention_backward).
pub fn backward<B: FusedOps>(
    grad_output: FloatTensor<B>,
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: Option<BoolTensor<B>>,
    document_ids: Option<IntTensor<B>>,
    options: AttentionOptions,
) -> AttentionGrads<B> {
    let inputs = Inputs::<B>::new(q, k, v, mask, document_ids);
    let grad: Tensor<B, 4> = float(grad_output);
    let [b, _, s, d] = inputs.q.dims();
    let blocks = inputs.blocks(&options);
    let device = inputs.q.device();
    // Key/value gradients, summed over the query heads sharing each k/v head: the block's
    // own when there is one block (in the input dtype, as eager attention's matmuls and
    // `repeat_kv` backward give them); else each block's sum in f32 is added into an f32
    // `[batch, kv_heads, seq, d]` accumulator (folding the head groups first keeps the
    // accumulator `q_heads / kv_heads` times smaller than the repeated heads).
    let kv_heads = inputs.kv_heads;
    let mut grad_k: Option<Tensor<B, 4>> = None;
    let mut grad_v: Option<Tensor<B, 4>> = None;
    let accumulate = |acc: &mut Option<Tensor<B, 4>>, part: Tensor<B, 4>| {
        if blocks.len() == 1 {
            *acc = Some(sum_kv_groups(part, kv_heads));
            return;
        }
        let part = sum_kv_groups(part.cast(DType::F32), kv_heads);
        let keys = part.dims()[2];
        let total = acc
            .take()
            .unwrap_or_else(|| Tensor::zeros([b, kv_heads, s, d], (&device, DType::F32)));
        let range = [0..b, 0..kv_heads, 0..keys, 0..d];
        let sum = total.clone().slice(range.clone()) + part;
        *acc = Some(total.slice_assign(range, sum));
    };
    let mut grad_q = Vec::with_capacity(blocks.len());
    for &(start, end, keys) in &blocks {
        let (p32, p) = inputs.probabilities((start, end, keys), &options);
        let g = grad.clone().narrow(2, start, end - start);
        let v = inputs.v.clone().narrow(2, 0, keys);
        let k = inputs.k.clone().narrow(2, 0, keys);
        let q = inputs.q.clone().narrow(2, start, end - start);
        // out = p·v
        accumulate(&mut grad_v, mm(p.swap_dims(2, 3), g.clone()));
        let grad_p = mm(g, v.swap_dims(2, 3)).cast(DType::F32);
        // softmax (f32) ← mask_fill (p is 0 where masked, so is this) ← cast ← ·scale
        let grad_scores: Tensor<B, 4> = float(B::fused_softmax_backward(prim(grad_p), prim(p32)));
        let grad_scores = grad_scores.cast(inputs.dtype).mul_scalar(options.scale);
        // scores = q·kᵀ
        grad_q.push(mm(grad_scores.clone(), k));
        accumulate(&mut grad_k, mm(grad_scores.swap_dims(2, 3), q));
    }
    let grad_q = if grad_q.len() == 1 {
        grad_q.pop().unwrap()
    } else {
        Tensor::cat(grad_q, 2)
    };
    let fold = |g: Option<Tensor<B, 4>>| {
        prim(g.expect("attention: at least one block").cast(inputs.dtype))
    };
    AttentionGrads {
        grad_q: prim(grad_q),
        grad_k: fold(grad_k),
        grad_v: fold(grad_v),
    }
}

/// `[batch, kv_heads, seq, d]` → `[batch, kv_heads · repeats, seq, d]`, each key/value head
/// repeated for the query heads of its group (transformers' `repeat_kv`).
pub fn repeat_kv<B: FusedOps>(x: Tensor<B, 4>, repeats: usize) -> Tensor<B, 4> {
    if repeats <= 1 {
        return x;
    }
    let [b, h, s, d] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([b, h, repeats, s, d])
        .reshape([b, h * repeats, s, d])
}

/// The transpose of [`repeat_kv`]: `[batch, kv_heads · repeats, seq, d]` →
/// `[batch, kv_heads, seq, d]`, summing each group.
fn sum_kv_groups<B: FusedOps>(x: Tensor<B, 4>, kv_heads: usize) -> Tensor<B, 4> {
    let [b, h, s, d] = x.dims();
    if h == kv_heads {
        return x;
    }
    x.reshape([b, kv_heads, h / kv_heads, s, d])
        .sum_dim(2)
        .reshape([b, kv_heads, s, d])
}
