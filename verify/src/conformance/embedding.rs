//! Conformance of the embedding lookup and its gradient ([`Op::Embedding`]:
//! `functional::embedding`, which `burn::nn::Embedding` runs on `Liger<_>`): `rows`
//! positions (one sequence) look up a table of `width`-wide rows, and the table's gradient
//! sums the positions' upstream gradients per index.
//!
//! The table has [`table_rows`] rows, about a quarter of the positions, so most indices
//! repeat; half the positions take one of three hot indices, so some sums run over a sixth
//! of all positions (a padding or punctuation token); some rows are never looked up and
//! must get a zero gradient.
//!
//! The output is a copy (exact). Each gradient row is a sum of `c` rounded inputs
//! accumulated in f32 and stored in the dtype once: `γ_c·Σ|g| + u·|v|` (see [`bounded`]).
//!
//! [`bounded`]: super::bounded

use super::bounded::{Bounded, unit};
use super::bounds::Expected;
use super::{Comparison, HostCase, Rng, compare_all, host_input, input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::FusedOps;

/// The shape sweep `(positions, width)`.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (1, 7),
        (37, 100),
        (5, 257),
        (300, 64),
        (4, 4097),
        (2000, 24),
    ];
    if !quick {
        // Llama-3.2-1B's and Qwen2.5-1.5B's widths at 4K tokens, and many positions.
        shapes.extend([(4096, 2048), (4096, 1536), (20_000, 40)]);
    }
    shapes
}

/// Rows of the table for `positions` positions.
pub fn table_rows(positions: usize) -> usize {
    positions / 4 + 3
}

struct Inputs {
    indices: Vec<i64>,
    /// `[table_rows, width]`.
    weights: Vec<f32>,
    /// `[positions, width]`: the upstream gradient of the output.
    grad: Vec<f32>,
}

fn draw(positions: usize, width: usize, rng: &mut Rng) -> Inputs {
    let vocab = table_rows(positions);
    let indices = (0..positions)
        .map(|_| {
            if rng.below(2) == 0 {
                rng.below(3) as i64
            } else {
                rng.below(vocab) as i64
            }
        })
        .collect();
    Inputs {
        indices,
        weights: rng.vec(vocab * width, -2.0, 2.0, 0.0),
        grad: rng.vec(positions * width, -1.0, 1.0, 0.0),
    }
}

/// The reference over the first `live` positions: the lookup (exact) and the gradient of
/// the table, from values already rounded to `dtype`.
fn expected(
    dtype: DType,
    (positions, width): (usize, usize),
    indices: &[i64],
    weights: &[f64],
    grad: &[f64],
    live: usize,
) -> Vec<Expected> {
    let vocab = table_rows(positions);
    let mut output = Vec::with_capacity(positions * width);
    for &i in indices {
        let row = i as usize * width;
        output.extend_from_slice(&weights[row..row + width]);
    }
    let mut sum = vec![0.0; vocab * width];
    let mut magnitude = vec![0.0; vocab * width];
    let mut count = vec![0usize; vocab];
    for (p, &i) in indices.iter().enumerate().take(live) {
        let i = i as usize;
        count[i] += 1;
        for c in 0..width {
            sum[i * width + c] += grad[p * width + c];
            magnitude[i * width + c] += grad[p * width + c].abs();
        }
    }
    let u32_ = unit(DType::F32);
    let e = (0..vocab * width)
        .map(|x| count[x / width] as f64 * u32_ * magnitude[x])
        .collect();
    let grad_weight = Bounded {
        rows: vocab,
        cols: width,
        v: sum,
        e,
    }
    .store(dtype);
    vec![
        Bounded::exact(positions, width, output).expected("output"),
        grad_weight.expected("grad_weight"),
    ]
}

/// See [`HostCase`]: the gradient without the last tenth of the positions.
pub fn host_case(positions: usize, width: usize, dtype: DType, rng: &mut Rng) -> HostCase {
    let inp = draw(positions, width, rng);
    let live = positions - (positions / 10).max(1).min(positions);
    let (w, g) = (
        host_input(&inp.weights, dtype),
        host_input(&inp.grad, dtype),
    );
    let shape = (positions, width);
    HostCase {
        expected: expected(dtype, shape, &inp.indices, &w, &g, positions),
        without_last_rows: expected(dtype, shape, &inp.indices, &w, &g, live),
    }
}

/// Runs the lookup and its backward at `[positions, width]` on `device`.
pub fn run<B: FusedOps>(
    positions: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let inp = draw(positions, width, rng);
    let vocab = table_rows(positions);
    let (w, wr) = input::<B>(inp.weights, vec![vocab, width], dtype, device);
    let (g, gr) = input::<B>(inp.grad, vec![positions, width], dtype, device);
    let w = Tensor::<A<B>, 2>::from_inner(w).require_grad();
    let indices = Tensor::<A<B>, 2, Int>::from_data(
        TensorData::new(inp.indices.clone(), [1, positions]),
        device,
    );
    poison::<B>(&[positions * width, vocab * width], dtype, device);
    let y = functional::embedding(w.clone(), indices);
    let upstream = Tensor::<A<B>, 2>::from_inner(g).reshape([1, positions, width]);
    let grads = (y.clone() * upstream).sum().backward();
    let actual = vec![
        ("output", to_f64(y.inner().reshape([positions, width]))),
        (
            "grad_weight",
            to_f64(w.grad(&grads).expect("grad of the table")),
        ),
    ];
    let e = expected(dtype, (positions, width), &inp.indices, &wr, &gr, positions);
    compare_all(actual, &e)
}
