//! Liger-Kernel's chunked losses on the same inputs: every fused post-training op gives
//! the loss, the metrics and the gradients Liger-Kernel's own code computes
//! (`tests/fixtures/liger_chunked/generate.py`, which names the version), on every
//! backend of the test device, in f32, against the verify crate's f64 reference of each
//! op: ours within its f32 bound, Liger-Kernel's within the sum of both evaluations'
//! bounds of ours.

use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional::TokenReference;
use liger_burn::functional::{self, Reference};
use liger_burn::ops::compose::fused_linear_distill::chunk_rows;
use liger_burn::ops::compose::fused_linear_preference::{chunk_pairs, chunk_sequences};
use liger_burn::ops::{
    DistillOptions, Divergence, DivergenceOptions, DivergenceReduction, DpoLossType, FusedOps,
    GrpoLossType, GrpoOptions, KtoOptions, PreferenceLoss, PreferenceOptions,
};
use liger_tests::BackendVisitor;
use liger_tests::tensors::{assert_rejects_wrong, check, named, values};
use liger_verify::conformance::bounds::{U32, accumulation};
use liger_verify::conformance::fused_linear_distill::{self, DistillInputs};
use liger_verify::conformance::fused_linear_preference::{self, PreferenceInputs, RefInputs};
use liger_verify::conformance::fused_linear_rl::{self, RlInputs};
use liger_verify::conformance::linear_cross_entropy::{LinearInputs, TF32_NORMWISE};
use liger_verify::conformance::{Expected, compare_normwise, divergence};
use serde::Deserialize;
use std::collections::BTreeMap;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/liger_chunked/liger_chunked.json"
);

#[derive(Deserialize, Clone, Debug)]
struct Floats {
    shape: Vec<usize>,
    data: Vec<f32>,
}

#[derive(Deserialize, Clone, Debug)]
struct Ints {
    shape: Vec<usize>,
    data: Vec<i64>,
}

