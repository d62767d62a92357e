//! A LoRA linear layer from [`FusedOps::fused_matmul`] (cuBLASLt on CUDA) and elementwise
//! ops: the default bodies of [`FusedOps::fused_lora_linear`] and its backward, so every
//! backend runs it. See [`crate::ops::lora`] for the math and the precision.
//!
//! Forward, with `c` the compute dtype ([`AdapterPrecision::compute_dtype`]) and `s` the
//! scale: `h = (c(x_a)·c(A)ᵀ)·s` (`[rows, r]`, kept for the backward), `y_a = h·c(B)ᵀ`,
//! `y = x·W + b` in the activation dtype, then `y + y_a` (in f32 and rounded once for
//! [`AdapterPrecision::F32`]). The scale is applied on the rank-`r` side, where it costs
//! `rows·r` multiplications instead of `rows·d_out`; in f32 that moves one f32 rounding
//! against PEFT's `lora_B(lora_A(x)) * s`.
//!
//! Backward of an upstream `g: [rows, d_out]`: `grad_B = c(g)ᵀ·h`, `u = (c(g)·c(B))·s`,
//! `grad_A = uᵀ·c(x_a)`, the adapter path's input gradient `u·c(A)`, the base path's
//! `g·Wᵀ`; when `x_a` is `x` the two input gradients are added (in f32 for
//! [`AdapterPrecision::F32`], rounded once).
//!
//! [`FusedOps::fused_lora_linear`]: crate::ops::FusedOps::fused_lora_linear

use super::to_dtype;
use crate::ops::{
    AdapterPrecision, FusedOps, LoraLinearGrads, LoraLinearGradsWanted, LoraLinearOutput,
    LoraLinearParts, LoraOptions,
};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive, ops::FloatTensor};

fn float<B: FusedOps, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn prim<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// `a · b` through [`FusedOps::fused_matmul`].
fn matmul<B: FusedOps>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    float(B::fused_matmul(prim(a), prim(b)))
}

/// `x` cast to `dtype` (no-op when it has it).
pub(crate) fn cast<B: FusedOps>(x: Tensor<B, 2>, dtype: DType) -> Tensor<B, 2> {
    float(to_dtype::<B>(prim(x), dtype))
}

/// A LoRA layer's sizes: rows of `x: [..., d_in]`, `d_in`, `d_out` of
/// `weight: [d_in, d_out]` and the rank of `a: [r, d_in]`.
pub(crate) struct LayerDims {
    pub rows: usize,
    pub d_in: usize,
    pub d_out: usize,
    pub rank: usize,
}

impl LayerDims {
    pub(crate) fn of(
        x: &burn::tensor::Shape,
        weight: &burn::tensor::Shape,
        a: &burn::tensor::Shape,
    ) -> Self {
        let d_in = x[x.num_dims() - 1];
        LayerDims {
            rows: x.num_elements() / d_in.max(1),
            d_in,
            d_out: weight[1],
            rank: a[0],
        }
    }
}

/// `[..., d]` → `[rows, d]`.
pub(crate) fn rows<B: FusedOps>(x: FloatTensor<B>) -> FloatTensor<B> {
    let shape = x.shape();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d.max(1);
    B::float_reshape(x, burn::tensor::Shape::new([rows, d]))
}

/// `[rows, d]` → `[...lead, d]` with the leading dimensions of `like`.
pub(crate) fn unrows<B: FusedOps>(x: FloatTensor<B>, like: &burn::tensor::Shape) -> FloatTensor<B> {
    let d = x.shape()[1];
    let mut dims = like.to_vec();
    *dims.last_mut().expect("rank >= 1") = d;
    B::float_reshape(x, burn::tensor::Shape::from(dims))
}

/// [`rows`] as a 2-D tensor.
fn flat<B: FusedOps>(x: FloatTensor<B>) -> Tensor<B, 2> {
    float::<B, 2>(rows::<B>(x))
}

/// [`unrows`] of a 2-D tensor.
fn unflat<B: FusedOps>(x: Tensor<B, 2>, like: &burn::tensor::Shape) -> FloatTensor<B> {
    unrows::<B>(prim(x), like)
}

/// `base + adapter` where `base` is in the activation dtype `dtype` and `adapter` in the
/// compute dtype: in f32 and rounded once when the adapter path is f32 (PEFT's sum), else
/// in `dtype`.
pub(crate) fn add_adapter<B: FusedOps>(
    base: Tensor<B, 2>,
    adapter: Tensor<B, 2>,
    dtype: DType,
    precision: AdapterPrecision,
) -> Tensor<B, 2> {
    match precision {
        AdapterPrecision::F32 if dtype != DType::F32 => {
            cast(cast(base, DType::F32) + adapter, dtype)
        }
        _ => base + adapter,
    }
}

