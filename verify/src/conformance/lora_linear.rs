//! Conformance of `functional::lora_linear`, a linear layer with a LoRA adapter and its
//! base frozen: `y = x·W + b + s·(x_a·Aᵀ)·Bᵀ`, with the gradients of `x`, of the adapter's
//! separate input `x_a` (a dropout's output) when it has one, of `A` and of `B`. `rows`
//! are tokens, `width` is `d_in`; `d_out` and the rank come from [`CASES`].
//!
//! Two variants:
//! - [`Op::LoraLinear`]: PEFT's mixed precision (the adapter path in f32 from `A`, `B` in
//!   f32, [`AdapterPrecision::F32`]), a bias, the adapter reading the layer's input;
//! - [`Op::LoraLinearDropout`]: the adapter path in the activations' dtype
//!   ([`AdapterPrecision::Activation`]), no bias, a separate adapter input.
//!
//! The reference ([`reference`]) carries the rounding bound of the op's definition
//! (`bounded`): the base product stored in the activations' dtype, as the frozen layer's
//! output is; the rank-r product stored in the compute dtype, scaled and stored again; the
//! adapter's output stored in the compute dtype and added to the base in the activations'
//! dtype. In the backward, the upstream gradient's products with `B` (scaled) and `W`
//! stored in their dtypes, and the input gradient's two paths summed (in f32 when the
//! adapter reads `x`) and rounded once.

use super::bounded::Bounded;
use super::{Comparison, Expected, HostCase, Op, Rng, compare_all, host_input, input, poison};
use super::{round_to, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor};
use liger_burn::functional;
use liger_burn::ops::{AdapterPrecision, FusedOps, LoraOptions};

/// `s` (`alpha / r`, or rsLoRA's `alpha / √r`): not a power of two, so the scaling rounds.
pub const SCALE: f64 = 1.75;

/// One shape of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraShape {
    /// Tokens.
    pub rows: usize,
    /// Input features.
    pub d_in: usize,
    /// Output features.
    pub d_out: usize,
    /// The adapter's rank.
    pub rank: usize,
}

const fn shape(rows: usize, d_in: usize, d_out: usize, rank: usize) -> LoraShape {
    LoraShape {
        rows,
        d_in,
        d_out,
        rank,
    }
}

/// The quick sweep: one token, rank 1, sizes no tile divides.
pub const CASES: &[LoraShape] = &[
    shape(1, 7, 5, 1),
    shape(3, 33, 29, 4),
    shape(37, 100, 45, 8),
    shape(300, 64, 130, 16),
    shape(5, 257, 33, 6),
];

/// The full sweep adds the models' projections at rank 64: Llama-3.2-1B's k/v at 4K
/// tokens and q/o at 1K, Llama-3-8B's down projection and Qwen2.5-1.5B's gate/up on a
/// few tokens.
pub const FULL_CASES: &[LoraShape] = &[
    shape(4096, 2048, 512, 64),
    shape(1024, 2048, 2048, 64),
    shape(64, 14_336, 4096, 64),
    shape(33, 1536, 8960, 64),
];

/// `(rows, d_in)` of every case of the sweep.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let full = if quick { &[][..] } else { FULL_CASES };
    CASES.iter().chain(full).map(|c| (c.rows, c.d_in)).collect()
}

/// The case of `(rows, d_in)`: from the tables, else `d_out = d_in + 3` at rank 4.
pub fn shape_of(rows: usize, d_in: usize) -> LoraShape {
    CASES
        .iter()
        .chain(FULL_CASES)
        .find(|c| c.rows == rows && c.d_in == d_in)
        .copied()
        .unwrap_or(shape(rows, d_in, d_in + 3, 4))
}

/// The layer's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The activations' dtype (of `x`, `W`, the bias and the output).
    pub dtype: DType,
    /// Where the adapter path computes.
    pub precision: AdapterPrecision,
    /// With a bias.
    pub bias: bool,
    /// The adapter reads a separate input.
    pub separate: bool,
}

