//! # Fine-tune a Hugging Face checkpoint through the library API
//!
//! Loads a Llama / Qwen2 / Qwen3 / Mistral checkpoint directory (`config.json`,
//! `model.safetensors` or its shards) with liger-models, fine-tunes it a few steps with
//! liger-train's SFT loop (instruction prompts masked out of the loss, examples packed into
//! rows, AdamW with warmup and cosine decay, global-norm clipping) on `Liger<Autodiff<B>>`
//! with every fused kernel on (RoPE, RMSNorm, SwiGLU, attention, fused linear cross
//! entropy), and prints the loss, gradient norm and tokens/s of every step (the first
//! steps compile the kernels, so they are slower). The trainer
//! saves the result in Hugging Face layout (`config.json` + `model.safetensors`, plus
//! `tokenizer.json`, and the optimizer and trainer state that `liger train --resume`
//! reads); the example loads it back and compares the loss on held-out examples before
//! and after.
//!
//! ```sh
//! cargo run -p liger-examples --example fine_tune
//! cargo run -p liger-examples --example fine_tune -- MODEL_DIR [OUTPUT_DIR [STEPS [LR]]]
//! cargo run --release -p liger-examples --example fine_tune --features cuda -- ./Llama-3.2-1B out 50 2e-5
//! ```
//!
//! Defaults: the tiny random Llama test checkpoint `models/fixtures/llama` (hidden 64, 2
//! layers, vocabulary 128), a new temporary directory for the output, 20 steps, learning
//! rate 1e-3 (right for that random checkpoint; a pretrained model wants about 2e-5).
//! Data: liger-train's bundled synthetic instruction dataset (`train/data/dataset.jsonl`),
//! tokenized with the checkpoint's `tokenizer.json`. The test checkpoint has none, and the
//! bundled 1024-token tokenizer does not fit its vocabulary of 128, so for such a
//! checkpoint the example makes a character-level tokenizer (printable ASCII and newline,
//! 100 tokens) — the way to train a checkpoint that has no tokenizer of its own.
//!
//! Device: the first that opens of CUDA (feature `cuda`), ROCm (`rocm`), wgpu's default
//! adapter (a GPU, else a CPU adapter such as Mesa's lavapipe) and NdArray (no kernels:
//! liger-burn's exact composition of stock ops).

// Shared with the other examples, each of which uses part of it.
#[allow(dead_code)]
mod devices;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
use devices::{Job, Target};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::{CausalLm, LigerConfig, ModelConfig};
use liger_train::batching::{Layout, make_batch};
use liger_train::checkpoint::TOKENIZER_FILE;
use liger_train::data::{self, BadLinePolicy, DataOptions, TooLongPolicy};
use liger_train::metrics::StepMetrics;
use liger_train::prompt::Tokenized;
use liger_train::schedule::LrSchedule;
use liger_train::tokenizer::{SpecialIds, TextTokenizer};
use liger_train::trainer::{Run, TrainObserver};
use liger_train::{TrainConfig, bundled};
use std::error::Error;
use std::path::{Path, PathBuf};

/// The training backend: `B` with autodiff, Burn's primitives routed to the fused kernels.
type TrainBackend<B> = Liger<Autodiff<B>>;

const DEFAULT_STEPS: usize = 20;
const DEFAULT_LR: f64 = 1e-3;
/// Longest packed row, in tokens (at most the checkpoint's `max_position_embeddings`).
const MAX_LENGTH: usize = 128;
const BATCH_SIZE: usize = 8;
/// Examples kept out of training, to measure the loss before and after.
const HELD_OUT: usize = 64;

/// Command-line settings.
struct Settings {
    model_dir: PathBuf,
    output: PathBuf,
    steps: usize,
    lr: f64,
}

