//! liger-models against Hugging Face transformers on the tiny random checkpoints of
//! `models/fixtures/` (made by `models/fixtures/generate.py`): per-token next-token losses,
//! their mean, logits, the loss with masked labels and its gradients, for Llama (llama3
//! RoPE scaling, attention and MLP biases), Qwen2 (q/k/v biases, tied embeddings), Qwen3
//! (q/k norms, head_dim ≠ hidden / heads, sharded checkpoint) and Mistral (sliding window
//! shorter than the sequences, bf16 weights on disk), f32.
//!
//! Every backend of the test device (fusion and plain CubeBackend, both reduction paths)
//! and NdArray, with the kernel switches all off (stock Burn), RMSNorm only, and all on.
//! Tolerance: `|ours - transformers| <= 1e-4 · max(1, |transformers|)`.

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::{CausalLm, HfParam, LigerConfig, evaluate};
use liger_tests::{BackendVisitor, for_each_model_backend};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;

const TOL: f64 = 1e-4;

#[derive(Deserialize)]
struct LogitRow {
    sequence: usize,
    position: usize,
    values: Vec<f32>,
}

#[derive(Deserialize)]
struct Masked {
    sequence: usize,
    labels: Vec<i64>,
    loss: f64,
    grad_norm: HashMap<String, f64>,
    grad: HashMap<String, Vec<f32>>,
}

#[derive(Deserialize)]
struct Expected {
    model_type: String,
    input_ids: Vec<Vec<u32>>,
    token_loss: Vec<Vec<f32>>,
    loss: f64,
    logits: Vec<LogitRow>,
    masked: Masked,
}

fn fixture(name: &str) -> (PathBuf, Expected) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/fixtures")
        .join(name);
    let text = std::fs::read_to_string(dir.join("expected.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("expected.json").display()));
    let expected: Expected = serde_json::from_str(&text).expect("expected.json parses");
    assert_eq!(expected.model_type, name);
    (dir, expected)
}

/// Worst error of a comparison, and the failures.
#[derive(Default)]
struct Report {
    max_abs: f64,
    compared: usize,
    failures: Vec<String>,
}

impl Report {
    fn value(&mut self, what: &str, ours: f64, theirs: f64) {
        let err = (ours - theirs).abs();
        self.compared += 1;
        if err.is_nan() || err > TOL * theirs.abs().max(1.0) {
            self.failures.push(format!(
                "{what}: ours {ours}, transformers {theirs} (error {err:.3e})"
            ));
        }
        if err > self.max_abs || err.is_nan() {
            self.max_abs = err;
        }
    }

    fn values(&mut self, what: &str, ours: &[f32], theirs: &[f32]) {
        assert_eq!(ours.len(), theirs.len(), "{what}: lengths differ");
        let before = self.failures.len();
        for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
            self.value(&format!("{what}[{i}]"), a as f64, b as f64);
        }
        // One line per tensor is enough to locate the problem.
        self.failures.truncate(before + 1);
    }
}

fn configs() -> [(&'static str, LigerConfig); 3] {
    [
        ("none", LigerConfig::none()),
        ("rms_norm", LigerConfig::rms_norm_only()),
        ("all", LigerConfig::all()),
    ]
}

fn int_tensor<B: FusedOps>(rows: &[Vec<i64>], device: &B::Device) -> Tensor<B, 2, Int> {
    let seq = rows[0].len();
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), seq]), device)
}

/// Forward, evaluation and loss of one fixture on one backend, every switch set.
struct Outputs<'a> {
    name: &'a str,
    dir: PathBuf,
    expected: Expected,
    report: Report,
}

impl BackendVisitor for Outputs<'_> {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let e = &self.expected;
        for (switches, liger) in configs() {
            let at = format!("{} {label} liger={switches}", self.name);
            let model = CausalLm::<B>::load(&self.dir, DType::F32, liger, device)
                .unwrap_or_else(|err| panic!("{at}: load: {err}"));

            // Per-token losses of both sequences in one right-padded batch.
            let report = evaluate(&model, e.input_ids.clone()).expect("evaluate");
            for (b, (ours, theirs)) in report.token_loss.iter().zip(&e.token_loss).enumerate() {
                self.report
                    .values(&format!("{at} token_loss[{b}]"), ours, theirs);
            }
            self.report
                .value(&format!("{at} loss"), report.loss, e.loss);

            // Logits of the padded batch at the recorded positions.
            let longest = e.input_ids.iter().map(Vec::len).max().unwrap();
            let padded: Vec<Vec<i64>> = e
                .input_ids
                .iter()
                .map(|s| {
                    let mut row: Vec<i64> = s.iter().map(|&t| t as i64).collect();
                    row.resize(longest, 0);
                    row
                })
                .collect();
            let logits = model.forward(int_tensor::<B>(&padded, device));
            let [_, _, vocab] = logits.dims();
            let logits = logits.into_data().to_vec::<f32>().unwrap();
            for row in &e.logits {
                let start = (row.sequence * longest + row.position) * vocab;
                self.report.values(
                    &format!("{at} logits[{}, {}]", row.sequence, row.position),
                    &logits[start..start + vocab],
                    &row.values,
                );
            }

            // The training loss with masked (-100) labels.
            let m = &e.masked;
            let ids: Vec<i64> = e.input_ids[m.sequence].iter().map(|&t| t as i64).collect();
            let loss = model
                .loss(
                    int_tensor::<B>(&[ids], device),
                    int_tensor::<B>(std::slice::from_ref(&m.labels), device),
                )
                .into_data()
                .to_vec::<f32>()
                .unwrap()[0];
            self.report
                .value(&format!("{at} masked loss"), loss as f64, m.loss);
        }
    }
}

