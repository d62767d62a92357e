//! Conformance of the linear layer with a bias ([`Op::Linear`]: `functional::linear`, which
//! `burn::nn::Linear` runs on `Liger<_>`): `y = x · W + b` and the gradients of `x`, `W`
//! and `b`. `rows` are tokens, `width` is `d_out`; `x` has [`D_IN`] features.
//!
//! The reference carries the bound of the default composition (the product accumulated
//! in f32 and stored, the bias added and stored; `g · Wᵀ` and `xᵀ · g` accumulated in f32
//! and stored; the bias's gradient summed over the rows in f32 and stored), which also
//! covers CUDA's cuBLASLt epilogues (the bias added before the one rounding, the rows
//! summed in f32 while the product reads them).

use super::bounded::Bounded;
use super::bounds::Expected;
use super::{Comparison, HostCase, Rng, compare_all, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor};
use liger_burn::functional;
use liger_burn::ops::FusedOps;

/// Input features (odd, so no tile divides it).
pub const D_IN: usize = 72;

/// The shape sweep `(rows, d_out)`: one row, odd widths, Qwen2.5-1.5B's query and key
/// widths at many tokens.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 5), (37, 29), (300, 64), (5, 257), (1000, 8)];
    if !quick {
        shapes.extend([(4096, 1536), (16_384, 256), (3, 8960)]);
    }
    shapes
}

struct Inputs {
    /// `[rows, D_IN]`.
    x: Vec<f32>,
    /// `[D_IN, d_out]` (Burn's layout).
    w: Vec<f32>,
    /// `[d_out]`.
    b: Vec<f32>,
    /// `[rows, d_out]`: the upstream gradient.
    g: Vec<f32>,
}

fn draw(rows: usize, d_out: usize, rng: &mut Rng) -> Inputs {
    Inputs {
        x: rng.vec(rows * D_IN, -1.0, 1.0, 0.0),
        w: rng.vec(D_IN * d_out, -0.5, 0.5, 0.0),
        b: rng.vec(d_out, -2.0, 2.0, 0.0),
        g: rng.vec(rows * d_out, -1.5, 1.5, 0.0),
    }
}

/// The output and the gradients of `x`, the weight and the bias from inputs already
/// rounded to `dtype`, the reductions over rows (`W`'s and `b`'s gradients) over the first
/// `live` rows of `g`.
fn expected(
    dtype: DType,
    (rows, d_out): (usize, usize),
    [x, w, b, g]: [&[f64]; 4],
    live: usize,
) -> Vec<Expected> {
    let x = Bounded::exact(rows, D_IN, x.to_vec());
    let w = Bounded::exact(D_IN, d_out, w.to_vec());
    let g_all = Bounded::exact(rows, d_out, g.to_vec());
    let mut g_live = g.to_vec();
    g_live[live * d_out..].iter_mut().for_each(|v| *v = 0.0);
    let g_live = Bounded::exact(rows, d_out, g_live);
    let y = x.mm(&w).store(dtype).add_row(b, dtype);
    let g_x = g_all.mm(&w.t()).store(dtype);
    let g_w = x.t().mm(&g_live).store(dtype);
    let g_b = Bounded::exact(1, rows, vec![1.0; rows])
        .mm(&g_live)
        .store(dtype);
    vec![
        y.expected("output"),
        g_x.expected("grad_x"),
        g_w.expected("grad_weight"),
        g_b.expected("grad_bias"),
    ]
}

/// See [`HostCase`]: the weight's and the bias's gradients sum over rows.
pub fn host_case(rows: usize, d_out: usize, dtype: DType, rng: &mut Rng) -> HostCase {
    let inp = draw(rows, d_out, rng);
    let live = rows - (rows / 10).max(1).min(rows);
    let r = |v: &[f32]| host_input(v, dtype);
    let (x, w, b, g) = (r(&inp.x), r(&inp.w), r(&inp.b), r(&inp.g));
    let all = [&x[..], &w, &b, &g];
    HostCase {
        expected: expected(dtype, (rows, d_out), all, rows),
        without_last_rows: expected(dtype, (rows, d_out), all, live),
    }
}

/// Runs the layer and its backward at `[rows, d_out]` on `device` through `Autodiff<B>`,
/// every input tracked.
pub fn run<B: FusedOps>(
    rows: usize,
    d_out: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let inp = draw(rows, d_out, rng);
    let (x, xr) = input::<B>(inp.x, vec![rows, D_IN], dtype, device);
    let (w, wr) = input::<B>(inp.w, vec![D_IN, d_out], dtype, device);
    let (b, br) = input::<B>(inp.b, vec![1, d_out], dtype, device);
    let (g, gr) = input::<B>(inp.g, vec![rows, d_out], dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let b = Tensor::<A<B>, 1>::from_inner(b.reshape([d_out])).require_grad();
    poison::<B>(
        &[rows * d_out, rows * D_IN, D_IN * d_out, d_out],
        dtype,
        device,
    );
    let y = functional::linear(x.clone(), w.clone(), Some(b.clone()));
    let grads = (y.clone() * Tensor::<A<B>, 2>::from_inner(g))
        .sum()
        .backward();
    let actual = vec![
        ("output", to_f64(y.inner())),
        ("grad_x", to_f64(x.grad(&grads).expect("grad_x"))),
        ("grad_weight", to_f64(w.grad(&grads).expect("grad_weight"))),
        (
            "grad_bias",
            to_f64(b.grad(&grads).expect("grad_bias").reshape([1, d_out])),
        ),
    ];
    compare_all(
        actual,
        &expected(dtype, (rows, d_out), [&xr, &wr, &br, &gr], rows),
    )
}
