//! Backward node of the embedding lookup: keeps the indices and the table's row count,
//! not the table (Burn's own node keeps the weights only to read their shape).

use crate::ops::FusedOps;
use burn::tensor::TensorMetadata;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

#[derive(Debug)]
struct EmbeddingBackward;

impl<B: FusedOps> Backward<B, 1> for EmbeddingBackward {
    /// The indices and the number of rows of the table.
    type State = (IntTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (indices, num_embeddings) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fused_embedding_backward(grad, indices, num_embeddings)
        });
    }
}

pub(crate) fn embedding<B: FusedOps, C: CheckpointStrategy>(
    weights: FloatTensor<Autodiff<B, C>>,
    indices: IntTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let num_embeddings = weights.primitive.shape()[0];
    let output = B::fused_embedding(weights.primitive, indices.clone());
    match EmbeddingBackward
        .prepare::<C>([weights.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((indices, num_embeddings), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
