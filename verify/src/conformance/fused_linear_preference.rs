//! Fused linear preference losses (DPO and its variants, ORPO, CPO, SimPO) in the
//! conformance suite: the naive f64 reference with its error bounds, and the case runner.
//! `rows` is the number of pairs `B`, `width` the vocabulary `V`; every sequence has
//! [`SEQ`] positions and the hidden size is [`HIDDEN`].
//!
//! # What an implementation computes, and how far it may be from the reference
//!
//! The op is defined as the composition `ops::compose::fused_linear_preference` documents:
//! per chunk of pairs, the logits of [`super::linear_cross_entropy`] (rounded to the dtype,
//! with the same uncertainty near rounding boundaries), each position's `−log p(y_t)` as the
//! fused cross entropy computes it (its row error, [`super::cross_entropy::row_stats`]),
//! the sequences' log-probabilities as f32 sums (and means) of those, the pair losses and
//! their derivatives as f32 formulas of the sequences' values, and the logits gradient as
//! the cross entropy's with a per-row factor built from them, then the linear layer's
//! gradients ([`super::linear_cross_entropy::linear_gradients`]).
//!
//! Every scalar formula is evaluated in [`Tracked`] arithmetic, which carries the error of
//! its inputs and of each f32 operation through it: the sequences' log-probabilities carry
//! the errors of their tokens (independent across tokens) and of the f32 sums; the pair
//! terms carry those; the loss is their f32 sum. A gradient element's bound is the cross
//! entropy's for an exact factor plus the factor's own error times `|p − δ|`; the factor
//! is shared by the positions of a sequence, so those errors add linearly within it before
//! the reductions over sequences treat them as independent.

