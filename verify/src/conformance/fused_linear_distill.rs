//! Fused linear distillation in the conformance suite: the naive f64 reference with its
//! error bounds, and the case runner. `rows` is `N`, `width` the student's vocabulary `V`;
//! the student's hidden size is [`HIDDEN`], the teacher's [`TEACHER_HIDDEN`].
//!
//! # What an implementation computes, and how far it may be from the reference
//!
//! The op is the composition `ops::compose::fused_linear_distill` documents: both heads'
//! logits rounded to the dtype as [`super::linear_cross_entropy`] defines them (with the
//! same uncertainty near rounding boundaries), the hard loss's rows by the cross entropy
//! (its row error, [`super::cross_entropy::row_stats`]), then in f32 the log-softmaxes of
//! the logits over `τ`, each element's divergence and `dX`, the row sums `Σ dX`, and the
//! logits gradient, rounded once to the dtype; then the linear layer's gradients
//! ([`super::linear_cross_entropy::linear_gradients`]).
//!
//! Each element is evaluated in [`Tracked`] arithmetic twice: with every input's error,
//! and without the errors shared by the row (its log-sum-exps and `Σ dX`): the second is
//! the element's own error, the difference the row's shared one.

use super::bounds::{Expected, Terms, U32, flush, unit_roundoff};
use super::cross_entropy::{RowStats, row_stats};
use super::linear_cross_entropy::{
    GradElement, LinearInputs, RowLayout, compare_linear, linear_gradients, logit,
};
use super::tracked::{self, Tracked};
use super::{Comparison, HostCase, Op, Rng, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::compose::fused_linear_distill::chunk_rows;
use liger_burn::ops::{CrossEntropyOptions, DistillOptions, Divergence, FusedOps, Reduction};
use liger_burn::test_hooks::override_chunk_rows;

/// Hidden size of the student head (odd).
pub const HIDDEN: usize = 45;
/// Hidden size of the teacher head (another odd size).
pub const TEACHER_HIDDEN: usize = 27;

/// The rounded inputs of a distillation case.
pub struct DistillInputs<'a> {
    /// The student head: `x: [N, H]`, `w: [V, H]`, `b: [V]`, the targets.
    pub student: LinearInputs<'a>,
    /// The teacher head: `x: [N, H_t]`, `w: [V_t, H_t]`, `b: [V_t]`.
    pub teacher: LinearInputs<'a>,
    /// The upstream gradient of the loss.
    pub g: f64,
}

/// One element's `log` probability as the device computes it: the scaled logit minus the
/// row's log-sum-exp.
fn log_prob(z: Tracked, inv_t: f64, lse: Tracked) -> Tracked {
    let scaled = if inv_t == 1.0 { z } else { z.scale(inv_t) };
    scaled.sub(lse)
}

/// The divergence of one element and its `dX` (see the module docs of the op), from the
/// student's and the teacher's log-probabilities.
fn divergence_element(ls: Tracked, lp: Tracked, divergence: Divergence) -> (Tracked, Tracked) {
    let (q, p) = (ls.exp(), lp.exp());
    match divergence.jsd_beta() {
        Some(0.0) => (p.mul(lp.sub(ls)), p.neg()),
        Some(1.0) => {
            let kl = q.mul(ls.sub(lp));
            (kl, kl.add(q))
        }
        Some(beta) => {
            let log_m = lp.shift(beta.ln()).log_add_exp(ls.shift((1.0 - beta).ln()));
            let student = q.mul(ls.sub(log_m));
            (
                p.mul(lp.sub(log_m))
                    .scale(beta)
                    .add(student.scale(1.0 - beta)),
                student.scale(1.0 - beta),
            )
        }
        None => {
            let diff = q.sub(p);
            // The sign flips only where the difference is within its error of 0.
            let sign = if diff.v > 0.0 { 1.0 } else { -1.0 };
            let d = if diff.v.abs() <= diff.e {
                Tracked::new(sign * 0.5 * q.v, q.v)
            } else {
                q.scale(0.5 * sign)
            };
            (diff.abs().scale(0.5), d)
        }
    }
}

