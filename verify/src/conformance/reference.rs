//! Naive f64 references of the normalizations and softmaxes, written independently of the
//! kernels and of Burn: plain loops over row-major `[rows, d]` slices, parallel over rows.
//! Each returns every output and gradient as an [`Expected`], with the error bound of
//! each element derived from the rounding model of [`super::bounds`].
//!
//! Gradients are those of `L = Σ g ⊙ y` for the upstream gradient `g`. `live` rows take
//! part in the reductions over rows (weight and bias gradients): all of them for the
//! reference itself, fewer to build a result that misses the last rows (the wrong-output
//! tests).

use super::bounds::{
    Expected, Terms, U32, ULP32, accumulation, exp_error, flush, ln_error, par_ranges, par_rows,
    unit_roundoff,
};
use burn::tensor::DType;

/// Relative error of `rstd = 1/√(Σv²/d + eps)` computed in f32 from `sumsq = Σv²`: the
/// squares (1 ulp each) and their accumulation, the division by `d` and the `+ eps`, then
/// half of it through the square root, plus the reciprocal square root itself (Vulkan's
/// `inversesqrt`: 2 ulp; a square root then a division: 2.5 + 1 ulp).
fn rstd_error(sumsq: f64, d: usize) -> f64 {
    let mean_square = if sumsq > 0.0 {
        accumulation(d, sumsq) / sumsq + 3.0 * U32
    } else {
        3.0 * U32
    };
    0.5 * mean_square + 3.5 * ULP32
}

/// One row's `[d]` slice of a row-major buffer.
fn row(v: &[f64], i: usize, d: usize) -> &[f64] {
    &v[i * d..(i + 1) * d]
}

/// The per-feature reductions of a norm's backward over `live` rows: `Σ_rows term`,
/// the magnitudes of the terms (their f32 accumulation) and of their rounding errors.
#[derive(Clone)]
struct FeatureSums {
    value: Vec<f64>,
    terms: Vec<Terms>,
    errors: Vec<Terms>,
}

impl FeatureSums {
    fn new(d: usize) -> Self {
        FeatureSums {
            value: vec![0.0; d],
            terms: vec![Terms::default(); d],
            errors: vec![Terms::default(); d],
        }
    }

    fn add(&mut self, j: usize, term: f64, error: f64) {
        self.value[j] += term;
        self.terms[j].push(term);
        self.errors[j].push(error);
    }

    fn merge(parts: Vec<FeatureSums>, d: usize) -> Self {
        let mut out = FeatureSums::new(d);
        for p in parts {
            for j in 0..d {
                out.value[j] += p.value[j];
                out.terms[j].merge(&p.terms[j]);
                out.errors[j].merge(&p.errors[j]);
            }
        }
        out
    }

    /// The reduced tensor stored in `dtype`: the store (`u·|e|` plus a flush), the
    /// independent per-term errors, the f32 accumulation, and `systematic · |e|` for an
    /// error common to every term (in relative terms).
    fn expected(self, name: &'static str, dtype: DType, systematic: f64) -> Expected {
        let u = unit_roundoff(dtype);
        let bounds = self
            .value
            .iter()
            .zip(&self.terms)
            .zip(&self.errors)
            .map(|((e, t), a)| {
                (u + systematic) * e.abs() + a.independent() + t.accumulation() + flush(dtype, *e)
            })
            .collect();
        Expected::new(name, self.value, bounds, 1)
    }
}