use super::bounds::{Expected, Terms, U32};
use super::cross_entropy::{Factors, element};
use super::linear_cross_entropy::{
    GradElement, LinearInputs, RowLayout, compare_linear, linear_gradients, linear_row_stats,
};
use super::tracked::{self, Tracked};
use super::{Comparison, HostCase, Op, Rng, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional::{self, Reference};
use liger_burn::ops::compose::fused_linear_preference::chunk_pairs;
use liger_burn::ops::{
    CrossEntropyOptions, DpoLossType, FusedOps, PreferenceLoss, PreferenceOptions, Reduction,
};
use liger_burn::test_hooks::override_chunk_rows;

/// Positions per sequence (odd).
pub const SEQ: usize = 9;
/// Hidden size of the policy head (odd).
pub const HIDDEN: usize = 45;
/// Hidden size of the reference head (another odd size).
pub const REF_HIDDEN: usize = 27;

/// The pair terms of [`PreferenceLoss`] in [`Tracked`] arithmetic, the same formulas as
/// `ops::compose::fused_linear_preference::pair_terms`.
#[derive(Clone, Copy, Debug)]
pub struct PairTerms {
    pub loss: Tracked,
    pub d_chosen: Tracked,
    pub d_rejected: Tracked,
    pub chosen_reward: Tracked,
    pub rejected_reward: Tracked,
    /// ORPO's `(log σ(lo), lo)`.
    pub log_odds: Option<(Tracked, Tracked)>,
}

fn smoothed(d: Tracked, eps: f64) -> (Tracked, Tracked) {
    let loss = d
        .log_sigmoid()
        .scale(-(1.0 - eps))
        .sub(d.neg().log_sigmoid().scale(eps));
    let grad = d
        .neg()
        .sigmoid()
        .scale(-(1.0 - eps))
        .add(d.sigmoid().scale(eps));
    (loss, grad)
}

fn slope(x: Tracked) -> Tracked {
    x.sigmoid().mul(x.neg().sigmoid())
}

/// The pair terms for the sequences' log-probabilities `c`, `r` and the reference's `rc`,
/// `rr` (exact zeros without one).
pub fn pair_terms(
    options: &PreferenceOptions,
    c: Tracked,
    r: Tracked,
    rc: Tracked,
    rr: Tracked,
) -> PairTerms {
    let beta = options.beta;
    let eps = options.label_smoothing;
    let plain = |loss, d_chosen, d_rejected| PairTerms {
        loss,
        d_chosen,
        d_rejected,
        chosen_reward: c.scale(beta),
        rejected_reward: r.scale(beta),
        log_odds: None,
    };
    match options.loss {
        PreferenceLoss::Dpo(kind) => {
            let (cl, rl) = (c.sub(rc), r.sub(rr));
            let d = cl.sub(rl).scale(beta);
            let of_d = |(loss, dd): (Tracked, Tracked)| (loss, dd.scale(beta), dd.scale(-beta));
            let (loss, dc, dr) = match kind {
                DpoLossType::Sigmoid => of_d(smoothed(d, eps)),
                DpoLossType::Hinge => of_d((d.neg().shift(1.0).relu(), d.step_below(1.0).neg())),
                DpoLossType::Robust => {
                    let scale = 1.0 / (1.0 - 2.0 * eps);
                    let loss = d
                        .log_sigmoid()
                        .scale(-(1.0 - eps))
                        .add(d.neg().log_sigmoid().scale(eps))
                        .scale(scale);
                    let grad = d
                        .neg()
                        .sigmoid()
                        .scale(-(1.0 - eps))
                        .sub(d.sigmoid().scale(eps))
                        .scale(scale);
                    of_d((loss, grad))
                }
                DpoLossType::ExoPair => {
                    let (log_pw, log_pl) = ((1.0 - eps).ln(), eps.ln());
                    let (qw, ql) = (d.sigmoid(), d.neg().sigmoid());
                    let loss = qw
                        .mul(d.log_sigmoid().shift(-log_pw))
                        .add(ql.mul(d.neg().log_sigmoid().shift(-log_pl)));
                    let grad = qw.mul(ql).mul(d.shift(-(log_pw - log_pl)));
                    of_d((loss, grad))
                }
                DpoLossType::NcaPair => {
                    let (bc, br) = (cl.scale(beta), rl.scale(beta));
                    let loss = bc
                        .log_sigmoid()
                        .neg()
                        .sub(bc.neg().log_sigmoid().scale(0.5))
                        .sub(br.neg().log_sigmoid().scale(0.5));
                    let dc = bc
                        .neg()
                        .sigmoid()
                        .neg()
                        .add(bc.sigmoid().scale(0.5))
                        .scale(beta);
                    (loss, dc, br.sigmoid().scale(0.5 * beta))
                }
                DpoLossType::BcoPair => {
                    let (bc, br) = (cl.scale(beta), rl.scale(beta));
                    let loss = bc.log_sigmoid().neg().sub(br.neg().log_sigmoid());
                    (
                        loss,
                        bc.neg().sigmoid().scale(-beta),
                        br.sigmoid().scale(beta),
                    )
                }
                DpoLossType::SppoHard => {
                    let half = 0.5 / beta;
                    let (a, b) = (cl.shift(-half), rl.shift(half));
                    (a.square().add(b.square()), a.scale(2.0), b.scale(2.0))
                }
                DpoLossType::ApoZero => {
                    let (bc, br) = (cl.scale(beta), rl.scale(beta));
                    let loss = bc.sigmoid().neg().shift(1.0).add(br.sigmoid());
                    (loss, slope(bc).scale(-beta), slope(br).scale(beta))
                }
                DpoLossType::ApoDown => {
                    let bc = cl.scale(beta);
                    let loss = bc.sigmoid().shift(1.0).sub(d.sigmoid());
                    let sd = slope(d).scale(beta);
                    (loss, slope(bc).scale(beta).sub(sd), sd)
                }
                DpoLossType::Discopop { tau } => {
                    let m = d.scale(1.0 / tau).sigmoid();
                    let e = d.neg().exp();
                    let ls = d.log_sigmoid();
                    let one_minus_m = m.neg().shift(1.0);
                    let loss = ls.neg().mul(one_minus_m).add(e.mul(m));
                    let dm = m.mul(one_minus_m).scale(1.0 / tau);
                    let grad = d
                        .neg()
                        .sigmoid()
                        .neg()
                        .mul(one_minus_m)
                        .sub(e.mul(m))
                        .add(dm.mul(ls.add(e)));
                    of_d((loss, grad))
                }
            };
            PairTerms {
                loss,
                d_chosen: dc,
                d_rejected: dr,
                chosen_reward: cl.scale(beta),
                rejected_reward: rl.scale(beta),
                log_odds: None,
            }
        }
        PreferenceLoss::Orpo => {
            // `p − ln(1 − eᵖ)`, the device's `log1p(−exp(p))`.
            let odds = |p: Tracked| p.sub(p.exp().neg().ln_1p());
            let lo = odds(c).sub(odds(r));
            let ls = lo.log_sigmoid();
            let dlo = lo.neg().sigmoid().scale(-beta);
            let dc = dlo.div(c.exp().neg().shift(1.0));
            let dr = dlo.neg().div(r.exp().neg().shift(1.0));
            let mut terms = plain(ls.scale(-beta), dc, dr);
            terms.log_odds = Some((ls, lo));
            terms
        }
        PreferenceLoss::Cpo => {
            let (loss, dd) = smoothed(c.sub(r).scale(beta), eps);
            plain(loss, dd.scale(beta), dd.scale(-beta))
        }
        PreferenceLoss::Simpo { gamma } => {
            let (loss, dd) = smoothed(c.sub(r).scale(beta).shift(-gamma), eps);
            plain(loss, dd.scale(beta), dd.scale(-beta))
        }
    }
}

/// The reference model of a case, as rounded inputs.
pub enum RefInputs<'a> {
    /// None: log-probabilities 0.
    None,
    /// Given `[2B]` log-probabilities (f32 values, exact).
    LogProbs(&'a [f64]),
    /// A reference head over `[2B·T, H_ref]` rows.
    Model {
        x: &'a [f64],
        w: &'a [f64],
        b: Option<&'a [f64]>,
        hidden: usize,
    },
}

/// The rounded inputs of a preference case.
pub struct PreferenceInputs<'a> {
    /// `[2B·T, H]`.
    pub x: &'a [f64],
    /// `[V, H]`.
    pub w: &'a [f64],
    /// `[V]`.
    pub b: Option<&'a [f64]>,
    /// `[2B·T]`.
    pub targets: &'a [i64],
    pub reference: RefInputs<'a>,
    /// The upstream gradient of the loss.
    pub g: f64,
}

