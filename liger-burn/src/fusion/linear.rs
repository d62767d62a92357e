//! The linear layer with a bias in the fusion stream. Where the inner backend runs its
//! products on a vendor library (cuBLASLt on CUDA), the forward and the weight's backward
//! are each one custom operation (`CustomOpIr`) running the inner backend's op, whose
//! epilogue adds (reduces) the bias; everywhere else they are the default compositions
//! of stock operations, which the fusion optimizer may fuse with their neighbours.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::FusedOps;
use crate::ops::compose::linear as compose;
use burn::tensor::{Shape, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// The custom operation: `B::fused_linear` on `x`, `weight`, `bias`.
#[derive(Clone, Copy, Debug)]
struct Linear;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for Linear {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared x, weight, bias");
        let (x, weight, bias) = (next(), next(), next());
        vec![B::fused_linear(x, weight, bias)]
    }
}

/// See [`FusedOps::fused_linear`].
pub(crate) fn linear<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    weight: FusionTensor<B::FusionRuntime>,
    bias: FusionTensor<B::FusionRuntime>,
) -> FusionTensor<B::FusionRuntime> {
    let dtype = x.dtype();
    if !B::fused_matmul_uses_vendor_library(x.client.device(), dtype) {
        return compose::forward::<Fusion<B>>(x, weight, bias);
    }
    let out = Shape::new([x.shape()[0], weight.shape()[1]]);
    custom_op::register::<B, _>(
        "liger_linear",
        vec![x, weight, bias],
        &[(out, dtype)],
        Linear,
    )
    .remove(0)
}

/// The custom operation: `B::fused_linear_weight_backward` on `x`, `grad`.
#[derive(Clone, Copy, Debug)]
struct LinearWeightBackward;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for LinearWeightBackward {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared x, grad");
        let (x, grad) = (next(), next());
        let (weight, bias) = B::fused_linear_weight_backward(x, grad);
        vec![weight, bias]
    }
}

/// See [`FusedOps::fused_linear_weight_backward`].
pub(crate) fn weight_backward<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    grad: FusionTensor<B::FusionRuntime>,
) -> (
    FusionTensor<B::FusionRuntime>,
    FusionTensor<B::FusionRuntime>,
) {
    let dtype = x.dtype();
    if !B::fused_matmul_uses_vendor_library(x.client.device(), dtype) {
        return compose::weight_backward::<Fusion<B>>(x, grad);
    }
    let (d_in, d_out) = (x.shape()[1], grad.shape()[1]);
    let outputs = [
        (Shape::new([d_in, d_out]), dtype),
        (Shape::new([d_out]), dtype),
    ];
    let mut out = custom_op::register::<B, _>(
        "liger_linear_weight_backward",
        vec![x, grad],
        &outputs,
        LinearWeightBackward,
    );
    let bias = out.pop().expect("two outputs");
    (out.pop().expect("two outputs"), bias)
}
