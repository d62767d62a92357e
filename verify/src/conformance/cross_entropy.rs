//! Cross entropy in the conformance suite: the naive f64 reference with its error bounds,
//! and the case runner.
//!
//! The reference works in two steps that [`super::linear_cross_entropy`] reuses: the
//! statistics of a row (its log-sum-exp and loss, [`row_stats`]), then the gradient of
//! each element ([`element`]), each with the error an f32 implementation storing the
//! gradient in the logits' dtype may make (see [`super::bounds`] for the model).

use super::bounds::{
    Expected, Terms, U32, ULP32, accumulation, exp_error, flush, ln_error, par_rows, tanh_error,
    unit_roundoff,
};
use super::{Comparison, HostCase, Op, Rng, compare_all, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction};

/// The per-row values of the reference (unit factors: the gradient of each row's own loss).
#[derive(Clone, Debug)]
pub struct CrossEntropyReference {
    /// `loss_i = ce_i + zl_i` (0 on ignored rows).
    pub loss: Vec<f64>,
    /// `zl_i = λ lse_i²` (0 on ignored rows).
    pub z_loss: Vec<f64>,
    /// `∂loss_i/∂x_i`, `[N, V]` (zero rows for ignored rows).
    pub grad: Vec<f64>,
    /// `Σ_{non-ignored} w[y_i]`, the mean's denominator of the cross-entropy part.
    pub weight_total: f64,
    /// Non-ignored rows, the mean's denominator of the z-loss part.
    pub count: f64,
}

impl CrossEntropyReference {
    /// The mean of [`CrossEntropyOptions`]: `Σ ce_i / W + Σ zl_i / n`.
    pub fn mean_loss(&self) -> f64 {
        let ce: f64 = self.loss.iter().zip(&self.z_loss).map(|(l, z)| l - z).sum();
        let zl: f64 = self.z_loss.iter().sum();
        div_or_zero(ce, self.weight_total) + div_or_zero(zl, self.count)
    }
}

fn div_or_zero(a: f64, b: f64) -> f64 {
    if b == 0.0 { 0.0 } else { a / b }
}

/// Whether row target `t` takes part (not ignored, in range).
fn valid(t: i64, v: usize, options: &CrossEntropyOptions) -> bool {
    t != options.ignore_index && t >= 0 && t < v as i64
}

/// `(Σ_{valid} w[y_i], valid rows)` over all rows.
pub(crate) fn totals(
    targets: &[i64],
    v: usize,
    weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
) -> (f64, f64) {
    targets
        .iter()
        .filter(|&&t| valid(t, v, options))
        .fold((0.0, 0.0), |(w, n), &t| {
            (w + weight.map_or(1.0, |w| w[t as usize]), n + 1.0)
        })
}

/// What multiplies each row's gradient: `ce` its cross-entropy part, `z` its z-loss part.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Factors {
    pub ce: f64,
    pub z: f64,
}

/// The factors of row `i` for the reduction and the upstream gradient `g` (one value, or
/// one per row under `Reduction::None`): a mean divides the cross-entropy part by
/// `Σ w[y]` and the z-loss part by the number of non-ignored rows (Liger-Kernel's rule).
pub(crate) fn factors(
    options: &CrossEntropyOptions,
    g: &[f64],
    (weight_total, count): (f64, f64),
    i: usize,
) -> Factors {
    match options.reduction {
        Reduction::None => Factors { ce: g[i], z: g[i] },
        Reduction::Sum => Factors { ce: g[0], z: g[0] },
        Reduction::Mean => Factors {
            ce: div_or_zero(g[0], weight_total),
            z: div_or_zero(g[0], count),
        },
    }
}

/// Relative error of the f32 factors the implementations use in place of [`factors`]'
/// exact ones, shared by every gradient element: a mean's `1/Σw[y]` is the reciprocal of
/// an f32 sum over the non-ignored rows (of class weights when `weighted`; a count
/// otherwise, exact in f32), and the backward's `r = g·s` one product more; a sum or no
/// reduction takes the upstream gradient as it is.
pub(crate) fn factor_error(
    options: &CrossEntropyOptions,
    (weight_total, count): (f64, f64),
    weighted: bool,
) -> f64 {
    match options.reduction {
        Reduction::None | Reduction::Sum => 0.0,
        Reduction::Mean if weighted => {
            accumulation(count as usize, weight_total.abs()) / weight_total.abs().max(1e-300)
                + 2.5 * ULP32
                + U32
        }
        Reduction::Mean => 2.5 * ULP32 + U32,
    }
}

