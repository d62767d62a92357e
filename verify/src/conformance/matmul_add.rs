//! Conformance of `FusedOps::fused_matmul_add`, the chunked losses' weight-gradient
//! accumulation `acc + lhs · rhs`: `acc: [m, n]` in f32 ([`Op::MatmulAdd`]) or in the
//! inputs' dtype ([`Op::MatmulAddInDtype`], the weight-dtype accumulation), `lhs` the
//! transposed view of a `[k, m]` tensor (as the losses pass `g_cᵀ`), `rhs: [k, n]`, with
//! `k` = [`K`]. `rows` is `m`, `width` is `n`.
//!
//! The reference carries the bound of the default composition (the product accumulated in
//! f32, rounded to the inputs' dtype, added and rounded in `acc`'s dtype), which also
//! covers CUDA's single cuBLASLt call (the product added in f32 without its own rounding).

use super::bounded::Bounded;
use super::{
    Comparison, Expected, HostCase, Op, Rng, compare_all, host_input, input, poison, to_f64,
};
use burn::tensor::{DType, TensorPrimitive};
use liger_burn::ops::FusedOps;

/// The products' inner dimension.
pub const K: usize = 96;

/// The shape sweep `(m, n)`.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 3), (37, 29), (64, 48), (5, 257)];
    if !quick {
        shapes.extend([(2048, 1024), (8, 16_384)]);
    }
    shapes
}

/// The accumulator's dtype for inputs of `dtype`.
fn acc_dtype(op: Op, dtype: DType) -> DType {
    match op {
        Op::MatmulAdd => DType::F32,
        Op::MatmulAddInDtype => dtype,
        other => unreachable!("{other:?} is not a matmul-add op"),
    }
}

struct Inputs {
    acc: Vec<f32>,
    /// `[k, m]`: `lhs` is its transpose.
    lhs_t: Vec<f32>,
    rhs: Vec<f32>,
}

fn draw(m: usize, n: usize, rng: &mut Rng) -> Inputs {
    Inputs {
        acc: rng.vec(m * n, -2.0, 2.0, 0.0),
        lhs_t: rng.vec(K * m, -1.0, 1.0, 0.0),
        rhs: rng.vec(K * n, -1.0, 1.0, 0.0),
    }
}

/// `acc + lhs_tᵀ · rhs` with its bound, from values already rounded to their dtypes:
/// `acc: [m, n]` in `acc_dtype`, `lhs_t: [k, m]` and `rhs: [k, n]` in `dtype`.
pub fn reference(
    dtype: DType,
    acc_dtype: DType,
    (m, k, n): (usize, usize, usize),
    [acc, lhs_t, rhs]: [&[f64]; 3],
) -> Bounded {
    let acc = Bounded::exact(m, n, acc.to_vec());
    let lhs = Bounded::exact(k, m, lhs_t.to_vec()).t();
    let rhs = Bounded::exact(k, n, rhs.to_vec());
    let product = lhs.mm(&rhs).store(dtype);
    acc.add(&product, acc_dtype)
}

fn expected(op: Op, dtype: DType, (m, n): (usize, usize), inputs: [&[f64]; 3]) -> Expected {
    reference(dtype, acc_dtype(op, dtype), (m, K, n), inputs).expected("output")
}

/// See [`HostCase`]; nothing sums over the rows of the output.
pub fn host_case(op: Op, m: usize, n: usize, dtype: DType, rng: &mut Rng) -> HostCase {
    let inp = draw(m, n, rng);
    let acc = host_input(&inp.acc, acc_dtype(op, dtype));
    let (lhs_t, rhs) = (host_input(&inp.lhs_t, dtype), host_input(&inp.rhs, dtype));
    let e = expected(op, dtype, (m, n), [&acc, &lhs_t, &rhs]);
    HostCase {
        expected: vec![e.clone()],
        without_last_rows: vec![e],
    }
}

/// Runs `op` at `[m, n]` on `device`.
pub fn run<B: FusedOps>(
    op: Op,
    m: usize,
    n: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    let inp = draw(m, n, rng);
    let (acc, acc_r) = input::<B>(inp.acc, vec![m, n], acc_dtype(op, dtype), device);
    let (lhs_t, lhs_r) = input::<B>(inp.lhs_t, vec![K, m], dtype, device);
    let (rhs, rhs_r) = input::<B>(inp.rhs, vec![K, n], dtype, device);
    poison::<B>(&[m * n], dtype, device);
    let out = B::fused_matmul_add(
        acc.into_primitive().tensor(),
        lhs_t.transpose().into_primitive().tensor(),
        rhs.into_primitive().tensor(),
    );
    let out = burn::tensor::Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out));
    let expected = expected(op, dtype, (m, n), [&acc_r, &lhs_r, &rhs_r]);
    let mut comparisons = compare_all(vec![("output", to_f64(out.clone()))], &[expected]);
    if out.dtype() != acc_dtype(op, dtype) {
        comparisons[0].tensor = "output (not in the accumulator's dtype)";
        comparisons[0].passed = false;
    }
    comparisons
}