impl Settings {
    fn from_args() -> Result<Self, Box<dyn Error>> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.len() > 4 || args.iter().any(|a| a.starts_with('-')) {
            return Err("usage: fine_tune [MODEL_DIR [OUTPUT_DIR [STEPS [LR]]]]".into());
        }
        let model_dir = args.first().map(PathBuf::from).unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/fixtures/llama")
        });
        // A missing directory keeps its name: loading it reports the error.
        let model_dir = model_dir.canonicalize().unwrap_or(model_dir);
        let output = args.get(1).map(PathBuf::from).unwrap_or_else(|| {
            std::env::temp_dir().join(format!("liger-fine-tune-{}", std::process::id()))
        });
        let steps = match args.get(2) {
            Some(s) => s.parse().map_err(|e| format!("STEPS `{s}`: {e}"))?,
            None => DEFAULT_STEPS,
        };
        let lr = match args.get(3) {
            Some(s) => s.parse().map_err(|e| format!("LR `{s}`: {e}"))?,
            None => DEFAULT_LR,
        };
        Ok(Settings {
            model_dir,
            output,
            steps,
            lr,
        })
    }
}

/// The checkpoint's `tokenizer.json`; else the bundled tokenizer if it fits the
/// vocabulary; else a character-level tokenizer.
fn tokenizer_for(model_dir: &Path, config: &ModelConfig) -> Result<TextTokenizer, Box<dyn Error>> {
    let file = model_dir.join(TOKENIZER_FILE);
    if file.is_file() {
        let ids = SpecialIds::from_hf_config(&config.extra);
        return Ok(TextTokenizer::from_file(&file, ids)?);
    }
    let bundled = bundled::tokenizer();
    if bundled.vocab_size() <= config.vocab_size {
        return Ok(bundled);
    }
    let chars = character_tokenizer();
    if chars.vocab_size() > config.vocab_size {
        return Err(format!(
            "{} has no {TOKENIZER_FILE} and a vocabulary of {}: too small even for a \
             character-level tokenizer ({} tokens)",
            model_dir.display(),
            config.vocab_size,
            chars.vocab_size()
        )
        .into());
    }
    Ok(chars)
}

/// A `tokenizer.json` with one token per character: `<pad>` 0, `<bos>` 1, `<eos>` 2,
/// `<unk>` 3 (any other character), then newline and printable ASCII. A BPE model without
/// merges splits text into characters.
fn character_tokenizer() -> TextTokenizer {
    let specials = ["<pad>", "<bos>", "<eos>", "<unk>"];
    let characters = std::iter::once('\n').chain(' '..='~');
    let tokens: Vec<String> = specials
        .iter()
        .map(|s| s.to_string())
        .chain(characters.map(String::from))
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id.into()))
        .collect();
    let added_tokens: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(id, content)| {
            serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    });
    TextTokenizer::from_json(
        json.to_string(),
        "character-level tokenizer",
        SpecialIds::default(),
    )
    .expect("the character-level tokenizer parses and has <eos>")
}

/// Prints every step.
struct StepLog;

impl TrainObserver for StepLog {
    fn on_step(&mut self, m: &StepMetrics, total: usize) {
        println!(
            "step {:>3}/{total}  loss {:.4}  lr {:.2e}  grad norm {:>6.3}  {:>5} tokens  \
             {:>7.0} tokens/s",
            m.step, m.loss, m.lr, m.grad_norm, m.tokens, m.tokens_per_second
        );
    }

    fn on_checkpoint(&mut self, _step: usize, dir: &Path) {
        println!("saved:    {}", dir.display());
    }
}

/// Mean loss of the trained (response) tokens of `examples`, for the checkpoint in `dir`,
/// one padded row per example.
fn held_out_loss<B: FusedOps>(
    dir: &Path,
    examples: &[Tokenized],
    pad: u32,
    device: &B::Device,
) -> Result<f32, Box<dyn Error>> {
    let model = CausalLm::<Liger<B>>::load(dir, DType::F32, LigerConfig::all(), device)?;
    let rows: Vec<Vec<usize>> = (0..examples.len()).map(|i| vec![i]).collect();
    let batch = make_batch(examples, &rows, Layout::Pad, MAX_LENGTH, pad);
    let shape = batch.shape();
    let ids =
        Tensor::<Liger<B>, 2, Int>::from_data(TensorData::new(batch.input_ids, shape), device);
    let labels =
        Tensor::<Liger<B>, 2, Int>::from_data(TensorData::new(batch.labels, shape), device);
    Ok(model.loss(ids, labels).into_scalar().elem())
}

struct FineTune {
    settings: Settings,
}

impl Job for FineTune {
    type Output = Result<(), Box<dyn Error>>;

