//! Fused linear cross entropy in the conformance suite: the naive f64 reference with its
//! error bounds, and the case runner. `width` is the vocabulary `V`; the hidden size is
//! [`HIDDEN`].
//!
//! # What an implementation computes, and how far it may be from the reference
//!
//! The op is defined as the unfused composition it replaces, chunked over rows (see
//! `ops::compose::linear_cross_entropy`):
//!
//! - `logits = round(round(x Wᵀ) + b)`: the matmul's output and the bias add are each
//!   stored in the input dtype (Burn's fusion keeps both roundings: a fused matmul writes
//!   its result to a local of the output dtype before the add);
//! - per chunk of rows, the cross entropy's logits gradient `G` stored in the dtype, then
//!   `grad_x = G·W` and the chunk's `Gᵀ·x` (each an f32-accumulated matmul stored in the
//!   dtype), the chunk products added into an f32 accumulator stored in the dtype at the
//!   end (or, with `WeightGradAccumulation::WeightDtype`, added to the dtype's running
//!   sum, each sum rounded), and `grad_b = Σ_rows G` in f32;
//! - under a mean or sum, the backward multiplies the stored gradients by the upstream
//!   gradient (one more store); under none it recomputes them with per-row factors.
//!
//! The reference rounds the logits exactly as that definition says. A device sums
//! `x·W` in f32 in its own order, so where the exact product lies within that sum's error
//! of a rounding boundary it may round to the other neighbour: the reference finds those
//! logits (the rounding is monotone, so the device's logit lies between the roundings of
//! the product's lower and upper error bounds) and carries their uncertainty through the
//! cross entropy ([`super::cross_entropy::row_stats`], [`super::cross_entropy::element`]).
//!
//! Each reduction's bound then adds the roundings of its terms, independent across rows
//! (√N-style, [`Terms::independent`]), the f32 accumulation, and its stores. For
//! `grad_weight` that includes one rounding of every chunk's `[V, H]` product: with a
//! class that is the target of two rows in different chunks whose terms nearly cancel,
//! the result is tiny while each chunk's product, rounded on its own, is large; this
//! rounding is as large as that of `G` itself and must be counted next to it.
//!
//! At f32 on a device whose f32 matmul is TF32 (Burn's CUDA backend on tensor cores),
//! detected from the backend's own products at the case's shapes, every result is compared
//! norm-wise instead (`‖out − ref‖ / ‖ref‖ ≤ 1e-3`): the op is defined on the backend's
//! matmul and inherits its precision.

use super::bounds::{Expected, Terms, U32, flush, par_ranges, round_to as round, unit_roundoff};
use super::cross_entropy::{
    Factors, RowStats, element, factor_error, factors, loss_tensors, row_stats, totals,
};
use super::{
    Comparison, HostCase, Op, Rng, compare_all, compare_normwise, host_input, input, poison, to_f64,
};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::compose::linear_cross_entropy::automatic_chunk_rows;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction, WeightGradAccumulation};
use liger_burn::test_hooks::{OverrideGuard, override_chunk_rows};

pub use super::bounds::round_to;

/// Hidden size of the cases (odd, so no kernel sees a friendly width).
pub const HIDDEN: usize = 45;

/// The rounded inputs of a case.
pub struct LinearInputs<'a> {
    /// `[N, H]`.
    pub x: &'a [f64],
    /// `[V, H]`.
    pub w: &'a [f64],
    /// `[V]`.
    pub b: Option<&'a [f64]>,
    /// `[N]`.
    pub targets: &'a [i64],
    /// `[V]`.
    pub class_weight: Option<&'a [f64]>,
    /// The upstream gradient: one value (mean, sum) or one per row (none).
    pub g: &'a [f64],
}

/// `(z, δz)`: the logit of row `i`, class `c` as the definition rounds it, and how far a
/// device's may be from it (see the module docs). The device's f32 sum of the `H`
/// products is within `2·H·u₃₂·Σ|x w|` of the exact one: the deterministic bound of
/// recursive summation, doubled for accumulators that truncate instead of rounding (the
/// products of two half-precision values are exact in f32; of two f32 values, one
/// more `u₃₂`).
pub(crate) fn logit(inp: &LinearInputs, h: usize, dtype: DType, i: usize, c: usize) -> (f64, f64) {
    let (xr, wr) = (&inp.x[i * h..(i + 1) * h], &inp.w[c * h..(c + 1) * h]);
    let (mut d, mut l1) = (0.0, 0.0);
    for k in 0..h {
        let t = xr[k] * wr[k];
        d += t;
        l1 += t.abs();
    }
    let products = if dtype == DType::F32 { U32 * l1 } else { 0.0 };
    let slack = 2.0 * h as f64 * U32 * l1 + products;
    let defined = |d: f64| {
        let z = round(dtype, d);
        match inp.b {
            Some(b) => round(dtype, z + b[c]),
            None => z,
        }
    };
    let z = defined(d);
    let (lo, hi) = (defined(d - slack), defined(d + slack));
    (z, (hi - z).max(z - lo))
}

