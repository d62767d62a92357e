//! Fused linear KTO and GRPO in the conformance suite: the naive f64 references with their
//! error bounds, and the case runners. `rows` is the number of sequences `B`, `width` the
//! vocabulary `V`; every sequence has [`SEQ`] positions, the hidden size is [`HIDDEN`].
//!
//! The error model is [`super::fused_linear_preference`]'s: the logits and each position's
//! log-probability with the cross entropy's row errors, every scalar formula in
//! [`Tracked`] arithmetic, each logits-gradient element the cross entropy's for an exact
//! factor plus the factor's own error times `|p − δ|`. KTO's factor is shared by the
//! positions of a sequence (a group); GRPO's depends on its own token only. Where a
//! decision of the formula (GRPO's clipped branch, the clipped-token count) lies within
//! the error of its threshold, either outcome is allowed.

use super::bounds::{Expected, U32};
use super::cross_entropy::{Factors, RowStats, element, row_stats};
use super::fused_linear_preference::{
    RefInputs, draw_targets, reference_logps, row_logit_sum, sequence_logps, token_options,
};
use super::linear_cross_entropy::{
    GradElement, LinearInputs, RowLayout, compare_linear, linear_gradients, linear_row_stats, logit,
};
use super::tracked::{self, Tracked};
use super::{Comparison, HostCase, Op, Rng, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional::{self, Reference, TokenReference};
use liger_burn::ops::compose::fused_linear_preference::chunk_sequences;
use liger_burn::ops::{FusedOps, GrpoLossType, GrpoOptions, KtoOptions};
use liger_burn::test_hooks::override_chunk_rows;

/// Positions per sequence (odd).
pub const SEQ: usize = 7;
/// Hidden size of the policy head (odd).
pub const HIDDEN: usize = 45;
/// Hidden size of the reference head.
pub const REF_HIDDEN: usize = 27;

fn scalar(name: &'static str, t: Tracked) -> Expected {
    Expected::new(name, vec![t.v], vec![t.e + U32 * t.v.abs()], 1)
}

fn vector(name: &'static str, ts: &[Tracked], rows: usize) -> Expected {
    Expected::new(
        name,
        ts.iter().map(|t| t.v).collect(),
        ts.iter().map(|t| t.e + U32 * t.v.abs()).collect(),
        rows,
    )
}

/// The CE element of a row for the factor `f` (with its error), as a [`GradElement`].
fn factored(
    st: &RowStats,
    c: usize,
    z: f64,
    dz: f64,
    f: Tracked,
    ignore: i64,
    dtype: DType,
) -> GradElement {
    if !st.valid {
        return GradElement::default();
    }
    let e = element(
        st,
        c,
        z,
        dz,
        None,
        &token_options(ignore),
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
}

/// The rounded inputs of a KTO or GRPO case.
pub struct RlInputs<'a> {
    /// `[B·T, H]`, `[V, H]`, `[V]`, and the targets (`[B·T]`).
    pub head: LinearInputs<'a>,
    pub reference: RefInputs<'a>,
    /// The upstream gradient of the loss.
    pub g: f64,
}

/// The reference of a fused linear KTO: the loss, the per-sequence metrics and the
/// gradients. `labels` 1 desirable; `kl` the given estimate; `per_chunk` sequences per chunk.
pub fn kto_expected(
    options: &KtoOptions,
    dtype: DType,
    (b, t, h, v): (usize, usize, usize, usize),
    inp: &RlInputs,
    labels: &[i64],
    kl: f64,
    per_chunk: usize,
) -> Vec<Expected> {
    let n = b * t;
    let (stats, _, logps) = sequence_logps(
        &inp.head,
        dtype,
        (b, t, h, v),
        options.ignore_index,
        options.average_log_prob,
    );
    let refs = reference_logps(
        &inp.reference,
        inp.head.targets,
        dtype,
        (b, t, v),
        options.ignore_index,
        options.average_log_prob,
    );
    let beta = options.beta;
    let mut losses = Vec::new();
    let mut rewards = Vec::new();
    let mut factors = Vec::new();
    for q in 0..b {
        let desirable = labels[q] == 1;
        let sign = if desirable { 1.0 } else { -1.0 };
        let weight = Tracked::constant(if desirable {
            options.desirable_weight
        } else {
            options.undesirable_weight
        });
        let ratio = logps[q].sub(refs[q]);
        let z = ratio.sub(Tracked::exact(kl)).scale(sign).scale(beta);
        losses.push(weight.mul(z.sigmoid().neg().shift(1.0)));
        rewards.push(ratio.scale(beta));
        let mut f = weight
            .mul(z.sigmoid().mul(z.neg().sigmoid()))
            .scale(sign)
            .scale(beta / b as f64);
        if options.average_log_prob {
            let count = stats[q * t..(q + 1) * t].iter().filter(|s| s.valid).count();
            f = f.div(Tracked::exact(count as f64));
        }
        factors.push(Tracked::new(f.v * inp.g, f.e * inp.g.abs()));
    }
    let loss = tracked::sum(&losses).scale(1.0 / b as f64);
    let logits_sum: Vec<Tracked> = (0..b)
        .map(|q| {
            let rows: Vec<Tracked> = (q * t..(q + 1) * t)
                .map(|i| row_logit_sum(&inp.head, (h, v), dtype, i))
                .collect();
            tracked::sum(&rows)
        })
        .collect();
    let mut out = vec![
        scalar("loss", loss),
        vector("logps", &logps, b),
        vector("rewards", &rewards, b),
        vector("logits_sum", &logits_sum, b),
    ];
    let chunk_of: Vec<usize> = (0..n).map(|i| i / t / per_chunk.max(1)).collect();
    let group_of: Vec<usize> = (0..n).map(|i| i / t).collect();
    let grads = linear_gradients(
        &inp.head,
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
            factored(
                &stats[i],
                c,
                z,
                dz,
                factors[i / t],
                options.ignore_index,
                dtype,
            )
        },
    );
    out.extend(grads.into_iter().flatten());
    out
}

