//! The functional API: fused ops on `burn::tensor::Tensor`s, for any backend that
//! implements [`FusedOps`] (CubeCL backends fused, every other backend through the exact
//! stock-op composition), with autodiff when the backend has it.
//!
//! Every function validates its inputs first and panics with a message naming the op,
//! the shapes and the dtypes (Burn's convention for invalid tensor input): this is where
//! validation runs, once; the [`FusedOps`] primitives it calls assume valid input.

use crate::ops::compose::cross_entropy::reciprocal_or_zero;
use crate::ops::validate::{self, NormInputs, kernel_dtypes};
use crate::ops::{FusedOps, RmsNormOptions};
use burn::tensor::{Tensor, TensorPrimitive};

mod divergence;
mod fused_linear_distill;
mod fused_linear_preference;
mod fused_linear_rl;
mod sequences;

pub use divergence::{divergence, jsd, kl_div, tvd};
pub use fused_linear_distill::{DistillLossOutput, fused_linear_distill};
pub use fused_linear_preference::{
    PreferenceLossOutput, PreferenceMetrics, Reference, fused_linear_preference,
};
pub use fused_linear_rl::{
    GrpoLossOutput, KtoLossOutput, KtoMetrics, TokenReference, fused_linear_grpo, fused_linear_kto,
};

fn prim<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    x.into_primitive().tensor()
}

