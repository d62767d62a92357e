//! Exact GELU and sigmoid on CubeCL tensors.

use super::empty_like;
use super::glu::prepare;
use super::launched;
use burn::tensor::TensorMetadata;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::activation as kernels;

/// Which activation, forward and backward.
#[derive(Clone, Copy)]
pub(crate) enum Unary {
    Gelu,
    Sigmoid,
}

pub(crate) fn forward<R: CubeRuntime>(x: CubeTensor<R>, kind: Unary) -> CubeTensor<R> {
    let [x] = prepare([x]);
    let shape = x.shape();
    let len = shape.num_elements();
    let output = empty_like(&x, shape, x.dtype);
    let launch = match kind {
        Unary::Gelu => kernels::gelu_forward::<R>,
        Unary::Sigmoid => kernels::sigmoid_forward::<R>,
    };
    launched(launch(
        &x.client,
        &super::launch_config(&x.client),
        &x.handle,
        &output.handle,
        len,
        x.dtype.into(),
    ));
    output
}

/// `saved` is the input for GELU and the output for sigmoid.
pub(crate) fn backward<R: CubeRuntime>(
    grad: CubeTensor<R>,
    saved: CubeTensor<R>,
    kind: Unary,
) -> CubeTensor<R> {
    let [saved, grad] = prepare([saved, grad]);
    let shape = saved.shape();
    let len = shape.num_elements();
    let grad_x = empty_like(&saved, shape, saved.dtype);
    let launch = match kind {
        Unary::Gelu => kernels::gelu_backward::<R>,
        Unary::Sigmoid => kernels::sigmoid_backward::<R>,
    };
    launched(launch(
        &saved.client,
        &super::launch_config(&saved.client),
        &grad.handle,
        &saved.handle,
        &grad_x.handle,
        len,
        saved.dtype.into(),
    ));
    grad_x
}
