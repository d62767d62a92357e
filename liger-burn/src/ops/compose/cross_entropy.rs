//! Cross entropy as stock Burn ops (f32 math), the same formulas as the fused kernel.
//!
//! This composition materializes several `[N, V]` f32 temporaries; it is the fallback for
//! backends without CubeCL and the reference the fused kernels must equal.

use super::{to_dtype, to_f32};
use crate::ops::{CrossEntropyOptions, CrossEntropyRows};
use burn::tensor::{
    Bool, DType, Int, Tensor, TensorMetadata, TensorPrimitive,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

fn float<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn prim<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// Rows whose target is in `[0, V)` and not `ignore_index`: `[N]`. The others are treated
/// as ignored here rather than rejected: target values live on the device, and the API
/// entry checks them with one read once the loss is queued
/// (`functional::check_target_bounds`), so nothing reads out of bounds before that.
pub(crate) fn valid_rows<B: Backend>(
    targets: Tensor<B, 1, Int>,
    vocab: usize,
    ignore_index: i64,
) -> Tensor<B, 1, Bool> {
    targets
        .clone()
        .greater_equal_elem(0)
        .bool_and(targets.clone().lower_elem(vocab as i64))
        .bool_and(targets.not_equal_elem(ignore_index))
}

/// `mask` as f32 ones and zeros.
pub(crate) fn mask_f32<B: Backend, const D: usize>(mask: Tensor<B, D, Bool>) -> Tensor<B, D> {
    mask.float().cast(DType::F32)
}

/// See [`FusedOps::fused_cross_entropy`](crate::ops::FusedOps::fused_cross_entropy).
pub fn forward<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    grad_scale: Option<FloatTensor<B>>,
    z_loss_scale: Option<FloatTensor<B>>,
    options: CrossEntropyOptions,
) -> CrossEntropyRows<B> {
    let dtype = logits.dtype();
    let shape = logits.shape();
    let (n, v) = (shape[0], shape[1]);
    let x: Tensor<B, 2> = float(to_f32::<B>(logits));
    let device = x.device();
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let valid = valid_rows(targets.clone(), v, options.ignore_index);
    // Invalid rows read class 0 (always in range) and are set to zero by `invalid`, a
    // fill rather than a product so that a NaN or infinite logit there stays out.
    let invalid = valid.clone().bool_not().reshape([n, 1]);
    let safe = targets.mask_fill(valid.bool_not(), 0).reshape([n, 1]);

    let (z, chain) = match options.softcap {
        Some(c) => {
            let t = (x / c).tanh();
            let chain = t.clone().powi_scalar(2).neg() + 1.0;
            (t * c, Some(chain))
        }
        None => (x, None),
    };
    let max = z.clone().max_dim(1);
    let sum_exp = (z.clone() - max.clone()).exp().sum_dim(1);
    let lse = max.clone() + sum_exp.log(); // [n, 1]
    let z_y = z.clone().gather(1, safe.clone());
    let weights = class_weight.map(|w| float::<B, 1>(to_f32::<B>(w)).reshape([1, v]));
    let (w_y, sum_w) = match &weights {
        Some(w) => (
            w.clone()
                .reshape([v])
                .gather(0, safe.clone().reshape([n]))
                .reshape([n, 1]),
            w.clone().sum().reshape([1, 1]),
        ),
        None => (
            Tensor::<B, 2>::ones([n, 1], &device).cast(DType::F32),
            Tensor::<B, 2>::full([1, 1], v as f32, &device).cast(DType::F32),
        ),
    };
    let eps = options.label_smoothing;
    let lambda = options.lse_square_scale;
    let mut ce = w_y.clone() * (lse.clone() - z_y) * (1.0 - eps);
    if eps != 0.0 {
        let sum_wz = match &weights {
            Some(w) => (z.clone() * w.clone()).sum_dim(1),
            None => z.clone().sum_dim(1),
        };
        ce = ce + (lse.clone() * sum_w.clone() - sum_wz) * (eps / v as f64);
    }
    // The z-loss squares torch.logsumexp, which shifts by 0 where the max is infinite: +inf
    // on a row holding +inf and no NaN, -inf on a row of -inf only; `lse` is NaN on both,
    // as F.cross_entropy's log-softmax is, so the loss stays NaN. Elsewhere the same value.
    let zl = if lambda != 0.0 || options.return_z_loss {
        let infinite = max.clone().abs().equal_elem(f32::INFINITY);
        let shift = max.clone().mask_fill(infinite, 0.0);
        let lse_z = (z.clone() - shift.clone()).exp().sum_dim(1).log() + shift;
        lse_z.powi_scalar(2) * lambda
    } else {
        Tensor::<B, 2>::zeros([n, 1], &device).cast(DType::F32)
    };
    let loss = (ce + zl.clone())
        .mask_fill(invalid.clone(), 0.0)
        .reshape([n]);
    let z_loss = options
        .return_z_loss
        .then(|| prim(zl.mask_fill(invalid.clone(), 0.0).reshape([n])));

    let grad_logits = grad_scale.map(|s| {
        // `[1]` (every row) or `[n]` (per row), broadcast over the classes.
        let k = s.shape().num_elements();
        let s = float::<B, 1>(to_f32::<B>(s)).reshape([k, 1]);
        let s_z = match z_loss_scale {
            Some(sz) => float::<B, 1>(to_f32::<B>(sz)).reshape([1, 1]),
            None => s.clone(),
        };
        let p = (z.clone() - lse.clone()).exp();
        let a = w_y * s.clone() * (1.0 - eps);
        let b = s.clone() * (eps / v as f64);
        let coef_p = a.clone() + b.clone() * sum_w + lse * s_z * (2.0 * lambda);
        let mut g = p * coef_p;
        if eps != 0.0 {
            g = match &weights {
                Some(w) => g - w.clone() * b,
                None => g - b,
            };
        }
        let classes = Tensor::<B, 1, Int>::arange(0..v as i64, &device)
            .reshape([1, v])
            .expand([n, v]);
        let one_hot = mask_f32(classes.equal(safe.expand([n, v])));
        g = g - one_hot * a;
        if let Some(chain) = chain {
            g = g * chain;
        }
        to_dtype::<B>(prim(g.mask_fill(invalid.expand([n, v]), 0.0)), dtype)
    });
    CrossEntropyRows {
        loss: prim(loss),
        z_loss,
        grad_logits,
    }
}