fn wrap<B: FusedOps, const D: usize>(x: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn check_norm<B: FusedOps, const D: usize>(
    op: &'static str,
    x: &Tensor<B, D>,
    weight: &Tensor<B, 1>,
    bias: Option<&Tensor<B, 1>>,
) {
    validate::check(validate::norm(&NormInputs {
        op,
        x: (x.shape(), x.dtype()),
        weight: (weight.shape(), weight.dtype()),
        bias: bias.map(|b| (b.shape(), b.dtype())),
        kernel_dtypes: kernel_dtypes::<B>(x.dtype()),
    }));
}

/// Identity that marks a point of the backward pass where the memory kept for it can go
/// back to the device (see [`FusedOps::memory_release_point`]): once the gradient reaches
/// `x`, the device pool's free buffers are released, then the gradient flows on. Put it on
/// the input of each repeated block (a decoder layer) when the pool reuses buffers by size
/// only. No effect without autodiff.
///
/// - `x`: any shape; returned as is.
pub fn memory_release_point<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    wrap(B::memory_release_point(prim(x)))
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * (offset + weight)`.
///
/// - `x`: `[..., d_model]`
/// - `weight`: `[d_model]`
/// - returns `[..., d_model]`
///
/// NaN/Inf: as PyTorch (transformers' `LlamaRMSNorm`/`GemmaRMSNorm`): a NaN in a row makes
/// its output and input gradient NaN; an infinity makes the row's `rstd` 0, so its output
/// is 0 but NaN at the infinity (`∞·0`) and its input gradient NaN; the weight gradient is
/// NaN in the columns of such elements. A NaN/±∞ weight gives NaN/±∞ in its column (NaN
/// where `x̂ = 0`) and NaN input gradients.
///
/// # Panics
/// On mismatched shapes or dtypes, and when `options.eps` is not positive and finite.
pub fn rms_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    options: RmsNormOptions,
) -> Tensor<B, D> {
    check_norm("rms_norm", &x, &weight, None);
    validate::check(validate::eps("rms_norm", options.eps, Some(&x.shape())));
    wrap(B::fused_rms_norm(prim(x), prim(weight), options).output)
}

/// Residual add then RMSNorm in one pass.
///
/// - `x`, `residual`: `[..., d_model]`
/// - `weight`: `[d_model]`
/// - returns `(rms_norm(x + residual), x + residual)`, both `[..., d_model]`
///
/// NaN/Inf: as PyTorch: the sum is IEEE addition (`∞ + -∞` is NaN), then [`rms_norm`]'s.
///
/// # Panics
/// On mismatched shapes or dtypes, and when `options.eps` is not positive and finite.
pub fn fused_add_rms_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    residual: Tensor<B, D>,
    weight: Tensor<B, 1>,
    options: RmsNormOptions,
) -> (Tensor<B, D>, Tensor<B, D>) {
    validate::check(validate::same_shape_dtype(
        "fused_add_rms_norm",
        ("x", &x.shape(), x.dtype()),
        ("residual", &residual.shape(), residual.dtype()),
    ));
    check_norm("fused_add_rms_norm", &x, &weight, None);
    validate::check(validate::eps(
        "fused_add_rms_norm",
        options.eps,
        Some(&x.shape()),
    ));
    let out = B::fused_add_rms_norm(prim(x), prim(residual), prim(weight), options);
    (wrap(out.output), wrap(out.sum))
}

/// LayerNorm over the last dimension: `(x - mean) / sqrt(var + eps) * gamma + beta`.
///
/// - `x`: `[..., d_model]`
/// - `gamma`, `beta`: `[d_model]`
/// - returns `[..., d_model]`
///
/// NaN/Inf: as PyTorch (`F.layer_norm`): a NaN or an infinity in a row makes its variance
/// NaN, so the row's output and input gradient are NaN, and so is the weight gradient
/// (the bias gradient, `Σ dy`, is not); a NaN/±∞ in `gamma` or `beta` stays in its column.
///
/// # Panics
/// On mismatched shapes or dtypes, and when `eps` is not positive and finite.
pub fn layer_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
) -> Tensor<B, D> {
    check_norm("layer_norm", &x, &gamma, beta.as_ref());
    validate::check(validate::eps("layer_norm", eps, Some(&x.shape())));
    wrap(B::fused_layer_norm(prim(x), prim(gamma), beta.map(prim), eps).output)
}

fn along_last<B: FusedOps, const D: usize>(
    op: &str,
    x: Tensor<B, D>,
    dim: usize,
    f: impl FnOnce(burn::tensor::ops::FloatTensor<B>) -> burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    assert!(
        dim < D,
        "{op}: dim {dim} is out of range for a tensor of rank {D} (shape {:?})",
        x.shape()
    );
    validate::check(validate::rows(
        op,
        (&x.shape(), x.dtype()),
        kernel_dtypes::<B>(x.dtype()),
    ));
    if dim == D - 1 {
        wrap(f(prim(x)))
    } else {
        // The kernels reduce the last dimension; other dims go through a transpose.
        wrap::<B, D>(f(prim(x.swap_dims(dim, D - 1)))).swap_dims(dim, D - 1)
    }
}

/// Softmax along `dim` (fused along the last dimension). `x`: any shape; same shape out.
///
/// NaN/Inf: as PyTorch (`torch.softmax`): a row holding NaN or +∞, or only −∞, is NaN
/// (output and gradient); a −∞ in another row has probability 0 and gradient 0.
pub fn softmax<B: FusedOps, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    along_last("softmax", x, dim, B::fused_softmax)
}

/// Log-softmax along `dim` (fused along the last dimension). `x`: any shape; same shape out.
///
/// NaN/Inf: as PyTorch (`torch.log_softmax`): a row holding NaN or +∞, or only −∞, is NaN
/// (output and gradient); a −∞ in another row stays −∞ and gets the upstream gradient.
pub fn log_softmax<B: FusedOps, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    along_last("log_softmax", x, dim, B::fused_log_softmax)
}

fn glu<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    activation: crate::ops::GluActivation,
) -> Tensor<B, D> {
    validate::check(validate::elementwise(
        activation.op_name(),
        &[
            ("gate", &gate.shape(), gate.dtype()),
            ("up", &up.shape(), up.dtype()),
        ],
        kernel_dtypes::<B>(gate.dtype()),
    ));
    wrap(B::fused_glu(prim(gate), prim(up), activation))
}

/// SwiGLU, the gated unit of the Llama/Qwen/Mistral MLP: `silu(gate) * up`, in one pass
/// (forward and backward), computed in f32 and rounded once.
///
/// - `gate`, `up`: `[..., d_ff]` (e.g. `[batch, seq, d_ff]`), same shape and dtype
/// - returns `[..., d_ff]`
///
/// NaN/Inf: as PyTorch (`F.silu(gate) * up`), elementwise: `silu(+∞) = +∞`,
/// `silu(−∞) = NaN` (`−∞·σ(−∞) = −∞·0`), the gate gradient at ±∞ is NaN, and an infinite
/// `up` where `silu(gate) = 0` gives NaN.
pub fn swiglu<B: FusedOps, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    glu(gate, up, crate::ops::GluActivation::Silu)
}

fn glu_linear<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    weight: Tensor<B, 2>,
    activation: crate::ops::GluActivation,
) -> Tensor<B, D> {
    let op = match activation {
        crate::ops::GluActivation::Silu => "swiglu_linear",
        crate::ops::GluActivation::GeluTanh => "geglu_linear",
    };
    validate::check(validate::elementwise(
        op,
        &[
            ("gate", &gate.shape(), gate.dtype()),
            ("up", &up.shape(), up.dtype()),
        ],
        kernel_dtypes::<B>(gate.dtype()),
    ));
    validate::check(validate::glu_linear_weight(
        op,
        (&gate.shape(), gate.dtype()),
        (&weight.shape(), weight.dtype()),
    ));
    wrap(B::fused_glu_linear(
        prim(gate),
        prim(up),
        prim(weight),
        activation,
    ))
}

/// A gated MLP's down projection on its SwiGLU unit, `(silu(gate) * up) · weight`, whose
/// backward recomputes `silu(gate) * up` instead of keeping it (the `[..., d_ff]` tensor a
/// `Linear` after [`swiglu`] keeps for its weight's gradient): Llama's
/// `down_proj(act_fn(gate_proj(x)) * up_proj(x))` with one activation-sized tensor less
/// per layer, for one more elementwise pass in the backward. Add the bias, if any, to the
/// result.
///
/// - `gate`, `up`: `[..., d_ff]`, same shape and dtype
/// - `weight`: `[d_ff, d_out]` (Burn's `Linear` layout), same dtype
/// - returns `[..., d_out]`
///
/// NaN/Inf: as [`swiglu`] followed by the product.
///
/// # Panics
/// On mismatched shapes or dtypes.
pub fn swiglu_linear<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    weight: Tensor<B, 2>,
) -> Tensor<B, D> {
    glu_linear(gate, up, weight, crate::ops::GluActivation::Silu)
}

/// [`swiglu_linear`] with GeGLU's `gelu_tanh(gate) * up` (Gemma's MLP).
///
/// - `gate`, `up`: `[..., d_ff]`, same shape and dtype
/// - `weight`: `[d_ff, d_out]`, same dtype
/// - returns `[..., d_out]`
///
/// # Panics
/// On mismatched shapes or dtypes.
pub fn geglu_linear<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    weight: Tensor<B, 2>,
) -> Tensor<B, D> {
    glu_linear(gate, up, weight, crate::ops::GluActivation::GeluTanh)
}

/// GeGLU, the gated unit of the Gemma MLP: `gelu_tanh(gate) * up` with PyTorch's
/// `gelu(approximate="tanh")`, in one pass (forward and backward).
///
/// - `gate`, `up`: `[..., d_ff]` (e.g. `[batch, seq, d_ff]`), same shape and dtype
/// - returns `[..., d_ff]`
///
/// NaN/Inf: as PyTorch (`F.gelu(gate, approximate="tanh") * up`), elementwise:
/// `gelu(+∞) = +∞`, `gelu(−∞) = NaN`, the gate gradient at ±∞ is NaN, and an infinite
/// `up` where `gelu(gate) = 0` gives NaN.
pub fn geglu<B: FusedOps, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    glu(gate, up, crate::ops::GluActivation::GeluTanh)
}

/// Embedding lookup: the rows of `weights` (`[num_embeddings, d]`) at `indices` (`[batch,
/// seq]`), `[batch, seq, d]`. The table's gradient sums the output gradient's rows of
/// repeated indices in f32 and rounds once to the table's dtype, deterministically (as
/// PyTorch's `embedding` backward), where Burn's own sums them in the table's dtype. On
/// `Liger<_>` backends `burn::nn::Embedding` runs the same.
///
/// Indices must lie in `[0, num_embeddings)`; they are not read back to check (that would
/// wait for the device). The gradient kernel adds nothing for an index outside.
pub fn embedding<B: FusedOps>(
    weights: Tensor<B, 2>,
    indices: Tensor<B, 2, burn::tensor::Int>,
) -> Tensor<B, 3> {
    validate::check(validate::rows(
        "embedding",
        (&weights.shape(), weights.dtype()),
        kernel_dtypes::<B>(weights.dtype()),
    ));
    wrap(B::fused_embedding(prim(weights), indices.into_primitive()))
}

/// A linear layer, `x · weight (+ bias)`, as `burn::tensor::module::linear` (Burn's
/// `[d_in, d_out]` weight layout), over the leading dims of `x` folded into rows. With a
/// bias the product and the bias add are one op: on CUDA one cuBLASLt call that adds the
/// bias to the f32 accumulator and rounds once, and whose backward sums the bias's
/// gradient while the weight-gradient product reads the output gradient. On `Liger<_>`
/// backends `burn::nn::Linear` runs the same.
///
/// - `x`: `[..., d_in]` (rank ≥ 2, e.g. `[batch, seq, d_in]`); `weight`: `[d_in, d_out]`;
///   `bias`: `[d_out]`; one float dtype
/// - returns `[..., d_out]`
pub fn linear<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    wrap(crate::backend::overrides::linear::<B>(
        prim(x),
        prim(weight),
        bias.map(prim),
    ))
}

/// Exact GELU, `0.5 x (1 + erf(x / sqrt(2)))`, with the exact derivative in the backward.
/// `x`: any shape (not empty); same shape out. On `Liger<_>` backends Burn's own
/// `burn::tensor::activation::gelu` runs the same kernel.
///
/// NaN/Inf: as PyTorch (`F.gelu`): `gelu(+∞) = +∞`, `gelu(−∞) = NaN` (`−∞·Φ(−∞) = −∞·0`),
/// and the gradient at ±∞ is NaN (`±∞·φ(±∞)`).
pub fn gelu<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    validate::check(validate::rows(
        "gelu",
        (&x.shape(), x.dtype()),
        kernel_dtypes::<B>(x.dtype()),
    ));
    wrap(B::fused_gelu(prim(x)))
}

