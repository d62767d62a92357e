//! Exact GELU and sigmoid, forward and backward, as stock Burn ops (computed in f32,
//! rounded once to the input dtype, like the kernels).

use super::{reciprocal, to_dtype, to_f32};
use burn::tensor::{TensorMetadata, backend::Backend, ops::FloatTensor};
use core::f64::consts::{FRAC_1_SQRT_2, PI};

/// `Φ(x) = (1 + erf(x / √2)) / 2`, f32 in and out.
fn normal_cdf<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let erf = B::float_erf(B::float_mul_scalar(x, FRAC_1_SQRT_2.into()));
    B::float_mul_scalar(B::float_add_scalar(erf, 1.0.into()), 0.5.into())
}

/// `x Φ(x)`.
pub fn gelu<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = x.dtype();
    let x = to_f32::<B>(x);
    to_dtype::<B>(B::float_mul(x.clone(), normal_cdf::<B>(x)), dtype)
}

/// `grad (Φ(x) + x φ(x))`, `φ(x) = exp(-x²/2) / √(2π)`.
pub fn gelu_backward<B: Backend>(grad: FloatTensor<B>, x: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = x.dtype();
    let x = to_f32::<B>(x);
    let g = to_f32::<B>(grad);
    let half_sq = B::float_mul_scalar(B::float_mul(x.clone(), x.clone()), (-0.5).into());
    let pdf = B::float_mul_scalar(B::float_exp(half_sq), (1.0 / (2.0 * PI).sqrt()).into());
    let d = B::float_add(normal_cdf::<B>(x.clone()), B::float_mul(x, pdf));
    to_dtype::<B>(B::float_mul(g, d), dtype)
}

/// `1 / (1 + exp(-x))`, f32 in and out.
pub(crate) fn sigmoid_f32<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    reciprocal::<B>(B::float_add_scalar(
        B::float_exp(B::float_neg(x)),
        1.0.into(),
    ))
}

/// `1 / (1 + exp(-x))`.
pub fn sigmoid<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = x.dtype();
    to_dtype::<B>(sigmoid_f32::<B>(to_f32::<B>(x)), dtype)
}

/// `grad y (1 - y)` from the output `y`.
pub fn sigmoid_backward<B: Backend>(
    grad: FloatTensor<B>,
    output: FloatTensor<B>,
) -> FloatTensor<B> {
    let dtype = output.dtype();
    let y = to_f32::<B>(output);
    let g = to_f32::<B>(grad);
    let one_minus = B::float_add_scalar(B::float_neg(y.clone()), 1.0.into());
    to_dtype::<B>(B::float_mul(g, B::float_mul(y, one_minus)), dtype)
}
