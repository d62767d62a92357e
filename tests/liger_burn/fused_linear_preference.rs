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

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::functional::{self, Reference};
use liger_burn::ops::{DpoLossType, FusedOps, PreferenceLoss, PreferenceOptions};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::values;
use liger_verify::conformance::Rng;

const B: usize = 2;
const T: usize = 5;
const H: usize = 6;
const V: usize = 9;

struct Batch {
    x: Vec<f32>,
    w: Vec<f32>,
    targets: Vec<i64>,
}

fn batch(rng: &mut Rng) -> Batch {
    Batch {
        x: rng.vec(2 * B * T * H, -1.0, 1.0, 0.0),
        w: rng.vec(V * H, -0.5, 0.5, 0.0),
        targets: (0..2 * B * T)
            .map(|i| {
                if i % T == 0 {
                    -100
                } else {
                    rng.below(V) as i64
                }
            })
            .collect(),
    }
}

fn tensors<Bk: burn::tensor::backend::Backend>(
    data: &Batch,
    device: &Bk::Device,
) -> (Tensor<Bk, 3>, Tensor<Bk, 2>, Tensor<Bk, 2, Int>) {
    (
        Tensor::from_data(TensorData::new(data.x.clone(), [2 * B, T, H]), device),
        Tensor::from_data(TensorData::new(data.w.clone(), [V, H]), device),
        Tensor::from_data(TensorData::new(data.targets.clone(), [2 * B, T]), device),
    )
}

/// The loss and the gradients of x and the weight on an autodiff backend.
fn loss_and_grads<A: AutodiffBackend + FusedOps>(
    data: &Batch,
    options: PreferenceOptions,
    device: &A::Device,
) -> [Vec<f64>; 3] {
    let (x, w, y) = tensors::<A>(data, device);
    let (x, w) = (x.require_grad(), w.require_grad());
    let out = functional::fused_linear_preference(
        x.clone(),
        w.clone(),
        None,
        y,
        Reference::None,
        options,
    );
    let grads = (out.loss.clone() * 0.75).backward();
    [
        values(out.loss.inner()),
        values(x.grad(&grads).unwrap()),
        values(w.grad(&grads).unwrap()),
    ]
}

/// `Liger<Autodiff<B>>` routes the op to autodiff's node: the same loss and gradients as
/// `Autodiff<B>`, bit for bit (the same computation).
#[test]
fn the_decorator_routes_to_the_autodiff_node() {
    let mut rng = Rng::new(3);
    let data = batch(&mut rng);
    let device = Default::default();
    for options in [PreferenceOptions::dpo(), PreferenceOptions::orpo()] {
        let plain = loss_and_grads::<Autodiff<NdArray>>(&data, options, &device);
        let decorated = loss_and_grads::<Liger<Autodiff<NdArray>>>(&data, options, &device);
        assert_eq!(plain, decorated, "{:?}", options.loss);
        assert!(plain[1].iter().any(|g| *g != 0.0), "a gradient reached x");
    }
}

/// Without any tracked input the op runs forward only: the same loss, no gradients.
#[test]
fn untracked_inputs_give_the_loss_alone() {
    let mut rng = Rng::new(4);
    let data = batch(&mut rng);
    let device = Default::default();
    let (x, w, y) = tensors::<Autodiff<NdArray>>(&data, &device);
    let options = PreferenceOptions::simpo();
    let out = functional::fused_linear_preference(x, w, None, y, Reference::None, options);
    let tracked = loss_and_grads::<Autodiff<NdArray>>(&data, options, &device);
    assert_eq!(values(out.loss.inner()), tracked[0]);
}

/// TRL's derived metrics agree with the per-pair rewards.
#[test]
fn margins_and_accuracies_follow_the_rewards() {
    let mut rng = Rng::new(5);
    let data = batch(&mut rng);
    let device = Default::default();
    let (x, w, y) = tensors::<NdArray>(&data, &device);
    let out = functional::fused_linear_preference(
        x,
        w,
        None,
        y,
        Reference::None,
        PreferenceOptions::cpo(),
    );
    let m = &out.metrics;
    let (c, r) = (
        values(m.chosen_rewards.clone()),
        values(m.rejected_rewards.clone()),
    );
    let accuracy = c.iter().zip(&r).filter(|(c, r)| c > r).count() as f64 / B as f64;
    let trl: std::collections::BTreeMap<_, _> = m.to_trl().into_iter().collect();
    assert_eq!(trl["rewards/accuracies"], accuracy);
    let margin = c.iter().zip(&r).map(|(c, r)| c - r).sum::<f64>() / B as f64;
    assert!((trl["rewards/margins"] - margin).abs() < 1e-6);
    assert!(
        !trl.contains_key("log_odds_ratio"),
        "ORPO's metrics only for ORPO"
    );
}