/// The cross-entropy options of the per-position log-probabilities.
pub(crate) fn token_options(ignore_index: i64) -> CrossEntropyOptions {
    CrossEntropyOptions::default()
        .with_ignore_index(ignore_index)
        .with_reduction(Reduction::None)
}

/// The reference model's per-sequence log-probabilities over `targets` (`[S·T]`): none (0),
/// given, or from its own head's rows.
pub(crate) fn reference_logps(
    reference: &RefInputs,
    targets: &[i64],
    dtype: DType,
    (s, t, v): (usize, usize, usize),
    ignore_index: i64,
    average: bool,
) -> Vec<Tracked> {
    match reference {
        RefInputs::None => vec![Tracked::exact(0.0); s],
        RefInputs::LogProbs(l) => l.iter().map(|&x| Tracked::exact(x)).collect(),
        RefInputs::Model { x, w, b, hidden } => {
            let head = LinearInputs {
                x,
                w,
                b: *b,
                targets,
                class_weight: None,
                g: &[],
            };
            sequence_logps(&head, dtype, (s, t, *hidden, v), ignore_index, average).2
        }
    }
}

/// Each row's `log p(y_t)` (0 on ignored rows) and each sequence's log-probability
/// (`[2B]`), from the logits of a head.
pub(crate) fn sequence_logps(
    head: &LinearInputs,
    dtype: DType,
    (s, t, h, v): (usize, usize, usize, usize),
    ignore_index: i64,
    average: bool,
) -> (
    Vec<super::cross_entropy::RowStats>,
    Vec<Tracked>,
    Vec<Tracked>,
) {
    let stats = linear_row_stats(head, dtype, (s * t, h, v), &token_options(ignore_index));
    let tokens: Vec<Tracked> = stats
        .iter()
        .map(|st| {
            if st.valid {
                Tracked::new(-st.loss, st.loss_error)
            } else {
                Tracked::exact(0.0)
            }
        })
        .collect();
    let logps = (0..s)
        .map(|q| {
            let seq = &tokens[q * t..(q + 1) * t];
            let sum = tracked::sum(seq);
            if average {
                let n = stats[q * t..(q + 1) * t]
                    .iter()
                    .filter(|st| st.valid)
                    .count();
                sum.div(Tracked::exact(n as f64))
            } else {
                sum
            }
        })
        .collect();
    (stats, tokens, logps)
}

/// The sum of row `i`'s logits over the classes as the ops compute it: a product of the
/// logits with a column of ones (f32 accumulation of the `V` rounded logits, with their
/// uncertainty) stored in the dtype.
pub(crate) fn row_logit_sum(
    head: &LinearInputs,
    (h, v): (usize, usize),
    dtype: DType,
    i: usize,
) -> Tracked {
    let (mut sum, mut terms, mut errors) = (0.0, Terms::default(), Terms::default());
    for c in 0..v {
        let (z, dz) = super::linear_cross_entropy::logit(head, h, dtype, i, c);
        sum += z;
        terms.push(z);
        errors.push(dz);
    }
    let store = super::bounds::unit_roundoff(dtype) * sum.abs() + super::bounds::flush(dtype, sum);
    Tracked::new(sum, errors.independent() + terms.accumulation() + store)
}

/// Metric names that are stored in f32 whatever the inputs' dtype.
pub const METRICS: [&str; 9] = [
    "chosen_logps",
    "rejected_logps",
    "chosen_rewards",
    "rejected_rewards",
    "chosen_logits_mean",
    "rejected_logits_mean",
    "nll_loss",
    "log_odds_ratio",
    "log_odds_chosen",
];

fn scalar(name: &'static str, t: Tracked) -> Expected {
    Expected::new(name, vec![t.v], vec![t.e + U32 * t.v.abs()], 1)
}

fn vector(name: &'static str, ts: &[Tracked]) -> Expected {
    Expected::new(
        name,
        ts.iter().map(|t| t.v).collect(),
        ts.iter().map(|t| t.e + U32 * t.v.abs()).collect(),
        ts.len(),
    )
}

