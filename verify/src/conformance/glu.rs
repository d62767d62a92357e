//! Conformance of the elementwise ops: SwiGLU, GeGLU, exact GELU and sigmoid, forward and
//! every gradient, against naive f64 references and against stock Burn compositions
//! (`activation::silu(gate) * up`, `activation::gelu_approximate(gate) * up`,
//! `activation::gelu` and its erf formula, `activation::sigmoid`), evaluated in f32 so
//! only the fused op's own rounding is measured.
//!
//! Inputs span `[-8, 8]`, where `tanh` and `sigmoid` saturate, so the tails of every
//! activation and derivative are exercised. Error bounds: [`activation`] and
//! [`expected_with_stock`].

use super::bounds::{U32, check, exp_error, flush, tanh_error, unit_roundoff};
use super::{Comparison, Expected, HostCase, Op, Rng, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::activation;
use burn::tensor::{DType, Tensor};
use core::f64::consts::PI;
use liger_burn::functional;
use liger_burn::ops::FusedOps;

/// The shape sweep: odd widths, one row, more elements than one launch's grid covers.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (1, 1),
        (1, 7),
        (3, 33),
        (37, 100),
        (2, 1000),
        (4, 4097),
        (300, 64),
        (70_000, 8),
    ];
    if !quick {
        shapes.extend([(4096, 4096), (1024, 14_336), (5, 14_337)]);
    }
    shapes
}

/// f64 references, written from the textbook formulas (not the kernels' forms).
pub mod reference {
    use super::PI;

