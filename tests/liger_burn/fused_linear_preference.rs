//! fused_linear_preference (DPO and every DPO loss type, ORPO, CPO, SimPO): the loss,
//! TRL's metrics and the gradients of x, the weight and the bias against the f64 reference
//! on every backend and dtype of the test device, with one pair per chunk and automatic
//! chunks, a reference head or given reference log-probabilities; against the same loss
//! composed of stock Burn ops under autodiff; `Liger<Autodiff<B>>`; and bad input.

use liger_verify::conformance::Op;

#[test]
fn fused_linear_dpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearDpo);
}

#[test]
fn fused_linear_dpo_loss_types_match_reference() {
    liger_tests::check_op(Op::FusedLinearDpoLossTypes);
}

#[test]
fn fused_linear_orpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearOrpo);
}

#[test]
fn fused_linear_cpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearCpo);
}

#[test]
fn fused_linear_simpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearSimpo);
}