/// One element of a logits gradient as [`linear_gradients`] takes it: the value, its
/// error bound split into the part independent from element to element and the part
/// shared by the rows of a group (a row's `lse` error; a sequence's loss factor).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GradElement {
    pub grad: f64,
    pub independent: f64,
    pub shared: f64,
}

/// How the rows of a chunked linear loss are processed: the chunk of each row (each
/// chunk's `[V, H]` weight-gradient product is rounded on its own) and the group of each
/// row (rows whose shared errors are correlated, summed linearly before the reductions
/// over groups treat them as independent).
pub(crate) struct RowLayout<'a> {
    pub chunk_of: &'a [usize],
    pub group_of: &'a [usize],
    /// The weight gradient summed over the chunks in the dtype
    /// ([`WeightGradAccumulation::WeightDtype`]): every running sum but the last (the
    /// result's own store) is rounded too.
    pub weight_grad_in_dtype: bool,
}

/// The gradients of a linear layer `logits = x Wᵀ (+ b)` under a chunked loss whose logits
/// gradient is `element(i, c, z, dz)` (row `i`, class `c`, the logit and its uncertainty,
/// see [`logit`]), for each number of rows in `lives` taking part (the first `live` rows;
/// the others get no gradient): `grad_x`, `grad_weight` and `grad_bias` with their bounds.
/// `stores` is the number of stores of each gradient in the dtype (2 when the backward
/// rescales the stored gradients).
pub(crate) fn linear_gradients(
    inp: &LinearInputs,
    dtype: DType,
    (n, h, v): (usize, usize, usize),
    layout: &RowLayout,
    lives: &[usize],
    stores: f64,
    element: impl Fn(usize, usize, f64, f64) -> GradElement + Sync,
) -> Vec<Vec<Expected>> {
    let u = unit_roundoff(dtype);
    let store = |e: f64| stores * (u * e.abs() + flush(dtype, e)) + (stores - 1.0) * U32 * e.abs();
    let chunks = layout.chunk_of.iter().max().map_or(0, |c| c + 1);
    let groups = layout.group_of.iter().max().map_or(0, |g| g + 1);
    // Groups are runs of consecutive rows.
    let group_end: Vec<bool> = (0..n)
        .map(|i| layout.group_of.get(i + 1) != layout.group_of.get(i))
        .collect();

    struct Sums {
        value: f64,
        terms: Terms,
        errors: Terms,
        chunks: Terms,
        running: f64,
    }
    impl Sums {
        fn new() -> Self {
            Sums {
                value: 0.0,
                terms: Terms::default(),
                errors: Terms::default(),
                chunks: Terms::default(),
                running: 0.0,
            }
        }
    }
    // Per `live`: grad_w [V·H] and grad_b [V] as (value, bound), grad_x partials [N·H] as
    // (value, l1 of terms, unused, shared errors).
    type Part = (Vec<[f64; 2]>, Vec<[f64; 2]>, Vec<[f64; 4]>, Vec<Terms>);
    let parts: Vec<Vec<Part>> = par_ranges(v, |classes| {
        let mut out: Vec<Part> = lives
            .iter()
            .map(|_| {
                (
                    Vec::with_capacity(classes.len() * h),
                    Vec::with_capacity(classes.len()),
                    vec![[0.0; 4]; n * h],
                    vec![Terms::default(); n * h],
                )
            })
            .collect();
        for c in classes {
            let mut gw: Vec<Vec<Sums>> = lives
                .iter()
                .map(|_| (0..h).map(|_| Sums::new()).collect())
                .collect();
            let mut gb: Vec<Sums> = lives.iter().map(|_| Sums::new()).collect();
            let mut chunk_sum = vec![vec![vec![0.0; h]; chunks]; lives.len()];
            let mut group_w = vec![vec![vec![0.0; h]; groups]; lives.len()];
            let mut group_b = vec![vec![0.0; groups]; lives.len()];
            for (i, &ends) in group_end.iter().enumerate() {
                let (z, dz) = logit(inp, h, dtype, i, c);
                let e = element(i, c, z, dz);
                let (chunk, group) = (layout.chunk_of[i], layout.group_of[i]);
                for (l, &live) in lives.iter().enumerate() {
                    if i >= live {
                        continue;
                    }
                    for k in 0..h {
                        let xv = inp.x[i * h + k];
                        let t = e.grad * xv;
                        let s = &mut gw[l][k];
                        s.value += t;
                        s.terms.push(t);
                        chunk_sum[l][chunk][k] += t;
                        group_w[l][group][k] += e.shared * xv.abs();
                        if ends || i + 1 == live {
                            s.errors
                                .push(e.independent * xv.abs() + group_w[l][group][k]);
                        } else {
                            s.errors.push(e.independent * xv.abs());
                        }
                        let wv = inp.w[c * h + k];
                        let gx = &mut out[l].2[i * h + k];
                        gx[0] += e.grad * wv;
                        gx[1] += (e.grad * wv).abs();
                        gx[3] += e.shared * wv.abs();
                        out[l].3[i * h + k].push(e.independent * wv.abs());
                    }
                    gb[l].value += e.grad;
                    gb[l].terms.push(e.grad);
                    group_b[l][group] += e.shared;
                    if ends || i + 1 == live {
                        gb[l].errors.push(e.independent + group_b[l][group]);
                    } else {
                        gb[l].errors.push(e.independent);
                    }
                }
            }
            for l in 0..lives.len() {
                for (k, s) in gw[l].iter_mut().enumerate() {
                    for sums in &chunk_sum[l] {
                        let sk = sums[k];
                        s.chunks.push(u * sk.abs() + flush(dtype, sk));
                    }
                    if layout.weight_grad_in_dtype {
                        // Sequential roundings of the running sums: summed linearly.
                        let mut sum = 0.0;
                        for sums in chunk_sum[l].iter().take(chunks.saturating_sub(1)) {
                            sum += sums[k];
                            s.running += u * sum.abs() + flush(dtype, sum);
                        }
                    }
                }
                for s in &gw[l] {
                    let bound = store(s.value)
                        + s.errors.independent()
                        + s.chunks.independent()
                        + s.running
                        + s.terms.accumulation();
                    out[l].0.push([s.value, bound]);
                }
                let s = &gb[l];
                let bound = store(s.value) + s.errors.independent() + s.terms.accumulation();
                out[l].1.push([s.value, bound]);
            }
        }
        out
    });
    lives
        .iter()
        .enumerate()
        .map(|(l, _)| {
            let mut grad_w = Vec::with_capacity(v * h);
            let mut grad_b = Vec::with_capacity(v);
            let mut gx = vec![[0.0; 4]; n * h];
            let mut gx_errors = vec![Terms::default(); n * h];
            for part in &parts {
                let (w, b, x, xe) = &part[l];
                grad_w.extend_from_slice(w);
                grad_b.extend_from_slice(b);
                for (k, p) in x.iter().enumerate() {
                    for m in 0..4 {
                        gx[k][m] += p[m];
                    }
                    gx_errors[k].merge(&xe[k]);
                }
            }
            let (gx_values, gx_bounds): (Vec<f64>, Vec<f64>) = gx
                .iter()
                .zip(&gx_errors)
                .map(|(p, errors)| {
                    let bound = store(p[0])
                        + errors.independent()
                        + p[3]
                        + super::bounds::accumulation(v, p[1]);
                    (p[0], bound)
                })
                .unzip();
            let mut out = vec![Expected::new("grad_x", gx_values, gx_bounds, n)];
            out.push(Expected::new(
                "grad_weight",
                grad_w.iter().map(|p| p[0]).collect(),
                grad_w.iter().map(|p| p[1]).collect(),
                v,
            ));
            if inp.b.is_some() {
                out.push(Expected::new(
                    "grad_bias",
                    grad_b.iter().map(|p| p[0]).collect(),
                    grad_b.iter().map(|p| p[1]).collect(),
                    1,
                ));
            }
            out
        })
        .collect()
}