/// Each token's log-probability at the temperature (the scaled logits' cross entropy),
/// with the row statistics of those scaled logits.
fn token_logps(
    head: &LinearInputs,
    dtype: DType,
    (n, h, v): (usize, usize, usize),
    inv_t: f64,
) -> Vec<RowStats> {
    let ce = token_options(-100);
    if inv_t == 1.0 {
        return linear_row_stats(head, dtype, (n, h, v), &ce);
    }
    super::bounds::par_ranges(n, |range| {
        range
            .map(|i| {
                let (z, dz): (Vec<f64>, Vec<f64>) = (0..v)
                    .map(|c| {
                        let (z, dz) = logit(head, h, dtype, i, c);
                        (z * inv_t, dz * inv_t + U32 * (z * inv_t).abs())
                    })
                    .unzip();
                row_stats(&z, Some(&dz), head.targets[i], None, &ce)
            })
            .collect::<Vec<_>>()
    })
    .concat()
}

/// The reference of a fused linear GRPO: the loss, the per-token log-probabilities, the
/// KL and clip-ratio metrics and the gradients. `head.targets` hold the completion ids
/// with `-100` outside the mask; `old` the given old log-probabilities.
#[allow(clippy::too_many_arguments)]
pub fn grpo_expected(
    options: &GrpoOptions,
    dtype: DType,
    (b, t, h, v): (usize, usize, usize, usize),
    inp: &RlInputs,
    advantages: &[f64],
    old: Option<&[f64]>,
    per_chunk: usize,
) -> Vec<Expected> {
    let n = b * t;
    let inv_t = 1.0 / options.temperature;
    let stats = token_logps(&inp.head, dtype, (n, h, v), inv_t);
    let logp: Vec<Tracked> = stats
        .iter()
        .map(|s| {
            if s.valid {
                Tracked::new(-s.loss, s.loss_error)
            } else {
                Tracked::exact(0.0)
            }
        })
        .collect();
    let refs: Option<Vec<Tracked>> = match &inp.reference {
        RefInputs::None => None,
        RefInputs::LogProbs(l) => Some(l.iter().map(|&x| Tracked::exact(x)).collect()),
        RefInputs::Model {
            x,
            w,
            b: rb,
            hidden,
        } => {
            let rhead = LinearInputs {
                x,
                w,
                b: *rb,
                targets: inp.head.targets,
                class_weight: None,
                g: &[],
            };
            Some(
                token_logps(&rhead, dtype, (n, *hidden, v), inv_t)
                    .iter()
                    .map(|s| {
                        if s.valid {
                            Tracked::new(-s.loss, s.loss_error)
                        } else {
                            Tracked::exact(0.0)
                        }
                    })
                    .collect(),
            )
        }
    };
    let masked = |i: usize| stats[i].valid;
    let total = (0..n).filter(|&i| masked(i)).count() as f64;
    let total_t = Tracked::exact(total.max(1.0));
    let norm = |i: usize| -> Tracked {
        match options.loss_type {
            GrpoLossType::Grpo => {
                let q = i / t;
                let count = (q * t..(q + 1) * t).filter(|&j| masked(j)).count() as f64;
                Tracked::exact(1.0).div(Tracked::exact(count.max(1.0) * b as f64))
            }
            GrpoLossType::Bnpo | GrpoLossType::Dapo => Tracked::exact(1.0).div(total_t),
            GrpoLossType::DrGrpo {
                max_completion_length,
            } => Tracked::constant(1.0 / (b * max_completion_length) as f64),
        }
    };
    let (lo, hi) = (1.0 - options.epsilon_low, 1.0 + options.epsilon_high);
    let mut token_losses = Vec::new();
    let mut kls = Vec::new();
    let mut clipped = Vec::new();
    let mut factors = vec![Tracked::exact(0.0); n];
    for i in 0..n {
        if !masked(i) {
            continue;
        }
        let a = Tracked::exact(advantages[i / t]);
        let ell = logp[i];
        let c1 = match old {
            Some(o) => ell.sub(Tracked::exact(o[i])).exp(),
            // The old log-probability is the current one: the ratio is exactly 1.
            None => Tracked::exact(1.0),
        };
        // The clamp is 1-Lipschitz.
        let c2 = Tracked::new(c1.v.clamp(lo, hi), c1.e);
        let (l1, l2) = (c1.mul(a), c2.mul(a));
        let unclipped = l1.v <= l2.v;
        let uncertain = (l1.v - l2.v).abs() <= l1.e + l2.e;
        let mut loss = if unclipped { l1.neg() } else { l2.neg() };
        loss.e = loss.e.max(l1.e.max(l2.e));
        let mut d = if unclipped {
            c1.mul(a).neg()
        } else {
            Tracked::exact(0.0)
        };
        if uncertain {
            d.e += (c1.v * a.v).abs() + c1.e * a.v.abs();
        }
        if options.beta != 0.0 {
            let r = refs.as_ref().expect("a reference with beta")[i];
            let delta = r.sub(ell);
            let e = delta.exp();
            let kl = e.sub(delta).shift(-1.0);
            loss = loss.add(kl.scale(options.beta));
            d = d.add(e.neg().shift(1.0).scale(options.beta));
            kls.push(kl);
        }
        let is_clipped = (c1.v < lo && a.v < 0.0) || (c1.v > hi && a.v > 0.0);
        let near = (c1.v - lo).abs() <= c1.e || (c1.v - hi).abs() <= c1.e;
        clipped.push(Tracked::new(
            if is_clipped { 1.0 } else { 0.0 },
            if near { 1.0 } else { 0.0 },
        ));
        let w = norm(i);
        token_losses.push(loss.mul(w));
        let f = d.mul(w).scale(-inv_t);
        factors[i] = Tracked::new(f.v * inp.g, f.e * inp.g.abs());
    }
    let per_token: Vec<Tracked> = (0..n)
        .map(|i| {
            if masked(i) {
                logp[i]
            } else {
                Tracked::exact(0.0)
            }
        })
        .collect();
    let mut out = vec![
        scalar("loss", tracked::sum(&token_losses)),
        vector("per_token_logps", &per_token, b),
        scalar("clip_ratio", tracked::sum(&clipped).div(total_t)),
    ];
    if options.beta != 0.0 {
        out.push(scalar("kl", tracked::sum(&kls).div(total_t)));
    }
    let chunk_of: Vec<usize> = (0..n).map(|i| i / t / per_chunk.max(1)).collect();
    let group_of: Vec<usize> = (0..n).collect();
    // At a temperature the gradient is f32 until one cast: the CE element's store is that.
    let grads = linear_gradients(
        &inp.head,
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
            let (z, dz) = if inv_t == 1.0 {
                (z, dz)
            } else {
                (z * inv_t, dz * inv_t + U32 * (z * inv_t).abs())
            };
            factored(&stats[i], c, z, dz, factors[i], -100, dtype)
        },
    );
    out.extend(grads.into_iter().flatten());
    out
}

