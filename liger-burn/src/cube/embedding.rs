//! The embedding gradient on CubeCL tensors.

use super::{empty_like, launched, rows_width};
use burn::tensor::{DType, IntDType, Shape, backend::Backend};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::embedding::embedding_backward;

/// See [`FusedOps::fused_embedding_backward`](crate::ops::FusedOps::fused_embedding_backward).
pub(super) fn backward<B, R: CubeRuntime>(
    grad: CubeTensor<R>,
    indices: CubeTensor<R>,
    num_embeddings: usize,
) -> CubeTensor<R>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>,
{
    let grad = into_contiguous(grad);
    // The kernel reads i32 or i64 indices; narrower or unsigned ones are widened to i32.
    let indices = match indices.dtype {
        DType::I32 | DType::I64 => indices,
        _ => B::int_cast(indices, IntDType::I32),
    };
    let indices = into_contiguous(indices);
    let (positions, width) = rows_width(grad.meta.shape());
    // Dense: the kernel writes rows `width` apart (Burn's own allocations may pad rows).
    let output = empty_like(&grad, Shape::new([num_embeddings, width]), grad.dtype);
    launched(embedding_backward::<R>(
        &grad.client,
        &grad.handle,
        &indices.handle,
        &output.handle,
        positions,
        width,
        num_embeddings,
        grad.dtype.into(),
        indices.dtype.into(),
    ));
    output
}