/// A row's statistics and their f32 errors.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowStats {
    pub valid: bool,
    pub target: usize,
    pub lse: f64,
    /// Absolute error of `lse`: the f32 normalizer (accumulation, `exp` of every term and
    /// of the online rescaling by the row's range), `ln`, one operation, and the logits'
    /// own uncertainty `min(Σ p δz, λ‖p δz‖₂)`.
    pub lse_error: f64,
    pub loss: f64,
    pub z_loss: f64,
    /// Error of the f32 loss of the row (see [`row_stats`]).
    pub loss_error: f64,
    pub z_loss_error: f64,
    /// `Σ_c w_c` (V without weights).
    pub weight_sum: f64,
    /// Error of `Σ_c w_c` accumulated in f32 (exact without weights).
    pub weight_sum_error: f64,
}

/// `(z, chain = dz/dx, error of z, error of the chain)` of logit `x` (absolute error
/// `dx` as the device holds it): soft-capped `c·tanh(x/c)` with `tanh`'s f32 error
/// ([`tanh_error`]) and one operation, or `x` itself.
fn capped(x: f64, dx: f64, options: &CrossEntropyOptions) -> (f64, f64, f64, f64) {
    match options.softcap {
        Some(c) => {
            let t = (x / c).tanh();
            let chain = 1.0 - t * t;
            let dt = tanh_error(x / c) + chain * dx / c;
            (
                c * t,
                chain,
                c * dt + U32 * (c * t).abs(),
                2.0 * t.abs() * dt + 2.0 * U32,
            )
        }
        None => (x, 1.0, dx, 0.0),
    }
}

/// The statistics of one row of logits `x` (`dx`: their absolute uncertainty, zero when
/// the reference has the device's own logits).
///
/// The loss `(1−ε)w_y(lse − z_y) + (ε/V)(lse Σw − Σ w_c z_c) + λ lse²` is off by the
/// errors of `lse` and `z` through it, the f32 accumulation of `Σ w_c z_c`, and six f32
/// operations on the magnitude of its terms.
pub(crate) fn row_stats(
    x: &[f64],
    dx: Option<&[f64]>,
    target: i64,
    weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
) -> RowStats {
    let v = x.len();
    let w = |c: usize| weight.map_or(1.0, |w| w[c]);
    let weight_sum: f64 = (0..v).map(w).sum();
    let weight_sum_error =
        weight.map_or(0.0, |ws| accumulation(v, ws.iter().map(|c| c.abs()).sum()));
    if !valid(target, v, options) {
        return RowStats {
            weight_sum,
            weight_sum_error,
            ..RowStats::default()
        };
    }
    let y = target as usize;
    let eps = options.label_smoothing;
    let lambda = options.lse_square_scale;
    let dx_at = |c: usize| dx.map_or(0.0, |d| d[c]);
    let caps: Vec<(f64, f64, f64, f64)> = (0..v).map(|c| capped(x[c], dx_at(c), options)).collect();
    let m = caps.iter().map(|c| c.0).fold(f64::NEG_INFINITY, f64::max);
    let lo = caps.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
    let sum: f64 = caps.iter().map(|c| (c.0 - m).exp()).sum();
    let lse = m + sum.ln();
    let mut uncertain = Terms::default();
    for c in caps.iter() {
        uncertain.push((c.0 - lse).exp() * c.2);
    }
    let lse_error = accumulation(v, sum) / sum
        + 2.0 * exp_error(m - lo)
        + 2.0 * U32
        + ln_error(sum)
        + U32 * lse.abs()
        + uncertain.independent();
    let z: Vec<f64> = caps.iter().map(|c| c.0).collect();
    let smooth: f64 = (0..v).map(|c| w(c) * (lse - z[c])).sum();
    let ce = (1.0 - eps) * w(y) * (lse - z[y]) + eps / v as f64 * smooth;
    let zl = lambda * lse * lse;
    let wz_l1: f64 = (0..v).map(|c| (w(c) * z[c]).abs()).sum();
    let wdz: f64 = (0..v).map(|c| w(c).abs() * caps[c].2).sum();
    let magnitude = (1.0 - eps) * w(y).abs() * (lse.abs() + z[y].abs())
        + eps / v as f64 * (lse.abs() * weight_sum + wz_l1)
        + lambda * lse * lse;
    let z_loss_error = 2.0 * lambda * lse.abs() * lse_error + 2.0 * U32 * lambda * lse * lse;
    let loss_error = (1.0 - eps) * w(y).abs() * (lse_error + caps[y].2)
        + eps / v as f64 * (weight_sum * lse_error + wdz + accumulation(v, wz_l1))
        + z_loss_error
        + 6.0 * U32 * magnitude;
    RowStats {
        valid: true,
        target: y,
        lse,
        lse_error,
        loss: ce + zl,
        z_loss: zl,
        loss_error,
        z_loss_error,
        weight_sum,
        weight_sum_error,
    }
}

