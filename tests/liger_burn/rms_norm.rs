//! RMSNorm: forward, grad_x and grad_weight against the f64 reference, Llama and Gemma
//! casting, every backend of the test device, both reduction paths, every dtype it has.

use liger_verify::conformance::Op;

#[test]
fn rms_norm_llama_matches_reference() {
    liger_tests::check_op(Op::RmsNorm);
}

#[test]
fn rms_norm_gemma_matches_reference() {
    liger_tests::check_op(Op::RmsNormGemma);
}
