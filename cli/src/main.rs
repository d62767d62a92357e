//! `liger`: supervised fine-tuning with liger-burn's fused kernels, evaluation of
//! checkpoints, and the verification commands.
//!
//! - `liger train`: supervised fine-tuning (SFT) of a causal LM from JSONL.
//! - `liger check`: the f64 conformance suite (every fused op, forward and every
//!   gradient, over a sweep of odd shapes) on one device and dtype.
//! - `liger bench`: fused (liger) against stock Burn, same backend, same shapes, same
//!   run: time, pool memory and achieved bandwidth against a measured copy ceiling,
//!   as a table and as CSV rows.
//! - `liger eval`: per-token next-token losses of a Hugging Face checkpoint (Llama,
//!   Qwen2, Qwen3, Mistral) through liger-models, as JSON.
//! - `liger converge`: mini models trained with the fused kernels on and off from the
//!   same start; per-step losses and final parameters compared.
//! - `liger merge`: a LoRA adapter (PEFT's files) merged into its base checkpoint.
//! - `liger bench --e2e`: whole training steps of 1B-class models, liger on and off,
//!   over sequence lengths (tokens/s, peak memory, longest sequence that fits).
//!
//! Exit codes: 0 success, 1 a conformance case failed, 2 the device or dtype is not
//! available (or another error).

// A build without any device feature compiles (and says so at run time), unwarned.
#![cfg_attr(
    not(any(
        feature = "vulkan",
        feature = "wgpu",
        feature = "cuda",
        feature = "rocm",
        feature = "ndarray"
    )),
    allow(dead_code, unused)
)]

mod eval;
mod logger;
mod merge;
mod train;

use clap::{Args, Parser, Subcommand};
use liger_verify::args::{BenchArgs, CheckArgs, ConvergeArgs, OnOff};
use liger_verify::device::DeviceKind;
use liger_verify::dtype::DtypeArg;
use liger_verify::{bench, check, converge};
use std::process::ExitCode;

