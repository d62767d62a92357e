//! RMSNorm and the fused add + RMSNorm in the fusion stream: one custom operation each.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{
    AddRmsNormOutput, FusedOps, NormGrads, RmsNormOptions, RmsNormOutput, row_stat_shape,
};
use burn::tensor::{DType, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// Which RMSNorm primitive a custom operation runs.
#[derive(Clone, Debug)]
enum RmsNormKernel {
    Forward(RmsNormOptions),
    Add(RmsNormOptions),
    Backward(RmsNormOptions),
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for RmsNormKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        match self.clone() {
            RmsNormKernel::Forward(options) => {
                let (x, w) = (next(), next());
                let out = B::fused_rms_norm(x, w, options);
                vec![out.output, out.rstd]
            }
            RmsNormKernel::Add(options) => {
                let (x, r, w) = (next(), next(), next());
                let out = B::fused_add_rms_norm(x, r, w, options);
                vec![out.output, out.sum, out.rstd]
            }
            RmsNormKernel::Backward(options) => {
                let (g, x, w, rstd) = (next(), next(), next(), next());
                let grads = B::fused_rms_norm_backward(g, x, w, rstd, options);
                vec![grads.grad_input, grads.grad_weight]
            }
        }
    }
}

pub(super) fn rms_norm<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    weight: FusionTensor<B::FusionRuntime>,
    options: RmsNormOptions,
) -> RmsNormOutput<Fusion<B>> {
    let (shape, dtype) = (x.shape(), x.dtype());
    let outs = [(row_stat_shape(&shape), DType::F32)];
    let [output, rstd]: [_; 2] = custom_op::register::<B, _>(
        "liger_rms_norm",
        vec![x, weight],
        &[(shape, dtype), outs[0].clone()],
        RmsNormKernel::Forward(options),
    )
    .try_into()
    .unwrap();
    RmsNormOutput { output, rstd }
}

pub(super) fn add_rms_norm<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    residual: FusionTensor<B::FusionRuntime>,
    weight: FusionTensor<B::FusionRuntime>,
    options: RmsNormOptions,
) -> AddRmsNormOutput<Fusion<B>> {
    let (shape, dtype) = (x.shape(), x.dtype());
    let [output, sum, rstd]: [_; 3] = custom_op::register::<B, _>(
        "liger_add_rms_norm",
        vec![x, residual, weight],
        &[
            (shape.clone(), dtype),
            (shape.clone(), dtype),
            (row_stat_shape(&shape), DType::F32),
        ],
        RmsNormKernel::Add(options),
    )
    .try_into()
    .unwrap();
    AddRmsNormOutput { output, sum, rstd }
}

pub(super) fn rms_norm_backward<B: FusionBackend + FusedOps>(
    grad_output: FusionTensor<B::FusionRuntime>,
    x: FusionTensor<B::FusionRuntime>,
    weight: FusionTensor<B::FusionRuntime>,
    rstd: FusionTensor<B::FusionRuntime>,
    options: RmsNormOptions,
) -> NormGrads<Fusion<B>> {
    let outs = [(x.shape(), x.dtype()), (weight.shape(), weight.dtype())];
    let [grad_input, grad_weight]: [_; 2] = custom_op::register::<B, _>(
        "liger_rms_norm_backward",
        vec![grad_output, x, weight, rstd],
        &outs,
        RmsNormKernel::Backward(options),
    )
    .try_into()
    .unwrap();
    NormGrads {
        grad_input,
        grad_weight,
        grad_bias: None,
    }
}