impl Op {
    /// Whether this is one of the KTO or GRPO variants.
    pub fn is_rl(self) -> bool {
        matches!(
            self,
            Op::FusedLinearKto
                | Op::FusedLinearKtoAvg
                | Op::FusedLinearGrpo
                | Op::FusedLinearDapo
                | Op::FusedLinearDrGrpo
        )
    }
}

/// The sweep (`rows` sequences of [`SEQ`] positions, `width` = V).
pub(crate) fn shapes(_op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 7), (5, 100)];
    if !quick {
        shapes.extend([(6, 4097), (16, 32_000), (32, 128_256)]);
    }
    shapes
}

/// Metric names stored in f32 whatever the dtype.
pub const METRICS: [&str; 6] = [
    "logps",
    "rewards",
    "logits_sum",
    "per_token_logps",
    "clip_ratio",
    "kl",
];

#[derive(Clone, Copy, PartialEq)]
enum RefKind {
    None,
    Given,
    Model,
}

struct Inputs {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    /// KTO: targets with ignored positions; GRPO: completion ids (all in range).
    ids: Vec<i64>,
    /// GRPO: 1 on completion tokens.
    mask: Vec<i64>,
    labels: Vec<i64>,
    advantages: Vec<f32>,
    ref_x: Vec<f32>,
    ref_w: Vec<f32>,
    ref_b: Vec<f32>,
    /// KTO: `[B]`; GRPO: `[B·T]`.
    ref_logps: Vec<f32>,
    old_logps: Vec<f32>,
    kl: f32,
    g: f32,
}