/// The reference of a fused linear preference loss: the loss, TRL's metrics, and the
/// gradients of `x`, the weight and the bias (for the upstream gradient `inp.g`) with their
/// bounds. `pairs_per_chunk` is the implementation's chunking.
pub fn expected(
    options: &PreferenceOptions,
    dtype: DType,
    (b, t, h, v): (usize, usize, usize, usize),
    inp: &PreferenceInputs,
    pairs_per_chunk: usize,
) -> Vec<Expected> {
    let s = 2 * b;
    let n = s * t;
    let head = LinearInputs {
        x: inp.x,
        w: inp.w,
        b: inp.b,
        targets: inp.targets,
        class_weight: None,
        g: &[],
    };
    let (stats, tokens, logps) = sequence_logps(
        &head,
        dtype,
        (s, t, h, v),
        options.ignore_index,
        options.average_log_prob,
    );
    let ref_logps = reference_logps(
        &inp.reference,
        inp.targets,
        dtype,
        (s, t, v),
        options.ignore_index,
        options.average_log_prob,
    );
    let pairs: Vec<PairTerms> = (0..b)
        .map(|p| {
            pair_terms(
                options,
                logps[p],
                logps[b + p],
                ref_logps[p],
                ref_logps[b + p],
            )
        })
        .collect();
    let per_pair = 1.0 / b as f64;
    let pair_sum = tracked::sum(&pairs.iter().map(|p| p.loss).collect::<Vec<_>>());
    let chosen_count = (0..b * t).filter(|&i| stats[i].valid).count() as f64;
    let nll_scale = Tracked::exact(1.0).div(Tracked::exact(chosen_count));
    let nll_loss = if options.compute_nll_loss {
        tracked::sum(&tokens[..b * t].iter().map(|x| x.neg()).collect::<Vec<_>>()).mul(nll_scale)
    } else {
        Tracked::exact(0.0)
    };
    let mut loss = pair_sum.scale(per_pair);
    if options.compute_nll_loss {
        loss = loss.add(nll_loss.scale(options.alpha));
    }
    // The logits' sums: every position and class of a side, f32 accumulation.
    let logits_mean = |rows: std::ops::Range<usize>| {
        let sums: Vec<Tracked> = rows
            .map(|i| row_logit_sum(&head, (h, v), dtype, i))
            .collect();
        tracked::sum(&sums).scale(1.0 / (b * t * v) as f64)
    };
    let mut out = vec![
        scalar("loss", loss),
        vector("chosen_logps", &logps[..b]),
        vector("rejected_logps", &logps[b..]),
        vector(
            "chosen_rewards",
            &pairs.iter().map(|p| p.chosen_reward).collect::<Vec<_>>(),
        ),
        vector(
            "rejected_rewards",
            &pairs.iter().map(|p| p.rejected_reward).collect::<Vec<_>>(),
        ),
        scalar("chosen_logits_mean", logits_mean(0..b * t)),
        scalar("rejected_logits_mean", logits_mean(b * t..n)),
    ];
    // Without the NLL term the metric is exactly 0 (as Liger-Kernel reports it).
    out.push(scalar("nll_loss", nll_loss));
    if matches!(options.loss, PreferenceLoss::Orpo) {
        let ratio = tracked::sum(
            &pairs
                .iter()
                .map(|p| p.log_odds.unwrap().0)
                .collect::<Vec<_>>(),
        );
        let chosen = tracked::sum(
            &pairs
                .iter()
                .map(|p| p.log_odds.unwrap().1)
                .collect::<Vec<_>>(),
        );
        out.push(scalar("log_odds_ratio", ratio.scale(per_pair)));
        out.push(scalar("log_odds_chosen", chosen.scale(per_pair)));
    }

    // Each sequence's factor of the cross-entropy gradient (times the upstream gradient,
    // which the backward applies to the stored gradients).
    let factors: Vec<Tracked> = (0..s)
        .map(|q| {
            let p = &pairs[q % b];
            let d = if q < b { p.d_chosen } else { p.d_rejected };
            let mut f = d.scale(-per_pair);
            if options.average_log_prob {
                let count = stats[q * t..(q + 1) * t]
                    .iter()
                    .filter(|st| st.valid)
                    .count();
                f = f.div(Tracked::exact(count as f64));
            }
            if options.compute_nll_loss && q < b {
                f = f.add(nll_scale.scale(options.alpha));
            }
            Tracked::new(f.v * inp.g, f.e * inp.g.abs())
        })
        .collect();
    let ce = token_options(options.ignore_index);
    let chunk_of: Vec<usize> = (0..n)
        .map(|i| (i / t % b) / pairs_per_chunk.max(1))
        .collect();
    let group_of: Vec<usize> = (0..n).map(|i| i / t).collect();
    let grads = linear_gradients(
        &head,
        dtype,
        (n, h, v),
        &RowLayout {
            chunk_of: &chunk_of,
            group_of: &group_of,
            weight_grad_in_dtype: false,
        },
        &[n],
        2.0,
        |i, c, z, dz| {
            let st = &stats[i];
            if !st.valid {
                return GradElement::default();
            }
            let f = factors[i / t];
            let e = element(
                st,
                c,
                z,
                dz,
                None,
                &ce,
                Factors { ce: f.v, z: 0.0 },
                dtype,
                1.0,
            );
            let p = (z - st.lse).exp();
            let delta = if c == st.target { 1.0 } else { 0.0 };
            GradElement {
                grad: e.grad,
                independent: e.independent,
                shared: e.per_lse * st.lse_error + f.e * (p - delta).abs(),
            }
        },
    );
    out.extend(grads.into_iter().flatten());
    out
}

