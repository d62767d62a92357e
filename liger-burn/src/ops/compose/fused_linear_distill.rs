//! Fused linear distillation, chunked over rows so neither head's `[N, V]` logits exist
//! whole: the default body of
//! [`FusedOps::fused_linear_distill`](crate::ops::FusedOps::fused_linear_distill).
//!
//! Per chunk of rows `c`:
//!
//! 1. the student's logits `s = x_c Wᵀ (+ b)` and the teacher's `t` (through
//!    [`FusedOps::fused_matmul`]), the student's padded with zero columns up to the
//!    teacher's vocabulary when that is larger (Liger-Kernel's rule);
//! 2. the hard loss's rows by the fused cross entropy of `s` (forward only);
//! 3. in f32, from `log Q = log_softmax(s/τ)` and `log P = log_softmax(t/τ)`: each row's
//!    divergence and its gradient with respect to `log Q` (Liger-Kernel's `dX`: for the JSD
//!    `(1−β) Q (log Q − log M)`, `−P` for the forward KL, `Q (log Q − log P) + Q` for the
//!    reverse KL, `½ sign(Q − P) Q` for the TVD), then through the log-softmax,
//!    `∂/∂s = (dX − Q Σ dX)/τ`; plus the hard loss's `softmax(s) − onehot(y)`, each scaled by
//!    its weight over the non-ignored rows, ignored rows zeroed, rounded once to the
//!    dtype;
//! 4. `grad_x_c = g W`, `grad_W += f32(gᵀ x_c)`, `grad_b += Σ f32(g)`
//!    (`chunked_linear`).
//!
//! Step 3 holds a few `[m, V]` f32 temporaries, so a chunk has at most
//! [`MAX_CHUNK_ROWS_PER_HIDDEN`]`⁻¹·H` rows (then those temporaries take about as much
//! memory as the f32 weight-gradient accumulator), and otherwise the rows of
//! [`super::linear_cross_entropy`].

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, prim};
use super::cross_entropy::{mask_f32, reciprocal_or_zero, valid_rows};
use super::divergence::log_add_exp;
use super::fused_linear_preference::token_options;
use super::linear_cross_entropy::automatic_chunk_rows;
use crate::ops::{DistillOptions, DistillOutput, Divergence, FusedOps, TeacherHead};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// A chunk's f32 temporaries are about this many `[m, V]` tensors: its rows are capped at
/// `H / 8` so that they take about the memory of the `[V, H]` f32 accumulator.
pub const MAX_CHUNK_ROWS_PER_HIDDEN: usize = 8;

/// Rows per chunk of a distillation over `n` rows of hidden size `h` and vocabulary `v`.
pub fn chunk_rows(n: usize, h: usize, v: usize) -> usize {
    #[cfg(feature = "test-hooks")]
    if let Some(forced) = crate::test_hooks::chunk_rows_override() {
        return forced.min(n).max(1);
    }
    automatic_chunk_rows(n, h, v)
        .min((h / MAX_CHUNK_ROWS_PER_HIDDEN).max(16))
        .max(1)
}

/// Each row's divergence `D(P, Q)` and its gradient with respect to the student's scaled
/// logits (before the `1/τ` of the chain rule), from `log Q` and `log P` (`[m, V]` f32).
pub(crate) fn divergence_rows<B: FusedOps>(
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
/// bound, which made these sums most of the loss's time.
fn row_sums<B: FusedOps>(t: Tensor<B, 2>) -> Tensor<B, 2> {
    let device = t.device();
    if !B::fused_matmul_uses_vendor_library(&device, DType::F32) {
        return t.sum_dim(1);
    }
    let v = t.dims()[1];
    let ones = Tensor::<B, 2>::ones([v, 1], &device).cast(DType::F32);
    super::chunked_linear::matmul::<B>(t, ones)
}

/// See [`FusedOps::fused_linear_distill`](crate::ops::FusedOps::fused_linear_distill).
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    teacher: TeacherHead<B>,
    targets: IntTensor<B>,
    compute_grad: bool,
    options: DistillOptions,
) -> DistillOutput<B> {
    let [n, h] = [x.shape()[0], x.shape()[1]];
    let v = weight.shape()[0];
    let vt = teacher.weight.shape()[0];
    let (w_dtype, b_dtype) = (weight.dtype(), bias.as_ref().map(|b| b.dtype()));
    let x: Tensor<B, 2> = float(x);
    let weight: Tensor<B, 2> = float(weight);
    let weight_t = weight.clone().transpose();
    let bias = bias.map(|b| float::<B, 1>(b).reshape([1, v]));
    let tx: Tensor<B, 2> = float(teacher.x);
    let tw_t = float::<B, 2>(teacher.weight).transpose();
    let tb = teacher.bias.map(|b| float::<B, 1>(b).reshape([1, vt]));
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let device = x.device();

    let valid = mask_f32(valid_rows(targets.clone(), v, options.ignore_index));
    let count = valid.clone().sum();
    // Liger-Kernel divides by the non-ignored rows, at least 1.
    let per_row = reciprocal_or_zero(count.clone().clamp_min(1.0));
    let inv_t = 1.0 / options.temperature;
    let chunk = chunk_rows(n, h, v.max(vt));
    let zero = || Tensor::<B, 1>::zeros([1], &device).cast(DType::F32);
    let (mut soft_sum, mut hard_sum) = (zero(), zero());
    let mut grad_x = Vec::new();
    let mut grads = LinearGrads::<B>::new(bias.is_some());
    let mut r0 = 0;
    while r0 < n {
        let r1 = (r0 + chunk).min(n);
        let m = r1 - r0;
        let x_c = x.clone().slice(r0..r1);
        let y_c = targets.clone().slice(r0..r1);
        let mask = valid.clone().slice(r0..r1);
        let s = chunk_logits::<B>(x_c.clone(), &weight_t, bias.as_ref());
        let t = chunk_logits::<B>(tx.clone().slice(r0..r1), &tw_t, tb.as_ref());
        let hard_rows = B::fused_cross_entropy(
            prim(s.clone()),
            y_c.clone().into_primitive(),
            None,
            None,
            None,
            token_options(options.ignore_index),
        )
        .loss;
        hard_sum = hard_sum + float::<B, 1>(hard_rows).sum();
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
        soft_sum = soft_sum + (rows * mask.clone()).sum();
        if compute_grad {
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
                .equal(y_c.reshape([m, 1]).expand([m, v]))
                .float()
                .cast(DType::F32);
            let hard_grad = probs - onehot;
            let w_soft = per_row.clone() * (options.weight_soft_loss * inv_t);
            let w_hard = per_row.clone() * options.weight_hard_loss;
            let g = (soft_grad * w_soft.reshape([1, 1]) + hard_grad * w_hard.reshape([1, 1]))
                * mask.reshape([m, 1]);
            grad_x.push(grads.add(g.cast(w_dtype), x_c, &weight));
        }
        r0 = r1;
    }
    let soft_loss = soft_sum * per_row.clone();
    let hard_loss = hard_sum * per_row;
    let loss =
        soft_loss.clone() * options.weight_soft_loss + hard_loss.clone() * options.weight_hard_loss;
    let (grad_weight, grad_bias) = grads.finish(w_dtype, b_dtype.unwrap_or(w_dtype));
    DistillOutput {
        loss: prim(loss),
        soft_loss: prim(soft_loss),
        hard_loss: prim(hard_loss),
        grad_x: compute_grad.then(|| prim(Tensor::cat(grad_x, 0))),
        grad_weight,
        grad_bias,
    }
}
