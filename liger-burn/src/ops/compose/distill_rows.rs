//! One chunk's rows of a distillation as the fused log-softmax and cross entropy and f32
//! stock ops: the default body of
//! [`FusedOps::fused_distill_rows`](crate::ops::FusedOps::fused_distill_rows).
//!
//! In f32, from `log Q = log_softmax(s/τ)` (the student's logits padded with zero columns
//! up to the teacher's vocabulary) and `log P = log_softmax(t/τ)`: each row's divergence and
//! its gradient with respect to `log Q` (Liger-Kernel's `dX`: for the JSD
//! `(1−β) Q (log Q − log M)`, `−P` for the forward KL, `Q (log Q − log P) + Q` for the
//! reverse KL, `½ sign(Q − P) Q` for the TVD), then through the log-softmax,
//! `∂/∂s = (dX − Q Σ dX)/τ`; plus the hard loss's `softmax(s) − onehot(y)`, each scaled by
//! its weight and the given scale, ignored rows zeroed, rounded once to the dtype. It holds
//! a few `[m, V]` f32 temporaries.

use super::chunked_linear::{float, prim};
use super::cross_entropy::{mask_f32, valid_rows};
use super::divergence::log_add_exp;
use super::fused_linear_preference::token_options;
use crate::ops::{DistillOptions, DistillRows, Divergence, FusedOps};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// Each row's divergence `D(P, Q)` and its gradient with respect to the student's scaled
/// logits (before the `1/τ` of the chain rule), from `log Q` and `log P` (`[m, V]` f32).
fn divergence_rows<B: FusedOps>(
    log_q: Tensor<B, 2>,
    log_p: Tensor<B, 2>,
    divergence: Divergence,
) -> (Tensor<B, 1>, Tensor<B, 2>) {
    let m = log_q.dims()[0];
    let q = log_q.clone().exp();
    let p = log_p.clone().exp();
    let (loss, dx) = match divergence.jsd_beta() {
        Some(0.0) => (p.clone() * (log_p - log_q), p.neg()),
        Some(1.0) => {
            let kl = q.clone() * (log_q - log_p);
            (kl.clone(), kl + q.clone())
        }
        Some(beta) => {
            let log_m = log_add_exp(log_p.clone() + beta.ln(), log_q.clone() + (1.0 - beta).ln());
            let student = q.clone() * (log_q - log_m.clone());
            let teacher = p * (log_p - log_m);
            (
                teacher * beta + student.clone() * (1.0 - beta),
                student * (1.0 - beta),
            )
        }
        None => {
            let diff = q.clone() - p;
            let sign = diff.clone().greater_elem(0.0).float().cast(DType::F32) * 2.0 - 1.0;
            (diff.abs() * 0.5, sign * q.clone() * 0.5)
        }
    };
    let grad = dx.clone() - q * row_sums(dx);
    (row_sums(loss).reshape([m]), grad)
}

/// The row sums of an f32 `[m, V]` tensor, `[m, 1]` f32. Where the backend's f32 matmul is
/// the vendor library's (cuBLASLt: true f32 accumulation, not TF32) they are one product
/// with a column of ones, memory-bound like any reduction; elsewhere Burn's `sum_dim`.
/// Burn's reduction picks its strategy by autotune; without autotune (this workspace's
/// default) it sums a `[512, 128256]` row block in 5.6 ms on an H200, 60× the bandwidth
/// bound.
fn row_sums<B: FusedOps>(t: Tensor<B, 2>) -> Tensor<B, 2> {
    let device = t.device();
    if !B::fused_matmul_uses_vendor_library(&device, DType::F32) {
        return t.sum_dim(1);
    }
    let v = t.dims()[1];
    let ones = Tensor::<B, 2>::ones([v, 1], &device).cast(DType::F32);
    super::chunked_linear::matmul::<B>(t, ones)
}

/// See [`FusedOps::fused_distill_rows`](crate::ops::FusedOps::fused_distill_rows).
pub fn forward<B: FusedOps>(
    student: FloatTensor<B>,
    teacher: FloatTensor<B>,
    targets: IntTensor<B>,
    grad_scale: Option<FloatTensor<B>>,
    options: DistillOptions,
) -> DistillRows<B> {
    let dtype = student.dtype();
    let s: Tensor<B, 2> = float(student);
    let t: Tensor<B, 2> = float(teacher);
    let [m, v] = s.dims();
    let vt = t.dims()[1];
    let device = s.device();
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let mask = mask_f32(valid_rows(targets.clone(), v, options.ignore_index));
    let inv_t = 1.0 / options.temperature;
    let hard_loss = B::fused_cross_entropy(
        prim(s.clone()),
        targets.clone().into_primitive(),
        None,
        None,
        None,
        token_options(options.ignore_index),
    )
    .loss;
    let s32 = s.cast(DType::F32);
    let padded = if vt > v {
        Tensor::cat(
            vec![
                s32.clone(),
                Tensor::<B, 2>::zeros([m, vt - v], &device).cast(DType::F32),
            ],
            1,
        )
    } else {
        s32.clone()
    };
    // The row log-softmaxes through the fused kernel where the backend has one.
    let log_q: Tensor<B, 2> = float(B::fused_log_softmax(prim(padded * inv_t)));
    let log_p: Tensor<B, 2> = float(B::fused_log_softmax(prim(t.cast(DType::F32) * inv_t)));
    let (rows, soft_grad) = divergence_rows(log_q.clone(), log_p, options.divergence);
    let soft_loss = rows * mask.clone();
    let grad_logits = grad_scale.map(|scale| {
        let scale: Tensor<B, 1> = float(scale);
        let soft_grad = if vt > v {
            soft_grad.slice([0..m, 0..v])
        } else {
            soft_grad
        };
        let probs = if vt == v && options.temperature == 1.0 {
            log_q.exp()
        } else {
            float(B::fused_softmax(prim(s32)))
        };
        let classes = Tensor::<B, 1, Int>::arange(0..v as i64, &device)
            .reshape([1, v])
            .expand([m, v]);
        let onehot = classes
            .equal(targets.reshape([m, 1]).expand([m, v]))
            .float()
            .cast(DType::F32);
        let hard_grad = probs - onehot;
        let w_soft = scale.clone() * (options.weight_soft_loss * inv_t);
        let w_hard = scale * options.weight_hard_loss;
        let g = (soft_grad * w_soft.reshape([1, 1]) + hard_grad * w_hard.reshape([1, 1]))
            * mask.reshape([m, 1]);
        prim(g.cast(dtype))
    });
    DistillRows {
        soft_loss: prim(soft_loss),
        hard_loss,
        grad_logits,
    }
}
