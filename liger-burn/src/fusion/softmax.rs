//! Softmax and log-softmax in the fusion stream: one custom operation each way.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::FusedOps;
use burn::tensor::TensorMetadata;
use burn_fusion::{FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// Which softmax primitive a custom operation runs.
#[derive(Clone, Debug)]
enum SoftmaxKernel {
    Forward { log: bool },
    Backward { log: bool },
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for SoftmaxKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        match self.clone() {
            SoftmaxKernel::Forward { log } => {
                let x = next();
                vec![if log {
                    B::fused_log_softmax(x)
                } else {
                    B::fused_softmax(x)
                }]
            }
            SoftmaxKernel::Backward { log } => {
                let (g, y) = (next(), next());
                vec![if log {
                    B::fused_log_softmax_backward(g, y)
                } else {
                    B::fused_softmax_backward(g, y)
                }]
            }
        }
    }
}

pub(super) fn softmax<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    log: bool,
) -> FusionTensor<B::FusionRuntime> {
    let out = (x.shape(), x.dtype());
    custom_op::register::<B, _>(
        if log {
            "liger_log_softmax"
        } else {
            "liger_softmax"
        },
        vec![x],
        &[out],
        SoftmaxKernel::Forward { log },
    )
    .remove(0)
}

pub(super) fn softmax_backward<B: FusionBackend + FusedOps>(
    grad: FusionTensor<B::FusionRuntime>,
    output: FusionTensor<B::FusionRuntime>,
    log: bool,
) -> FusionTensor<B::FusionRuntime> {
    let out = (output.shape(), output.dtype());
    custom_op::register::<B, _>(
        if log {
            "liger_log_softmax_backward"
        } else {
            "liger_softmax_backward"
        },
        vec![grad, output],
        &[out],
        SoftmaxKernel::Backward { log },
    )
    .remove(0)
}
