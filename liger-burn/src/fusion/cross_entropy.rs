//! Cross entropy in the fusion stream: custom operations with float and int inputs (the
//! loss, its backward, and the targets' statistics).

use super::custom_op::{self, CustomKernel, Handles};
use crate::ops::{CrossEntropyOptions, CrossEntropyRows, FusedOps, TargetStats};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::{FusionBackend, FusionTensor};
use burn_ir::TensorIr;

#[derive(Clone, Debug)]
struct CrossEntropyKernel {
    options: CrossEntropyOptions,
    weighted: bool,
    with_grad: bool,
    z_scaled: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for CrossEntropyKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        // Inputs: logits, targets (int), [class_weight], [grad_scale], [z_loss_scale].
        let logits = handles.get_float_tensor::<B>(&inputs[0]);
        let targets = handles.get_int_tensor::<B>(&inputs[1]);
        let mut floats = inputs[2..].iter();
        let class_weight = self
            .weighted
            .then(|| handles.get_float_tensor::<B>(floats.next().expect("class_weight")));
        let grad_scale = self
            .with_grad
            .then(|| handles.get_float_tensor::<B>(floats.next().expect("grad_scale")));
        let z_loss_scale = self
            .z_scaled
            .then(|| handles.get_float_tensor::<B>(floats.next().expect("z_loss_scale")));
        let rows = B::fused_cross_entropy(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            self.options,
        );
        // Outputs: loss, [z_loss], [grad_logits].
        let mut outputs = vec![rows.loss];
        outputs.extend(rows.z_loss);
        outputs.extend(rows.grad_logits);
        outputs
    }
}

pub(crate) fn forward<B: FusionBackend + FusedOps>(
    logits: FusionTensor<B::FusionRuntime>,
    targets: FusionTensor<B::FusionRuntime>,
    class_weight: Option<FusionTensor<B::FusionRuntime>>,
    grad_scale: Option<FusionTensor<B::FusionRuntime>>,
    z_loss_scale: Option<FusionTensor<B::FusionRuntime>>,
    options: CrossEntropyOptions,
) -> CrossEntropyRows<burn_fusion::Fusion<B>> {
    let shape = logits.shape();
    let dtype = logits.dtype();
    let rows = shape[0];
    let weighted = class_weight.is_some();
    let with_grad = grad_scale.is_some();
    let z_scaled = z_loss_scale.is_some();
    let mut inputs = vec![logits, targets];
    inputs.extend(class_weight);
    inputs.extend(grad_scale);
    inputs.extend(z_loss_scale);
    let mut out_specs = vec![(Shape::new([rows]), DType::F32)];
    if options.return_z_loss {
        out_specs.push((Shape::new([rows]), DType::F32));
    }
    if with_grad {
        out_specs.push((shape, dtype));
    }
    let kernel = CrossEntropyKernel {
        options,
        weighted,
        with_grad,
        z_scaled,
    };
    let mut outs =
        custom_op::register::<B, _>("liger_cross_entropy", inputs, &out_specs, kernel).into_iter();
    let loss = outs.next().expect("loss output");
    let z_loss = options
        .return_z_loss
        .then(|| outs.next().expect("z_loss output"));
    let grad_logits = with_grad.then(|| outs.next().expect("grad output"));
    CrossEntropyRows {
        loss,
        z_loss,
        grad_logits,
    }
}

#[derive(Clone, Debug)]
struct CrossEntropyBackwardKernel;

impl<B: FusionBackend + FusedOps> CustomKernel<B> for CrossEntropyBackwardKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        // Inputs: grad, grad_rows, grad_scale (a gradient the stream holds nowhere else
        // arrives as the only handle to its buffer, so the kernel works in place).
        let mut floats = custom_op::float_inputs::<B>(inputs, handles);
        let (grad, grad_rows, grad_scale) = (
            floats.next().expect("grad"),
            floats.next().expect("grad_rows"),
            floats.next().expect("grad_scale"),
        );
        vec![B::fused_cross_entropy_backward(grad, grad_rows, grad_scale)]
    }
}

/// See [`FusedOps::fused_cross_entropy_backward`].
pub(crate) fn backward<B: FusionBackend + FusedOps>(
    grad: FusionTensor<B::FusionRuntime>,
    grad_rows: FusionTensor<B::FusionRuntime>,
    grad_scale: FusionTensor<B::FusionRuntime>,
) -> FusionTensor<B::FusionRuntime> {
    let spec = (grad.shape(), grad.dtype());
    custom_op::register::<B, _>(
        "liger_cross_entropy_backward",
        vec![grad, grad_rows, grad_scale],
        &[spec],
        CrossEntropyBackwardKernel,
    )
    .pop()
    .expect("one output")
}

#[derive(Clone, Debug)]
struct TargetStatsKernel {
    vocab: usize,
    ignore_index: i64,
    weighted: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for TargetStatsKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        // Inputs: targets (int), [class_weight].
        let targets = handles.get_int_tensor::<B>(&inputs[0]);
        let class_weight = self
            .weighted
            .then(|| handles.get_float_tensor::<B>(&inputs[1]));
        let stats = B::fused_target_stats(targets, class_weight, self.vocab, self.ignore_index);
        vec![stats.weight_scale, stats.row_scale, stats.out_of_range]
    }
}

/// See [`FusedOps::fused_target_stats`].
pub(crate) fn target_stats<B: FusionBackend + FusedOps>(
    targets: FusionTensor<B::FusionRuntime>,
    class_weight: Option<FusionTensor<B::FusionRuntime>>,
    vocab: usize,
    ignore_index: i64,
) -> TargetStats<burn_fusion::Fusion<B>> {
    let kernel = TargetStatsKernel {
        vocab,
        ignore_index,
        weighted: class_weight.is_some(),
    };
    let mut inputs = vec![targets];
    inputs.extend(class_weight);
    let scalar = (Shape::new([1]), DType::F32);
    let [weight_scale, row_scale, out_of_range]: [_; 3] = custom_op::register::<B, _>(
        "liger_target_stats",
        inputs,
        &[scalar.clone(), scalar.clone(), scalar],
        kernel,
    )
    .try_into()
    .expect("three outputs");
    TargetStats {
        weight_scale,
        row_scale,
        out_of_range,
    }
}
