//! Fused linear cross entropy in the conformance suite: the naive f64 reference and the
//! case runner. `width` is the vocabulary `V`; the hidden size is [`HIDDEN`].
//!
//! The logits are an intermediate stored in the input dtype (the matmul's output, then
//! the bias add), exactly as in the unfused composition, so the reference rounds them the
//! same way before the cross entropy: only the op's own error is measured. Gradients are
//! compared after multiplying both sides by the same exact factor (`W/g` for `x`,
//! `V·W/g` for the weight and bias under a mean; see `conformance::cross_entropy`), with
//! the reduction tolerances (`sum_rtol · Σ|terms|`) plus the storage floor of the
//! gradient logits (each may be a flushed subnormal).
//!
//! At f32 on a device whose f32 matmul is TF32 (Burn's CUDA backend on tensor cores),
//! detected from the backend's own products at the case's shapes, every result is compared
//! norm-wise instead (`‖out − ref‖ / ‖ref‖ ≤ 1e-3`): the op is defined on the backend's
//! matmul and inherits its precision.

use super::cross_entropy::{reference as ce_reference, storage_floor};
use super::{
    Comparison, Op, Rng, Tolerance, compare, compare_impl, compare_normwise, input, poison, to_f64,
};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData, bf16, f16};
use liger_burn::functional;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction};
use liger_burn::test_hooks::{OverrideGuard, override_chunk_rows};

/// Hidden size of the cases (odd, so no kernel sees a friendly width).
pub const HIDDEN: usize = 45;

/// `v` rounded to `dtype`, as the device stores it.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F64 => v,
        _ => v as f32 as f64,
    }
}

/// Reference gradients of a linear cross entropy, with the magnitudes their error scales with.
#[derive(Clone, Debug)]
pub struct LinearReference {
    /// Per-row loss and z-loss, and the mean's denominator, of the cross entropy.
    pub rows: super::cross_entropy::CrossEntropyReference,
    /// `∂L/∂x`, `[N, H]`.
    pub grad_x: Vec<f64>,
    /// `∂L/∂W`, `[V, H]`.
    pub grad_w: Vec<f64>,
    /// `∂L/∂b`, `[V]`.
    pub grad_b: Vec<f64>,
    /// `Σ_c |G_ic W_ch|`, `Σ_i |G_ic x_ih|`, `Σ_i |G_ic|`: what the f32 sums' error scales with.
    pub sums: [Vec<f64>; 3],
    /// `Σ_c |W_ch|`, `Σ_i |x_ih|`, `N`: what the flushed-subnormal error of `G` scales with.
    pub floor_terms: [Vec<f64>; 3],
}

