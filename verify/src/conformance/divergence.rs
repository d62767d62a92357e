//! Divergences between `[N, V]` distributions (`kl_div`, `jsd`, `tvd`) in the conformance
//! suite: the naive f64 reference with its error bounds, and the case runner.
//!
//! Every divergence is elementwise in `(input, target)` before its reduction, so the
//! reference evaluates each element's value and derivative in [`Tracked`] arithmetic (the
//! inputs exact: the dtype's values the device holds; each f32 operation's error), then
//! the reduction: an f32 sum of the elements (their errors independent, the accumulation)
//! times the reduction's factor; the gradient is each element's derivative times that
//! factor, stored in the dtype.

use super::bounds::{Expected, Terms, U32, flush, unit_roundoff};
use super::tracked::Tracked;
use super::{Comparison, HostCase, Op, Rng, compare_all, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{Divergence, DivergenceOptions, DivergenceReduction, FusedOps};

/// One element's value and derivative with respect to the input `x`, for the target `y`.
pub fn element(x: f64, y: f64, options: &DivergenceOptions) -> (Tracked, Tracked) {
    let (x, y) = (Tracked::exact(x), Tracked::exact(y));
    let Some(beta) = options.divergence.jsd_beta() else {
        let d = x.sub(y);
        let sign = if d.v > 0.0 { 0.5 } else { -0.5 };
        return (d.abs().scale(0.5), Tracked::exact(sign));
    };
    let (log_p, p) = if options.log_target {
        (y, y.exp())
    } else {
        (y.max(Tracked::constant(options.eps)).ln(), y)
    };
    if beta == 0.0 {
        return (p.mul(log_p.sub(x)), p.neg());
    }
    let q = x.exp();
    if beta == 1.0 {
        let kl = q.mul(x.sub(log_p));
        return (kl, kl.add(q));
    }
    let log_m = log_p
        .shift(beta.ln())
        .log_add_exp(x.shift((1.0 - beta).ln()));
    let student = q.mul(x.sub(log_m));
    let loss = p
        .mul(log_p.sub(log_m))
        .scale(beta)
        .add(student.scale(1.0 - beta));
    (loss, student.scale(1.0 - beta))
}

/// The reference of a divergence over `x`, `y` (`[n, v]`, the dtype's values), `labels`,
/// the upstream gradient `g` (one value, or one per element under no reduction).
pub fn expected(
    options: &DivergenceOptions,
    dtype: DType,
    (n, v): (usize, usize),
    x: &[f64],
    y: &[f64],
    labels: Option<&[i64]>,
    g: &[f64],
) -> Vec<Expected> {
    let u = unit_roundoff(dtype);
    let kept = |i: usize| labels.is_none_or(|l| l[i] != options.ignore_index);
    let rows = (0..n).filter(|&i| kept(i)).count() as f64;
    let factor = match options.reduction {
        DivergenceReduction::None | DivergenceReduction::Sum => Tracked::exact(1.0),
        DivergenceReduction::Mean => Tracked::exact(1.0).div(Tracked::exact(rows * v as f64)),
        DivergenceReduction::BatchMean => Tracked::exact(1.0).div(Tracked::exact(rows)),
    };
    let factor = if rows == 0.0 {
        Tracked::exact(0.0)
    } else {
        factor
    };
    let mut values = Vec::with_capacity(n * v);
    let mut value_bounds = Vec::with_capacity(n * v);
    let mut grads = Vec::with_capacity(n * v);
    let mut grad_bounds = Vec::with_capacity(n * v);
    let (mut sum, mut terms, mut errors) = (0.0, Terms::default(), Terms::default());
    for i in 0..n {
        for c in 0..v {
            let k = i * v + c;
            let (l, d) = if kept(i) {
                element(x[k], y[k], options)
            } else {
                (Tracked::exact(0.0), Tracked::exact(0.0))
            };
            values.push(l.v);
            value_bounds.push(l.e + U32 * l.v.abs());
            sum += l.v;
            terms.push(l.v);
            errors.push(l.e);
            let up = if g.len() == 1 { g[0] } else { g[k] };
            let scaled = d.mul(factor);
            let value = scaled.v * up;
            // Stored in the dtype, then (backward) multiplied by the upstream gradient in
            // f32 and stored again.
            grads.push(value);
            grad_bounds.push(
                scaled.e * up.abs()
                    + 2.0 * (u * value.abs() + flush(dtype, value))
                    + U32 * value.abs(),
            );
        }
    }
    let loss = match options.reduction {
        DivergenceReduction::None => Expected::new("loss", values, value_bounds, n),
        _ => {
            let total = Tracked::new(sum, errors.independent() + terms.accumulation()).mul(factor);
            Expected::new(
                "loss",
                vec![total.v],
                vec![total.e + U32 * total.v.abs()],
                1,
            )
        }
    };
    vec![loss, Expected::new("grad_input", grads, grad_bounds, n)]
}

impl Op {
    /// Whether this is one of the divergence variants.
    pub fn is_divergence(self) -> bool {
        matches!(self, Op::KlDiv | Op::KlDivNone | Op::Jsd | Op::Tvd)
    }
}

/// The sweep (`[rows, width]` distributions).
pub(crate) fn shapes(_op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 7), (37, 100), (3, 4097)];
    if !quick {
        shapes.extend([(64, 32_000), (16, 128_256)]);
    }
    shapes
}