/// RMSNorm: `y = x·rstd·(offset + w)`, `rstd = (mean(x²) + eps)^(-1/2)`, and its
/// gradients; `llama` casting rounds `x̂ = x·rstd` to the dtype before the weight multiply
/// (Gemma casting computes everything in f32 and rounds once).
///
/// Bounds (`u` the dtype's unit roundoff, `r` the relative error of `rstd`, [`rstd_error`]):
/// - `y`: the store `u|y|`, Llama's rounding of `x̂` (`u·|x̂|·|offset + w|`), `r` and three
///   f32 operations on `|x̂|(|offset| + |w|)`, and a flush of `y` (and Llama's `x̂`).
/// - `dx = rstd·(m − x̂·c)` with `m = g·(offset + w)`, `c = mean(m·x̂)`: the store, `2r`
///   and five f32 operations on `rstd(|m| + |x̂ c|)`, and `rstd·|x̂|` times the error of `c`
///   (its f32 accumulation and the `r` of its terms).
/// - `dw = Σ_rows g·x̂`: the store, each term off by `(u + r + 2·2⁻²⁴)|g x̂|` (`u` where the
///   kernel multiplies by `x̂` rounded to the dtype, Llama casting), independently over
///   rows (√N-style), plus `r|dw|` for any error of `rstd` common to every row, and the
///   f32 accumulation over the rows.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    dtype: DType,
    x: &[f64],
    w: &[f64],
    g: &[f64],
    d: usize,
    eps: f64,
    offset: f64,
    llama: bool,
    live: usize,
) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let rows = x.len() / d;
    let llama_u = if llama { u } else { 0.0 };
    let mut y = vec![[0.0; 4]; x.len()];
    par_rows(&mut y, d, |i, out| {
        let xr = row(x, i, d);
        let gr = row(g, i, d);
        let sumsq: f64 = xr.iter().map(|v| v * v).sum();
        let rstd = 1.0 / (sumsq / d as f64 + eps).sqrt();
        let r = rstd_error(sumsq, d);
        let scale = |j: usize| offset + w[j];
        let scale_mag = |j: usize| offset.abs() + w[j].abs();
        let xh = |j: usize| xr[j] * rstd;
        let c: f64 = (0..d).map(|j| gr[j] * scale(j) * xh(j)).sum::<f64>() / d as f64;
        let c_terms: f64 = (0..d)
            .map(|j| (gr[j] * scale_mag(j) * xh(j)).abs())
            .sum::<f64>();
        let c_error = (accumulation(d, c_terms) + (r + 3.0 * U32) * c_terms) / d as f64;
        for j in 0..d {
            let yj = xh(j) * scale(j);
            let mag = xh(j).abs() * scale_mag(j);
            let llama_flush = if llama {
                flush(dtype, xh(j)) * scale_mag(j)
            } else {
                0.0
            };
            let by =
                u * yj.abs() + (llama_u + r + 3.0 * U32) * mag + flush(dtype, yj) + llama_flush;
            let m = gr[j] * scale(j);
            let dx = rstd * (m - xh(j) * c);
            let mag_dx = rstd * (gr[j].abs() * scale_mag(j) + (xh(j) * c).abs());
            let bdx = u * dx.abs()
                + (2.0 * r + 5.0 * U32) * mag_dx
                + rstd * xh(j).abs() * c_error
                + flush(dtype, dx);
            out[j] = [yj, by, dx, bdx];
        }
    });
    let parts = par_ranges(live.min(rows), |range| {
        let mut dw = FeatureSums::new(d);
        for i in range {
            let xr = row(x, i, d);
            let sumsq: f64 = xr.iter().map(|v| v * v).sum();
            let rstd = 1.0 / (sumsq / d as f64 + eps).sqrt();
            let r = rstd_error(sumsq, d);
            for j in 0..d {
                let xh = xr[j] * rstd;
                let t = g[i * d + j] * xh;
                let llama_flush = if llama {
                    flush(dtype, xh) * g[i * d + j].abs()
                } else {
                    0.0
                };
                dw.add(j, t, (llama_u + r + 2.0 * U32) * t.abs() + llama_flush);
            }
        }
        dw
    });
    let r_max = (0..rows)
        .map(|i| rstd_error(row(x, i, d).iter().map(|v| v * v).sum(), d))
        .fold(0.0, f64::max);
    vec![
        Expected::new(
            "output",
            y.iter().map(|v| v[0]).collect(),
            y.iter().map(|v| v[1]).collect(),
            rows,
        ),
        Expected::new(
            "grad_x",
            y.iter().map(|v| v[2]).collect(),
            y.iter().map(|v| v[3]).collect(),
            rows,
        ),
        FeatureSums::merge(parts, d).expected("grad_weight", dtype, r_max),
    ]
}

