//! LayerNorm under autodiff: one fused forward, a node whose backward runs the fused
//! backward kernel.

use super::register_norm_grads;
use crate::ops::{FusedOps, LayerNormOutput};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct LayerNormBackward;

impl<B: FusedOps, const N: usize> Backward<B, N> for LayerNormBackward {
    /// `x`, gamma, mean, rstd.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, gamma, mean, rstd) = ops.state.clone();
        let g = B::fused_layer_norm_backward(grad, x, gamma, mean, rstd, N == 3);
        register_norm_grads::<B, N>(&ops, grads, g);
    }
}

pub(crate) fn layer_norm<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: Option<FloatTensor<Autodiff<B, C>>>,
    eps: f64,
) -> LayerNormOutput<Autodiff<B, C>> {
    let out = B::fused_layer_norm(
        x.primitive.clone(),
        gamma.primitive.clone(),
        beta.as_ref().map(|b| b.primitive.clone()),
        eps,
    );
    let mean = Autodiff::<B, C>::from_inner(out.mean.clone());
    let rstd = Autodiff::<B, C>::from_inner(out.rstd.clone());
    let state = (
        x.primitive.clone(),
        gamma.primitive.clone(),
        out.mean,
        out.rstd,
    );
    let output = match beta {
        Some(beta) => match LayerNormBackward
            .prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out.output),
            OpsKind::UnTracked(prep) => prep.finish(out.output),
        },
        None => match LayerNormBackward
            .prepare::<C>([x.node.clone(), gamma.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out.output),
            OpsKind::UnTracked(prep) => prep.finish(out.output),
        },
    };
    LayerNormOutput { output, mean, rstd }
}
