//! Small tensor and comparison helpers shared by the suites that build inputs by hand
//! (cross entropy, fused linear cross entropy).

use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};
pub use liger_verify::conformance::bounds::named;
use liger_verify::conformance::{Comparison, Expected};

/// The values of `t` as f64 (through f32, exact for every dtype the suites use).
pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(DType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// An f32 tensor of `shape` from `v`.
pub fn floats<B: Backend, const D: usize>(
    v: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), device)
}

/// An int tensor `[v.len()]` from `v`.
pub fn ints<B: Backend>(v: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

/// Multiplies a gradient by `k` (to compare values of order 1, see conformance::cross_entropy).
pub fn scaled(v: &[f64], k: f64) -> Vec<f64> {
    v.iter().map(|x| x * k).collect()
}

/// Asserts a comparison passed, naming the backend and case.
pub fn check(label: &str, case: &str, c: Comparison) {
    assert!(
        c.passed,
        "{label} {case} {}: max abs {:.3e}, max rel {:.3e}",
        c.tensor, c.max_abs, c.max_rel
    );
}

/// Asserts that `expected`'s bounds reject every typical wrong result (zeros, doubled,
/// rows dropped, transposed, shifted: `liger_verify::conformance::bounds::WRONG_RESULTS`),
/// so the comparison under them can fail.
pub fn assert_rejects_wrong(expected: &Expected, what: &str) {
    let accepted = expected.accepted_wrong_results();
    assert!(
        accepted.is_empty(),
        "{what} {}: the bounds accept wrong results: {accepted:?}",
        expected.tensor
    );
}

/// The largest difference between `a` and `b`, relative to the largest magnitude in `b`
/// (the reference), for comparing two runs of one computation.
pub fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "max_rel: lengths differ");
    let scale = b
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs() / scale)
        .fold(0.0, f64::max)
}
