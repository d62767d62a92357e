//! liger-models against Hugging Face transformers on the tiny random checkpoints of
//! `models/fixtures/` (made by `models/fixtures/generate.py`): per-token next-token losses,
//! their mean, logits, the loss with masked labels and its gradients, for Llama (llama3
//! RoPE scaling, attention and MLP biases), Qwen2 (q/k/v biases, tied embeddings), Qwen3
//! (q/k norms, head_dim ≠ hidden / heads, sharded checkpoint) and Mistral (sliding window
//! shorter than the sequences, bf16 weights on disk), f32.
//!
//! Every backend of the test device (fusion and plain CubeBackend, both reduction paths)
//! and NdArray, with the kernel switches all off (stock Burn), RMSNorm only, and all on.
//! Tolerance of the values: `|ours - transformers| <= 1e-4 · max(1, |transformers|)`.
//! Gradients: every parameter's full gradient, norm-wise against transformers' f64
//! gradient (`grads.safetensors`) within [`GRAD_TOL`].

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

pub(crate) const TOL: f64 = 1e-4;

/// Norm-wise relative error allowed for an f32 gradient of these models against the f64
/// one: `D · n · u₃₂`. Forward and backward through two decoder layers are at most
/// `D = 90` stages (per layer: two RMSNorms, the projections, RoPE, scores, softmax, the
/// weighted sum, the output projection, SwiGLU and the residual adds, about 13; the final
/// norm, `lm_head` and the cross entropy; the backward about twice the forward), each a
/// reduction over at most `n = 128` terms (vocabulary 128, hidden 64, MLP 96, 13
/// positions), whose f32 evaluation errs by at most `γ_n = n·u₃₂` relative at first
/// order. Random weights of standard deviation `1/√fan_in` keep each stage's gain near
/// one, so the errors add up without amplification; transformers' own f32 gradients,
/// recorded per parameter in the fixtures, are held to the same bound, which checks that
/// premise on every fixture.
pub(crate) const GRAD_TOL: f64 = 90.0 * 128.0 / 16_777_216.0;

/// `‖ours − reference‖ / ‖reference‖`, infinite when a value is not finite or the lengths
/// differ.
pub(crate) fn normwise_error(ours: &[f32], reference: &[f32]) -> f64 {
    if ours.len() != reference.len() || ours.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0.0, 0.0);
    for (&a, &r) in ours.iter().zip(reference) {
        diff += (f64::from(a) - f64::from(r)).powi(2);
        norm += f64::from(r).powi(2);
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Every parameter's gradient of the masked loss (transformers, f64, stored as f32).
fn reference_grads(dir: &std::path::Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("grads.safetensors"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("grads.safetensors").display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("grads.safetensors parses");
    file.tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let values = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (t.shape().to_vec(), values))
        })
        .collect()
}

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
    /// Per parameter, `‖g_f32 − g_f64‖ / ‖g_f64‖` of transformers' own f32 gradient.
    grad_f32_error: HashMap<String, f64>,
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
    /// Largest norm-wise relative error of a gradient.
    max_grad_error: f64,
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

    /// A whole gradient, norm-wise within [`GRAD_TOL`].
    fn gradient(&mut self, what: &str, ours: &[f32], theirs: &[f32]) {
        let err = normwise_error(ours, theirs);
        self.compared += 1;
        if !(err <= GRAD_TOL) {
            self.failures.push(format!(
                "{what}: ‖ours − transformers‖/‖transformers‖ = {err:.3e} > {GRAD_TOL:.3e}"
            ));
        }
        if err > self.max_grad_error || err.is_nan() {
            self.max_grad_error = err;
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
/// `Liger<Autodiff<B>>` (all switches): every parameter's full gradient, in Hugging Face
/// layout, norm-wise against transformers' f64 `loss.backward()` within [`GRAD_TOL`].
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
        let reference = reference_grads(&dir);
        for (hf_name, err) in &e.masked.grad_f32_error {
            // The bound's premise: transformers' own f32 gradient is within it.
            self.report.compared += 1;
            if !(*err <= GRAD_TOL) {
                self.report.failures.push(format!(
                    "{name}: transformers' f32 gradient of {hf_name} is {err:.3e} from its f64 one, beyond {GRAD_TOL:.3e}"
                ));
            }
        }
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
            assert_eq!(params.len(), reference.len(), "{at}: parameter count");
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
                let (shape, theirs) = reference
                    .get(&hf_name)
                    .unwrap_or_else(|| panic!("{at}: transformers has no parameter {hf_name}"));
                assert_eq!(p.hf_shape(), *shape, "{at}: shape of {hf_name}");
                self.report
                    .gradient(&format!("{at} grad {hf_name}"), &grad, theirs);
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
        "gradients: {} tensors compared, max norm-wise error {:.3e} (bound {GRAD_TOL:.3e})",
        r.compared, r.max_grad_error
    );
    assert!(
        r.failures.is_empty(),
        "gradients differ from transformers:\n{}",
        r.failures.join("\n")
    );
}

/// The gradient comparison rejects a transposed attention projection gradient (`q_proj`,
/// `o_proj`; the transpose's buffer read with the right shape, as a kernel that writes
/// the wrong layout would leave it) of every fixture, and accepts the reference itself.
#[test]
fn transposed_attention_gradients_are_rejected() {
    for name in ["llama", "qwen2", "qwen3", "mistral"] {
        let (dir, _) = fixture(name);
        let grads = reference_grads(&dir);
        for proj in ["q_proj", "o_proj"] {
            let key = format!("model.layers.0.self_attn.{proj}.weight");
            let (shape, g) = &grads[&key];
            assert_eq!(normwise_error(g, g), 0.0);
            let (rows, cols) = (shape[0], shape[1]);
            // The transpose's buffer (`[cols, rows]`, row-major) read with the shape.
            let transposed: Vec<f32> = (0..rows * cols)
                .map(|k| g[(k % rows) * cols + k / rows])
                .collect();
            let err = normwise_error(&transposed, g);
            assert!(
                err > GRAD_TOL,
                "{name} {key}: a transposed gradient passes ({err:.3e} within {GRAD_TOL:.3e})"
            );
        }
    }
}
