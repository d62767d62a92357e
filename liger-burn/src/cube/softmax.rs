//! Softmax and log-softmax on CubeCL tensors.

use super::{empty_like, launched, rows_width};
use burn::tensor::TensorMetadata;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::softmax::{softmax_backward, softmax_forward};

pub(crate) fn forward<R: CubeRuntime>(x: CubeTensor<R>, log: bool) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let shape = x.shape();
    let (rows, width) = rows_width(&shape);
    let output = empty_like(&x, shape, x.dtype);
    launched(softmax_forward::<R>(
        &x.client,
        &super::launch_config(&x.client),
        &x.handle,
        &output.handle,
        rows,
        width,
        log,
        x.dtype.into(),
    ));
    output
}

pub(crate) fn backward<R: CubeRuntime>(
    grad: CubeTensor<R>,
    output: CubeTensor<R>,
    log: bool,
) -> CubeTensor<R> {
    let grad = into_contiguous(grad);
    let output = into_contiguous(output);
    let shape = output.shape();
    let (rows, width) = rows_width(&shape);
    let grad_x = empty_like(&output, shape, output.dtype);
    launched(softmax_backward::<R>(
        &output.client,
        &super::launch_config(&output.client),
        &grad.handle,
        &output.handle,
        &grad_x.handle,
        rows,
        width,
        log,
        output.dtype.into(),
    ));
    grad_x
}
