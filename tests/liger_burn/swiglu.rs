//! SwiGLU `silu(gate) * up`: forward and both gradients against the f64 reference and stock Burn
//! (`activation::silu(gate) * up`) on every backend of the test device and every dtype it has,
//! under forced grid striding and split launches too; one-sided gradient tracking; bad
//! input; the `SwiGluMlp` module (record layout, forward).

use liger_burn::nn::{SwiGluMlp, SwiGluMlpConfig};
use liger_tests::glu::{
    check_bad_inputs, check_dtype_validation, check_op_with_elementwise_limits,
    check_partial_tracking,
};
use liger_verify::conformance::Op;

#[test]
fn swiglu_matches_reference_and_burn() {
    liger_tests::check_op(Op::SwiGlu);
}

#[test]
fn swiglu_under_launch_limits() {
    check_op_with_elementwise_limits(Op::SwiGlu);
}

#[test]
fn swiglu_one_input_tracked() {
    check_partial_tracking(Op::SwiGlu);
}

#[test]
fn swiglu_bad_inputs_are_rejected() {
    check_bad_inputs(Op::SwiGlu);
}

#[test]
fn swiglu_dtype_validation() {
    check_dtype_validation(Op::SwiGlu);
}

// Record layout both ways against a struct of burn `Linear`s, and config defaults.
liger_tests::glu_mlp_tests!(
    SwiGluMlp,
    SwiGluMlpConfig,
    liger_tests::glu::MlpActivation::Silu,
    swiglu_mlp_loads_stock_record_and_matches,
    swiglu_mlp_defaults_and_any_rank
);

/// `FusedOps::submit_queued` and `FusedOps::hand_off_queued` between queueing work and
/// reading it back, and each `HandOff` of the fusion stream's fused operations, change
/// nothing but when the work starts, on every backend (the fusion stream's, CubeCL's and
/// Autodiff's).
struct SubmitQueued;

impl liger_tests::BackendVisitor for SubmitQueued {
    fn visit<B: liger_burn::ops::FusedOps>(&mut self, label: &str, device: &B::Device) {
        use burn::backend::Autodiff;
        use liger_burn::fusion::HandOff;
        use liger_burn::ops::FusedOps;
        use liger_tests::tensors::{floats, values};
        let mut rng = liger_tests::fresh_rng();
        let (gate, up) = (
            rng.vec(6 * 37, -3.0, 3.0, 0.0),
            rng.vec(6 * 37, -3.0, 3.0, 0.0),
        );
        let run = |submit: bool, hand_off: HandOff| {
            let _hand_off = liger_burn::test_hooks::override_hand_off(hand_off);
            let gate = floats::<Autodiff<B>, 2>(&gate, [6, 37], device).require_grad();
            let up = floats::<Autodiff<B>, 2>(&up, [6, 37], device);
            let y = liger_burn::functional::swiglu(gate.clone(), up);
            if submit {
                <Autodiff<B> as FusedOps>::submit_queued(device);
            }
            let grads = y.clone().backward();
            if submit {
                B::submit_queued(device);
                B::hand_off_queued(device);
            }
            (values(y.inner()), values(gate.grad(&grads).unwrap()))
        };
        let reference = run(false, HandOff::Runtime);
        for hand_off in [HandOff::Runtime, HandOff::Kernels, HandOff::Operations] {
            for submit in [false, true] {
                assert_eq!(
                    run(submit, hand_off),
                    reference,
                    "{label}: {hand_off:?} hand-off (submitting: {submit}) changed a result"
                );
            }
        }
    }
}

#[test]
fn submitting_queued_work_changes_no_result() {
    liger_tests::for_each_backend(&mut SubmitQueued);
}