/// A row's statistics for the soft loss.
#[derive(Clone)]
struct Row {
    valid: bool,
    target: usize,
    /// Log-sum-exps of the scaled student (padded) and teacher logits, and of the unscaled
    /// student logits (the hard loss's softmax).
    lse_s: Tracked,
    lse_t: Tracked,
    lse_raw: Tracked,
    /// `Σ_j dX_j`.
    sum_dx: Tracked,
    soft: Tracked,
    hard: Tracked,
}

fn stats_of(z: &[f64], dz: &[f64], target: i64, options: &CrossEntropyOptions) -> RowStats {
    row_stats(z, Some(dz), target, None, options)
}

/// One head's logits as the implementation holds them: `(z, δz)` for row `i`, class `c`,
/// the value and its error bound.
type Logits<'a> = dyn Fn(usize, usize) -> (f64, f64) + Sync + 'a;

/// The relative error of the device's `1/τ`: `τ` rounded to f32, then its reciprocal
/// (exact when both are f32 values, as for a power of two).
fn inverse_temperature_error(temperature: f64) -> f64 {
    let exact = |x: f64| f64::from(x as f32) == x;
    if exact(temperature) && exact(1.0 / temperature) {
        0.0
    } else {
        2.0 * U32
    }
}

/// The soft and hard losses of each row, with the statistics the gradient reuses, from
/// the student's (`V` columns, padded with zeros up to `V_t`) and the teacher's logits.
fn soft_rows(
    options: &DistillOptions,
    (n, v, vt): (usize, usize, usize),
    targets: &[i64],
    student: &Logits,
    teacher: &Logits,
) -> Vec<Row> {
    let inv_t = 1.0 / options.temperature;
    let inv_t_error = inverse_temperature_error(options.temperature);
    let ce = CrossEntropyOptions::default()
        .with_ignore_index(options.ignore_index)
        .with_reduction(Reduction::None);
    // `z·(1/τ)`: the product's rounding and `1/τ`'s own error.
    let scale_err = |z: f64| {
        if inv_t == 1.0 {
            0.0
        } else {
            (U32 + inv_t_error) * (z * inv_t).abs()
        }
    };
    super::bounds::par_ranges(n, |range| {
        range
            .map(|i| {
                let target = targets[i];
                let mut z = vec![0.0; vt];
                let mut dz = vec![0.0; vt];
                for c in 0..v {
                    (z[c], dz[c]) = student(i, c);
                }
                let raw = stats_of(&z[..v], &dz[..v], target, &ce);
                if !raw.valid {
                    let zero = Tracked::exact(0.0);
                    return Row {
                        valid: false,
                        target: 0,
                        lse_s: zero,
                        lse_t: zero,
                        lse_raw: zero,
                        sum_dx: zero,
                        soft: zero,
                        hard: zero,
                    };
                }
                let (zt, dzt): (Vec<f64>, Vec<f64>) = (0..vt).map(|c| teacher(i, c)).unzip();
                let scaled = |z: &[f64], dz: &[f64]| -> (Vec<f64>, Vec<f64>) {
                    z.iter()
                        .zip(dz)
                        .map(|(&a, &d)| (a * inv_t, d * inv_t + scale_err(a)))
                        .unzip()
                };
                let (zs, dzs) = scaled(&z, &dz);
                let (zts, dzts) = scaled(&zt, &dzt);
                let s = stats_of(&zs, &dzs, target, &ce);
                let t = stats_of(&zts, &dzts, target, &ce);
                let lse_s = Tracked::new(s.lse, s.lse_error);
                let lse_t = Tracked::new(t.lse, t.lse_error);
                // Each element twice: with the row's shared errors, and without.
                let (mut soft_own, mut soft_shared, mut soft_terms) =
                    (Terms::default(), 0.0, Terms::default());
                let (mut dx_own, mut dx_shared, mut dx_terms) =
                    (Terms::default(), 0.0, Terms::default());
                let (mut soft, mut sum_dx) = (0.0, 0.0);
                for c in 0..vt {
                    let zc = Tracked::new(z[c], dz[c]);
                    let tc = Tracked::new(zt[c], dzt[c]);
                    let full = divergence_element(
                        log_prob(zc, inv_t, lse_s),
                        log_prob(tc, inv_t, lse_t),
                        options.divergence,
                    );
                    let own = divergence_element(
                        log_prob(zc, inv_t, lse_s.exact_part()),
                        log_prob(tc, inv_t, lse_t.exact_part()),
                        options.divergence,
                    );
                    soft += full.0.v;
                    soft_terms.push(full.0.v);
                    soft_own.push(own.0.e);
                    soft_shared += full.0.e - own.0.e;
                    sum_dx += full.1.v;
                    dx_terms.push(full.1.v);
                    dx_own.push(own.1.e);
                    dx_shared += full.1.e - own.1.e;
                }
                Row {
                    valid: true,
                    target: raw.target,
                    lse_s,
                    lse_t,
                    lse_raw: Tracked::new(raw.lse, raw.lse_error),
                    sum_dx: Tracked::new(
                        sum_dx,
                        dx_own.independent()
                            + dx_shared
                            + dx_terms.accumulation()
                            + U32 * sum_dx.abs(),
                    ),
                    soft: Tracked::new(
                        soft,
                        soft_own.independent()
                            + soft_shared
                            + soft_terms.accumulation()
                            + U32 * soft.abs(),
                    ),
                    hard: Tracked::new(raw.loss, raw.loss_error),
                }
            })
            .collect::<Vec<_>>()
    })
    .concat()
}

