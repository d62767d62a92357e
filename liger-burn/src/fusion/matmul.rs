//! The matrix product in the fusion stream. Where the inner backend runs it on a vendor
//! library (cuBLASLt on CUDA), it is one custom operation (`CustomOpIr`) that runs the
//! inner `fused_matmul` when the stream reaches it; everywhere else it is Burn's own
//! matmul operation, which the fusion optimizer may fuse with neighbouring elementwise
//! work. `fused_matmul_add` likewise: one custom operation on the vendor library (the
//! accumulator, at its last use, is updated in its own buffer), else the default
//! composition of stock operations.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{FusedOps, matmul_shape};
use burn::tensor::TensorMetadata;
use burn::tensor::ops::FloatTensorOps;
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// The custom operation: `B::fused_matmul` on its two inputs.
#[derive(Clone, Copy, Debug)]
struct Matmul;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for Matmul {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let (lhs, rhs) = (
            inputs.next().expect("custom op declared lhs"),
            inputs.next().expect("custom op declared rhs"),
        );
        vec![B::fused_matmul(lhs, rhs)]
    }
}

/// `lhs [..., m, k] · rhs [..., k, n]` (see [`FusedOps::fused_matmul`]).
pub(crate) fn matmul<B: FusionBackend + FusedOps>(
    lhs: FusionTensor<B::FusionRuntime>,
    rhs: FusionTensor<B::FusionRuntime>,
) -> FusionTensor<B::FusionRuntime> {
    let dtype = lhs.dtype();
    if !B::fused_matmul_uses_vendor_library(lhs.client.device(), dtype) {
        return Fusion::<B>::float_matmul(lhs, rhs);
    }
    let out_shape = matmul_shape(&lhs.shape(), &rhs.shape());
    custom_op::register::<B, _>(
        "liger_matmul",
        vec![lhs, rhs],
        &[(out_shape, dtype)],
        Matmul,
    )
    .remove(0)
}

/// The custom operation: `B::fused_matmul_backward` on its three inputs.
#[derive(Clone, Copy, Debug)]
struct MatmulBackward;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for MatmulBackward {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared lhs, rhs, grad");
        let (lhs, rhs, grad) = (next(), next(), next());
        let (grad_lhs, grad_rhs) = B::fused_matmul_backward(lhs, rhs, grad);
        vec![grad_lhs, grad_rhs]
    }
}

/// Both gradients of a 2-D product (see [`FusedOps::fused_matmul_backward`]): one custom
/// operation on the vendor library, else the default composition (Burn's matmul
/// operations, which the fusion optimizer may fuse with their neighbours).
pub(crate) fn matmul_backward<B: FusionBackend + FusedOps>(
    lhs: FusionTensor<B::FusionRuntime>,
    rhs: FusionTensor<B::FusionRuntime>,
    grad: FusionTensor<B::FusionRuntime>,
) -> (
    FusionTensor<B::FusionRuntime>,
    FusionTensor<B::FusionRuntime>,
) {
    // Before the operation joins the stream, whose thread would find the error later.
    crate::ops::compose::check_matmul_backward(&lhs, &rhs, &grad);
    let dtype = lhs.dtype();
    if !B::fused_matmul_uses_vendor_library(lhs.client.device(), dtype) {
        return crate::ops::compose::matmul_backward::<Fusion<B>>(lhs, rhs, grad);
    }
    let outputs = [(lhs.shape(), dtype), (rhs.shape(), dtype)];
    let mut out = custom_op::register::<B, _>(
        "liger_matmul_backward",
        vec![lhs, rhs, grad],
        &outputs,
        MatmulBackward,
    );
    let grad_rhs = out.pop().expect("two outputs");
    (out.pop().expect("two outputs"), grad_rhs)
}

/// The custom operation: `B::fused_matmul_add` on its three inputs.
#[derive(Clone, Copy, Debug)]
struct MatmulAdd;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for MatmulAdd {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared acc, lhs, rhs");
        let (acc, lhs, rhs) = (next(), next(), next());
        vec![B::fused_matmul_add(acc, lhs, rhs)]
    }
}

/// `acc + lhs · rhs` (see [`FusedOps::fused_matmul_add`]).
pub(crate) fn matmul_add<B: FusionBackend + FusedOps>(
    acc: FusionTensor<B::FusionRuntime>,
    lhs: FusionTensor<B::FusionRuntime>,
    rhs: FusionTensor<B::FusionRuntime>,
) -> FusionTensor<B::FusionRuntime> {
    if !B::fused_matmul_uses_vendor_library(lhs.client.device(), lhs.dtype()) {
        return crate::ops::compose::matmul_add::<Fusion<B>>(acc, lhs, rhs);
    }
    let out = (acc.shape(), acc.dtype());
    custom_op::register::<B, _>("liger_matmul_add", vec![acc, lhs, rhs], &[out], MatmulAdd)
        .remove(0)
}
