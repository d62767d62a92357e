//! Kernel hooks: every switchable op of the models goes through one function here, which
//! takes its [`LigerConfig`](crate::LigerConfig) switch and runs either liger-burn's fused
//! op (`on`) or the stock Burn composition (`off`), with the same semantics (those of
//! Hugging Face transformers) either way.
//!
//! The `on` branches call `liger_burn::functional::{rms_norm, rope, swiglu, cross_entropy,
//! fused_linear_cross_entropy, attention}`; the `off` branches are the stock compositions in
//! [`stock`] (eager attention in [`crate::eager_attention`]).

use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::{DType, Int, Tensor};
use liger_burn::nn::LoraAdapter;
use liger_burn::ops::{FusedOps, RmsNormOptions, WeightGradAccumulation};

/// Label of a position that takes no part in the loss (PyTorch's and Liger's default).
pub const IGNORE_INDEX: i64 = -100;

/// How per-token losses are reduced: liger-burn's own (mean over the tokens whose target
/// is not [`IGNORE_INDEX`], 0 when there are none; sum; or one loss per token).
pub use liger_burn::ops::Reduction;

/// RMSNorm over the last dimension with Hugging Face Llama casting (`rstd` in f32, the
/// normalized input cast back to the input dtype, then multiplied by the weight).
///
/// - `x`: `[..., d]`, `weight`: `[d]` → `[..., d]`
pub fn rms_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
    on: bool,
) -> Tensor<B, D> {
    if on {
        liger_burn::functional::rms_norm(x, weight, RmsNormOptions::llama(eps))
    } else {
        stock::rms_norm(x, weight, eps)
    }
}

/// Rotary position embedding in Hugging Face's `rotate_half` layout:
/// `x * cos + rotate_half(x) * sin` for q and k.
///
/// - `q`: `[batch, q_heads, seq, head_dim]`, `k`: `[batch, kv_heads, seq, head_dim]`
/// - `cos`, `sin`: `[1 or batch, seq, head_dim]` (see [`crate::rope`]; per row for packed documents), dtype of q and k
/// - returns the rotated `(q, k)`, same shapes
pub fn rope<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
    on: bool,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [bq, _, sq, dq] = q.dims();
    let [bk, _, sk, dk] = k.dims();
    let [one, sc, dc] = cos.dims();
    assert!(
        bq == bk
            && sq == sk
            && dq == dk
            && (one == 1 || one == bq)
            && sc == sq
            && dc == dq
            && cos.dims() == sin.dims(),
        "rope: expected q [batch, q_heads, seq, head_dim], k [batch, kv_heads, seq, head_dim], \
         cos and sin [1 or batch, seq, head_dim]; got q {:?} ({:?}), k {:?} ({:?}), cos {:?}, sin {:?}",
        q.dims(),
        q.dtype(),
        k.dims(),
        k.dtype(),
        cos.dims(),
        sin.dims()
    );
    if on {
        liger_burn::functional::rope(q, k, cos, sin, liger_burn::ops::RopeLayout::RotateHalf)
    } else {
        stock::rope(q, k, cos, sin)
    }
}

