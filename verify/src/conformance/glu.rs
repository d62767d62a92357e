//! Conformance of the elementwise ops: SwiGLU, GeGLU, exact GELU and sigmoid, forward and
//! every gradient, against naive f64 references and against stock Burn compositions
//! (`activation::silu(gate) * up`, `activation::gelu_approximate(gate) * up`,
//! `activation::gelu` and its erf formula, `activation::sigmoid`), evaluated in f32 so
//! only the fused op's own rounding is measured.
//!
//! Inputs span `[-8, 8]`, where `tanh` and `sigmoid` saturate, so the tails of every
//! activation and derivative are exercised.

use super::{Comparison, Op, Rng, Tolerance, compare, input, poison, to_f64};
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

fn leaf<B: FusedOps>(t: &Tensor<B, 2>) -> Tensor<A<B>, 2> {
    Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad()
}

/// The stock-Burn side: f32 leaves holding the same (rounded) values.
fn leaf_f32<B: FusedOps>(t: &Tensor<B, 2>) -> Tensor<A<B>, 2> {
    Tensor::<A<B>, 2>::from_inner(t.clone().cast(DType::F32)).require_grad()
}

/// Runs one of [`Op::SwiGlu`], [`Op::GeGlu`], [`Op::Gelu`], [`Op::Sigmoid`] at
/// `[rows, width]`; returns every comparison.
pub(super) fn run_case<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    let tol = Tolerance::for_dtype(dtype);
    let n = rows * width;
    let shape = vec![rows, width];
    let (x, xr) = input::<B>(rng.vec(n, -8.0, 8.0, 0.0), shape.clone(), dtype, device);
    let (g, gr) = input::<B>(rng.vec(n, -1.5, 1.5, 0.0), shape.clone(), dtype, device);
    let mut out = Vec::new();
    match op {
        Op::SwiGlu | Op::GeGlu => {
            let (up, upr) = input::<B>(rng.vec(n, -2.0, 2.0, 0.0), shape, dtype, device);
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

            let act = if op == Op::SwiGlu {
                reference::silu
            } else {
                reference::gelu_tanh
            };
            let (yr, dgr, dur) = reference::glu(act, &gr, &xr, &upr);
            out.push(compare("output", &y, &yr, tol));
            out.push(compare("grad_gate", &dgate, &dgr, tol));
            out.push(compare("grad_up", &dup, &dur, tol));

            let (gate_s, up_s) = (leaf_f32(&x), leaf_f32(&up));
            let act_s = if op == Op::SwiGlu {
                activation::silu(gate_s.clone())
            } else {
                activation::gelu_approximate(gate_s.clone())
            };
            let y_s = act_s * up_s.clone();
            let g_s = Tensor::<A<B>, 2>::from_inner(g.cast(DType::F32));
            let grads = (y_s.clone() * g_s).sum().backward();
            out.push(compare("output_vs_burn", &y, &to_f64(y_s.inner()), tol));
            out.push(compare(
                "grad_gate_vs_burn",
                &dgate,
                &to_f64(gate_s.grad(&grads).unwrap()),
                tol,
            ));
            out.push(compare(
                "grad_up_vs_burn",
                &dup,
                &to_f64(up_s.grad(&grads).unwrap()),
                tol,
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
            let act = if op == Op::Gelu {
                reference::gelu
            } else {
                reference::sigmoid_pair
            };
            let (yr, dxr) = reference::unary(act, &gr, &xr);
            out.push(compare("output", &y, &yr, tol));
            out.push(compare("grad_x", &dx, &dxr, tol));

            let x_s = leaf_f32(&x);
            let y_s = if op == Op::Gelu {
                activation::gelu(x_s.clone())
            } else {
                activation::sigmoid(x_s.clone())
            };
            out.push(compare(
                "output_vs_burn",
                &y,
                &to_f64(y_s.clone().inner()),
                tol,
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
            out.push(compare(
                "grad_x_vs_burn",
                &dx,
                &to_f64(x_s.grad(&grads).unwrap()),
                tol,
            ));
        }
        other => unreachable!("{other:?} is not an elementwise op"),
    }
    out
}
