//! Attention for `Fusion<B>`: when `B` runs the flash kernels for the inputs, the forward
//! (outputs: the attention and `lse`) and the backward (outputs: the gradients of q, k, v)
//! are each one custom operation in the fusion stream running `B`'s; otherwise the
//! blockwise composition runs on `Fusion<B>` itself, its stock ops fused by the stream.

use super::custom_op::{self, CustomKernel, Handles};
use crate::ops::{
    AttentionGrads, AttentionKernel, AttentionOptions, AttentionOutput, FusedOps, compose,
};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

type Tensor<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

/// The forward: inputs `[q, k, v, document_ids?]`, outputs `[output, lse]`.
#[derive(Clone, Debug)]
struct Forward {
    options: AttentionOptions,
    documents: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for Forward {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let [q, k, v] = [0, 1, 2].map(|i| handles.get_float_tensor::<B>(&inputs[i]));
        let ids = self
            .documents
            .then(|| handles.get_int_tensor::<B>(&inputs[3]));
        let out = B::fused_attention(q, k, v, None, ids, self.options);
        let lse = out
            .lse
            .expect("attention: the inner backend ran the flash kernels it reported");
        vec![out.output, lse]
    }
}

/// The backward: inputs `[grad_output, q, k, v, output, lse, document_ids?]`, outputs
/// `[grad_q, grad_k, grad_v]`.
#[derive(Clone, Debug)]
struct Backward {
    options: AttentionOptions,
    documents: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for Backward {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let [g, q, k, v, output, lse] =
            [0, 1, 2, 3, 4, 5].map(|i| handles.get_float_tensor::<B>(&inputs[i]));
        let ids = self
            .documents
            .then(|| handles.get_int_tensor::<B>(&inputs[6]));
        let forward = AttentionOutput {
            output,
            lse: Some(lse),
        };
        let grads = B::fused_attention_backward(g, q, k, v, None, ids, Some(forward), self.options);
        vec![grads.grad_q, grads.grad_k, grads.grad_v]
    }
}

fn flash<B: FusionBackend + FusedOps>(q: &Tensor<B>, options: &AttentionOptions) -> bool {
    B::flash_attention_variant(q.client.device(), q.dtype(), q.shape()[3], options).is_some()
}

/// `fused_attention` for `Fusion<B>`.
pub(crate) fn forward<B: FusionBackend + FusedOps>(
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
    mask: Option<Tensor<B>>,
    document_ids: Option<Tensor<B>>,
    options: AttentionOptions,
) -> AttentionOutput<Fusion<B>> {
    if mask.is_some() && options.kernel == AttentionKernel::Flash {
        panic!(
            "attention: AttentionKernel::Flash cannot take a mask tensor (the flash kernels build causal, window and document masks from positions and ids)"
        );
    }
    if mask.is_some() || !flash::<B>(&q, &options) {
        return compose::attention::forward::<Fusion<B>>(q, k, v, mask, document_ids, options);
    }
    let shape = q.shape();
    let outputs = [
        (shape.clone(), q.dtype()),
        (Shape::new([shape[0], shape[1], shape[2]]), DType::F32),
    ];
    let documents = document_ids.is_some();
    let mut inputs = vec![q, k, v];
    inputs.extend(document_ids);
    let [output, lse]: [_; 2] = custom_op::register::<B, _>(
        "liger_flash_attention",
        inputs,
        &outputs,
        Forward { options, documents },
    )
    .try_into()
    .expect("two outputs");
    AttentionOutput {
        output,
        lse: Some(lse),
    }
}

/// `fused_attention_backward` for `Fusion<B>`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<B: FusionBackend + FusedOps>(
    grad_output: Tensor<B>,
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
    mask: Option<Tensor<B>>,
    document_ids: Option<Tensor<B>>,
    forward: Option<AttentionOutput<Fusion<B>>>,
    options: AttentionOptions,
) -> AttentionGrads<Fusion<B>> {
    let saved = forward.and_then(|f| Some((f.output, f.lse?)));
    let (Some((output, lse)), None) = (saved, &mask) else {
        return compose::attention::backward::<Fusion<B>>(
            grad_output,
            q,
            k,
            v,
            mask,
            document_ids,
            options,
        );
    };
    let outputs = [
        (q.shape(), q.dtype()),
        (k.shape(), k.dtype()),
        (v.shape(), v.dtype()),
    ];
    let documents = document_ids.is_some();
    let mut inputs = vec![grad_output, q, k, v, output, lse];
    inputs.extend(document_ids);
    let [grad_q, grad_k, grad_v]: [_; 3] = custom_op::register::<B, _>(
        "liger_flash_attention_backward",
        inputs,
        &outputs,
        Backward { options, documents },
    )
    .try_into()
    .expect("three outputs");
    AttentionGrads {
        grad_q,
        grad_k,
        grad_v,
    }
}

/// `flash_attention_variant` for `Fusion<B>`: `B`'s.
pub(crate) fn variant<B: FusionBackend + FusedOps>(
    device: &B::Device,
    dtype: DType,
    head_dim: usize,
    options: &AttentionOptions,
) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
    B::flash_attention_variant(device, dtype, head_dim, options)
}