/// `op`'s variant in `dtype`.
pub fn variant(op: Op, dtype: DType) -> Variant {
    let (precision, bias, separate) = match op {
        Op::LoraLinear => (AdapterPrecision::F32, true, false),
        Op::LoraLinearDropout => (AdapterPrecision::Activation, false, true),
        other => unreachable!("{other:?} is not a LoRA op"),
    };
    Variant {
        dtype,
        precision,
        bias,
        separate,
    }
}

/// A case's inputs as drawn (f32, before rounding).
#[derive(Clone, Debug)]
pub struct Inputs {
    /// `[rows, d_in]`.
    pub x: Vec<f32>,
    /// `[rows, d_in]`, the separate adapter input.
    pub xa: Vec<f32>,
    /// `[d_in, d_out]` (Burn's layout).
    pub w: Vec<f32>,
    /// `[d_out]`.
    pub b: Vec<f32>,
    /// `[rank, d_in]` (PEFT's `lora_A.weight`).
    pub a: Vec<f32>,
    /// `[d_out, rank]` (PEFT's `lora_B.weight`).
    pub bb: Vec<f32>,
    /// `[rows, d_out]` upstream gradient.
    pub g: Vec<f32>,
}

/// Draws a case's inputs; the weights scaled by `1/√fan_in`, as initialized layers are, so
/// outputs and gradients stay of order one at every size.
pub fn draw(s: LoraShape, rng: &mut Rng) -> Inputs {
    let w_in = 1.0 / (s.d_in as f64).sqrt();
    let w_rank = 1.0 / (s.rank as f64).sqrt();
    Inputs {
        x: rng.vec(s.rows * s.d_in, -1.0, 1.0, 0.0),
        xa: rng.vec(s.rows * s.d_in, -1.0, 1.0, 0.0),
        w: rng.vec(s.d_in * s.d_out, -w_in, w_in, 0.0),
        b: rng.vec(s.d_out, -0.5, 0.5, 0.0),
        a: rng.vec(s.rank * s.d_in, -w_in, w_in, 0.0),
        bb: rng.vec(s.d_out * s.rank, -w_rank, w_rank, 0.0),
        g: rng.vec(s.rows * s.d_out, -1.0, 1.0, 0.0),
    }
}

/// The inputs as the device holds them: `x`, `x_a`, `W`, the bias in the activations'
/// dtype, `A`, `B` in f32 (trainable adapters), the upstream gradient in the activations'
/// dtype.
pub struct Rounded<'a> {
    /// `[rows, d_in]`.
    pub x: &'a [f64],
    /// `[rows, d_in]`; unused unless the variant has a separate input.
    pub xa: &'a [f64],
    /// `[d_in, d_out]`.
    pub w: &'a [f64],
    /// `[d_out]`; unused without a bias.
    pub b: &'a [f64],
    /// `[rank, d_in]`.
    pub a: &'a [f64],
    /// `[d_out, rank]`.
    pub bb: &'a [f64],
    /// `[rows, d_out]`.
    pub g: &'a [f64],
}

/// The output and every gradient, with their bounds.
pub struct Reference {
    /// `[rows, d_out]`.
    pub y: Bounded,
    /// `[rows, d_in]`.
    pub gx: Bounded,
    /// `grad_x` as a stock autodiff composition computes it: the adapter path's input
    /// gradient rounded to the activations' dtype, then added in that dtype to the base's.
    pub gx_stock: Bounded,
    /// `[rows, d_in]`: the separate input's gradient (the adapter path's input gradient in
    /// the compute dtype when the adapter reads `x`).
    pub gxa: Bounded,
    /// `[rank, d_in]`.
    pub ga: Bounded,
    /// `[d_out, rank]`.
    pub gb: Bounded,
}

