//! Gated linear units, `out = act(gate) · up`: SwiGLU (`act` = SiLU) and GeGLU (`act` =
//! tanh-approximated GELU, PyTorch's `gelu(approximate="tanh")`), forward and backward,
//! the activation a comptime parameter of the one shared elementwise kernel
//! ([`crate::elementwise`]).
//!
//! The backward recomputes the activation from `gate` (nothing is kept from the forward):
//! `grad_gate = grad · up · act'(gate)`, `grad_up = grad · act(gate)`. Inputs of any
//! float dtype are widened to f32, computed in f32 and rounded once on the store.

use crate::counters::{self, Kernel};
use crate::elementwise::{Pass, launch};
use crate::launch::{KernelError, LaunchConfig};
use crate::pointwise::Activation;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// The activation of a gated unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluActivation {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU: `gelu_tanh(gate) · up`.
    GeluTanh,
}

impl GluActivation {
    fn activation(self) -> Activation {
        match self {
            GluActivation::Silu => Activation::Silu,
            GluActivation::GeluTanh => Activation::GeluTanh,
        }
    }

    fn name(self, backward: bool) -> &'static str {
        match (self, backward) {
            (GluActivation::Silu, false) => "swiglu",
            (GluActivation::Silu, true) => "swiglu_backward",
            (GluActivation::GeluTanh, false) => "geglu",
            (GluActivation::GeluTanh, true) => "geglu_backward",
        }
    }
}

/// Gated unit forward: `output = act(gate) · up`.
///
/// `gate, up, output`: `len` contiguous elements of `dtype` (any shape `[..., d]`).
pub fn glu_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    gate: &Handle,
    up: &Handle,
    output: &Handle,
    len: usize,
    act: GluActivation,
    dtype: StorageType,
) -> Result<(), KernelError> {
    launch(
        act.name(false),
        client,
        &config.elementwise,
        &[gate, up],
        &[output],
        len,
        Pass::Glu,
        act.activation(),
        dtype,
    )?;
    counters::record(match act {
        GluActivation::Silu => Kernel::swiglu_forward,
        GluActivation::GeluTanh => Kernel::geglu_forward,
    });
    Ok(())
}

/// Gated unit backward, recomputing the activation from `gate`:
/// `grad_gate = grad · up · act'(gate)`, `grad_up = grad · act(gate)`, and, when `unit` is
/// given, `unit = act(gate) · up` (the forward's output, for a consumer such as the down
/// projection's weight gradient: one pass over `gate` and `up` instead of two).
///
/// `grad, gate, up, grad_gate, grad_up, unit`: `len` contiguous elements of `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn glu_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    gate: &Handle,
    up: &Handle,
    grad_gate: &Handle,
    grad_up: &Handle,
    unit: Option<&Handle>,
    len: usize,
    act: GluActivation,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let (outputs, pass) = match unit {
        Some(unit) => (vec![grad_gate, grad_up, unit], Pass::GluBackwardUnit),
        None => (vec![grad_gate, grad_up], Pass::GluBackward),
    };
    launch(
        act.name(true),
        client,
        &config.elementwise,
        &[grad, gate, up],
        &outputs,
        len,
        pass,
        act.activation(),
        dtype,
    )?;
    counters::record(match act {
        GluActivation::Silu => Kernel::swiglu_backward,
        GluActivation::GeluTanh => Kernel::geglu_backward,
    });
    Ok(())
}
