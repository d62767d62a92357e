//! GeGLU `gelu_tanh(gate) * up`: forward and both gradients against the f64 reference and stock Burn
//! (`activation::gelu_approximate(gate) * up`) on every backend of the test device and every dtype it has,
//! under forced grid striding and split launches too; one-sided gradient tracking; bad
//! input; the `GeGluMlp` module (record layout, forward).

use liger_burn::nn::{GeGluMlp, GeGluMlpConfig};
use liger_tests::glu::{
    check_bad_inputs, check_dtype_validation, check_op_with_elementwise_limits,
    check_partial_tracking,
};
use liger_verify::conformance::Op;

#[test]
fn geglu_matches_reference_and_burn() {
    liger_tests::check_op(Op::GeGlu);
}

#[test]
fn geglu_under_launch_limits() {
    check_op_with_elementwise_limits(Op::GeGlu);
}

#[test]
fn geglu_one_input_tracked() {
    check_partial_tracking(Op::GeGlu);
}

#[test]
fn geglu_bad_inputs_are_rejected() {
    check_bad_inputs(Op::GeGlu);
}

#[test]
fn geglu_dtype_validation() {
    check_dtype_validation(Op::GeGlu);
}

// Record layout both ways against a struct of burn `Linear`s, and config defaults.
liger_tests::glu_mlp_tests!(
    GeGluMlp,
    GeGluMlpConfig,
    liger_tests::glu::MlpActivation::GeluTanh,
    geglu_mlp_loads_stock_record_and_matches,
    geglu_mlp_defaults_and_any_rank
);
