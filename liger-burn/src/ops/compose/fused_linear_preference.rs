//! Fused linear preference losses (DPO, ORPO, CPO, SimPO), chunked over pairs so the
//! `[2B·T, V]` logits never exist: the default body of
//! [`FusedOps::fused_linear_preference`](crate::ops::FusedOps::fused_linear_preference),
//! built from [`FusedOps::fused_matmul`] and [`FusedOps::fused_cross_entropy`] only.
//!
//! A pair's loss depends on both of its sequences, so a chunk holds whole pairs: the
//! chosen sequences `p0..p1` and the rejected sequences `B+p0..B+p1` (Liger-Kernel's
//! chunking). Per chunk:
//!
//! 1. `logits = x_c Wᵀ (+ b)`;
//! 2. the fused cross entropy (forward only) gives each position's `−log p(y_t)`, from
//!    which the sequences' log-probabilities `s` (sum or mean over the non-ignored
//!    positions), the pair losses and their derivatives `∂L/∂s` follow (a few `[pairs]`
//!    vectors);
//! 3. since `∂ log p(y_t)/∂logits_t = onehot(y_t) − softmax(logits_t)`, the logits gradient
//!    of the chunk is the cross entropy's gradient with the per-row factor
//!    `r_t = −∂L/∂s (/ n_tokens) (+ α/N_chosen for the NLL term on chosen rows)`: a second
//!    fused cross-entropy pass with that `grad_scale` writes it over the logits;
//! 4. `grad_x_c = g W`, `grad_W += f32(gᵀ x_c)`, `grad_b += Σ f32(g)`
//!    (`chunked_linear`).
//!
//! The reference model's log-probabilities, when computed from its head, are step 1–2 on
//! the reference inputs, in the same chunk. TRL's logits metrics come from a product of
//! the chunk's logits with a column of ones (`logit_sums`): no f32 copy of the logits. A chunk holds `≈ chunk_rows / (2T)` pairs
//! (at least one), with the rows per chunk of [`super::linear_cross_entropy`].

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, prim};
use super::cross_entropy::reciprocal_or_zero;
use super::linear_cross_entropy::chunk_rows;
use crate::ops::{
    CrossEntropyOptions, DpoLossType, FusedOps, PreferenceLoss, PreferenceOptions,
    PreferenceOutput, Reduction, ReferenceInput,
};
use burn::tensor::activation::{log_sigmoid, sigmoid};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};

/// Pairs per chunk for `B` pairs of `T` positions, hidden size `h`, vocabulary `v`.
pub fn chunk_pairs(b: usize, t: usize, h: usize, v: usize) -> usize {
    let rows = chunk_rows(2 * b * t, h, v);
    (rows / (2 * t).max(1)).clamp(1, b.max(1))
}

/// Whole sequences per chunk for `s` sequences of `T` positions (KTO, GRPO).
pub fn chunk_sequences(s: usize, t: usize, h: usize, v: usize) -> usize {
    let rows = chunk_rows(s * t, h, v);
    (rows / t.max(1)).clamp(1, s.max(1))
}

/// Each sequence's sum of its logits over every position and class, `[s]` f32, from a
/// chunk's `[s·T, V]` logits: a product with a column of ones (f32 accumulation, each
/// row's sum stored in the logits' dtype), so no f32 copy of the logits is made.
pub(crate) fn logit_sums<B: FusedOps>(
    logits: Tensor<B, 2>,
    ones: &Tensor<B, 2>,
    seqs: usize,
) -> Tensor<B, 1> {
    let rows = logits.dims()[0];
    super::chunked_linear::matmul::<B>(logits, ones.clone())
        .cast(DType::F32)
        .reshape([seqs, rows / seqs.max(1)])
        .sum_dim(1)
        .reshape([seqs])
}

/// The cross-entropy options of the per-position log-probabilities: rows whose target is
/// `ignore_index` (or out of range) give 0 and no gradient.
pub(crate) fn token_options(ignore_index: i64) -> CrossEntropyOptions {
    CrossEntropyOptions::default()
        .with_ignore_index(ignore_index)
        .with_reduction(Reduction::None)
        .with_check_targets(false)
}

/// The log-probability of each sequence of a chunk: `token_nll: [s, T]` (`−log p(y_t)`, 0
/// on ignored positions), `counts: [s]` its non-ignored positions. `[s]` f32.
pub(crate) fn sequence_logps<B: FusedOps>(
    token_nll: Tensor<B, 2>,
    counts: Tensor<B, 1>,
    average: bool,
) -> Tensor<B, 1> {
    let s = token_nll.dims()[0];
    let sum = token_nll.sum_dim(1).reshape([s]).neg();
    if average { sum / counts } else { sum }
}

