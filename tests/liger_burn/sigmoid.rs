//! Sigmoid: forward and gradient against the f64 reference and stock Burn
//! (`activation::sigmoid`) on every backend of the test device and every dtype it has,
//! under forced grid striding and split launches too; bad input; stock Burn's `sigmoid`
//! primitive on `Liger<_>` with input the kernels do not take. The tests are
//! `activation_tests!` (tests/support/glu.rs).

liger_tests::activation_tests!(
    liger_verify::conformance::Op::Sigmoid,
    burn::tensor::activation::sigmoid,
    sigmoid_matches_reference_and_burn,
    sigmoid_under_launch_limits,
    sigmoid_bad_inputs_are_rejected,
    sigmoid_dtype_validation,
    stock_sigmoid_on_liger_accepts_what_burn_accepts
);