/// Sigmoid, `1 / (1 + exp(-x))`; the backward works from the output. `x`: any shape (not
/// empty); same shape out. On `Liger<_>` backends Burn's own
/// `burn::tensor::activation::sigmoid` runs the same kernel.
///
/// NaN/Inf: as PyTorch (`torch.sigmoid`): `σ(+∞) = 1`, `σ(−∞) = 0`, gradient 0 at both.
pub fn sigmoid<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    validate::check(validate::rows(
        "sigmoid",
        (&x.shape(), x.dtype()),
        kernel_dtypes::<B>(x.dtype()),
    ));
    wrap(B::fused_sigmoid(prim(x)))
}

/// Rotary position embedding of q and k, fused: one kernel launch rotates both
/// (forward), and one launch computes both gradients (backward).
///
/// `out = x·cos + rot(x)·sin` per row of `head_dim`; `layout` says which elements pair
/// up ([`RopeLayout::RotateHalf`](crate::ops::RopeLayout::RotateHalf) for Hugging Face Llama/Qwen/Mistral,
/// [`RopeLayout::Interleaved`](crate::ops::RopeLayout::Interleaved) for `burn::nn::RotaryEncoding`).
///
/// - `q`: `[batch, q_heads, seq, head_dim]`
/// - `k`: `[batch, kv_heads, seq, head_dim]` (`kv_heads` may differ from `q_heads`)
/// - `cos`, `sin`: `[1 or batch, seq, head_dim]`, q's dtype, full `head_dim` wide (see
///   [`rope_tables`]); position offsets and frequency scaling live in the tables.
/// - returns the rotated `(q, k)`, same shapes, contiguous
///
/// q and k may be non-contiguous views (e.g. `[batch, seq, heads, head_dim]` after
/// `swap_dims(1, 2)`); the kernel reads them through their strides. `head_dim` must be
/// even. The tables are treated as constants: **no gradient flows into `cos` or `sin`**
/// (they are built from positions, not learned); gradients flow into q and k.
///
/// NaN/Inf: as PyTorch (transformers' `q * cos + rotate_half(q) * sin`): elementwise IEEE
/// math, so an infinity times a zero table entry is NaN (at position 0, `sin = 0`); the
/// gradients do not depend on q and k.
pub fn rope<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
    layout: crate::ops::RopeLayout,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    validate::check(validate::rope(&validate::RopeInputs {
        op: "rope",
        rotated: [
            Some(("q", q.shape(), q.dtype())),
            Some(("k", k.shape(), k.dtype())),
        ],
        cos: (cos.shape(), cos.dtype()),
        sin: (sin.shape(), sin.dtype()),
        kernel_dtypes: kernel_dtypes::<B>(q.dtype()),
    }));
    let out = B::fused_rope(prim(q), prim(k), prim(cos), prim(sin), layout);
    (wrap(out.q), wrap(out.k))
}

