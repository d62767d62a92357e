//! kl_div, jsd and tvd on `[N, V]` distributions: the loss (reduced, or elementwise with
//! an upstream gradient per element) and the input's gradient against the f64 reference
//! on every backend and dtype of the test device, with labels; and bad input.

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{Divergence, DivergenceOptions, DivergenceReduction};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::Op;

#[test]
fn kl_div_matches_reference() {
    liger_tests::check_op(Op::KlDiv);
}

#[test]
fn kl_div_none_matches_reference() {
    liger_tests::check_op(Op::KlDivNone);
}

#[test]
fn jsd_matches_reference() {
    liger_tests::check_op(Op::Jsd);
}

#[test]
fn tvd_matches_reference() {
    liger_tests::check_op(Op::Tvd);
}

#[test]
fn bad_input_is_rejected() {
    type Bk = NdArray;
    let device = Default::default();
    let a = Tensor::<Bk, 2>::from_data(TensorData::new(vec![0.5f32; 6], [2, 3]), &device);
    let msg = panic_message(|| {
        functional::kl_div(
            a.clone(),
            a.clone().slice([0..2, 0..2]),
            DivergenceReduction::Sum,
            true,
        );
    });
    assert_mentions("shape", &msg, &["divergence", "target", "[2, 2]", "[2, 3]"]);
    let msg = panic_message(|| {
        let o = DivergenceOptions::new(Divergence::Tvd).with_log_target(true);
        functional::divergence(a.clone(), a.clone(), None, o);
    });
    assert_mentions("tvd log target", &msg, &["TVD", "log_target"]);
    let msg = panic_message(|| {
        functional::jsd(a.clone(), a.clone(), None, -0.1, -100);
    });
    assert_mentions("beta", &msg, &["beta", "[0, 1]"]);
}

/// The full conformance sweep (large vocabularies) of these ops on every backend and dtype
/// of the test device, for real devices: `cargo test --release -p liger-tests --test
/// liger_burn -- --ignored divergence_full_sweep`.
#[test]
#[ignore = "full sweep (V up to 128,256): too slow on a software rasterizer; run on a GPU with --ignored"]
fn divergence_full_sweep() {
    liger_tests::check_ops_full(liger_verify::conformance::Op::is_divergence);
}
