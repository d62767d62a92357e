//! Exact (erf) GELU: forward and gradient against the f64 reference and stock Burn
//! (`activation::gelu` forward, the autodiff of its erf formula backward) on every backend
//! of the test device and every dtype it has, under forced grid striding and split
//! launches too; bad input; stock Burn's `gelu` primitive on `Liger<_>` with input the
//! kernels do not take. The tests are `activation_tests!` (tests/support/glu.rs).

liger_tests::activation_tests!(
    liger_verify::conformance::Op::Gelu,
    burn::tensor::activation::gelu,
    gelu_matches_reference_and_burn,
    gelu_under_launch_limits,
    gelu_bad_inputs_are_rejected,
    gelu_dtype_validation,
    stock_gelu_on_liger_accepts_what_burn_accepts
);