fn draw(op: Op, b: usize, v: usize, rng: &mut Rng) -> Inputs {
    let t = SEQ;
    let kto = matches!(op, Op::FusedLinearKto | Op::FusedLinearKtoAvg);
    let x = rng.vec(b * t * HIDDEN, -1.0, 1.0, 0.0);
    let w = rng.vec(v * HIDDEN, -0.5, 0.5, 0.0);
    let bias =
        matches!(op, Op::FusedLinearKto | Op::FusedLinearGrpo).then(|| rng.vec(v, -0.5, 0.5, 0.0));
    let (ids, mask) = if kto {
        (draw_targets(b, t, v, -100, rng), vec![])
    } else {
        let ids = (0..b * t).map(|_| rng.below(v) as i64).collect();
        // A prompt-free completion of 1 to T tokens, then padding.
        let mask = (0..b)
            .flat_map(|_| {
                let len = 1 + rng.below(t);
                (0..t).map(move |p| i64::from(p < len))
            })
            .collect();
        (ids, mask)
    };
    let labels = (0..b).map(|q| i64::from(q % 3 != 1)).collect();
    let scale = if op == Op::FusedLinearKtoAvg {
        1.0
    } else {
        t as f32
    };
    let n_ref = if kto { b } else { b * t };
    let ref_logps = rng
        .vec(n_ref, -4.0, -1.0, 0.0)
        .into_iter()
        .map(|l| if kto { l * scale } else { l })
        .collect();
    Inputs {
        x,
        w,
        b: bias,
        ids,
        mask,
        labels,
        advantages: rng.vec(b, -1.0, 1.0, 0.0),
        ref_x: rng.vec(b * t * REF_HIDDEN, -1.0, 1.0, 0.0),
        ref_w: rng.vec(v * REF_HIDDEN, -0.5, 0.5, 0.0),
        ref_b: rng.vec(v, -0.5, 0.5, 0.0),
        ref_logps,
        old_logps: rng.vec(b * t, -5.0, -3.0, 0.0),
        kl: rng.vec(1, 0.0, 0.5, 0.0)[0],
        g: rng.vec(1, 0.5, 1.5, 0.0)[0],
    }
}

struct KtoVariant {
    options: KtoOptions,
    reference: RefKind,
    kl: bool,
    one_sequence_chunks: bool,
}

fn kto_variant(op: Op) -> KtoVariant {
    match op {
        Op::FusedLinearKto => KtoVariant {
            options: KtoOptions::default().with_weights(1.0, 1.33),
            reference: RefKind::Model,
            kl: true,
            one_sequence_chunks: true,
        },
        _ => KtoVariant {
            options: KtoOptions::default()
                .with_beta(0.5)
                .with_average_log_prob(true),
            reference: RefKind::Given,
            kl: false,
            one_sequence_chunks: false,
        },
    }
}

struct GrpoVariant {
    options: GrpoOptions,
    reference: RefKind,
    old: bool,
    one_sequence_chunks: bool,
}

