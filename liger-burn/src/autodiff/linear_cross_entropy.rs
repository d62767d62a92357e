//! Fused linear cross entropy (with or without a LoRA adapter on the LM head) on
//! `Autodiff<B>`: the forward computes every gradient a tracked input needs (chunk by
//! chunk, inside `B`'s primitive) and the backward node only scales them by the upstream
//! gradient, or hands them over untouched when it is exactly 1. An input that is not
//! tracked (a frozen LM head) gets no gradient computed at all.
//!
//! The node's parents are, in order: `x`, the weight, the bias (when there is one), the
//! adapter's separate input (when it has one), `A` and `B` (with an adapter).

use crate::ops::compose::linear_cross_entropy::{Gradients as ChunkGrads, chunked};
use crate::ops::{
    CrossEntropyOptions, FusedOps, LinearCrossEntropyGradsWanted, LinearCrossEntropyOutput,
    LoraHead, LoraHeadGrads, Reduction,
};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// What reduction none needs to recompute the gradients for an arbitrary per-row
/// upstream gradient.
#[derive(Debug, Clone)]
struct Inputs<B: FusedOps> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter: Option<LoraHead<B>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
}

/// The node's state: the gradients of the reduced loss for an upstream gradient of 1, one
/// per parent in the parents' order; the options; and for reduction none the inputs.
#[derive(Debug, Clone)]
struct State<B: FusedOps> {
    stored: Vec<Option<FloatTensor<B>>>,
    options: CrossEntropyOptions,
    wanted: LinearCrossEntropyGradsWanted,
    inputs: Option<Inputs<B>>,
}

/// The gradients of `out` in the parents' order (see the module docs).
fn in_parent_order<B: FusedOps>(
    out: &LinearCrossEntropyOutput<B>,
    has_bias: bool,
    adapter: Option<bool>,
) -> Vec<Option<FloatTensor<B>>> {
    let mut v = vec![out.grad_x.clone(), out.grad_weight.clone()];
    if has_bias {
        v.push(out.grad_bias.clone());
    }
    if let Some(separate) = adapter {
        let empty = LoraHeadGrads {
            grad_x: None,
            grad_a: None,
            grad_b: None,
        };
        let g = out.adapter.clone().unwrap_or(empty);
        if separate {
            v.push(g.grad_x);
        }
        v.push(g.grad_a);
        v.push(g.grad_b);
    }
    v
}

#[derive(Debug)]
struct LinearCrossEntropyBackward;

