//! fused_linear_kto: the loss, the per-sequence metrics and the gradients against the f64
//! reference on every backend and dtype of the test device (a reference head with a KL
//! estimate and TRL's weights, one sequence per chunk; given reference log-probabilities,
//! averaged, automatic chunks); and bad input.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::functional::{self, Reference};
use liger_burn::ops::KtoOptions;
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::Op;

#[test]
fn fused_linear_kto_matches_reference() {
    liger_tests::check_op(Op::FusedLinearKto);
}

#[test]
fn fused_linear_kto_avg_matches_reference() {
    liger_tests::check_op(Op::FusedLinearKtoAvg);
}

#[test]
fn bad_input_is_rejected() {
    type Bk = NdArray;
    let device = Default::default();
    let (b, t, h, v) = (3, 4, 5, 6);
    let x = Tensor::<Bk, 3>::zeros([b, t, h], &device);
    let w = Tensor::<Bk, 2>::zeros([v, h], &device);
    let y = Tensor::<Bk, 2, Int>::from_data(TensorData::new(vec![1i64; b * t], [b, t]), &device);
    let labels = Tensor::<Bk, 1, Int>::from_data(TensorData::new(vec![1i64, 0, 1], [b]), &device);
    let o = KtoOptions::default();
    let msg = panic_message(|| {
        functional::fused_linear_kto(
            x.clone(),
            w.clone(),
            None,
            y.clone(),
            labels.clone().slice(0..2),
            Reference::None,
            None,
            o,
        );
    });
    assert_mentions(
        "labels",
        &msg,
        &["fused_linear_kto", "labels", "[3]", "[2]"],
    );
    let msg = panic_message(|| {
        let kl = Tensor::<Bk, 1>::zeros([3], &device);
        functional::fused_linear_kto(
            x.clone(),
            w.clone(),
            None,
            y.clone(),
            labels.clone(),
            Reference::None,
            Some(kl),
            o,
        );
    });
    assert_mentions("kl", &msg, &["kl", "[1]", "[3]"]);
    let mut empty = vec![1i64; b * t];
    empty[t..2 * t].iter_mut().for_each(|y| *y = -100);
    let y_empty = Tensor::<Bk, 2, Int>::from_data(TensorData::new(empty, [b, t]), &device);
    let msg = panic_message(|| {
        functional::fused_linear_kto(
            x.clone(),
            w.clone(),
            None,
            y_empty,
            labels.clone(),
            Reference::None,
            None,
            o,
        );
    });
    assert_mentions(
        "empty completion",
        &msg,
        &["sequence 1", "empty completion"],
    );
}

/// The full conformance sweep (large vocabularies) of these ops on every backend and dtype
/// of the test device, for real devices: `cargo test --release -p liger-tests --test
/// liger_burn -- --ignored fused_linear_kto_and_grpo_full_sweep`.
#[test]
#[ignore = "full sweep (V up to 128,256, 32 sequences): too slow on a software rasterizer; run on a GPU with --ignored"]
fn fused_linear_kto_and_grpo_full_sweep() {
    liger_tests::check_ops_full(liger_verify::conformance::Op::is_rl);
}
