//! The standalone GELU (exact, erf) and sigmoid kernels, forward and backward, on the
//! shared elementwise kernel of [`crate::elementwise`] with the math of
//! [`crate::pointwise`].

use crate::counters::{self, Kernel};
use crate::elementwise::{Pass, launch};
use crate::launch::{KernelError, LaunchConfig};
use crate::pointwise::Activation;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Exact GELU forward: `output = x Φ(x)`. `x, output`: `len` contiguous elements of `dtype`.
pub fn gelu_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    x: &Handle,
    output: &Handle,
    len: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    launch(
        "gelu",
        client,
        &config.elementwise,
        &[x],
        &[output],
        len,
        Pass::Unary,
        Activation::Gelu,
        dtype,
    )?;
    counters::record(Kernel::gelu_forward);
    Ok(())
}

/// Exact GELU backward from the input: `grad_x = grad · (Φ(x) + x φ(x))`.
/// `grad, x, grad_x`: `len` contiguous elements of `dtype`.
pub fn gelu_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    x: &Handle,
    grad_x: &Handle,
    len: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    launch(
        "gelu_backward",
        client,
        &config.elementwise,
        &[grad, x],
        &[grad_x],
        len,
        Pass::UnaryBackward,
        Activation::Gelu,
        dtype,
    )?;
    counters::record(Kernel::gelu_backward);
    Ok(())
}

/// Sigmoid forward. `x, output`: `len` contiguous elements of `dtype`.
pub fn sigmoid_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    x: &Handle,
    output: &Handle,
    len: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    launch(
        "sigmoid",
        client,
        &config.elementwise,
        &[x],
        &[output],
        len,
        Pass::Unary,
        Activation::Sigmoid,
        dtype,
    )?;
    counters::record(Kernel::sigmoid_forward);
    Ok(())
}

/// Sigmoid backward from the output: `grad_x = grad · y (1 - y)`.
/// `grad, output, grad_x`: `len` contiguous elements of `dtype`.
pub fn sigmoid_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    output: &Handle,
    grad_x: &Handle,
    len: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    launch(
        "sigmoid_backward",
        client,
        &config.elementwise,
        &[grad, output],
        &[grad_x],
        len,
        Pass::UnaryBackward,
        Activation::Sigmoid,
        dtype,
    )?;
    counters::record(Kernel::sigmoid_backward);
    Ok(())
}
