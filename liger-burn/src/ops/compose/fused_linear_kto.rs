//! Fused linear KTO, chunked over sequences so the `[B·T, V]` logits never exist: the
//! default body of [`FusedOps::fused_linear_kto`](crate::ops::FusedOps::fused_linear_kto).
//!
//! A sequence's loss depends on that sequence alone (and on constants: the KL estimate,
//! the batch size), so chunks are runs of whole sequences; per chunk the steps of
//! [`super::fused_linear_preference`]: the logits, the token log-probabilities by the fused
//! cross entropy, the sequence log-probabilities and the losses' derivatives, and the
//! logits gradient as the cross entropy's with a per-row factor.

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, prim};
use super::fused_linear_preference::{
    Head, chunk_sequences, logit_sums as sequence_logit_sums, sequence_logps, token_nll,
    token_options,
};
use crate::ops::{FusedOps, KtoOptions, KtoOutput, ReferenceInput};
use burn::tensor::activation::sigmoid;
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// Rows `[k·T, H]` of sequences `range` of `x: [S, T, H]`.
fn rows<B: FusedOps>(x: &Tensor<B, 3>, range: std::ops::Range<usize>) -> Tensor<B, 2> {
    let [_, t, h] = x.dims();
    let k = range.len();
    x.clone().slice(range).reshape([k * t, h])
}

/// See [`FusedOps::fused_linear_kto`](crate::ops::FusedOps::fused_linear_kto).
#[allow(clippy::too_many_arguments)]
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    targets: IntTensor<B>,
    labels: IntTensor<B>,
    reference: ReferenceInput<B>,
    kl: Option<FloatTensor<B>>,
    compute_grad: bool,
    options: KtoOptions,
) -> KtoOutput<B> {
    let shape = x.shape();
    let (b, t, h) = (shape[0], shape[1], shape[2]);
    let v = weight.shape()[0];
    let (w_dtype, b_dtype) = (weight.dtype(), bias.as_ref().map(|b| b.dtype()));
    let policy = Head::<B>::new(x, weight.clone(), bias);
    let weight: Tensor<B, 2> = float(weight);
    let targets: Tensor<B, 2, Int> = Tensor::from_primitive(targets);
    let device = weight.device();
    let desirable = Tensor::<B, 1, Int>::from_primitive(labels)
        .equal_elem(1)
        .float()
        .cast(DType::F32);
    let kl = kl
        .map(|k| float::<B, 1>(k).cast(DType::F32))
        .unwrap_or_else(|| Tensor::<B, 1>::zeros([1], &device).cast(DType::F32));
    let reference = match reference {
        ReferenceInput::None => None,
        ReferenceInput::LogProbs(l) => Some(Ok(float::<B, 1>(l).cast(DType::F32))),
        ReferenceInput::Model { x, weight, bias } => Some(Err(Head::<B>::new(x, weight, bias))),
    };
    let counts: Tensor<B, 1> = targets
        .clone()
        .not_equal_elem(options.ignore_index)
        .float()
        .cast(DType::F32)
        .sum_dim(1)
        .reshape([b]);
    let per_chunk = chunk_sequences(b, t, h, v);
    let ones = Tensor::<B, 2>::ones([v, 1], &device).cast(w_dtype);
    let mut loss_sum = Tensor::<B, 1>::zeros([1], &device).cast(DType::F32);
    let (mut logps, mut rewards, mut logit_sums, mut grad_x) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut grads = LinearGrads::<B>::new(policy.bias.is_some());
    let beta = options.beta;
    let mut q0 = 0;
    while q0 < b {
        let q1 = (q0 + per_chunk).min(b);
        let k = q1 - q0;
        let x_c = rows(&policy.x, q0..q1);
        let y_c = targets.clone().slice(q0..q1).reshape([k * t]);
        let counts_c = counts.clone().slice(q0..q1);
        let logits = chunk_logits::<B>(x_c.clone(), &policy.weight_t, policy.bias.as_ref());
        logit_sums.push(sequence_logit_sums::<B>(logits.clone(), &ones, k));
        let nll = token_nll::<B>(logits.clone(), y_c.clone(), k, options.ignore_index);
        let s = sequence_logps(nll, counts_c.clone(), options.average_log_prob);
        let r = match &reference {
            None => Tensor::<B, 1>::zeros([k], &device).cast(DType::F32),
            Some(Ok(given)) => given.clone().slice(q0..q1),
            Some(Err(head)) => {
                let rl =
                    chunk_logits::<B>(rows(&head.x, q0..q1), &head.weight_t, head.bias.as_ref());
                let rn = token_nll::<B>(rl, y_c.clone(), k, options.ignore_index);
                sequence_logps(rn, counts_c.clone(), options.average_log_prob)
            }
        };
        let d = desirable.clone().slice(q0..q1);
        let sign = d.clone() * 2.0 - 1.0;
        let weight_i =
            d.clone() * options.desirable_weight + (d.neg() + 1.0) * options.undesirable_weight;
        let ratio = s.clone() - r;
        let z = (ratio.clone() - kl.clone().expand([k])) * sign.clone() * beta;
        let loss = weight_i.clone() * (sigmoid(z.clone()).neg() + 1.0);
        loss_sum = loss_sum + loss.sum();
        logps.push(s);
        rewards.push(ratio * beta);
        if compute_grad {
            // −∂L/∂s = w σ(z) σ(−z) β sign / B; a mean divides by the positions too.
            let slope = sigmoid(z.clone()) * sigmoid(z.neg());
            let mut seq_factor = weight_i * slope * sign * (beta / b as f64);
            if options.average_log_prob {
                seq_factor = seq_factor / counts_c;
            }
            let row_factor = seq_factor.reshape([k, 1]).expand([k, t]).reshape([k * t]);
            let g = B::fused_cross_entropy(
                prim(logits),
                y_c.into_primitive(),
                None,
                Some(prim(row_factor)),
                None,
                token_options(options.ignore_index),
            )
            .grad_logits
            .expect("a gradient for a grad_scale");
            grad_x.push(grads.add(float(g), x_c, &weight).reshape([k, t, h]));
        }
        q0 = q1;
    }
    let (grad_weight, grad_bias) = grads.finish(w_dtype, b_dtype.unwrap_or(w_dtype));
    KtoOutput {
        loss: prim(loss_sum / b as f64),
        logps: prim(Tensor::cat(logps, 0)),
        rewards: prim(Tensor::cat(rewards, 0)),
        logits_sum: prim(Tensor::cat(logit_sums, 0)),
        grad_x: compute_grad.then(|| prim(Tensor::cat(grad_x, 0))),
        grad_weight,
        grad_bias,
    }
}
