//! Cross entropy in the conformance suite: the naive f64 reference and the case runner.
//!
//! Gradients are compared after multiplying both sides by `V · W / g` (mean), `V / g`
//! (sum) or `V / g_i` (none, per row), `g` being the random upstream gradient: a mean
//! over many rows of a wide softmax has elements of order `1 / (W · V)`, far below any
//! absolute tolerance, while the rescaled ones are of order 1, so the dtype tolerances
//! measure the kernel's actual error. The factor is exact in f64 and the same on both sides.

use super::{Comparison, Op, Rng, Tolerance, compare, compare_impl, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction};

/// The absolute floor of the gradient's storage: twice the smallest normal of `dtype`.
///
/// The gradient is stored in the logits dtype, then (for an upstream gradient other than
/// 1) multiplied and stored again. Values below the smallest normal are subnormal, which
/// devices may flush to zero (Vulkan does by default, and lavapipe does for f16), so each
/// of the two stores can lose up to the smallest normal. A mean over many rows of a wide
/// softmax puts many f16 gradients there (`p_c / W` below f16's 6.1e-5), where no
/// relative tolerance can hold for any implementation.
pub(crate) fn storage_floor(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2.0 * 2f64.powi(-14),
        _ => 2.0 * 2f64.powi(-126),
    }
}

/// The per-row values of the reference.
#[derive(Clone, Debug)]
pub struct CrossEntropyReference {
    /// `loss_i = ce_i + zl_i` (0 on ignored rows).
    pub loss: Vec<f64>,
    /// `zl_i = λ lse_i²` (0 on ignored rows).
    pub z_loss: Vec<f64>,
    /// `∂loss_i/∂x_i`, `[N, V]` (zero rows for ignored rows).
    pub grad: Vec<f64>,
    /// `Σ_{non-ignored} w[y_i]`, the mean's denominator.
    pub weight_total: f64,
}

