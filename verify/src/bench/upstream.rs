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

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::{ones, root};
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{Tensor, TensorData, Tolerance};

    type B = NdArray<f32>;

    #[test]
    fn each_output_gets_its_given_gradient() {
        let device = Default::default();
        let xs = [1.0f32, -2.0, 0.5];
        let x = Tensor::<Autodiff<B>, 1>::from_floats(xs, &device).require_grad();
        let y = x.clone() * 3.0;
        let z = x.clone().exp();
        let dy = [0.5f32, 2.0, -1.0];
        let dz = [-1.5f32, 0.25, 4.0];
        let upstream = [
            Some(Tensor::<B, 1>::from_floats(dy, &device)),
            Some(Tensor::<B, 1>::from_floats(dz, &device)),
        ];
        let r = root(&[y, z], &upstream);
        assert_eq!(r.dims(), [1]);
        let grad = x.grad(&r.backward()).unwrap().into_data();
        // d/dx of Σ dy·3x + Σ dz·exp(x), not Burn's seed of ones (3 + exp(x)).
        let expected: Vec<f32> = (0..3).map(|i| 3.0 * dy[i] + xs[i].exp() * dz[i]).collect();
        // Each side rounds a product, an exponential (within an ulp) and a sum of terms
        // under 8 in size, in f32: a few units of 2^-24 of 8 apart at most.
        let bound = Tolerance::rel_abs(4.0 * f32::EPSILON, 8.0 * 8.0 * f32::EPSILON / 2.0);
        grad.assert_approx_eq::<f32>(&TensorData::from(expected.as_slice()), bound);
        let seeded: Vec<f32> = xs.iter().map(|x| 3.0 + x.exp()).collect();
        assert!(
            grad.to_vec::<f32>()
                .unwrap()
                .iter()
                .zip(&seeded)
                .any(|(g, s)| (g - s).abs() > 1e-3),
            "the given gradients must differ from Burn's seed for this test to tell them apart"
        );
    }

    #[test]
    fn a_scalar_output_is_its_own_root() {
        let device = Default::default();
        let x = Tensor::<Autodiff<B>, 1>::from_floats([1.0f32, 2.0], &device).require_grad();
        let loss = (x.clone() * 2.0).sum();
        let upstream = ones(std::slice::from_ref(&loss.clone().inner()));
        assert!(
            upstream[0].is_none(),
            "a one-element output takes Burn's seed"
        );
        let grad = x
            .grad(&root(&[loss], &upstream).backward())
            .unwrap()
            .into_data();
        // 2·1 is exact in f32.
        grad.assert_approx_eq::<f32>(&TensorData::from([2.0f32, 2.0]), Tolerance::strict());
    }

    #[test]
    fn ones_match_the_outputs() {
        let device = Default::default();
        let out = Tensor::<B, 1>::from_floats([1.0f32, 2.0, 3.0, 4.0], &device);
        let made = ones(&[out]);
        let dy = made[0]
            .clone()
            .expect("a gradient for a four-element output");
        assert_eq!(dy.to_data().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    }
}
