//! Divergences between two `[N, V]` distributions as stock Burn ops (f32 math): the
//! default body of [`FusedOps::fused_divergence`](crate::ops::FusedOps::fused_divergence).
//! Every divergence here is elementwise in `(input, target)` before the reduction (the
//! JSD's mixture `M = βP + (1−β)Q` too), so the loss and its gradient come from one pass.

use super::chunked_linear::{float, prim};
use super::cross_entropy::reciprocal_or_zero;
use super::to_dtype;
use crate::ops::{DivergenceOptions, DivergenceOutput, DivergenceReduction, FusedOps};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// `ln(eᵃ + eᵇ)` elementwise, without overflow.
pub(crate) fn log_add_exp<B: FusedOps>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    let m = a.clone().max_pair(b.clone());
    m.clone() + ((a - m.clone()).exp() + (b - m).exp()).log()
}

/// The elementwise values and their derivatives with respect to the input (f32).
pub(crate) fn elementwise<B: FusedOps>(
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
    options: &DivergenceOptions,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let Some(beta) = options.divergence.jsd_beta() else {
        let d = x - y;
        let sign = d.clone().greater_elem(0.0).float().cast(DType::F32) - 0.5;
        return (d.abs() * 0.5, sign);
    };
    let (log_p, p) = if options.log_target {
        (y.clone(), y.exp())
    } else {
        (y.clone().clamp_min(options.eps).log(), y)
    };
    if beta == 0.0 {
        return (p.clone() * (log_p - x), p.neg());
    }
    let q = x.clone().exp();
    if beta == 1.0 {
        let kl = q.clone() * (x - log_p);
        return (kl.clone(), kl + q);
    }
    let log_m = log_add_exp(log_p.clone() + beta.ln(), x.clone() + (1.0 - beta).ln());
    let student = q * (x - log_m.clone());
    let loss = p * (log_p - log_m) * beta + student.clone() * (1.0 - beta);
    (loss, student * (1.0 - beta))
}

/// See [`FusedOps::fused_divergence`](crate::ops::FusedOps::fused_divergence).
pub fn forward<B: FusedOps>(
    input: FloatTensor<B>,
    target: FloatTensor<B>,
    labels: Option<IntTensor<B>>,
    compute_grad: bool,
    options: DivergenceOptions,
) -> DivergenceOutput<B> {
    let dtype = input.dtype();
    let [n, v] = [input.shape()[0], input.shape()[1]];
    let x = float::<B, 2>(input).cast(DType::F32);
    let y = float::<B, 2>(target).cast(DType::F32);
    let device = x.device();
    let (mut loss, mut grad) = elementwise(x, y, &options);
    let rows = match labels {
        Some(l) => {
            let kept = Tensor::<B, 1, Int>::from_primitive(l)
                .not_equal_elem(options.ignore_index)
                .float()
                .cast(DType::F32);
            let mask = kept.clone().reshape([n, 1]);
            loss = loss * mask.clone();
            grad = grad * mask;
            kept.sum()
        }
        None => Tensor::<B, 1>::full([1], n as f64, &device).cast(DType::F32),
    };
    let scale = match options.reduction {
        DivergenceReduction::None | DivergenceReduction::Sum => None,
        DivergenceReduction::Mean => Some(reciprocal_or_zero(rows * v as f64)),
        DivergenceReduction::BatchMean => Some(reciprocal_or_zero(rows)),
    };
    let reduced = match (options.reduction, &scale) {
        (DivergenceReduction::None, _) => prim(loss),
        (_, Some(s)) => prim(loss.sum() * s.clone()),
        (_, None) => prim(loss.sum()),
    };
    let grad = compute_grad.then(|| {
        let g = match scale {
            Some(s) => grad * s.reshape([1, 1]),
            None => grad,
        };
        to_dtype::<B>(prim(g), dtype)
    });
    DivergenceOutput {
        loss: reduced,
        grad,
    }
}