/// The reference of `v` at `s` from inputs already rounded as the device holds them.
pub fn reference(v: Variant, s: LoraShape, inp: Rounded<'_>) -> Reference {
    let LoraShape {
        rows,
        d_in,
        d_out,
        rank,
    } = s;
    let dt = v.dtype;
    let cd = v.precision.compute_dtype(dt);
    let to_cd = |x: &[f64]| x.iter().map(|&x| round_to(cd, x)).collect::<Vec<_>>();
    let x = Bounded::exact(rows, d_in, inp.x.to_vec());
    let xa = if v.separate {
        Bounded::exact(rows, d_in, inp.xa.to_vec())
    } else {
        x.clone()
    };
    let w = Bounded::exact(d_in, d_out, inp.w.to_vec());
    let a = Bounded::exact(rank, d_in, to_cd(inp.a));
    let b = Bounded::exact(d_out, rank, to_cd(inp.bb));
    let g = Bounded::exact(rows, d_out, inp.g.to_vec());
    let mut base = x.mm(&w).store(dt);
    if v.bias {
        base = base.add_row(inp.b, dt);
    }
    let h = xa.mm(&a.t()).store(cd).scale(SCALE).store(cd);
    let y = base.add(&h.mm(&b.t()).store(cd), dt);
    let gb = g.t().mm(&h).store(cd);
    let u = g.mm(&b).store(cd).scale(SCALE).store(cd);
    let ga = u.t().mm(&xa).store(cd);
    let adapter_x = u.mm(&a).store(cd);
    let base_x = g.mm(&w.t()).store(dt);
    let (gx, gx_stock, gxa) = if v.separate {
        (base_x.clone(), base_x, adapter_x.store(dt))
    } else {
        (
            base_x.add(&adapter_x, dt),
            base_x.add(&adapter_x.store(dt), dt),
            adapter_x,
        )
    };
    Reference {
        y,
        gx,
        gx_stock,
        gxa,
        ga,
        gb,
    }
}

fn expected(v: Variant, r: Reference) -> Vec<Expected> {
    let mut e = vec![r.y.expected("output"), r.gx.expected("grad_x")];
    if v.separate {
        e.push(r.gxa.expected("grad_adapter_x"));
    }
    e.push(r.ga.expected("grad_A"));
    e.push(r.gb.expected("grad_B"));
    e
}

/// The reference of `v` at `s` from drawn inputs, each rounded by `round` to the dtype
/// the device holds it in (see [`Rounded`]).
pub fn reference_from(
    v: Variant,
    s: LoraShape,
    inp: &Inputs,
    round: impl Fn(&[f32], DType) -> Vec<f64>,
) -> Reference {
    let dt = v.dtype;
    let (x, xa, w, b) = (
        round(&inp.x, dt),
        round(&inp.xa, dt),
        round(&inp.w, dt),
        round(&inp.b, dt),
    );
    let (a, bb, g) = (
        round(&inp.a, DType::F32),
        round(&inp.bb, DType::F32),
        round(&inp.g, dt),
    );
    let rounded = Rounded {
        x: &x,
        xa: &xa,
        w: &w,
        b: &b,
        a: &a,
        bb: &bb,
        g: &g,
    };
    reference(v, s, rounded)
}

/// See [`HostCase`]: the adapter gradients are the reductions over rows (`live` rows keep
/// their upstream gradient).
pub fn host_case(
    op: Op,
    rows: usize,
    d_in: usize,
    dtype: DType,
    rng: &mut Rng,
    live: usize,
) -> HostCase {
    let s = shape_of(rows, d_in);
    let v = variant(op, dtype);
    let inp = draw(s, rng);
    let with = expected(v, reference_from(v, s, &inp, host_input));
    let mut live_rows = inp;
    live_rows.g[live * s.d_out..].fill(0.0);
    let dropped = expected(v, reference_from(v, s, &live_rows, host_input));
    let without = with
        .iter()
        .zip(dropped)
        .map(|(e, d)| {
            if matches!(e.tensor, "grad_A" | "grad_B") {
                d
            } else {
                e.clone()
            }
        })
        .collect();
    HostCase {
        expected: with,
        without_last_rows: without,
    }
}

