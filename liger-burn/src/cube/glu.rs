//! Gated linear units (SwiGLU, GeGLU) on CubeCL tensors.

use super::{empty_like, launched};
use crate::ops::GluActivation;
use burn::tensor::TensorMetadata;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::glu::{self as kernels, glu_backward, glu_forward};

fn kernel_activation(activation: GluActivation) -> kernels::GluActivation {
    match activation {
        GluActivation::Silu => kernels::GluActivation::Silu,
        GluActivation::GeluTanh => kernels::GluActivation::GeluTanh,
    }
}

/// Elementwise operands, dense.
pub(crate) fn prepare<R: CubeRuntime, const N: usize>(
    tensors: [CubeTensor<R>; N],
) -> [CubeTensor<R>; N] {
    tensors.map(into_contiguous)
}

pub(crate) fn forward<R: CubeRuntime>(
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    activation: GluActivation,
) -> CubeTensor<R> {
    let [gate, up] = prepare([gate, up]);
    let shape = gate.shape();
    let len = shape.num_elements();
    let output = empty_like(&gate, shape, gate.dtype);
    launched(glu_forward::<R>(
        &gate.client,
        &super::launch_config(&gate.client),
        &gate.handle,
        &up.handle,
        &output.handle,
        len,
        kernel_activation(activation),
        gate.dtype.into(),
    ));
    output
}

/// `(grad_gate, grad_up)`, and the unit `act(gate) · up` from the same pass when `unit`.
pub(crate) fn backward<R: CubeRuntime>(
    grad: CubeTensor<R>,
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    activation: GluActivation,
    unit: bool,
) -> (CubeTensor<R>, CubeTensor<R>, Option<CubeTensor<R>>) {
    let [gate, up, grad] = prepare([gate, up, grad]);
    let shape = gate.shape();
    let len = shape.num_elements();
    let grad_gate = empty_like(&gate, shape.clone(), gate.dtype);
    let grad_up = empty_like(&gate, shape.clone(), gate.dtype);
    let unit = unit.then(|| empty_like(&gate, shape, gate.dtype));
    launched(glu_backward::<R>(
        &gate.client,
        &super::launch_config(&gate.client),
        &grad.handle,
        &gate.handle,
        &up.handle,
        &grad_gate.handle,
        &grad_up.handle,
        unit.as_ref().map(|u| &u.handle),
        len,
        kernel_activation(activation),
        gate.dtype.into(),
    ));
    (grad_gate, grad_up, unit)
}