fn grpo_variant(op: Op) -> GrpoVariant {
    match op {
        // TRL's GRPO normalization, given reference and old log-probabilities.
        Op::FusedLinearGrpo => GrpoVariant {
            options: GrpoOptions::default().with_loss_type(GrpoLossType::Grpo),
            reference: RefKind::Given,
            old: true,
            one_sequence_chunks: true,
        },
        // DAPO with a reference head at a temperature, the current policy as the old one.
        Op::FusedLinearDapo => GrpoVariant {
            options: GrpoOptions::default()
                .with_beta(0.1)
                .with_epsilon(0.2, 0.28)
                .with_temperature(0.7),
            reference: RefKind::Model,
            old: false,
            one_sequence_chunks: false,
        },
        // Dr. GRPO without a KL term.
        _ => GrpoVariant {
            options: GrpoOptions::default()
                .with_beta(0.0)
                .with_loss_type(GrpoLossType::DrGrpo {
                    max_completion_length: SEQ + 2,
                }),
            reference: RefKind::None,
            old: true,
            one_sequence_chunks: true,
        },
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&c| f64::from(c)).collect()
}

fn per_chunk(one: bool, b: usize, v: usize) -> (usize, Option<usize>) {
    if one {
        (1, Some(SEQ))
    } else {
        (chunk_sequences(b, SEQ, HIDDEN, v), None)
    }
}

/// The targets the reference reads for GRPO: the completion ids, `-100` outside the mask.
fn grpo_targets(inputs: &Inputs) -> Vec<i64> {
    inputs
        .ids
        .iter()
        .zip(&inputs.mask)
        .map(|(&id, &m)| if m != 0 { id } else { -100 })
        .collect()
}

/// The reference of a case from its rounded inputs.
fn case_expected(
    op: Op,
    dtype: DType,
    (b, v): (usize, usize),
    inputs: &Inputs,
    r: &dyn Fn(&[f32]) -> Vec<f64>,
) -> Vec<Expected> {
    let (x, w) = (r(&inputs.x), r(&inputs.w));
    let bias = inputs.b.as_deref().map(r);
    let (ref_x, ref_w, ref_b) = (r(&inputs.ref_x), r(&inputs.ref_w), r(&inputs.ref_b));
    let ref_logps = f64s(&inputs.ref_logps);
    let grpo_t = grpo_targets(inputs);
    let kto = matches!(op, Op::FusedLinearKto | Op::FusedLinearKtoAvg);
    let targets = if kto { &inputs.ids } else { &grpo_t };
    let kind = if kto {
        kto_variant(op).reference
    } else {
        grpo_variant(op).reference
    };
    let reference = match kind {
        RefKind::None => RefInputs::None,
        RefKind::Given => RefInputs::LogProbs(&ref_logps),
        RefKind::Model => RefInputs::Model {
            x: &ref_x,
            w: &ref_w,
            b: Some(&ref_b),
            hidden: REF_HIDDEN,
        },
    };
    let inp = RlInputs {
        head: LinearInputs {
            x: &x,
            w: &w,
            b: bias.as_deref(),
            targets,
            class_weight: None,
            g: &[],
        },
        reference,
        g: f64::from(inputs.g),
    };
    if kto {
        let var = kto_variant(op);
        let kl = if var.kl { f64::from(inputs.kl) } else { 0.0 };
        kto_expected(
            &var.options,
            dtype,
            (b, SEQ, HIDDEN, v),
            &inp,
            &inputs.labels,
            kl,
            per_chunk(var.one_sequence_chunks, b, v).0,
        )
    } else {
        let var = grpo_variant(op);
        let old = f64s(&inputs.old_logps);
        grpo_expected(
            &var.options,
            dtype,
            (b, SEQ, HIDDEN, v),
            &inp,
            &f64s(&inputs.advantages),
            var.old.then_some(&old[..]),
            per_chunk(var.one_sequence_chunks, b, v).0,
        )
    }
}

