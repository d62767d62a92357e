//! Gated linear units, exact GELU and sigmoid in the fusion stream: each call is one
//! custom operation (`CustomOpIr`) that runs the inner backend's fused kernel when the
//! stream reaches it.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{FusedOps, GluActivation, GluGrads};
use burn::tensor::TensorMetadata;
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// Which primitive a custom operation runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ElementwiseKind {
    Glu(GluActivation),
    GluBackward(GluActivation),
    GluBackwardUnit(GluActivation),
    Gelu,
    GeluBackward,
    Sigmoid,
    SigmoidBackward,
}

impl ElementwiseKind {
    /// The custom op's id.
    fn id(self) -> &'static str {
        match self {
            ElementwiseKind::Glu(GluActivation::Silu) => "liger_swiglu",
            ElementwiseKind::Glu(GluActivation::GeluTanh) => "liger_geglu",
            ElementwiseKind::GluBackward(GluActivation::Silu) => "liger_swiglu_backward",
            ElementwiseKind::GluBackward(GluActivation::GeluTanh) => "liger_geglu_backward",
            ElementwiseKind::GluBackwardUnit(GluActivation::Silu) => "liger_swiglu_backward_unit",
            ElementwiseKind::GluBackwardUnit(GluActivation::GeluTanh) => {
                "liger_geglu_backward_unit"
            }
            ElementwiseKind::Gelu => "liger_gelu",
            ElementwiseKind::GeluBackward => "liger_gelu_backward",
            ElementwiseKind::Sigmoid => "liger_sigmoid",
            ElementwiseKind::SigmoidBackward => "liger_sigmoid_backward",
        }
    }

    fn outputs(self) -> usize {
        match self {
            ElementwiseKind::GluBackward(_) => 2,
            ElementwiseKind::GluBackwardUnit(_) => 3,
            _ => 1,
        }
    }
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for ElementwiseKind {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        match *self {
            ElementwiseKind::Glu(act) => vec![B::fused_glu(next(), next(), act)],
            ElementwiseKind::GluBackward(act) => {
                let (g, gate, up) = (next(), next(), next());
                let grads = B::fused_glu_backward(g, gate, up, act);
                vec![grads.grad_gate, grads.grad_up]
            }
            ElementwiseKind::GluBackwardUnit(act) => {
                let (g, gate, up) = (next(), next(), next());
                let (grads, unit) = B::fused_glu_backward_with_unit(g, gate, up, act);
                vec![grads.grad_gate, grads.grad_up, unit]
            }
            ElementwiseKind::Gelu => vec![B::fused_gelu(next())],
            ElementwiseKind::GeluBackward => vec![B::fused_gelu_backward(next(), next())],
            ElementwiseKind::Sigmoid => vec![B::fused_sigmoid(next())],
            ElementwiseKind::SigmoidBackward => vec![B::fused_sigmoid_backward(next(), next())],
        }
    }
}

/// Registers `kind` on `inputs` (all of one shape and dtype); returns its outputs, each of
/// the inputs' shape and dtype.
pub(crate) fn register<B: FusionBackend + FusedOps>(
    kind: ElementwiseKind,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let out = (inputs[0].shape(), inputs[0].dtype());
    custom_op::register::<B, _>(kind.id(), inputs, &vec![out; kind.outputs()], kind)
}

type Tensor<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

pub(crate) fn glu<B: FusionBackend + FusedOps>(
    gate: Tensor<B>,
    up: Tensor<B>,
    activation: GluActivation,
) -> Tensor<B> {
    register::<B>(ElementwiseKind::Glu(activation), vec![gate, up]).remove(0)
}

pub(crate) fn glu_backward<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    gate: Tensor<B>,
    up: Tensor<B>,
    activation: GluActivation,
) -> GluGrads<Fusion<B>> {
    let [grad_gate, grad_up]: [_; 2] = register::<B>(
        ElementwiseKind::GluBackward(activation),
        vec![grad_output, gate, up],
    )
    .try_into()
    .unwrap();
    GluGrads { grad_gate, grad_up }
}

pub(crate) fn glu_backward_with_unit<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    gate: Tensor<B>,
    up: Tensor<B>,
    activation: GluActivation,
) -> (GluGrads<Fusion<B>>, Tensor<B>) {
    let [grad_gate, grad_up, unit]: [_; 3] = register::<B>(
        ElementwiseKind::GluBackwardUnit(activation),
        vec![grad_output, gate, up],
    )
    .try_into()
    .unwrap();
    (GluGrads { grad_gate, grad_up }, unit)
}

/// `kind` is [`ElementwiseKind::Gelu`] or [`ElementwiseKind::Sigmoid`].
pub(crate) fn unary<B: FusionBackend + FusedOps>(x: Tensor<B>, kind: ElementwiseKind) -> Tensor<B> {
    register::<B>(kind, vec![x]).remove(0)
}

/// `kind` is [`ElementwiseKind::GeluBackward`] (`saved` = the input) or
/// [`ElementwiseKind::SigmoidBackward`] (`saved` = the output).
pub(crate) fn unary_backward<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    saved: Tensor<B>,
    kind: ElementwiseKind,
) -> Tensor<B> {
    register::<B>(kind, vec![grad_output, saved]).remove(0)
}
