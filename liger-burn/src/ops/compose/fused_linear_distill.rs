//! Fused linear distillation, chunked over rows so neither head's `[N, V]` logits exist
//! whole: the default body of
//! [`FusedOps::fused_linear_distill`](crate::ops::FusedOps::fused_linear_distill).
//!
//! Per chunk of rows `c`:
//!
//! 1. the student's logits `s = x_c Wᵀ (+ b)` and the teacher's `t` (through
//!    [`FusedOps::fused_matmul`]);
//! 2. each row's soft and hard loss and the gradient `g` of their weighted mean with
//!    respect to `s` by [`FusedOps::fused_distill_rows`] (one kernel on CubeCL backends;
//!    the student padded with zero columns up to the teacher's vocabulary when that is
//!    larger, Liger-Kernel's rule);
//! 3. `grad_x_c = g W`, `grad_W += f32(gᵀ x_c)`, `grad_b += Σ f32(g)`
//!    (`chunked_linear`).
//!
//! The default body of step 2 holds a few `[m, V]` f32 temporaries, so a chunk has at most
//! [`MAX_CHUNK_ROWS_PER_HIDDEN`]`⁻¹·H` rows (then those temporaries take about as much
//! memory as the f32 weight-gradient accumulator), and otherwise the rows of
//! [`super::linear_cross_entropy`].

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, prim};
use super::cross_entropy::{mask_f32, reciprocal_or_zero, valid_rows};
use super::linear_cross_entropy::automatic_chunk_rows;
use crate::ops::{DistillOptions, DistillOutput, FusedOps, TeacherHead};
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
    let chunk = chunk_rows(n, h, v.max(vt));
    let zero = || Tensor::<B, 1>::zeros([1], &device).cast(DType::F32);
    let (mut soft_sum, mut hard_sum) = (zero(), zero());
    let mut grad_x = Vec::new();
    let mut grads = LinearGrads::<B>::new(bias.is_some());
    let mut r0 = 0;
    while r0 < n {
        let r1 = (r0 + chunk).min(n);
        let x_c = x.clone().slice(r0..r1);
        let y_c = targets.clone().slice(r0..r1);
        let s = chunk_logits::<B>(x_c.clone(), &weight_t, bias.as_ref());
        let t = chunk_logits::<B>(tx.clone().slice(r0..r1), &tw_t, tb.as_ref());
        let rows = B::fused_distill_rows(
            prim(s),
            prim(t),
            y_c.into_primitive(),
            compute_grad.then(|| prim(per_row.clone())),
            options,
        );
        soft_sum = soft_sum + float::<B, 1>(rows.soft_loss).sum();
        hard_sum = hard_sum + float::<B, 1>(rows.hard_loss).sum();
        if let Some(g) = rows.grad_logits {
            let g: Tensor<B, 2> = float(g);
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