/// See [`super::host_case`].
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
) -> HostCase {
    let inputs = draw(op, rows, width, rng);
    let expected = case_expected(op, dtype, (rows, width), &inputs, &|v| host_input(v, dtype));
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

/// Runs a KTO or GRPO variant with `B = rows` sequences, `V = width`.
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let (b, v, t, h) = (rows, width, SEQ, HIDDEN);
    let inputs = draw(op, b, v, rng);
    let (x, xr) = input::<B>(inputs.x.clone(), vec![b * t, h], dtype, device);
    let (w, wr) = input::<B>(inputs.w.clone(), vec![v, h], dtype, device);
    let probe = (x.clone(), w.clone());
    let bias = inputs
        .b
        .clone()
        .map(|bv| input::<B>(bv, vec![v], dtype, device).0);
    let (rx, _) = input::<B>(inputs.ref_x.clone(), vec![b * t, REF_HIDDEN], dtype, device);
    let (rw, _) = input::<B>(inputs.ref_w.clone(), vec![v, REF_HIDDEN], dtype, device);
    let (rb, _) = input::<B>(inputs.ref_b.clone(), vec![v], dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x)
        .reshape([b, t, h])
        .require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let bias = bias.map(|bt| {
        Tensor::<A<B>, 2>::from_inner(bt)
            .reshape([v])
            .require_grad()
    });
    let ints2 =
        |d: &[i64]| Tensor::<A<B>, 2, Int>::from_data(TensorData::new(d.to_vec(), [b, t]), device);
    let ref_model = || {
        (
            Tensor::<A<B>, 2>::from_inner(rx.clone()).reshape([b, t, REF_HIDDEN]),
            Tensor::<A<B>, 2>::from_inner(rw.clone()),
            Some(Tensor::<A<B>, 2>::from_inner(rb.clone()).reshape([v])),
        )
    };
    poison::<B>(&[b * t * h, v * h, v, b * t * v], dtype, device);
    let kto = matches!(op, Op::FusedLinearKto | Op::FusedLinearKtoAvg);
    let mut actual = Vec::new();
    let grads = if kto {
        let var = kto_variant(op);
        let reference = match var.reference {
            RefKind::None => Reference::None,
            RefKind::Given => Reference::LogProbs(Tensor::from_data(
                TensorData::new(inputs.ref_logps.clone(), [b]),
                device,
            )),
            RefKind::Model => {
                let (x, weight, bias) = ref_model();
                Reference::Model { x, weight, bias }
            }
        };
        let _chunk = per_chunk(var.one_sequence_chunks, b, v)
            .1
            .map(override_chunk_rows);
        let out = functional::fused_linear_kto(
            x.clone(),
            w.clone(),
            bias.clone(),
            ints2(&inputs.ids),
            Tensor::from_data(TensorData::new(inputs.labels.clone(), [b]), device),
            reference,
            var.kl
                .then(|| Tensor::from_data(TensorData::new(vec![inputs.kl], [1]), device)),
            var.options,
        );
        let grads = (out.loss.clone() * inputs.g).backward();
        let m = &out.metrics;
        actual.push(("loss", to_f64(out.loss.inner())));
        actual.push(("logps", to_f64(m.logps.clone().inner())));
        actual.push(("rewards", to_f64(m.rewards.clone().inner())));
        actual.push(("logits_sum", to_f64(m.logits_sum.clone().inner())));
        grads
    } else {
        let var = grpo_variant(op);
        let reference = match var.reference {
            RefKind::None => TokenReference::None,
            RefKind::Given => TokenReference::LogProbs(Tensor::from_data(
                TensorData::new(inputs.ref_logps.clone(), [b, t]),
                device,
            )),
            RefKind::Model => {
                let (x, weight, bias) = ref_model();
                TokenReference::Model { x, weight, bias }
            }
        };
        let _chunk = per_chunk(var.one_sequence_chunks, b, v)
            .1
            .map(override_chunk_rows);
        let out = functional::fused_linear_grpo(
            x.clone(),
            w.clone(),
            bias.clone(),
            ints2(&inputs.ids),
            ints2(&inputs.mask),
            Tensor::from_data(TensorData::new(inputs.advantages.clone(), [b]), device),
            reference,
            var.old.then(|| {
                Tensor::from_data(TensorData::new(inputs.old_logps.clone(), [b, t]), device)
            }),
            var.options,
        );
        let grads = (out.loss.clone() * inputs.g).backward();
        actual.push(("loss", to_f64(out.loss.inner())));
        actual.push(("per_token_logps", to_f64(out.per_token_logps.inner())));
        actual.push(("clip_ratio", to_f64(out.clip_ratio.inner())));
        actual.push(("kl", to_f64(out.kl.inner())));
        grads
    };
    actual.push(("grad_x", to_f64(x.grad(&grads).expect("grad_x"))));
    actual.push(("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))));
    if let Some(bt) = &bias {
        actual.push(("grad_bias", to_f64(bt.grad(&grads).expect("grad_bias"))));
    }
    // The reference sees the values the device holds.
    let expected = case_expected(op, dtype, (b, v), &inputs, &|vals| host_input(vals, dtype));
    compare_linear(
        actual,
        &expected,
        dtype,
        (&probe.0, &xr),
        (&probe.1, &wr),
        rng,
    )
}
