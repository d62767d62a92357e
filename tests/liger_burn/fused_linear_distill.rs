//! fused_linear_distill (JSD, forward and reverse KL, TVD, with the hard loss): the loss,
//! the soft and hard losses and the gradients of the student's x, weight and bias against
//! the f64 reference on every backend and dtype of the test device, forced and automatic
//! chunks, a teacher vocabulary padded larger; and bad input.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{DistillOptions, Divergence};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::{Op, Rng};

#[test]
fn fused_linear_jsd_matches_reference() {
    liger_tests::check_op(Op::FusedLinearJsd);
}

#[test]
fn fused_linear_forward_kl_matches_reference() {
    liger_tests::check_op(Op::FusedLinearForwardKl);
}

#[test]
fn fused_linear_reverse_kl_matches_reference() {
    liger_tests::check_op(Op::FusedLinearReverseKl);
}

#[test]
fn fused_linear_tvd_matches_reference() {
    liger_tests::check_op(Op::FusedLinearTvd);
}

/// Bad input: a clear error naming the op before any work, or once it is queued.
#[test]
fn bad_input_is_rejected() {
    type Bk = NdArray;
    let device = Default::default();
    let mut rng = Rng::new(9);
    let (n, h, ht, v) = (6, 4, 3, 5);
    let t2 = |values: Vec<f32>, shape: [usize; 2]| {
        Tensor::<Bk, 2>::from_data(TensorData::new(values, shape), &device)
    };
    let x = t2(rng.vec(n * h, -1.0, 1.0, 0.0), [n, h]);
    let w = t2(rng.vec(v * h, -1.0, 1.0, 0.0), [v, h]);
    let tx = t2(rng.vec(n * ht, -1.0, 1.0, 0.0), [n, ht]);
    let tw = t2(rng.vec((v + 1) * ht, -1.0, 1.0, 0.0), [v + 1, ht]);
    let y = Tensor::<Bk, 1, Int>::from_data(
        TensorData::new(vec![0i64, 1, 2, 3, 4, -100], [n]),
        &device,
    );
    let run = |x: Tensor<Bk, 2>, w: Tensor<Bk, 2>, tx: Tensor<Bk, 2>, tw: Tensor<Bk, 2>, y, o| {
        panic_message(|| {
            functional::fused_linear_distill(x, w, None, tx, tw, None, y, o);
        })
    };
    let o = DistillOptions::default();
    // A teacher vocabulary smaller than the student's.
    let msg = run(
        x.clone(),
        w.clone(),
        tx.clone(),
        tw.clone().slice(0..v - 1),
        y.clone(),
        o,
    );
    assert_mentions(
        "vocab",
        &msg,
        &[
            "fused_linear_distill",
            "teacher's vocabulary (4",
            "student's (5",
        ],
    );
    // Teacher rows that are not the student's.
    let msg = run(
        x.clone(),
        w.clone(),
        tx.clone().slice(0..n - 1),
        tw.clone(),
        y.clone(),
        o,
    );
    assert_mentions("rows", &msg, &["teacher x", "6 rows"]);
    // A teacher hidden size its weight does not have.
    let msg = run(
        x.clone(),
        w.clone(),
        tx.clone(),
        tw.clone().slice([0..v + 1, 0..2]),
        y.clone(),
        o,
    );
    assert_mentions("teacher weight", &msg, &["teacher x", "H = 3"]);
    // Options outside their domain.
    let msg = run(
        x.clone(),
        w.clone(),
        tx.clone(),
        tw.clone(),
        y.clone(),
        o.with_temperature(0.0),
    );
    assert_mentions("temperature", &msg, &["temperature", "positive"]);
    let bad_beta = o.with_divergence(Divergence::Jsd { beta: 1.5 });
    let msg = run(
        x.clone(),
        w.clone(),
        tx.clone(),
        tw.clone(),
        y.clone(),
        bad_beta,
    );
    assert_mentions("beta", &msg, &["beta", "[0, 1]", "1.5"]);
    // A target outside the student's vocabulary.
    let y_bad =
        Tensor::<Bk, 1, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3, 5, 0], [n]), &device);
    let msg = run(x, w, tx, tw, y_bad, o);
    assert_mentions("target", &msg, &["target 5", "[0, 5)"]);
}

/// The full conformance sweep (large vocabularies) of these ops on every backend and dtype
/// of the test device, for real devices: `cargo test --release -p liger-tests --test
/// liger_burn -- --ignored fused_linear_distill_full_sweep`.
#[test]
#[ignore = "full sweep (V up to 128,256, 256 rows): too slow on a software rasterizer; run on a GPU with --ignored"]
fn fused_linear_distill_full_sweep() {
    liger_tests::check_ops_full(liger_verify::conformance::Op::is_distill);
}
