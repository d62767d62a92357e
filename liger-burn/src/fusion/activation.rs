//! Exact GELU and sigmoid in the fusion stream: the elementwise custom operation that the
//! gated units share ([`super::glu`]), one kind per primitive.

use super::glu::{ElementwiseKind, unary, unary_backward};
use crate::ops::FusedOps;
use burn_fusion::{FusionBackend, FusionTensor};

type Tensor<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

pub(super) fn gelu<B: FusionBackend + FusedOps>(x: Tensor<B>) -> Tensor<B> {
    unary::<B>(x, ElementwiseKind::Gelu)
}

pub(super) fn gelu_backward<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    x: Tensor<B>,
) -> Tensor<B> {
    unary_backward::<B>(grad_output, x, ElementwiseKind::GeluBackward)
}

pub(super) fn sigmoid<B: FusionBackend + FusedOps>(x: Tensor<B>) -> Tensor<B> {
    unary::<B>(x, ElementwiseKind::Sigmoid)
}

pub(super) fn sigmoid_backward<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    output: Tensor<B>,
) -> Tensor<B> {
    unary_backward::<B>(grad_output, output, ElementwiseKind::SigmoidBackward)
}
