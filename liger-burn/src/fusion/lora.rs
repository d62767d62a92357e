//! The LoRA linear layer in the fusion stream. Where the inner backend runs its products on
//! a vendor library (cuBLASLt on CUDA), the forward's two paths and the backward are one
//! custom operation each, running the inner backend's chained products, and the forward's
//! sum is stock operations the fusion optimizer fuses; everywhere else the default
//! composition of stock operations.

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::compose::lora::LayerDims;
use crate::ops::{
    FusedOps, LoraLinearGrads, LoraLinearGradsWanted, LoraLinearParts, LoraOptions, compose,
};
use burn::tensor::{Shape, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

/// Whether the layer is one custom operation for activations of this dtype.
fn as_custom_op<B: FusionBackend + FusedOps>(
    x: &FusionTensor<B::FusionRuntime>,
    options: LoraOptions,
) -> bool {
    let dtype = x.dtype();
    let device = x.client.device();
    B::fused_matmul_uses_vendor_library(device, dtype)
        && B::fused_matmul_uses_vendor_library(device, options.precision.compute_dtype(dtype))
}

/// The forward's custom operation: the two paths before their sum. Inputs: x, weight,
/// [bias], [adapter_x], A, B; outputs: base, adapter, hidden.
#[derive(Clone, Copy, Debug)]
struct LoraParts {
    options: LoraOptions,
    bias: bool,
    separate: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for LoraParts {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        let (x, weight) = (next(), next());
        let bias = self.bias.then(&mut next);
        let adapter_x = self.separate.then(&mut next);
        let (a, b) = (next(), next());
        let parts = B::fused_lora_linear_parts(x, weight, bias, adapter_x, a, b, self.options);
        vec![parts.base, parts.adapter, parts.hidden]
    }
}

/// See [`FusedOps::fused_lora_linear_parts`]: one custom operation where the inner backend
/// runs the products on a vendor library, so the sum that follows
/// ([`compose::lora::add_adapter`], in the fusion stream) fuses its casts.
pub(crate) fn parts<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    weight: FusionTensor<B::FusionRuntime>,
    bias: Option<FusionTensor<B::FusionRuntime>>,
    adapter_x: Option<FusionTensor<B::FusionRuntime>>,
    a: FusionTensor<B::FusionRuntime>,
    b: FusionTensor<B::FusionRuntime>,
    options: LoraOptions,
) -> LoraLinearParts<Fusion<B>> {
    if !as_custom_op::<B>(&x, options) {
        return compose::lora::parts::<Fusion<B>>(x, weight, bias, adapter_x, a, b, options);
    }
    let shape = x.shape();
    let dtype = x.dtype();
    let c = options.precision.compute_dtype(dtype);
    let LayerDims {
        rows, d_out, rank, ..
    } = LayerDims::of(&shape, &weight.shape(), &a.shape());
    let kernel = LoraParts {
        options,
        bias: bias.is_some(),
        separate: adapter_x.is_some(),
    };
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    inputs.extend(adapter_x);
    inputs.extend([a, b]);
    let outputs = [
        (Shape::new([rows, d_out]), dtype),
        (Shape::new([rows, d_out]), c),
        (Shape::new([rows, rank]), c),
    ];
    let mut outs =
        custom_op::register::<B, _>("liger_lora_linear", inputs, &outputs, kernel).into_iter();
    let mut next = || outs.next().expect("declared output");
    LoraLinearParts {
        base: next(),
        adapter: next(),
        hidden: next(),
    }
}

/// The backward's custom operation. Inputs: grad_output, adapter_input, weight, A, B,
/// hidden; outputs: the gradients `wanted` asks for, in `LoraLinearGrads`' order.
#[derive(Clone, Copy, Debug)]
struct LoraBackward {
    options: LoraOptions,
    separate: bool,
    wanted: LoraLinearGradsWanted,
}

impl LoraBackward {
    /// Whether each of `grad_x`, `grad_adapter_x`, `grad_a`, `grad_b` is produced.
    fn produced(&self) -> [bool; 4] {
        [
            self.wanted.x,
            self.separate && self.wanted.adapter_x,
            self.wanted.a,
            self.wanted.b,
        ]
    }
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for LoraBackward {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        let (grad, adapter_input, weight, a, b, hidden) =
            (next(), next(), next(), next(), next(), next());
        let g = B::fused_lora_linear_backward(
            grad,
            adapter_input,
            self.separate,
            weight,
            a,
            b,
            hidden,
            self.options,
            self.wanted,
        );
        let grads = [g.grad_x, g.grad_adapter_x, g.grad_a, g.grad_b];
        grads
            .into_iter()
            .zip(self.produced())
            .filter(|(_, produced)| *produced)
            .map(|(grad, _)| grad.expect("the backward computes every gradient asked for"))
            .collect()
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<B: FusionBackend + FusedOps>(
    grad_output: FusionTensor<B::FusionRuntime>,
    adapter_input: FusionTensor<B::FusionRuntime>,
    separate: bool,
    weight: FusionTensor<B::FusionRuntime>,
    a: FusionTensor<B::FusionRuntime>,
    b: FusionTensor<B::FusionRuntime>,
    hidden: FusionTensor<B::FusionRuntime>,
    options: LoraOptions,
    wanted: LoraLinearGradsWanted,
) -> LoraLinearGrads<Fusion<B>> {
    if !as_custom_op::<B>(&adapter_input, options) {
        return compose::lora::backward::<Fusion<B>>(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        );
    }
    let kernel = LoraBackward {
        options,
        separate,
        wanted,
    };
    let x_spec = (adapter_input.shape(), adapter_input.dtype());
    let specs = [
        x_spec.clone(),
        x_spec,
        (a.shape(), a.dtype()),
        (b.shape(), b.dtype()),
    ];
    let outputs = specs
        .into_iter()
        .zip(kernel.produced())
        .filter(|(_, produced)| *produced)
        .map(|(spec, _)| spec)
        .collect::<Vec<_>>();
    let inputs = vec![grad_output, adapter_input, weight, a, b, hidden];
    let mut outs =
        custom_op::register::<B, _>("liger_lora_linear_backward", inputs, &outputs, kernel)
            .into_iter();
    let mut take = |produced: bool| produced.then(|| outs.next().expect("declared output"));
    let [x, adapter_x, ga, gb] = kernel.produced();
    LoraLinearGrads {
        grad_x: take(x),
        grad_adapter_x: take(adapter_x),
        grad_a: take(ga),
        grad_b: take(gb),
    }
}
