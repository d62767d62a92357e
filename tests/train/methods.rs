//! `liger train --method`: each post-training method converges on the bundled data with
//! the bundled model shape (NdArray, `Liger<Autodiff<NdArray>>`): DPO's and KTO's reward
//! margins and DPO's preference accuracy rise, ORPO's, CPO's and SimPO's losses fall,
//! distillation's KL to a teacher falls; a resumed DPO run repeats the uninterrupted one
//! bit for bit (the reference rebuilt from the seed); the data formats' errors.

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use liger_burn::Liger;
use liger_burn::functional::{self, Reference};
use liger_burn::ops::{DistillOptions, Divergence, KtoOptions, PreferenceOptions};
use liger_models::{CausalLm, LigerConfig};
use liger_train::batching::epoch_pair_batches;
use liger_train::checkpoint;
use liger_train::data::{self, BadLinePolicy, DataKind, DataOptions, Dataset, TooLongPolicy};
use liger_train::method::MethodConfig;
use liger_train::metrics::TrainSummary;
use liger_train::tokenizer::TextTokenizer;
use liger_train::trainer::{self, Resume, Run, TrainConfig};
use liger_train::{TrainError, bundled};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

type B = Liger<Autodiff<NdArray>>;
type Inner = Liger<NdArray>;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "liger-method-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MAX_LENGTH: usize = 64;

fn dataset(tok: &TextTokenizer, kind: DataKind, rows: usize) -> Dataset {
    let (text, _) = bundled::dataset_for(kind);
    let text: String = text.lines().take(rows).map(|l| format!("{l}\n")).collect();
    data::prepare_post(
        &text,
        "bundled (head)",
        tok,
        DataOptions {
            max_length: MAX_LENGTH,
            on_bad_line: BadLinePolicy::Fail,
            on_too_long: TooLongPolicy::Truncate,
        },
        kind,
    )
    .unwrap()
}

fn config(method: MethodConfig, steps: usize, lr: f64, save_every: usize) -> TrainConfig {
    let mut c = TrainConfig::random_model_defaults(steps, save_every);
    c.max_length = MAX_LENGTH;
    c.batch_size = 4;
    c.schedule.peak_lr = lr;
    c.method = method;
    c
}

/// The bundled model at random, from the config's seed ([`backend_rng`] held: the
/// generator is shared with the other tests of the binary).
///
/// [`backend_rng`]: crate::training::backend_rng
fn model(tok: &TextTokenizer, seed: u64) -> CausalLm<B> {
    let _rng = crate::training::backend_rng();
    trainer::random_model::<B>(
        &bundled::model_config_for(tok),
        LigerConfig::all(),
        burn::tensor::DType::F32,
        &Default::default(),
        seed,
    )
}

/// The policy and its frozen reference: the same parameters on the inner backend (the
/// optimizer's updates write new buffers while the reference holds the old ones).
fn policy_and_reference(tok: &TextTokenizer, seed: u64) -> (CausalLm<B>, CausalLm<Inner>) {
    let policy = model(tok, seed);
    let reference = policy.valid();
    (policy, reference)
}

fn train(
    model: CausalLm<B>,
    frozen: Option<CausalLm<Inner>>,
    dataset: &Dataset,
    tok: &TextTokenizer,
    config: TrainConfig,
    output: &Path,
    resume: Option<Resume<B>>,
) -> Result<TrainSummary, TrainError> {
    trainer::train(
        Run {
            model,
            dataset,
            tokenizer: tok,
            config,
            output: output.to_path_buf(),
            resume,
            memory: None,
            kernels: "test".into(),
            frozen,
            base_model: None,
        },
        &mut (),
    )
}

/// The mean of metric `name` over steps `range` of a run, over the steps that have it
/// (KTO's side means are NaN on a step whose batches hold no completion of that side).
fn mean(s: &TrainSummary, name: &str, range: std::ops::Range<usize>) -> f64 {
    let values: Vec<f64> = s.history[range]
        .iter()
        .map(|m| {
            m.extra
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no metric {name}"))
                .1
        })
        .filter(|v| !v.is_nan())
        .collect();
    values.iter().sum::<f64>() / values.len() as f64
}

fn loss_mean(s: &TrainSummary, range: std::ops::Range<usize>) -> f64 {
    let l: Vec<f64> = s.history[range].iter().map(|m| m.loss).collect();
    l.iter().sum::<f64>() / l.len() as f64
}

