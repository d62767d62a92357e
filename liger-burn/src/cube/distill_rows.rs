//! A distillation chunk's rows on CubeCL tensors: one kernel for both losses and the
//! student's gradient.

use super::cross_entropy::to_f32;
use super::{empty_like, launched};
use crate::ops::{DistillOptions, DistillRows, Divergence, FusedOps};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata, backend::Backend};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::distill_rows::{
    DistillDivergence, DistillGrad, DistillRowsBuffers, DistillRowsOptions, distill_rows,
};

fn kernel_divergence(divergence: Divergence) -> (DistillDivergence, f32) {
    match divergence.jsd_beta() {
        Some(0.0) => (DistillDivergence::ForwardKl, 0.0),
        Some(1.0) => (DistillDivergence::ReverseKl, 1.0),
        Some(beta) => (DistillDivergence::Jsd, beta as f32),
        None => (DistillDivergence::Tvd, 0.0),
    }
}

pub(crate) fn forward<B, R: CubeRuntime>(
    student: CubeTensor<R>,
    teacher: CubeTensor<R>,
    targets: CubeTensor<R>,
    grad_scale: Option<CubeTensor<R>>,
    options: DistillOptions,
) -> DistillRows<B>
where
    B: FusedOps + Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>,
{
    // The kernel reads both heads in one dtype (the API entry gives the teacher the
    // student's); anything else takes the composition.
    if student.dtype != teacher.dtype {
        return crate::ops::compose::distill_rows::forward::<B>(
            student, teacher, targets, grad_scale, options,
        );
    }
    let student = into_contiguous(student);
    let teacher = into_contiguous(teacher);
    let (rows, vocab) = (student.shape()[0], student.shape()[1]);
    let teacher_vocab = teacher.shape()[1];
    // The kernel reads i32 or i64 targets; narrower or unsigned ones are widened to i32.
    let targets = match targets.dtype {
        DType::I32 | DType::I64 => targets,
        _ => B::int_cast(targets, IntDType::I32),
    };
    let targets = into_contiguous(targets);
    let grad_scale = grad_scale.map(to_f32::<B, R>);
    let soft_loss = empty_like(&student, Shape::new([rows]), DType::F32);
    let hard_loss = empty_like(&student, Shape::new([rows]), DType::F32);
    // The gradient goes over the student's logits when nothing else holds their buffer
    // (the chunked loss moves a fresh matmul output in); otherwise into a new buffer.
    let in_place = grad_scale.is_some() && student.can_mut();
    let grad_out = (grad_scale.is_some() && !in_place)
        .then(|| empty_like(&student, student.shape(), student.dtype));
    let grad = match (&grad_scale, &grad_out) {
        (None, _) => DistillGrad::None,
        (Some(s), None) => DistillGrad::InPlace { scale: &s.handle },
        (Some(s), Some(g)) => DistillGrad::Into {
            scale: &s.handle,
            grad: &g.handle,
        },
    };
    let (divergence, beta) = kernel_divergence(options.divergence);
    launched(distill_rows::<R>(
        &student.client,
        &super::launch_config(&student.client),
        DistillRowsBuffers {
            student: &student.handle,
            teacher: &teacher.handle,
            targets: &targets.handle,
            grad,
            soft_loss: &soft_loss.handle,
            hard_loss: &hard_loss.handle,
        },
        rows,
        vocab,
        teacher_vocab,
        DistillRowsOptions {
            divergence,
            beta,
            temperature: options.temperature as f32,
            soft_weight: options.weight_soft_loss as f32,
            hard_weight: options.weight_hard_loss as f32,
            ignore_index: options.ignore_index,
        },
        student.dtype.into(),
        targets.dtype.into(),
    ));
    let grad_logits = if in_place { Some(student) } else { grad_out };
    DistillRows {
        soft_loss,
        hard_loss,
        grad_logits,
    }
}
