//! A distillation chunk's rows in the fusion stream: one custom operation with float and
//! int inputs.

use super::custom_op::{self, CustomKernel, Handles};
use crate::ops::{DistillOptions, DistillRows, FusedOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::{FusionBackend, FusionTensor};
use burn_ir::TensorIr;

#[derive(Clone, Debug)]
struct DistillRowsKernel {
    options: DistillOptions,
    with_grad: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for DistillRowsKernel {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        // Inputs: student, teacher, targets (int), [grad_scale].
        let student = handles.get_float_tensor::<B>(&inputs[0]);
        let teacher = handles.get_float_tensor::<B>(&inputs[1]);
        let targets = handles.get_int_tensor::<B>(&inputs[2]);
        let grad_scale = self
            .with_grad
            .then(|| handles.get_float_tensor::<B>(&inputs[3]));
        let rows = B::fused_distill_rows(student, teacher, targets, grad_scale, self.options);
        // Outputs: soft_loss, hard_loss, [grad_logits].
        let mut outputs = vec![rows.soft_loss, rows.hard_loss];
        outputs.extend(rows.grad_logits);
        outputs
    }
}

pub(crate) fn forward<B: FusionBackend + FusedOps>(
    student: FusionTensor<B::FusionRuntime>,
    teacher: FusionTensor<B::FusionRuntime>,
    targets: FusionTensor<B::FusionRuntime>,
    grad_scale: Option<FusionTensor<B::FusionRuntime>>,
    options: DistillOptions,
) -> DistillRows<burn_fusion::Fusion<B>> {
    let shape = student.shape();
    let dtype = student.dtype();
    let rows = shape[0];
    let with_grad = grad_scale.is_some();
    let mut inputs = vec![student, teacher, targets];
    inputs.extend(grad_scale);
    let mut out_specs = vec![
        (Shape::new([rows]), DType::F32),
        (Shape::new([rows]), DType::F32),
    ];
    if with_grad {
        out_specs.push((shape, dtype));
    }
    let kernel = DistillRowsKernel { options, with_grad };
    let mut outs =
        custom_op::register::<B, _>("liger_distill_rows", inputs, &out_specs, kernel).into_iter();
    let soft_loss = outs.next().expect("soft_loss output");
    let hard_loss = outs.next().expect("hard_loss output");
    let grad_logits = with_grad.then(|| outs.next().expect("grad output"));
    DistillRows {
        soft_loss,
        hard_loss,
        grad_logits,
    }
}