/// Naive f64 cross entropy, straight from the definitions on
/// [`CrossEntropyOptions`]: rows of `x: [N, V]`, `targets: [N]`, optional `weight: [V]`.
pub fn reference(
    x: &[f64],
    v: usize,
    targets: &[i64],
    weight: Option<&[f64]>,
    options: &CrossEntropyOptions,
) -> CrossEntropyReference {
    let n = targets.len();
    let eps = options.label_smoothing;
    let lambda = options.lse_square_scale;
    let w = |c: usize| weight.map_or(1.0, |w| w[c]);
    let mut out = CrossEntropyReference {
        loss: vec![0.0; n],
        z_loss: vec![0.0; n],
        grad: vec![0.0; n * v],
        weight_total: 0.0,
    };
    for i in 0..n {
        let t = targets[i];
        if t == options.ignore_index || t < 0 || t >= v as i64 {
            continue;
        }
        let y = t as usize;
        let row = &x[i * v..(i + 1) * v];
        let (z, chain): (Vec<f64>, Vec<f64>) = row
            .iter()
            .map(|&xc| match options.softcap {
                Some(c) => {
                    let th = (xc / c).tanh();
                    (c * th, 1.0 - th * th)
                }
                None => (xc, 1.0),
            })
            .unzip();
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|zc| (zc - m).exp()).sum::<f64>().ln();
        let p: Vec<f64> = z.iter().map(|zc| (zc - lse).exp()).collect();
        let sum_w: f64 = (0..v).map(w).sum();
        let smooth: f64 = (0..v).map(|c| w(c) * (lse - z[c])).sum();
        let ce = (1.0 - eps) * w(y) * (lse - z[y]) + eps / v as f64 * smooth;
        let zl = lambda * lse * lse;
        out.loss[i] = ce + zl;
        out.z_loss[i] = zl;
        out.weight_total += w(y);
        for c in 0..v {
            let delta = if c == y { 1.0 } else { 0.0 };
            let dz = (1.0 - eps) * w(y) * (p[c] - delta)
                + eps / v as f64 * (p[c] * sum_w - w(c))
                + 2.0 * lambda * lse * p[c];
            out.grad[i * v + c] = dz * chain[c];
        }
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
        Op::CrossEntropyZLossSoftcap => Variant {
            options: base
                .with_lse_square_scale(1e-2)
                .with_softcap(Some(7.5))
                .with_return_z_loss(true),
            weighted: false,
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

/// Runs a cross-entropy variant at `[rows, V = width]`: loss, z-loss and the logits
/// gradient (random upstream gradient) against [`reference`].
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
    let Variant {
        options,
        weighted,
        ignored,
        range,
    } = variant(op, v);
    let (x, xr) = input::<B>(rng.vec(n, -range, range, 0.0), vec![rows, v], dtype, device);
    let targets: Vec<i64> = (0..rows)
        .map(|_| {
            if rng.uniform() < ignored {
                options.ignore_index
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let weight: Option<Vec<f32>> = weighted.then(|| rng.vec(v, 0.5, 2.0, 0.0));
    let weight_r: Option<Vec<f64>> = weight
        .as_ref()
        .map(|w| w.iter().map(|&c| f64::from(c)).collect());
    let expected = reference(&xr, v, &targets, weight_r.as_deref(), &options);

    let t = Tensor::<A<B>, 1, Int>::from_data(TensorData::new(targets.clone(), [rows]), device);
    let w = weight.map(|w| Tensor::<A<B>, 1>::from_data(TensorData::new(w, [v]), device));
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    // Random upstream gradient: a scalar away from 1 for mean/sum, one per row for none.
    let per_row = options.reduction == Reduction::None;
    // Under none every third row gets exactly 1 (the scale the forward applied): the
    // backward leaves those rows as they are and rescales the others.
    let mut g: Vec<f32> = rng.vec(if per_row { rows } else { 1 }, 0.5, 1.5, 0.0);
    if per_row {
        g.iter_mut().step_by(3).for_each(|gi| *gi = 1.0);
    }
    let g_t = Tensor::<A<B>, 1>::from_data(TensorData::new(g.clone(), [g.len()]), device);
    poison::<B>(&[n], dtype, device);
    poison::<B>(&[rows, rows], DType::F32, device);
    // Most variants get logits computed from `x` (as a model's are), which the loss then
    // owns alone: the fused kernels write the gradient over them. The others get the leaf
    // itself, which the test holds: the gradient goes to a new buffer.
    let in_place = !matches!(op, Op::CrossEntropyZLossSoftcap | Op::CrossEntropySum);
    let logits = if in_place { x.clone() * 1.0 } else { x.clone() };
    let out = functional::cross_entropy(logits, t, w, options);
    let grads = (out.loss.clone() * g_t).sum().backward();
    let grad = to_f64(x.grad(&grads).expect("logits gradient"));

    let tol = Tolerance::for_dtype(dtype);
    // Losses are f32 outputs computed in f32 from the (rounded) inputs.
    let loss_tol = Tolerance::for_dtype(DType::F32);
    let reduce = |per_row_values: &[f64]| -> Vec<f64> {
        match options.reduction {
            Reduction::None => per_row_values.to_vec(),
            Reduction::Sum => vec![per_row_values.iter().sum()],
            Reduction::Mean => {
                let total: f64 = per_row_values.iter().sum();
                let w = expected.weight_total;
                vec![if w == 0.0 { 0.0 } else { total / w }]
            }
        }
    };
    let mut comparisons = vec![compare(
        "loss",
        &to_f64(out.loss.inner()),
        &reduce(&expected.loss),
        loss_tol,
    )];
    if let Some(z) = out.z_loss {
        comparisons.push(compare(
            "z_loss",
            &to_f64(z.inner()),
            &reduce(&expected.z_loss),
            loss_tol,
        ));
    }
    // `grad = ∂loss_i/∂x · factor_i`; compare `grad · V / factor_i` (see the module docs).
    let factor = |i: usize| -> f64 {
        match options.reduction {
            Reduction::None => f64::from(g[i]),
            Reduction::Sum => f64::from(g[0]),
            Reduction::Mean if expected.weight_total == 0.0 => 0.0,
            Reduction::Mean => f64::from(g[0]) / expected.weight_total,
        }
    };
    let spacing = storage_floor(dtype);
    let mut actual_scaled = vec![0.0; n];
    let mut expected_scaled = vec![0.0; n];
    let mut floor = vec![0.0; n];
    for i in 0..rows {
        let f = factor(i);
        for c in 0..v {
            let k = i * v + c;
            // An all-ignored mean has no gradient to rescale: compare the raw zeros.
            let (a, e, fl) = if f == 0.0 {
                (grad[k], 0.0, spacing)
            } else {
                let scale = v as f64 / f;
                (
                    grad[k] * scale,
                    expected.grad[k] * v as f64,
                    spacing * scale,
                )
            };
            actual_scaled[k] = a;
            expected_scaled[k] = e;
            // `compare_impl` allows `sum_rtol · scale[k]` on top of the tolerance.
            floor[k] = fl / tol.sum_rtol;
        }
    }
    comparisons.push(compare_impl(
        "grad_logits (x V/g)",
        &actual_scaled,
        &expected_scaled,
        Some(&floor),
        tol,
    ));
    comparisons
}