/// Causal self-attention with grouped-query heads, as transformers' eager attention
/// computes it (scores in the activation dtype, masked softmax in f32, probabilities cast
/// back). `on`: liger-burn's [`attention`](liger_burn::functional::attention), which keeps
/// nothing `[seq, seq]`-sized for the backward; `off`: eager attention, which keeps the
/// probabilities of every layer. `deterministic`: liger-burn's backward gives the same bits
/// on every run (see `AttentionOptions::deterministic`).
///
/// - `q`: `[batch, q_heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`
/// - `mask`: `[1 or batch, seq, seq]`, `true` where query `i` must not see key `j` (hides
///   every `j > i`, keys outside `window` and, in packed rows, other documents' keys);
///   eager attention needs it, liger-burn's builds the same mask per block from positions,
///   `window` and `document_ids` when it is `None`
/// - `document_ids`: `[batch, seq]` for packed rows: query `i` sees only keys of its own
///   document (liger-burn's attention; eager attention reads the mask instead)
/// - returns `[batch, q_heads, seq, head_dim]`
///
/// # Panics
/// When `on` is false and no mask is given.
pub fn attention<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 3, burn::tensor::Bool>>,
    document_ids: Option<Tensor<B, 2, burn::tensor::Int>>,
    window: Option<usize>,
    dtype: DType,
    on: bool,
    deterministic: bool,
) -> Tensor<B, 4> {
    if on {
        let head_dim = q.dims()[3];
        let options = liger_burn::ops::AttentionOptions::causal(head_dim)
            .with_window(window)
            .with_deterministic(deterministic);
        match (document_ids, mask) {
            (Some(ids), _) => {
                liger_burn::functional::attention_with_documents(q, k, v, ids, options)
            }
            (None, Some(mask)) if mask.dims()[0] == 1 => {
                let [_, s, _] = mask.dims();
                liger_burn::functional::attention(q, k, v, Some(mask.reshape([s, s])), options)
            }
            (None, Some(_)) => panic!(
                "attention: liger-burn's attention takes one [seq, seq] mask for every row; \
                 pass document ids for packed rows"
            ),
            (None, None) => liger_burn::functional::attention(q, k, v, None, options),
        }
    } else {
        let mask = mask.expect("eager attention needs the [1 or batch, seq, seq] mask");
        crate::eager_attention::eager_attention_grouped(q, k, v, &mask, dtype)
    }
}

/// SwiGLU: `silu(gate) * up`.
///
/// - `gate`, `up`: `[..., intermediate]` → `[..., intermediate]`
pub fn swiglu<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    on: bool,
) -> Tensor<B, D> {
    assert!(
        gate.dims() == up.dims() && gate.dtype() == up.dtype(),
        "swiglu: gate and up must have the same shape and dtype, got gate {:?} ({:?}) and up {:?} ({:?})",
        gate.dims(),
        gate.dtype(),
        up.dims(),
        up.dtype()
    );
    if on {
        liger_burn::functional::swiglu(gate, up)
    } else {
        stock::swiglu(gate, up)
    }
}

/// Cross entropy of logits against integer targets, computed in f32 (as transformers
/// upcasts the logits); targets equal to [`IGNORE_INDEX`] are excluded.
///
/// - `logits`: `[n, vocab]`, any float dtype
/// - `targets`: `[n]`, in `0..vocab` or [`IGNORE_INDEX`]
/// - `check_targets`: with `on`, whether the kernel's target range is read back to name
///   an out-of-range target (see `LigerConfig::check_targets`)
/// - returns f32 `[1]` (mean, sum) or `[n]` ([`Reduction::None`])
pub fn cross_entropy<B: FusedOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    reduction: Reduction,
    on: bool,
    check_targets: bool,
) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let [nt] = targets.dims();
    assert!(
        n == nt,
        "cross_entropy: logits [n, vocab] and targets [n] disagree: logits {:?} ({:?}), targets {:?}",
        logits.dims(),
        logits.dtype(),
        targets.dims()
    );
    if on {
        let options = loss_options(reduction).with_check_targets(check_targets);
        liger_burn::functional::cross_entropy(logits, targets, None, options).loss
    } else {
        stock::cross_entropy(logits, targets, reduction)
    }
}

/// A linear layer with a LoRA adapter, the base frozen:
/// `x·weight + bias + s·(dropout(x)·Aᵀ)·Bᵀ` (see [`liger_burn::ops::LoraOptions`] for the
/// math and the adapter path's precision). `on`: liger-burn's LoRA op, whose node keeps the
/// adapter's input in its own dtype; `off`: the stock composition (PEFT's forward in Burn
/// ops, autodiff keeping the adapter's widened input).
///
/// - `x`: `[..., d_in]`; `weight`: `[d_in, d_out]` (Burn's layout); `bias`: `[d_out]`
/// - returns `[..., d_out]`
pub fn lora_linear<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    adapter: &LoraAdapter<B>,
    on: bool,
) -> Tensor<B, D> {
    if on {
        adapter.forward(x, weight, bias)
    } else {
        stock::lora_linear(x, weight, bias, adapter)
    }
}