    fn run<B: FusedOps>(&mut self, target: Target, device: B::Device) -> Self::Output {
        let s = &self.settings;
        println!(
            "device:   {} ({})",
            target.name(),
            TrainBackend::<B>::name(&device)
        );
        let config = ModelConfig::from_file(s.model_dir.join("config.json"))?;
        let tokenizer = tokenizer_for(&s.model_dir, &config)?;
        let max_length = MAX_LENGTH.min(config.max_position_embeddings);
        let options = DataOptions {
            max_length,
            on_bad_line: BadLinePolicy::Fail,
            on_too_long: TooLongPolicy::Truncate,
        };
        let mut train_set =
            data::prepare(bundled::DATASET, bundled::DATASET_NAME, &tokenizer, options)?;
        let held_out = train_set
            .examples
            .split_off(train_set.examples.len().saturating_sub(HELD_OUT));
        println!(
            "data:     {}: {} training examples, {} held out ({}, {} tokens)",
            train_set.source_name,
            train_set.examples.len(),
            held_out.len(),
            tokenizer.source,
            tokenizer.vocab_size()
        );

        let model = CausalLm::<TrainBackend<B>>::load(
            &s.model_dir,
            DType::F32,
            LigerConfig::all(),
            &device,
        )?;
        let mc = &model.config;
        println!(
            "model:    {} ({:?}, hidden {}, {} layers, vocabulary {}, {:.2}M parameters)",
            s.model_dir.display(),
            mc.model_type,
            mc.hidden_size,
            mc.num_hidden_layers,
            mc.vocab_size,
            mc.num_params() as f64 / 1e6
        );
        let pad = tokenizer.specials.pad;
        let before = held_out_loss::<B>(&s.model_dir, &held_out, pad, &device)?;

        let train_config = TrainConfig {
            max_length,
            // Rows of exactly `max_length` tokens: one shape per step, so the kernels
            // compile once.
            layout: Layout::Pack,
            batch_size: BATCH_SIZE,
            grad_accum: 1,
            schedule: LrSchedule {
                peak_lr: s.lr,
                min_lr_ratio: 0.1,
                warmup_steps: (s.steps / 10).max(1),
                total_steps: s.steps,
            },
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            seed: 42,
            // Only the final checkpoint.
            save_every: 0,
            // The model's dtype: f32 here, so no master copy either way.
            pure_low_precision: false,
            method: liger_train::method::MethodConfig::Sft,
            // Full fine-tuning.
            lora: None,
        };
        println!(
            "training: {} steps of {BATCH_SIZE} packed rows of {max_length} tokens, lr {:.1e}, \
             output {}",
            s.steps,
            s.lr,
            s.output.display()
        );
        let summary = liger_train::train(
            Run {
                model,
                dataset: &train_set,
                tokenizer: &tokenizer,
                config: train_config,
                output: s.output.clone(),
                resume: None,
                memory: None,
                kernels: "Liger<Autodiff<B>>; fused: rope, rms_norm, swiglu, attention, \
                          fused_linear_cross_entropy"
                    .into(),
                frozen: None,
                base_model: Some(s.model_dir.display().to_string()),
            },
            &mut StepLog,
        )?;
        println!(
            "done:     {} steps, {} tokens in {:.1} s = {:.0} tokens/s; loss {:.4} -> {:.4}",
            summary.steps,
            summary.tokens,
            summary.seconds,
            summary.tokens_per_second(),
            summary.first_loss,
            summary.last_loss
        );

        let after = held_out_loss::<B>(&summary.checkpoint, &held_out, pad, &device)?;
        let mut files: Vec<String> = std::fs::read_dir(&summary.checkpoint)?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        files.sort();
        println!(
            "checkpoint: {} ({})",
            summary.checkpoint.display(),
            files.join(", ")
        );
        println!(
            "held-out loss ({} examples, reloaded from the checkpoints): {before:.4} before, \
             {after:.4} after",
            held_out.len()
        );
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut job = FineTune {
        settings: Settings::from_args()?,
    };
    // Fastest first; `Target::WgpuCpu` is left out: the default adapter already falls back
    // to the CPU adapter when there is no GPU.
    let order: Vec<Target> = Target::compiled()
        .into_iter()
        .filter(|&t| t != Target::WgpuCpu)
        .collect();
    match devices::run_on_first(&order, &mut job) {
        Some((_, result)) => result,
        None => Err("no device of this build opened here".into()),
    }
}