/// See [`FusedOps::fused_cross_entropy_backward`](crate::ops::FusedOps::fused_cross_entropy_backward).
pub fn backward<B: Backend>(
    grad: FloatTensor<B>,
    grad_rows: FloatTensor<B>,
    grad_scale: FloatTensor<B>,
) -> FloatTensor<B> {
    use burn::tensor::ElementConversion;
    let dtype = grad.dtype();
    let r: Tensor<B, 1> = float::<B, 1>(grad_rows).cast(DType::F32);
    let n = r.dims()[0];
    let s: Tensor<B, 1> = float::<B, 1>(grad_scale).cast(DType::F32);
    let s = if s.dims()[0] == n {
        s
    } else {
        s.reshape([1]).expand([n])
    };
    let same = r.clone().equal(s.clone());
    // One flag read back: far cheaper than a pass over `[N, V]` when nothing changes (a
    // mean or sum followed by `backward()`; Liger skips the multiply the same way).
    if same.clone().all().int().into_scalar().elem::<i64>() != 0 {
        return grad;
    }
    // Rows with `r_i = s_i` get the factor 1 (exactly `r_i / s_i`, also when both are 0).
    let factor = (r / s.clone())
        .mask_fill(s.equal_elem(0.0), 0.0)
        .mask_fill(same, 1.0);
    let g: Tensor<B, 2> = float::<B, 2>(grad).cast(DType::F32);
    prim((g * factor.reshape([n, 1])).cast(dtype))
}

/// See [`FusedOps::fused_target_stats`](crate::ops::FusedOps::fused_target_stats).
pub fn target_stats<B: crate::ops::FusedOps>(
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    vocab: usize,
    ignore_index: i64,
) -> crate::ops::TargetStats<B> {
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let class_weight = class_weight.map(float::<B, 1>);
    let weight_scale = reciprocal_or_zero(non_ignored_weight(
        &targets,
        class_weight.as_ref(),
        vocab,
        ignore_index,
    ));
    let row_scale = reciprocal_or_zero(non_ignored_weight(&targets, None, vocab, ignore_index));
    let out_of_range = valid_rows(targets.clone(), vocab, ignore_index)
        .bool_not()
        .bool_and(targets.not_equal_elem(ignore_index));
    crate::ops::TargetStats {
        weight_scale: prim(weight_scale),
        row_scale: prim(row_scale),
        out_of_range: prim(mask_f32(out_of_range).sum()),
    }
}

/// `1 / d`, and `0` where `d = 0` (an all-ignored batch has loss 0 and zero gradients).
pub(crate) fn reciprocal_or_zero<B: crate::ops::FusedOps>(d: Tensor<B, 1>) -> Tensor<B, 1> {
    let zero = d.clone().equal_elem(0.0);
    (d.ones_like() / d).mask_fill(zero, 0.0)
}

/// `Σ_{non-ignored i} w[y_i]` (the count of non-ignored rows without weights), `[1]` f32.
/// Targets outside `[0, V)` count as ignored.
pub(crate) fn non_ignored_weight<B: crate::ops::FusedOps>(
    targets: &Tensor<B, 1, burn::tensor::Int>,
    class_weight: Option<&Tensor<B, 1>>,
    vocab: usize,
    ignore_index: i64,
) -> Tensor<B, 1> {
    let valid = valid_rows(targets.clone(), vocab, ignore_index);
    match class_weight {
        Some(w) => {
            let safe = targets.clone().mask_fill(valid.clone().bool_not(), 0);
            let w_y = w.clone().cast(burn::tensor::DType::F32).gather(0, safe);
            (w_y * mask_f32(valid)).sum()
        }
        None => mask_f32(valid).sum(),
    }
}
