//! Conformance of the GLU-linear ops (`functional::swiglu_linear`, `geglu_linear`): the
//! gated MLP's down projection `(act(gate) · up) · W` on its gated unit, whose backward
//! recomputes the unit instead of keeping it. `rows` are tokens, `width` is the unit's
//! size `d_ff`; the projection has [`D_OUT`] outputs.
//!
//! The reference ([`reference`]) carries the rounding bound of the op's definition
//! (`bounded`): the unit `act(gate)·up` within its activation's f32 bound
//! ([`super::glu::activation`]) and stored to the dtype, the products accumulated in f32
//! and stored, the unit's gradient `g · Wᵀ` stored before the gated unit's backward reads
//! it. Inputs span `[-6, 6]` for the gate (both tails of the activations), `[-2, 2]` for
//! `up`; the upstream gradient is random.

use super::bounded::{Bounded, U32};
use super::glu::{Activation, activation};
use super::{Comparison, HostCase, Op, Rng, compare_all, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor};
use liger_burn::functional;
use liger_burn::ops::FusedOps;

/// Outputs of the projection (odd, so no tile divides it).
pub const D_OUT: usize = 40;

/// The shape sweep `(rows, d_ff)`: one row, odd sizes, Llama's and Qwen's `d_ff` in full.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 7), (3, 33), (37, 100), (300, 64), (5, 257)];
    if !quick {
        shapes.extend([(4096, 512), (1024, 2048), (64, 8960), (33, 14_336)]);
    }
    shapes
}

/// The inputs of a case as drawn.
pub struct Inputs {
    /// `[rows, d_ff]`.
    pub gate: Vec<f32>,
    /// `[rows, d_ff]`.
    pub up: Vec<f32>,
    /// `[d_ff, D_OUT]` (Burn's layout).
    pub w: Vec<f32>,
    /// `[rows, D_OUT]` upstream gradient.
    pub g: Vec<f32>,
}

/// Draws a case's inputs.
pub fn draw(rows: usize, d_ff: usize, rng: &mut Rng) -> Inputs {
    Inputs {
        gate: rng.vec(rows * d_ff, -6.0, 6.0, 0.0),
        up: rng.vec(rows * d_ff, -2.0, 2.0, 0.0),
        w: rng.vec(d_ff * D_OUT, -0.3, 0.3, 0.0),
        g: rng.vec(rows * D_OUT, -1.5, 1.5, 0.0),
    }
}

/// The output and the gradients of `gate`, `up` and the weight, with their bounds.
pub struct Reference {
    /// `[rows, D_OUT]`.
    pub y: Bounded,
    /// `[rows, d_ff]`.
    pub g_gate: Bounded,
    /// `[rows, d_ff]`.
    pub g_up: Bounded,
    /// `[d_ff, D_OUT]`.
    pub g_w: Bounded,
}

/// An elementwise result `v` whose f32 evaluation errs by `e`, stored to `dtype`.
fn elementwise(rows: usize, cols: usize, v: Vec<f64>, e: Vec<f64>, dtype: DType) -> Bounded {
    Bounded { rows, cols, v, e }.store(dtype)
}