/// The row statistics of a linear loss's logits: each row's logits with their
/// uncertainty, through [`row_stats`] for `inp.targets`.
pub(crate) fn linear_row_stats(
    inp: &LinearInputs,
    dtype: DType,
    (n, h, v): (usize, usize, usize),
    options: &CrossEntropyOptions,
) -> Vec<RowStats> {
    par_ranges(n, |range| {
        let mut z = vec![0.0; v];
        let mut dz = vec![0.0; v];
        range
            .map(|i| {
                for c in 0..v {
                    (z[c], dz[c]) = logit(inp, h, dtype, i, c);
                }
                row_stats(&z, Some(&dz), inp.targets[i], inp.class_weight, options)
            })
            .collect::<Vec<_>>()
    })
    .concat()
}

/// The reference of a fused linear cross entropy, for each number of rows in `lives`
/// taking part (the first `live` rows; the others get no gradient and are left out of the
/// reductions): the loss (and z-loss), `grad_x`, `grad_weight` and `grad_bias` with their
/// bounds. `chunk` is the rows per chunk of the implementation (the chunk products' own
/// rounding depends on it).
pub fn expected(
    options: &CrossEntropyOptions,
    dtype: DType,
    (n, h, v): (usize, usize, usize),
    inp: &LinearInputs,
    chunk: usize,
    lives: &[usize],
) -> Vec<Vec<Expected>> {
    let tot = totals(inp.targets, v, inp.class_weight, options);
    // Pass 1, over rows: each row's logits with their uncertainty, and its statistics.
    let stats = linear_row_stats(inp, dtype, (n, h, v), options);
    let row_factors: Vec<Factors> = (0..n).map(|i| factors(options, inp.g, tot, i)).collect();
    let scale_error = factor_error(options, tot, inp.class_weight.is_some());
    // A mean or sum multiplies the stored gradients by the upstream gradient afterwards.
    let stores = if options.reduction == Reduction::None {
        1.0
    } else {
        2.0
    };
    let chunk = chunk.max(1);
    let chunk_of: Vec<usize> = (0..n).map(|i| i / chunk).collect();
    let group_of: Vec<usize> = (0..n).collect();
    // Pass 2, over classes: every gradient element of the class, its terms and errors.
    let grads = linear_gradients(
        inp,
        dtype,
        (n, h, v),
        &RowLayout {
            chunk_of: &chunk_of,
            group_of: &group_of,
            weight_grad_in_dtype: options.weight_grad_accumulation
                == WeightGradAccumulation::WeightDtype,
        },
        lives,
        stores,
        |i, c, z, dz| {
            let e = element(
                &stats[i],
                c,
                z,
                dz,
                inp.class_weight,
                options,
                row_factors[i],
                dtype,
                1.0,
            );
            GradElement {
                grad: e.grad,
                independent: e.independent,
                shared: e.per_lse * stats[i].lse_error + scale_error * e.grad.abs(),
            }
        },
    );
    lives
        .iter()
        .zip(grads)
        .map(|(&live, grads)| {
            let mut out = loss_tensors(&stats, options, tot, live);
            out.extend(grads);
            out
        })
        .collect()
}

