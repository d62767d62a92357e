//! Fused linear cross entropy on `Autodiff<B>`: the forward computes every gradient
//! (chunk by chunk, inside `B`'s primitive) and the backward node only scales them by the
//! upstream gradient, or hands them over untouched when it is exactly 1.

use crate::ops::compose::linear_cross_entropy::{Gradients as ChunkGrads, chunked};
use crate::ops::{CrossEntropyOptions, FusedOps, LinearCrossEntropyOutput, Reduction};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// What reduction none needs to recompute the gradients for an arbitrary per-row
/// upstream gradient: `x`, weight, bias, targets, class weights.
type Inputs<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
    IntTensor<B>,
    Option<FloatTensor<B>>,
);

/// Stored gradients (x, weight, bias) of the reduced loss for an upstream gradient of 1,
/// the options, and for reduction none the inputs.
type State<B> = (
    [Option<FloatTensor<B>>; 3],
    CrossEntropyOptions,
    Option<Inputs<B>>,
);

#[derive(Debug)]
struct LinearCrossEntropyBackward;

impl<B: FusedOps, const N: usize> Backward<B, N> for LinearCrossEntropyBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<B>(&ops.node);
        let (stored, options, inputs) = ops.state;
        let values = match inputs {
            // Mean or sum: a scalar upstream gradient (4 bytes read back).
            None => {
                let g = float::<B, 1>(upstream)
                    .into_data()
                    .iter::<f64>()
                    .next()
                    .expect("a scalar upstream gradient");
                if g == 1.0 {
                    stored
                } else {
                    stored.map(|t| t.map(|t| scale::<B>(t, g)))
                }
            }
            // None: per-row factors. All ones (`loss.sum().backward()`) reuses the stored
            // gradients; anything else needs the weight gradient `Σ_i r_i ∂loss_i/∂W`,
            // which the stored sum cannot give: a second chunked pass computes it.
            Some((x, weight, bias, targets, class_weight)) => {
                let r = float::<B, 1>(upstream.clone()).cast(DType::F32);
                let ones = r.clone().equal_elem(1.0).all();
                if ones.int().into_scalar().elem::<i64>() != 0 {
                    stored
                } else {
                    let out = chunked::<B>(
                        x,
                        weight,
                        bias,
                        targets,
                        class_weight,
                        ChunkGrads::RowFactors(upstream),
                        options,
                    );
                    [out.grad_x, out.grad_weight, out.grad_bias]
                }
            }
        };
        for (parent, value) in ops.parents.iter().zip(values) {
            if let (Some(node), Some(value)) = (parent, value) {
                grads.register::<B>(node.id, value);
            }
        }
    }
}

use burn::tensor::ElementConversion;

fn float<B: FusedOps, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// `t · g` computed in f32, stored in `t`'s dtype.
fn scale<B: FusedOps>(t: FloatTensor<B>, g: f64) -> FloatTensor<B> {
    let dtype = t.dtype();
    let rank = t.shape().num_dims();
    match rank {
        1 => (float::<B, 1>(t).cast(DType::F32) * g)
            .cast(dtype)
            .into_primitive()
            .tensor(),
        _ => (float::<B, 2>(t).cast(DType::F32) * g)
            .cast(dtype)
            .into_primitive()
            .tensor(),
    }
}

#[allow(clippy::too_many_arguments)]
fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    kind: OpsKind<LinearCrossEntropyBackward, B, State<B>, C, N>,
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<Autodiff<B, C>> {
    type A<B, C> = Autodiff<B, C>;
    match kind {
        OpsKind::Tracked(prep) => {
            let inputs = (options.reduction == Reduction::None).then(|| {
                (
                    x.clone(),
                    weight.clone(),
                    bias.clone(),
                    targets.clone(),
                    class_weight.clone(),
                )
            });
            let out = B::fused_linear_cross_entropy(
                x,
                weight,
                bias,
                targets,
                class_weight,
                true,
                options,
            );
            let stored = [
                out.grad_x.clone(),
                out.grad_weight.clone(),
                out.grad_bias.clone(),
            ];
            let loss = prep.finish((stored, options, inputs), out.loss);
            LinearCrossEntropyOutput {
                loss,
                z_loss: out.z_loss.map(A::<B, C>::from_inner),
                grad_x: out.grad_x.map(A::<B, C>::from_inner),
                grad_weight: out.grad_weight.map(A::<B, C>::from_inner),
                grad_bias: out.grad_bias.map(A::<B, C>::from_inner),
            }
        }
        OpsKind::UnTracked(prep) => {
            // Nothing needs a gradient: forward only.
            let out = B::fused_linear_cross_entropy(
                x,
                weight,
                bias,
                targets,
                class_weight,
                false,
                options,
            );
            LinearCrossEntropyOutput {
                loss: prep.finish(out.loss),
                z_loss: out.z_loss.map(A::<B, C>::from_inner),
                grad_x: None,
                grad_weight: None,
                grad_bias: None,
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<Autodiff<B, C>>>,
    _compute_grad: bool,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<Autodiff<B, C>> {
    // Whether gradients are computed follows the graph: they are exactly when a parent
    // (x, weight or bias) is tracked.
    let class_weight = class_weight.map(|w| w.primitive);
    match bias {
        Some(b) => finish::<B, C, 3>(
            LinearCrossEntropyBackward
                .prepare::<C>([x.node.clone(), weight.node.clone(), b.node.clone()])
                .compute_bound()
                .stateful(),
            x.primitive,
            weight.primitive,
            Some(b.primitive),
            targets,
            class_weight,
            options,
        ),
        None => finish::<B, C, 2>(
            LinearCrossEntropyBackward
                .prepare::<C>([x.node.clone(), weight.node.clone()])
                .compute_bound()
                .stateful(),
            x.primitive,
            weight.primitive,
            None,
            targets,
            class_weight,
            options,
        ),
    }
}