/// Residual add + RMSNorm (Llama casting): `s = x + r` stored in the dtype, `y =
/// rms_norm(s)`, and the gradients of `L = Σ g⊙y + Σ g₂⊙s`.
///
/// The sum is the exact `x + r` rounded to the dtype (computed here, never read from the
/// device): the device adds in f32 and rounds once, so it is within `u|x + r|` of the
/// exact sum, as the reference is, hence within `2u|x + r|` (plus a flush) of it. The
/// norm's reference takes that rounded sum as its input. `dx = dr = dy_norm + g₂`: the
/// norm's `dx` bound plus one more store.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    dtype: DType,
    x: &[f64],
    r: &[f64],
    w: &[f64],
    g: &[f64],
    g2: &[f64],
    d: usize,
    eps: f64,
    live: usize,
) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let rows = x.len() / d;
    let exact: Vec<f64> = x.iter().zip(r).map(|(a, b)| a + b).collect();
    let s: Vec<f64> = exact
        .iter()
        .map(|&v| super::bounds::round_to(dtype, v))
        .collect();
    let sum_bounds = exact
        .iter()
        .map(|v| 2.0 * u * v.abs() + flush(dtype, *v))
        .collect();
    let mut norm = rms_norm(dtype, &s, w, g, d, eps, 0.0, true, live);
    let grad_w = norm.pop().expect("grad_weight");
    let dx = norm.pop().expect("grad_x");
    let y = norm.pop().expect("output");
    let (grad, grad_bounds): (Vec<f64>, Vec<f64>) = dx
        .values
        .iter()
        .zip(&dx.bounds)
        .zip(g2)
        .map(|((v, b), g2)| {
            let e = v + g2;
            (e, b + u * e.abs() + flush(dtype, e))
        })
        .unzip();
    vec![
        Expected::new("sum", s, sum_bounds, rows),
        y,
        Expected::new("grad_x", grad.clone(), grad_bounds.clone(), rows),
        Expected::new("grad_residual", grad, grad_bounds, rows),
        grad_w,
    ]
}

/// One row's LayerNorm statistics and the errors of an f32 implementation.
struct LayerNormRow {
    mean: f64,
    rstd: f64,
    /// Absolute error of the mean.
    mean_error: f64,
    /// Relative error of `rstd`.
    rstd_error: f64,
}

/// Mean and variance of a row as the kernel (sums shifted by the row's first element)
/// or the composition (two passes) computes them in f32: the error bounds cover both.
///
/// - mean: the f32 accumulation of `Σ(x − x₀)` (or `Σx`) and its rounding, `2u₃₂`-relative
///   on `|mean|`.
/// - variance: the shifted form `Σ(x − x₀)²/d − (Σ(x − x₀)/d)²` cancels down to the
///   variance from `var + (mean − x₀)²`, so its error is the accumulation of the squares
///   plus twice the shifted mean's error times the shifted mean; the two-pass form errs
///   by the accumulation of `(x − mean)²` and `2|x − mean|·δmean` per term. Both are added.
fn layer_norm_row(xr: &[f64], eps: f64) -> LayerNormRow {
    let d = xr.len();
    let n = d as f64;
    let x0 = xr[0];
    let mean = xr.iter().sum::<f64>() / n;
    let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let l1: f64 = xr.iter().map(|v| v.abs() + x0.abs()).sum();
    let mean_error = (accumulation(d, l1) + 2.0 * U32 * l1) / n + 2.0 * U32 * mean.abs();
    let shifted_mean = mean - x0;
    let s2: f64 = xr.iter().map(|v| (v - x0).powi(2)).sum();
    let shifted = (accumulation(d, s2) + 3.0 * U32 * s2) / n
        + 2.0 * shifted_mean.abs() * mean_error
        + 2.0 * U32 * (shifted_mean.powi(2) + s2 / n);
    let c2: f64 = xr.iter().map(|v| (v - mean).powi(2)).sum();
    let cd: f64 = xr.iter().map(|v| (v - mean).abs()).sum();
    let two_pass =
        (accumulation(d, c2) + 3.0 * U32 * c2 + 2.0 * cd * (mean_error + U32 * cd / n)) / n;
    let var_error = (shifted + two_pass) / (var + eps);
    LayerNormRow {
        mean,
        rstd: 1.0 / (var + eps).sqrt(),
        mean_error,
        rstd_error: 0.5 * (var_error + U32) + 4.0 * U32,
    }
}