impl Op {
    /// Whether this is one of the fused linear cross-entropy variants.
    pub fn is_linear_cross_entropy(self) -> bool {
        matches!(
            self,
            Op::FusedLinearCrossEntropy
                | Op::FusedLinearCrossEntropyNone
                | Op::FusedLinearCrossEntropySum
        )
    }
}

/// The fused linear cross-entropy sweep (`width` is V; H is [`HIDDEN`]).
///
/// Every new shape costs many kernel compilations on a software rasterizer (matmuls and
/// fused element-wise blocks per chunk shape), so the quick list is short: 37 rows make
/// a last partial chunk for the forced chunk sizes (8 and 5 rows), one row is the
/// degenerate case, and 300 rows of 64 classes take two automatic chunks.
pub(crate) fn shapes(op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = match op {
        Op::FusedLinearCrossEntropy => vec![(1, 7), (37, 100)],
        Op::FusedLinearCrossEntropyNone => vec![(37, 100)],
        _ => vec![(300, 64)],
    };
    if !quick {
        shapes.extend([
            (65, 1000),
            (9, 4097),
            (512, 32_000),
            (256, 128_256),
            (4096, 4096),
        ]);
    }
    shapes
}

/// What a variant exercises.
struct Variant {
    options: CrossEntropyOptions,
    bias: bool,
    weighted: bool,
    /// Forced rows per chunk (`None`: automatic).
    chunk: Option<usize>,
}

fn variant(op: Op, v: usize) -> Variant {
    let base = CrossEntropyOptions::default();
    match op {
        // Several chunks of 8 rows, the last one partial; the weight gradient summed in
        // the dtype (the other variants sum it in f32).
        Op::FusedLinearCrossEntropy => Variant {
            options: base
                .with_label_smoothing(0.1)
                .with_weight_grad_accumulation(WeightGradAccumulation::WeightDtype),
            bias: true,
            weighted: false,
            chunk: Some(8),
        },
        // Per-row upstream gradients: the backward's second chunked pass.
        Op::FusedLinearCrossEntropyNone => Variant {
            options: base
                .with_reduction(Reduction::None)
                .with_lse_square_scale(1e-3)
                .with_softcap(Some(5.0))
                .with_return_z_loss(true),
            bias: false,
            weighted: true,
            chunk: Some(5),
        },
        // Automatic chunking, an ignore_index inside the vocabulary.
        Op::FusedLinearCrossEntropySum => Variant {
            options: base
                .with_reduction(Reduction::Sum)
                .with_ignore_index((v / 2) as i64),
            bias: true,
            weighted: false,
            chunk: None,
        },
        other => unreachable!("{other:?} is not a linear cross-entropy variant"),
    }
}