/// The gradient of one element of a row, `f_ce·∂ce/∂x_c + f_z·∂zl/∂x_c`, with its error
/// bound split into what is independent from element to element (`independent`) and the
/// coefficient of the row's `lse` error shared by every element (`per_lse`: the error is
/// `per_lse · stats.lse_error`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Element {
    pub grad: f64,
    pub independent: f64,
    pub per_lse: f64,
}

/// See [`Element`]. Both implementations (the kernel and the stock composition) compute
/// `chain · (p·coef − b·w_c − a·δ_cy)` in f32 with `p = e^(z − lse)`, `a = (1−ε)·w_y·f_ce`,
/// `b = (ε/V)·f_ce`, `coef = a + b·Σw + 2λ·lse·f_z`, from f32 factors `f` (their own error
/// is [`factor_error`]'s, left to the caller).
///
/// - `p` is off relatively by `exp`'s error, one operation on `|z − lse|`, the logit's own
///   error, and (shared by the row) `lse`'s.
/// - `a`: `ε` stored in f32, `1 − ε` and two products (4 operations); `b`: `ε` stored,
///   `ε/V` and the product (3); `b·Σw`: `b`'s, `Σw`'s f32 accumulation over the classes
///   (exact without weights) and the product; `2λ·lse·f_z`: `λ` stored and three products;
///   `coef`: two sums on its terms' magnitudes; `p·coef`: one product.
/// - `b·w_c` and `a·δ`: their factor's operations and one product; the two differences:
///   one operation each on the magnitude of the three terms.
/// - the chain: its error on the unchained gradient and one product.
/// - `stores` stores in the dtype (`u|g|` and a flush each) and, for each after the
///   first, the backward's rescaling by `r/s` (a division and a product).
#[allow(clippy::too_many_arguments)]
pub(crate) fn element(
    stats: &RowStats,
    c: usize,
    x: f64,
    dx: f64,
    weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
    f: Factors,
    dtype: DType,
    stores: f64,
) -> Element {
    if !stats.valid {
        return Element::default();
    }
    let v = stats.weight_sum;
    let vocab = weight.map_or(v, |w| w.len() as f64);
    let w = |c: usize| weight.map_or(1.0, |w| w[c]);
    let eps = options.label_smoothing;
    let lambda = options.lse_square_scale;
    let (z, chain, dz, dchain) = capped(x, dx, options);
    let p = (z - stats.lse).exp();
    let delta = if c == stats.target { 1.0 } else { 0.0 };
    let a = (1.0 - eps) * w(stats.target) * f.ce;
    let b = eps / vocab * f.ce;
    let coef = a + b * v + 2.0 * lambda * stats.lse * f.z;
    let unchained = p * coef - b * w(c) - a * delta;
    let grad = chain * unchained;
    let u = unit_roundoff(dtype);
    let p_rel = exp_error(z - stats.lse) + U32 * (z - stats.lse).abs() + dz;
    let (a_abs, bw_abs) = (a.abs(), b.abs() * v.abs());
    let lse_term = (2.0 * lambda * stats.lse * f.z).abs();
    let weight_sum_error = stats.weight_sum_error / v.abs().max(1e-300);
    let coef_error = 4.0 * U32 * a_abs
        + (4.0 * U32 + weight_sum_error) * bw_abs
        + 4.0 * U32 * lse_term
        + 2.0 * U32 * (a_abs + bw_abs + lse_term);
    let side = b.abs() * w(c).abs() + a_abs * delta;
    let unchained_error = p * coef.abs() * (p_rel + U32)
        + p * coef_error
        + 4.0 * U32 * side
        + 2.0 * U32 * (p * coef.abs() + side);
    let chain_product = if options.softcap.is_some() {
        U32 * grad.abs()
    } else {
        0.0
    };
    let independent = chain * unchained_error
        + unchained.abs() * dchain
        + chain_product
        + stores * (u * grad.abs() + flush(dtype, grad))
        + (stores - 1.0).max(0.0) * (2.5 * ULP32 + U32) * grad.abs();
    let per_lse = chain * p * (coef.abs() + 2.0 * lambda * f.z.abs());
    Element {
        grad,
        independent,
        per_lse,
    }
}