/// LayerNorm `y = x̂·γ + β`, `x̂ = (x − mean)·rstd`, and its gradients.
///
/// Bounds: `x̂` is off by `rstd(δmean + u₃₂|x − mean|) + |x̂|(r + u₃₂)` ([`layer_norm_row`]);
/// - `y`: the store, `|γ|·δx̂`, two f32 operations on `|x̂γ| + |β|`, a flush;
/// - `dx = rstd(gγ − x̂·c₁ − c₂)`, `c₁ = mean(gγx̂)`, `c₂ = mean(gγ)`: the store, `r` and
///   three f32 operations on the terms' magnitudes, `|x̂|δc₁ + δx̂|c₁| + δc₂`, a flush;
/// - `dγ = Σ_rows g·x̂`: the store, each term off by `|g|δx̂ + 2u₃₂|g x̂|` independently over
///   rows, `r|dγ|` for an error common to the rows, and the accumulation;
/// - `dβ = Σ_rows g`: the store and the accumulation (the terms are exact).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    dtype: DType,
    x: &[f64],
    gamma: &[f64],
    beta: Option<&[f64]>,
    g: &[f64],
    d: usize,
    eps: f64,
    live: usize,
) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let rows = x.len() / d;
    let n = d as f64;
    let xhat_error = |s: &LayerNormRow, v: f64| {
        let xh = (v - s.mean) * s.rstd;
        s.rstd * (s.mean_error + U32 * (v - s.mean).abs()) + xh.abs() * (s.rstd_error + U32)
    };
    let mut out = vec![[0.0; 4]; x.len()];
    par_rows(&mut out, d, |i, o| {
        let xr = row(x, i, d);
        let gr = row(g, i, d);
        let s = layer_norm_row(xr, eps);
        let xh: Vec<f64> = xr.iter().map(|v| (v - s.mean) * s.rstd).collect();
        let dxh: Vec<f64> = xr.iter().map(|&v| xhat_error(&s, v)).collect();
        let gh: Vec<f64> = (0..d).map(|j| gr[j] * gamma[j]).collect();
        let c1 = (0..d).map(|j| gh[j] * xh[j]).sum::<f64>() / n;
        let c2 = gh.iter().sum::<f64>() / n;
        let c1_terms: f64 = (0..d).map(|j| (gh[j] * xh[j]).abs()).sum();
        let gh_l1: f64 = gh.iter().map(|v| v.abs()).sum();
        let c1_error = (accumulation(d, c1_terms)
            + 2.0 * U32 * c1_terms
            + (0..d).map(|j| gh[j].abs() * dxh[j]).sum::<f64>())
            / n;
        let c2_error = (accumulation(d, gh_l1) + U32 * gh_l1) / n;
        for j in 0..d {
            let b = beta.map_or(0.0, |b| b[j]);
            let y = xh[j] * gamma[j] + b;
            let by = u * y.abs()
                + gamma[j].abs() * dxh[j]
                + 2.0 * U32 * ((xh[j] * gamma[j]).abs() + b.abs())
                + flush(dtype, y);
            let dx = s.rstd * (gh[j] - xh[j] * c1 - c2);
            let mag = s.rstd * (gh[j].abs() + (xh[j] * c1).abs() + c2.abs());
            let bdx = u * dx.abs()
                + (s.rstd_error + 3.0 * U32) * mag
                + s.rstd * (xh[j].abs() * c1_error + dxh[j] * c1.abs() + c2_error)
                + flush(dtype, dx);
            o[j] = [y, by, dx, bdx];
        }
    });
    let parts = par_ranges(live.min(rows), |range| {
        let mut dgamma = FeatureSums::new(d);
        let mut dbeta = FeatureSums::new(d);
        for i in range {
            let xr = row(x, i, d);
            let s = layer_norm_row(xr, eps);
            for j in 0..d {
                let gij = g[i * d + j];
                let xh = (xr[j] - s.mean) * s.rstd;
                let t = gij * xh;
                dgamma.add(
                    j,
                    t,
                    gij.abs() * xhat_error(&s, xr[j]) + 2.0 * U32 * t.abs(),
                );
                dbeta.add(j, gij, 0.0);
            }
        }
        (dgamma, dbeta)
    });
    let (dgamma, dbeta): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    let r_max = (0..rows)
        .map(|i| layer_norm_row(row(x, i, d), eps).rstd_error)
        .fold(0.0, f64::max);
    let mut result = vec![
        Expected::new(
            "output",
            out.iter().map(|v| v[0]).collect(),
            out.iter().map(|v| v[1]).collect(),
            rows,
        ),
        Expected::new(
            "grad_x",
            out.iter().map(|v| v[2]).collect(),
            out.iter().map(|v| v[3]).collect(),
            rows,
        ),
        FeatureSums::merge(dgamma, d).expected("grad_weight", dtype, r_max),
    ];
    if beta.is_some() {
        result.push(FeatureSums::merge(dbeta, d).expected("grad_bias", dtype, 0.0));
    }
    result
}

/// A row's softmax in f64 with the relative error of its f32 normalizer: `(max, Σe^(x −
/// max), common)`, `common` the relative error of the f32 sum every element of the row
/// shares: its accumulation, each term's `exp` error (at most the row's largest), the
/// online rescaling of partial sums by one more `exp` of at most the row's range, and
/// the division.
fn softmax_row(xr: &[f64]) -> (f64, f64, f64) {
    let max = xr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = xr.iter().cloned().fold(f64::INFINITY, f64::min);
    let sum: f64 = xr.iter().map(|v| (v - max).exp()).sum();
    let range_exp = exp_error(max - min);
    let common = accumulation(xr.len(), sum) / sum + 2.0 * range_exp + 2.0 * U32;
    (max, sum, common)
}

