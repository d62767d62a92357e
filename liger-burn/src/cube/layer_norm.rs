//! LayerNorm on CubeCL tensors.

use super::{empty_like, launched, prepare_norm, rows_width};
use crate::ops::{LayerNormOutput, NormGrads, row_stat_shape};
use burn::tensor::{DType, TensorMetadata, backend::Backend};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::layer_norm::{layer_norm_backward, layer_norm_forward};

pub(crate) fn forward<B, R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    beta: Option<CubeTensor<R>>,
    eps: f64,
) -> LayerNormOutput<B>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let (x, gamma) = prepare_norm(x, gamma);
    let beta = beta.map(into_contiguous);
    let shape = x.shape();
    let (rows, width) = rows_width(&shape);
    let output = empty_like(&x, shape.clone(), x.dtype);
    let mean = empty_like(&x, row_stat_shape(&shape), DType::F32);
    let rstd = empty_like(&x, row_stat_shape(&shape), DType::F32);
    launched(layer_norm_forward::<R>(
        &x.client,
        &super::launch_config(&x.client),
        &x.handle,
        &gamma.handle,
        beta.as_ref().map(|b| &b.handle),
        &output.handle,
        &mean.handle,
        &rstd.handle,
        rows,
        width,
        eps as f32,
        x.dtype.into(),
    ));
    LayerNormOutput { output, mean, rstd }
}

pub(crate) fn backward<B, R: CubeRuntime>(
    grad: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    mean: CubeTensor<R>,
    rstd: CubeTensor<R>,
    has_bias: bool,
) -> NormGrads<B>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let (x, gamma) = prepare_norm(x, gamma);
    let grad = into_contiguous(grad);
    let mean = into_contiguous(mean);
    let rstd = into_contiguous(rstd);
    let shape = x.shape();
    let (rows, width) = rows_width(&shape);
    let grad_x = empty_like(&x, shape, x.dtype);
    let grad_gamma = empty_like(&x, gamma.shape(), gamma.dtype);
    let grad_beta = has_bias.then(|| empty_like(&x, gamma.shape(), gamma.dtype));
    launched(layer_norm_backward::<R>(
        &x.client,
        &super::launch_config(&x.client),
        &grad.handle,
        &x.handle,
        &gamma.handle,
        &mean.handle,
        &rstd.handle,
        &grad_x.handle,
        &grad_gamma.handle,
        grad_beta.as_ref().map(|b| &b.handle),
        rows,
        width,
        x.dtype.into(),
    ));
    NormGrads {
        grad_input: grad_x,
        grad_weight: grad_gamma,
        grad_bias: grad_beta,
    }
}
