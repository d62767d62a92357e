//! The LoRA linear layer on `Autodiff<B>`: `B`'s forward, and a node whose parents are `x`,
//! the adapter's separate input (when it has one), `A` and `B`. The base weight and bias
//! are constants (a frozen base: no gradient, nothing kept but the weight handle the input
//! gradient needs).
//!
//! The node keeps the weight, `A`, `B`, the adapter's input in its own dtype (widened
//! again in the backward, PEFT keeps an f32 copy) and the scaled hidden `[rows, r]`; the
//! base path's input is not kept (the frozen weight needs no gradient).

use crate::ops::{FusedOps, LoraLinearGradsWanted, LoraOptions};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[derive(Debug)]
struct LoraLinearBackward;

/// The adapter's input (`x` itself, or the separate input: the base path's input
/// gradient needs nothing of `x`), whether it is `x`, the weight, `A`, `B`, the hidden,
/// the options, which gradients.
#[derive(Debug, Clone)]
struct State<B: FusedOps> {
    adapter_input: FloatTensor<B>,
    separate: bool,
    weight: FloatTensor<B>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    hidden: FloatTensor<B>,
    options: LoraOptions,
    wanted: LoraLinearGradsWanted,
}

impl<B: FusedOps, const N: usize> Backward<B, N> for LoraLinearBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let separate = s.separate;
        let g = B::fused_lora_linear_backward(
            grad,
            s.adapter_input,
            separate,
            s.weight,
            s.a,
            s.b,
            s.hidden,
            s.options,
            s.wanted,
        );
        let mut values = vec![g.grad_x];
        if separate {
            values.push(g.grad_adapter_x);
        }
        values.push(g.grad_a);
        values.push(g.grad_b);
        for (parent, value) in ops.parents.iter().zip(values) {
            if let (Some(node), Some(value)) = (parent, value) {
                grads.register::<B>(node.id, value);
            }
        }
    }
}

/// The inputs of one call (the hidden comes from the forward).
struct Call<B: FusedOps> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter_x: Option<FloatTensor<B>>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    options: LoraOptions,
    wanted: LoraLinearGradsWanted,
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize>(
    kind: OpsKind<LoraLinearBackward, B, State<B>, C, N>,
    call: Call<B>,
) -> crate::ops::LoraLinearOutput<Autodiff<B, C>> {
    let out = B::fused_lora_linear(
        call.x.clone(),
        call.weight.clone(),
        call.bias,
        call.adapter_x.clone(),
        call.a.clone(),
        call.b.clone(),
        call.options,
    );
    let hidden = Autodiff::<B, C>::from_inner(out.hidden.clone());
    let output = match kind {
        OpsKind::Tracked(prep) => prep.finish(
            State {
                separate: call.adapter_x.is_some(),
                adapter_input: call.adapter_x.unwrap_or(call.x),
                weight: call.weight,
                a: call.a,
                b: call.b,
                hidden: out.hidden,
                options: call.options,
                wanted: call.wanted,
            },
            out.output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out.output),
    };
    crate::ops::LoraLinearOutput { output, hidden }
}

/// `fused_lora_linear` for `Autodiff<B>`: the output is tracked; the hidden is returned
/// untracked (the node keeps its own handle).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    adapter_x: Option<FloatTensor<Autodiff<B, C>>>,
    a: FloatTensor<Autodiff<B, C>>,
    b: FloatTensor<Autodiff<B, C>>,
    options: LoraOptions,
) -> crate::ops::LoraLinearOutput<Autodiff<B, C>> {
    let wanted = LoraLinearGradsWanted {
        x: x.is_tracked(),
        adapter_x: adapter_x.as_ref().is_some_and(|t| t.is_tracked()),
        a: a.is_tracked(),
        b: b.is_tracked(),
    };
    let mut nodes = vec![x.node.clone()];
    if let Some(t) = &adapter_x {
        nodes.push(t.node.clone());
    }
    nodes.push(a.node.clone());
    nodes.push(b.node.clone());
    let call = Call {
        x: x.primitive,
        weight: weight.primitive,
        bias: bias.map(|t| t.primitive),
        adapter_x: adapter_x.map(|t| t.primitive),
        a: a.primitive,
        b: b.primitive,
        options,
        wanted,
    };
    match nodes.len() {
        3 => finish::<B, C, 3>(
            LoraLinearBackward
                .prepare::<C>(nodes.try_into().expect("3 parents"))
                .compute_bound()
                .stateful(),
            call,
        ),
        _ => finish::<B, C, 4>(
            LoraLinearBackward
                .prepare::<C>(nodes.try_into().expect("4 parents"))
                .compute_bound()
                .stateful(),
            call,
        ),
    }
}