/// Liger-Kernel-style fused kernels for Burn: fine-tuning, evaluation, checks and benchmarks.
#[derive(Parser, Debug)]
#[command(name = "liger", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More of what liger-burn, CubeCL and Burn report on stderr: -v their informational
    /// messages, -vv their debug messages (e.g. the device features CubeCL found). Without
    /// it, their warnings only (e.g. cuBLASLt missing, so products run on Burn's matmul).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the f64 conformance suite (every fused op, outputs and gradients) on a device.
    ///
    /// Exits 0 when every comparison passes, 1 when one fails, 2 when the device or
    /// dtype is not available.
    Check(CheckArgs),
    /// Benchmark the fused ops (liger) against the stock Burn path (burn) on a device.
    ///
    /// Writes a table to the terminal and, with --csv, one CSV row per measurement.
    Bench(BenchArgs),
    /// Per-token next-token losses of a Hugging Face checkpoint on token sequences.
    ///
    /// Loads MODEL (a directory with config.json and model.safetensors, or the shards of
    /// model.safetensors.index.json; Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3 or Mistral) and
    /// prints one JSON line on stdout: {"loss": mean over every predicted token,
    /// "token_loss": [[loss of token t+1 given tokens 0..=t, ...], ...]} (one list per
    /// sequence, one value fewer than its tokens). Progress lines go to stderr.
    ///
    /// Example: liger eval --model ./Llama-3.2-1B --tokens tokens.json --dtype bf16
    #[command(verbatim_doc_comment)]
    Eval(EvalArgs),
    /// Supervised fine-tuning (SFT) of a causal LM from a JSONL file, with the fused kernels.
    ///
    /// With no arguments: a small Llama-style model initialized at random trains 300 steps
    /// on the bundled synthetic instruction dataset and tokenizer, on the best device of
    /// this build (a few minutes on a CPU through lavapipe). With --model DIR it fine-tunes
    /// a Hugging Face checkpoint (Llama, Qwen2, Qwen3, Mistral) with its tokenizer.json.
    ///
    /// Prompt tokens are masked out of the loss (only the response and the end-of-sequence
    /// token are trained); AdamW with linear warmup and cosine decay, gradient accumulation,
    /// global-norm gradient clipping. The whole data file is validated and tokenized before
    /// step 1. Checkpoints (OUTPUT/checkpoint-<step>/: config.json, model.safetensors,
    /// tokenizer.json, optimizer.mpk, trainer_state.json) every --save-every steps and at
    /// the end; --resume continues one exactly. Per-step metrics go to
    /// OUTPUT/train_log.csv. If a step panics or the loss becomes NaN/inf, the last good
    /// state is saved and the command exits 1 with the reason.
    ///
    /// With --lora-rank N: LoRA fine-tuning. The model is frozen and rank-N adapters train
    /// on --lora-targets (f32, whatever --dtype); checkpoints then hold PEFT's adapter files
    /// (adapter_config.json, adapter_model.safetensors) and the adapters' optimizer state
    /// instead of the model; `liger merge` folds them into the base. A random model's base
    /// is written to OUTPUT/base-model/.
    ///
    /// Example: liger train --model ./Llama-3.2-1B --data sft.jsonl --device cuda
    ///          --dtype bf16 --batch-size 4 --grad-accum 8 --packing --max-length 2048
    ///          [--lora-rank 64 --lora-alpha 128 --lora-targets all-linear]
    #[command(verbatim_doc_comment)]
    Train(train::TrainArgs),
    /// Convergence of training with the fused kernels against stock Burn (like
    /// Liger-Kernel's mini-model convergence tests).
    ///
    /// Each mini model (vocabulary 1031, hidden 64, 2 layers, 4/2 GQA heads) is trained
    /// twice from the same seeded parameters on the same random token batches (masked
    /// prompts and random -100 labels) with AdamW: liger off (Autodiff<B>, every kernel
    /// switch off) and liger on (Liger<Autodiff<B>>, every kernel on). Prints each step's
    /// two losses and their difference, the worst parameter difference and its tensor.
    ///
    /// Exit 0 when every model's per-step losses and final parameters agree within the
    /// tolerances (|on - off| <= atol + rtol*|off|) and its loss fell; 1 otherwise; 2 when
    /// the device or dtype is not available.
    ///
    /// Example: liger converge --device cuda --dtype bf16 --models llama,qwen2,qwen3,mistral
    #[command(verbatim_doc_comment)]
    Converge(ConvergeArgs),
    /// Merge a LoRA adapter into its base model and write a plain Hugging Face checkpoint.
    ///
    /// Reads the base checkpoint (--base: config.json and model.safetensors or its shards)
    /// and a PEFT adapter (--adapter: adapter_config.json and adapter_model.safetensors, as
    /// written by `liger train --lora-rank` or by PEFT's save_pretrained), computes every
    /// adapted weight W + s·B·A in f32 (s = alpha/r, or alpha/sqrt(r) with rsLoRA) and
    /// stores it in the base dtype, and writes config.json and model.safetensors to --out,
    /// with the base's tokenizer and generation files. The merged model gives the adapted
    /// model's outputs without any LoRA support. An adapter on the LM head of a model with
    /// tied embeddings unties them (lm_head.weight is written).
    ///
    /// Example: liger merge --base ./Llama-3.2-1B --adapter out/checkpoint-300
    ///          --out ./Llama-3.2-1B-sft
    #[command(verbatim_doc_comment)]
    Merge(MergeArgs),
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Base checkpoint directory (the model the adapter was trained on).
    #[arg(long, value_name = "DIR")]
    pub base: std::path::PathBuf,
    /// PEFT adapter directory: adapter_config.json and adapter_model.safetensors.
    #[arg(long, value_name = "DIR")]
    pub adapter: std::path::PathBuf,
    /// Output directory for the merged checkpoint (created; not the base or adapter).
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
    /// Dtype of the merged weights. [default: the base's torch_dtype in config.json,
    /// f32 when it has none]
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Device to merge on (the whole base model is loaded there).
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Checkpoint directory: config.json plus model.safetensors or
    /// model.safetensors.index.json and its shards (weights in f32, f16 or bf16).
    #[arg(long, value_name = "DIR")]
    pub model: std::path::PathBuf,
    /// JSON file of token ids: {"input_ids": [[1, 2, 3, ...], ...]}; sequences may have
    /// different lengths (each needs one token; at least one needs two).
    #[arg(long, value_name = "FILE.json")]
    pub tokens: std::path::PathBuf,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Dtype of the parameters and activations (the weights are converted on load;
    /// losses are computed in f32).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// `on`: every fused kernel (RMSNorm, RoPE, SwiGLU, fused linear cross entropy) on
    /// the `Liger<B>` backend; `off`: stock Burn ops.
    #[arg(long, value_enum, default_value_t = OnOff::On, value_name = "on|off")]
    pub liger: OnOff,
    /// Sequences per forward pass (each batch is right-padded to its longest sequence).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub batch_size: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logger::install(cli.verbose);
    let result = match cli.command {
        Command::Check(args) => check::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Train(args) => train::run(args),
        Command::Converge(args) => converge::run(args),
        Command::Merge(args) => merge::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn verbose_counts_after_any_subcommand() {
        let cli = Cli::try_parse_from(["liger", "train", "-vv"]).expect("parses");
        assert_eq!(cli.verbose, 2);
        let cli = Cli::try_parse_from(["liger", "-v", "check"]).expect("parses");
        assert_eq!(cli.verbose, 1);
    }

    #[test]
    fn check_takes_an_elementwise_geometry_and_refuses_a_malformed_one() {
        let cli = Cli::try_parse_from(["liger", "check", "--elementwise-geometry", "units=256"])
            .expect("parses");
        let Command::Check(args) = cli.command else {
            panic!("not the check command");
        };
        let mut config = liger_cubecl_kernels::LaunchConfig::default().elementwise;
        args.elementwise_geometry
            .expect("the geometry is kept")
            .apply(&mut config);
        assert_eq!(config.units, 256);
        let error = Cli::try_parse_from(["liger", "check", "--elementwise-geometry", "units=0"])
            .err()
            .expect("units=0 is refused");
        assert!(error.to_string().contains("units"), "{error}");
    }
}