#[derive(Deserialize, Clone, Debug)]
struct Case {
    op: String,
    case: String,
    options: serde_json::Value,
    inputs: BTreeMap<String, Floats>,
    int_inputs: BTreeMap<String, Ints>,
    grad_output: f32,
    outputs: BTreeMap<String, Floats>,
    grads: BTreeMap<String, Floats>,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(FIXTURE).unwrap_or_else(|e| {
        panic!("{FIXTURE}: {e} (run tests/fixtures/liger_chunked/generate.py)")
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{FIXTURE}: {e}"))
}

type A<B> = Autodiff<B>;

fn floats<B: FusedOps, const D: usize>(f: &Floats, device: &B::Device) -> Tensor<A<B>, D> {
    Tensor::from_data(TensorData::new(f.data.clone(), f.shape.clone()), device)
}

fn ints<B: FusedOps, const D: usize>(i: &Ints, device: &B::Device) -> Tensor<A<B>, D, Int> {
    Tensor::from_data(TensorData::new(i.data.clone(), i.shape.clone()), device)
}

fn opt_f64(o: &serde_json::Value, key: &str, default: f64) -> f64 {
    o.get(key).and_then(|v| v.as_f64()).unwrap_or(default)
}

fn opt_bool(o: &serde_json::Value, key: &str, default: bool) -> bool {
    o.get(key).and_then(|v| v.as_bool()).unwrap_or(default)
}

fn preference_options(o: &serde_json::Value) -> PreferenceOptions {
    let base = match o["loss"].as_str().unwrap() {
        "dpo" => {
            let t = DpoLossType::from_name(o["loss_type"].as_str().unwrap()).expect("a loss type");
            PreferenceOptions::dpo().with_loss(PreferenceLoss::Dpo(t))
        }
        "orpo" => PreferenceOptions::orpo(),
        "cpo" => PreferenceOptions::cpo(),
        "simpo" => PreferenceOptions::simpo().with_loss(PreferenceLoss::Simpo {
            gamma: opt_f64(o, "gamma", 0.5),
        }),
        other => panic!("unknown preference loss {other}"),
    };
    base.with_beta(opt_f64(o, "beta", base.beta))
        .with_alpha(opt_f64(o, "alpha", base.alpha))
        .with_label_smoothing(opt_f64(o, "label_smoothing", 0.0))
        .with_average_log_prob(opt_bool(o, "average_log_prob", base.average_log_prob))
        .with_compute_nll_loss(opt_bool(o, "compute_nll_loss", base.compute_nll_loss))
}

/// `(name, values)` of every output and gradient of a preference case on `Autodiff<B>`.
fn run_preference<B: FusedOps>(case: &Case, device: &B::Device) -> Vec<(String, Vec<f64>)> {
    let options = preference_options(&case.options);
    let x = floats::<B, 3>(&case.inputs["x"], device).require_grad();
    let w = floats::<B, 2>(&case.inputs["weight"], device).require_grad();
    let b = case
        .inputs
        .get("bias")
        .map(|b| floats::<B, 1>(b, device).require_grad());
    let reference = match case.options.get("reference").and_then(|r| r.as_str()) {
        Some("model") => Reference::Model {
            x: floats::<B, 3>(&case.inputs["ref_x"], device),
            weight: floats::<B, 2>(&case.inputs["ref_weight"], device),
            bias: Some(floats::<B, 1>(&case.inputs["ref_bias"], device)),
        },
        _ => Reference::None,
    };
    let y = ints::<B, 2>(&case.int_inputs["targets"], device);
    let out =
        functional::fused_linear_preference(x.clone(), w.clone(), b.clone(), y, reference, options);
    let grads = (out.loss.clone() * case.grad_output).backward();
    let m = &out.metrics;
    let mut got = vec![
        ("loss".to_string(), values(out.loss.inner())),
        (
            "chosen_logps".into(),
            values(m.chosen_logps.clone().inner()),
        ),
        (
            "rejected_logps".into(),
            values(m.rejected_logps.clone().inner()),
        ),
        (
            "chosen_rewards".into(),
            values(m.chosen_rewards.clone().inner()),
        ),
        (
            "rejected_rewards".into(),
            values(m.rejected_rewards.clone().inner()),
        ),
        (
            "chosen_logits_mean".into(),
            values(m.chosen_logits_mean.clone().inner()),
        ),
        (
            "rejected_logits_mean".into(),
            values(m.rejected_logits_mean.clone().inner()),
        ),
        ("nll_loss".into(), values(m.nll_loss.clone().inner())),
        ("grad x".into(), values(x.grad(&grads).unwrap())),
        ("grad weight".into(), values(w.grad(&grads).unwrap())),
    ];
    if let (Some(r), Some(c)) = (&m.log_odds_ratio, &m.log_odds_chosen) {
        got.push(("log_odds_ratio".into(), values(r.clone().inner())));
        got.push(("log_odds_chosen".into(), values(c.clone().inner())));
    }
    if let Some(b) = &b {
        got.push(("grad bias".into(), values(b.grad(&grads).unwrap())));
    }
    got
}

/// A distillation case: `LigerFusedLinearJSDFunction`, whose `β` 0 and 1 are the KLs.
fn distill_options(o: &serde_json::Value) -> DistillOptions {
    DistillOptions::default()
        .with_divergence(Divergence::Jsd {
            beta: opt_f64(o, "beta", 0.5),
        })
        .with_temperature(opt_f64(o, "temperature", 1.0))
        .with_weights(
            opt_f64(o, "weight_hard_loss", 0.5),
            opt_f64(o, "weight_soft_loss", 0.5),
        )
}

fn run_distill<B: FusedOps>(case: &Case, device: &B::Device) -> Vec<(String, Vec<f64>)> {
    let options = distill_options(&case.options);
    let x = floats::<B, 2>(&case.inputs["x"], device).require_grad();
    let w = floats::<B, 2>(&case.inputs["weight"], device).require_grad();
    let b = case
        .inputs
        .get("bias")
        .map(|b| floats::<B, 1>(b, device).require_grad());
    let out = functional::fused_linear_distill(
        x.clone(),
        w.clone(),
        b.clone(),
        floats::<B, 2>(&case.inputs["teacher_x"], device),
        floats::<B, 2>(&case.inputs["teacher_weight"], device),
        case.inputs
            .get("teacher_bias")
            .map(|b| floats::<B, 1>(b, device)),
        ints::<B, 1>(&case.int_inputs["targets"], device),
        options,
    );
    let grads = (out.loss.clone() * case.grad_output).backward();
    let mut got = vec![
        ("loss".to_string(), values(out.loss.inner())),
        ("soft_loss".into(), values(out.soft_loss.inner())),
        ("hard_loss".into(), values(out.hard_loss.inner())),
        ("grad x".into(), values(x.grad(&grads).unwrap())),
        ("grad weight".into(), values(w.grad(&grads).unwrap())),
    ];
    if let Some(b) = &b {
        got.push(("grad bias".into(), values(b.grad(&grads).unwrap())));
    }
    got
}

fn divergence_options(o: &serde_json::Value) -> DivergenceOptions {
    let divergence = match o["divergence"].as_str().unwrap() {
        "jsd" => Divergence::Jsd {
            beta: opt_f64(o, "beta", 0.5),
        },
        "forward_kl" => Divergence::ForwardKl,
        "tvd" => Divergence::Tvd,
        other => panic!("unknown divergence {other}"),
    };
    let reduction = match o["reduction"].as_str().unwrap() {
        "sum" => DivergenceReduction::Sum,
        "mean" => DivergenceReduction::Mean,
        "batchmean" => DivergenceReduction::BatchMean,
        other => panic!("unknown reduction {other}"),
    };
    DivergenceOptions::new(divergence)
        .with_reduction(reduction)
        .with_log_target(opt_bool(o, "log_target", false))
}

/// A plain divergence case.
fn run_divergence<B: FusedOps>(case: &Case, device: &B::Device) -> Vec<(String, Vec<f64>)> {
    let options = divergence_options(&case.options);
    let x = floats::<B, 2>(&case.inputs["input"], device).require_grad();
    let y = floats::<B, 2>(&case.inputs["target"], device);
    let labels = case
        .int_inputs
        .get("labels")
        .map(|l| ints::<B, 1>(l, device));
    let loss = functional::divergence(x.clone(), y, labels, options);
    let grads = (loss.clone() * case.grad_output).backward();
    vec![
        ("loss".to_string(), values(loss.inner())),
        ("grad input".into(), values(x.grad(&grads).unwrap())),
    ]
}

/// A KTO case; Liger-Kernel reports sums over each side, formed here from the
/// per-sequence metrics.
fn run_kto<B: FusedOps>(case: &Case, device: &B::Device) -> Vec<(String, Vec<f64>)> {
    let o = &case.options;
    let options = KtoOptions::default()
        .with_beta(opt_f64(o, "beta", 0.1))
        .with_average_log_prob(opt_bool(o, "average_log_prob", false));
    let x = floats::<B, 3>(&case.inputs["x"], device).require_grad();
    let w = floats::<B, 2>(&case.inputs["weight"], device).require_grad();
    let b = case
        .inputs
        .get("bias")
        .map(|b| floats::<B, 1>(b, device).require_grad());
    let reference = match o.get("reference").and_then(|r| r.as_str()) {
        Some("model") => Reference::Model {
            x: floats::<B, 3>(&case.inputs["ref_x"], device),
            weight: floats::<B, 2>(&case.inputs["ref_weight"], device),
            bias: Some(floats::<B, 1>(&case.inputs["ref_bias"], device)),
        },
        _ => Reference::None,
    };
    let labels = ints::<B, 1>(&case.int_inputs["labels"], device);
    let out = functional::fused_linear_kto(
        x.clone(),
        w.clone(),
        b.clone(),
        ints::<B, 2>(&case.int_inputs["targets"], device),
        labels,
        reference,
        case.inputs.get("kl").map(|k| floats::<B, 1>(k, device)),
        options,
    );
    let grads = (out.loss.clone() * case.grad_output).backward();
    let m = &out.metrics;
    let d = values(m.desirable.clone().inner());
    let sums = |t: Tensor<A<B>, 1>| {
        let v = values(t.inner());
        let chosen: f64 = v.iter().zip(&d).map(|(a, d)| a * d).sum();
        let rejected: f64 = v.iter().zip(&d).map(|(a, d)| a * (1.0 - d)).sum();
        (vec![chosen], vec![rejected])
    };
    let (cl, rl) = sums(m.logps.clone());
    let (cg, rg) = sums(m.logits_sum.clone());
    let (cr, rr) = sums(m.rewards.clone());
    let mut got = vec![
        ("loss".to_string(), values(out.loss.inner())),
        ("chosen_logps_sum".into(), cl),
        ("rejected_logps_sum".into(), rl),
        ("chosen_logits_sum".into(), cg),
        ("rejected_logits_sum".into(), rg),
        ("chosen_rewards_sum".into(), cr),
        ("rejected_rewards_sum".into(), rr),
        ("grad x".into(), values(x.grad(&grads).unwrap())),
        ("grad weight".into(), values(w.grad(&grads).unwrap())),
    ];
    if let Some(b) = &b {
        got.push(("grad bias".into(), values(b.grad(&grads).unwrap())));
    }
    got
}

/// A GRPO case.
fn grpo_options(o: &serde_json::Value) -> GrpoOptions {
    let loss_type = match o["loss_type"].as_str().unwrap() {
        "grpo" => GrpoLossType::Grpo,
        "bnpo" => GrpoLossType::Bnpo,
        "dapo" => GrpoLossType::Dapo,
        "dr_grpo" => GrpoLossType::DrGrpo {
            max_completion_length: o["max_completion_length"].as_u64().unwrap() as usize,
        },
        other => panic!("unknown loss type {other}"),
    };
    GrpoOptions::default()
        .with_beta(opt_f64(o, "beta", 0.04))
        .with_epsilon(
            opt_f64(o, "epsilon_low", 0.2),
            opt_f64(o, "epsilon_high", 0.2),
        )
        .with_loss_type(loss_type)
        .with_temperature(opt_f64(o, "temperature", 1.0))
}

fn run_grpo<B: FusedOps>(case: &Case, device: &B::Device) -> Vec<(String, Vec<f64>)> {
    let o = &case.options;
    let options = grpo_options(o);
    let x = floats::<B, 3>(&case.inputs["x"], device).require_grad();
    let w = floats::<B, 2>(&case.inputs["weight"], device).require_grad();
    let b = case
        .inputs
        .get("bias")
        .map(|b| floats::<B, 1>(b, device).require_grad());
    let reference = match o["reference"].as_str().unwrap() {
        "model" => TokenReference::Model {
            x: floats::<B, 3>(&case.inputs["ref_x"], device),
            weight: floats::<B, 2>(&case.inputs["ref_weight"], device),
            bias: Some(floats::<B, 1>(&case.inputs["ref_bias"], device)),
        },
        "given" => TokenReference::LogProbs(floats::<B, 2>(&case.inputs["ref_logps"], device)),
        _ => TokenReference::None,
    };
    let out = functional::fused_linear_grpo(
        x.clone(),
        w.clone(),
        b.clone(),
        ints::<B, 2>(&case.int_inputs["completion_ids"], device),
        ints::<B, 2>(&case.int_inputs["completion_mask"], device),
        floats::<B, 1>(&case.inputs["advantages"], device),
        reference,
        case.inputs
            .get("old_logps")
            .map(|o| floats::<B, 2>(o, device)),
        options,
    );
    let grads = (out.loss.clone() * case.grad_output).backward();
    let mut got = vec![
        ("loss".to_string(), values(out.loss.inner())),
        ("clip_ratio".into(), values(out.clip_ratio.inner())),
        ("grad x".into(), values(x.grad(&grads).unwrap())),
        ("grad weight".into(), values(w.grad(&grads).unwrap())),
    ];
    if options.beta != 0.0 {
        got.push(("kl".into(), values(out.kl.inner())));
    }
    if let Some(b) = &b {
        got.push(("grad bias".into(), values(b.grad(&grads).unwrap())));
    }
    got
}

/// A float input of a case as f64 values.
fn f64s(case: &Case, name: &str) -> Vec<f64> {
    case.inputs[name]
        .data
        .iter()
        .map(|&v| f64::from(v))
        .collect()
}

/// The policy head of a post-training case (`x: [S, T, H]`, `weight: [V, H]`, an optional
/// bias) and its reference model (`options.reference`: a frozen head, given per-token
/// log-probabilities, or none) as f64 values.
struct Head {
    x: Vec<f64>,
    w: Vec<f64>,
    b: Option<Vec<f64>>,
    /// `(S, T, H, V)`.
    dims: (usize, usize, usize, usize),
    kind: String,
    ref_x: Vec<f64>,
    ref_w: Vec<f64>,
    ref_b: Option<Vec<f64>>,
    given: Vec<f64>,
}

impl Head {
    fn new(case: &Case) -> Self {
        let f = |name: &str| f64s(case, name);
        let [s, t, h] = case.inputs["x"].shape[..] else {
            panic!("{} {}: x is [S, T, H]", case.op, case.case)
        };
        let kind = case.options.get("reference").and_then(|r| r.as_str());
        let kind = kind.unwrap_or("none").to_string();
        let model = kind == "model";
        Head {
            x: f("x"),
            w: f("weight"),
            b: case.inputs.contains_key("bias").then(|| f("bias")),
            dims: (s, t, h, case.inputs["weight"].shape[0]),
            ref_x: if model { f("ref_x") } else { vec![] },
            ref_w: if model { f("ref_weight") } else { vec![] },
            ref_b: model.then(|| f("ref_bias")),
            given: if kind == "given" {
                f("ref_logps")
            } else {
                vec![]
            },
            kind,
        }
    }

    fn reference(&self) -> RefInputs<'_> {
        match self.kind.as_str() {
            "model" => RefInputs::Model {
                x: &self.ref_x,
                w: &self.ref_w,
                b: self.ref_b.as_deref(),
                hidden: self.ref_x.len() / (self.dims.0 * self.dims.1),
            },
            "given" => RefInputs::LogProbs(&self.given),
            _ => RefInputs::None,
        }
    }

    fn linear<'a>(&'a self, targets: &'a [i64]) -> LinearInputs<'a> {
        LinearInputs {
            x: &self.x,
            w: &self.w,
            b: self.b.as_deref(),
            targets,
            class_weight: None,
            g: &[],
        }
    }
}

/// The f64 reference of a case with its f32 bounds, for our evaluation and for
/// Liger-Kernel's (which takes the whole batch in one chunk).
fn references(case: &Case) -> [Vec<Expected>; 2] {
    let f = |name: &str| f64s(case, name);
    let g = f64::from(case.grad_output);
    match case.op.as_str() {
        "divergence" => {
            let shape = &case.inputs["input"].shape;
            let labels = case.int_inputs.get("labels").map(|l| l.data.clone());
            let expected = divergence::expected(
                &divergence_options(&case.options),
                DType::F32,
                (shape[0], shape[1]),
                &f("input"),
                &f("target"),
                labels.as_deref(),
                &[g],
            );
            [expected.clone(), expected]
        }
        "fused_linear_distill" => {
            let (x, w, tx, tw) = (f("x"), f("weight"), f("teacher_x"), f("teacher_weight"));
            let (b, tb) = (
                case.inputs.contains_key("bias").then(|| f("bias")),
                case.inputs
                    .contains_key("teacher_bias")
                    .then(|| f("teacher_bias")),
            );
            let targets = &case.int_inputs["targets"].data;
            let [n, h] = case.inputs["x"].shape[..] else {
                panic!("x: [N, H]")
            };
            let (v, ht) = (
                case.inputs["weight"].shape[0],
                case.inputs["teacher_x"].shape[1],
            );
            let vt = case.inputs["teacher_weight"].shape[0];
            let head = |x, w, b| LinearInputs {
                x,
                w,
                b,
                targets,
                class_weight: None,
                g: &[],
            };
            let inputs = DistillInputs {
                student: head(&x, &w, b.as_deref()),
                teacher: head(&tx, &tw, tb.as_deref()),
                g,
            };
            let options = distill_options(&case.options);
            let with_chunk = |chunk| {
                fused_linear_distill::expected(
                    &options,
                    DType::F32,
                    (n, h, ht, v, vt),
                    &inputs,
                    chunk,
                )
            };
            [with_chunk(chunk_rows(n, h, vt)), with_chunk(n)]
        }
        "fused_linear_preference" => {
            let head = Head::new(case);
            let (s, t, h, v) = head.dims;
            let inputs = PreferenceInputs {
                x: &head.x,
                w: &head.w,
                b: head.b.as_deref(),
                targets: &case.int_inputs["targets"].data,
                reference: head.reference(),
                g,
            };
            let options = preference_options(&case.options);
            let pairs = s / 2;
            let with_chunk = |chunk| {
                fused_linear_preference::expected(
                    &options,
                    DType::F32,
                    (pairs, t, h, v),
                    &inputs,
                    chunk,
                )
            };
            [with_chunk(chunk_pairs(pairs, t, h, v)), with_chunk(pairs)]
        }
        "fused_linear_kto" => {
            let head = Head::new(case);
            let (seqs, t, h, v) = head.dims;
            let inputs = RlInputs {
                head: head.linear(&case.int_inputs["targets"].data),
                reference: head.reference(),
                g,
            };
            let labels = &case.int_inputs["labels"].data;
            let kl = case.inputs.get("kl").map_or(0.0, |k| f64::from(k.data[0]));
            let options = KtoOptions::default()
                .with_beta(opt_f64(&case.options, "beta", 0.1))
                .with_average_log_prob(opt_bool(&case.options, "average_log_prob", false));
            let with_chunk = |chunk| {
                let mut expected = fused_linear_rl::kto_expected(
                    &options,
                    DType::F32,
                    (seqs, t, h, v),
                    &inputs,
                    labels,
                    kl,
                    chunk,
                );
                expected.extend(side_sums(&expected, labels));
                expected
            };
            [with_chunk(chunk_sequences(seqs, t, h, v)), with_chunk(seqs)]
        }
        "fused_linear_grpo" => {
            let head = Head::new(case);
            let (seqs, t, h, v) = head.dims;
            // The reference reads the completion ids with -100 outside the mask.
            let ids = &case.int_inputs["completion_ids"].data;
            let mask = &case.int_inputs["completion_mask"].data;
            let targets: Vec<i64> = ids
                .iter()
                .zip(mask)
                .map(|(&id, &m)| if m != 0 { id } else { -100 })
                .collect();
            let inputs = RlInputs {
                head: head.linear(&targets),
                reference: head.reference(),
                g,
            };
            let old = case
                .inputs
                .contains_key("old_logps")
                .then(|| f("old_logps"));
            let options = grpo_options(&case.options);
            let with_chunk = |chunk| {
                fused_linear_rl::grpo_expected(
                    &options,
                    DType::F32,
                    (seqs, t, h, v),
                    &inputs,
                    &f("advantages"),
                    old.as_deref(),
                    chunk,
                )
            };
            [with_chunk(chunk_sequences(seqs, t, h, v)), with_chunk(seqs)]
        }
        other => panic!("unknown op {other} in the fixture"),
    }
}

/// Liger-Kernel's KTO metrics: the per-sequence log-probabilities, logit sums and rewards
/// summed over the desirable (label 1) and the undesirable sequences, from the reference's
/// per-sequence values. Each sum's bound is its terms' bounds plus an f32 accumulation of
/// the terms and its store (Liger-Kernel sums in f32; the test sums ours in f64, within
/// the same bound).
fn side_sums(expected: &[Expected], labels: &[i64]) -> Vec<Expected> {
    let mut out = Vec::new();
    for (metric, names) in [
        ("logps", ["chosen_logps_sum", "rejected_logps_sum"]),
        ("logits_sum", ["chosen_logits_sum", "rejected_logits_sum"]),
        ("rewards", ["chosen_rewards_sum", "rejected_rewards_sum"]),
    ] {
        let e = named(expected, metric);
        for (name, desirable) in names.into_iter().zip([1, 0]) {
            let picked: Vec<usize> = (0..labels.len())
                .filter(|&q| labels[q] == desirable)
                .collect();
            let total: f64 = picked.iter().map(|&q| e.values[q]).sum();
            let l1: f64 = picked.iter().map(|&q| e.values[q].abs()).sum();
            let bound = picked.iter().map(|&q| e.bounds[q]).sum::<f64>()
                + accumulation(picked.len(), l1)
                + U32 * total.abs();
            out.push(Expected::new(name, vec![total], vec![bound], 1));
        }
    }
    out
}

struct Fixtures {
    fixture: Fixture,
    cases: usize,
}

impl BackendVisitor for Fixtures {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        // Where the backend's f32 matmul is TF32 (CUDA), the reference model's head runs
        // on it: every result inherits TF32's rounding, so norm-wise within its bound.
        let tf32 = liger_tests::stock_matmul_is_tf32::<B>(
            (64, 64, 64),
            device,
            &mut liger_tests::fresh_rng(),
        );
        for case in &self.fixture.cases {
            let got = match case.op.as_str() {
                "fused_linear_preference" => run_preference::<B>(case, device),
                "fused_linear_distill" => run_distill::<B>(case, device),
                "divergence" => run_divergence::<B>(case, device),
                "fused_linear_kto" => run_kto::<B>(case, device),
                "fused_linear_grpo" => run_grpo::<B>(case, device),
                other => panic!("unknown op {other} in the fixture"),
            };
            let at = format!("{} {}", case.op, case.case);
            let references = references(case);
            for (name, actual) in &got {
                let liger: Vec<f64> = match name.strip_prefix("grad ") {
                    Some(g) => &case.grads[g],
                    None => &case.outputs[name.as_str()],
                }
                .data
                .iter()
                .map(|&v| f64::from(v))
                .collect();
                let what = format!("{at} {name}");
                if tf32 {
                    check(
                        label,
                        &what,
                        compare_normwise("value", actual, &liger, TF32_NORMWISE),
                    );
                    continue;
                }
                let tensor = name.replace(' ', "_");
                let [ours, theirs] = references
                    .each_ref()
                    .map(|r| r.iter().find(|e| e.tensor == tensor));
                let (Some(ours), Some(theirs)) = (ours, theirs) else {
                    panic!("{label} {what}: the f64 reference has no `{tensor}`");
                };
                // Ours within its bound of the f64 value; Liger-Kernel's, another f32
                // evaluation of the definition, within the sum of both bounds of ours.
                check(label, &what, ours.check(actual));
                check(
                    label,
                    &format!("{what} (against Liger-Kernel)"),
                    ours.against(liger, &theirs.bounds).check(actual),
                );
                assert_rejects_wrong(ours, &format!("{label} {what}"));
            }
            self.cases += 1;
        }
    }
}

#[test]
fn chunked_losses_match_liger_kernel() {
    let mut v = Fixtures {
        fixture: fixture(),
        cases: 0,
    };
    liger_tests::for_each_backend(&mut v);
    assert!(v.cases > 0, "no case ran");
}