impl<B: FusedOps, const N: usize> Backward<B, N> for LinearCrossEntropyBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<B>(&ops.node);
        let State {
            stored,
            options,
            wanted,
            inputs,
        } = ops.state;
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
                    stored
                        .into_iter()
                        .map(|t| t.map(|t| scale::<B>(t, g)))
                        .collect()
                }
            }
            // None: per-row factors. All ones (`loss.sum().backward()`) reuses the stored
            // gradients; anything else needs the parameter gradients `Σ_i r_i ∂loss_i/∂θ`,
            // which the stored sums cannot give: a second chunked pass computes them.
            Some(inp) => {
                let r = float::<B, 1>(upstream.clone()).cast(DType::F32);
                let ones = r.clone().equal_elem(1.0).all();
                if ones.int().into_scalar().elem::<i64>() != 0 {
                    stored
                } else {
                    let has_bias = inp.bias.is_some();
                    let adapter = inp.adapter.as_ref().map(|a| a.x.is_some());
                    let out = chunked::<B>(
                        inp.x,
                        inp.weight,
                        inp.bias,
                        inp.adapter,
                        inp.targets,
                        inp.class_weight,
                        ChunkGrads::RowFactors(upstream),
                        wanted,
                        options,
                    );
                    in_parent_order(&out, has_bias, adapter)
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

/// The inner call and the node, for `N` parents.
#[allow(clippy::too_many_arguments)]
fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    kind: OpsKind<LinearCrossEntropyBackward, B, State<B>, C, N>,
    inputs: Inputs<B>,
    wanted: LinearCrossEntropyGradsWanted,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<Autodiff<B, C>> {
    type A<B, C> = Autodiff<B, C>;
    let lift = |out: LinearCrossEntropyOutput<B>, loss| LinearCrossEntropyOutput {
        loss,
        z_loss: out.z_loss.map(A::<B, C>::from_inner),
        grad_x: out.grad_x.map(A::<B, C>::from_inner),
        grad_weight: out.grad_weight.map(A::<B, C>::from_inner),
        grad_bias: out.grad_bias.map(A::<B, C>::from_inner),
        adapter: out.adapter.map(|g| LoraHeadGrads {
            grad_x: g.grad_x.map(A::<B, C>::from_inner),
            grad_a: g.grad_a.map(A::<B, C>::from_inner),
            grad_b: g.grad_b.map(A::<B, C>::from_inner),
        }),
    };
    let has_bias = inputs.bias.is_some();
    let adapter = inputs.adapter.as_ref().map(|a| a.x.is_some());
    match kind {
        OpsKind::Tracked(prep) => {
            let kept = (options.reduction == Reduction::None).then(|| inputs.clone());
            let Inputs {
                x,
                weight,
                bias,
                adapter: head,
                targets,
                class_weight,
            } = inputs;
            let out = B::fused_lora_linear_cross_entropy(
                x,
                weight,
                bias,
                head,
                targets,
                class_weight,
                wanted,
                options,
            );
            let state = State {
                stored: in_parent_order(&out, has_bias, adapter),
                options,
                wanted,
                inputs: kept,
            };
            let loss = prep.finish(state, out.loss.clone());
            lift(out, loss)
        }
        OpsKind::UnTracked(prep) => {
            // Nothing needs a gradient: forward only.
            let Inputs {
                x,
                weight,
                bias,
                adapter: head,
                targets,
                class_weight,
            } = inputs;
            let out = B::fused_lora_linear_cross_entropy(
                x,
                weight,
                bias,
                head,
                targets,
                class_weight,
                LinearCrossEntropyGradsWanted::none(),
                options,
            );
            let loss = prep.finish(out.loss.clone());
            lift(out, loss)
        }
    }
}

/// [`FusedOps::fused_lora_linear_cross_entropy`] (and, with no adapter,
/// `fused_linear_cross_entropy`) for `Autodiff<B>`: gradients exactly for the tracked inputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    adapter: Option<LoraHead<Autodiff<B, C>>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<Autodiff<B, C>>>,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<Autodiff<B, C>> {
    let mut nodes = vec![x.node.clone(), weight.node.clone()];
    let mut wanted = LinearCrossEntropyGradsWanted {
        x: x.is_tracked(),
        weight: weight.is_tracked(),
        ..LinearCrossEntropyGradsWanted::none()
    };
    if let Some(b) = &bias {
        nodes.push(b.node.clone());
        wanted.bias = b.is_tracked();
    }
    if let Some(ad) = &adapter {
        if let Some(xa) = &ad.x {
            nodes.push(xa.node.clone());
            wanted.adapter_x = xa.is_tracked();
        }
        nodes.push(ad.a.node.clone());
        nodes.push(ad.b.node.clone());
        wanted.a = ad.a.is_tracked();
        wanted.b = ad.b.is_tracked();
    }
    let inputs = Inputs {
        x: x.primitive,
        weight: weight.primitive,
        bias: bias.map(|b| b.primitive),
        adapter: adapter.map(|ad| LoraHead {
            x: ad.x.map(|t| t.primitive),
            a: ad.a.primitive,
            b: ad.b.primitive,
            options: ad.options,
        }),
        targets,
        class_weight: class_weight.map(|w| w.primitive),
    };
    // One node type per parent count (the bias, the adapter and its separate input are
    // optional): 2 to 6 parents.
    macro_rules! with_parents {
        ($($n:literal),*) => {
            match nodes.len() {
                $($n => finish::<B, C, $n>(
                    LinearCrossEntropyBackward
                        .prepare::<C>(nodes.try_into().expect("the parent count"))
                        .compute_bound()
                        .stateful(),
                    inputs,
                    wanted,
                    options,
                ),)*
                n => unreachable!("fused linear cross entropy with {n} parents"),
            }
        };
    }
    with_parents!(2, 3, 4, 5, 6)
}