/// The mean reward margin and the preference accuracy of `policy` against `reference` on
/// every pair of `data` (no gradient), through the fused DPO op as training computes them.
fn preference_eval(
    policy: &CausalLm<Inner>,
    reference: &CausalLm<Inner>,
    data: &Dataset,
    tok: &TextTokenizer,
    options: PreferenceOptions,
) -> (f64, f64) {
    use burn::tensor::{Int, Tensor, TensorData};
    let device = Default::default();
    let (mut margins, mut correct, mut pairs) = (0.0, 0.0, 0.0);
    for b in epoch_pair_batches(&data.examples, 0, 0, 8, MAX_LENGTH, tok.specials.pad) {
        let ids = Tensor::<Inner, 2, Int>::from_data(
            TensorData::new(b.input_ids, [b.batch, b.seq]),
            &device,
        );
        let labels = Tensor::<Inner, 2, Int>::from_data(
            TensorData::new(b.labels, [b.batch, b.seq]),
            &device,
        );
        let hidden = |m: &CausalLm<Inner>| m.hidden_states(ids.clone()).narrow(1, 0, b.seq - 1);
        let out = functional::fused_linear_preference(
            hidden(policy),
            policy.lm_head_weight(),
            None,
            labels.narrow(1, 1, b.seq - 1),
            Reference::Model {
                x: hidden(reference),
                weight: reference.lm_head_weight(),
                bias: None,
            },
            options,
        );
        let m: Vec<f64> = out.metrics.margins().into_data().iter::<f64>().collect();
        pairs += m.len() as f64;
        margins += m.iter().sum::<f64>();
        correct += m.iter().filter(|&&x| x > 0.0).count() as f64;
    }
    (margins / pairs, correct / pairs)
}

/// DPO on 40 pairs (3 epochs): from the reference itself (loss ln 2, every margin 0, no
/// pair preferred), the trained policy prefers the chosen completion of most pairs with a
/// positive mean margin, the per-step margins and the loss move the same way.
#[test]
fn dpo_accuracy_and_margins_rise() {
    let tok = bundled::tokenizer();
    let data = dataset(&tok, DataKind::Pairs, 40);
    let dir = TempDir::new("dpo");
    let seed = 7;
    let options = PreferenceOptions::dpo().with_beta(0.5);
    let (policy, reference) = policy_and_reference(&tok, seed);
    let (m0, a0) = preference_eval(&policy.valid(), &reference, &data, &tok, options);
    let s = train(
        policy,
        Some(reference.clone()),
        &data,
        &tok,
        TrainConfig {
            seed,
            ..config(MethodConfig::Preference(options), 30, 5e-3, 0)
        },
        &dir.0,
        None,
    )
    .unwrap();
    assert!(
        (s.first_loss - 2f64.ln()).abs() < 1e-5,
        "DPO starts at ln 2: {}",
        s.first_loss
    );
    let trained = CausalLm::<Inner>::load(
        &s.checkpoint,
        burn::tensor::DType::F32,
        LigerConfig::all(),
        &Default::default(),
    )
    .unwrap();
    let (m1, a1) = preference_eval(&trained, &reference, &data, &tok, options);
    let (s0, s1) = (
        mean(&s, "rewards/margins", 0..6),
        mean(&s, "rewards/margins", 24..30),
    );
    eprintln!(
        "DPO on the data: margin {m0:.4} -> {m1:.4}, accuracy {a0:.3} -> {a1:.3}; per-step margins {s0:.4} -> {s1:.4}"
    );
    assert_eq!((m0, a0), (0.0, 0.0), "the policy starts as its reference");
    assert!(m1 > 0.1, "the mean margin did not rise: {m1}");
    assert!(a1 >= 0.7, "the accuracy did not rise: {a1}");
    assert!(s1 > s0, "the per-step margins did not rise: {s0} -> {s1}");
    assert!(loss_mean(&s, 24..30) < loss_mean(&s, 0..6));
}

/// ORPO, CPO, SimPO (no reference): the loss of the last steps is below the first steps'.
#[test]
fn reference_free_preference_losses_fall() {
    let tok = bundled::tokenizer();
    let data = dataset(&tok, DataKind::Pairs, 200);
    for options in [
        PreferenceOptions::orpo(),
        PreferenceOptions::cpo(),
        PreferenceOptions::simpo(),
    ] {
        let dir = TempDir::new("ref-free");
        let s = train(
            model(&tok, 3),
            None,
            &data,
            &tok,
            config(MethodConfig::Preference(options), 15, 3e-3, 0),
            &dir.0,
            None,
        )
        .unwrap();
        let (l0, l1) = (loss_mean(&s, 0..3), loss_mean(&s, 12..15));
        eprintln!("{}: loss {l0:.4} -> {l1:.4}", options.loss.name());
        assert!(
            l1 < l0 * 0.9,
            "{}: loss did not fall: {l0} -> {l1}",
            options.loss.name()
        );
    }
}