fn options(op: Op) -> DivergenceOptions {
    match op {
        // PyTorch's kl_div with a probability target, batch mean.
        Op::KlDiv => DivergenceOptions::new(Divergence::ForwardKl).with_log_target(false),
        // Elementwise values (an upstream gradient per element), log-space target.
        Op::KlDivNone => {
            DivergenceOptions::new(Divergence::ForwardKl).with_reduction(DivergenceReduction::None)
        }
        // Liger-Kernel's LigerJSD with labels.
        Op::Jsd => DivergenceOptions::new(Divergence::Jsd { beta: 0.3 }),
        // The TVD summed, with labels.
        Op::Tvd => DivergenceOptions::new(Divergence::Tvd).with_reduction(DivergenceReduction::Sum),
        other => unreachable!("{other:?} is not a divergence"),
    }
}

fn labelled(op: Op) -> bool {
    matches!(op, Op::Jsd | Op::Tvd)
}

/// The inputs of a case: distributions from random logits with a peak per row (as real
/// logits have), in the space each divergence reads.
struct Inputs {
    x: Vec<f32>,
    y: Vec<f32>,
    labels: Vec<i64>,
    g: Vec<f32>,
}

fn distribution(n: usize, v: usize, log: bool, rng: &mut Rng) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * v);
    for _ in 0..n {
        let mut z: Vec<f64> = rng
            .vec(v, -2.0, 2.0, 0.0)
            .into_iter()
            .map(f64::from)
            .collect();
        z[rng.below(v)] += 2.0 + (v as f64).ln();
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|a| (a - m).exp()).sum::<f64>().ln();
        out.extend(z.iter().map(|a| {
            let l = a - lse;
            (if log { l } else { l.exp() }) as f32
        }));
    }
    out
}

fn draw(op: Op, n: usize, v: usize, rng: &mut Rng) -> Inputs {
    let o = options(op);
    let tvd = o.divergence == Divergence::Tvd;
    let x = distribution(n, v, !tvd, rng);
    let y = distribution(n, v, o.log_target, rng);
    let labels = (0..n)
        .map(|_| {
            if rng.uniform() < 0.2 {
                o.ignore_index
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let per_element = o.reduction == DivergenceReduction::None;
    let g = rng.vec(if per_element { n * v } else { 1 }, 0.5, 1.5, 0.0);
    Inputs { x, y, labels, g }
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
) -> HostCase {
    let inputs = draw(op, rows, width, rng);
    let (x, y) = (host_input(&inputs.x, dtype), host_input(&inputs.y, dtype));
    let labels = labelled(op).then_some(&inputs.labels[..]);
    let expected = expected(
        &options(op),
        dtype,
        (rows, width),
        &x,
        &y,
        labels,
        &f64s(&inputs.g),
    );
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

/// Runs a divergence variant on `[rows, width]`.
pub(crate) fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let (n, v) = (rows, width);
    let o = options(op);
    let inputs = draw(op, n, v, rng);
    let (x, xr) = input::<B>(inputs.x, vec![n, v], dtype, device);
    let (y, yr) = input::<B>(inputs.y, vec![n, v], dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let labels = labelled(op).then(|| {
        Tensor::<A<B>, 1, Int>::from_data(TensorData::new(inputs.labels.clone(), [n]), device)
    });
    let g =
        Tensor::<A<B>, 1>::from_data(TensorData::new(inputs.g.clone(), [inputs.g.len()]), device);
    poison::<B>(&[n * v, n * v], dtype, device);
    let loss = functional::divergence(x.clone(), Tensor::from_inner(y), labels, o);
    let grads = (loss.clone() * g).sum().backward();
    let actual = vec![
        ("loss", to_f64(loss.inner())),
        ("grad_input", to_f64(x.grad(&grads).expect("grad_input"))),
    ];
    let labels = labelled(op).then_some(&inputs.labels[..]);
    let expected = expected(&o, dtype, (n, v), &xr, &yr, labels, &f64s(&inputs.g));
    compare_all(actual, &expected)
}