/// `[s·T, H]` rows of sequences `a` then `b` (ranges of `x: [2B, T, H]`).
fn pair_rows<B: FusedOps>(
    x: &Tensor<B, 3>,
    chosen: std::ops::Range<usize>,
    rejected: std::ops::Range<usize>,
) -> Tensor<B, 2> {
    let [_, t, h] = x.dims();
    let s = chosen.len() + rejected.len();
    Tensor::cat(vec![x.clone().slice(chosen), x.clone().slice(rejected)], 0).reshape([s * t, h])
}

fn pair_targets<B: FusedOps>(
    y: &Tensor<B, 2, Int>,
    chosen: std::ops::Range<usize>,
    rejected: std::ops::Range<usize>,
) -> Tensor<B, 1, Int> {
    let t = y.dims()[1];
    let s = chosen.len() + rejected.len();
    Tensor::cat(vec![y.clone().slice(chosen), y.clone().slice(rejected)], 0).reshape([s * t])
}

/// `−log p(y_t)` of a chunk's rows from its logits (forward only), `[s, T]` f32.
pub(crate) fn token_nll<B: FusedOps>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    seqs: usize,
    ignore_index: i64,
) -> Tensor<B, 2> {
    let rows = B::fused_cross_entropy(
        prim(logits),
        targets.into_primitive(),
        None,
        None,
        None,
        token_options(ignore_index),
    );
    let t = rows.loss.shape()[0] / seqs.max(1);
    float::<B, 1>(rows.loss).reshape([seqs, t])
}

/// What the loss of a chunk of pairs gives: per pair its loss, `∂loss/∂c`, `∂loss/∂r`
/// (for the sequence log-probabilities `c`, `r`), the rewards, and ORPO's log-odds terms.
pub(crate) struct PairTerms<B: FusedOps> {
    pub loss: Tensor<B, 1>,
    pub d_chosen: Tensor<B, 1>,
    pub d_rejected: Tensor<B, 1>,
    pub chosen_rewards: Tensor<B, 1>,
    pub rejected_rewards: Tensor<B, 1>,
    /// `(log σ(lo), lo)` per pair (ORPO).
    pub log_odds: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
}

/// `−(1−ε) log σ(d) − ε log σ(−d)` and its derivative `−(1−ε)σ(−d) + ε σ(d)`.
fn smoothed_sigmoid<B: FusedOps>(d: Tensor<B, 1>, eps: f64) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let loss = log_sigmoid(d.clone()) * (-(1.0 - eps)) - log_sigmoid(d.clone().neg()) * eps;
    let grad = sigmoid(d.clone().neg()) * (-(1.0 - eps)) + sigmoid(d) * eps;
    (loss, grad)
}

/// `σ'(x) = σ(x)σ(−x)`.
fn sigmoid_slope<B: FusedOps>(x: Tensor<B, 1>) -> Tensor<B, 1> {
    sigmoid(x.clone()) * sigmoid(x.neg())
}

