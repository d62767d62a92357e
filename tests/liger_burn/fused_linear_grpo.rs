//! fused_linear_grpo: the loss, the per-token log-probabilities, the KL and clip-ratio
//! metrics and the gradients against the f64 reference on every backend and dtype of the
//! test device (loss types grpo, dapo at a temperature with a reference head, dr_grpo
//! without a KL term); and bad input.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::functional::{self, TokenReference};
use liger_burn::ops::{GrpoLossType, GrpoOptions};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::Op;

#[test]
fn fused_linear_grpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearGrpo);
}

#[test]
fn fused_linear_dapo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearDapo);
}

#[test]
fn fused_linear_dr_grpo_matches_reference() {
    liger_tests::check_op(Op::FusedLinearDrGrpo);
}

#[test]
fn bad_input_is_rejected() {
    type Bk = NdArray;
    let device = Default::default();
    let (b, t, h, v) = (2, 4, 5, 6);
    let x = Tensor::<Bk, 3>::zeros([b, t, h], &device);
    let w = Tensor::<Bk, 2>::zeros([v, h], &device);
    let ids = Tensor::<Bk, 2, Int>::from_data(TensorData::new(vec![1i64; b * t], [b, t]), &device);
    let mask = Tensor::<Bk, 2, Int>::ones([b, t], &device);
    let adv = Tensor::<Bk, 1>::zeros([b], &device);
    let o = GrpoOptions::default();
    // A KL weight without a reference.
    let msg = panic_message(|| {
        functional::fused_linear_grpo(
            x.clone(),
            w.clone(),
            None,
            ids.clone(),
            mask.clone(),
            adv.clone(),
            TokenReference::None,
            None,
            o,
        );
    });
    assert_mentions(
        "reference",
        &msg,
        &["fused_linear_grpo", "beta", "no reference"],
    );
    let o0 = o.with_beta(0.0);
    let msg = panic_message(|| {
        functional::fused_linear_grpo(
            x.clone(),
            w.clone(),
            None,
            ids.clone(),
            mask.clone(),
            adv.clone().slice(0..1),
            TokenReference::None,
            None,
            o0,
        );
    });
    assert_mentions("advantages", &msg, &["advantages", "[2]", "[1]"]);
    let msg = panic_message(|| {
        let dr = o0.with_loss_type(GrpoLossType::DrGrpo {
            max_completion_length: 0,
        });
        functional::fused_linear_grpo(
            x.clone(),
            w.clone(),
            None,
            ids.clone(),
            mask.clone(),
            adv.clone(),
            TokenReference::None,
            None,
            dr,
        );
    });
    assert_mentions("dr_grpo", &msg, &["dr_grpo", "max_completion_length"]);
    // A completion without a token.
    let mut m = vec![1i64; b * t];
    m[t..].iter_mut().for_each(|m| *m = 0);
    let empty = Tensor::<Bk, 2, Int>::from_data(TensorData::new(m, [b, t]), &device);
    let msg = panic_message(|| {
        functional::fused_linear_grpo(
            x.clone(),
            w.clone(),
            None,
            ids.clone(),
            empty,
            adv.clone(),
            TokenReference::None,
            None,
            o0,
        );
    });
    assert_mentions("empty", &msg, &["sequence 1", "empty completion"]);
}