/// The factors of the two losses' gradients: `σ·w_soft/τ` and `σ·w_hard`, from the scale
/// `σ` as the device holds it (f32, with its error) and the weights (f32 constants).
fn loss_weights(options: &DistillOptions, sigma: Tracked) -> (Tracked, Tracked) {
    let inv_t = 1.0 / options.temperature;
    let soft_factor = options.weight_soft_loss * inv_t;
    let soft = Tracked::new(
        soft_factor,
        (2.0 * U32 + inverse_temperature_error(options.temperature)) * soft_factor.abs(),
    );
    (sigma.mul(soft), sigma.scale(options.weight_hard_loss))
}

/// One element of the gradient of `w_soft·soft + w_hard·hard` with respect to the
/// student's logit `s` (`(z, δz)`, teacher's `t` at the same column), evaluated with the
/// row's shared errors (`.0`) and without them (`.1`: the element's own).
fn grad_element(
    r: &Row,
    options: &DistillOptions,
    shared_probs: bool,
    c: usize,
    (z, dz): (f64, f64),
    (zt, dzt): (f64, f64),
    (w_soft, w_hard): (Tracked, Tracked),
) -> (Tracked, Tracked) {
    let inv_t = 1.0 / options.temperature;
    let eval = |lse_s: Tracked, lse_t: Tracked, lse_raw: Tracked, sum_dx: Tracked| {
        let zc = Tracked::new(z, dz);
        let ls = log_prob(zc, inv_t, lse_s);
        let (_, dx) = divergence_element(
            ls,
            log_prob(Tracked::new(zt, dzt), inv_t, lse_t),
            options.divergence,
        );
        let soft = dx.sub(ls.exp().mul(sum_dx));
        let probs = if shared_probs {
            ls.exp()
        } else {
            zc.sub(lse_raw).exp()
        };
        let hard = if c == r.target {
            probs.shift(-1.0)
        } else {
            probs
        };
        soft.mul(w_soft).add(hard.mul(w_hard))
    };
    let full = eval(r.lse_s, r.lse_t, r.lse_raw, r.sum_dx);
    let own = eval(
        r.lse_s.exact_part(),
        r.lse_t.exact_part(),
        r.lse_raw.exact_part(),
        r.sum_dx.exact_part(),
    );
    (full, own)
}