impl Op {
    /// Whether this is one of the fused linear preference variants.
    pub fn is_preference(self) -> bool {
        matches!(
            self,
            Op::FusedLinearDpo
                | Op::FusedLinearDpoLossTypes
                | Op::FusedLinearOrpo
                | Op::FusedLinearCpo
                | Op::FusedLinearSimpo
        )
    }
}

/// The sweep (`rows` pairs of [`SEQ`] positions, `width` = V). The quick list: one pair at
/// a tiny vocabulary, three pairs (three chunks when one pair is forced per chunk). The
/// full list adds the widths of real tokenizers.
pub(crate) fn shapes(_op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 7), (3, 100)];
    if !quick {
        shapes.extend([(4, 4097), (8, 32_000), (16, 128_256)]);
    }
    shapes
}

/// How the reference model's log-probabilities come in.
#[derive(Clone, Copy, PartialEq)]
enum RefKind {
    None,
    Given,
    Model,
}

/// What a variant exercises.
struct Variant {
    options: PreferenceOptions,
    bias: bool,
    reference: RefKind,
    /// One pair per chunk (Liger-Kernel's default chunk size) instead of the automatic size.
    one_pair_chunks: bool,
}

fn variant(op: Op, loss_type: DpoLossType) -> Variant {
    match op {
        // Sigmoid with TRL's label smoothing, a reference head with a bias, the NLL term.
        Op::FusedLinearDpo => Variant {
            options: PreferenceOptions::dpo()
                .with_label_smoothing(0.1)
                .with_compute_nll_loss(true)
                .with_alpha(0.5),
            bias: true,
            reference: RefKind::Model,
            one_pair_chunks: true,
        },
        // Every loss type on given reference log-probabilities, averaged.
        Op::FusedLinearDpoLossTypes => Variant {
            options: PreferenceOptions::dpo()
                .with_loss(PreferenceLoss::Dpo(loss_type))
                .with_beta(0.5)
                .with_label_smoothing(0.1)
                .with_average_log_prob(true),
            bias: false,
            reference: RefKind::Given,
            one_pair_chunks: false,
        },
        Op::FusedLinearOrpo => Variant {
            options: PreferenceOptions::orpo(),
            bias: true,
            reference: RefKind::None,
            one_pair_chunks: true,
        },
        Op::FusedLinearCpo => Variant {
            options: PreferenceOptions::cpo()
                .with_label_smoothing(0.1)
                .with_ignore_index(3),
            bias: false,
            reference: RefKind::None,
            one_pair_chunks: true,
        },
        Op::FusedLinearSimpo => Variant {
            options: PreferenceOptions::simpo().with_label_smoothing(0.05),
            bias: true,
            reference: RefKind::None,
            one_pair_chunks: false,
        },
        other => unreachable!("{other:?} is not a preference variant"),
    }
}

/// The loss types a case of `op` runs.
fn loss_types(op: Op) -> Vec<DpoLossType> {
    if op == Op::FusedLinearDpoLossTypes {
        DpoLossType::ALL.to_vec()
    } else {
        vec![DpoLossType::Sigmoid]
    }
}

/// The inputs of a case, as drawn.
struct Inputs {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    targets: Vec<i64>,
    ref_x: Vec<f32>,
    ref_w: Vec<f32>,
    ref_b: Vec<f32>,
    ref_logps: Vec<f32>,
    g: f32,
}

/// Targets of `s` sequences of `t` positions: a prompt of 0 to `t − 2` ignored positions,
/// then tokens, some trailing padding; at least one scored position each.
pub(crate) fn draw_targets(s: usize, t: usize, v: usize, ignore: i64, rng: &mut Rng) -> Vec<i64> {
    let mut out = Vec::with_capacity(s * t);
    for _ in 0..s {
        let prompt = rng.below(t - 1);
        let end = t - rng.below(t - prompt).min(2);
        for p in 0..t {
            let token = loop {
                let y = rng.below(v) as i64;
                if y != ignore {
                    break y;
                }
            };
            out.push(if p < prompt || p >= end.max(prompt + 1) {
                ignore
            } else {
                token
            });
        }
    }
    out
}