/// Softmax attention that keeps nothing `[seq, seq]`-sized for the backward:
/// `softmax(mask(q·kᵀ·scale))·v`. On CubeCL backends with tensor cores for the dtype
/// (CUDA in f16/bf16, head_dim a multiple of 16 up to 256) the flash kernels run it;
/// elsewhere, transformers' eager attention (scores in the input dtype, the masked softmax
/// in f32) in blocks of query rows, the backward recomputing each block's probabilities.
/// Exact either way: no approximation beyond the rounding of the input dtype.
/// [`AttentionOptions::kernel`](crate::ops::AttentionOptions::kernel) overrides the choice;
/// see [`FusedOps::fused_attention`](crate::ops::FusedOps::fused_attention).
///
/// - `q`: `[batch, q_heads, seq, head_dim]`
/// - `k`, `v`: `[batch, kv_heads, seq, head_dim]`, `q_heads` a multiple of `kv_heads`
///   (grouped-query attention: each k/v head serves `q_heads / kv_heads` query heads)
/// - `mask`: `[seq, seq]`, `true` where query `i` must not see key `j`, combined with the
///   mask of `options` (`causal`: `j > i`; `window`: `i - j >= window`); or `None`: only
///   the mask of `options`, built per block from positions, so no `[seq, seq]` tensor exists
///   (it would pass 32-bit indexing at 46K tokens). A given mask always takes the blockwise
///   path. A query that sees no key gets output 0 and no gradient.
/// - returns `[batch, q_heads, seq, head_dim]`, q's dtype
///
/// # Panics
/// On mismatched shapes or dtypes, naming them, and on `options.window == Some(0)`.
pub fn attention<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 2, burn::tensor::Bool>>,
    options: crate::ops::AttentionOptions,
) -> Tensor<B, 4> {
    attend(q, k, v, mask, None, options)
}

/// [`attention`] over packed sequences: query `i` of batch row `b` sees only the keys of its
/// own document, `document_ids[b, j] == document_ids[b, i]` (and, with the options, only
/// earlier keys, within the window). The flash kernels skip every key block outside the
/// query block's documents when ids do not decrease along a row (documents laid end to
/// end); any ids are correct.
///
/// - `document_ids`: `[batch, seq]`, int
/// - the rest as [`attention`]
///
/// # Panics
/// On mismatched shapes or dtypes, naming them.
pub fn attention_with_documents<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    document_ids: Tensor<B, 2, burn::tensor::Int>,
    options: crate::ops::AttentionOptions,
) -> Tensor<B, 4> {
    attend(q, k, v, None, Some(document_ids), options)
}

fn attend<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 2, burn::tensor::Bool>>,
    document_ids: Option<Tensor<B, 2, burn::tensor::Int>>,
    options: crate::ops::AttentionOptions,
) -> Tensor<B, 4> {
    validate::check(validate::attention(&validate::AttentionInputs {
        op: "attention",
        q: (q.shape(), q.dtype()),
        k: (k.shape(), k.dtype()),
        v: (v.shape(), v.dtype()),
        mask: mask.as_ref().map(|m| m.shape()),
        document_ids: document_ids.as_ref().map(|d| (d.shape(), d.dtype())),
        window: options.window,
    }));
    wrap(
        B::fused_attention(
            prim(q),
            prim(k),
            prim(v),
            mask.map(|m| m.into_primitive()),
            document_ids.map(|d| d.into_primitive()),
            options,
        )
        .output,
    )
}

/// cos/sin tables for [`rope`], as Hugging Face builds them: inverse frequencies
/// `1 / theta^(2i / head_dim)` for `i < head_dim / 2` (optionally with Llama 3.1
/// scaling), angles `position · inv_freq[i]`.
///
/// - `positions`: the position of each of the `seq` rows (`0..seq`, or `start..start + seq`
///   for a KV-cache offset, or any list)
/// - returns `(cos, sin)`, each `[1, seq, head_dim]` of `dtype`: `RotateHalf` repeats the
///   `head_dim / 2` values (`cos[j] = cos[j + head_dim/2]`), `Interleaved` repeats each
///   one for its pair (`cos[2i] = cos[2i + 1]`)
///
/// Computed in f64 and rounded once to `dtype`. (`transformers` computes the angles in
/// f32, so its tables differ from these by the f32 rounding of `position · inv_freq`,
/// about `position · 6e-8` radians; the f64 values are the exact ones.)
///
/// # Panics
/// On an odd `head_dim`, a `theta` that is not positive and finite, a non-float `dtype`,
/// or invalid `scaling` parameters ([`Llama3RopeScaling::check`](crate::ops::Llama3RopeScaling::check)).
#[allow(clippy::too_many_arguments)]
pub fn rope_tables<B: burn::tensor::backend::Backend>(
    theta: f64,
    head_dim: usize,
    positions: impl IntoIterator<Item = usize>,
    scaling: Option<crate::ops::Llama3RopeScaling>,
    layout: crate::ops::RopeLayout,
    dtype: burn::tensor::DType,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    assert!(
        head_dim > 0 && head_dim.is_multiple_of(2),
        "rope_tables: head_dim must be even and positive, got {head_dim}"
    );
    assert!(
        theta.is_finite() && theta > 0.0,
        "rope_tables: theta must be positive, got {theta}"
    );
    assert!(
        dtype.is_float(),
        "rope_tables: dtype must be a float type, got {dtype:?}"
    );
    if let Some(Err(e)) = scaling.map(|s| s.check()) {
        panic!("rope_tables: {e}");
    }
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| {
            let f = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            scaling.map_or(f, |s| s.scale(f))
        })
        .collect();
    let frequency = |j: usize| match layout {
        crate::ops::RopeLayout::RotateHalf => inv_freq[j % half],
        crate::ops::RopeLayout::Interleaved => inv_freq[j / 2],
    };
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    let mut seq = 0;
    for pos in positions {
        for j in 0..head_dim {
            let angle = pos as f64 * frequency(j);
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
        seq += 1;
    }
    let make = |values: Vec<f64>| {
        Tensor::<B, 3>::from_data(
            burn::tensor::TensorData::new(values, [1, seq, head_dim]),
            (device, dtype),
        )
    };
    (make(cos), make(sin))
}