/// KTO: from the reference (every reward 0), the desirable completions' rewards rise above
/// the undesirable ones'.
#[test]
fn kto_margins_rise() {
    let tok = bundled::tokenizer();
    let data = dataset(&tok, DataKind::Labelled, 400);
    let dir = TempDir::new("kto");
    let seed = 11;
    let (policy, reference) = policy_and_reference(&tok, seed);
    let s = train(
        policy,
        Some(reference),
        &data,
        &tok,
        TrainConfig {
            seed,
            ..config(MethodConfig::Kto(KtoOptions::default()), 30, 3e-3, 0)
        },
        &dir.0,
        None,
    )
    .unwrap();
    let (m0, m1) = (
        mean(&s, "rewards/margins", 0..6),
        mean(&s, "rewards/margins", 24..30),
    );
    eprintln!("KTO margins {m0:.4} -> {m1:.4}");
    assert!(m1 > m0 + 0.05, "margins did not rise: {m0} -> {m1}");
}

/// Distillation: the forward KL to a teacher (another random model) falls by more than
/// half in 15 steps.
#[test]
fn distill_kl_falls() {
    let tok = bundled::tokenizer();
    let data = dataset(&tok, DataKind::Sft, 200);
    let dir = TempDir::new("distill");
    let teacher = model(&tok, 99).valid();
    let options = DistillOptions::default()
        .with_divergence(Divergence::ForwardKl)
        .with_weights(0.0, 1.0);
    let s = train(
        model(&tok, 5),
        Some(teacher),
        &data,
        &tok,
        config(MethodConfig::Distill(options), 15, 3e-3, 0),
        &dir.0,
        None,
    )
    .unwrap();
    let (k0, k1) = (mean(&s, "soft_loss", 0..2), mean(&s, "soft_loss", 13..15));
    eprintln!("distill KL {k0:.4} -> {k1:.4}");
    assert!(k1 < 0.5 * k0, "KL did not fall: {k0} -> {k1}");
}

/// A DPO run resumed at step 3 of 6 repeats the uninterrupted run's steps 4 to 6 bit for
/// bit (losses, gradient norms, TRL's metrics): the data order from the checkpoint's
/// cursor, the same reference.
#[test]
fn dpo_resume_repeats_the_run() {
    let tok = bundled::tokenizer();
    let data = dataset(&tok, DataKind::Pairs, 60);
    let seed = 21;
    let c = TrainConfig {
        seed,
        ..config(
            MethodConfig::Preference(PreferenceOptions::dpo()),
            6,
            3e-3,
            3,
        )
    };
    let full_dir = TempDir::new("dpo-full");
    let (policy, reference) = policy_and_reference(&tok, seed);
    let full = train(
        policy,
        Some(reference.clone()),
        &data,
        &tok,
        c.clone(),
        &full_dir.0,
        None,
    )
    .unwrap();
    let part_dir = TempDir::new("dpo-part");
    let loaded = checkpoint::load::<B, trainer::ParamRecord<B>>(
        &checkpoint::checkpoint_dir(&full_dir.0, 3),
        burn::tensor::DType::F32,
        LigerConfig::all(),
        &Default::default(),
    )
    .unwrap();
    let resumed = train(
        loaded.model,
        Some(reference),
        &data,
        &tok,
        c,
        &part_dir.0,
        Some(Resume {
            optimizer: loaded.optimizer,
            state: loaded.state,
        }),
    )
    .unwrap();
    // Everything but the wall times.
    let numbers = |h: &[liger_train::metrics::StepMetrics]| -> Vec<_> {
        h.iter()
            .map(|m| {
                (
                    m.step,
                    m.loss,
                    m.lr,
                    m.grad_norm,
                    m.tokens,
                    m.trained_tokens,
                    m.extra.clone(),
                )
            })
            .collect()
    };
    assert_eq!(numbers(&resumed.history), numbers(&full.history[3..]));
}