/// LM head and cross entropy: `cross_entropy(hidden @ lm_head_weightᵀ, targets)`, plus
/// the LM head's LoRA adapter's update of the logits when there is one. With the fused op
/// on, the `[n, vocab]` logits are never materialized whole, and the adapter's gradients
/// come from the same chunked pass.
///
/// - `hidden`: `[n, hidden]`
/// - `lm_head_weight`: `[vocab, hidden]` (Hugging Face layout)
/// - `adapter`: the LM head's adapter (`A: [r, hidden]`, `B: [vocab, r]`)
/// - `targets`: `[n]`, in `0..vocab` or [`IGNORE_INDEX`]
/// - `lora_on`: with `on` off, whether the materialized logits' adapter path is
///   liger-burn's LoRA op (else the stock composition)
/// - `accumulation`: with `on`, the dtype the head's weight gradient is summed in over
///   the chunks
/// - `check_targets`: with `on`, whether the target range is read back to name an
///   out-of-range target (see `LigerConfig::check_targets`)
/// - returns f32 `[1]` (mean, sum) or `[n]` ([`Reduction::None`])
#[allow(clippy::too_many_arguments)]
pub fn fused_linear_cross_entropy<B: FusedOps>(
    hidden: Tensor<B, 2>,
    lm_head_weight: Tensor<B, 2>,
    adapter: Option<&LoraAdapter<B>>,
    targets: Tensor<B, 1, Int>,
    reduction: Reduction,
    on: bool,
    lora_on: bool,
    accumulation: WeightGradAccumulation,
    check_targets: bool,
) -> Tensor<B, 1> {
    let [n, h] = hidden.dims();
    let [_, hw] = lm_head_weight.dims();
    let [nt] = targets.dims();
    assert!(
        n == nt && h == hw,
        "fused_linear_cross_entropy: expected hidden [n, hidden], weight [vocab, hidden], \
         targets [n]; got hidden {:?} ({:?}), weight {:?} ({:?}), targets {:?}",
        hidden.dims(),
        hidden.dtype(),
        lm_head_weight.dims(),
        lm_head_weight.dtype(),
        targets.dims()
    );
    match (on, adapter) {
        (true, None) => {
            liger_burn::functional::fused_linear_cross_entropy(
                hidden,
                lm_head_weight,
                None,
                targets,
                None,
                loss_options(reduction)
                    .with_weight_grad_accumulation(accumulation)
                    .with_check_targets(check_targets),
            )
            .loss
        }
        (true, Some(adapter)) => {
            let head = adapter.head(&hidden);
            liger_burn::functional::fused_linear_cross_entropy_lora(
                hidden,
                lm_head_weight,
                None,
                Some(head),
                targets,
                None,
                loss_options(reduction)
                    .with_weight_grad_accumulation(accumulation)
                    .with_check_targets(check_targets),
            )
            .loss
        }
        (false, None) => {
            stock::fused_linear_cross_entropy(hidden, lm_head_weight, targets, reduction)
        }
        (false, Some(adapter)) => {
            let logits = lora_linear(hidden, lm_head_weight.transpose(), None, adapter, lora_on);
            stock::cross_entropy(logits, targets, reduction)
        }
    }
}

/// liger-burn's cross-entropy options for the models' loss: `ignore_index` -100, no
/// smoothing, no z-loss, `reduction`.
fn loss_options(reduction: Reduction) -> liger_burn::ops::CrossEntropyOptions {
    liger_burn::ops::CrossEntropyOptions {
        ignore_index: IGNORE_INDEX,
        reduction,
        ..Default::default()
    }
}

/// The stock Burn compositions (Hugging Face semantics).
pub mod stock {
    use super::*;

    /// See [`super::rms_norm`]: transformers' `LlamaRMSNorm.forward`.
    pub fn rms_norm<B: FusedOps, const D: usize>(
        x: Tensor<B, D>,
        weight: Tensor<B, 1>,
        eps: f64,
    ) -> Tensor<B, D> {
        let dtype = x.dtype();
        let xf = x.cast(DType::F32);
        let mean_square = xf.clone().square().mean_dim(D - 1);
        // 1 / sqrt by a division, not `recip()`: with burn-ndarray's `simd` feature,
        // NdArray's is an approximation on the buffer's aligned part only.
        let root = (mean_square + eps).sqrt();
        let normalized = xf * (root.ones_like() / root);
        let [d] = weight.dims();
        let mut shape = [1; D];
        shape[D - 1] = d;
        weight.reshape(shape) * normalized.cast(dtype)
    }