/// Output of [`cross_entropy`] and [`fused_linear_cross_entropy`].
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput<B: burn::tensor::backend::Backend> {
    /// The loss: `[1]` for [`Reduction::Mean`](crate::ops::Reduction::Mean) and
    /// [`Reduction::Sum`](crate::ops::Reduction::Sum), `[N]` per row for
    /// [`Reduction::None`](crate::ops::Reduction::None). Its gradient reaches the logits.
    pub loss: Tensor<B, 1>,
    /// The z-loss part of `loss` (`λ lse²`, reduced the same way), when
    /// `options.return_z_loss`; for logging, it carries no gradient of its own.
    pub z_loss: Option<Tensor<B, 1>>,
}

/// Cross entropy of `logits` against integer `targets`, fused: one kernel computes the
/// per-row loss and, when the logits are tracked by autodiff, their gradient, written over
/// the logits buffer when nothing else holds it. No `[N, V]` softmax is ever stored.
///
/// - `logits`: `[N, V]` (f32, f16 or bf16 on the kernels; any float on the fallback)
/// - `targets`: `[N]`, class indices in `[0, V)` or `options.ignore_index`
/// - `class_weight`: `[V]`, optional per-class weights (PyTorch's `weight`); they get no
///   gradient (they are treated as constants)
/// - returns the loss (`[1]` or `[N]`, see [`CrossEntropyOutput`]) and optionally the z-loss
///
/// The math, the mean's denominator, the all-ignored case and the target check are
/// documented on [`CrossEntropyOptions`](crate::ops::CrossEntropyOptions). With
/// `check_targets` (default) this reads one number back from the device (the count of
/// bad targets) before it returns; the read is queued ahead of the loss's kernel, so the
/// device computes the loss while the host waits for the count.
///
/// The backward costs nothing when the loss is reduced (mean or sum) and the upstream
/// gradient is exactly 1 (plain `loss.backward()`): the gradient was computed in the
/// forward. Otherwise it is one pass over `[N, V]`.
///
/// NaN/Inf: as PyTorch (`F.cross_entropy`, and Liger-Kernel's z-loss `λ·logsumexp²` with
/// `torch.logsumexp`); see [`CrossEntropyOptions`](crate::ops::CrossEntropyOptions) for
/// the rows and the one exception (ignored rows).
pub fn cross_entropy<B: FusedOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<Tensor<B, 1>>,
    options: crate::ops::CrossEntropyOptions,
) -> CrossEntropyOutput<B> {
    cross_entropy_with_denominator(logits, targets, class_weight, options, None)
}

