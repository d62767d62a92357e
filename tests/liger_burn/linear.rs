//! The linear layer with a bias (`functional::linear`, which `burn::nn::Linear` runs on
//! `Liger<_>`): the conformance sweep (the output and the gradients of x, the weight and
//! the bias against f64, every dtype of the device, a random upstream gradient, outputs
//! poisoned first); bad shapes and dtypes are refused naming the op. Which path
//! `nn::Linear` takes in both wrapping orders (and on CUDA, that the bias runs in
//! cuBLASLt's epilogues) is checked in `matmul.rs`.

use burn::backend::NdArray;
use burn::tensor::{DType, Tensor};
use liger_burn::{Liger, functional};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::Op;

#[test]
fn linear_conformance() {
    liger_tests::check_op(Op::Linear);
}

/// The full sweep: too large for a software rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn linear_full_sweep() {
    liger_tests::check_ops_full(|op| op == Op::Linear);
}

/// A bias of the wrong length or dtype, and a weight that does not fit `x`, are refused
/// naming the op, the shapes and the dtypes.
#[test]
fn linear_bad_inputs_are_rejected() {
    type L = Liger<NdArray>;
    let device = Default::default();
    let x = || Tensor::<L, 3>::zeros([2, 3, 4], &device);
    let w = || Tensor::<L, 2>::zeros([4, 5], &device);
    let msg = panic_message(|| {
        let _ = functional::linear(x(), w(), Some(Tensor::<L, 1>::zeros([6], &device)));
    });
    assert_mentions(
        "bias length",
        &msg,
        &["linear", "[2, 3, 4]", "[4, 5]", "[6]"],
    );
    let msg = panic_message(|| {
        let _ = functional::linear(x(), Tensor::<L, 2>::zeros([5, 5], &device), None);
    });
    assert_mentions(
        "weight rows",
        &msg,
        &["linear", "[2, 3, 4]", "[5, 5]", "F32"],
    );
    let bias = Tensor::<L, 1>::zeros([5], &device).cast(DType::F64);
    let msg = panic_message(|| {
        let _ = functional::linear(x(), w(), Some(bias.clone()));
    });
    assert_mentions("bias dtype", &msg, &["linear", "F32", "F64"]);
}