/// Softmax over rows of `d` and its gradient `dx = y ⊙ (g − Σ g y)`.
///
/// Bounds: `y_c = e^(x_c − max)/S` is off by `(u + common + exp_error(x_c − max) + u₃₂)|y_c|`
/// plus a flush ([`softmax_row`]). The backward works from the forward's stored output `ŷ`
/// (off by that bound `b_c`): `D = Σ g ŷ` is off by `common·|D|` (the normalizer's error
/// scales every `y` of the row alike), the independent per-element errors `(u +
/// exp_error)|g y|` and flushes (√N-style), and the f32 accumulation; `dx_c` then by
/// `b_c|g_c − D| + |y_c|δD`, two f32 operations and its store.
pub fn softmax(dtype: DType, x: &[f64], g: &[f64], d: usize) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let rows = x.len() / d;
    let mut out = vec![[0.0; 4]; x.len()];
    par_rows(&mut out, d, |i, o| {
        let xr = row(x, i, d);
        let gr = row(g, i, d);
        let (max, sum, common) = softmax_row(xr);
        let y: Vec<f64> = xr.iter().map(|v| (v - max).exp() / sum).collect();
        let by: Vec<f64> = (0..d)
            .map(|c| (u + common + exp_error(xr[c] - max) + 2.0 * U32) * y[c] + flush(dtype, y[c]))
            .collect();
        let dot: f64 = (0..d).map(|c| gr[c] * y[c]).sum();
        let mut independent = Terms::default();
        let mut terms = Terms::default();
        for c in 0..d {
            let gy = (gr[c] * y[c]).abs();
            terms.push(gy);
            independent.push(
                (u + exp_error(xr[c] - max) + 2.0 * U32) * gy + flush(dtype, y[c]) * gr[c].abs(),
            );
        }
        let dot_error =
            common * dot.abs() + independent.independent() + terms.accumulation() + U32 * terms.l1;
        for c in 0..d {
            let dx = y[c] * (gr[c] - dot);
            let bdx = u * dx.abs()
                + by[c] * (gr[c] - dot).abs()
                + y[c] * dot_error
                + 2.0 * U32 * y[c] * (gr[c].abs() + dot.abs())
                + flush(dtype, dx);
            o[c] = [y[c], by[c], dx, bdx];
        }
    });
    split_pairs(out, rows)
}

/// Log-softmax over rows of `d` and its gradient `dx = g − e^y Σg`.
///
/// Bounds: `y_c = (x_c − max) − ln S` is off by the store `u|y_c|`, one f32 subtraction
/// each on `|x_c − max|` and `|y_c|`, the normalizer's relative error (`common`, an
/// absolute error of `ln S`), `ln`'s own error, and a flush. The backward works from the
/// stored `ŷ` (off by that bound `b_c`): `e^ŷ` is off by `p_c(b_c + exp_error(ŷ_c))`, `Σg`
/// by its f32 accumulation; then two f32 operations and the store.
pub fn log_softmax(dtype: DType, x: &[f64], g: &[f64], d: usize) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let rows = x.len() / d;
    let mut out = vec![[0.0; 4]; x.len()];
    par_rows(&mut out, d, |i, o| {
        let xr = row(x, i, d);
        let gr = row(g, i, d);
        let (max, sum, common) = softmax_row(xr);
        let lse = sum.ln();
        let total: f64 = gr.iter().sum();
        let total_error = accumulation(d, gr.iter().map(|v| v.abs()).sum());
        for c in 0..d {
            let y = xr[c] - max - lse;
            let by = u * y.abs()
                + U32 * ((xr[c] - max).abs() + y.abs())
                + common
                + ln_error(sum)
                + flush(dtype, y);
            let p = y.exp();
            let dx = gr[c] - p * total;
            let bdx = u * dx.abs()
                + p * total.abs() * (by + exp_error(y))
                + p * total_error
                + 2.0 * U32 * (gr[c].abs() + p * total.abs())
                + flush(dtype, dx);
            o[c] = [y, by, dx, bdx];
        }
    });
    split_pairs(out, rows)
}

/// `[output, bound, grad, bound]` per element into the two tensors.
fn split_pairs(out: Vec<[f64; 4]>, rows: usize) -> Vec<Expected> {
    vec![
        Expected::new(
            "output",
            out.iter().map(|v| v[0]).collect(),
            out.iter().map(|v| v[1]).collect(),
            rows,
        ),
        Expected::new(
            "grad_x",
            out.iter().map(|v| v[2]).collect(),
            out.iter().map(|v| v[3]).collect(),
            rows,
        ),
    ]
}