/// [`cross_entropy`] whose mean divides by `denominator` (`[1]`, f32, on the device)
/// instead of `Σ_{non-ignored} w[y_i]` (the modules use it for Burn's denominators).
pub(crate) fn cross_entropy_with_denominator<B: FusedOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<Tensor<B, 1>>,
    options: crate::ops::CrossEntropyOptions,
    denominator: Option<Tensor<B, 1>>,
) -> CrossEntropyOutput<B> {
    use crate::ops::Reduction;
    const OP: &str = "cross_entropy";
    validate::check(validate::cross_entropy(
        &validate::CrossEntropyInputs {
            op: OP,
            logits: (logits.shape(), logits.dtype()),
            targets: (targets.shape(), targets.dtype()),
            class_weight: class_weight.as_ref().map(|w| (w.shape(), w.dtype())),
            grad_scale: None,
            z_loss_scale: None,
            kernel_dtypes: kernel_dtypes::<B>(logits.dtype()),
        },
        &options,
    ));
    let vocab = logits.dims()[1];
    let logits_shape = logits.shape();
    // Class weights are constants of the loss.
    let class_weight = class_weight.map(|w| w.detach());
    // A mean divides the z-loss by the non-ignored rows and the rest by the denominator
    // (`Σ w[y]` by default): they differ with class weights or another denominator.
    let z_scaled = options.reduction == Reduction::Mean
        && options.lse_square_scale != 0.0
        && (class_weight.is_some() || denominator.is_some());
    let mean_of_targets = options.reduction == Reduction::Mean && denominator.is_none();
    let stats = (options.check_targets || z_scaled || mean_of_targets)
        .then(|| target_stats(&targets, class_weight.as_ref(), vocab, options.ignore_index));
    let check = stats
        .as_ref()
        .filter(|_| options.check_targets)
        .map(|stats| {
            TargetCheck::new(
                wrap(stats.out_of_range.clone()),
                &targets,
                vocab,
                options.ignore_index,
            )
        });
    let z_scale = z_scaled.then(|| wrap(stats.as_ref().expect("statistics").row_scale.clone()));
    let scale = match (options.reduction, denominator) {
        (Reduction::Mean, Some(d)) => Some(reciprocal_or_zero(d)),
        (Reduction::Mean, None) => Some(wrap(
            stats.as_ref().expect("statistics").weight_scale.clone(),
        )),
        (Reduction::Sum | Reduction::None, _) => None,
    };
    // Asked only when autodiff tracks the logits (the Autodiff backend decides too).
    let grad_scale = logits.is_require_grad().then(|| {
        scale.clone().unwrap_or_else(|| {
            Tensor::<B, 1>::ones([1], &logits.device()).cast(burn::tensor::DType::F32)
        })
    });
    let kernel_options = options.with_return_z_loss(options.return_z_loss || z_scale.is_some());
    let rows = B::fused_cross_entropy(
        prim(logits),
        targets.into_primitive(),
        class_weight.map(prim),
        grad_scale.clone().map(prim),
        grad_scale.and(z_scale.clone()).map(prim),
        kernel_options,
    );
    let reduce = |t: Tensor<B, 1>, s: &Option<Tensor<B, 1>>| match (s, options.reduction) {
        (Some(s), _) => t.sum() * s.clone(),
        (None, Reduction::Sum) => t.sum(),
        (None, _) => t,
    };
    let z_rows = rows.z_loss.map(wrap);
    let loss = match (&z_scale, &scale, &z_rows) {
        // `Σ loss_i · s + Σ zl_i · (s_z − s)`: the rows' losses hold the z-loss at the
        // scale `s`; only the loss rows are differentiated (the forward's gradient
        // already has each part at its own scale).
        (Some(s_z), Some(s), Some(z)) => {
            reduce(wrap(rows.loss), &scale) + z.clone().sum() * (s_z.clone() - s.clone())
        }
        _ => reduce(wrap(rows.loss), &scale),
    };
    let z_loss_scale = z_scale.or(scale);
    let out = CrossEntropyOutput {
        loss,
        z_loss: z_rows
            .filter(|_| options.return_z_loss)
            .map(|z| reduce(z, &z_loss_scale)),
    };
    if let Some(check) = check {
        check.finish(OP, &logits_shape);
    }
    out
}

/// [`FusedOps::fused_target_stats`] of tensors: one launch on the fused backends, queued
/// before the loss so that its scales are on the device when the loss's kernels run.
pub(crate) fn target_stats<B: FusedOps>(
    targets: &Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<&Tensor<B, 1>>,
    vocab: usize,
    ignore_index: i64,
) -> crate::ops::TargetStats<B> {
    B::fused_target_stats(
        targets.clone().into_primitive(),
        class_weight.map(|w| prim(w.clone())),
        vocab,
        ignore_index,
    )
}

/// A check that every target is in `[0, V)` or `ignore_index`, queued before a loss: the
/// count of bad targets from [`target_stats`], whose read starts before the loss's kernels
/// are queued ([`FusedOps::start_read`]) and is waited for by [`TargetCheck::finish`] once
/// they are submitted, so the device runs the loss while the host waits for the count. The
/// kernels treat a bad target's row as ignored (its target is never an index), so nothing
/// has read out of bounds before the panic.
pub(crate) struct TargetCheck<B: FusedOps> {
    out_of_range: crate::ops::PendingRead,
    targets: Tensor<B, 1, burn::tensor::Int>,
    vocab: usize,
    ignore_index: i64,
}

impl<B: FusedOps> TargetCheck<B> {
    /// The check of `targets` on the count `out_of_range` of [`target_stats`]: its read
    /// starts here.
    pub(crate) fn new(
        out_of_range: Tensor<B, 1>,
        targets: &Tensor<B, 1, burn::tensor::Int>,
        vocab: usize,
        ignore_index: i64,
    ) -> Self {
        Self {
            out_of_range: B::start_read(prim(out_of_range)),
            targets: targets.clone(),
            vocab,
            ignore_index,
        }
    }

    /// Queues the statistics the check reads (no class weights: only the count is used)
    /// and starts reading the count.
    pub(crate) fn queue(
        targets: &Tensor<B, 1, burn::tensor::Int>,
        vocab: usize,
        ignore_index: i64,
    ) -> Self {
        let stats = target_stats(targets, None, vocab, ignore_index);
        Self::new(wrap(stats.out_of_range), targets, vocab, ignore_index)
    }

    /// Submits the work queued since (the loss), then waits for the count and panics
    /// naming `op`, the offending target and `V` when a target is bad; only then are the
    /// targets' bounds computed, to name a value.
    pub(crate) fn finish(self, op: &str, logits_shape: &burn::tensor::Shape) {
        let Self {
            out_of_range,
            targets,
            vocab,
            ignore_index,
        } = self;
        B::submit_queued(&targets.device());
        let out_of_range = out_of_range.wait().iter::<f32>().next().expect("one count");
        if out_of_range != 0.0 {
            let bounds: Vec<i64> = target_bounds(&targets, ignore_index)
                .into_data()
                .iter::<i64>()
                .collect();
            // A bad target lies below 0 (then it is the smallest) or at V or above.
            let bad = if bounds[0] < 0 { bounds[0] } else { bounds[1] };
            panic!(
                "{op}: target {bad} is out of range [0, {vocab}) for logits {logits_shape:?} (and is not ignore_index {ignore_index})"
            );
        }
    }
}