    /// `erf(x)` to about 1e-15: `2/√π e^{-x²} Σ 2ⁿ x^{2n+1} / (1·3···(2n+1))`, a series
    /// of positive terms (no cancellation); `±1` beyond `|x| = 6` (`erfc(6) < 3e-17`).
    pub fn erf(x: f64) -> f64 {
        if x.abs() > 6.0 {
            return x.signum();
        }
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term.abs() > 1e-17 * sum.abs() && n < 500.0 {
            n += 1.0;
            term *= 2.0 * x * x / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / PI.sqrt() * (-x * x).exp() * sum
    }

    /// `1 / (1 + e^{-x})`.
    pub fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `x σ(x)` and its derivative.
    pub fn silu(x: f64) -> (f64, f64) {
        let s = sigmoid(x);
        (x * s, s + x * s * (1.0 - s))
    }

    /// PyTorch's `gelu(approximate="tanh")` and its derivative.
    pub fn gelu_tanh(x: f64) -> (f64, f64) {
        let k = (2.0 / PI).sqrt();
        let t = (k * (x + 0.044715 * x.powi(3))).tanh();
        let dt = (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
        (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * dt)
    }

    /// Exact GELU `x Φ(x)` and its derivative `Φ(x) + x φ(x)`.
    pub fn gelu(x: f64) -> (f64, f64) {
        let cdf = 0.5 * (1.0 + erf(x / 2f64.sqrt()));
        let pdf = (-0.5 * x * x).exp() / (2.0 * PI).sqrt();
        (x * cdf, cdf + x * pdf)
    }

    /// Gated unit `act(gate) * up` and its gradients `(grad_gate, grad_up)` for `grad`.
    pub fn glu(
        act: fn(f64) -> (f64, f64),
        grad: &[f64],
        gate: &[f64],
        up: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut out = Vec::with_capacity(gate.len());
        let mut grad_gate = Vec::with_capacity(gate.len());
        let mut grad_up = Vec::with_capacity(gate.len());
        for ((&g, &u), &dy) in gate.iter().zip(up).zip(grad) {
            let (a, da) = act(g);
            out.push(a * u);
            grad_gate.push(dy * u * da);
            grad_up.push(dy * a);
        }
        (out, grad_gate, grad_up)
    }

    /// `act(x)` and its gradient `grad * act'(x)`.
    pub fn unary(act: fn(f64) -> (f64, f64), grad: &[f64], x: &[f64]) -> (Vec<f64>, Vec<f64>) {
        x.iter()
            .zip(grad)
            .map(|(&v, &dy)| {
                let (a, da) = act(v);
                (a, dy * da)
            })
            .unzip()
    }

    /// `σ(x)` with its derivative.
    pub fn sigmoid_pair(x: f64) -> (f64, f64) {
        let s = sigmoid(x);
        (s, s * (1.0 - s))
    }
}

type A<B> = Autodiff<B>;

/// An activation's value and derivative at `x`, with the error bounds of evaluating each
/// in f32, and the extra error of stock Burn's formula where it differs.
pub struct Activation {
    /// `act(x)`.
    pub value: f64,
    /// `act'(x)`.
    pub derivative: f64,
    /// Largest error of `act(x)` evaluated in f32 (absolute).
    pub value_error: f64,
    /// Largest error of `act'(x)` evaluated in f32 (absolute).
    pub derivative_error: f64,
    /// Added to `value_error` for stock Burn's f32 composition (its `erf`).
    pub stock_value_error: f64,
    /// Added to `derivative_error` for stock Burn's f32 composition.
    pub stock_derivative_error: f64,
}

/// `(√(2/π), 0.044715)` of the tanh GELU.
const GELU_TANH: (f64, f64) = (0.797_884_560_802_865_4, 0.044715);

/// Abramowitz and Stegun's 7.1.26, stock Burn's `erf` on CubeCL devices: absolute error
/// at most 1.5e-7.
const STOCK_ERF_ERROR: f64 = 1.5e-7;

/// `op`'s activation at `x` with its f32 error bounds ([`U32`] = 2⁻²⁴, `E(y)` =
/// [`exp_error`], `T(y)` = [`tanh_error`]); each covers the fused kernels' forms and the
/// textbook forms of the compositions (stock ops on NdArray, stock Burn):
/// - sigmoid `σ = 1/(1 + e⁻ˣ)` (or `e^(−|x|)/(1 + e^(−|x|))`): `E(x) + 4u₃₂` relative;
///   `σ(1 − σ)`: twice that plus one operation, and `2u₃₂σ` for `1 − σ` formed by
///   cancellation.
/// - SiLU `xσ`: one more operation; `σ + xσ(1 − σ)`: `E(x) + 8u₃₂` on the magnitudes
///   `σ + |x|σ(1 − σ)`, and `2u₃₂|x|σ` for `1 − σ` by cancellation.
/// - tanh GELU `½x(1 + tanh a)`, `a = √(2/π)(x + 0.044715x³)`, computed as `xσ(2a)`:
///   `E(2a) + 8u₃₂|a| + 6u₃₂` relative (the argument's own error through `σ`), and
///   `½|x|T(a)` absolute for `1 + tanh a` formed by cancellation. Its derivative: the same
///   relative error on its terms' magnitudes, and `T(a)` times the magnitude of what
///   multiplies `1 + t` and `1 − t²`.
/// - exact GELU `xΦ(x)`: `E(x²/2) + 6u₃₂` relative (`Φ` from an `erfc` within 2 ulp), and
///   `u₃₂|x|` for `1 + erf` by cancellation; its derivative `Φ + xφ` likewise. Stock
///   Burn's `erf` adds [`STOCK_ERF_ERROR`].
pub fn activation(op: Op, x: f64) -> Activation {
    use reference::*;
    let s = sigmoid(x);
    match op {
        Op::Sigmoid => Activation {
            value: s,
            derivative: s * (1.0 - s),
            value_error: (exp_error(x) + 4.0 * U32) * s,
            derivative_error: (2.0 * exp_error(x) + 9.0 * U32) * s * (1.0 - s) + 2.0 * U32 * s,
            stock_value_error: 0.0,
            stock_derivative_error: 0.0,
        },
        Op::SwiGlu => {
            let (v, d) = silu(x);
            let mag = s + x.abs() * s * (1.0 - s);
            Activation {
                value: v,
                derivative: d,
                value_error: (exp_error(x) + 5.0 * U32) * v.abs(),
                derivative_error: (exp_error(x) + 8.0 * U32) * mag + 2.0 * U32 * x.abs() * s,
                stock_value_error: 0.0,
                stock_derivative_error: 0.0,
            }
        }
        Op::GeGlu => {
            let (v, d) = gelu_tanh(x);
            let (k, c) = GELU_TANH;
            let a = k * (x + c * x.powi(3));
            let t = a.tanh();
            let da = k * (1.0 + 3.0 * c * x * x);
            let rel = exp_error(2.0 * a) + 8.0 * U32 * a.abs() + 10.0 * U32;
            let mag = 0.5 * (1.0 + t.abs()) + 0.5 * x.abs() * (1.0 - t * t) * da;
            Activation {
                value: v,
                derivative: d,
                value_error: rel * v.abs() + 0.5 * x.abs() * tanh_error(a),
                derivative_error: rel * mag + tanh_error(a) * (0.5 + x.abs() * da),
                stock_value_error: 0.0,
                stock_derivative_error: 0.0,
            }
        }
        Op::Gelu => {
            let (v, d) = gelu(x);
            let rel = exp_error(x * x / 2.0) + 6.0 * U32;
            let cdf = 0.5 * (1.0 + erf(x / 2f64.sqrt()));
            let pdf = (-0.5 * x * x).exp() / (2.0 * PI).sqrt();
            Activation {
                value: v,
                derivative: d,
                value_error: rel * v.abs() + U32 * x.abs(),
                derivative_error: rel * (cdf + x.abs() * pdf) + 2.0 * U32,
                stock_value_error: 0.5 * x.abs() * STOCK_ERF_ERROR,
                stock_derivative_error: 0.5 * STOCK_ERF_ERROR * (1.0 + x.abs()),
            }
        }
        other => unreachable!("{other:?} is not an elementwise op"),
    }
}

/// The inputs of an elementwise case, as drawn: `x` (the gate of a gated unit) in
/// `[-8, 8]`, `up` in `[-2, 2]` (gated units), the upstream gradient in `[-1.5, 1.5]`.
struct Inputs {
    x: Vec<f32>,
    up: Vec<f32>,
    g: Vec<f32>,
}

fn draw(op: Op, n: usize, rng: &mut Rng) -> Inputs {
    let x = rng.vec(n, -8.0, 8.0, 0.0);
    let g = rng.vec(n, -1.5, 1.5, 0.0);
    let up = if matches!(op, Op::SwiGlu | Op::GeGlu) {
        rng.vec(n, -2.0, 2.0, 0.0)
    } else {
        vec![]
    };
    Inputs { x, up, g }
}

/// The reference of an elementwise case from its rounded inputs (`x` the gate of a gated
/// unit, `up` empty for the unary ops, `g` the upstream gradient), each tensor viewed as
/// `[rows, len / rows]`: the output and the input gradients with their bounds, and the
/// bounds against stock Burn's f32 composition.
///
/// Bounds: each stored result is off by its store `u|e|` and flush, plus the f32 error
/// of its formula: the activation's ([`activation`]) times the exact factors multiplying
/// it (`up`, `g`), plus one f32 operation per product. The sigmoid's gradient is computed
/// from the forward's output as stored (Burn's `sigmoid_backward`), which adds that
/// store's error through `σ(1 − σ)`.
pub fn expected_with_stock(
    op: Op,
    dtype: DType,
    rows: usize,
    x: &[f64],
    up: &[f64],
    g: &[f64],
) -> (Vec<Expected>, Vec<Vec<f64>>) {
    let u = unit_roundoff(dtype);
    let store = |e: f64, f32_error: f64| u * e.abs() + f32_error + flush(dtype, e);
    let gated = !up.is_empty();
    let n = x.len();
    let mut columns = vec![vec![0.0; n]; 9];
    for i in 0..n {
        let mut a = activation(op, x[i]);
        if op == Op::Sigmoid {
            // Burn's sigmoid backward takes the forward's stored output `ŷ`: `σ(1 − σ)`
            // from `ŷ` rounded to the dtype is off by `|1 − 2σ|·δŷ`.
            let s = a.value;
            a.derivative_error += (1.0 - 2.0 * s).abs() * (u * s + flush(dtype, s));
        }
        let (y, dgate, dup) = if gated {
            (a.value * up[i], g[i] * up[i] * a.derivative, g[i] * a.value)
        } else {
            (a.value, g[i] * a.derivative, 0.0)
        };
        let upm = if gated { up[i].abs() } else { 1.0 };
        let ops = if gated { 1.0 } else { 0.0 };
        let by = store(y, upm * a.value_error + ops * U32 * y.abs());
        let bg = store(
            dgate,
            (g[i] * upm).abs() * a.derivative_error + (1.0 + ops) * U32 * dgate.abs(),
        );
        let bu = store(dup, g[i].abs() * a.value_error + U32 * dup.abs());
        columns[0][i] = y;
        columns[1][i] = by;
        columns[2][i] = dgate;
        columns[3][i] = bg;
        columns[4][i] = dup;
        columns[5][i] = bu;
        columns[6][i] = by + upm * (a.value_error + a.stock_value_error);
        columns[7][i] = bg + (g[i] * upm).abs() * (a.derivative_error + a.stock_derivative_error);
        columns[8][i] = bu + g[i].abs() * (a.value_error + a.stock_value_error);
    }
    let take = |k: usize, c: &mut Vec<Vec<f64>>| std::mem::take(&mut c[k]);
    let mut expected = vec![Expected::new(
        "output",
        take(0, &mut columns),
        take(1, &mut columns),
        rows,
    )];
    if gated {
        expected.push(Expected::new(
            "grad_gate",
            take(2, &mut columns),
            take(3, &mut columns),
            rows,
        ));
        expected.push(Expected::new(
            "grad_up",
            take(4, &mut columns),
            take(5, &mut columns),
            rows,
        ));
    } else {
        expected.push(Expected::new(
            "grad_x",
            take(2, &mut columns),
            take(3, &mut columns),
            rows,
        ));
    }
    let stock = if gated {
        vec![
            take(6, &mut columns),
            take(7, &mut columns),
            take(8, &mut columns),
        ]
    } else {
        vec![take(6, &mut columns), take(7, &mut columns)]
    };
    (expected, stock)
}

/// See [`super::host_case`]: no reduction over rows here.
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
    _live: usize,
) -> HostCase {
    let inputs = draw(op, rows * width, rng);
    let (x, up, g) = (
        host_input(&inputs.x, dtype),
        host_input(&inputs.up, dtype),
        host_input(&inputs.g, dtype),
    );
    let (expected, _) = expected_with_stock(op, dtype, rows, &x, &up, &g);
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

fn leaf<B: FusedOps>(t: &Tensor<B, 2>) -> Tensor<A<B>, 2> {
    Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad()
}

/// The stock-Burn side: f32 leaves holding the same (rounded) values.
fn leaf_f32<B: FusedOps>(t: &Tensor<B, 2>) -> Tensor<A<B>, 2> {
    Tensor::<A<B>, 2>::from_inner(t.clone().cast(DType::F32)).require_grad()
}

/// Runs one of [`Op::SwiGlu`], [`Op::GeGlu`], [`Op::Gelu`], [`Op::Sigmoid`] at
/// `[rows, width]`; returns every comparison: against the f64 reference, and against
/// stock Burn's f32 composition (within the reference's bound plus stock's own error).
pub(super) fn run_case<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    let n = rows * width;
    let shape = vec![rows, width];
    let inputs = draw(op, n, rng);
    let (x, xr) = input::<B>(inputs.x, shape.clone(), dtype, device);
    let (g, gr) = input::<B>(inputs.g, shape.clone(), dtype, device);
    let mut out = Vec::new();
    match op {
        Op::SwiGlu | Op::GeGlu => {
            let (up, upr) = input::<B>(inputs.up, shape, dtype, device);
            let (gate_ad, up_ad) = (leaf(&x), leaf(&up));
            poison::<B>(&[n, n, n, n], dtype, device);
            let y = if op == Op::SwiGlu {
                functional::swiglu(gate_ad.clone(), up_ad.clone())
            } else {
                functional::geglu(gate_ad.clone(), up_ad.clone())
            };
            let grads = (y.clone() * Tensor::from_inner(g.clone())).sum().backward();
            let y = to_f64(y.inner());
            let dgate = to_f64(gate_ad.grad(&grads).unwrap());
            let dup = to_f64(up_ad.grad(&grads).unwrap());
            let (expected, stock) = expected_with_stock(op, dtype, rows, &xr, &upr, &gr);
            out.push(expected[0].check(&y));
            out.push(expected[1].check(&dgate));
            out.push(expected[2].check(&dup));

            let (gate_s, up_s) = (leaf_f32(&x), leaf_f32(&up));
            let act_s = if op == Op::SwiGlu {
                activation::silu(gate_s.clone())
            } else {
                activation::gelu_approximate(gate_s.clone())
            };
            let y_s = act_s * up_s.clone();
            let g_s = Tensor::<A<B>, 2>::from_inner(g.cast(DType::F32));
            let grads = (y_s.clone() * g_s).sum().backward();
            out.push(check("output_vs_burn", &y, &to_f64(y_s.inner()), &stock[0]));
            out.push(check(
                "grad_gate_vs_burn",
                &dgate,
                &to_f64(gate_s.grad(&grads).unwrap()),
                &stock[1],
            ));
            out.push(check(
                "grad_up_vs_burn",
                &dup,
                &to_f64(up_s.grad(&grads).unwrap()),
                &stock[2],
            ));
        }
        Op::Gelu | Op::Sigmoid => {
            let x_ad = leaf(&x);
            poison::<B>(&[n, n, n], dtype, device);
            let y = if op == Op::Gelu {
                functional::gelu(x_ad.clone())
            } else {
                functional::sigmoid(x_ad.clone())
            };
            let grads = (y.clone() * Tensor::from_inner(g.clone())).sum().backward();
            let y = to_f64(y.inner());
            let dx = to_f64(x_ad.grad(&grads).unwrap());
            let (expected, stock) = expected_with_stock(op, dtype, rows, &xr, &[], &gr);
            out.push(expected[0].check(&y));
            out.push(expected[1].check(&dx));

            let x_s = leaf_f32(&x);
            let y_s = if op == Op::Gelu {
                activation::gelu(x_s.clone())
            } else {
                activation::sigmoid(x_s.clone())
            };
            out.push(check(
                "output_vs_burn",
                &y,
                &to_f64(y_s.clone().inner()),
                &stock[0],
            ));
            // Stock `gelu`'s backward differentiates the tanh approximation (up to ~9e-4
            // off); the exact derivative of stock Burn is that of its erf formula.
            let y_s = if op == Op::Gelu {
                let erf = (x_s.clone() * core::f64::consts::FRAC_1_SQRT_2).erf();
                x_s.clone() * (erf + 1.0) * 0.5
            } else {
                y_s
            };
            let g_s = Tensor::<A<B>, 2>::from_inner(g.cast(DType::F32));
            let grads = (y_s * g_s).sum().backward();
            out.push(check(
                "grad_x_vs_burn",
                &dx,
                &to_f64(x_s.grad(&grads).unwrap()),
                &stock[1],
            ));
        }
        other => unreachable!("{other:?} is not an elementwise op"),
    }
    out
}