/// Naive f64 cross entropy, straight from the definitions on [`CrossEntropyOptions`]:
/// rows of `x: [N, V]`, `targets: [N]`, optional `weight: [V]`; the gradient is each
/// row's own (`∂loss_i/∂x_i`).
pub fn reference(
    x: &[f64],
    v: usize,
    targets: &[i64],
    weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
) -> CrossEntropyReference {
    let n = targets.len();
    let (weight_total, count) = totals(targets, v, weight, options);
    let mut loss = vec![[0.0; 2]; n];
    let mut grad = vec![0.0; n * v];
    let stats: Vec<RowStats> = super::bounds::par_ranges(n, |range| {
        range
            .map(|i| row_stats(&x[i * v..(i + 1) * v], None, targets[i], weight, options))
            .collect::<Vec<_>>()
    })
    .concat();
    for (l, s) in loss.iter_mut().zip(&stats) {
        *l = [s.loss, s.z_loss];
    }
    let unit = Factors { ce: 1.0, z: 1.0 };
    par_rows(&mut grad, v, |i, row| {
        for (c, g) in row.iter_mut().enumerate() {
            *g = element(
                &stats[i],
                c,
                x[i * v + c],
                0.0,
                weight,
                options,
                unit,
                DType::F64,
                1.0,
            )
            .grad;
        }
    });
    CrossEntropyReference {
        loss: loss.iter().map(|l| l[0]).collect(),
        z_loss: loss.iter().map(|l| l[1]).collect(),
        grad,
        weight_total,
        count,
    }
}

/// A reduced loss (or z-loss) over the first `live` rows, stored in f32: per-row values
/// `values`, their errors `errors`, the row factors `scale(i)` (and the largest factor's
/// relative error, `scale_error`).
///
/// Bound: the rows' errors times their factor (independent over rows), the f32
/// accumulation of the scaled values, the factor's relative error on the result, and
/// three operations and the store on the result.
fn reduced(
    values: &[f64],
    errors: &[f64],
    scale: impl Fn(usize) -> f64,
    scale_error: f64,
    live: usize,
) -> (f64, f64) {
    let mut total = 0.0;
    let mut terms = Terms::default();
    let mut row_errors = Terms::default();
    for i in 0..live.min(values.len()) {
        let s = scale(i);
        total += values[i] * s;
        terms.push(values[i] * s);
        row_errors.push(errors[i] * s.abs());
    }
    let bound =
        row_errors.independent() + terms.accumulation() + (scale_error + 4.0 * U32) * terms.l1;
    (total, bound)
}

