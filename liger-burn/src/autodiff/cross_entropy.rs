//! Cross entropy on `Autodiff<B>`: the forward computes the logits gradient (scaled by the
//! caller's device-side `grad_scale`), and the backward node only rescales it by the
//! incoming gradient ([`FusedOps::fused_cross_entropy_backward`]), skipping even that
//! where it is a no-op.

use crate::ops::{CrossEntropyOptions, CrossEntropyRows, FusedOps};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// Backward of the per-row loss: the stored gradient `G = s · ∂(Σ loss)/∂logits` becomes
/// `G_i · r_i / s` for the incoming per-row gradient `r`.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: FusedOps> Backward<B, 1> for CrossEntropyBackward {
    /// The scaled logits gradient `[N, V]` and its scale `s` (`[1]`, f32).
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let rows_grad = grads.consume::<B>(&ops.node);
        let (grad, scale) = ops.state;
        if let Some(parent) = &ops.parents[0] {
            grads.register::<B>(
                parent.id,
                B::fused_cross_entropy_backward(grad, rows_grad, scale),
            );
        }
    }
}

pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<Autodiff<B, C>>>,
    grad_scale: Option<FloatTensor<Autodiff<B, C>>>,
    z_loss_scale: Option<FloatTensor<Autodiff<B, C>>>,
    options: CrossEntropyOptions,
) -> CrossEntropyRows<Autodiff<B, C>> {
    type A<B, C> = Autodiff<B, C>;
    let class_weight = class_weight.map(|w| w.primitive);
    let z_loss_scale = z_loss_scale.map(|s| s.primitive);
    match CrossEntropyBackward
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            // The logits need a gradient: compute it in the forward pass. Without a
            // caller-given scale the node works with `s = 1`.
            let device = B::float_device(&logits.primitive);
            let scale = match grad_scale {
                Some(s) => s.primitive,
                None => B::float_ones([1].into(), &device, burn::tensor::FloatDType::F32),
            };
            let rows = B::fused_cross_entropy(
                logits.primitive,
                targets,
                class_weight,
                Some(scale.clone()),
                z_loss_scale,
                options,
            );
            let grad = rows
                .grad_logits
                .expect("fused_cross_entropy returns the gradient it was asked for");
            let loss = prep.finish((grad.clone(), scale), rows.loss);
            CrossEntropyRows {
                loss,
                z_loss: rows.z_loss.map(A::<B, C>::from_inner),
                grad_logits: Some(A::<B, C>::from_inner(grad)),
            }
        }
        OpsKind::UnTracked(prep) => {
            // Nothing needs the gradient: forward only, whatever the caller asked for.
            let rows = B::fused_cross_entropy(
                logits.primitive,
                targets,
                class_weight,
                None,
                None,
                options,
            );
            CrossEntropyRows {
                loss: prep.finish(rows.loss),
                z_loss: rows.z_loss.map(A::<B, C>::from_inner),
                grad_logits: None,
            }
        }
    }
}