/// The inputs of a case, as drawn.
struct Inputs {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    targets: Vec<i64>,
    class_weight: Option<Vec<f32>>,
    g: Vec<f32>,
}

fn draw(op: Op, n: usize, v: usize, rng: &mut Rng) -> Inputs {
    let var = variant(op, v);
    let h = HIDDEN;
    let x = rng.vec(n * h, -1.0, 1.0, 0.0);
    let w = rng.vec(v * h, -0.5, 0.5, 0.0);
    let b = var.bias.then(|| rng.vec(v, -0.5, 0.5, 0.0));
    let targets = (0..n)
        .map(|_| {
            if rng.uniform() < 0.1 {
                var.options.ignore_index
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let class_weight = var.weighted.then(|| rng.vec(v, 0.5, 2.0, 0.0));
    let per_row = var.options.reduction == Reduction::None;
    let g = rng.vec(if per_row { n } else { 1 }, 0.5, 1.5, 0.0);
    Inputs {
        x,
        w,
        b,
        targets,
        class_weight,
        g,
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&c| f64::from(c)).collect()
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
    let (n, v, h) = (rows, width, HIDDEN);
    let var = variant(op, v);
    let inputs = draw(op, n, v, rng);
    let (x, w) = (host_input(&inputs.x, dtype), host_input(&inputs.w, dtype));
    let b = inputs.b.as_ref().map(|b| host_input(b, dtype));
    let cw = inputs.class_weight.as_deref().map(f64s);
    let g = f64s(&inputs.g);
    let inp = LinearInputs {
        x: &x,
        w: &w,
        b: b.as_deref(),
        targets: &inputs.targets,
        class_weight: cw.as_deref(),
        g: &g,
    };
    let chunk = var.chunk.unwrap_or_else(|| automatic_chunk_rows(n, h, v));
    let mut both = expected(&var.options, dtype, (n, h, v), &inp, chunk, &[rows, live]);
    let without_last_rows = both.pop().expect("two references");
    HostCase {
        expected: both.pop().expect("two references"),
        without_last_rows,
    }
}

/// A backend `x·Wᵀ` whose norm-wise error exceeds this is not f32 (f32 accumulation of
/// `H = 45` products lands near 1e-7; TF32, inputs rounded to 10 bits, near 3e-4).
const TF32_DETECT: f64 = 1e-5;

/// Norm-wise bound of every result when the matmul is TF32: METHOD's figure for a TF32
/// product (near 3e-4) with room for the two products a gradient goes through.
pub const TF32_NORMWISE: f64 = 1e-3;

/// Largest norm-wise relative error of the backend's own products at the op's three
/// shapes (`x·Wᵀ`, `G·W`, `Gᵀ·x`, as `compose::linear_cross_entropy` calls them; `G` a
/// random `[n, v]` matrix) against f64 on the values the device holds. Burn picks the
/// matmul kernel per shape (TF32 tensor cores or exact f32 units), so every shape is probed.
pub(crate) fn matmul_error<B: FusedOps>(
    x: &Tensor<B, 2>,
    w: &Tensor<B, 2>,
    xr: &[f64],
    wr: &[f64],
    (n, h, v): (usize, usize, usize),
    rng: &mut Rng,
) -> f64 {
    let (g, gr) = input::<B>(
        rng.vec(n * v, -1.0, 1.0, 0.0),
        vec![n, v],
        DType::F32,
        &x.device(),
    );
    // a: [m, k] row-major, b_at(k_idx, col) reads the right operand.
    let rel = |actual: Vec<f64>,
               m: usize,
               k: usize,
               cols: usize,
               a: &dyn Fn(usize, usize) -> f64,
               b: &dyn Fn(usize, usize) -> f64| {
        let (mut diff, mut norm) = (0.0, 0.0);
        for i in 0..m {
            for c in 0..cols {
                let e: f64 = (0..k).map(|t| a(i, t) * b(t, c)).sum();
                diff += (actual[i * cols + c] - e).powi(2);
                norm += e * e;
            }
        }
        (diff / f64::max(norm, f64::MIN_POSITIVE)).sqrt()
    };
    let logits = to_f64(x.clone().matmul(w.clone().transpose()));
    let grad_x = to_f64(g.clone().matmul(w.clone()));
    let grad_w = to_f64(g.transpose().matmul(x.clone()));
    let e_logits = rel(logits, n, h, v, &|i, t| xr[i * h + t], &|t, c| {
        wr[c * h + t]
    });
    let e_grad_x = rel(grad_x, n, v, h, &|i, t| gr[i * v + t], &|t, c| {
        wr[t * h + c]
    });
    let e_grad_w = rel(grad_w, v, n, h, &|i, t| gr[t * v + i], &|t, c| {
        xr[t * h + c]
    });
    e_logits.max(e_grad_x).max(e_grad_w)
}

/// Largest norm-wise relative error of the backend's f32 products at the shapes of
/// `x·Wᵀ` for `x: [n, h]`, `W: [v, h]` (and the two gradient products), on fresh random
/// inputs against f64. Above [`TF32_DETECT`] the backend's f32 matmul is reduced
/// precision (TF32 tensor cores): anything built on it inherits a ~1e-3 relative error,
/// so callers comparing two f32 runs (as `liger converge`) must allow for it.
pub fn f32_matmul_error<B: FusedOps>(
    (n, h, v): (usize, usize, usize),
    device: &B::Device,
    rng: &mut Rng,
) -> f64 {
    let (x, xr) = input::<B>(
        rng.vec(n * h, -1.0, 1.0, 0.0),
        vec![n, h],
        DType::F32,
        device,
    );
    let (w, wr) = input::<B>(
        rng.vec(v * h, -1.0, 1.0, 0.0),
        vec![v, h],
        DType::F32,
        device,
    );
    matmul_error(&x, &w, &xr, &wr, (n, h, v), rng)
}

/// The comparisons of a chunked linear loss's results: elementwise under the bounds, or
/// norm-wise (every tensor within [`TF32_NORMWISE`]) when the case is f32 and the
/// backend's f32 products at the op's shapes are reduced precision (see the module docs),
/// probed on `x: [n, h]` and `w: [v, h]` as the device holds them (`xr`, `wr`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare_linear<B: FusedOps>(
    actual: Vec<(&'static str, Vec<f64>)>,
    expected: &[Expected],
    dtype: DType,
    (x, xr): (&Tensor<B, 2>, &[f64]),
    (w, wr): (&Tensor<B, 2>, &[f64]),
    rng: &mut Rng,
) -> Vec<Comparison> {
    let [n, h] = x.dims();
    let v = w.dims()[0];
    let reduced =
        dtype == DType::F32 && is_reduced_precision(matmul_error(x, w, xr, wr, (n, h, v), rng));
    if !reduced {
        return compare_all(actual, expected);
    }
    expected
        .iter()
        .map(|e| {
            let a = &actual
                .iter()
                .find(|(name, _)| *name == e.tensor)
                .expect("result")
                .1;
            compare_normwise(e.tensor, a, &e.values, TF32_NORMWISE)
        })
        .collect()
}

/// Whether [`f32_matmul_error`] says the backend's f32 matmul is reduced precision.
pub fn is_reduced_precision(matmul_error: f64) -> bool {
    matmul_error > TF32_DETECT
}

/// The chunk rows on this thread while held (`None`: the automatic size).
struct ChunkOverride(#[allow(dead_code)] Option<OverrideGuard<usize>>);

impl ChunkOverride {
    fn set(rows: Option<usize>) -> Self {
        ChunkOverride(rows.map(override_chunk_rows))
    }
}

/// Runs a fused linear cross-entropy variant with `N = rows`, `V = width`, `H = HIDDEN`.
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let (n, v, h) = (rows, width, HIDDEN);
    let Variant { options, chunk, .. } = variant(op, v);
    let inputs = draw(op, n, v, rng);
    let (x, xr) = input::<B>(inputs.x, vec![n, h], dtype, device);
    let (w, wr) = input::<B>(inputs.w, vec![v, h], dtype, device);
    let b = inputs.b.map(|b| input::<B>(b, vec![v], dtype, device));
    let cw_r = inputs.class_weight.as_deref().map(f64s);
    let g_r = f64s(&inputs.g);

    // The op is defined on the backend's matmul. Where that runs at reduced precision
    // at f32 (TF32 tensor cores) at any of the op's shapes, every result inherits its
    // error: compare norm-wise.
    let reduced_matmul = (dtype == DType::F32)
        .then(|| matmul_error(&x, &w, &xr, &wr, (n, h, v), rng))
        .is_some_and(is_reduced_precision);

    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let (b, br) = match b {
        Some((b, br)) => (
            Some(Tensor::<A<B>, 2>::from_inner(b).reshape([v]).require_grad()),
            Some(br),
        ),
        None => (None, None),
    };
    let t = Tensor::<A<B>, 1, Int>::from_data(TensorData::new(inputs.targets.clone(), [n]), device);
    let cw = inputs
        .class_weight
        .map(|c| Tensor::<A<B>, 1>::from_data(TensorData::new(c, [v]), device));
    let g_t =
        Tensor::<A<B>, 1>::from_data(TensorData::new(inputs.g.clone(), [inputs.g.len()]), device);
    poison::<B>(&[n * h, v * h, v], dtype, device);
    let (out, grads) = {
        let _chunk = ChunkOverride::set(chunk);
        let out =
            functional::fused_linear_cross_entropy(x.clone(), w.clone(), b.clone(), t, cw, options);
        let grads = (out.loss.clone() * g_t).sum().backward();
        (out, grads)
    };
    let mut actual = vec![
        ("loss", to_f64(out.loss.inner())),
        ("grad_x", to_f64(x.grad(&grads).expect("grad_x"))),
        ("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))),
    ];
    if let Some(z) = out.z_loss {
        actual.push(("z_loss", to_f64(z.inner())));
    }
    if let Some(b) = &b {
        actual.push(("grad_bias", to_f64(b.grad(&grads).expect("grad_bias"))));
    }
    let inp = LinearInputs {
        x: &xr,
        w: &wr,
        b: br.as_deref(),
        targets: &inputs.targets,
        class_weight: cw_r.as_deref(),
        g: &g_r,
    };
    let chunk = chunk.unwrap_or_else(|| automatic_chunk_rows(n, h, v));
    let expected = expected(&options, dtype, (n, h, v), &inp, chunk, &[n])
        .pop()
        .expect("one reference");
    if reduced_matmul {
        expected
            .iter()
            .map(|e| {
                let a = &actual
                    .iter()
                    .find(|(name, _)| *name == e.tensor)
                    .expect("result")
                    .1;
                compare_normwise(e.tensor, a, &e.values, TF32_NORMWISE)
            })
            .collect()
    } else {
        compare_all(actual, &expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(v: f32) -> f32 {
        burn::tensor::bf16::from_f32(v).to_f32()
    }

    /// What the chunked path computes on a device in bf16, every rounding in place
    /// (round-to-nearest stores to bf16, f32 arithmetic in between): the logits, the
    /// cross entropy's gradient `G` stored in bf16, each chunk's `Gᵀx` accumulated in f32
    /// and stored in bf16, those added into an f32 accumulator stored in bf16 at the end,
    /// `G·W` per row stored in bf16, `Σ_rows G` in f32. Reduction none (per-row factors),
    /// no bias, no label smoothing, as the `_none` variant.
    fn emulate_none(
        options: &CrossEntropyOptions,
        (n, h, v): (usize, usize, usize),
        x: &[f64],
        w: &[f64],
        targets: &[i64],
        cw: &[f64],
        g: &[f64],
        chunk: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let lambda = options.lse_square_scale as f32;
        let cap = options.softcap.map(|c| c as f32);
        let mut grad = vec![0f32; n * v];
        for i in 0..n {
            let t = targets[i];
            if t < 0 || t >= v as i64 {
                continue;
            }
            let y = t as usize;
            let logits: Vec<f32> = (0..v)
                .map(|c| {
                    let mut d = 0f32;
                    for k in 0..h {
                        d += (x[i * h + k] as f32) * (w[c * h + k] as f32);
                    }
                    bf16(d)
                })
                .collect();
            let z: Vec<f32> = logits
                .iter()
                .map(|&l| cap.map_or(l, |c| (l / c).tanh() * c))
                .collect();
            let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = z.iter().map(|&zc| (zc - m).exp()).sum();
            let lse = m + s.ln();
            let scale = g[i] as f32;
            let a = cw[y] as f32 * scale;
            let coef = a + 2.0 * lambda * lse * scale;
            for c in 0..v {
                let p = (z[c] - lse).exp();
                let mut gc = p * coef - if c == y { a } else { 0.0 };
                if let Some(cp) = cap {
                    let tc = logits[c] / cp;
                    let th = tc.tanh();
                    gc *= 1.0 - th * th;
                }
                grad[i * v + c] = bf16(gc);
            }
        }
        let mut acc = vec![0f32; v * h];
        let mut grad_x = vec![0f64; n * h];
        let mut r0 = 0;
        while r0 < n {
            let r1 = (r0 + chunk).min(n);
            for c in 0..v {
                for k in 0..h {
                    let mut p = 0f32;
                    for i in r0..r1 {
                        p += grad[i * v + c] * x[i * h + k] as f32;
                    }
                    acc[c * h + k] += bf16(p);
                }
            }
            for i in r0..r1 {
                for k in 0..h {
                    let mut p = 0f32;
                    for c in 0..v {
                        p += grad[i * v + c] * w[c * h + k] as f32;
                    }
                    grad_x[i * h + k] = f64::from(bf16(p));
                }
            }
            r0 = r1;
        }
        let grad_w = acc.iter().map(|&a| f64::from(bf16(a))).collect();
        (grad_x, grad_w)
    }

    /// The H200's `fused_linear_cross_entropy_none` failure: a correctly rounded bf16
    /// chunked computation exceeds the old bound `u·Σ|terms|` (plus `2e-2·|e|` and an
    /// absolute `5e-2` on values scaled by `V`), which counted the rounding of each term of
    /// `Gᵀx` but not that of each chunk's product. Where a class is the target of two rows
    /// in different chunks whose terms nearly cancel, each chunk's large product is
    /// rounded on its own while the result is small: that rounding is as large as the
    /// terms' own. The case has such pairs (row `P + p` holds `−x` of row `p`, the same
    /// target and upstream factor); the old bound rejects the honest computation at some
    /// of their elements, the bounds of [`expected`] accept every element.
    #[test]
    fn chunk_products_rounding_is_within_the_bound_and_beyond_the_old_one() {
        let op = Op::FusedLinearCrossEntropyNone;
        let pairs = 60;
        let (n, h, v) = (2 * pairs, HIDDEN, 10 * pairs);
        let chunk = 5;
        let dtype = DType::BF16;
        let u = unit_roundoff(dtype);
        let (mut old_rejections, mut worst, mut used_new) = (0, 0.0f64, 0.0f64);
        for seed in 0..2 {
            let mut rng = Rng::new(seed);
            let mut inputs = draw(op, n, v, &mut rng);
            for p in 0..pairs {
                inputs.targets[p] = p as i64;
                inputs.targets[pairs + p] = p as i64;
                inputs.g[pairs + p] = inputs.g[p];
                for k in 0..h {
                    inputs.x[(pairs + p) * h + k] = -inputs.x[p * h + k];
                }
            }
            let options = variant(op, v).options;
            let (x, w) = (host_input(&inputs.x, dtype), host_input(&inputs.w, dtype));
            let cw = f64s(inputs.class_weight.as_deref().expect("weighted variant"));
            let g = f64s(&inputs.g);
            let inp = LinearInputs {
                x: &x,
                w: &w,
                b: None,
                targets: &inputs.targets,
                class_weight: Some(&cw),
                g: &g,
            };
            let expected = expected(&options, dtype, (n, h, v), &inp, chunk, &[n])
                .pop()
                .expect("one reference");
            let (grad_x, grad_w) =
                emulate_none(&options, (n, h, v), &x, &w, &inputs.targets, &cw, &g, chunk);
            let tensor = |name: &str| expected.iter().find(|e| e.tensor == name).unwrap();
            for (name, actual) in [("grad_x", &grad_x), ("grad_weight", &grad_w)] {
                let c = tensor(name).check(actual);
                assert!(
                    c.passed,
                    "seed {seed} {name}: the honest bf16 computation is rejected (used {:.2})",
                    c.max_used
                );
                used_new = used_new.max(c.max_used);
            }
            // The old bound on `grad_weight`, in the units it was applied in (values
            // times V under reduction none), its `Σ|terms|` recomputed here.
            let gw = tensor("grad_weight");
            let reference = reference_rows(&options, dtype, (n, h, v), &inp);
            for (k, (&a, &e)) in grad_w.iter().zip(&gw.values).enumerate() {
                let (c, hk) = (k / h, k % h);
                let terms: f64 = (0..n)
                    .map(|i| (reference[i * v + c] * x[i * h + hk]).abs())
                    .sum();
                let scale = v as f64;
                let old = 5e-2 + 2e-2 * (e * scale).abs() + u * terms * scale;
                let used = (a - e).abs() * scale / old;
                worst = worst.max(used);
                if used > 1.0 {
                    old_rejections += 1;
                }
            }
        }
        eprintln!(
            "old bound: {old_rejections} rejections, worst {worst:.2} of it; \
             new bounds: at most {used_new:.2} used"
        );
        assert!(
            old_rejections > 0,
            "the old bound accepted every element: the case does not reach its weakness"
        );
    }

    /// The reference's `G` (row factors applied), to recompute the old bound's terms.
    fn reference_rows(
        options: &CrossEntropyOptions,
        dtype: DType,
        (n, h, v): (usize, usize, usize),
        inp: &LinearInputs,
    ) -> Vec<f64> {
        let tot = totals(inp.targets, v, inp.class_weight, options);
        let mut out = vec![0.0; n * v];
        for i in 0..n {
            let (z, dz): (Vec<f64>, Vec<f64>) = (0..v).map(|c| logit(inp, h, dtype, i, c)).unzip();
            let stats = row_stats(&z, Some(&dz), inp.targets[i], inp.class_weight, options);
            let f = factors(options, inp.g, tot, i);
            for c in 0..v {
                out[i * v + c] = element(
                    &stats,
                    c,
                    z[c],
                    0.0,
                    inp.class_weight,
                    options,
                    f,
                    dtype,
                    1.0,
                )
                .grad;
            }
        }
        out
    }
}