/// The reference of a fused linear distillation: the loss, the soft and hard losses, and
/// the gradients of the student's `x`, weight and bias (for the upstream gradient `inp.g`)
/// with their bounds. `chunk` is the implementation's rows per chunk.
pub fn expected(
    options: &DistillOptions,
    dtype: DType,
    (n, h, ht, v, vt): (usize, usize, usize, usize, usize),
    inp: &DistillInputs,
    chunk: usize,
) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let student = |i: usize, c: usize| logit(&inp.student, h, dtype, i, c);
    let teacher = |i: usize, c: usize| logit(&inp.teacher, ht, dtype, i, c);
    let rows = soft_rows(options, (n, v, vt), inp.student.targets, &student, &teacher);
    let count = rows.iter().filter(|r| r.valid).count() as f64;
    let per_row = Tracked::exact(1.0).div(Tracked::exact(count.max(1.0)));
    let valid_rows = |f: &dyn Fn(&Row) -> Tracked| -> Vec<Tracked> {
        rows.iter().filter(|r| r.valid).map(f).collect()
    };
    let soft = tracked::sum(&valid_rows(&|r| r.soft)).mul(per_row);
    let hard = tracked::sum(&valid_rows(&|r| r.hard)).mul(per_row);
    let loss = soft
        .scale(options.weight_soft_loss)
        .add(hard.scale(options.weight_hard_loss));
    let scalar = |name: &'static str, t: Tracked| {
        Expected::new(name, vec![t.v], vec![t.e + U32 * t.v.abs()], 1)
    };
    let mut out = vec![
        scalar("loss", loss),
        scalar("soft_loss", soft),
        scalar("hard_loss", hard),
    ];

    let weights = loss_weights(options, per_row);
    let shared_probs = vt == v && options.temperature == 1.0;
    let element = |i: usize, c: usize, z: f64, dz: f64| -> GradElement {
        let r = &rows[i];
        if !r.valid {
            return GradElement::default();
        }
        let (full, own) =
            grad_element(r, options, shared_probs, c, (z, dz), teacher(i, c), weights);
        let grad = full.v * inp.g;
        GradElement {
            grad,
            // The element's own errors and its store to the dtype.
            independent: own.e * inp.g.abs() + u * grad.abs() + flush(dtype, grad),
            shared: (full.e - own.e) * inp.g.abs(),
        }
    };
    let chunk_of: Vec<usize> = (0..n).map(|i| i / chunk.max(1)).collect();
    let group_of: Vec<usize> = (0..n).collect();
    let grads = linear_gradients(
        &inp.student,
        dtype,
        (n, h, v),
        &RowLayout {
            chunk_of: &chunk_of,
            group_of: &group_of,
            weight_grad_in_dtype: false,
        },
        &[n],
        2.0,
        element,
    );
    out.extend(grads.into_iter().flatten());
    out
}

/// The reference of one chunk's rows ([`FusedOps::fused_distill_rows`]) from logits the
/// device holds exactly (`student: [m, V]`, `teacher: [m, V_t]`, values of the dtype): each
/// row's soft and hard loss (`[m]` f32, 0 on ignored rows) and the gradient of
/// `σ Σ (w_soft soft + w_hard hard)` with respect to the student's logits (`[m, V]`,
/// rounded to the dtype), for the f32 scale `sigma`.
pub fn rows_expected(
    options: &DistillOptions,
    dtype: DType,
    (m, v, vt): (usize, usize, usize),
    student: &[f64],
    teacher: &[f64],
    targets: &[i64],
    sigma: f32,
) -> Vec<Expected> {
    assert_eq!(student.len(), m * v, "student logits: [m, V]");
    assert_eq!(teacher.len(), m * vt, "teacher logits: [m, V_t]");
    let u = unit_roundoff(dtype);
    let student_at = |i: usize, c: usize| (student[i * v + c], 0.0);
    let teacher_at = |i: usize, c: usize| (teacher[i * vt + c], 0.0);
    let rows = soft_rows(options, (m, v, vt), targets, &student_at, &teacher_at);
    let per_row = |name: &'static str, f: &dyn Fn(&Row) -> Tracked| {
        let (values, bounds): (Vec<f64>, Vec<f64>) = rows
            .iter()
            .map(|r| {
                let t = f(r);
                (t.v, t.e)
            })
            .unzip();
        Expected::new(name, values, bounds, m)
    };
    let weights = loss_weights(options, Tracked::exact(f64::from(sigma)));
    let shared_probs = vt == v && options.temperature == 1.0;
    let (mut grad, mut grad_bounds) = (Vec::with_capacity(m * v), Vec::with_capacity(m * v));
    for (i, r) in rows.iter().enumerate() {
        for c in 0..v {
            if !r.valid {
                grad.push(0.0);
                grad_bounds.push(0.0);
                continue;
            }
            let (full, _) = grad_element(
                r,
                options,
                shared_probs,
                c,
                student_at(i, c),
                teacher_at(i, c),
                weights,
            );
            grad.push(full.v);
            // The f32 value's error, then its store to the dtype (within `u` of the f32
            // value, itself within `full.e` of the exact one).
            grad_bounds.push((1.0 + u) * full.e + u * full.v.abs() + flush(dtype, full.v));
        }
    }
    vec![
        per_row("soft_loss", &|r| r.soft),
        per_row("hard_loss", &|r| r.hard),
        Expected::new("grad_logits", grad, grad_bounds, m),
    ]
}