fn outputs_match(name: &str) {
    let (dir, expected) = fixture(name);
    let mut run = Outputs {
        name,
        dir,
        expected,
        report: Report::default(),
    };
    for_each_model_backend(&mut run);
    let r = run.report;
    eprintln!(
        "{name}: {} values compared, max abs error {:.3e}",
        r.compared, r.max_abs
    );
    assert!(
        r.failures.is_empty(),
        "{name} differs from transformers:\n{}",
        r.failures.join("\n")
    );
}

#[test]
fn llama_matches_transformers() {
    outputs_match("llama");
}

#[test]
fn qwen2_matches_transformers() {
    outputs_match("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    outputs_match("qwen3");
}

#[test]
fn mistral_matches_transformers() {
    outputs_match("mistral");
}

/// Gradients of the masked loss through `Autodiff<B>` (switches none and rms_norm) and
/// `Liger<Autodiff<B>>` (all switches): every parameter's gradient norm and two
/// norm-weight gradients in full, against `loss.backward()` in transformers.
struct Gradients {
    report: Report,
}

impl Gradients {
    fn check<B: AutodiffBackend + FusedOps>(
        &mut self,
        at: &str,
        name: &str,
        device: &B::Device,
        switch_sets: &[(&str, LigerConfig)],
    ) where
        B::InnerBackend: FusedOps,
    {
        let (dir, e) = fixture(name);
        for &(switches, liger) in switch_sets {
            let at = format!("{name} {at} liger={switches}");
            let model = CausalLm::<B>::load(&dir, DType::F32, liger, device).expect("load");
            let m = &e.masked;
            let ids: Vec<i64> = e.input_ids[m.sequence].iter().map(|&t| t as i64).collect();
            let loss = model.loss(
                int_tensor::<B>(&[ids], device),
                int_tensor::<B>(std::slice::from_ref(&m.labels), device),
            );
            let grads = loss.backward();
            let params = model.hf_params();
            assert_eq!(params.len(), m.grad_norm.len(), "{at}: parameter count");
            for (hf_name, p) in params {
                let grad: Vec<f32> = match p {
                    HfParam::LinearWeight(w) => {
                        w.val().grad(&grads).map(|g| g.transpose().into_data())
                    }
                    HfParam::Matrix(w) => w.val().grad(&grads).map(|g| g.into_data()),
                    HfParam::Vector(w) => w.val().grad(&grads).map(|g| g.into_data()),
                }
                .unwrap_or_else(|| panic!("{at}: no gradient for {hf_name}"))
                .to_vec()
                .unwrap();
                let norm = grad.iter().map(|&g| (g as f64).powi(2)).sum::<f64>().sqrt();
                let theirs = *m
                    .grad_norm
                    .get(&hf_name)
                    .unwrap_or_else(|| panic!("{at}: transformers has no parameter {hf_name}"));
                self.report
                    .value(&format!("{at} |grad {hf_name}|"), norm, theirs);
                if let Some(full) = m.grad.get(&hf_name) {
                    self.report
                        .values(&format!("{at} grad {hf_name}"), &grad, full);
                }
            }
        }
    }
}

impl BackendVisitor for Gradients {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let [none, rms_norm, all] = configs();
        for name in ["llama", "qwen2", "qwen3", "mistral"] {
            self.check::<Autodiff<B>>(label, name, device, &[none, rms_norm]);
            // The wrapping recommended for training: Burn's softmax / log-softmax
            // primitives (attention, cross entropy) also run the fused kernels.
            self.check::<Liger<Autodiff<B>>>(&format!("liger<{label}>"), name, device, &[all]);
        }
    }
}

#[test]
fn gradients_match_transformers() {
    let mut run = Gradients {
        report: Report::default(),
    };
    for_each_model_backend(&mut run);
    let r = run.report;
    eprintln!(
        "gradients: {} values compared, max abs error {:.3e}",
        r.compared, r.max_abs
    );
    assert!(
        r.failures.is_empty(),
        "gradients differ from transformers:\n{}",
        r.failures.join("\n")
    );
}