/// Bad input: a clear error naming the op, before any work (shapes, dtypes, options), or
/// once the work is queued (targets).
#[test]
fn bad_input_is_rejected() {
    type Bk = NdArray;
    let device = Default::default();
    let mut rng = Rng::new(6);
    let data = batch(&mut rng);
    let (x, w, y) = tensors::<Bk>(&data, &device);
    let run = |x: Tensor<Bk, 3>, w: Tensor<Bk, 2>, y: Tensor<Bk, 2, Int>, r: Reference<Bk>, o| {
        panic_message(|| {
            functional::fused_linear_preference(x, w, None, y, r, o);
        })
    };
    let dpo = PreferenceOptions::dpo();
    // Chosen and rejected batches that differ: an odd number of sequences.
    let odd = x.clone().slice(0..3);
    let msg = run(odd, w.clone(), y.clone().slice(0..3), Reference::None, dpo);
    assert_mentions(
        "odd batch",
        &msg,
        &["fused_linear_preference", "odd", "[3, 5, 6]"],
    );
    // Targets of another shape.
    let msg = run(
        x.clone(),
        w.clone(),
        y.clone().slice([0..4, 0..4]),
        Reference::None,
        dpo,
    );
    assert_mentions("targets", &msg, &["targets", "[4, 5]", "[4, 4]"]);
    // A hidden size the weight does not have.
    let msg = run(
        x.clone(),
        w.clone().slice([0..V, 0..4]),
        y.clone(),
        Reference::None,
        dpo,
    );
    assert_mentions("weight", &msg, &["weight", "H = 6"]);
    // A reference head of another vocabulary.
    let reference = Reference::Model {
        x: x.clone(),
        weight: w.clone().slice(0..V - 1),
        bias: None,
    };
    let msg = run(x.clone(), w.clone(), y.clone(), reference, dpo);
    assert_mentions("reference vocab", &msg, &["vocabulary", "8", "9"]);
    // Reference log-probabilities of the wrong length.
    let given = Tensor::<Bk, 1>::zeros([3], &device);
    let msg = run(
        x.clone(),
        w.clone(),
        y.clone(),
        Reference::LogProbs(given),
        dpo,
    );
    assert_mentions(
        "given reference",
        &msg,
        &["reference log-probabilities", "[4]", "[3]"],
    );
    // A reference for a loss without one.
    let given = Tensor::<Bk, 1>::zeros([4], &device);
    let msg = run(
        x.clone(),
        w.clone(),
        y.clone(),
        Reference::LogProbs(given),
        PreferenceOptions::orpo(),
    );
    assert_mentions("orpo reference", &msg, &["orpo uses no reference"]);
    // Options outside their domain.
    let robust = dpo
        .with_loss(PreferenceLoss::Dpo(DpoLossType::Robust))
        .with_label_smoothing(0.5);
    let msg = run(x.clone(), w.clone(), y.clone(), Reference::None, robust);
    assert_mentions("robust", &msg, &["label_smoothing", "robust", "0.5"]);
    let exo = dpo.with_loss(PreferenceLoss::Dpo(DpoLossType::ExoPair));
    let msg = run(x.clone(), w.clone(), y.clone(), Reference::None, exo);
    assert_mentions("exo_pair", &msg, &["exo_pair", "(0, 1)"]);
    // An empty completion: every position of a sequence ignored.
    let mut targets = data.targets.clone();
    targets[3 * T..4 * T].iter_mut().for_each(|t| *t = -100);
    let y_empty = Tensor::<Bk, 2, Int>::from_data(TensorData::new(targets, [2 * B, T]), &device);
    let msg = run(x.clone(), w.clone(), y_empty, Reference::None, dpo);
    assert_mentions(
        "empty completion",
        &msg,
        &["sequence 3", "empty completion"],
    );
    // A target outside the vocabulary.
    let mut targets = data.targets.clone();
    targets[7] = V as i64;
    let y_bad = Tensor::<Bk, 2, Int>::from_data(TensorData::new(targets, [2 * B, T]), &device);
    let msg = run(x, w, y_bad, Reference::None, dpo);
    assert_mentions("target", &msg, &["target 9", "[0, 9)"]);
}

/// The full conformance sweep (large vocabularies) of these ops on every backend and dtype
/// of the test device, for real devices: `cargo test --release -p liger-tests --test
/// liger_burn -- --ignored fused_linear_preference_full_sweep`.
#[test]
#[ignore = "full sweep (V up to 128,256, 16 pairs): too slow on a software rasterizer; run on a GPU with --ignored"]
fn fused_linear_preference_full_sweep() {
    liger_tests::check_ops_full(liger_verify::conformance::Op::is_preference);
}