/// The loss (and z-loss) tensors of a reduction from the row statistics, over the first
/// `live` rows. A mean's denominators `1/Σw[y]` and `1/n` are f32 values computed from an
/// f32 sum of the weights (its accumulation and the division) or an exact count.
pub(crate) fn loss_tensors(
    stats: &[RowStats],
    options: &CrossEntropyOptions,
    (weight_total, count): (f64, f64),
    live: usize,
) -> Vec<Expected> {
    let n = stats.len();
    let ce: Vec<f64> = stats.iter().map(|s| s.loss - s.z_loss).collect();
    let ce_err: Vec<f64> = stats.iter().map(|s| s.loss_error).collect();
    let zl: Vec<f64> = stats.iter().map(|s| s.z_loss).collect();
    let zl_err: Vec<f64> = stats.iter().map(|s| s.z_loss_error).collect();
    let mut out = Vec::new();
    let mut push = |name: &'static str, values: &[f64], errors: &[f64], with_ce: bool| {
        match options.reduction {
            Reduction::None => {
                let (values, bounds) = (0..n)
                    .map(|i| {
                        let e = if i < live { values[i] } else { 0.0 };
                        (e, errors[i] + U32 * e.abs())
                    })
                    .unzip();
                out.push(Expected::new(name, values, bounds, n));
            }
            Reduction::Sum => {
                let (e, b) = reduced(values, errors, |_| 1.0, 0.0, live);
                out.push(Expected::new(name, vec![e], vec![b + U32 * e.abs()], 1));
            }
            Reduction::Mean => {
                let w_error = accumulation(n, weight_total.abs()) / weight_total.max(1e-300)
                    + 2.5 * ULP32
                    + U32;
                let inv = |t: f64| div_or_zero(1.0, t);
                let (ce_v, ce_b) = if with_ce {
                    reduced(&ce, &ce_err, |_| inv(weight_total), w_error, live)
                } else {
                    (0.0, 0.0)
                };
                let (zl_v, zl_b) = reduced(&zl, &zl_err, |_| inv(count), 2.5 * ULP32 + U32, live);
                let e = ce_v + zl_v;
                // The z-loss part may be formed as `Σloss/W + Σzl·(1/n − 1/W)`.
                let zl_l1: f64 = zl.iter().take(live).map(|v| v.abs()).sum();
                let regroup =
                    (accumulation(n, zl_l1) + 4.0 * U32 * zl_l1) * (inv(weight_total) + inv(count));
                let bound = if with_ce { ce_b + zl_b + regroup } else { zl_b };
                out.push(Expected::new(name, vec![e], vec![bound + U32 * e.abs()], 1));
            }
        }
    };
    let loss_rows: Vec<f64> = stats.iter().map(|s| s.loss).collect();
    match options.reduction {
        Reduction::Mean => push("loss", &ce, &ce_err, true),
        _ => push("loss", &loss_rows, &ce_err, true),
    }
    if options.return_z_loss {
        push("z_loss", &zl, &zl_err, false);
    }
    out
}

impl Op {
    /// Whether this is one of the cross-entropy variants.
    pub fn is_cross_entropy(self) -> bool {
        matches!(
            self,
            Op::CrossEntropy
                | Op::CrossEntropySmoothWeighted
                | Op::CrossEntropyZLossSoftcap
                | Op::CrossEntropyNone
                | Op::CrossEntropySum
        )
    }
}

/// The cross-entropy shape sweep (`width` is the vocabulary size V).
///
/// The plain variant walks every geometry: V = 1, a few classes, register-cached rows
/// (V = 1000), rows read twice (V = 4097, 32000) and more rows than the launch has cubes
/// (grid-strided). The option variants, whose code paths do not depend on the geometry
/// beyond cached or not, take a shorter quick list.
pub(crate) fn shapes(op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = if op == Op::CrossEntropy {
        vec![(5, 1), (3, 7), (6, 1000), (4, 4097), (2, 32_000), (300, 64)]
    } else {
        vec![(5, 1), (3, 7), (37, 100), (4, 4097), (300, 64)]
    };
    if op == Op::CrossEntropy || !quick {
        // More rows than the launch caps cubes at, so rows are grid-strided.
        shapes.push((70_000, 2));
    }
    if !quick {
        shapes.extend([
            (2, 32_000),
            (16, 50_257),
            (8, 128_256),
            (4, 151_936),
            (4, 262_144),
            (65_536, 32),
            (512, 4096),
        ]);
        shapes.sort();
        shapes.dedup();
    }
    shapes
}

/// What a variant exercises.
struct Variant {
    options: CrossEntropyOptions,
    weighted: bool,
    /// Fraction of rows whose target is `ignore_index`.
    ignored: f64,
    /// Logits are uniform in `[-range, range]`.
    range: f64,
}

