//! LayerNorm in the fusion stream: one custom operation each way.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{FusedOps, LayerNormOutput, NormGrads, row_stat_shape};
use burn::tensor::{DType, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// Which LayerNorm primitive a custom operation runs.
#[derive(Clone, Debug)]
enum LayerNormKernel {
    Forward { eps: f64, has_bias: bool },
    Backward { has_bias: bool },
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for LayerNormKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        match self.clone() {
            LayerNormKernel::Forward { eps, has_bias } => {
                let (x, gamma) = (next(), next());
                let beta = has_bias.then(&mut next);
                let out = B::fused_layer_norm(x, gamma, beta, eps);
                vec![out.output, out.mean, out.rstd]
            }
            LayerNormKernel::Backward { has_bias } => {
                let (g, x, gamma, mean, rstd) = (next(), next(), next(), next(), next());
                let grads = B::fused_layer_norm_backward(g, x, gamma, mean, rstd, has_bias);
                let mut out = vec![grads.grad_input, grads.grad_weight];
                out.extend(grads.grad_bias);
                out
            }
        }
    }
}

pub(super) fn layer_norm<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    gamma: FusionTensor<B::FusionRuntime>,
    beta: Option<FusionTensor<B::FusionRuntime>>,
    eps: f64,
) -> LayerNormOutput<Fusion<B>> {
    let (shape, dtype) = (x.shape(), x.dtype());
    let has_bias = beta.is_some();
    let mut inputs = vec![x, gamma];
    inputs.extend(beta);
    let stat = (row_stat_shape(&shape), DType::F32);
    let [output, mean, rstd]: [_; 3] = custom_op::register::<B, _>(
        "liger_layer_norm",
        inputs,
        &[(shape, dtype), stat.clone(), stat],
        LayerNormKernel::Forward { eps, has_bias },
    )
    .try_into()
    .unwrap();
    LayerNormOutput { output, mean, rstd }
}

pub(super) fn layer_norm_backward<B: FusionBackend + FusedOps>(
    grad_output: FusionTensor<B::FusionRuntime>,
    x: FusionTensor<B::FusionRuntime>,
    gamma: FusionTensor<B::FusionRuntime>,
    mean: FusionTensor<B::FusionRuntime>,
    rstd: FusionTensor<B::FusionRuntime>,
    has_bias: bool,
) -> NormGrads<Fusion<B>> {
    let mut outs = vec![(x.shape(), x.dtype()), (gamma.shape(), gamma.dtype())];
    if has_bias {
        outs.push((gamma.shape(), gamma.dtype()));
    }
    let mut grads = custom_op::register::<B, _>(
        "liger_layer_norm_backward",
        vec![grad_output, x, gamma, mean, rstd],
        &outs,
        LayerNormKernel::Backward { has_bias },
    )
    .into_iter();
    NormGrads {
        grad_input: grads.next().unwrap(),
        grad_weight: grads.next().unwrap(),
        grad_bias: grads.next(),
    }
}
