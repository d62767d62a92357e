//! The embedding gradient in the fusion stream: one custom operation with a float and an
//! int input.

use super::custom_op::{self, CustomKernel, Handles};
use crate::ops::FusedOps;
use burn::tensor::{Shape, TensorMetadata};
use burn_fusion::{FusionBackend, FusionTensor};
use burn_ir::TensorIr;

#[derive(Clone, Debug)]
struct EmbeddingBackwardKernel {
    num_embeddings: usize,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for EmbeddingBackwardKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        // Inputs: grad_output, indices (int).
        let grad = handles.get_float_tensor::<B>(&inputs[0]);
        let indices = handles.get_int_tensor::<B>(&inputs[1]);
        vec![B::fused_embedding_backward(
            grad,
            indices,
            self.num_embeddings,
        )]
    }
}

/// See [`FusedOps::fused_embedding_backward`].
pub(crate) fn backward<B: FusionBackend + FusedOps>(
    grad_output: FusionTensor<B::FusionRuntime>,
    indices: FusionTensor<B::FusionRuntime>,
    num_embeddings: usize,
) -> FusionTensor<B::FusionRuntime> {
    let shape = grad_output.shape();
    let width = shape[shape.num_dims() - 1];
    let spec = (Shape::new([num_embeddings, width]), grad_output.dtype());
    custom_op::register::<B, _>(
        "liger_embedding_backward",
        vec![grad_output, indices],
        &[spec],
        EmbeddingBackwardKernel { num_embeddings },
    )
    .pop()
    .expect("one output")
}