/// The pair losses of [`PreferenceLoss`] on f32 `[k]` vectors: the policy's sequence
/// log-probabilities `c`, `r` and the reference's `rc`, `rr` (zeros without one).
pub(crate) fn pair_terms<B: FusedOps>(
    options: &PreferenceOptions,
    c: Tensor<B, 1>,
    r: Tensor<B, 1>,
    rc: Tensor<B, 1>,
    rr: Tensor<B, 1>,
) -> PairTerms<B> {
    let beta = options.beta;
    let eps = options.label_smoothing;
    let plain = |loss, d_chosen, d_rejected, c: Tensor<B, 1>, r: Tensor<B, 1>| PairTerms {
        loss,
        d_chosen,
        d_rejected,
        chosen_rewards: c * beta,
        rejected_rewards: r * beta,
        log_odds: None,
    };
    match options.loss {
        PreferenceLoss::Dpo(kind) => {
            let (cl, rl) = (c - rc, r - rr);
            let (chosen_rewards, rejected_rewards) = (cl.clone() * beta, rl.clone() * beta);
            let d = (cl.clone() - rl.clone()) * beta;
            // Losses of `d` alone: the derivatives are `±β ∂L/∂d`.
            let of_d =
                |(loss, dd): (Tensor<B, 1>, Tensor<B, 1>)| (loss, dd.clone() * beta, dd * (-beta));
            let (loss, dc, dr) = match kind {
                DpoLossType::Sigmoid => of_d(smoothed_sigmoid(d, eps)),
                DpoLossType::Hinge => {
                    let inside = d.clone().lower_elem(1.0).float().cast(DType::F32);
                    of_d(((d.neg() + 1.0).clamp_min(0.0), inside.neg()))
                }
                DpoLossType::Robust => {
                    let scale = 1.0 / (1.0 - 2.0 * eps);
                    let loss = (log_sigmoid(d.clone()) * (-(1.0 - eps))
                        + log_sigmoid(d.clone().neg()) * eps)
                        * scale;
                    let grad =
                        (sigmoid(d.clone().neg()) * (-(1.0 - eps)) - sigmoid(d) * eps) * scale;
                    of_d((loss, grad))
                }
                DpoLossType::ExoPair => {
                    let (log_pw, log_pl) = ((1.0 - eps).ln(), eps.ln());
                    let (qw, ql) = (sigmoid(d.clone()), sigmoid(d.clone().neg()));
                    let loss = qw.clone() * (log_sigmoid(d.clone()) - log_pw)
                        + ql.clone() * (log_sigmoid(d.clone().neg()) - log_pl);
                    let grad = qw * ql * (d - (log_pw - log_pl));
                    of_d((loss, grad))
                }
                DpoLossType::NcaPair => {
                    let (bc, br) = (cl * beta, rl * beta);
                    let loss = log_sigmoid(bc.clone()).neg()
                        - log_sigmoid(bc.clone().neg()) * 0.5
                        - log_sigmoid(br.clone().neg()) * 0.5;
                    let dc = (sigmoid(bc.clone().neg()).neg() + sigmoid(bc) * 0.5) * beta;
                    let dr = sigmoid(br) * (0.5 * beta);
                    (loss, dc, dr)
                }
                DpoLossType::BcoPair => {
                    let (bc, br) = (cl * beta, rl * beta);
                    let loss = log_sigmoid(bc.clone()).neg() - log_sigmoid(br.clone().neg());
                    (loss, sigmoid(bc.neg()) * (-beta), sigmoid(br) * beta)
                }
                DpoLossType::SppoHard => {
                    let half = 0.5 / beta;
                    let (a, b) = (cl - half, rl + half);
                    (
                        a.clone().powi_scalar(2) + b.clone().powi_scalar(2),
                        a * 2.0,
                        b * 2.0,
                    )
                }
                DpoLossType::ApoZero => {
                    let (bc, br) = (cl * beta, rl * beta);
                    let loss = sigmoid(bc.clone()).neg() + 1.0 + sigmoid(br.clone());
                    (loss, sigmoid_slope(bc) * (-beta), sigmoid_slope(br) * beta)
                }
                DpoLossType::ApoDown => {
                    let bc = cl * beta;
                    let loss = sigmoid(bc.clone()) + 1.0 - sigmoid(d.clone());
                    let sd = sigmoid_slope(d) * beta;
                    (loss, sigmoid_slope(bc) * beta - sd.clone(), sd)
                }
                DpoLossType::Discopop { tau } => {
                    let m = sigmoid(d.clone() / tau);
                    let e = d.clone().neg().exp();
                    let ls = log_sigmoid(d.clone());
                    let loss = ls.clone().neg() * (m.clone().neg() + 1.0) + e.clone() * m.clone();
                    let slope = m.clone() * (m.clone().neg() + 1.0) / tau;
                    let grad = sigmoid(d.neg()).neg() * (m.clone().neg() + 1.0) - e.clone() * m
                        + slope * (ls + e);
                    of_d((loss, grad))
                }
            };
            PairTerms {
                loss,
                d_chosen: dc,
                d_rejected: dr,
                chosen_rewards,
                rejected_rewards,
                log_odds: None,
            }
        }
        PreferenceLoss::Orpo => {
            // log odds(p) = p − log(1 − eᵖ); d/dp = 1/(1 − eᵖ).
            let odds = |p: Tensor<B, 1>| p.clone() - p.exp().neg().log1p();
            let lo = odds(c.clone()) - odds(r.clone());
            let ls = log_sigmoid(lo.clone());
            let dlo = sigmoid(lo.clone().neg()) * (-beta);
            let dc = dlo.clone() / (c.clone().exp().neg() + 1.0);
            let dr = dlo.neg() / (r.clone().exp().neg() + 1.0);
            let mut terms = plain(ls.clone() * (-beta), dc, dr, c, r);
            terms.log_odds = Some((ls, lo));
            terms
        }
        PreferenceLoss::Cpo => {
            let (loss, dd) = smoothed_sigmoid((c.clone() - r.clone()) * beta, eps);
            plain(loss, dd.clone() * beta, dd * (-beta), c, r)
        }
        PreferenceLoss::Simpo { gamma } => {
            let (loss, dd) = smoothed_sigmoid((c.clone() - r.clone()) * beta - gamma, eps);
            plain(loss, dd.clone() * beta, dd * (-beta), c, r)
        }
    }
}