fn draw(op: Op, b: usize, v: usize, options: &PreferenceOptions, rng: &mut Rng) -> Inputs {
    let var = variant(op, DpoLossType::Sigmoid);
    let (s, t) = (2 * b, SEQ);
    let x = rng.vec(s * t * HIDDEN, -1.0, 1.0, 0.0);
    let w = rng.vec(v * HIDDEN, -0.5, 0.5, 0.0);
    let bias = var.bias.then(|| rng.vec(v, -0.5, 0.5, 0.0));
    let targets = draw_targets(s, t, v, options.ignore_index, rng);
    let ref_x = rng.vec(s * t * REF_HIDDEN, -1.0, 1.0, 0.0);
    let ref_w = rng.vec(v * REF_HIDDEN, -0.5, 0.5, 0.0);
    let ref_b = rng.vec(v, -0.5, 0.5, 0.0);
    let scale = if options.average_log_prob {
        1.0
    } else {
        t as f32
    };
    let ref_logps = rng
        .vec(s, -3.0, -0.5, 0.0)
        .into_iter()
        .map(|l| l * scale)
        .collect();
    let g = rng.vec(1, 0.5, 1.5, 0.0)[0];
    Inputs {
        x,
        w,
        b: bias,
        targets,
        ref_x,
        ref_w,
        ref_b,
        ref_logps,
        g,
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&c| f64::from(c)).collect()
}

/// The chunking of a case: pairs per chunk, and the rows to force for it (if any).
fn chunking(var: &Variant, b: usize, v: usize) -> (usize, Option<usize>) {
    if var.one_pair_chunks {
        (1, Some(2 * SEQ))
    } else {
        (chunk_pairs(b, SEQ, HIDDEN, v), None)
    }
}

/// See [`super::host_case`]: the first loss type's reference (the wrong-output tests drop
/// the last rows of each per-row tensor themselves).
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
) -> HostCase {
    let (b, v) = (rows, width);
    let var = variant(op, loss_types(op)[0]);
    let options = var.options;
    let inputs = draw(op, b, v, &options, rng);
    let r = |x: &[f32]| host_input(x, dtype);
    let (x, w) = (r(&inputs.x), r(&inputs.w));
    let bias = inputs.b.as_ref().map(|b| r(b));
    let (ref_x, ref_w, ref_b) = (r(&inputs.ref_x), r(&inputs.ref_w), r(&inputs.ref_b));
    let ref_logps = f64s(&inputs.ref_logps);
    let reference = match var.reference {
        RefKind::None => RefInputs::None,
        RefKind::Given => RefInputs::LogProbs(&ref_logps),
        RefKind::Model => RefInputs::Model {
            x: &ref_x,
            w: &ref_w,
            b: Some(&ref_b),
            hidden: REF_HIDDEN,
        },
    };
    let inp = PreferenceInputs {
        x: &x,
        w: &w,
        b: bias.as_deref(),
        targets: &inputs.targets,
        reference,
        g: f64::from(inputs.g),
    };
    let (pairs, _) = chunking(&var, b, v);
    let expected = expected(&options, dtype, (b, SEQ, HIDDEN, v), &inp, pairs);
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

/// Static names of the tensors of each loss type of [`Op::FusedLinearDpoLossTypes`].
fn typed_name(loss_type: DpoLossType, tensor: &str) -> &'static str {
    const NAMES: [[&str; 4]; 10] = [
        [
            "sigmoid loss",
            "sigmoid grad_x",
            "sigmoid grad_weight",
            "sigmoid chosen_rewards",
        ],
        [
            "hinge loss",
            "hinge grad_x",
            "hinge grad_weight",
            "hinge chosen_rewards",
        ],
        [
            "robust loss",
            "robust grad_x",
            "robust grad_weight",
            "robust chosen_rewards",
        ],
        [
            "exo_pair loss",
            "exo_pair grad_x",
            "exo_pair grad_weight",
            "exo_pair chosen_rewards",
        ],
        [
            "nca_pair loss",
            "nca_pair grad_x",
            "nca_pair grad_weight",
            "nca_pair chosen_rewards",
        ],
        [
            "bco_pair loss",
            "bco_pair grad_x",
            "bco_pair grad_weight",
            "bco_pair chosen_rewards",
        ],
        [
            "sppo_hard loss",
            "sppo_hard grad_x",
            "sppo_hard grad_weight",
            "sppo_hard chosen_rewards",
        ],
        [
            "apo_zero loss",
            "apo_zero grad_x",
            "apo_zero grad_weight",
            "apo_zero chosen_rewards",
        ],
        [
            "apo_down loss",
            "apo_down grad_x",
            "apo_down grad_weight",
            "apo_down chosen_rewards",
        ],
        [
            "discopop loss",
            "discopop grad_x",
            "discopop grad_weight",
            "discopop chosen_rewards",
        ],
    ];
    let t = DpoLossType::ALL
        .iter()
        .position(|l| l.name() == loss_type.name())
        .expect("a loss type");
    let k = ["loss", "grad_x", "grad_weight", "chosen_rewards"]
        .iter()
        .position(|n| *n == tensor)
        .expect("a compared tensor");
    NAMES[t][k]
}

