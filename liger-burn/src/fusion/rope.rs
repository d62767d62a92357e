//! RoPE for `Fusion<B>`: forward and backward each registered as one custom operation in
//! the fusion stream (q and k in one op, so one kernel launch), running `B`'s fused RoPE.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{FusedOps, RopeGrads, RopeLayout, RopeOutput};
use burn::tensor::TensorMetadata;
use burn_fusion::{FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// The custom operation: inputs `[q?, k?, cos, sin]`, outputs `[q?, k?]`.
#[derive(Clone, Debug)]
struct RopeKernel {
    layout: RopeLayout,
    backward: bool,
    has_q: bool,
    has_k: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for RopeKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        let q = self.has_q.then(&mut next);
        let k = self.has_k.then(&mut next);
        let (cos, sin) = (next(), next());
        if self.backward {
            let grads = B::fused_rope_backward(q, k, cos, sin, self.layout);
            grads.grad_q.into_iter().chain(grads.grad_k).collect()
        } else {
            let out = B::fused_rope(
                q.expect("forward has q"),
                k.expect("forward has k"),
                cos,
                sin,
                self.layout,
            );
            vec![out.q, out.k]
        }
    }
}

/// The rotated (or, backward, the gradients of) q and k, each when given.
type RopePair<B> = (
    Option<FusionTensor<<B as FusionBackend>::FusionRuntime>>,
    Option<FusionTensor<<B as FusionBackend>::FusionRuntime>>,
);

/// Registers the op; returns the rotated tensors where inputs were given.
pub(crate) fn rope<B: FusionBackend + FusedOps>(
    q: Option<FusionTensor<B::FusionRuntime>>,
    k: Option<FusionTensor<B::FusionRuntime>>,
    cos: FusionTensor<B::FusionRuntime>,
    sin: FusionTensor<B::FusionRuntime>,
    layout: RopeLayout,
    backward: bool,
) -> RopePair<B> {
    if q.is_none() && k.is_none() {
        return (None, None);
    }
    let (has_q, has_k) = (q.is_some(), k.is_some());
    let rotated: Vec<_> = q.into_iter().chain(k).collect();
    let outputs: Vec<_> = rotated.iter().map(|t| (t.shape(), t.dtype())).collect();
    let mut inputs = rotated;
    inputs.extend([cos, sin]);
    let id = if backward {
        "liger_rope_backward"
    } else {
        "liger_rope"
    };
    let kernel = RopeKernel {
        layout,
        backward,
        has_q,
        has_k,
    };
    let mut out = custom_op::register::<B, _>(id, inputs, &outputs, kernel).into_iter();
    let q = has_q.then(|| out.next().expect("rotated q"));
    let k = has_k.then(|| out.next().expect("rotated k"));
    (q, k)
}

/// `fused_rope` for `Fusion<B>`.
pub(crate) fn forward<B: FusionBackend + FusedOps>(
    q: FusionTensor<B::FusionRuntime>,
    k: FusionTensor<B::FusionRuntime>,
    cos: FusionTensor<B::FusionRuntime>,
    sin: FusionTensor<B::FusionRuntime>,
    layout: RopeLayout,
) -> RopeOutput<burn_fusion::Fusion<B>> {
    let (q, k) = rope::<B>(Some(q), Some(k), cos, sin, layout, false);
    RopeOutput {
        q: q.expect("q was given"),
        k: k.expect("k was given"),
    }
}

/// `fused_rope_backward` for `Fusion<B>`.
pub(crate) fn backward<B: FusionBackend + FusedOps>(
    grad_q: Option<FusionTensor<B::FusionRuntime>>,
    grad_k: Option<FusionTensor<B::FusionRuntime>>,
    cos: FusionTensor<B::FusionRuntime>,
    sin: FusionTensor<B::FusionRuntime>,
    layout: RopeLayout,
) -> RopeGrads<burn_fusion::Fusion<B>> {
    let (grad_q, grad_k) = rope::<B>(grad_q, grad_k, cos, sin, layout, true);
    RopeGrads { grad_q, grad_k }
}