/// A head to run a chunk through: `x: [2B, T, H]`, the weight's transposed view, the bias
/// as `[1, V]`.
pub(crate) struct Head<B: FusedOps> {
    pub x: Tensor<B, 3>,
    pub weight_t: Tensor<B, 2>,
    pub bias: Option<Tensor<B, 2>>,
}

impl<B: FusedOps> Head<B> {
    pub(crate) fn new(
        x: FloatTensor<B>,
        weight: FloatTensor<B>,
        bias: Option<FloatTensor<B>>,
    ) -> Self {
        let weight: Tensor<B, 2> = float(weight);
        let v = weight.dims()[0];
        Head {
            x: float(x),
            weight_t: weight.transpose(),
            bias: bias.map(|b| float::<B, 1>(b).reshape([1, v])),
        }
    }
}

/// See [`FusedOps::fused_linear_preference`](crate::ops::FusedOps::fused_linear_preference).
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    targets: IntTensor<B>,
    reference: ReferenceInput<B>,
    compute_grad: bool,
    options: PreferenceOptions,
) -> PreferenceOutput<B> {
    let shape = x.shape();
    let (s2, t, h) = (shape[0], shape[1], shape[2]);
    let b = s2 / 2;
    let v = weight.shape()[0];
    let (w_dtype, b_dtype) = (weight.dtype(), bias.as_ref().map(|b| b.dtype()));
    let policy = Head::<B>::new(x, weight.clone(), bias);
    let weight: Tensor<B, 2> = float(weight);
    let targets: Tensor<B, 2, Int> = Tensor::from_primitive(targets);
    let device = weight.device();
    let reference = match reference {
        ReferenceInput::None => None,
        ReferenceInput::LogProbs(l) => Some(Ok(float::<B, 1>(l).cast(DType::F32))),
        ReferenceInput::Model { x, weight, bias } => Some(Err(Head::<B>::new(x, weight, bias))),
    };

    // Whole-batch constants: the non-ignored positions of every sequence, of all chosen ones.
    let counts: Tensor<B, 1> = targets
        .clone()
        .not_equal_elem(options.ignore_index)
        .float()
        .cast(DType::F32)
        .sum_dim(1)
        .reshape([s2]);
    let chosen_tokens = counts.clone().slice(0..b).sum();
    let nll_scale = reciprocal_or_zero(chosen_tokens);

    let pairs = chunk_pairs(b, t, h, v);
    let ones = Tensor::<B, 2>::ones([v, 1], &device).cast(w_dtype);
    let zero = || Tensor::<B, 1>::zeros([1], &device).cast(DType::F32);
    let (mut loss_sum, mut nll_sum) = (zero(), zero());
    let (mut chosen_logits, mut rejected_logits) = (zero(), zero());
    let (mut log_odds_ratio, mut log_odds_chosen) = (zero(), zero());
    let mut logps = (Vec::new(), Vec::new());
    let mut rewards = (Vec::new(), Vec::new());
    let mut grad_x = (Vec::new(), Vec::new());
    let mut grads = LinearGrads::<B>::new(policy.bias.is_some());
    let mut p0 = 0;
    while p0 < b {
        let p1 = (p0 + pairs).min(b);
        let k = p1 - p0;
        let (chosen, rejected) = (p0..p1, b + p0..b + p1);
        let x_c = pair_rows(&policy.x, chosen.clone(), rejected.clone());
        let y_c = pair_targets(&targets, chosen.clone(), rejected.clone());
        let counts_c = Tensor::cat(
            vec![
                counts.clone().slice(chosen.clone()),
                counts.clone().slice(rejected.clone()),
            ],
            0,
        );
        let logits = chunk_logits::<B>(x_c.clone(), &policy.weight_t, policy.bias.as_ref());
        // Σ of every logit of each sequence (TRL's logits/chosen and logits/rejected).
        let logit_sums = logit_sums::<B>(logits.clone(), &ones, 2 * k);
        chosen_logits = chosen_logits + logit_sums.clone().slice(0..k).sum();
        rejected_logits = rejected_logits + logit_sums.slice(k..2 * k).sum();
        let nll = token_nll::<B>(logits.clone(), y_c.clone(), 2 * k, options.ignore_index);
        let s = sequence_logps(nll.clone(), counts_c.clone(), options.average_log_prob);
        let (ref_c, ref_r) = match &reference {
            None => (zero().expand([k]), zero().expand([k])),
            Some(Ok(given)) => (
                given.clone().slice(chosen.clone()),
                given.clone().slice(rejected.clone()),
            ),
            Some(Err(head)) => {
                let rx = pair_rows(&head.x, chosen.clone(), rejected.clone());
                let rl = chunk_logits::<B>(rx, &head.weight_t, head.bias.as_ref());
                let rn = token_nll::<B>(rl, y_c.clone(), 2 * k, options.ignore_index);
                let rs = sequence_logps(rn, counts_c.clone(), options.average_log_prob);
                (rs.clone().slice(0..k), rs.slice(k..2 * k))
            }
        };
        let (c, r) = (s.clone().slice(0..k), s.slice(k..2 * k));
        let terms = pair_terms(&options, c.clone(), r.clone(), ref_c, ref_r);
        loss_sum = loss_sum + terms.loss.sum();
        if options.compute_nll_loss {
            nll_sum = nll_sum + nll.clone().slice(0..k).sum();
        }
        if let Some((ls, lo)) = &terms.log_odds {
            log_odds_ratio = log_odds_ratio + ls.clone().sum();
            log_odds_chosen = log_odds_chosen + lo.clone().sum();
        }
        logps.0.push(c);
        logps.1.push(r);
        rewards.0.push(terms.chosen_rewards);
        rewards.1.push(terms.rejected_rewards);
        if compute_grad {
            // Row factor of the cross-entropy gradient (`onehot − softmax` is the gradient
            // of `log p(y_t)`, the cross entropy's is its negative): `−∂L/∂s / B`, divided
            // by the sequence's positions for a mean, plus `α/N_chosen` on chosen rows.
            let mut seq_factor =
                Tensor::cat(vec![terms.d_chosen, terms.d_rejected], 0) * (-1.0 / b as f64);
            if options.average_log_prob {
                seq_factor = seq_factor / counts_c;
            }
            if options.compute_nll_loss {
                let nll_rows = Tensor::cat(
                    vec![
                        nll_scale.clone().expand([k]) * options.alpha,
                        Tensor::<B, 1>::zeros([k], &device).cast(DType::F32),
                    ],
                    0,
                );
                seq_factor = seq_factor + nll_rows;
            }
            let row_factor = seq_factor
                .reshape([2 * k, 1])
                .expand([2 * k, t])
                .reshape([2 * k * t]);
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
            let gx = grads.add(float(g), x_c, &weight).reshape([2 * k, t, h]);
            grad_x.0.push(gx.clone().slice(0..k));
            grad_x.1.push(gx.slice(k..2 * k));
        }
        p0 = p1;
    }
    let per_pair = 1.0 / b as f64;
    let nll_loss = nll_sum * nll_scale;
    let mut loss = loss_sum * per_pair;
    if options.compute_nll_loss {
        loss = loss + nll_loss.clone() * options.alpha;
    }
    let logits_per_side = 1.0 / (b * t * v) as f64;
    let orpo = matches!(options.loss, PreferenceLoss::Orpo);
    let (grad_weight, grad_bias) = grads.finish(w_dtype, b_dtype.unwrap_or(w_dtype));
    PreferenceOutput {
        loss: prim(loss),
        chosen_logps: prim(Tensor::cat(logps.0, 0)),
        rejected_logps: prim(Tensor::cat(logps.1, 0)),
        chosen_rewards: prim(Tensor::cat(rewards.0, 0)),
        rejected_rewards: prim(Tensor::cat(rewards.1, 0)),
        chosen_logits_mean: prim(chosen_logits * logits_per_side),
        rejected_logits_mean: prim(rejected_logits * logits_per_side),
        nll_loss: prim(nll_loss),
        log_odds_ratio: orpo.then(|| prim(log_odds_ratio * per_pair)),
        log_odds_chosen: orpo.then(|| prim(log_odds_chosen * per_pair)),
        grad_x: compute_grad.then(|| {
            let mut parts = grad_x.0;
            parts.extend(grad_x.1);
            prim(Tensor::cat(parts, 0))
        }),
        grad_weight,
        grad_bias,
    }
}