/// Runs a preference variant with `B = rows` pairs, `V = width`.
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    let mut out = Vec::new();
    for loss_type in loss_types(op) {
        let comparisons = run_one::<B>(op, loss_type, rows, width, dtype, device, rng);
        if op == Op::FusedLinearDpoLossTypes {
            out.extend(
                comparisons
                    .into_iter()
                    .filter(|c| {
                        matches!(
                            c.tensor,
                            "loss" | "grad_x" | "grad_weight" | "chosen_rewards"
                        )
                    })
                    .map(|mut c| {
                        c.tensor = typed_name(loss_type, c.tensor);
                        c
                    }),
            );
        } else {
            out.extend(comparisons);
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run_one<B: FusedOps>(
    op: Op,
    loss_type: DpoLossType,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let (b, v, t, h) = (rows, width, SEQ, HIDDEN);
    let s = 2 * b;
    let var = variant(op, loss_type);
    let options = var.options;
    let inputs = draw(op, b, v, &options, rng);
    let (x, xr) = input::<B>(inputs.x, vec![s * t, h], dtype, device);
    let (w, wr) = input::<B>(inputs.w, vec![v, h], dtype, device);
    let probe = (x.clone(), w.clone());
    let bias = inputs.b.map(|bv| input::<B>(bv, vec![v], dtype, device));
    let (rx, rxr) = input::<B>(inputs.ref_x, vec![s * t, REF_HIDDEN], dtype, device);
    let (rw, rwr) = input::<B>(inputs.ref_w, vec![v, REF_HIDDEN], dtype, device);
    let (rb, rbr) = input::<B>(inputs.ref_b, vec![v], dtype, device);
    let ref_logps_r = f64s(&inputs.ref_logps);

    let x = Tensor::<A<B>, 2>::from_inner(x)
        .reshape([s, t, h])
        .require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let (bias, bias_r) = match bias {
        Some((bt, br)) => (
            Some(
                Tensor::<A<B>, 2>::from_inner(bt)
                    .reshape([v])
                    .require_grad(),
            ),
            Some(br),
        ),
        None => (None, None),
    };
    let targets =
        Tensor::<A<B>, 2, Int>::from_data(TensorData::new(inputs.targets.clone(), [s, t]), device);
    let reference = match var.reference {
        RefKind::None => Reference::None,
        RefKind::Given => Reference::LogProbs(Tensor::from_data(
            TensorData::new(inputs.ref_logps.clone(), [s]),
            device,
        )),
        RefKind::Model => Reference::Model {
            x: Tensor::<A<B>, 2>::from_inner(rx).reshape([s, t, REF_HIDDEN]),
            weight: Tensor::from_inner(rw),
            bias: Some(Tensor::<A<B>, 2>::from_inner(rb).reshape([v])),
        },
    };
    let (pairs, forced) = chunking(&var, b, v);
    poison::<B>(&[s * t * h, v * h, v, s * t * v], dtype, device);
    let (out, grads) = {
        let _chunk = forced.map(override_chunk_rows);
        let out = functional::fused_linear_preference(
            x.clone(),
            w.clone(),
            bias.clone(),
            targets,
            reference,
            options,
        );
        let grads = (out.loss.clone() * inputs.g).backward();
        (out, grads)
    };
    let m = &out.metrics;
    let mut actual = vec![
        ("loss", to_f64(out.loss.inner())),
        ("chosen_logps", to_f64(m.chosen_logps.clone().inner())),
        ("rejected_logps", to_f64(m.rejected_logps.clone().inner())),
        ("chosen_rewards", to_f64(m.chosen_rewards.clone().inner())),
        (
            "rejected_rewards",
            to_f64(m.rejected_rewards.clone().inner()),
        ),
        (
            "chosen_logits_mean",
            to_f64(m.chosen_logits_mean.clone().inner()),
        ),
        (
            "rejected_logits_mean",
            to_f64(m.rejected_logits_mean.clone().inner()),
        ),
        ("nll_loss", to_f64(m.nll_loss.clone().inner())),
        ("grad_x", to_f64(x.grad(&grads).expect("grad_x"))),
        ("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))),
    ];
    if let (Some(r), Some(c)) = (&m.log_odds_ratio, &m.log_odds_chosen) {
        actual.push(("log_odds_ratio", to_f64(r.clone().inner())));
        actual.push(("log_odds_chosen", to_f64(c.clone().inner())));
    }
    if let Some(bt) = &bias {
        actual.push(("grad_bias", to_f64(bt.grad(&grads).expect("grad_bias"))));
    }
    let reference = match var.reference {
        RefKind::None => RefInputs::None,
        RefKind::Given => RefInputs::LogProbs(&ref_logps_r),
        RefKind::Model => RefInputs::Model {
            x: &rxr,
            w: &rwr,
            b: Some(&rbr),
            hidden: REF_HIDDEN,
        },
    };
    let inp = PreferenceInputs {
        x: &xr,
        w: &wr,
        b: bias_r.as_deref(),
        targets: &inputs.targets,
        reference,
        g: f64::from(inputs.g),
    };
    let expected = expected(&options, dtype, (b, t, h, v), &inp, pairs);
    compare_linear(
        actual,
        &expected,
        dtype,
        (&probe.0, &xr),
        (&probe.1, &wr),
        rng,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivative formulas match central differences of the loss formulas in f64,
    /// for every loss and every DPO type, at random log-probabilities: the reference's
    /// gradients come from its own derivatives, so they are checked independently here.
    #[test]
    fn pair_derivatives_match_finite_differences() {
        let mut rng = Rng::new(7);
        let mut losses: Vec<PreferenceOptions> = DpoLossType::ALL
            .iter()
            .map(|&t| {
                PreferenceOptions::dpo()
                    .with_loss(PreferenceLoss::Dpo(t))
                    .with_beta(0.7)
                    .with_label_smoothing(0.1)
            })
            .collect();
        losses.push(PreferenceOptions::orpo().with_beta(0.3));
        losses.push(PreferenceOptions::cpo().with_label_smoothing(0.2));
        losses.push(PreferenceOptions::simpo().with_beta(2.0));
        for options in &losses {
            for _ in 0..20 {
                let draw = |rng: &mut Rng| f64::from(rng.vec(1, -3.0, -0.2, 0.0)[0]);
                let (c, r, rc, rr) = (
                    draw(&mut rng),
                    draw(&mut rng),
                    draw(&mut rng),
                    draw(&mut rng),
                );
                let loss = |c: f64, r: f64| {
                    pair_terms(
                        options,
                        Tracked::exact(c),
                        Tracked::exact(r),
                        Tracked::exact(rc),
                        Tracked::exact(rr),
                    )
                    .loss
                    .v
                };
                let at = pair_terms(
                    options,
                    Tracked::exact(c),
                    Tracked::exact(r),
                    Tracked::exact(rc),
                    Tracked::exact(rr),
                );
                let step = 1e-6;
                let dc = (loss(c + step, r) - loss(c - step, r)) / (2.0 * step);
                let dr = (loss(c, r + step) - loss(c, r - step)) / (2.0 * step);
                let name = match options.loss {
                    PreferenceLoss::Dpo(t) => t.name(),
                    other => other.name(),
                };
                for (what, analytic, numeric) in [
                    ("d_chosen", at.d_chosen.v, dc),
                    ("d_rejected", at.d_rejected.v, dr),
                ] {
                    assert!(
                        (analytic - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                        "{name} {what} at c={c} r={r} rc={rc} rr={rr}: analytic {analytic}, finite differences {numeric}"
                    );
                }
            }
        }
    }

    /// The formulas against values worked out by hand (and with TRL's / Liger-Kernel's
    /// Python expressions): DPO sigmoid at `d = β(c − r − rc + rr)`, ORPO's log odds.
    #[test]
    fn pair_losses_match_hand_values() {
        let t = Tracked::exact;
        let dpo = pair_terms(
            &PreferenceOptions::dpo(),
            t(-10.0),
            t(-12.0),
            t(-11.0),
            t(-11.5),
        );
        // d = 0.1 · ((−10 + 11) − (−12 + 11.5)) = 0.15; −log σ(0.15).
        assert!((dpo.loss.v - 0.620_957_048).abs() < 1e-8, "{}", dpo.loss.v);
        assert!((dpo.chosen_reward.v - 0.1).abs() < 1e-12);
        assert!((dpo.rejected_reward.v + 0.05).abs() < 1e-12);
        let orpo = pair_terms(&PreferenceOptions::orpo(), t(-0.5), t(-1.0), t(0.0), t(0.0));
        // lo = (−0.5 + 1) − (ln(1 − e^−0.5) − ln(1 − e^−1)) = 0.5 − (−0.932752 + 0.458675).
        let lo = 0.5 - ((1.0 - (-0.5f64).exp()).ln() - (1.0 - (-1.0f64).exp()).ln());
        assert!((orpo.log_odds.unwrap().1.v - lo).abs() < 1e-12);
        assert!((orpo.loss.v - 0.1 * (1.0 + (-lo).exp()).ln()).abs() < 1e-12);
    }
}
