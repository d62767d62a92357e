//! The embedding gradient from stock ops: the default body of
//! [`FusedOps::fused_embedding_backward`](crate::ops::FusedOps::fused_embedding_backward).

use burn::tensor::{
    DType, FloatDType, Shape, TensorMetadata,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

/// `grad [..., d]`, `indices [...]` → `[num_embeddings, d]`: Burn's `select_add` of the
/// gradient rows into zeros, in f32 (so repeated indices are summed in f32 and rounded to
/// the gradient's dtype once, as the fused kernel does).
pub fn backward<B: Backend>(
    grad: FloatTensor<B>,
    indices: IntTensor<B>,
    num_embeddings: usize,
) -> FloatTensor<B> {
    let shape = grad.shape();
    let d = shape[shape.num_dims() - 1];
    let positions = indices.shape().num_elements();
    let dtype = grad.dtype();
    let device = B::float_device(&grad);
    let grad = super::to_f32::<B>(B::float_reshape(grad, Shape::new([positions, d])));
    let indices = B::int_reshape(indices, Shape::new([positions]));
    let zeros = B::float_zeros(Shape::new([num_embeddings, d]), &device, FloatDType::F32);
    let sum = B::float_select_add(zeros, 0, indices, grad);
    if dtype == DType::F32 {
        sum
    } else {
        B::float_cast(sum, dtype.into())
    }
}