impl Op {
    /// Whether this is one of the fused linear distillation variants.
    pub fn is_distill(self) -> bool {
        matches!(
            self,
            Op::FusedLinearJsd
                | Op::FusedLinearForwardKl
                | Op::FusedLinearReverseKl
                | Op::FusedLinearTvd
        )
    }
}

/// The sweep (`rows` = N, `width` = the student's V).
pub(crate) fn shapes(_op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 7), (37, 100)];
    if !quick {
        shapes.extend([(65, 4097), (128, 32_000), (256, 128_256)]);
    }
    shapes
}

/// What a variant exercises.
struct Variant {
    options: DistillOptions,
    bias: bool,
    /// Extra teacher classes (its padded vocabulary).
    teacher_extra: usize,
    /// Forced rows per chunk (`None`: automatic).
    chunk: Option<usize>,
}

fn variant(op: Op, v: usize) -> Variant {
    let base = DistillOptions::default();
    match op {
        // Liger-Kernel's defaults at τ = 2, both biases, chunks of 8 rows.
        Op::FusedLinearJsd => Variant {
            options: base.with_temperature(2.0),
            bias: true,
            teacher_extra: 0,
            chunk: Some(8),
        },
        // A teacher vocabulary padded larger, other weights.
        Op::FusedLinearForwardKl => Variant {
            options: base
                .with_divergence(Divergence::ForwardKl)
                .with_weights(0.3, 0.7),
            bias: false,
            teacher_extra: 3,
            chunk: Some(5),
        },
        Op::FusedLinearReverseKl => Variant {
            options: base
                .with_divergence(Divergence::ReverseKl)
                .with_temperature(0.7),
            bias: true,
            teacher_extra: 0,
            chunk: None,
        },
        // The TVD alone, an ignore_index inside the vocabulary.
        Op::FusedLinearTvd => Variant {
            options: base
                .with_divergence(Divergence::Tvd)
                .with_weights(0.0, 1.0)
                .with_ignore_index((v / 2) as i64),
            bias: false,
            teacher_extra: 0,
            chunk: Some(8),
        },
        other => unreachable!("{other:?} is not a distillation variant"),
    }
}

struct Inputs {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    tx: Vec<f32>,
    tw: Vec<f32>,
    tb: Option<Vec<f32>>,
    targets: Vec<i64>,
    g: f32,
}

fn draw(op: Op, n: usize, v: usize, rng: &mut Rng) -> Inputs {
    let var = variant(op, v);
    let vt = v + var.teacher_extra;
    Inputs {
        x: rng.vec(n * HIDDEN, -1.0, 1.0, 0.0),
        w: rng.vec(v * HIDDEN, -0.5, 0.5, 0.0),
        b: var.bias.then(|| rng.vec(v, -0.5, 0.5, 0.0)),
        tx: rng.vec(n * TEACHER_HIDDEN, -1.0, 1.0, 0.0),
        tw: rng.vec(vt * TEACHER_HIDDEN, -0.7, 0.7, 0.0),
        tb: var.bias.then(|| rng.vec(vt, -0.5, 0.5, 0.0)),
        // Some rows ignored, never the first (a one-row case would have nothing to check).
        targets: (0..n)
            .map(|i| {
                if i > 0 && rng.uniform() < 0.1 {
                    return var.options.ignore_index;
                }
                loop {
                    let y = rng.below(v) as i64;
                    if y != var.options.ignore_index {
                        break y;
                    }
                }
            })
            .collect(),
        g: rng.vec(1, 0.5, 1.5, 0.0)[0],
    }
}

fn chunk_of(var: &Variant, n: usize, v: usize) -> usize {
    var.chunk
        .map(|c| c.min(n).max(1))
        .unwrap_or_else(|| chunk_rows(n, HIDDEN, v + var.teacher_extra))
}

