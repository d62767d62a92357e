//! RoPE for `Fusion<B>`: forward and backward each registered as one custom operation in
//! the fusion stream (q and k in one op, so one kernel launch), running `B`'s fused RoPE.

use crate::ops::validate;
use crate::ops::{FusedOps, RopeGrads, RopeLayout, RopeOutput};
use burn::tensor::TensorMetadata;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use core::marker::PhantomData;

/// The custom operation: inputs `[q?, k?, cos, sin]`, outputs `[q?, k?]`.
#[derive(Clone, Debug)]
struct RopeOp<B> {
    desc: CustomOpIr,
    layout: RopeLayout,
    backward: bool,
    has_q: bool,
    has_k: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedOps> Operation<B::FusionRuntime> for RopeOp<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let mut inputs = self
            .desc
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<B>(t));
        let mut next = || inputs.next().expect("custom op declared its inputs");
        let q = self.has_q.then(&mut next);
        let k = self.has_k.then(&mut next);
        let (cos, sin) = (next(), next());
        let outputs: Vec<B::FloatTensorPrimitive> = if self.backward {
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
        };
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&ir.id, tensor);
        }
    }
}

/// Validates eagerly (the stream runs later) and registers the op; returns the rotated
/// tensors where inputs were given.
pub(crate) fn rope<B: FusionBackend + FusedOps>(
    q: Option<FusionTensor<B::FusionRuntime>>,
    k: Option<FusionTensor<B::FusionRuntime>>,
    cos: FusionTensor<B::FusionRuntime>,
    sin: FusionTensor<B::FusionRuntime>,
    layout: RopeLayout,
    backward: bool,
) -> (
    Option<FusionTensor<B::FusionRuntime>>,
    Option<FusionTensor<B::FusionRuntime>>,
) {
    let op = if backward { "rope_backward" } else { "rope" };
    if q.is_none() && k.is_none() {
        return (None, None);
    }
    validate::check(validate::rope_tensors(
        op,
        q.as_ref(),
        k.as_ref(),
        &cos,
        &sin,
        backward,
        true,
    ));
    let (has_q, has_k) = (q.is_some(), k.is_some());
    let rotated: Vec<_> = q.into_iter().chain(k).collect();
    let client = cos.client.clone();
    let outputs = rotated
        .iter()
        .map(|t| TensorIr::uninit(client.create_empty_handle(), t.shape(), t.dtype()))
        .collect::<Vec<_>>();
    let mut inputs = rotated;
    inputs.extend([cos, sin]);
    let streams = OperationStreams::with_inputs(inputs.iter());
    let inputs = inputs.into_iter().map(|t| t.into_ir()).collect::<Vec<_>>();
    let id = if backward {
        "liger_rope_backward"
    } else {
        "liger_rope"
    };
    let desc = CustomOpIr::new(id, &inputs, &outputs);
    let mut out = client
        .register(
            streams,
            OperationIr::Custom(desc.clone()),
            RopeOp::<B> {
                desc,
                layout,
                backward,
                has_q,
                has_k,
                _backend: PhantomData,
            },
        )
        .into_iter();
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
