//! Fused linear GRPO, chunked over sequences so the `[B·T, V]` logits never exist: the
//! default body of [`FusedOps::fused_linear_grpo`](crate::ops::FusedOps::fused_linear_grpo).
//!
//! Each completion token's loss depends on its own log-probability (and on constants: its
//! sequence's advantage, old and reference log-probabilities, the normalizer from the
//! completion mask), so per chunk: the logits (in f32 divided by the temperature when it
//! is not 1), the tokens' log-probabilities by the fused cross entropy (positions outside
//! the completion mask ignored), the per-token losses and their derivatives, and the
//! logits gradient as the cross entropy's with the per-row factor `−∂L/∂ℓ / temperature`.

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, prim};
use super::cross_entropy::reciprocal_or_zero;
use super::fused_linear_preference::{Head, chunk_sequences, token_options};
use crate::ops::{FusedOps, GrpoLossType, GrpoOptions, GrpoOutput, ReferenceInput};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// The target of positions outside the completion mask.
const MASKED: i64 = -100;

/// `log p(y)` of a chunk's rows, `[m]` f32, 0 on masked rows, and the logits the gradient
/// pass reads (f32 over the temperature when it is not 1).
fn token_logps<B: FusedOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    temperature: f64,
) -> (Tensor<B, 1>, Tensor<B, 2>) {
    let logits = if temperature == 1.0 {
        logits
    } else {
        logits.cast(DType::F32) * (1.0 / temperature)
    };
    let rows = B::fused_cross_entropy(
        prim(logits.clone()),
        targets.into_primitive(),
        None,
        None,
        None,
        token_options(MASKED),
    );
    (float::<B, 1>(rows.loss).neg(), logits)
}