/// Runs `op` at `rows` tokens of `d_in` features on `device` through `Autodiff<B>`.
pub fn run<B: FusedOps>(
    op: Op,
    rows: usize,
    d_in: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let s = shape_of(rows, d_in);
    let v = variant(op, dtype);
    let inp = draw(s, rng);
    let (x, x_r) = input::<B>(inp.x, vec![rows, d_in], dtype, device);
    let (xa, xa_r) = input::<B>(inp.xa, vec![rows, d_in], dtype, device);
    let (w, w_r) = input::<B>(inp.w, vec![d_in, s.d_out], dtype, device);
    let (b, b_r) = input::<B>(inp.b, vec![s.d_out], dtype, device);
    let (a, a_r) = input::<B>(inp.a, vec![s.rank, d_in], DType::F32, device);
    let (bb, bb_r) = input::<B>(inp.bb, vec![s.d_out, s.rank], DType::F32, device);
    let (g, g_r) = input::<B>(inp.g, vec![rows, s.d_out], dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let xa = Tensor::<A<B>, 2>::from_inner(xa).require_grad();
    let a = Tensor::<A<B>, 2>::from_inner(a).require_grad();
    let bb = Tensor::<A<B>, 2>::from_inner(bb).require_grad();
    let bias = v
        .bias
        .then(|| Tensor::<A<B>, 2>::from_inner(b).reshape([s.d_out]));
    poison::<B>(
        &[
            rows * s.d_out,
            rows * d_in,
            rows * s.rank,
            s.rank * d_in,
            s.d_out * s.rank,
        ],
        dtype,
        device,
    );
    let y = functional::lora_linear(
        x.clone(),
        Tensor::from_inner(w),
        bias,
        v.separate.then(|| xa.clone()),
        a.clone(),
        bb.clone(),
        LoraOptions::new(SCALE).with_precision(v.precision),
    );
    let grads = (y.clone() * Tensor::<A<B>, 2>::from_inner(g))
        .sum()
        .backward();
    // Each result with the dtype it must come in: the activations' for the output and the
    // input gradients, f32 for the f32 adapters' gradients.
    let mut results = vec![
        ("output", y.inner(), dtype),
        ("grad_x", x.grad(&grads).expect("grad_x"), dtype),
        ("grad_A", a.grad(&grads).expect("grad_A"), DType::F32),
        ("grad_B", bb.grad(&grads).expect("grad_B"), DType::F32),
    ];
    if v.separate {
        let gxa = xa.grad(&grads).expect("grad_adapter_x");
        results.push(("grad_adapter_x", gxa, dtype));
    }
    let wrong_dtype: Vec<&'static str> = results
        .iter()
        .filter(|(_, t, want)| t.dtype() != *want)
        .map(|(name, _, _)| *name)
        .collect();
    let actual = results
        .into_iter()
        .map(|(name, t, _)| (name, to_f64(t)))
        .collect();
    let rounded = Rounded {
        x: &x_r,
        xa: &xa_r,
        w: &w_r,
        b: &b_r,
        a: &a_r,
        bb: &bb_r,
        g: &g_r,
    };
    let mut comparisons = compare_all(actual, &expected(v, reference(v, s, rounded)));
    for c in comparisons.iter_mut() {
        if wrong_dtype.contains(&c.tensor) {
            c.tensor = wrong_dtype_label(c.tensor);
            c.passed = false;
        }
    }
    comparisons
}

/// The report's name of a tensor that came back in another dtype than the op's.
fn wrong_dtype_label(tensor: &'static str) -> &'static str {
    match tensor {
        "output" => "output (not in the activations' dtype)",
        "grad_x" => "grad_x (not in the activations' dtype)",
        "grad_adapter_x" => "grad_adapter_x (not in the activations' dtype)",
        "grad_A" => "grad_A (not in A's dtype, f32)",
        "grad_B" => "grad_B (not in B's dtype, f32)",
        other => other,
    }
}
