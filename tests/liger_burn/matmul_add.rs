//! `FusedOps::fused_matmul_add`, the chunked losses' weight-gradient accumulation:
//! `acc + lhs · rhs` with an f32 `acc` and with one of the inputs' dtype (the weight-dtype
//! accumulation), on every backend of the test device and every dtype it has, with `lhs`
//! a transposed view (as the losses pass `g_cᵀ`), at odd shapes.
//!
//! Compared with an f64 reference that carries the rounding bound of the default
//! composition (the product accumulated in f32, rounded to the dtype, added and rounded in
//! `acc`'s dtype; `liger_verify::conformance::matmul_add::reference`), which also covers CUDA's single cuBLASLt call
//! (the product added in f32 without the rounding to the dtype). Wrong results (zeros, doubled, a
//! dropped row, shifted rows, a transposed buffer) must exceed the bounds, and an
//! accumulator another handle still holds must come out unchanged (the update happens in
//! its buffer only when nothing else holds it).

use burn::tensor::{DType, Tensor, TensorPrimitive};
use liger_burn::ops::FusedOps;
use liger_tests::BackendVisitor;
use liger_tests::bounded::{check_with_rejection, rounded, tensor};
use liger_tests::tensors::values as host;
use liger_verify::conformance::{Op, Rng, matmul_add};

fn prim<B: FusedOps, const D: usize>(t: Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    t.into_primitive().tensor()
}

fn wrap<B: FusedOps, const D: usize>(t: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

struct Run {
    rng: Rng,
    cases: usize,
}

impl BackendVisitor for Run {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let mut failures = Vec::new();
        for (m, k, n) in [(37, 45, 29), (1, 7, 3), (64, 130, 48)] {
            // An f32 accumulator, and one in the inputs' dtype when that is not f32.
            let pairs = liger_tests::dtypes::<B>(device)
                .into_iter()
                .flat_map(|d| [(d, DType::F32), (d, d)])
                .filter(|(d, a)| *a == DType::F32 || *d != DType::F32);
            for (dtype, acc_dtype) in pairs {
                let acc = self.rng.vec(m * n, -2.0, 2.0, 0.0);
                // `lhs` is the transposed view of a `[k, m]` tensor.
                let lhs_t = self.rng.vec(k * m, -1.0, 1.0, 0.0);
                let rhs = self.rng.vec(k * n, -1.0, 1.0, 0.0);
                let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();

                // One rounding of the sum to the accumulator's dtype (the suite's reference).
                let expected = matmul_add::reference(
                    dtype,
                    acc_dtype,
                    (m, k, n),
                    [
                        &rounded(&acc, acc_dtype),
                        &rounded(&lhs_t, dtype),
                        &rounded(&rhs, dtype),
                    ],
                );

                for aliased in [false, true] {
                    let acc_t = tensor::<B, 2>(&f(&acc), [m, n], acc_dtype, device);
                    let keep = aliased.then(|| acc_t.clone());
                    let lhs = tensor::<B, 2>(&f(&lhs_t), [k, m], dtype, device).transpose();
                    let rhs_t = tensor::<B, 2>(&f(&rhs), [k, n], dtype, device);
                    let out: Tensor<B, 2> =
                        wrap(B::fused_matmul_add(prim(acc_t), prim(lhs), prim(rhs_t)));
                    let name = format!(
                        "{label} {dtype:?} into {acc_dtype:?} [{m}, {k}] x [{k}, {n}] aliased {aliased}"
                    );
                    assert_eq!(out.dtype(), acc_dtype, "{name}: the result's dtype");
                    check_with_rejection(&mut failures, &name, &expected, &host(out));
                    if let Some(kept) = keep {
                        if host(kept) != rounded(&acc, acc_dtype) {
                            failures.push(format!(
                                "{name}: the accumulator another handle holds changed"
                            ));
                        }
                    }
                    self.cases += 1;
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        eprintln!("{label}: fused_matmul_add within its rounding bounds");
    }
}

#[test]
fn matmul_add_matches_reference() {
    let mut run = Run {
        rng: liger_tests::fresh_rng(),
        cases: 0,
    };
    liger_tests::for_each_backend(&mut run);
    assert!(run.cases > 0, "no backend ran");
}

/// The conformance suite's quick sweep, both accumulator dtypes (`liger check --op
/// matmul_add --quick`).
#[test]
fn matmul_add_conformance() {
    liger_tests::check_op(Op::MatmulAdd);
    liger_tests::check_op(Op::MatmulAddInDtype);
}

/// The full sweep: too large for a software rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn matmul_add_conformance_full() {
    liger_tests::check_ops_full(Op::is_matmul_add);
}
