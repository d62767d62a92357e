//! The root of a timed backward that hands each output a given gradient, as PyTorch's
//! `torch.autograd.grad(outputs, inputs, grad_outputs=dy)` does in the anchor
//! (`scripts/device/anchor_kernels.py`).
//!
//! Burn's `backward()` seeds its root with ones of the root's shape. Called on a
//! non-scalar output, that is a fill kernel as large as the output in every iteration
//! (53 µs for SwiGLU's 8192×14336 bf16 output on an H200), work that the anchor does not
//! do. Here the root is one element, so Burn's seed is one element too, and its backward
//! hands each output the gradient made once per input set.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

#[derive(Debug)]
struct GivenGradient;

impl<B: Backend> Backward<B, 1> for GivenGradient {
    /// The gradient handed to the output.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = ops.state;
        // The root's own gradient is Burn's one-element seed: it only starts the pass.
        unary::<B, _>(ops.parents, ops.node, grads, |_seed| upstream);
    }
}

/// A one-element root (value 0, not a loss) whose backward gives `output` the gradient
/// `upstream` (`[n]`, the shape and dtype of `output`).
fn given<B: Backend>(
    output: Tensor<Autodiff<B>, 1>,
    upstream: &Tensor<B, 1>,
) -> Tensor<Autodiff<B>, 1> {
    assert_eq!(
        output.dims(),
        upstream.dims(),
        "bench: the upstream gradient must have its output's shape"
    );
    let device = output.device();
    let dtype = output.dtype();
    let output = output.into_primitive().tensor();
    let value = B::float_zeros([1].into(), &device, dtype.into());
    let root = match GivenGradient
        .prepare::<NoCheckpointing>([output.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(upstream.clone().into_primitive().tensor(), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    Tensor::from_primitive(TensorPrimitive::Float(root))
}

/// The root of the backward of `outputs` (the differentiated ones, see
/// [`super::ops::differentiated`]) with gradients `upstream`, one per output, in order;
/// an output without one (a scalar loss) is its own root, seeded by Burn with a one.
pub fn root<B: Backend>(
    outputs: &[Tensor<Autodiff<B>, 1>],
    upstream: &[Option<Tensor<B, 1>>],
) -> Tensor<Autodiff<B>, 1> {
    assert_eq!(
        outputs.len(),
        upstream.len(),
        "bench: one upstream entry per output"
    );
    outputs
        .iter()
        .zip(upstream)
        .map(|(output, dy)| match dy {
            Some(dy) => given(output.clone(), dy),
            None => output.clone(),
        })
        .reduce(|a, b| a + b)
        .expect("bench: an op has at least one output")
}

/// The gradients `root` hands to `outputs` (the forward's outputs on the inner backend,
/// used for their shapes and dtypes only): ones, as the anchor's; `None` for a
/// one-element output.
pub fn ones<B: Backend>(outputs: &[Tensor<B, 1>]) -> Vec<Option<Tensor<B, 1>>> {
    outputs
        .iter()
        .map(|o| (o.dims()[0] > 1).then(|| Tensor::ones(o.shape(), (&o.device(), o.dtype()))))
        .collect()
}