fn variant(op: Op, v: usize) -> Variant {
    let base = CrossEntropyOptions::default();
    match op {
        Op::CrossEntropy => Variant {
            options: base,
            weighted: false,
            ignored: 0.1,
            range: 4.0,
        },
        Op::CrossEntropySmoothWeighted => Variant {
            options: base.with_label_smoothing(0.1),
            weighted: true,
            ignored: 0.1,
            range: 4.0,
        },
        // Class weights, a mean and a z-loss together: the z-loss divided by the
        // non-ignored rows, the rest by their weights.
        Op::CrossEntropyZLossSoftcap => Variant {
            options: base
                .with_lse_square_scale(1e-2)
                .with_softcap(Some(7.5))
                .with_return_z_loss(true),
            weighted: true,
            ignored: 0.1,
            range: 15.0,
        },
        Op::CrossEntropyNone => Variant {
            options: base
                .with_reduction(Reduction::None)
                .with_label_smoothing(0.05)
                .with_lse_square_scale(1e-3)
                .with_return_z_loss(true),
            weighted: true,
            ignored: 0.1,
            range: 4.0,
        },
        // A custom ignore_index inside the vocabulary (every row when V = 1).
        Op::CrossEntropySum => Variant {
            options: base
                .with_reduction(Reduction::Sum)
                .with_ignore_index((v / 2) as i64),
            weighted: false,
            ignored: 0.2,
            range: 4.0,
        },
        other => unreachable!("{other:?} is not a cross-entropy variant"),
    }
}

/// The inputs of a case, as drawn.
struct Inputs {
    x: Vec<f32>,
    targets: Vec<i64>,
    weight: Option<Vec<f32>>,
    /// Upstream gradient: one value (mean, sum) or one per row (none).
    g: Vec<f32>,
}