/// See [`super::host_case`].
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
) -> HostCase {
    let (n, v) = (rows, width);
    let var = variant(op, v);
    let vt = v + var.teacher_extra;
    let inputs = draw(op, n, v, rng);
    let r = |x: &[f32]| host_input(x, dtype);
    let (x, w, tx, tw) = (r(&inputs.x), r(&inputs.w), r(&inputs.tx), r(&inputs.tw));
    let (b, tb) = (inputs.b.as_deref().map(r), inputs.tb.as_deref().map(r));
    let inp = DistillInputs {
        student: LinearInputs {
            x: &x,
            w: &w,
            b: b.as_deref(),
            targets: &inputs.targets,
            class_weight: None,
            g: &[],
        },
        teacher: LinearInputs {
            x: &tx,
            w: &tw,
            b: tb.as_deref(),
            targets: &inputs.targets,
            class_weight: None,
            g: &[],
        },
        g: f64::from(inputs.g),
    };
    let expected = expected(
        &var.options,
        dtype,
        (n, HIDDEN, TEACHER_HIDDEN, v, vt),
        &inp,
        chunk_of(&var, n, v),
    );
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

/// Runs a distillation variant with `N = rows`, `V = width`.
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let (n, v, h, ht) = (rows, width, HIDDEN, TEACHER_HIDDEN);
    let var = variant(op, v);
    let vt = v + var.teacher_extra;
    let inputs = draw(op, n, v, rng);
    let (x, xr) = input::<B>(inputs.x, vec![n, h], dtype, device);
    let (w, wr) = input::<B>(inputs.w, vec![v, h], dtype, device);
    let probe = (x.clone(), w.clone());
    let (tx, txr) = input::<B>(inputs.tx, vec![n, ht], dtype, device);
    let (tw, twr) = input::<B>(inputs.tw, vec![vt, ht], dtype, device);
    let b = inputs.b.map(|b| input::<B>(b, vec![v], dtype, device));
    let tb = inputs.tb.map(|b| input::<B>(b, vec![vt], dtype, device));
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let (b, br) = match b {
        Some((t, r)) => (
            Some(Tensor::<A<B>, 2>::from_inner(t).reshape([v]).require_grad()),
            Some(r),
        ),
        None => (None, None),
    };
    let (tb, tbr) = match tb {
        Some((t, r)) => (
            Some(Tensor::<A<B>, 2>::from_inner(t).reshape([vt])),
            Some(r),
        ),
        None => (None, None),
    };
    let targets =
        Tensor::<A<B>, 1, Int>::from_data(TensorData::new(inputs.targets.clone(), [n]), device);
    poison::<B>(&[n * h, v * h, v, n * vt], dtype, device);
    let (out, grads) = {
        let _chunk = var.chunk.map(override_chunk_rows);
        let out = functional::fused_linear_distill(
            x.clone(),
            w.clone(),
            b.clone(),
            Tensor::from_inner(tx),
            Tensor::from_inner(tw),
            tb,
            targets,
            var.options,
        );
        let grads = (out.loss.clone() * inputs.g).backward();
        (out, grads)
    };
    let mut actual = vec![
        ("loss", to_f64(out.loss.inner())),
        ("soft_loss", to_f64(out.soft_loss.inner())),
        ("hard_loss", to_f64(out.hard_loss.inner())),
        ("grad_x", to_f64(x.grad(&grads).expect("grad_x"))),
        ("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))),
    ];
    if let Some(b) = &b {
        actual.push(("grad_bias", to_f64(b.grad(&grads).expect("grad_bias"))));
    }
    let inp = DistillInputs {
        student: LinearInputs {
            x: &xr,
            w: &wr,
            b: br.as_deref(),
            targets: &inputs.targets,
            class_weight: None,
            g: &[],
        },
        teacher: LinearInputs {
            x: &txr,
            w: &twr,
            b: tbr.as_deref(),
            targets: &inputs.targets,
            class_weight: None,
            g: &[],
        },
        g: f64::from(inputs.g),
    };
    let expected = expected(
        &var.options,
        dtype,
        (n, h, ht, v, vt),
        &inp,
        chunk_of(&var, n, v),
    );
    compare_linear(
        actual,
        &expected,
        dtype,
        (&probe.0, &xr),
        (&probe.1, &wr),
        rng,
    )
}