    /// `cat(-x[.., d/2..], x[.., ..d/2])` along the last dimension.
    fn rotate_half<B: FusedOps>(x: Tensor<B, 4>) -> Tensor<B, 4> {
        let d = x.dims()[3];
        let x1 = x.clone().narrow(3, 0, d / 2);
        let x2 = x.narrow(3, d / 2, d - d / 2);
        Tensor::cat(vec![x2.neg(), x1], 3)
    }

    /// See [`super::rope`]: transformers' `apply_rotary_pos_emb`.
    pub fn rope<B: FusedOps>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        cos: Tensor<B, 3>,
        sin: Tensor<B, 3>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let cos: Tensor<B, 4> = cos.unsqueeze_dim(1);
        let sin: Tensor<B, 4> = sin.unsqueeze_dim(1);
        let q_out = q.clone() * cos.clone() + rotate_half(q) * sin.clone();
        let k_out = k.clone() * cos + rotate_half(k) * sin;
        (q_out, k_out)
    }

    /// See [`super::swiglu`].
    pub fn swiglu<B: FusedOps, const D: usize>(
        gate: Tensor<B, D>,
        up: Tensor<B, D>,
    ) -> Tensor<B, D> {
        silu(gate) * up
    }

    /// See [`super::cross_entropy`]: `torch.nn.functional.cross_entropy(logits.float(),
    /// targets, ignore_index=-100)`, except that a mean over zero tokens is 0, not NaN.
    pub fn cross_entropy<B: FusedOps>(
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
        reduction: Reduction,
    ) -> Tensor<B, 1> {
        let log_probs = log_softmax(logits.cast(DType::F32), 1);
        let ignored = targets.clone().equal_elem(IGNORE_INDEX);
        // Any in-range index for the ignored rows; their loss is zeroed below.
        let safe = targets.mask_fill(ignored.clone(), 0);
        let picked: Tensor<B, 1> = log_probs.gather(1, safe.unsqueeze_dim(1)).squeeze_dim(1);
        let losses = picked.neg().mask_fill(ignored.clone(), 0.0);
        match reduction {
            Reduction::None => losses,
            Reduction::Sum => losses.sum(),
            Reduction::Mean => {
                let count = ignored.bool_not().int().sum().float().cast(DType::F32);
                losses.sum() / count.clamp_min(1.0)
            }
        }
    }

    /// See [`super::lora_linear`]: PEFT's `LoraLayer.forward` in Burn ops, the scale on the
    /// rank-`r` side as liger-burn's op applies it.
    pub fn lora_linear<B: FusedOps, const D: usize>(
        x: Tensor<B, D>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        adapter: &LoraAdapter<B>,
    ) -> Tensor<B, D> {
        use burn::tensor::module::linear;
        let dtype = x.dtype();
        let compute = adapter.precision.compute_dtype(dtype);
        let adapter_x = adapter.adapter_input(&x).unwrap_or_else(|| x.clone());
        let base = linear(x, weight, bias);
        let a = adapter.lora_a.val().cast(compute).transpose();
        let b = adapter.lora_b.val().cast(compute).transpose();
        let hidden = linear(adapter_x.cast(compute), a, None).mul_scalar(adapter.scale);
        let update = linear(hidden, b, None);
        if compute == DType::F32 && dtype != DType::F32 {
            (base.cast(DType::F32) + update).cast(dtype)
        } else {
            base + update
        }
    }

    /// See [`super::fused_linear_cross_entropy`]: materializes the logits.
    pub fn fused_linear_cross_entropy<B: FusedOps>(
        hidden: Tensor<B, 2>,
        lm_head_weight: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
        reduction: Reduction,
    ) -> Tensor<B, 1> {
        let logits = hidden.matmul(lm_head_weight.transpose());
        cross_entropy(logits, targets, reduction)
    }
}
