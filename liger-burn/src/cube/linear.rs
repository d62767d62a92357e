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
    use super::super::cublaslt::{self, Epilogue, Product, Unavailable};
    use super::super::empty_like;
    use super::super::matmul::blas_operands;
    use burn::tensor::{Shape, TensorMetadata};
    use burn_cubecl::CubeRuntime;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::cuda::CudaRuntime;
    use liger_cubecl_kernels::counters::{self, Kernel};
    use std::any::Any;

    type Cuda = CubeTensor<CudaRuntime>;

    /// `Ok` from the CUDA path, or the operands back (boxed as they came) when `R` is not
    /// CUDA or cuBLASLt declined (the reason logged).
    fn on_cuda<R: CubeRuntime, In: 'static, InCuda: 'static, Out: 'static, OutCuda: 'static>(
        op: &str,
        operands: In,
        run: impl FnOnce(InCuda) -> Result<OutCuda, (Unavailable, InCuda)>,
    ) -> Result<Out, In> {
        let boxed: Box<dyn Any> = Box::new(operands);
        let back: Box<dyn Any> = match boxed.downcast::<InCuda>() {
            Ok(cuda) => match run(*cuda) {
                Ok(out) => {
                    counters::record(Kernel::matmul_vendor);
                    counters::record(Kernel::matmul_vendor_epilogue);
                    let out: Box<dyn Any> = Box::new(out);
                    return Ok(*out.downcast::<Out>().expect("R is CUDA"));
                }
                Err((why, operands)) => {
                    log::debug!("liger {op}: the default composition on CUDA: {why}");
                    Box::new(operands)
                }
            },
            Err(other) => other,
        };
        Err(*back
            .downcast::<In>()
            .expect("the operands as they were boxed"))
    }

    /// Whether cuBLASLt is set up for `t`'s dtype on its device.
    fn usable(t: &Cuda) -> Result<(), Unavailable> {
        cublaslt::data_type(t.dtype)?;
        cublaslt::device_support(&t.device).map(|_| ())
    }

    /// A `[len]` vector as the epilogue reads it: contiguous.
    fn dense_vector(v: Cuda) -> Cuda {
        if v.meta.strides().to_vec() == [1] {
            v
        } else {
            into_contiguous(v)
        }
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn forward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        bias: CubeTensor<R>,
    ) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        on_cuda::<R, _, (Cuda, Cuda, Cuda), _, Cuda>("linear", (x, weight, bias), |(x, w, b)| {
            let (rows, d_in, d_out) = (x.shape()[0], x.shape()[1], w.shape()[1]);
            if rows == 0 || d_in == 0 || d_out == 0 {
                let why = Unavailable::NoAlgorithm("an empty product".into());
                return Err((why, (x, w, b)));
            }
            if let Err(why) = usable(&x) {
                return Err((why, (x, w, b)));
            }
            let b = dense_vector(b);
            let out = empty_like(&x, Shape::new([rows, d_out]), x.dtype);
            let (x, w, layout) = blas_operands(x, w, &[rows, d_out]);
            let product = Product {
                lhs: &x,
                rhs: &w,
                out: &out,
                layout: &layout,
                accumulate: false,
                alpha: 1.0,
                epilogue: Epilogue::Bias(&b),
            };
            match cublaslt::run(&x.device.clone(), product, None) {
                Ok(_) => Ok(out),
                Err(why) => Err((why, (x, w, b))),
            }
        })
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn weight_backward<R: CubeRuntime>(
        x_t: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> Result<(CubeTensor<R>, CubeTensor<R>), (CubeTensor<R>, CubeTensor<R>)> {
        on_cuda::<R, _, (Cuda, Cuda), _, (Cuda, Cuda)>(
            "linear weight backward",
            (x_t, grad),
            |(x_t, g)| {
                let (d_in, rows, d_out) = (x_t.shape()[0], x_t.shape()[1], g.shape()[1]);
                if rows == 0 || d_in == 0 || d_out == 0 {
                    let why = Unavailable::NoAlgorithm("an empty product".into());
                    return Err((why, (x_t, g)));
                }
                if let Err(why) = usable(&g) {
                    return Err((why, (x_t, g)));
                }
                let g_weight = empty_like(&g, Shape::new([d_in, d_out]), g.dtype);
                let g_bias = empty_like(&g, Shape::new([d_out]), g.dtype);
                let (x_t, g, layout) = blas_operands(x_t, g, &[d_in, d_out]);
                let product = Product {
                    lhs: &x_t,
                    rhs: &g,
                    out: &g_weight,
                    layout: &layout,
                    accumulate: false,
                    alpha: 1.0,
                    epilogue: Epilogue::RhsRowSums(&g_bias),
                };
                match cublaslt::run(&g.device.clone(), product, None) {
                    Ok(_) => Ok((g_weight, g_bias)),
                    Err(why) => Err((why, (x_t, g))),
                }
            },
        )
    }
}

#[cfg(not(feature = "cuda"))]
mod vendor {
    use burn_cubecl::CubeRuntime;
    use burn_cubecl::tensor::CubeTensor;

    #[allow(clippy::type_complexity)]
    pub(super) fn forward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: CubeTensor<R>,
        bias: CubeTensor<R>,
    ) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        Err((x, weight, bias))
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn weight_backward<R: CubeRuntime>(
        x_t: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> Result<(CubeTensor<R>, CubeTensor<R>), (CubeTensor<R>, CubeTensor<R>)> {
        Err((x_t, grad))
    }
}