/// Mismatched data and method, and a method without its frozen model.
#[test]
fn wrong_data_or_missing_models_are_refused() {
    let tok = bundled::tokenizer();
    let sft = dataset(&tok, DataKind::Sft, 20);
    let pairs = dataset(&tok, DataKind::Pairs, 20);
    let dir = TempDir::new("refused");
    let dpo = MethodConfig::Preference(PreferenceOptions::dpo());
    let e = train(
        model(&tok, 1),
        Some(model(&tok, 1).valid()),
        &sft,
        &tok,
        config(dpo, 2, 1e-3, 0),
        &dir.0,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("dpo") && e.contains("\"chosen\""), "{e}");
    let e = train(
        model(&tok, 1),
        None,
        &pairs,
        &tok,
        config(dpo, 2, 1e-3, 0),
        &dir.0,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs a frozen reference"), "{e}");
    let mut packed = config(dpo, 2, 1e-3, 0);
    packed.layout = liger_train::batching::Layout::Pack;
    let e = train(
        model(&tok, 1),
        Some(model(&tok, 1).valid()),
        &pairs,
        &tok,
        packed,
        &dir.0,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--packing"), "{e}");
    // A KTO row without its label.
    let bad = "{\"prompt\": \"p\", \"completion\": \"c\"}\n";
    let e = data::prepare_post(
        bad,
        "bad.jsonl",
        &tok,
        DataOptions {
            max_length: 64,
            on_bad_line: BadLinePolicy::Fail,
            on_too_long: TooLongPolicy::Fail,
        },
        DataKind::Labelled,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad.jsonl") && e.contains("label"), "{e}");
}

/// LoRA (every projection, `all-linear`) with every post-training method: only the
/// adapters train (the checkpoint holds PEFT's adapter files and no model weights; every
/// `lora_B` starts at zero and ends non-zero), the base stays bit for bit as it was, and
/// every loss is finite. DPO's and KTO's reference is the policy before its first step,
/// adapters included (with `B` at zero: the base's function); distillation's teacher
/// another random model. An adapter on the LM head, which the fused post-training losses
/// would not train, is refused before any work with an error that says what to do.
#[test]
fn every_method_trains_lora_adapters_only() {
    use liger_models::lora::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
    use liger_models::{LoraConfig, LoraTarget};
    let tok = bundled::tokenizer();
    let device = Default::default();
    let seed = 13;
    let lora = LoraConfig {
        targets: LoraTarget::ALL_LINEAR.to_vec(),
        ..LoraConfig::new(4, 8.0)
    };
    let cases = [
        (
            MethodConfig::Preference(PreferenceOptions::dpo()),
            DataKind::Pairs,
        ),
        (
            MethodConfig::Preference(PreferenceOptions::orpo()),
            DataKind::Pairs,
        ),
        (MethodConfig::Kto(KtoOptions::default()), DataKind::Labelled),
        (
            MethodConfig::Distill(DistillOptions::default()),
            DataKind::Sft,
        ),
    ];
    for (method, kind) in cases {
        let name = method.name();
        let data = dataset(&tok, kind, 40);
        let dir = TempDir::new("lora-method");
        let base_tensors = model(&tok, seed).hf_tensors();
        let policy = trainer::attach_lora(model(&tok, seed), &lora, seed, &device).unwrap();
        let frozen = match method {
            MethodConfig::Distill(_) => Some(model(&tok, 99).valid()),
            m if m.needs_frozen() => Some(policy.valid()),
            _ => None,
        };
        let mut config = TrainConfig {
            seed,
            ..config(method, 4, 3e-3, 0)
        };
        let with_head = LoraConfig {
            targets: LoraTarget::ALL.to_vec(),
            ..lora.clone()
        };
        config.lora = Some(with_head);
        let refused = config.validate().err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains(name) && m.contains("drop lm_head")),
            "{name}: an lm_head adapter must be refused: {refused:?}"
        );
        config.lora = Some(lora.clone());
        let s = train(policy, frozen, &data, &tok, config, &dir.0, None)
            .unwrap_or_else(|e| panic!("{name} with LoRA: {e}"));
        assert_eq!(s.steps, 4, "{name}");
        assert!(
            s.history.iter().all(|m| m.loss.is_finite()),
            "{name}: a loss is not finite: {:?}",
            s.history.iter().map(|m| m.loss).collect::<Vec<_>>()
        );
        let at = &s.checkpoint;
        assert!(at.join(ADAPTER_CONFIG_FILE).is_file(), "{name}");
        assert!(
            !at.join("model.safetensors").exists(),
            "{name}: a LoRA checkpoint holds no model weights"
        );
        let bytes = std::fs::read(at.join(ADAPTER_WEIGHTS_FILE)).unwrap();
        let adapters = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let b_tensors: Vec<_> = adapters
            .tensors()
            .into_iter()
            .filter(|(n, _)| n.contains("lora_B"))
            .collect();
        assert_eq!(
            b_tensors.len(),
            7 * 2,
            "{name}: one B per projection and layer"
        );
        for (n, view) in &b_tensors {
            assert!(
                view.data().iter().any(|&b| b != 0),
                "{name}: adapter {n} did not train"
            );
        }
        let trained =
            checkpoint::load_lora::<B, trainer::ParamRecord<B>>(at, model(&tok, seed), &device)
                .unwrap()
                .model;
        let trained_tensors = trained.hf_tensors();
        assert_eq!(trained_tensors.len(), base_tensors.len(), "{name}");
        for ((n, x), (m, y)) in base_tensors.iter().zip(&trained_tensors) {
            assert_eq!(n, m, "{name}");
            assert_eq!(
                x.as_bytes(),
                y.as_bytes(),
                "{name}: base tensor {n} changed"
            );
        }
    }
}
