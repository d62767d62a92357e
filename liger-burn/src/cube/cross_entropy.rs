//! Cross entropy on CubeCL tensors.

use super::{empty_like, launched};
use crate::ops::{CrossEntropyOptions, CrossEntropyRows};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata, backend::Backend};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::cross_entropy::{
    CrossEntropyBuffers, CrossEntropyKernelOptions, GradTarget, cross_entropy,
    cross_entropy_backward, target_stats,
};

/// `x` in f32, dense.
pub(super) fn to_f32<B, R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let x = if x.dtype == DType::F32 {
        x
    } else {
        B::float_cast(x, burn::tensor::FloatDType::F32)
    };
    into_contiguous(x)
}

/// i32 or i64 targets, dense: narrower or unsigned ones are widened to i32.
fn kernel_targets<B, R: CubeRuntime>(targets: CubeTensor<R>) -> CubeTensor<R>
where
    B: Backend<IntTensorPrimitive = CubeTensor<R>>,
{
    let targets = match targets.dtype {
        DType::I32 | DType::I64 => targets,
        _ => B::int_cast(targets, IntDType::I32),
    };
    into_contiguous(targets)
}

/// See [`FusedOps::fused_target_stats`](crate::ops::FusedOps::fused_target_stats).
pub(crate) fn stats<B, R: CubeRuntime>(
    targets: CubeTensor<R>,
    class_weight: Option<CubeTensor<R>>,
    vocab: usize,
    ignore_index: i64,
) -> crate::ops::TargetStats<B>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>,
{
    let targets = kernel_targets::<B, R>(targets);
    let class_weight = class_weight.map(to_f32::<B, R>);
    let scalar = || empty_like(&targets, Shape::new([1]), DType::F32);
    let (weight_scale, row_scale, out_of_range) = (scalar(), scalar(), scalar());
    launched(target_stats::<R>(
        &targets.client,
        &super::launch_config(&targets.client),
        &targets.handle,
        class_weight.as_ref().map(|w| &w.handle),
        [
            &weight_scale.handle,
            &row_scale.handle,
            &out_of_range.handle,
        ],
        targets.shape().num_elements(),
        vocab,
        ignore_index,
        targets.dtype.into(),
    ));
    crate::ops::TargetStats {
        weight_scale,
        row_scale,
        out_of_range,
    }
}

pub(crate) fn forward<B, R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    class_weight: Option<CubeTensor<R>>,
    grad_scale: Option<CubeTensor<R>>,
    z_loss_scale: Option<CubeTensor<R>>,
    options: CrossEntropyOptions,
) -> CrossEntropyRows<B>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>,
{
    let logits = into_contiguous(logits);
    let shape = logits.shape();
    let (rows, vocab) = (shape[0], shape[1]);
    let targets = kernel_targets::<B, R>(targets);
    // Class weights in f32 (a `[V]` vector) and their sum, both on the device.
    let class_weight = class_weight.map(|w| {
        let w = to_f32::<B, R>(w);
        let sum = into_contiguous(B::float_sum(w.clone()));
        (w, sum)
    });
    let grad_scale = grad_scale.map(to_f32::<B, R>);
    // Without a gradient the z-loss scale has nothing to scale.
    let z_loss_scale = z_loss_scale
        .filter(|_| grad_scale.is_some())
        .map(to_f32::<B, R>);
    let loss = empty_like(&logits, Shape::new([rows]), DType::F32);
    let z_loss = options
        .return_z_loss
        .then(|| empty_like(&logits, Shape::new([rows]), DType::F32));
    // The gradient goes over the logits when nothing else holds their buffer (the usual
    // case: the logits are a fresh matmul output moved into the loss), as Liger does;
    // otherwise into a new buffer.
    let in_place = grad_scale.is_some() && logits.can_mut() && logits.is_contiguous();
    let grad_out = (grad_scale.is_some() && !in_place)
        .then(|| empty_like(&logits, shape.clone(), logits.dtype));
    let grad = match (&grad_scale, in_place, &grad_out) {
        (None, _, _) => GradTarget::None,
        (Some(_), true, _) => GradTarget::InPlace,
        (Some(_), false, Some(g)) => GradTarget::Into(&g.handle),
        (Some(_), false, None) => unreachable!("a gradient buffer was allocated"),
    };
    launched(cross_entropy::<R>(
        &logits.client,
        &super::launch_config(&logits.client),
        CrossEntropyBuffers {
            logits: &logits.handle,
            targets: &targets.handle,
            class_weight: class_weight.as_ref().map(|(w, s)| (&w.handle, &s.handle)),
            grad_scale: grad_scale
                .as_ref()
                .map(|s| (&s.handle, s.shape().num_elements() != 1)),
            z_loss_scale: z_loss_scale.as_ref().map(|s| &s.handle),
            grad,
            loss: &loss.handle,
            z_loss: z_loss.as_ref().map(|z| &z.handle),
        },
        rows,
        vocab,
        CrossEntropyKernelOptions {
            ignore_index: options.ignore_index,
            label_smoothing: options.label_smoothing as f32,
            lse_square_scale: options.lse_square_scale as f32,
            softcap: options.softcap.map(|c| c as f32),
        },
        logits.dtype.into(),
        targets.dtype.into(),
    ));
    let grad_logits = if in_place { Some(logits) } else { grad_out };
    CrossEntropyRows {
        loss,
        z_loss,
        grad_logits,
    }
}

/// See [`FusedOps::fused_cross_entropy_backward`](crate::ops::FusedOps::fused_cross_entropy_backward):
/// in place, with no host read, when nothing else holds `grad`'s buffer; otherwise the
/// composed default (one flag read back), so a shared gradient is never copied for nothing.
pub(crate) fn backward<B, R: CubeRuntime>(
    grad: CubeTensor<R>,
    grad_rows: CubeTensor<R>,
    grad_scale: CubeTensor<R>,
) -> CubeTensor<R>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    if !(grad.can_mut() && grad.is_contiguous()) {
        return crate::ops::compose::cross_entropy::backward::<B>(grad, grad_rows, grad_scale);
    }
    let shape = grad.shape();
    let (rows, vocab) = (shape[0], shape[1]);
    let per_row_scale = grad_scale.shape().num_elements() != 1;
    let grad_rows = to_f32::<B, R>(grad_rows);
    let grad_scale = to_f32::<B, R>(grad_scale);
    launched(cross_entropy_backward::<R>(
        &grad.client,
        &super::launch_config(&grad.client),
        &grad.handle,
        &grad_rows.handle,
        (&grad_scale.handle, per_row_scale),
        rows,
        vocab,
        grad.dtype.into(),
    ));
    grad
}
