//! The linear layer with a bias from stock ops: the default bodies of
//! [`FusedOps::fused_linear`](crate::ops::FusedOps::fused_linear) and
//! [`FusedOps::fused_linear_weight_backward`](crate::ops::FusedOps::fused_linear_weight_backward).

use crate::ops::FusedOps;
use burn::tensor::{Shape, TensorMetadata, ops::FloatTensor};

/// `x [rows, d_in] · weight [d_in, d_out] + bias [d_out]` → `[rows, d_out]`: the product
/// (rounded to the inputs' dtype), then the bias broadcast over the rows and added.
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
) -> FloatTensor<B> {
    let d_out = bias.shape().num_elements();
    let bias = B::float_reshape(bias, Shape::new([1, d_out]));
    B::float_add(B::fused_matmul(x, weight), bias)
}

/// The weight's and the bias's gradients of [`forward`] from `x [rows, d_in]` and
/// `grad [rows, d_out]`: `xᵀ · grad` (`[d_in, d_out]`) and [`bias_grad`].
pub fn weight_backward<B: FusedOps>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let bias = bias_grad::<B>(grad.clone());
    let weight = B::fused_matmul(B::float_swap_dims(x, 0, 1), grad);
    (weight, bias)
}

/// `grad [rows, d_out]` summed over the rows, `[d_out]`: accumulated in f32 and rounded to
/// `grad`'s dtype once.
pub fn bias_grad<B: FusedOps>(grad: FloatTensor<B>) -> FloatTensor<B> {
    let (dtype, d_out) = (grad.dtype(), grad.shape()[1]);
    let sum = B::float_sum_dim(super::to_f32::<B>(grad), 0);
    super::to_dtype::<B>(B::float_reshape(sum, Shape::new([d_out])), dtype)
}
