//! RMSNorm on CubeCL tensors.

use super::{empty_like, launched, prepare_norm, rows_width};
use crate::ops::{NormGrads, RmsNormCasting, RmsNormOptions, RmsNormOutput, row_stat_shape};
use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::rms_norm::{RmsNormKernelOptions, rms_norm_backward, rms_norm_forward};

fn kernel_options(options: RmsNormOptions) -> RmsNormKernelOptions {
    RmsNormKernelOptions {
        eps: options.eps as f32,
        offset: options.offset as f32,
        gemma: options.casting == RmsNormCasting::Gemma,
    }
}

/// Forward; with a residual also returns `x + residual`.
pub(crate) fn forward<B, R: CubeRuntime>(
    x: CubeTensor<R>,
    residual: Option<CubeTensor<R>>,
    weight: CubeTensor<R>,
    options: RmsNormOptions,
) -> (RmsNormOutput<B>, Option<CubeTensor<R>>)
where
    B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let (x, weight) = prepare_norm(x, weight);
    let residual = residual.map(into_contiguous);
    let shape = x.shape();
    let (rows, width) = rows_width(&shape);
    let output = empty_like(&x, shape.clone(), x.dtype);
    let rstd = empty_like(&x, row_stat_shape(&shape), DType::F32);
    let sum = residual
        .as_ref()
        .map(|_| empty_like(&x, shape.clone(), x.dtype));
    launched(rms_norm_forward::<R>(
        &x.client,
        &super::launch_config(&x.client),
        &x.handle,
        residual
            .as_ref()
            .zip(sum.as_ref())
            .map(|(r, s)| (&r.handle, &s.handle)),
        &weight.handle,
        &output.handle,
        &rstd.handle,
        rows,
        width,
        kernel_options(options),
        x.dtype.into(),
    ));
    (RmsNormOutput { output, rstd }, sum)
}

pub(crate) fn backward<B, R: CubeRuntime>(
    grad: CubeTensor<R>,
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    rstd: CubeTensor<R>,
    options: RmsNormOptions,
) -> NormGrads<B>
where
    B: burn::tensor::backend::Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let (x, weight) = prepare_norm(x, weight);
    let grad = into_contiguous(grad);
    let rstd = into_contiguous(rstd);
    let shape = x.shape();
    let (rows, width) = rows_width(&shape);
    let grad_x = empty_like(&x, shape, x.dtype);
    let grad_weight = empty_like(&x, weight.shape(), weight.dtype);
    launched(rms_norm_backward::<R>(
        &x.client,
        &super::launch_config(&x.client),
        &grad.handle,
        &x.handle,
        &weight.handle,
        &rstd.handle,
        &grad_x.handle,
        &grad_weight.handle,
        rows,
        width,
        kernel_options(options),
        x.dtype.into(),
    ));
    NormGrads {
        grad_input: grad_x,
        grad_weight,
        grad_bias: None,
    }
}