fn draw(op: Op, rows: usize, v: usize, rng: &mut Rng) -> Inputs {
    let var = variant(op, v);
    let x = rng.vec(rows * v, -var.range, var.range, 0.0);
    let targets = (0..rows)
        .map(|_| {
            if rng.uniform() < var.ignored {
                var.options.ignore_index
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let weight = var.weighted.then(|| rng.vec(v, 0.5, 2.0, 0.0));
    // Random upstream gradient: a scalar away from 1 for mean/sum, one per row for none,
    // where every third row gets exactly 1 (the scale the forward applied): the backward
    // leaves those rows as they are and rescales the others.
    let per_row = var.options.reduction == Reduction::None;
    let mut g = rng.vec(if per_row { rows } else { 1 }, 0.5, 1.5, 0.0);
    if per_row {
        g.iter_mut().step_by(3).for_each(|gi| *gi = 1.0);
    }
    Inputs {
        x,
        targets,
        weight,
        g,
    }
}

/// The expected `loss`, `z_loss` (when the options return it) and `grad_logits` of a cross
/// entropy with these options, with their bounds, from logits `x: [N, V]` the device holds
/// exactly (values of `dtype`), `targets: [N]`, class weights `[V]` as the device holds
/// them, and the upstream gradient `g` (one value; one per row under `Reduction::None`),
/// over the first `live` rows (later rows: zero gradient, left out of the reduction).
#[allow(clippy::too_many_arguments)]
pub fn expected_with_options(
    options: &CrossEntropyOptions,
    dtype: DType,
    v: usize,
    x: &[f64],
    targets: &[i64],
    weight: Option<&[f64]>,
    g: &[f64],
    live: usize,
) -> Vec<Expected> {
    let options = *options;
    let rows = targets.len();
    let tot = totals(targets, v, weight, &options);
    let stats: Vec<RowStats> = super::bounds::par_ranges(rows, |range| {
        range
            .map(|i| row_stats(&x[i * v..(i + 1) * v], None, targets[i], weight, &options))
            .collect::<Vec<_>>()
    })
    .concat();
    let mut out = loss_tensors(&stats, &options, tot, live);
    // The forward stores the gradient once; the backward rescales a row (a second
    // store) unless its upstream gradient equals the forward's scale exactly.
    let stores = |i: usize| -> f64 {
        let unit = match options.reduction {
            Reduction::None => g[i] == 1.0,
            _ => false,
        };
        if unit { 1.0 } else { 2.0 }
    };
    let scale_error = factor_error(&options, tot, weight.is_some());
    let mut grad = vec![[0.0; 2]; rows * v];
    par_rows(&mut grad, v, |i, row| {
        if i >= live {
            return;
        }
        let f = factors(&options, g, tot, i);
        for (c, out) in row.iter_mut().enumerate() {
            let e = element(
                &stats[i],
                c,
                x[i * v + c],
                0.0,
                weight,
                &options,
                f,
                dtype,
                stores(i),
            );
            *out = [
                e.grad,
                e.independent + e.per_lse * stats[i].lse_error + scale_error * e.grad.abs(),
            ];
        }
    });
    out.push(Expected::new(
        "grad_logits",
        grad.iter().map(|v| v[0]).collect(),
        grad.iter().map(|v| v[1]).collect(),
        rows,
    ));
    out
}

/// See [`super::host_case`].
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
    live: usize,
) -> HostCase {
    let inputs = draw(op, rows, width, rng);
    let x = host_input(&inputs.x, dtype);
    let weight: Option<Vec<f64>> = inputs
        .weight
        .as_ref()
        .map(|w| w.iter().map(|&c| f64::from(c)).collect());
    let g: Vec<f64> = inputs.g.iter().map(|&c| f64::from(c)).collect();
    let build = |live: usize| {
        expected_with_options(
            &variant(op, width).options,
            dtype,
            width,
            &x,
            &inputs.targets,
            weight.as_deref(),
            &g,
            live,
        )
    };
    HostCase {
        expected: build(rows),
        without_last_rows: build(live),
    }
}

/// Runs a cross-entropy variant at `[rows, V = width]`: loss, z-loss and the logits
/// gradient (random upstream gradient) against [`expected`].
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let v = width;
    let n = rows * v;
    let options = variant(op, v).options;
    let inputs = draw(op, rows, v, rng);
    let (x, xr) = input::<B>(inputs.x, vec![rows, v], dtype, device);
    let t =
        Tensor::<A<B>, 1, Int>::from_data(TensorData::new(inputs.targets.clone(), [rows]), device);
    let weight_r: Option<Vec<f64>> = inputs
        .weight
        .as_ref()
        .map(|w| w.iter().map(|&c| f64::from(c)).collect());
    let w = inputs
        .weight
        .map(|w| Tensor::<A<B>, 1>::from_data(TensorData::new(w, [v]), device));
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let g_r: Vec<f64> = inputs.g.iter().map(|&c| f64::from(c)).collect();
    let g_t =
        Tensor::<A<B>, 1>::from_data(TensorData::new(inputs.g.clone(), [inputs.g.len()]), device);
    poison::<B>(&[n], dtype, device);
    poison::<B>(&[rows, rows], DType::F32, device);
    // Most variants get logits computed from `x` (as a model's are), which the loss then
    // owns alone: the fused kernels write the gradient over them. The others get the leaf
    // itself, which the test holds: the gradient goes to a new buffer.
    let in_place = !matches!(op, Op::CrossEntropyZLossSoftcap | Op::CrossEntropySum);
    let logits = if in_place { x.clone() * 1.0 } else { x.clone() };
    let out = functional::cross_entropy(logits, t, w, options);
    let grads = (out.loss.clone() * g_t).sum().backward();
    let mut actual = vec![
        ("loss", to_f64(out.loss.inner())),
        (
            "grad_logits",
            to_f64(x.grad(&grads).expect("logits gradient")),
        ),
    ];
    if let Some(z) = out.z_loss {
        actual.push(("z_loss", to_f64(z.inner())));
    }
    let expected = expected_with_options(
        &options,
        dtype,
        v,
        &xr,
        &inputs.targets,
        weight_r.as_deref(),
        &g_r,
        rows,
    );
    compare_all(actual, &expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gradient is the derivative of the loss: central differences of the f64 loss
    /// (weights, smoothing, z-loss and softcap together) match [`reference`]'s gradient.
    #[test]
    fn reference_gradient_is_the_derivative_of_its_loss() {
        let mut rng = Rng::new(3);
        let (n, v) = (3, 11);
        let x: Vec<f64> = (0..n * v).map(|_| 6.0 * rng.uniform() - 3.0).collect();
        let weight: Vec<f64> = (0..v).map(|_| 0.5 + rng.uniform()).collect();
        let targets = [2i64, -100, 7];
        let options = CrossEntropyOptions::default()
            .with_label_smoothing(0.1)
            .with_lse_square_scale(0.01)
            .with_softcap(Some(4.0));
        let r = reference(&x, v, &targets, Some(&weight), &options);
        let h = 1e-6;
        for k in 0..n * v {
            let mut xp = x.clone();
            xp[k] += h;
            let mut xm = x.clone();
            xm[k] -= h;
            let i = k / v;
            let lp = reference(&xp, v, &targets, Some(&weight), &options).loss[i];
            let lm = reference(&xm, v, &targets, Some(&weight), &options).loss[i];
            let numeric = (lp - lm) / (2.0 * h);
            assert!(
                (numeric - r.grad[k]).abs() < 1e-6,
                "element {k}: {numeric} vs {}",
                r.grad[k]
            );
        }
    }

    /// The stock composition's logits gradient for label smoothing and class weights
    /// under a mean (`compose::cross_entropy`, then the backward's `r/s` rescaling),
    /// emulated operation by operation in f32 with sequential sums, is within the bound
    /// of [`expected_with_options`] at every element, over many draws: the bound counts every
    /// operation the implementations make.
    #[test]
    fn bound_covers_an_f32_emulation_of_the_stock_composition() {
        let op = Op::CrossEntropySmoothWeighted;
        let (rows, v) = (300, 64);
        let options = variant(op, v).options;
        let eps = options.label_smoothing as f32;
        let mut worst = 0.0f64;
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let inp = draw(op, rows, v, &mut rng);
            let w = inp.weight.as_ref().expect("weighted variant");
            let live = |t: i64| valid(t, v, &options);
            let total = inp
                .targets
                .iter()
                .filter(|&&t| live(t))
                .fold(0.0f32, |acc, &t| acc + w[t as usize]);
            let s = 1.0f32 / total;
            let sum_w = w.iter().fold(0.0f32, |acc, &c| acc + c);
            let factor = (inp.g[0] * s) / s;
            let mut grad = vec![0.0f64; rows * v];
            for i in 0..rows {
                let t = inp.targets[i];
                if !live(t) {
                    continue;
                }
                let z = &inp.x[i * v..(i + 1) * v];
                let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum_exp = z.iter().fold(0.0f32, |acc, &c| acc + (c - max).exp());
                let lse = max + sum_exp.ln();
                let a = w[t as usize] * s * (1.0 - eps);
                let b = s * ((eps as f64 / v as f64) as f32);
                let coef = a + b * sum_w;
                for c in 0..v {
                    let mut g = (z[c] - lse).exp() * coef - w[c] * b;
                    if c as i64 == t {
                        g -= a;
                    }
                    grad[i * v + c] = f64::from(g * factor);
                }
            }
            let x: Vec<f64> = inp.x.iter().map(|&c| f64::from(c)).collect();
            let weight: Vec<f64> = w.iter().map(|&c| f64::from(c)).collect();
            let g: Vec<f64> = inp.g.iter().map(|&c| f64::from(c)).collect();
            let expected = expected_with_options(
                &options,
                DType::F32,
                v,
                &x,
                &inp.targets,
                Some(&weight),
                &g,
                rows,
            );
            let e = crate::conformance::bounds::named(&expected, "grad_logits");
            for (k, &actual) in grad.iter().enumerate() {
                let used = (actual - e.values[k]).abs() / e.bounds[k].max(f64::MIN_POSITIVE);
                assert!(
                    used <= 1.0,
                    "seed {seed}, element {k}: {actual} against {} ± {}",
                    e.values[k],
                    e.bounds[k]
                );
                worst = worst.max(used);
            }
        }
        // The emulation comes near the bound: it is not loose by orders of magnitude.
        assert!(worst > 0.05, "largest error {worst} of the bound");
    }

    /// A mean with class weights divides the cross-entropy part by `Σ w[y]` and the
    /// z-loss by the number of non-ignored rows (Liger-Kernel's `cross_entropy.py`).
    #[test]
    fn weighted_mean_divides_the_z_loss_by_the_row_count() {
        let x = [1.0, 2.0, 0.5, -1.0, 0.0, 3.0];
        let weight = [0.5, 2.0, 1.0];
        let targets = [1i64, 2];
        let options = CrossEntropyOptions::default().with_lse_square_scale(0.1);
        let r = reference(&x, 3, &targets, Some(&weight), &options);
        assert_eq!((r.weight_total, r.count), (3.0, 2.0));
        let ce: f64 = r.loss.iter().zip(&r.z_loss).map(|(l, z)| l - z).sum();
        let zl: f64 = r.z_loss.iter().sum();
        assert!((r.mean_loss() - (ce / 3.0 + zl / 2.0)).abs() < 1e-15);
        let f = factors(&options, &[1.0], (3.0, 2.0), 0);
        assert_eq!(
            f,
            Factors {
                ce: 1.0 / 3.0,
                z: 0.5
            }
        );
    }
}
