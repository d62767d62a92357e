//! The backward node of the chunked post-training losses (preference, KTO, GRPO,
//! distillation): their forward computes every gradient of the scalar loss chunk by chunk
//! (inside `B`'s primitive), and the node only scales them by the upstream gradient, or
//! hands them over untouched when it is exactly 1 (Liger-Kernel's backward).

use crate::ops::{DistillOutput, FusedOps, GrpoOutput, KtoOutput, PreferenceOutput};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, ElementConversion, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// The stored gradients of the parents (x, weight, bias), for an upstream gradient of 1.
type State<B> = [Option<FloatTensor<B>>; 3];

#[derive(Debug)]
struct StoredGradientsBackward;

impl<B: FusedOps, const N: usize> Backward<B, N> for StoredGradientsBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<B>(&ops.node);
        // A scalar loss: its upstream gradient is one value (4 bytes read back).
        let g = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upstream))
            .into_data()
            .iter::<f64>()
            .next()
            .expect("a scalar upstream gradient");
        let values = if g == 1.0 {
            ops.state
        } else {
            ops.state.map(|t| t.map(|t| scale::<B>(t, g)))
        };
        for (parent, value) in ops.parents.iter().zip(values) {
            if let (Some(node), Some(value)) = (parent, value) {
                grads.register::<B>(node.id, value);
            }
        }
    }
}

/// `t · g` computed in f32, stored in `t`'s dtype (any rank).
fn scale<B: FusedOps>(t: FloatTensor<B>, g: f64) -> FloatTensor<B> {
    let dtype = t.dtype();
    let shape = t.shape();
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(
        t,
        [shape.num_elements()].into(),
    )));
    let scaled = (flat.cast(DType::F32) * g.elem::<f64>()).cast(dtype);
    B::float_reshape(scaled.into_primitive().tensor(), shape)
}

/// The output of a chunked loss: its `[1]` loss, the gradients of x, the weight and the
/// bias (for an upstream gradient of 1), and the same output on `Autodiff<B, C>`.
pub(crate) trait ChunkedLossOutput<B: FusedOps>: Sized {
    /// This output with `Autodiff<B, C>` tensors.
    type Tracked<C: CheckpointStrategy>;
    /// The loss and the stored gradients of (x, weight, bias).
    fn parts(&self) -> (FloatTensor<B>, State<B>);
    /// This output on `Autodiff<B, C>` with `loss` (the tracked loss) in place of its own;
    /// the rest are constants of the graph.
    fn tracked<C: CheckpointStrategy>(self, loss: FloatTensor<Autodiff<B, C>>) -> Self::Tracked<C>;
}

macro_rules! chunked_loss_output {
    ($($output:ident),*) => {$(
        impl<B: FusedOps> ChunkedLossOutput<B> for $output<B> {
            type Tracked<C: CheckpointStrategy> = $output<Autodiff<B, C>>;

            fn parts(&self) -> (FloatTensor<B>, State<B>) {
                let stored = [self.grad_x.clone(), self.grad_weight.clone(), self.grad_bias.clone()];
                (self.loss.clone(), stored)
            }

            fn tracked<C: CheckpointStrategy>(
                self,
                loss: FloatTensor<Autodiff<B, C>>,
            ) -> Self::Tracked<C> {
                $output {
                    loss,
                    ..self.map(Autodiff::<B, C>::from_inner)
                }
            }
        }
    )*};
}

chunked_loss_output!(PreferenceOutput, DistillOutput, KtoOutput, GrpoOutput);

/// Runs a chunked loss of the linear layer (`x`, `weight`, `bias`) on `B` and tracks its
/// `[1]` loss with the stored-gradient node: `run(compute_grad)` is the inner forward.
/// Gradients are computed exactly when a parameter is tracked.
pub(crate) fn track<B: FusedOps, C: CheckpointStrategy, O: ChunkedLossOutput<B>>(
    x: &FloatTensor<Autodiff<B, C>>,
    weight: &FloatTensor<Autodiff<B, C>>,
    bias: Option<&FloatTensor<Autodiff<B, C>>>,
    run: impl FnOnce(bool) -> O,
) -> O::Tracked<C> {
    let parents = [Some(x), Some(weight), bias];
    let run = |compute_grad| {
        let out = run(compute_grad);
        let (loss, stored) = out.parts();
        (loss, stored, out)
    };
    let nodes: Vec<_> = parents.iter().flatten().map(|p| p.node.clone()).collect();
    let (loss, out) = match nodes.len() {
        2 => finish::<B, C, 2, O>(
            StoredGradientsBackward
                .prepare::<C>([nodes[0].clone(), nodes[1].clone()])
                .compute_bound()
                .stateful(),
            run,
        ),
        3 => finish::<B, C, 3, O>(
            StoredGradientsBackward
                .prepare::<C>([nodes[0].clone(), nodes[1].clone(), nodes[2].clone()])
                .compute_bound()
                .stateful(),
            run,
        ),
        n => unreachable!("a linear head has 2 or 3 parameters, got {n}"),
    };
    out.tracked(loss)
}

fn finish<B: FusedOps, C: CheckpointStrategy, const N: usize, T>(
    kind: OpsKind<StoredGradientsBackward, B, State<B>, C, N>,
    run: impl FnOnce(bool) -> (FloatTensor<B>, State<B>, T),
) -> (FloatTensor<Autodiff<B, C>>, T) {
    match kind {
        OpsKind::Tracked(prep) => {
            let (loss, stored, rest) = run(true);
            let mut kept: State<B> = [None, None, None];
            // The state lists only the parents the node has (x, weight, then the bias).
            for (k, g) in stored.into_iter().flatten().enumerate().take(N) {
                kept[k] = Some(g);
            }
            (prep.finish(kept, loss), rest)
        }
        OpsKind::UnTracked(prep) => {
            let (loss, _, rest) = run(false);
            (prep.finish(loss), rest)
        }
    }
}
