//! Softmax and log-softmax over the last dimension as stock Burn ops.

use super::{to_dtype, to_f32};
use burn::tensor::{TensorMetadata, backend::Backend, ops::FloatTensor};

fn last_dim<B: Backend>(x: &FloatTensor<B>) -> usize {
    x.shape().num_dims() - 1
}

/// `exp(x - max) / sum(exp(x - max))`.
pub fn softmax<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = x.dtype();
    let dim = last_dim::<B>(&x);
    let xf = to_f32::<B>(x);
    let max = B::float_max_dim(xf.clone(), dim);
    let exp = B::float_exp(B::float_sub(xf, max));
    let sum = B::float_sum_dim(exp.clone(), dim);
    to_dtype::<B>(B::float_div(exp, sum), dtype)
}

/// `y * (grad - sum(grad * y))`.
pub fn softmax_backward<B: Backend>(
    grad: FloatTensor<B>,
    output: FloatTensor<B>,
) -> FloatTensor<B> {
    let dtype = output.dtype();
    let dim = last_dim::<B>(&output);
    let y = to_f32::<B>(output);
    let g = to_f32::<B>(grad);
    let dot = B::float_sum_dim(B::float_mul(g.clone(), y.clone()), dim);
    to_dtype::<B>(B::float_mul(y, B::float_sub(g, dot)), dtype)
}

/// `x - max - log(sum(exp(x - max)))`.
pub fn log_softmax<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = x.dtype();
    let dim = last_dim::<B>(&x);
    let xf = to_f32::<B>(x);
    let max = B::float_max_dim(xf.clone(), dim);
    let shifted = B::float_sub(xf, max);
    let lse = B::float_log(B::float_sum_dim(B::float_exp(shifted.clone()), dim));
    to_dtype::<B>(B::float_sub(shifted, lse), dtype)
}

/// `grad - exp(y) * sum(grad)`.
pub fn log_softmax_backward<B: Backend>(
    grad: FloatTensor<B>,
    output: FloatTensor<B>,
) -> FloatTensor<B> {
    let dtype = output.dtype();
    let dim = last_dim::<B>(&output);
    let y = to_f32::<B>(output);
    let g = to_f32::<B>(grad);
    let sum = B::float_sum_dim(g.clone(), dim);
    to_dtype::<B>(B::float_sub(g, B::float_mul(B::float_exp(y), sum)), dtype)
}