/// The reference at `[rows, d_ff]` from inputs already rounded to `dtype` (`gate`, `up`:
/// `[rows, d_ff]`, `w`: `[d_ff, out]`, `g`: `[rows, out]`), for `op` `SwiGluLinear` or
/// `GeGluLinear`.
pub fn reference(
    op: Op,
    dtype: DType,
    (rows, d_ff, out): (usize, usize, usize),
    [gate, up, w, g]: [&[f64]; 4],
) -> Reference {
    let act_op = match op {
        Op::SwiGluLinear => Op::SwiGlu,
        Op::GeGluLinear => Op::GeGlu,
        other => unreachable!("{other:?} is not a GLU-linear op"),
    };
    let w = Bounded::exact(d_ff, out, w.to_vec());
    let g = Bounded::exact(rows, out, g.to_vec());
    let acts: Vec<Activation> = gate.iter().map(|&x| activation(act_op, x)).collect();
    // The unit, as the forward and the backward's recomputation store it.
    let (v, e): (Vec<f64>, Vec<f64>) = acts
        .iter()
        .zip(up)
        .map(|(a, u)| {
            let v = a.value * u;
            (v, u.abs() * a.value_error + U32 * v.abs())
        })
        .unzip();
    let unit = elementwise(rows, d_ff, v, e, dtype);
    let y = unit.mm(&w).store(dtype);
    let g_w = unit.t().mm(&g).store(dtype);
    // The unit's gradient, stored before the gated unit's backward reads it.
    let gu = g.mm(&w.t()).store(dtype);
    let (mut vg, mut eg, mut vu, mut eu) = (vec![], vec![], vec![], vec![]);
    for i in 0..rows * d_ff {
        let (a, u, x, ex) = (&acts[i], up[i], gu.v[i], gu.e[i]);
        let v = x * u * a.derivative;
        vg.push(v);
        eg.push(
            ex * (u * a.derivative).abs()
                + (x * u).abs() * a.derivative_error
                + 2.0 * U32 * v.abs(),
        );
        let v = x * a.value;
        vu.push(v);
        eu.push(ex * a.value.abs() + x.abs() * a.value_error + U32 * v.abs());
    }
    Reference {
        y,
        g_gate: elementwise(rows, d_ff, vg, eg, dtype),
        g_up: elementwise(rows, d_ff, vu, eu, dtype),
        g_w,
    }
}

fn expected(r: Reference) -> Vec<super::Expected> {
    vec![
        r.y.expected("output"),
        r.g_gate.expected("grad_gate"),
        r.g_up.expected("grad_up"),
        r.g_w.expected("grad_weight"),
    ]
}

/// See [`HostCase`]: the weight gradient is the one reduction over rows (`live` rows
/// keep their upstream gradient).
pub fn host_case(
    op: Op,
    rows: usize,
    d_ff: usize,
    dtype: DType,
    rng: &mut Rng,
    live: usize,
) -> HostCase {
    let inp = draw(rows, d_ff, rng);
    let r = |v: &[f32]| host_input(v, dtype);
    let (gate, up, w, g) = (r(&inp.gate), r(&inp.up), r(&inp.w), r(&inp.g));
    let shape = (rows, d_ff, D_OUT);
    let with = expected(reference(op, dtype, shape, [&gate, &up, &w, &g]));
    // Only the weight gradient sums over rows; the other tensors stay as they are.
    let mut g_live = g;
    g_live[live * D_OUT..].iter_mut().for_each(|x| *x = 0.0);
    let mut without = with.clone();
    without[3] = expected(reference(op, dtype, shape, [&gate, &up, &w, &g_live])).remove(3);
    HostCase {
        expected: with,
        without_last_rows: without,
    }
}

/// Runs `op` at `[rows, d_ff]` on `device` through `Autodiff<B>`, every input tracked.
pub fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    d_ff: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let inp = draw(rows, d_ff, rng);
    let (gate, gate_r) = input::<B>(inp.gate, vec![rows, d_ff], dtype, device);
    let (up, up_r) = input::<B>(inp.up, vec![rows, d_ff], dtype, device);
    let (w, w_r) = input::<B>(inp.w, vec![d_ff, D_OUT], dtype, device);
    let (g, g_r) = input::<B>(inp.g, vec![rows, D_OUT], dtype, device);
    let gate = Tensor::<A<B>, 2>::from_inner(gate).require_grad();
    let up = Tensor::<A<B>, 2>::from_inner(up).require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    poison::<B>(&[rows * D_OUT, rows * d_ff, d_ff * D_OUT], dtype, device);
    let y = match op {
        Op::SwiGluLinear => functional::swiglu_linear(gate.clone(), up.clone(), w.clone()),
        Op::GeGluLinear => functional::geglu_linear(gate.clone(), up.clone(), w.clone()),
        other => unreachable!("{other:?} is not a GLU-linear op"),
    };
    let grads = (y.clone() * Tensor::<A<B>, 2>::from_inner(g))
        .sum()
        .backward();
    let actual = vec![
        ("output", to_f64(y.inner())),
        ("grad_gate", to_f64(gate.grad(&grads).expect("grad_gate"))),
        ("grad_up", to_f64(up.grad(&grads).expect("grad_up"))),
        ("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))),
    ];
    let expected = expected(reference(
        op,
        dtype,
        (rows, d_ff, D_OUT),
        [&gate_r, &up_r, &w_r, &g_r],
    ));
    compare_all(actual, &expected)
}
