//! RMSNorm and the fused add + RMSNorm under autodiff: one fused forward, a node whose
//! backward runs the fused backward kernel.

use super::register_norm_grads;
use crate::ops::{AddRmsNormOutput, FusedOps, RmsNormOptions, RmsNormOutput};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct RmsNormBackward;

impl<B: FusedOps> Backward<B, 2> for RmsNormBackward {
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        RmsNormOptions,
    );

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight, rstd, options) = ops.state.clone();
        let g = B::fused_rms_norm_backward(grad, x, weight, rstd, options);
        register_norm_grads::<B, 2>(&ops, grads, g);
    }
}

/// The `x + residual` half of the fused add + RMSNorm: gradient passes through to both.
#[derive(Debug)]
struct ResidualAddBackward;

impl<B: FusedOps> Backward<B, 2> for ResidualAddBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [a, b] = ops.parents;
        match (a, b) {
            (Some(a), Some(b)) => {
                grads.register::<B>(a.id, grad.clone());
                grads.register::<B>(b.id, grad);
            }
            (Some(node), None) | (None, Some(node)) => grads.register::<B>(node.id, grad),
            (None, None) => {}
        }
    }
}

pub(crate) fn rms_norm<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    options: RmsNormOptions,
) -> RmsNormOutput<Autodiff<B, C>> {
    let out = B::fused_rms_norm(x.primitive.clone(), weight.primitive.clone(), options);
    let rstd = Autodiff::<B, C>::from_inner(out.rstd.clone());
    let output = match RmsNormBackward
        .prepare::<C>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            (x.primitive, weight.primitive, out.rstd, options),
            out.output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out.output),
    };
    RmsNormOutput { output, rstd }
}

pub(crate) fn add_rms_norm<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    residual: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    options: RmsNormOptions,
) -> AddRmsNormOutput<Autodiff<B, C>> {
    // One fused forward launch; the graph gets two nodes (the add, then the norm of
    // the sum), so the sum's own consumers and the norm both send gradient back.
    let out = B::fused_add_rms_norm(
        x.primitive.clone(),
        residual.primitive.clone(),
        weight.primitive.clone(),
        options,
    );
    let sum = ResidualAddBackward
        .prepare::<C>([x.node.clone(), residual.node.clone()])
        .compute_bound()
        .stateless(out.sum.clone());
    let rstd = Autodiff::<B, C>::from_inner(out.rstd.clone());
    let output = match RmsNormBackward
        .prepare::<C>([sum.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            prep.finish((out.sum, weight.primitive, out.rstd, options), out.output)
        }
        OpsKind::UnTracked(prep) => prep.finish(out.output),
    };
    AddRmsNormOutput { output, sum, rstd }
}