/// See [`FusedOps::fused_linear_grpo`](crate::ops::FusedOps::fused_linear_grpo).
#[allow(clippy::too_many_arguments)]
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    completion_ids: IntTensor<B>,
    completion_mask: IntTensor<B>,
    advantages: FloatTensor<B>,
    reference: ReferenceInput<B>,
    old_logps: Option<FloatTensor<B>>,
    compute_grad: bool,
    options: GrpoOptions,
) -> GrpoOutput<B> {
    let shape = x.shape();
    let (b, t, h) = (shape[0], shape[1], shape[2]);
    let v = weight.shape()[0];
    let (w_dtype, b_dtype) = (weight.dtype(), bias.as_ref().map(|b| b.dtype()));
    let policy = Head::<B>::new(x, weight.clone(), bias);
    let weight: Tensor<B, 2> = float(weight);
    let device = weight.device();
    let mask_int: Tensor<B, 2, Int> = Tensor::from_primitive(completion_mask);
    let kept = mask_int.clone().not_equal_elem(0);
    let mask = kept.clone().float().cast(DType::F32);
    let targets =
        Tensor::<B, 2, Int>::from_primitive(completion_ids).mask_fill(kept.bool_not(), MASKED);
    let advantages = float::<B, 1>(advantages).cast(DType::F32);
    let old = old_logps.map(|o| float::<B, 2>(o).cast(DType::F32));
    let reference = match reference {
        ReferenceInput::None => None,
        ReferenceInput::LogProbs(l) => Some(Ok(float::<B, 2>(l).cast(DType::F32))),
        ReferenceInput::Model { x, weight, bias } => Some(Err(Head::<B>::new(x, weight, bias))),
    };
    let seq_counts = mask.clone().sum_dim(1).reshape([b]);
    let total = mask.clone().sum().clamp_min(1.0);
    // Each token's weight in the loss.
    let norm: Tensor<B, 2> = match options.loss_type {
        GrpoLossType::Grpo => reciprocal_or_zero(seq_counts.clone().clamp_min(1.0) * b as f64)
            .reshape([b, 1])
            .expand([b, t]),
        GrpoLossType::Bnpo | GrpoLossType::Dapo => reciprocal_or_zero(total.clone())
            .reshape([1, 1])
            .expand([b, t]),
        GrpoLossType::DrGrpo {
            max_completion_length,
        } => Tensor::<B, 2>::full([b, t], 1.0 / (b * max_completion_length) as f64, &device)
            .cast(DType::F32),
    };
    let per_chunk = chunk_sequences(b, t, h, v);
    let zero = || Tensor::<B, 1>::zeros([1], &device).cast(DType::F32);
    let (mut loss, mut kl_sum, mut clipped_sum) = (zero(), zero(), zero());
    let (mut logps_out, mut grad_x) = (Vec::new(), Vec::new());
    let mut grads = LinearGrads::<B>::new(policy.bias.is_some());
    let (lo, hi) = (1.0 - options.epsilon_low, 1.0 + options.epsilon_high);
    let mut q0 = 0;
    while q0 < b {
        let q1 = (q0 + per_chunk).min(b);
        let (k, m) = (q1 - q0, (q1 - q0) * t);
        let [_, _, hd] = policy.x.dims();
        let x_c = policy.x.clone().slice(q0..q1).reshape([m, hd]);
        let y_c = targets.clone().slice(q0..q1).reshape([m]);
        let mask_c = mask.clone().slice(q0..q1).reshape([m]);
        let norm_c = norm.clone().slice(q0..q1).reshape([m]);
        let adv = advantages
            .clone()
            .slice(q0..q1)
            .reshape([k, 1])
            .expand([k, t])
            .reshape([m]);
        let logits = chunk_logits::<B>(x_c.clone(), &policy.weight_t, policy.bias.as_ref());
        let (logp, logits) = token_logps(logits, y_c.clone(), options.temperature);
        let old_c = match &old {
            Some(o) => o.clone().slice(q0..q1).reshape([m]),
            None => logp.clone(),
        };
        let c1 = (logp.clone() - old_c).exp();
        let c2 = c1.clone().clamp(lo, hi);
        let (l1, l2) = (c1.clone() * adv.clone(), c2 * adv.clone());
        let unclipped = l1.clone().lower_equal(l2.clone()).float().cast(DType::F32);
        let mut token_loss = l1.min_pair(l2).neg();
        // ∂loss_t/∂ℓ: the unclipped branch's −A c (the clipped branch is constant in ℓ).
        let mut d_logp = (c1.clone() * adv.clone() * unclipped).neg();
        if options.beta != 0.0 {
            let ref_c = match &reference {
                None => logp.clone(),
                Some(Ok(given)) => given.clone().slice(q0..q1).reshape([m]),
                Some(Err(head)) => {
                    let rx = head.x.clone().slice(q0..q1);
                    let [_, _, hr] = rx.dims();
                    let rl =
                        chunk_logits::<B>(rx.reshape([m, hr]), &head.weight_t, head.bias.as_ref());
                    token_logps(rl, y_c.clone(), options.temperature).0
                }
            };
            let delta = ref_c - logp.clone();
            let e = delta.clone().exp();
            let kl = e.clone() - delta - 1.0;
            token_loss = token_loss + kl.clone() * options.beta;
            d_logp = d_logp + (e.neg() + 1.0) * options.beta;
            kl_sum = kl_sum + (kl * mask_c.clone()).sum();
        }
        let clipped = c1
            .clone()
            .lower_elem(lo)
            .bool_and(adv.clone().lower_elem(0.0))
            .bool_or(c1.greater_elem(hi).bool_and(adv.greater_elem(0.0)))
            .float()
            .cast(DType::F32);
        clipped_sum = clipped_sum + (clipped * mask_c.clone()).sum();
        let weight_t = mask_c.clone() * norm_c;
        loss = loss + (token_loss * weight_t.clone()).sum();
        logps_out.push((logp * mask_c).reshape([k, t]));
        if compute_grad {
            let row_factor = (d_logp * weight_t) * (-1.0 / options.temperature);
            let g = B::fused_cross_entropy(
                prim(logits),
                y_c.into_primitive(),
                None,
                Some(prim(row_factor)),
                None,
                token_options(MASKED),
            )
            .grad_logits
            .expect("a gradient for a grad_scale");
            let g: Tensor<B, 2> = float(g);
            grad_x.push(grads.add(g.cast(w_dtype), x_c, &weight).reshape([k, t, h]));
        }
        q0 = q1;
    }
    let (grad_weight, grad_bias) = grads.finish(w_dtype, b_dtype.unwrap_or(w_dtype));
    GrpoOutput {
        loss: prim(loss),
        per_token_logps: prim(Tensor::cat(logps_out, 0)),
        kl: prim(kl_sum / total.clone()),
        clip_ratio: prim(clipped_sum / total),
        grad_x: compute_grad.then(|| prim(Tensor::cat(grad_x, 0))),
        grad_weight,
        grad_bias,
    }
}