/// Naive f64 linear cross entropy: `logits = round(round(x Wᵀ) + b)` in `dtype`, the
/// cross entropy of [`super::cross_entropy::reference`], and the gradients of
/// `L = Σ_i f_i loss_i` for the per-row factors `f` (the reduction and upstream gradient).
#[allow(clippy::too_many_arguments)]
pub fn reference(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    (n, h, v): (usize, usize, usize),
    targets: &[i64],
    class_weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
    dtype: DType,
    factor: impl Fn(usize, f64) -> f64,
) -> LinearReference {
    let mut logits = vec![0.0; n * v];
    for i in 0..n {
        for c in 0..v {
            let dot: f64 = (0..h).map(|k| x[i * h + k] * w[c * h + k]).sum();
            let mut z = round_to(dtype, dot);
            if let Some(b) = b {
                z = round_to(dtype, z + b[c]);
            }
            logits[i * v + c] = z;
        }
    }
    let rows = ce_reference(&logits, v, targets, class_weight, options);
    let g: Vec<f64> = (0..n * v)
        .map(|k| rows.grad[k] * factor(k / v, rows.weight_total))
        .collect();
    let mut out = LinearReference {
        grad_x: vec![0.0; n * h],
        grad_w: vec![0.0; v * h],
        grad_b: vec![0.0; v],
        sums: [vec![0.0; n * h], vec![0.0; v * h], vec![0.0; v]],
        floor_terms: [vec![0.0; n * h], vec![0.0; v * h], vec![n as f64; v]],
        rows,
    };
    for i in 0..n {
        for c in 0..v {
            let gic = g[i * v + c];
            for k in 0..h {
                let (xv, wv) = (x[i * h + k], w[c * h + k]);
                out.grad_x[i * h + k] += gic * wv;
                out.sums[0][i * h + k] += (gic * wv).abs();
                out.floor_terms[0][i * h + k] += wv.abs();
                out.grad_w[c * h + k] += gic * xv;
                out.sums[1][c * h + k] += (gic * xv).abs();
                out.floor_terms[1][c * h + k] += xv.abs();
            }
            out.grad_b[c] += gic;
            out.sums[2][c] += gic.abs();
        }
    }
    out
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
        // Several chunks of 8 rows, the last one partial.
        Op::FusedLinearCrossEntropy => Variant {
            options: base.with_label_smoothing(0.1),
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

/// A backend `x·Wᵀ` whose norm-wise error exceeds this is not f32 (f32 accumulation of
/// `H = 45` products lands near 1e-7; TF32, inputs rounded to 10 bits, near 3e-4).
const TF32_DETECT: f64 = 1e-5;

/// Norm-wise bound of every result when the matmul is TF32: METHOD's figure for a TF32
/// product (near 3e-4) with room for the two products a gradient goes through.
const TF32_NORMWISE: f64 = 1e-3;

/// Largest norm-wise relative error of the backend's own products at the op's three
/// shapes (`x·Wᵀ`, `G·W`, `Gᵀ·x`, as `compose::linear_cross_entropy` calls them; `G` a
/// random `[n, v]` matrix) against f64 on the values the device holds. Burn picks the
/// matmul kernel per shape (TF32 tensor cores or exact f32 units), so every shape is probed.
fn matmul_error<B: FusedOps>(
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
    let Variant {
        options,
        bias,
        weighted,
        chunk,
    } = variant(op, v);
    let (x, xr) = input::<B>(rng.vec(n * h, -1.0, 1.0, 0.0), vec![n, h], dtype, device);
    let (w, wr) = input::<B>(rng.vec(v * h, -0.5, 0.5, 0.0), vec![v, h], dtype, device);
    let b = bias.then(|| input::<B>(rng.vec(v, -0.5, 0.5, 0.0), vec![v], dtype, device));
    let targets: Vec<i64> = (0..n)
        .map(|_| {
            if rng.uniform() < 0.1 {
                options.ignore_index
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let class_weight: Option<Vec<f32>> = weighted.then(|| rng.vec(v, 0.5, 2.0, 0.0));
    let per_row = options.reduction == Reduction::None;
    let g: Vec<f32> = rng.vec(if per_row { n } else { 1 }, 0.5, 1.5, 0.0);

    let factor = |i: usize, total: f64| -> f64 {
        match options.reduction {
            Reduction::None => f64::from(g[i]),
            Reduction::Sum => f64::from(g[0]),
            Reduction::Mean if total == 0.0 => 0.0,
            Reduction::Mean => f64::from(g[0]) / total,
        }
    };
    let cw_r: Option<Vec<f64>> = class_weight
        .as_ref()
        .map(|w| w.iter().map(|&c| f64::from(c)).collect());
    let expected = reference(
        &xr,
        &wr,
        b.as_ref().map(|b| b.1.as_slice()),
        (n, h, v),
        &targets,
        cw_r.as_deref(),
        &options,
        dtype,
        factor,
    );

    // The op is defined on the backend's matmul. Where that runs at reduced precision
    // at f32 (TF32 tensor cores) at any of the op's shapes, every result inherits its
    // error: compare norm-wise.
    let reduced_matmul = (dtype == DType::F32)
        .then(|| matmul_error(&x, &w, &xr, &wr, (n, h, v), rng))
        .is_some_and(is_reduced_precision);

    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let b = b.map(|(b, _)| Tensor::<A<B>, 2>::from_inner(b).reshape([v]).require_grad());
    let t = Tensor::<A<B>, 1, Int>::from_data(TensorData::new(targets, [n]), device);
    let cw = class_weight.map(|c| Tensor::<A<B>, 1>::from_data(TensorData::new(c, [v]), device));
    let g_t = Tensor::<A<B>, 1>::from_data(TensorData::new(g.clone(), [g.len()]), device);
    poison::<B>(&[n * h, v * h, v], dtype, device);
    let (out, grads) = {
        let _chunk = ChunkOverride::set(chunk);
        let out =
            functional::fused_linear_cross_entropy(x.clone(), w.clone(), b.clone(), t, cw, options);
        let grads = (out.loss.clone() * g_t).sum().backward();
        (out, grads)
    };

    let loss_tol = Tolerance::for_dtype(dtype);
    let compare = |name: &'static str, a: &[f64], e: &[f64], tol: Tolerance| {
        if reduced_matmul {
            compare_normwise(name, a, e, TF32_NORMWISE)
        } else {
            compare(name, a, e, tol)
        }
    };
    let reduce = |values: &[f64]| -> Vec<f64> {
        match options.reduction {
            Reduction::None => values.to_vec(),
            Reduction::Sum => vec![values.iter().sum()],
            Reduction::Mean => {
                let total = expected.rows.weight_total;
                let s: f64 = values.iter().sum();
                vec![if total == 0.0 { 0.0 } else { s / total }]
            }
        }
    };
    let mut comparisons = vec![compare(
        "loss",
        &to_f64(out.loss.inner()),
        &reduce(&expected.rows.loss),
        loss_tol,
    )];
    if let Some(z) = out.z_loss {
        comparisons.push(compare(
            "z_loss",
            &to_f64(z.inner()),
            &reduce(&expected.rows.z_loss),
            loss_tol,
        ));
    }

    // Both sides times the same factor, so the gradients are of order one.
    let total = expected.rows.weight_total;
    let k_x = match options.reduction {
        Reduction::Mean if total > 0.0 => total / f64::from(g[0]),
        Reduction::Sum | Reduction::Mean => 1.0 / f64::from(g[0]),
        Reduction::None => 1.0,
    };
    let k_w = k_x * v as f64;
    let tol = Tolerance::for_dtype(dtype);
    let floor = storage_floor(dtype);
    let chunks = n.div_ceil(chunk.unwrap_or(n)) as f64;
    let mut check = |name: &'static str, actual: Vec<f64>, which: usize, k: f64| {
        let (exp, sums, terms) = match which {
            0 => (
                &expected.grad_x,
                &expected.sums[0],
                &expected.floor_terms[0],
            ),
            1 => (
                &expected.grad_w,
                &expected.sums[1],
                &expected.floor_terms[1],
            ),
            _ => (
                &expected.grad_b,
                &expected.sums[2],
                &expected.floor_terms[2],
            ),
        };
        let a: Vec<f64> = actual.iter().map(|v| v * k).collect();
        let e: Vec<f64> = exp.iter().map(|v| v * k).collect();
        // `compare_impl` allows `sum_rtol · scale[i]` on top of the tolerance.
        let scale: Vec<f64> = sums
            .iter()
            .zip(terms)
            .map(|(s, t)| s * k + floor * (t + chunks + 1.0) * k / tol.sum_rtol)
            .collect();
        comparisons.push(if reduced_matmul {
            compare_normwise(name, &a, &e, TF32_NORMWISE)
        } else {
            compare_impl(name, &a, &e, Some(&scale), tol)
        });
    };
    check("grad_x", to_f64(x.grad(&grads).expect("grad_x")), 0, k_x);
    check(
        "grad_weight",
        to_f64(w.grad(&grads).expect("grad_weight")),
        1,
        k_w,
    );
    if let Some(b) = b {
        check(
            "grad_bias",
            to_f64(b.grad(&grads).expect("grad_bias")),
            2,
            k_w,
        );
    }
    comparisons
}