/// The smallest and largest target that is not `ignore_index` (`[2]`, on the device, 0
/// for an all-ignored batch), for naming a bad target in [`TargetCheck::finish`].
pub(crate) fn target_bounds<B: FusedOps>(
    targets: &Tensor<B, 1, burn::tensor::Int>,
    ignore_index: i64,
) -> Tensor<B, 1, burn::tensor::Int> {
    let ignored = targets.clone().equal_elem(ignore_index);
    let kept = targets.clone().mask_fill(ignored, 0);
    Tensor::cat(vec![kept.clone().min(), kept.max()], 0)
}

/// Linear layer then cross entropy, fused: `cross_entropy(x weightᵀ + bias, targets)`
/// without ever holding the `[N, V]` logits (chunked over rows; see
/// [`compose::linear_cross_entropy`](crate::ops::compose::linear_cross_entropy) for the
/// chunk size and the f32 weight-gradient accumulator it costs, `V·H·4` bytes).
///
/// - `x`: `[N, H]` (e.g. the flattened `[batch · seq, d_model]` final hidden states)
/// - `weight`: `[V, H]` (PyTorch's `lm_head.weight` layout; for a `burn::nn::Linear`,
///   whose weight is `[H, V]`, pass its transpose — a view, no copy)
/// - `bias`: `[V]`, optional
/// - `targets`: `[N]`, class indices in `[0, V)` or `options.ignore_index`
/// - `class_weight`: `[V]`, optional per-class weights (no gradient)
/// - returns the loss (`[1]` or `[N]`) and optionally the z-loss, as [`cross_entropy`]
///
/// When autodiff tracks `x`, `weight` or `bias`, their gradients are computed in the
/// forward pass; the backward only scales them by the upstream gradient (nothing at all
/// when it is exactly 1, e.g. plain `loss.backward()` on a mean). Under reduction none
/// with per-row upstream gradients other than 1 the backward repeats the chunked pass.
///
/// NaN/Inf: as PyTorch's `x @ weight.T + bias` then [`cross_entropy`]: the logits follow
/// IEEE matmul (`∞·0` is NaN), then cross entropy's rules; a NaN row of the logits
/// gradient makes the whole weight and bias gradients NaN, as in PyTorch.
pub fn fused_linear_cross_entropy<B: FusedOps>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<Tensor<B, 1>>,
    options: crate::ops::CrossEntropyOptions,
) -> CrossEntropyOutput<B> {
    const OP: &str = "fused_linear_cross_entropy";
    validate::check(validate::linear_cross_entropy(
        OP,
        (x.shape(), x.dtype()),
        (weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())),
        (targets.shape(), targets.dtype()),
        class_weight.as_ref().map(|w| (w.shape(), w.dtype())),
        &options,
    ));
    check_logits_dtype(OP, &x);
    let vocab = weight.dims()[0];
    let logits_shape = burn::tensor::Shape::new([x.dims()[0], vocab]);
    let check = options
        .check_targets
        .then(|| TargetCheck::queue(&targets, vocab, options.ignore_index));
    let compute_grad = x.is_require_grad()
        || weight.is_require_grad()
        || bias.as_ref().is_some_and(|b| b.is_require_grad());
    let out = B::fused_linear_cross_entropy(
        prim(x),
        prim(weight),
        bias.map(prim),
        targets.into_primitive(),
        class_weight.map(|w| prim(w.detach())),
        compute_grad,
        options,
    );
    if let Some(check) = check {
        check.finish(OP, &logits_shape);
    }
    CrossEntropyOutput {
        loss: wrap(out.loss),
        z_loss: out.z_loss.map(wrap),
    }
}

/// The chunks' logits of a fused linear loss over `x` reach the fused cross entropy in
/// `x`'s dtype: one `B`'s fused primitives must take.
pub(crate) fn check_logits_dtype<B: FusedOps, const D: usize>(op: &str, x: &Tensor<B, D>) {
    validate::check(validate::fused_dtype(
        op,
        "x",
        (&x.shape(), x.dtype()),
        B::fused_dtype_supported(x.dtype()),
    ));
}

/// A LoRA adapter on the LM head of [`fused_linear_cross_entropy_lora`]: `A: [r, H]`,
/// `B: [V, r]` (PEFT's `lora_A.weight`, `lora_B.weight`), trained; `x`: the adapter's input
/// when it is not the loss's `x` (`dropout(x)`), `[N, H]`.
#[derive(Debug, Clone)]
pub struct LoraHeadAdapter<B: burn::tensor::backend::Backend> {
    /// The adapter's separate input, if any.
    pub x: Option<Tensor<B, 2>>,
    /// `A`, `[r, H]`.
    pub a: Tensor<B, 2>,
    /// `B`, `[V, r]`.
    pub b: Tensor<B, 2>,
    /// Scale and precision.
    pub options: crate::ops::LoraOptions,
}