/// See [`FusedOps::fused_lora_linear`](crate::ops::FusedOps::fused_lora_linear).
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter_x: Option<FloatTensor<B>>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    options: LoraOptions,
) -> LoraLinearOutput<B> {
    let shape = x.shape();
    let dtype = x.dtype();
    let parts = B::fused_lora_linear_parts(x, weight, bias, adapter_x, a, b, options);
    sum_parts::<B>(parts, &shape, dtype, options)
}

/// The output of [`forward`] from its parts: `base + adapter` ([`add_adapter`]) shaped
/// `[...lead, d_out]` like `x: [...lead, d_in]` of dtype `dtype`.
pub fn sum_parts<B: FusedOps>(
    parts: LoraLinearParts<B>,
    shape: &burn::tensor::Shape,
    dtype: DType,
    options: LoraOptions,
) -> LoraLinearOutput<B> {
    let out = add_adapter::<B>(
        float(parts.base),
        float(parts.adapter),
        dtype,
        options.precision,
    );
    LoraLinearOutput {
        output: unflat::<B>(out, shape),
        hidden: parts.hidden,
    }
}

/// See [`FusedOps::fused_lora_linear_parts`](crate::ops::FusedOps::fused_lora_linear_parts).
pub fn parts<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter_x: Option<FloatTensor<B>>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    options: LoraOptions,
) -> LoraLinearParts<B> {
    let c = options.precision.compute_dtype(x.dtype());
    let x2 = flat::<B>(x);
    let xa = match adapter_x {
        Some(t) => flat::<B>(t),
        None => x2.clone(),
    };
    let mut base = matmul::<B>(x2, float(weight));
    if let Some(bias) = bias {
        let d = base.dims()[1];
        base = base + float::<B, 1>(bias).reshape([1, d]);
    }
    let a_c = cast::<B>(float(a), c);
    let b_c = cast::<B>(float(b), c);
    let hidden = matmul::<B>(cast::<B>(xa, c), a_c.transpose()).mul_scalar(options.scale);
    let adapter = matmul::<B>(hidden.clone(), b_c.transpose());
    LoraLinearParts {
        base: prim(base),
        adapter: prim(adapter),
        hidden: prim(hidden),
    }
}

/// Backward of [`forward`]: the gradients `wanted` asks for (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn backward<B: FusedOps>(
    grad_output: FloatTensor<B>,
    adapter_input: FloatTensor<B>,
    separate: bool,
    weight: FloatTensor<B>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    hidden: FloatTensor<B>,
    options: LoraOptions,
    wanted: LoraLinearGradsWanted,
) -> LoraLinearGrads<B> {
    let x_shape = adapter_input.shape();
    let dtype = adapter_input.dtype();
    let (a_dtype, b_dtype) = (a.dtype(), b.dtype());
    let c = options.precision.compute_dtype(dtype);
    let g = flat::<B>(grad_output);
    let g_c = cast::<B>(g.clone(), c);
    let a_c = cast::<B>(float(a), c);
    let b_c = cast::<B>(float(b), c);
    let grad_b = wanted.b.then(|| {
        prim(cast::<B>(
            matmul::<B>(g_c.clone().transpose(), float(hidden)),
            b_dtype,
        ))
    });
    let adapter_input_grad = wanted.x && !separate || wanted.adapter_x && separate;
    // u = s·(g·B): the gradient of the rank-r hidden before its scale.
    let u =
        (wanted.a || adapter_input_grad).then(|| matmul::<B>(g_c, b_c).mul_scalar(options.scale));
    let grad_a = match (&u, wanted.a) {
        (Some(u), true) => Some(prim(cast::<B>(
            matmul::<B>(
                u.clone().transpose(),
                cast::<B>(flat::<B>(adapter_input), c),
            ),
            a_dtype,
        ))),
        _ => None,
    };
    let adapter_grad = match (u, adapter_input_grad) {
        (Some(u), true) => Some(matmul::<B>(u, a_c)),
        _ => None,
    };
    // The base path: g·Wᵀ (W is [d_in, d_out]; its transpose is a view).
    let base_x = wanted
        .x
        .then(|| matmul::<B>(g, float::<B, 2>(weight).transpose()));
    let (grad_x, grad_adapter_x) = if separate {
        (
            base_x.map(|t| unflat::<B>(t, &x_shape)),
            adapter_grad.map(|t| unflat::<B>(cast::<B>(t, dtype), &x_shape)),
        )
    } else {
        let sum = match (base_x, adapter_grad) {
            (Some(base), Some(adapter)) => {
                Some(add_adapter::<B>(base, adapter, dtype, options.precision))
            }
            (base, _) => base,
        };
        (sum.map(|t| unflat::<B>(t, &x_shape)), None)
    };
    LoraLinearGrads {
        grad_x,
        grad_adapter_x,
        grad_a,
        grad_b,
    }
}
