//! [`FusedOps::fused_linear`](crate::ops::FusedOps::fused_linear) and
//! [`FusedOps::fused_linear_weight_backward`](crate::ops::FusedOps::fused_linear_weight_backward)
//! on `CubeBackend`: on the CUDA runtime one cuBLASLt call each, whose epilogue adds the
//! bias to the f32 accumulator (forward) or sums the output gradient over the rows while
//! the weight-gradient product reads it (backward); the default compositions everywhere
//! else and for what cuBLASLt declines (the reason logged at debug level).

use crate::ops::compose::linear as compose;
use burn::tensor::ops::FloatTensorOps;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// `x [rows, d_in] · weight [d_in, d_out] + bias [d_out]`.
pub(crate) fn linear<R, F, I, BT>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: CubeTensor<R>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    match vendor::forward::<R>(x, weight, bias) {
        Ok(out) => out,
        Err((x, weight, bias)) => compose::forward::<CubeBackend<R, F, I, BT>>(x, weight, bias),
    }
}

/// `(xᵀ · grad, Σ_rows grad)` for `x [rows, d_in]`, `grad [rows, d_out]`.
pub(crate) fn weight_backward<R, F, I, BT>(
    x: CubeTensor<R>,
    grad: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    let x_t = Cube::<R, F, I, BT>::float_swap_dims(x, 0, 1);
    match vendor::weight_backward::<R>(x_t, grad) {
        Ok(grads) => grads,
        Err((x_t, grad)) => {
            let x = Cube::<R, F, I, BT>::float_swap_dims(x_t, 0, 1);
            compose::weight_backward::<Cube<R, F, I, BT>>(x, grad)
        }
    }
}

#[cfg(feature = "cuda")]
mod vendor {
    use super::super::cublaslt::{Epilogue, Unavailable};
    use super::super::empty_like;
    use super::super::matmul::{cuda_product, known_type, same_type};
    use burn::tensor::{Shape, TensorMetadata};
    use burn_cubecl::CubeRuntime;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::cuda::CudaRuntime;
    use liger_cubecl_kernels::counters::{self, Kernel};

    type Cuda = CubeTensor<CudaRuntime>;

    /// `Ok` from the CUDA path, or the operands back (boxed as they came) when `R` is not
    /// CUDA or cuBLASLt declined (the reason logged).
    fn on_cuda<In: 'static, InCuda: 'static, Out: 'static, OutCuda: 'static>(
        op: &str,
        operands: In,
        run: impl FnOnce(InCuda) -> Result<OutCuda, (Unavailable, InCuda)>,
    ) -> Result<Out, In> {
        match run(same_type::<In, InCuda>(operands)?) {
            Ok(out) => {
                counters::record(Kernel::matmul_vendor);
                counters::record(Kernel::matmul_vendor_epilogue);
                Ok(known_type(out))
            }
            Err((why, operands)) => {
                log::debug!("liger {op}: the default composition on CUDA: {why}");
                Err(known_type(operands))
            }
        }
    }

    /// A `[len]` vector as the epilogue reads it: contiguous.
    fn dense_vector(v: Cuda) -> Cuda {
        if v.meta.strides().to_vec() == [1] {
            v
        } else {
            into_contiguous(v)
        }
    }

    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(super) fn forward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        bias: CubeTensor<R>,
    ) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        on_cuda::<_, (Cuda, Cuda, Cuda), _, Cuda>("linear", (x, weight, bias), |(x, w, b)| {
            let b = dense_vector(b);
            let out_shape = Shape::new([x.shape()[0], w.shape()[1]]);
            match cuda_product(x, w, out_shape, None, None, Epilogue::Bias(&b)) {
                Ok(out) => Ok(out),
                Err((why, x, w, _)) => Err((why, (x, w, b))),
            }
        })
    }

    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(super) fn weight_backward<R: CubeRuntime>(
        x_t: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> Result<(CubeTensor<R>, CubeTensor<R>), (CubeTensor<R>, CubeTensor<R>)> {
        on_cuda::<_, (Cuda, Cuda), _, (Cuda, Cuda)>(
            "linear weight backward",
            (x_t, grad),
            |(x_t, g)| {
                let (d_in, d_out) = (x_t.shape()[0], g.shape()[1]);
                let g_bias = empty_like(&g, Shape::new([d_out]), g.dtype);
                let out_shape = Shape::new([d_in, d_out]);
                let sums = Epilogue::RhsRowSums(&g_bias);
                match cuda_product(x_t, g, out_shape, None, None, sums) {
                    Ok(g_weight) => Ok((g_weight, g_bias)),
                    Err((why, x_t, g, _)) => Err((why, (x_t, g))),
                }
            },
        )
    }
}

#[cfg(not(feature = "cuda"))]
mod vendor {
    use burn_cubecl::CubeRuntime;
    use burn_cubecl::tensor::CubeTensor;

    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(super) fn forward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        bias: CubeTensor<R>,
    ) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        Err((x, weight, bias))
    }

    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(super) fn weight_backward<R: CubeRuntime>(
        x_t: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> Result<(CubeTensor<R>, CubeTensor<R>), (CubeTensor<R>, CubeTensor<R>)> {
        Err((x_t, grad))
    }
}