/// [`fused_linear_cross_entropy`] with a LoRA adapter on the LM head:
/// `cross_entropy(x weightᵀ + bias + s·(x_a Aᵀ) Bᵀ, targets)`, chunked over rows, the
/// merged weight and the `[N, V]` logits never built; the adapter's gradients are computed
/// in the same pass from each chunk's logits gradient and accumulated in f32 (Liger-Kernel's
/// fused linear cross entropy takes `lm_head.weight` only: under PEFT it silently trains
/// no LM-head adapter). See [`crate::ops::lora`] for the math and the precision, and
/// [`compose::linear_cross_entropy`](crate::ops::compose::linear_cross_entropy) for the
/// chunks.
///
/// - `x`: `[N, H]`; `weight`: `[V, H]` (a frozen LM head gets no gradient, and none is
///   computed: untracked inputs cost nothing); `bias`: `[V]`
/// - `adapter`: `None` is [`fused_linear_cross_entropy`]
/// - `targets`: `[N]`; `class_weight`: `[V]` (no gradient)
/// - returns the loss (`[1]` or `[N]`) and optionally the z-loss, as [`cross_entropy`]
pub fn fused_linear_cross_entropy_lora<B: FusedOps>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    adapter: Option<LoraHeadAdapter<B>>,
    targets: Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<Tensor<B, 1>>,
    options: crate::ops::CrossEntropyOptions,
) -> CrossEntropyOutput<B> {
    const OP: &str = "fused_linear_cross_entropy_lora";
    validate::check(validate::linear_cross_entropy(
        OP,
        (x.shape(), x.dtype()),
        (weight.shape(), weight.dtype()),
        bias.as_ref().map(|b| (b.shape(), b.dtype())),
        (targets.shape(), targets.dtype()),
        class_weight.as_ref().map(|w| (w.shape(), w.dtype())),
        &options,
    ));
    check_logits_dtype(OP, &x);
    let vocab = weight.dims()[0];
    if let Some(ad) = &adapter {
        let (xs, as_, bs) = (x.shape(), ad.a.shape(), ad.b.shape());
        let xa = ad.x.as_ref().map(|t| t.shape());
        validate::check(validate::adapter(&validate::AdapterInputs {
            op: OP,
            x: (&xs, x.dtype()),
            adapter_x: xa
                .as_ref()
                .map(|s| (s, ad.x.as_ref().map_or(x.dtype(), |t| t.dtype()))),
            a: (&as_, ad.a.dtype()),
            b: (&bs, ad.b.dtype()),
            d_in: x.dims()[1],
            d_out: vocab,
            options: &ad.options,
        }));
    }
    let logits_shape = burn::tensor::Shape::new([x.dims()[0], vocab]);
    let check = options
        .check_targets
        .then(|| TargetCheck::queue(&targets, vocab, options.ignore_index));
    // Outside autodiff: the gradients of the inputs marked as requiring one.
    let wanted = crate::ops::LinearCrossEntropyGradsWanted {
        x: x.is_require_grad(),
        weight: weight.is_require_grad(),
        bias: bias.as_ref().is_some_and(|b| b.is_require_grad()),
        adapter_x: adapter
            .as_ref()
            .and_then(|a| a.x.as_ref())
            .is_some_and(|t| t.is_require_grad()),
        a: adapter.as_ref().is_some_and(|a| a.a.is_require_grad()),
        b: adapter.as_ref().is_some_and(|a| a.b.is_require_grad()),
    };
    let out = B::fused_lora_linear_cross_entropy(
        prim(x),
        prim(weight),
        bias.map(prim),
        adapter.map(|ad| crate::ops::LoraHead {
            x: ad.x.map(prim),
            a: prim(ad.a),
            b: prim(ad.b),
            options: ad.options,
        }),
        targets.into_primitive(),
        class_weight.map(|w| prim(w.detach())),
        wanted,
        options,
    );
    if let Some(check) = check {
        check.finish(OP, &logits_shape);
    }
    CrossEntropyOutput {
        loss: wrap(out.loss),
        z_loss: out.z_loss.map(wrap),
    }
}

/// A linear layer with a LoRA adapter, the base frozen: `x·weight + bias + s·(x_a·Aᵀ)·Bᵀ`
/// without the merged weight. The backward gives `A`, `B`, `x` and `x_a` their gradients;
/// the weight and bias get none (see [`crate::ops::lora`] for the math, and
/// [`AdapterPrecision`](crate::ops::AdapterPrecision) for where the adapter path computes).
///
/// - `x`: `[..., d_in]`
/// - `weight`: `[d_in, d_out]` (Burn's `Linear` layout), `bias`: `[d_out]`: constants; one
///   that requires a gradient is refused (LoRA keeps the base frozen: mark it with
///   `set_require_grad(false)`)
/// - `adapter_x`: the adapter's input when it is not `x` (`dropout(x)`), like `x`
/// - `a`: `[r, d_in]`, `b`: `[d_out, r]` (PEFT's `lora_A.weight`, `lora_B.weight`)
/// - returns `[..., d_out]` in `x`'s dtype
pub fn lora_linear<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    adapter_x: Option<Tensor<B, D>>,
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
    options: crate::ops::LoraOptions,
) -> Tensor<B, D> {
    const OP: &str = "lora_linear";
    if weight.is_require_grad() || bias.as_ref().is_some_and(|t| t.is_require_grad()) {
        panic!(
            "{OP}: the base weight {:?} (or its bias) requires a gradient, but LoRA keeps the \
             base frozen and computes none for it; mark it with set_require_grad(false) (or \
             detach it) so no optimizer expects one",
            weight.dims()
        );
    }
    let (x, weight, bias, adapter_x, a, b) = (
        prim(x),
        prim(weight),
        bias.map(prim),
        adapter_x.map(prim),
        prim(a),
        prim(b),
    );
    validate::check(
        validate::lora_linear_tensors(
            OP,
            &x,
            &weight,
            bias.as_ref(),
            adapter_x.as_ref(),
            &a,
            &b,
            &options,
        )
        .map(|_| ()),
    );
    wrap(B::fused_lora_linear(x, weight, bias, adapter_x, a, b, options).output)
}
