//! `liger train`: supervised fine-tuning (liger-train) of a random small model or a
//! Hugging Face checkpoint, on the best device of this build.
//!
//! Order of work: settings and tokenizer, then the whole data file parsed and tokenized
//! (so a data error stops the job before step 1), then the device, the model and the loop.
//! The header and the summary go to stdout; progress (bar or log lines) to stderr.

use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::DType;
use clap::{Args, ValueEnum};
use liger_burn::Liger;
use liger_burn::ops::AdapterPrecision;
use liger_burn::ops::FusedOps;
use liger_burn::ops::{Divergence, DpoLossType, PreferenceLoss};
use liger_models::{CausalLm, LigerConfig, LoraConfig, LoraTarget, ModelConfig};
use liger_train::batching::Layout;
use liger_train::checkpoint::{self, TrainerState};
use liger_train::data::{self, BadLinePolicy, DataKind, DataOptions, Dataset, TooLongPolicy};
use liger_train::method::MethodConfig;
use liger_train::metrics::format_memory;
use liger_train::progress::ConsoleProgress;
use liger_train::schedule::LrSchedule;
use liger_train::tokenizer::{SpecialIds, TextTokenizer};
use liger_train::trainer::{self, Resume, Run, TrainBackend, TrainConfig};
use liger_train::{TrainError, bundled};
use liger_verify::args::{HeadGradArg, OnOff};
use liger_verify::device::{self, Ctx, DeviceKind, OnDevice};
use liger_verify::dtype::DtypeArg;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `--on-bad-line`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BadLineArg {
    /// Report the line (file:line: reason) and train on the others.
    Skip,
    /// Stop before training, naming the file and line.
    Fail,
}

/// Where a LoRA run on a random model writes that model (under --output): its adapters'
/// base.
const RANDOM_BASE_DIR: &str = "base-model";

/// `--lora-precision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LoraPrecisionArg {
    /// PEFT's default: A and B in f32, the adapter's products in f32 (the input widened),
    /// its output added to the base layer's in f32 and rounded once.
    F32,
    /// PEFT under autocast (Hugging Face Trainer's bf16=True): A and B rounded to the
    /// activation dtype for the products (f32 accumulation); A and B themselves stay f32.
    Activation,
}

impl LoraPrecisionArg {
    fn precision(self) -> AdapterPrecision {
        match self {
            LoraPrecisionArg::F32 => AdapterPrecision::F32,
            LoraPrecisionArg::Activation => AdapterPrecision::Activation,
        }
    }
}

/// `--on-too-long`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TooLongArg {
    /// Keep the first --max-length tokens (left out if no response token remains).
    Truncate,
    /// Report the example and leave it out.
    Skip,
    /// Stop before training, naming the file and line.
    Fail,
}

// Defaults of the settings that a resume takes from the checkpoint instead.
use liger_train::config::defaults::{
    BATCH_SIZE as DEFAULT_BATCH_SIZE, LR_PRETRAINED as DEFAULT_LR_PRETRAINED,
    LR_RANDOM as DEFAULT_LR_RANDOM, MAX_GRAD_NORM as DEFAULT_MAX_GRAD_NORM,
    MAX_LENGTH as DEFAULT_MAX_LENGTH, MIN_LR_RATIO as DEFAULT_MIN_LR_RATIO,
    SAVE_EVERY as DEFAULT_SAVE_EVERY, SEED as DEFAULT_SEED, STEPS as DEFAULT_STEPS,
    WEIGHT_DECAY as DEFAULT_WEIGHT_DECAY, warmup_steps as default_warmup_steps,
};

/// `--method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Supervised fine-tuning (next-token cross entropy of the responses).
    Sft,
    /// DPO against a frozen reference (the model before its first step).
    Dpo,
    /// ORPO: odds-ratio preference term plus the chosen responses' NLL.
    Orpo,
    /// CPO: reference-free DPO plus the chosen responses' NLL.
    Cpo,
    /// SimPO: length-normalized, reference-free, with a target margin.
    Simpo,
    /// KTO on unpaired completions labelled desirable or not, against a frozen reference.
    Kto,
    /// Distillation from a frozen teacher (--teacher) on SFT rows.
    Distill,
}

/// `--divergence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DivergenceArg {
    /// Generalized Jensen-Shannon divergence with --jsd-beta.
    Jsd,
    /// KL(teacher || student).
    ForwardKl,
    /// KL(student || teacher).
    ReverseKl,
    /// Total variation distance.
    Tvd,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// What to train: `sft` (supervised fine-tuning), the preference losses `dpo`, `orpo`,
    /// `cpo`, `simpo` (data: TRL's {"prompt", "chosen", "rejected"}), `kto` ({"prompt",
    /// "completion", "label"}), `distill` (SFT rows and --teacher). DPO and KTO compare to a
    /// frozen reference: the model before its first step. Each has bundled data, so `liger
    /// train --method dpo` runs as is. [default: sft]
    #[arg(long, value_enum, value_name = "METHOD")]
    pub method: Option<MethodArg>,
    /// β of DPO, ORPO, CPO, SimPO and KTO. [default: 0.1]
    #[arg(long, value_name = "BETA")]
    pub beta: Option<f64>,
    /// DPO's loss type (TRL's names: sigmoid, hinge, robust, exo_pair, nca_pair, bco_pair,
    /// sppo_hard, apo_zero, apo_down, discopop). [default: sigmoid]
    #[arg(long, value_name = "TYPE")]
    pub loss_type: Option<String>,
    /// Label smoothing of DPO (sigmoid, robust, exo_pair), CPO and SimPO. [default: 0]
    #[arg(long, value_name = "EPS")]
    pub label_smoothing: Option<f64>,
    /// Weight of the chosen responses' NLL term (ORPO, CPO, SimPO: on by default; DPO: off
    /// unless given, as TRL's rpo_alpha). [default: 1]
    #[arg(long, value_name = "ALPHA")]
    pub alpha: Option<f64>,
    /// SimPO's target reward margin γ. [default: 0.5]
    #[arg(long, value_name = "GAMMA")]
    pub simpo_gamma: Option<f64>,
    /// KTO's weight of the desirable completions. [default: 1]
    #[arg(long, value_name = "W")]
    pub desirable_weight: Option<f64>,
    /// KTO's weight of the undesirable completions. [default: 1]
    #[arg(long, value_name = "W")]
    pub undesirable_weight: Option<f64>,
    /// The teacher of --method distill: a Hugging Face checkpoint directory with the
    /// student's tokenizer (its vocabulary may only be padded larger).
    #[arg(long, value_name = "DIR")]
    pub teacher: Option<PathBuf>,
    /// The reference model of --method dpo/kto. [default: the model before its first step;
    /// on a resume, the random initialization of --seed: a run started from --model must
    /// name it]
    #[arg(long, value_name = "DIR")]
    pub reference: Option<PathBuf>,
    /// Distillation's divergence. [default: jsd]
    #[arg(long, value_enum)]
    pub divergence: Option<DivergenceArg>,
    /// β of the distillation's JSD (0: forward KL, 1: reverse KL). [default: 0.5]
    #[arg(long, value_name = "BETA")]
    pub jsd_beta: Option<f64>,
    /// Distillation's temperature on both heads' logits. [default: 1]
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,
    /// Distillation's weight of the cross entropy against the data. [default: 0.5]
    #[arg(long, value_name = "W")]
    pub weight_hard_loss: Option<f64>,
    /// Distillation's weight of the divergence to the teacher. [default: 0.5]
    #[arg(long, value_name = "W")]
    pub weight_soft_loss: Option<f64>,
    /// Training data, JSONL, in the format of --method: SFT and distillation read one
    /// object per line, {"instruction": ..., "input": ... (optional), "output": ...} (only
    /// the output and the end-of-sequence token are trained) or {"text": ...} (trained
    /// whole); the preference methods {"prompt", "chosen", "rejected"}; KTO {"prompt",
    /// "completion", "label"}. Default: the bundled synthetic data of the method (3000
    /// rows of arithmetic, reversal, counting, copying and facts, and 1000 pairs or
    /// labelled completions derived from them; train/data/).
    #[arg(long, value_name = "FILE.jsonl")]
    pub data: Option<PathBuf>,
    /// Hugging Face checkpoint to fine-tune (config.json, model.safetensors or its shards,
    /// tokenizer.json; Llama, Qwen2, Qwen3, Mistral). Default: a small Llama-style model
    /// (hidden 128, 2 layers, the tokenizer's vocabulary) initialized at random from --seed.
    /// With --resume of a LoRA run: the base model, if it moved since the run started
    /// (default: the base the checkpoint names).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// tokenizer.json to use instead of the one of --model / --resume (default: theirs, or
    /// the bundled byte-level BPE of 1024 tokens without --model).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Output directory: checkpoint-<step>/ directories and train_log.csv (one row per
    /// step). Default: liger-train-out, or the parent of the --resume checkpoint.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Continue from a checkpoint-<step> directory of an earlier run: model, optimizer
    /// state, data position and settings are restored, and the following steps give the
    /// same losses as the uninterrupted run. Pass the same --data; the settings below
    /// default to the checkpoint's, and one given with another value is refused.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = device::DeviceKind::Auto)]
    pub device: device::DeviceKind,
    /// CubeCL's device memory pool: `default` = CubeCL's own pools; `exact` = every
    /// allocation exactly sized and reused by the same size only, meant for steps of one
    /// shape (use with --packing; with per-batch padding each new shape adds buffers that
    /// are never reused); `release` = `exact`, with the free buffers handed back to the
    /// device at each decoder layer of the backward and after each optimizer step, so the
    /// memory one size frees serves another (on CUDA through its stream-ordered pool);
    /// `auto` = `release` on CUDA, `default` elsewhere. See verify/src/pool.rs.
    #[arg(long, value_enum, default_value_t = liger_verify::pool::MemoryPool::Auto, value_name = "POOL")]
    pub memory_pool: liger_verify::pool::MemoryPool,
    /// Dtype of the weights, activations and gradients (losses in f32). f16 and bf16 train
    /// in mixed precision: forward and backward in that dtype, AdamW updating f32 master
    /// weights with f32 moments (read and written in one fused pass that also writes the
    /// low-precision weights), as Hugging Face Trainer's bf16=True; see
    /// --pure-low-precision.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// With --dtype f16/bf16: no f32 master copy; the AdamW moments stay in the low dtype
    /// and the weights are updated there (the optimizer state takes 4 bytes per parameter
    /// instead of 12). WARNING: an update smaller than half an ulp of its weight rounds to
    /// nothing; at lr 2e-5 every bf16 weight above about 0.01 in magnitude never changes,
    /// so fine-tuning at usual learning rates barely moves the model; in f16 the second
    /// moment of small gradients underflows to zero, and the steps that follow can be
    /// orders of magnitude too large. No effect with f32.
    #[arg(long)]
    pub pure_low_precision: bool,
    /// `on`: the `Liger<Autodiff<B>>` backend with every fused kernel (RMSNorm, RoPE,
    /// SwiGLU, fused linear cross entropy; fused softmax in the attention); `off`: plain
    /// `Autodiff<B>`, stock Burn ops. The five flags below override single kernels.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub liger: OnOff,
    /// Trade recomputation for memory, as transformers' `gradient_checkpointing`: each
    /// decoder layer keeps only its input for the backward and runs its forward again
    /// there, so one layer's activations are alive at a time instead of every layer's.
    /// Same losses and gradients; about one more forward pass a step.
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Fused RoPE of q and k (default: as --liger).
    #[arg(long, value_enum, value_name = "on|off")]
    pub rope: Option<OnOff>,
    /// Fused RMSNorm (default: as --liger).
    #[arg(long, value_enum, value_name = "on|off")]
    pub rms_norm: Option<OnOff>,
    /// Fused SwiGLU in the MLP (default: as --liger).
    #[arg(long, value_enum, value_name = "on|off")]
    pub swiglu: Option<OnOff>,
    /// Fused cross entropy over materialized logits (default: off; turning it on turns
    /// fused linear cross entropy off unless that is given too: the two are exclusive).
    #[arg(long, value_enum, value_name = "on|off")]
    pub cross_entropy: Option<OnOff>,
    /// Fused LM head + cross entropy, logits never whole (default: as --liger).
    #[arg(long, value_enum, value_name = "on|off")]
    pub fused_linear_cross_entropy: Option<OnOff>,
    /// Attention that recomputes its probabilities in the backward instead of keeping them
    /// (memory linear in the sequence instead of quadratic; same math as eager attention)
    /// (default: as --liger).
    #[arg(long, value_enum, value_name = "on|off")]
    pub attention: Option<OnOff>,
    /// Gradients that are the same bits on every run of the same build and device, so a
    /// resumed run repeats the uninterrupted one exactly. On CUDA the flash attention
    /// backward otherwise sums the query gradient by atomic adds (as FlashAttention-2 and
    /// PyTorch's SDPA do), whose order varies; this runs a second kernel for it instead
    /// (slower at long sequences).
    #[arg(long)]
    pub deterministic: bool,
    /// The dtype the fused linear cross entropy sums the LM head's weight gradient in over
    /// its chunks of tokens: `weight-dtype`, as Liger-Kernel (one rounding per chunk, no f32
    /// [vocab, hidden] accumulator: 4 bytes per head weight less while the loss runs), or
    /// `f32` (one rounding in all). Same result for f32 weights. [default: weight-dtype]
    #[arg(long, value_enum, value_name = "weight-dtype|f32")]
    pub head_grad: Option<HeadGradArg>,
    /// Longest example in tokens (bos + prompt + response + eos); with --packing, the
    /// length of every packed row. [default: 256]
    #[arg(long, value_name = "TOKENS")]
    pub max_length: Option<usize>,
    /// Pack whole examples end to end into rows of --max-length tokens (no example is
    /// split; the first token of each is not trained) instead of one padded example per
    /// row. Each example attends only to itself, with positions restarting at 0, as
    /// transformers' padding-free packing. `--packing` alone means on. [default: off]
    #[arg(long, value_enum, value_name = "on|off", num_args = 0..=1, default_missing_value = "on")]
    pub packing: Option<OnOff>,
    /// Rows per micro-batch. [default: 8]
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Micro-batches per optimizer step (gradient accumulation; the step's loss is the mean
    /// over all its trained tokens). [default: 1]
    #[arg(long, value_name = "N")]
    pub grad_accum: Option<usize>,
    /// Peak learning rate (AdamW, betas 0.9/0.999, eps 1e-8). [default: 3e-3 for the
    /// random model, 2e-5 with --model]
    #[arg(long, value_name = "LR")]
    pub lr: Option<f64>,
    /// Final learning rate of the cosine decay, as a fraction of --lr. [default: 0.1]
    #[arg(long, value_name = "RATIO")]
    pub min_lr_ratio: Option<f64>,
    /// Steps of linear warmup from lr/warmup to lr. [default: 10% of the steps, at most 100]
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<usize>,
    /// Optimizer steps to run in total. [default: 300, or what --epochs implies]
    #[arg(long, value_name = "N", conflicts_with = "epochs")]
    pub steps: Option<usize>,
    /// Passes over the data instead of --steps (steps = micro-batches of the epochs /
    /// --grad-accum, rounded up).
    #[arg(long, value_name = "N")]
    pub epochs: Option<usize>,
    /// AdamW decoupled weight decay (all parameters). [default: 0.01]
    #[arg(long, value_name = "WD")]
    pub weight_decay: Option<f64>,
    /// Clip the global L2 norm of all gradients to this (PyTorch's clip_grad_norm_); 0 turns
    /// clipping off. The norm before clipping is logged either way. [default: 1.0]
    #[arg(long, value_name = "NORM")]
    pub max_grad_norm: Option<f64>,
    /// Write a checkpoint every N steps; 0: only the final one. [default: 100]
    #[arg(long, value_name = "N")]
    pub save_every: Option<usize>,
    /// Seed of the data order and of the random model's initialization. [default: 42]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Print a log line every N steps (above the progress bar on a terminal; the only
    /// progress output otherwise); 0: first and last step only.
    #[arg(long, value_name = "N", default_value_t = 25)]
    pub log_every: usize,
    /// LoRA fine-tuning with adapters of rank N: the model's weights are frozen (no
    /// gradient, no optimizer state; they stay in --dtype) and only a low-rank update
    /// W + (alpha/N)·B·A of each --lora-targets projection trains, A [N, in] and B [out, N]
    /// in f32 (PEFT's initialization: A Kaiming-uniform, B zero, so training starts from
    /// the model itself). The forward adds (dropout(x)·Aᵀ)·Bᵀ·alpha/N to each frozen layer's
    /// output without building the merged weight. Checkpoints hold the adapters only, as
    /// PEFT writes them (adapter_config.json, adapter_model.safetensors: load them with
    /// PeftModel.from_pretrained, or `liger merge` them into the base), plus their
    /// optimizer state. Without this flag every parameter trains.
    #[arg(long, value_name = "N")]
    pub lora_rank: Option<usize>,
    /// LoRA alpha: the adapters' output is scaled by alpha/rank (alpha/sqrt(rank) with
    /// --lora-rslora). [default: 2 × --lora-rank]
    #[arg(long, value_name = "ALPHA", requires = "lora_rank")]
    pub lora_alpha: Option<f64>,
    /// Dropout probability of the adapters' input (the frozen path sees x unchanged),
    /// in [0, 1). [default: 0]
    #[arg(long, value_name = "P", requires = "lora_rank")]
    pub lora_dropout: Option<f64>,
    /// Comma list of the projections that get adapters: q, k, v, o (attention), gate, up,
    /// down (MLP), lm_head (the output layer; its adapter trains inside the fused linear
    /// cross entropy), or all-linear (= q,k,v,o,gate,up,down). The _proj names (q_proj,
    /// ...) are accepted too. [default: all-linear]
    #[arg(long, value_name = "LIST", requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// rsLoRA scaling alpha/sqrt(rank) instead of alpha/rank (Kalajdzievski 2023; PEFT's
    /// use_rslora), which keeps the update's size stable as the rank grows.
    #[arg(long, requires = "lora_rank")]
    pub lora_rslora: bool,
    /// Where the adapters' products compute with --dtype f16/bf16 (no effect with f32).
    /// [default: f32]
    #[arg(
        long,
        value_enum,
        value_name = "f32|activation",
        requires = "lora_rank"
    )]
    pub lora_precision: Option<LoraPrecisionArg>,
    /// What to do with a data line that is not valid JSON or lacks a field.
    #[arg(long, value_enum, default_value_t = BadLineArg::Fail)]
    pub on_bad_line: BadLineArg,
    /// What to do with an example longer than --max-length.
    #[arg(long, value_enum, default_value_t = TooLongArg::Truncate)]
    pub on_too_long: TooLongArg,
}

/// Runs `liger train`.
pub fn run(args: TrainArgs) -> Result<ExitCode> {
    let mut args = args;
    args.memory_pool = args.memory_pool.resolve(args.device);
    liger_verify::pool::configure(args.memory_pool)?;
    let saved = match &args.resume {
        Some(dir) => Some(checkpoint::read_state(dir)?),
        None => None,
    };
    let tokenizer = load_tokenizer(&args, saved.as_ref())?;
    let method = method_config(&args, saved.as_ref())?;
    let kind = match method {
        MethodConfig::Preference(_) => DataKind::Pairs,
        MethodConfig::Kto(_) => DataKind::Labelled,
        _ => DataKind::Sft,
    };
    let (text, source) = match &args.data {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the data file {}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let (text, name) = bundled::dataset_for(kind);
            (text.to_string(), name.to_string())
        }
    };
    let max_length = pick(
        "max-length",
        args.max_length,
        saved.as_ref().map(|s| s.config.max_length),
        DEFAULT_MAX_LENGTH,
    )?;
    let opts = DataOptions {
        max_length,
        on_bad_line: match args.on_bad_line {
            BadLineArg::Skip => BadLinePolicy::Skip,
            BadLineArg::Fail => BadLinePolicy::Fail,
        },
        on_too_long: match args.on_too_long {
            TooLongArg::Truncate => TooLongPolicy::Truncate,
            TooLongArg::Skip => TooLongPolicy::Skip,
            TooLongArg::Fail => TooLongPolicy::Fail,
        },
    };
    let dataset = data::prepare_post(&text, &source, &tokenizer, opts, kind)?;
    report_data(&dataset, &tokenizer);
    let mut config = settings(
        &args,
        saved.as_ref(),
        &dataset,
        &tokenizer,
        max_length,
        method,
    )?;
    config.method = method;
    config.validate()?;
    let liger = liger_config(&args)?;
    let output = match (&args.output, &args.resume) {
        (Some(o), _) => o.clone(),
        (None, Some(r)) => r
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        (None, None) => PathBuf::from("liger-train-out"),
    };
    device::dispatch(
        args.device,
        TrainJob {
            args,
            tokenizer,
            dataset,
            config,
            liger,
            output,
        },
    )
}

/// The tokenizer: --tokenizer, else the checkpoint's or model's tokenizer.json, else the
/// bundled one. Special ids come from the model's config.json where it has them (for a
/// LoRA checkpoint, which has none: its base model's).
fn load_tokenizer(args: &TrainArgs, saved: Option<&TrainerState>) -> Result<TextTokenizer> {
    let model_dir = args.resume.as_ref().or(args.model.as_ref());
    let config_dir = match (&args.resume, saved) {
        (Some(_), Some(state)) if state.config.lora.is_some() => base_dir(args, state),
        _ => model_dir.cloned(),
    };
    let ids = match config_dir {
        Some(dir) => {
            let config = ModelConfig::from_file(dir.join("config.json"))?;
            SpecialIds::from_hf_config(&config.extra)
        }
        None => SpecialIds::default(),
    };
    let path = match (&args.tokenizer, model_dir) {
        (Some(p), _) => p.clone(),
        (None, Some(dir)) => {
            let p = dir.join(checkpoint::TOKENIZER_FILE);
            if !p.is_file() {
                bail!(
                    "{}: not found; the model directory needs its tokenizer.json, or pass \
                     --tokenizer FILE",
                    p.display()
                );
            }
            p
        }
        (None, None) => return Ok(bundled::tokenizer()),
    };
    Ok(TextTokenizer::from_file(&path, ids)?)
}

/// The base model of a resumed LoRA run: --model, else the one its checkpoint names
/// (`None`: a random model from the seed).
fn base_dir(args: &TrainArgs, state: &TrainerState) -> Option<PathBuf> {
    args.model
        .clone()
        .or_else(|| state.base_model.as_ref().map(PathBuf::from))
}

/// The flag's value, else the checkpoint's (a flag that disagrees with it is refused),
/// else the default.
fn pick<T: PartialEq + std::fmt::Debug + Copy>(
    flag: &str,
    given: Option<T>,
    saved: Option<T>,
    default: T,
) -> Result<T> {
    match (given, saved) {
        (Some(g), Some(s)) if g != s => bail!(
            "--{flag} {g:?} differs from the checkpoint's {s:?}: a resumed run keeps the \
             settings it was started with (drop the flag)"
        ),
        (Some(g), _) => Ok(g),
        (None, Some(s)) => Ok(s),
        (None, None) => Ok(default),
    }
}

/// The run's settings from the flags, the checkpoint and the defaults.
fn settings(
    args: &TrainArgs,
    saved: Option<&TrainerState>,
    dataset: &Dataset,
    tokenizer: &TextTokenizer,
    max_length: usize,
    method: MethodConfig,
) -> Result<TrainConfig> {
    let sc = saved.map(|s| &s.config);
    let layout = pick(
        "packing",
        args.packing
            .map(|p| if p.on() { Layout::Pack } else { Layout::Pad }),
        sc.map(|c| c.layout),
        Layout::Pad,
    )?;
    let batch_size = pick(
        "batch-size",
        args.batch_size,
        sc.map(|c| c.batch_size),
        DEFAULT_BATCH_SIZE,
    )?;
    let grad_accum = pick("grad-accum", args.grad_accum, sc.map(|c| c.grad_accum), 1)?;
    let seed = pick("seed", args.seed, sc.map(|c| c.seed), DEFAULT_SEED)?;
    let max_grad_norm = pick(
        "max-grad-norm",
        args.max_grad_norm.map(|n| (n > 0.0).then_some(n)),
        sc.map(|c| c.max_grad_norm),
        Some(DEFAULT_MAX_GRAD_NORM),
    )?;
    let mut config = TrainConfig {
        max_length,
        layout,
        batch_size,
        grad_accum,
        schedule: LrSchedule {
            peak_lr: 0.0,
            min_lr_ratio: 0.0,
            warmup_steps: 0,
            total_steps: 0,
        },
        weight_decay: pick(
            "weight-decay",
            args.weight_decay,
            sc.map(|c| c.weight_decay),
            DEFAULT_WEIGHT_DECAY,
        )?,
        max_grad_norm,
        seed,
        save_every: pick(
            "save-every",
            args.save_every,
            sc.map(|c| c.save_every),
            DEFAULT_SAVE_EVERY,
        )?,
        pure_low_precision: pick(
            "pure-low-precision",
            args.pure_low_precision.then_some(true),
            sc.map(|c| c.pure_low_precision),
            false,
        )?,
        method,
        lora: None,
    };
    if batch_size == 0 || grad_accum == 0 {
        bail!("--batch-size and --grad-accum must be at least 1");
    }
    config.lora = lora_settings(args, sc)?;
    let ss = saved.map(|s| s.config.schedule);
    let implied_steps = match args.epochs {
        Some(0) => bail!("--epochs must be at least 1"),
        Some(e) => Some(trainer::steps_for_epochs(
            dataset,
            &config,
            tokenizer.specials.pad,
            e,
        )),
        None => args.steps,
    };
    let total_steps = pick(
        "steps",
        implied_steps,
        ss.map(|s| s.total_steps),
        DEFAULT_STEPS,
    )?;
    let default_lr = if args.model.is_some() {
        DEFAULT_LR_PRETRAINED
    } else {
        DEFAULT_LR_RANDOM
    };
    config.schedule = LrSchedule {
        peak_lr: pick("lr", args.lr, ss.map(|s| s.peak_lr), default_lr)?,
        min_lr_ratio: pick(
            "min-lr-ratio",
            args.min_lr_ratio,
            ss.map(|s| s.min_lr_ratio),
            DEFAULT_MIN_LR_RATIO,
        )?,
        warmup_steps: pick(
            "warmup-steps",
            args.warmup_steps,
            ss.map(|s| s.warmup_steps),
            default_warmup_steps(total_steps),
        )?,
        total_steps,
    };
    config.validate()?;
    Ok(config)
}

/// The method and its options from the flags, the checkpoint (a resume keeps its
/// method; a flag that disagrees is refused) and Liger-Kernel's defaults.
fn method_config(args: &TrainArgs, saved: Option<&TrainerState>) -> Result<MethodConfig> {
    let given = args.method.map(|m| match m {
        MethodArg::Sft => "sft",
        MethodArg::Dpo => "dpo",
        MethodArg::Orpo => "orpo",
        MethodArg::Cpo => "cpo",
        MethodArg::Simpo => "simpo",
        MethodArg::Kto => "kto",
        MethodArg::Distill => "distill",
    });
    let flags_given = args.beta.is_some()
        || args.loss_type.is_some()
        || args.label_smoothing.is_some()
        || args.alpha.is_some()
        || args.simpo_gamma.is_some()
        || args.desirable_weight.is_some()
        || args.undesirable_weight.is_some()
        || args.divergence.is_some()
        || args.jsd_beta.is_some()
        || args.temperature.is_some()
        || args.weight_hard_loss.is_some()
        || args.weight_soft_loss.is_some();
    if let Some(saved) = saved {
        let kept = saved.config.method;
        if given.is_some_and(|g| g != kept.name()) {
            bail!(
                "--method {} differs from the checkpoint's {}: a resumed run keeps its method",
                given.unwrap_or_default(),
                kept.name()
            );
        }
        if flags_given {
            bail!(
                "a resumed run keeps its method's options ({:?}): drop the loss flags",
                kept
            );
        }
        return Ok(kept);
    }
    let name = given.unwrap_or("sft");
    let mut method = MethodConfig::from_name(name).expect("a known method");
    let only = |flag: &str, given: bool, methods: &str| -> Result<()> {
        if given {
            bail!("--{flag} applies to --method {methods}, not {name}");
        }
        Ok(())
    };
    match &mut method {
        MethodConfig::Sft => {
            if flags_given {
                bail!(
                    "the loss flags (--beta, --loss-type, ...) apply to the other methods, not sft"
                );
            }
        }
        MethodConfig::Preference(o) => {
            if let Some(t) = &args.loss_type {
                if !matches!(o.loss, PreferenceLoss::Dpo(_)) {
                    bail!("--loss-type applies to --method dpo, not {name}");
                }
                let Some(t) = DpoLossType::from_name(t) else {
                    bail!(
                        "--loss-type {t}: unknown; one of {}",
                        DpoLossType::ALL.map(|t| t.name()).join(", ")
                    );
                };
                o.loss = PreferenceLoss::Dpo(t);
            }
            if let Some(g) = args.simpo_gamma {
                if !matches!(o.loss, PreferenceLoss::Simpo { .. }) {
                    bail!("--simpo-gamma applies to --method simpo, not {name}");
                }
                o.loss = PreferenceLoss::Simpo { gamma: g };
            }
            if let Some(b) = args.beta {
                o.beta = b;
            }
            if let Some(e) = args.label_smoothing {
                o.label_smoothing = e;
            }
            if let Some(a) = args.alpha {
                o.alpha = a;
                o.compute_nll_loss = true;
            }
            only("desirable-weight", args.desirable_weight.is_some(), "kto")?;
            only(
                "undesirable-weight",
                args.undesirable_weight.is_some(),
                "kto",
            )?;
        }
        MethodConfig::Kto(o) => {
            if let Some(b) = args.beta {
                o.beta = b;
            }
            o.desirable_weight = args.desirable_weight.unwrap_or(o.desirable_weight);
            o.undesirable_weight = args.undesirable_weight.unwrap_or(o.undesirable_weight);
            only("loss-type", args.loss_type.is_some(), "dpo")?;
            only(
                "label-smoothing",
                args.label_smoothing.is_some(),
                "dpo, cpo, simpo",
            )?;
            only("alpha", args.alpha.is_some(), "dpo, orpo, cpo, simpo")?;
        }
        MethodConfig::Distill(o) => {
            let beta = args.jsd_beta.unwrap_or(0.5);
            o.divergence = match args.divergence.unwrap_or(DivergenceArg::Jsd) {
                DivergenceArg::Jsd => Divergence::Jsd { beta },
                DivergenceArg::ForwardKl => Divergence::ForwardKl,
                DivergenceArg::ReverseKl => Divergence::ReverseKl,
                DivergenceArg::Tvd => Divergence::Tvd,
            };
            if args.jsd_beta.is_some() && !matches!(o.divergence, Divergence::Jsd { .. }) {
                bail!("--jsd-beta applies to --divergence jsd");
            }
            o.temperature = args.temperature.unwrap_or(o.temperature);
            o.weight_hard_loss = args.weight_hard_loss.unwrap_or(o.weight_hard_loss);
            o.weight_soft_loss = args.weight_soft_loss.unwrap_or(o.weight_soft_loss);
            only("beta", args.beta.is_some(), "dpo, orpo, cpo, simpo, kto")?;
            only("loss-type", args.loss_type.is_some(), "dpo")?;
        }
    }
    if !matches!(method, MethodConfig::Distill(_)) {
        for (flag, given) in [
            ("divergence", args.divergence.is_some()),
            ("jsd-beta", args.jsd_beta.is_some()),
            ("temperature", args.temperature.is_some()),
            ("weight-hard-loss", args.weight_hard_loss.is_some()),
            ("weight-soft-loss", args.weight_soft_loss.is_some()),
        ] {
            only(flag, given, "distill")?;
        }
    }
    if matches!(method, MethodConfig::Distill(_)) != args.teacher.is_some() {
        bail!(if args.teacher.is_some() {
            "--teacher applies to --method distill"
        } else {
            "--method distill needs --teacher DIR (a Hugging Face checkpoint with the student's tokenizer)"
        });
    }
    method
        .check()
        .map_err(|e| anyhow::anyhow!("--method {name}: {e}"))?;
    Ok(method)
}

/// The LoRA settings from the --lora-* flags and the checkpoint's (a resumed run keeps
/// them: a flag that disagrees is refused).
fn lora_settings(args: &TrainArgs, saved: Option<&TrainConfig>) -> Result<Option<LoraConfig>> {
    let saved_lora = saved.map(|c| c.lora.as_ref());
    if let (Some(None), Some(_)) = (saved_lora, args.lora_rank) {
        bail!(
            "--lora-rank: the checkpoint is of a full fine-tuning run; a resumed run keeps its \
             settings (drop the --lora-* flags)"
        );
    }
    let saved_lora = saved_lora.flatten();
    let rank = match (args.lora_rank, saved_lora) {
        (None, None) => return Ok(None),
        (given, s) => pick("lora-rank", given, s.map(|l| l.rank), 0)?,
    };
    let alpha = pick(
        "lora-alpha",
        args.lora_alpha,
        saved_lora.map(|l| l.alpha),
        2.0 * rank as f64,
    )?;
    let dropout = pick(
        "lora-dropout",
        args.lora_dropout,
        saved_lora.map(|l| l.dropout),
        0.0,
    )?;
    let use_rslora = pick(
        "lora-rslora",
        args.lora_rslora.then_some(true),
        saved_lora.map(|l| l.use_rslora),
        false,
    )?;
    let precision = pick(
        "lora-precision",
        args.lora_precision.map(LoraPrecisionArg::precision),
        saved_lora.map(|l| l.precision),
        AdapterPrecision::F32,
    )?;
    let targets = match (&args.lora_targets, saved_lora) {
        (Some(list), s) => {
            let t =
                LoraTarget::parse_list(list).map_err(|e| anyhow::anyhow!("--lora-targets: {e}"))?;
            if let Some(s) = s
                && s.targets != t
            {
                bail!(
                    "--lora-targets {list} differs from the checkpoint's {:?}: a resumed run \
                     keeps the settings it was started with (drop the flag)",
                    s.targets
                );
            }
            t
        }
        (None, Some(s)) => s.targets.clone(),
        (None, None) => LoraTarget::ALL_LINEAR.to_vec(),
    };
    let lora = LoraConfig {
        rank,
        alpha,
        dropout,
        targets,
        use_rslora,
        precision,
    };
    lora.validate()
        .map_err(|e| anyhow::anyhow!("{e} (--lora-rank, --lora-alpha, --lora-dropout)"))?;
    if args.gradient_checkpointing && lora.dropout > 0.0 {
        bail!(
            "--gradient-checkpointing runs each layer's forward again in the backward, which \
             would draw other LoRA dropout masks than the forward did (dropout {}): set \
             --lora-dropout 0, or train without --gradient-checkpointing",
            lora.dropout
        );
    }
    Ok(Some(lora))
}

/// Trainable and total parameters, and the LoRA settings, in words.
fn parameters_text<B: FusedOps>(model: &CausalLm<B>, lora: Option<&LoraConfig>) -> String {
    let trainable = model.num_trainable_params();
    let adapters: usize = model
        .adapters()
        .iter()
        .map(|m| {
            m.adapter.lora_a.dims().iter().product::<usize>()
                + m.adapter.lora_b.dims().iter().product::<usize>()
        })
        .sum();
    let total = model.config.num_params() + adapters;
    let share = 100.0 * trainable as f64 / total.max(1) as f64;
    match lora {
        None => format!("{trainable} trainable of {total} ({share:.2}%): full fine-tuning"),
        Some(l) => format!(
            "{trainable} trainable of {total} ({share:.2}%): LoRA rank {}, alpha {} (scale \
             {:.4}{}), dropout {}, {} adapters on {}; adapters in f32 ({} products), the base \
             frozen",
            l.rank,
            l.alpha,
            l.scale(),
            if l.use_rslora { ", rsLoRA" } else { "" },
            l.dropout,
            model.adapters().len(),
            l.targets
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(","),
            l.precision.name()
        ),
    }
}

/// Kernel switches: --liger, then the per-kernel flags.
fn liger_config(args: &TrainArgs) -> Result<LigerConfig> {
    let mut c = match args.liger {
        OnOff::On => LigerConfig::all(),
        OnOff::Off => LigerConfig::none(),
    };
    let set = |flag: Option<OnOff>, field: &mut bool| {
        if let Some(f) = flag {
            *field = f.on();
        }
    };
    set(args.rope, &mut c.rope);
    set(args.rms_norm, &mut c.rms_norm);
    set(args.swiglu, &mut c.swiglu);
    set(args.attention, &mut c.attention);
    c.deterministic = args.deterministic;
    if let Some(head_grad) = args.head_grad {
        c.head_grad_accumulation = head_grad.accumulation();
    }
    set(
        args.fused_linear_cross_entropy,
        &mut c.fused_linear_cross_entropy,
    );
    if let Some(ce) = args.cross_entropy {
        c.cross_entropy = ce.on();
        if ce.on() && args.fused_linear_cross_entropy.is_none() {
            c.fused_linear_cross_entropy = false;
        }
    }
    c.validate().map_err(|e| {
        anyhow::anyhow!("{e} (--cross-entropy on and --fused-linear-cross-entropy on together)")
    })?;
    Ok(c)
}

fn kernels_text(args: &TrainArgs, c: &LigerConfig) -> String {
    let on: Vec<&str> = [
        (c.rope, "rope"),
        (c.rms_norm, "rms_norm"),
        (c.swiglu, "swiglu"),
        (c.cross_entropy, "cross_entropy"),
        (c.fused_linear_cross_entropy, "fused_linear_cross_entropy"),
        (c.attention, "attention"),
        (c.lora, "lora"),
    ]
    .into_iter()
    .filter_map(|(b, n)| b.then_some(n))
    .collect();
    format!(
        "{} backend; fused: {}{}",
        match args.liger {
            OnOff::On => "Liger<Autodiff<B>>",
            OnOff::Off => "Autodiff<B>",
        },
        if on.is_empty() {
            "none (stock Burn)".to_string()
        } else {
            on.join(", ")
        },
        if c.deterministic {
            "; deterministic gradients"
        } else {
            ""
        }
    ) + if c.fused_linear_cross_entropy
        && c.head_grad_accumulation == liger_burn::ops::WeightGradAccumulation::F32
    {
        "; LM head gradient summed in f32"
    } else {
        ""
    }
}

/// The optimizer and its precision, in words.
fn optimizer_text(dtype: DtypeArg, config: &TrainConfig) -> String {
    let fused = "AdamW (liger-burn, one fused kernel per parameter on CubeCL devices)";
    match dtype.dtype() {
        DType::F16 | DType::BF16 if config.pure_low_precision => format!(
            "{fused}; pure {dtype}: weights and moments in {dtype}, no master copy (updates \
             below half a {dtype} ulp are lost)"
        ),
        DType::F16 | DType::BF16 => format!(
            "{fused}; mixed precision: f32 master weights and moments, {dtype} weights for \
             the forward and backward"
        ),
        _ => format!("{fused}; weights and moments in {dtype}"),
    }
}

/// Prints what was read, skipped and truncated.
fn report_data(d: &Dataset, tok: &TextTokenizer) {
    println!(
        "data:      {}: {} examples, {} tokens (tokenizer: {}, {} tokens)",
        d.source_name,
        d.examples.len(),
        d.tokens(),
        tok.source,
        tok.vocab_size()
    );
    if !d.skipped.is_empty() {
        println!("skipped:   {} lines", d.skipped.len());
        for e in d.skipped.iter().take(10) {
            println!("  {e}");
        }
        if d.skipped.len() > 10 {
            println!("  ... and {} more", d.skipped.len() - 10);
        }
    }
    if !d.truncated.is_empty() {
        let lines: Vec<String> = d.truncated.iter().take(10).map(|l| l.to_string()).collect();
        println!(
            "truncated: {} examples to --max-length (lines {}{})",
            d.truncated.len(),
            lines.join(", "),
            if d.truncated.len() > 10 { ", ..." } else { "" }
        );
    }
}

struct TrainJob {
    args: TrainArgs,
    tokenizer: TextTokenizer,
    dataset: Dataset,
    config: TrainConfig,
    liger: LigerConfig,
    output: PathBuf,
}

impl TrainJob {
    fn train<B: TrainBackend>(
        self,
        ctx_device: &B::Device,
        memory: Option<Box<dyn Fn() -> u64 + '_>>,
    ) -> Result<ExitCode>
    where
        CausalLm<B>: AutodiffModule<B>,
    {
        let dtype = self.args.dtype.dtype();
        // The model a run starts from (a LoRA run's frozen base): --model, or random.
        let base = |dir: Option<&PathBuf>| -> Result<(CausalLm<B>, String)> {
            Ok(match dir {
                Some(dir) => (
                    CausalLm::<B>::load(dir, dtype, self.liger, ctx_device)?,
                    dir.display().to_string(),
                ),
                None => {
                    let mc = bundled::model_config_for(&self.tokenizer);
                    let model = trainer::random_model::<B>(
                        &mc,
                        self.liger,
                        dtype,
                        ctx_device,
                        self.config.seed,
                    );
                    (model, format!("random init (seed {})", self.config.seed))
                }
            })
        };
        let (model, resume, origin, base_model) = match &self.args.resume {
            Some(dir) => {
                let state = checkpoint::read_state(dir)?;
                let (loaded, base_model) = if state.config.lora.is_some() {
                    let base_path = base_dir(&self.args, &state);
                    let (model, from) = base(base_path.as_ref())?;
                    println!("base:      {from}");
                    let loaded = checkpoint::load_lora::<B, trainer::ParamRecord<B>>(
                        dir, model, ctx_device,
                    )?;
                    (loaded, base_path.map(|p| p.display().to_string()))
                } else {
                    if self.args.model.is_some() {
                        bail!(
                            "--model with --resume: the checkpoint of a full fine-tuning run \
                             holds the whole model (only a LoRA run's needs its base)"
                        );
                    }
                    let loaded = checkpoint::load::<B, trainer::ParamRecord<B>>(
                        dir, dtype, self.liger, ctx_device,
                    )?;
                    let base_model = loaded.state.base_model.clone();
                    (loaded, base_model)
                };
                let origin = format!("{} (resumed at step {})", dir.display(), loaded.state.step);
                let resume = Resume {
                    optimizer: loaded.optimizer,
                    state: loaded.state,
                };
                (loaded.model, Some(resume), origin, base_model)
            }
            None => {
                let (model, origin) = base(self.args.model.as_ref())?;
                let mut base_model = self.args.model.as_ref().map(|p| p.display().to_string());
                let model = match &self.config.lora {
                    Some(lora) => {
                        if base_model.is_none() {
                            // The adapters need their base to be loaded (PEFT, `liger
                            // merge`, a resume): a random one is written beside them.
                            let dir = self.output.join(RANDOM_BASE_DIR);
                            model.save(&dir)?;
                            let tok = dir.join(checkpoint::TOKENIZER_FILE);
                            std::fs::write(&tok, &self.tokenizer.json)
                                .with_context(|| format!("writing {}", tok.display()))?;
                            println!("base:      random model written to {}", dir.display());
                            base_model = Some(dir.display().to_string());
                        }
                        trainer::attach_lora(model, lora, self.config.seed, ctx_device)?
                    }
                    None => model,
                };
                (model, None, origin, base_model)
            }
        };
        let frozen = self.frozen_model::<B>(&model, ctx_device)?;
        let model = model
            .with_memory_release_per_layer(self.args.memory_pool.releases_in_step())
            .with_gradient_checkpointing(self.args.gradient_checkpointing);
        let mc = &model.config;
        if self.tokenizer.vocab_size() > mc.vocab_size {
            bail!(
                "the tokenizer ({}) has {} tokens but the model's vocabulary is {}: token ids \
                 would fall outside the embedding",
                self.tokenizer.source,
                self.tokenizer.vocab_size(),
                mc.vocab_size
            );
        }
        println!(
            "model:     {} ({}, hidden {}, {} layers, vocab {}, {:.2}M parameters) in {}",
            origin,
            mc.model_type,
            mc.hidden_size,
            mc.num_hidden_layers,
            mc.vocab_size,
            mc.num_params() as f64 / 1e6,
            self.args.dtype
        );
        println!(
            "params:    {}",
            parameters_text(&model, self.config.lora.as_ref())
        );
        println!("kernels:   {}", kernels_text(&self.args, &self.liger));
        if self.args.gradient_checkpointing {
            println!(
                "memory:    gradient checkpointing: each decoder layer keeps its input and runs \
                 again in the backward"
            );
        }
        if self.config.method != MethodConfig::Sft {
            println!(
                "method:    {} {:?}",
                self.config.method.name(),
                self.config.method
            );
        }
        println!(
            "optimizer: {}",
            optimizer_text(self.args.dtype, &self.config)
        );
        let c = &self.config;
        println!(
            "schedule:  {} steps x {} micro-batches of {} {} ({}, max length {}), lr {:.1e} \
             (warmup {}, cosine to {:.1e}), weight decay {}, clip {}, seed {}",
            c.schedule.total_steps,
            c.grad_accum,
            c.batch_size,
            if c.method.paired() { "pairs" } else { "rows" },
            match c.layout {
                Layout::Pad => "padded",
                Layout::Pack => "packed",
            },
            c.max_length,
            c.schedule.peak_lr,
            c.schedule.warmup_steps,
            c.schedule.peak_lr * c.schedule.min_lr_ratio,
            c.weight_decay,
            c.max_grad_norm
                .map_or("off".to_string(), |n| format!("global norm {n}")),
            c.seed
        );
        println!("output:    {}", self.output.display());
        let mut progress = ConsoleProgress::new(self.args.log_every);
        let result = trainer::train(
            Run {
                model,
                dataset: &self.dataset,
                tokenizer: &self.tokenizer,
                config: self.config.clone(),
                output: self.output.clone(),
                resume,
                memory,
                kernels: kernels_text(&self.args, &self.liger),
                frozen,
                base_model,
            },
            &mut progress,
        );
        progress.finish();
        let s = match result {
            Ok(s) => s,
            Err(e @ (TrainError::NonFinite { .. } | TrainError::Panicked { .. })) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(e.into()),
        };
        println!(
            "done:      {} steps (to step {}), {} tokens in {:.1} s = {:.0} tokens/s",
            s.steps,
            s.last_step,
            s.tokens,
            s.seconds,
            s.tokens_per_second()
        );
        println!(
            "loss:      {:.4} (first step) -> {:.4} (last step)",
            s.first_loss, s.last_loss
        );
        println!(
            "memory:    peak device pool {}",
            format_memory(s.peak_memory_bytes)
        );
        println!("saved:     {}", s.checkpoint.display());
        println!("metrics:   {}", s.log.display());
        Ok(ExitCode::SUCCESS)
    }
}

impl TrainJob {
    /// The frozen model of the method, on the inner backend: the teacher (--teacher), or
    /// the reference: --reference, else the policy before its first step (on a resume:
    /// the random initialization of the seed, which a run from --model must name with
    /// --reference).
    fn frozen_model<B: TrainBackend>(
        &self,
        policy: &CausalLm<B>,
        device: &B::Device,
    ) -> Result<Option<CausalLm<B::InnerBackend>>> {
        let method = self.config.method;
        if !method.needs_frozen() {
            return Ok(None);
        }
        let dtype = self.args.dtype.dtype();
        let load = |dir: &Path, what: &str| -> Result<CausalLm<B::InnerBackend>> {
            let m = CausalLm::<B::InnerBackend>::load(dir, dtype, self.liger, device)
                .with_context(|| format!("loading the {what} {}", dir.display()))?;
            println!(
                "{what:<10} {} (hidden {}, {} layers, vocab {}), frozen",
                dir.display(),
                m.config.hidden_size,
                m.config.num_hidden_layers,
                m.config.vocab_size
            );
            Ok(m)
        };
        if let MethodConfig::Distill(_) = method {
            let dir = self
                .args
                .teacher
                .as_ref()
                .context("--method distill needs --teacher DIR")?;
            let teacher = load(dir, "teacher:")?;
            if teacher.config.vocab_size < policy.config.vocab_size {
                bail!(
                    "the teacher's vocabulary ({}) is smaller than the student's ({}): they must share the tokenizer",
                    teacher.config.vocab_size,
                    policy.config.vocab_size
                );
            }
            return Ok(Some(teacher));
        }
        match (self.args.reference.as_ref(), &self.args.resume) {
            (Some(dir), _) => Ok(Some(load(dir, "reference:")?)),
            // A fresh run: the policy as it is now, its parameters shared until the first
            // update writes new ones.
            (None, None) => {
                println!("reference: the model before its first step, frozen");
                Ok(Some(policy.valid()))
            }
            (None, Some(_)) if !bundled_shape(&policy.config, &self.tokenizer) => {
                bail!(
                    "resuming --method {}: pass --reference DIR, the model the run started from",
                    method.name()
                )
            }
            (None, Some(_)) => {
                let mc = bundled::model_config_for(&self.tokenizer);
                println!("reference: random init (seed {}), frozen", self.config.seed);
                Ok(Some(trainer::random_model::<B::InnerBackend>(
                    &mc,
                    self.liger,
                    dtype,
                    device,
                    self.config.seed,
                )))
            }
        }
    }
}

/// Whether `config` has the shape of the bundled model for `tokenizer` (a run that started
/// from the seed's random initialization).
fn bundled_shape(config: &ModelConfig, tokenizer: &TextTokenizer) -> bool {
    let b = bundled::model_config_for(tokenizer);
    let shape = |c: &ModelConfig| {
        (
            c.model_type,
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.tie_word_embeddings,
        )
    };
    shape(config) == shape(&b)
}

impl OnDevice for TrainJob {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        println!(
            "device:    {} ({}; Burn autotune {})",
            ctx.kind,
            B::name(&ctx.device),
            if cfg!(feature = "autotune") {
                "on"
            } else {
                "off"
            }
        );
        if ctx.cube.is_some() {
            println!("pool:      {}", self.args.memory_pool.describe());
        }
        if let Some(code) = device::require_dtype::<B>(
            &ctx.device,
            self.args.dtype.dtype(),
            self.args.dtype,
            "train",
            " (try --dtype f32)",
        ) {
            return Ok(code);
        }
        // CubeCL compiles kernels per shape: padded batches (each rounded to its own
        // longest row) bring new shapes, so new compilations, for many steps on a GPU.
        if matches!(ctx.kind, DeviceKind::Cuda | DeviceKind::Rocm)
            && self.config.layout == Layout::Pad
        {
            println!(
                "hint:      --packing gives every step one shape ([batch, --max-length]), so \
                 kernels compile once; padded batches of new lengths compile new ones"
            );
        }
        // Read after each step's synchronization. Under `--memory-pool release` the step's
        // free buffers go back to the device first (the optimizer step's release); the
        // figure is the device memory held (CUDA's pool high-water mark) where the runtime
        // has such a pool, else CubeCL's pool's reservation.
        let release = self.args.memory_pool.releases_in_step();
        let memory: Option<Box<dyn Fn() -> u64 + '_>> = ctx.cube.as_ref().map(|c| {
            Box::new(move || {
                if release {
                    c.cleanup();
                }
                let u = c.usage();
                u.device.map_or(u.reserved, |d| d.reserved_high)
            }) as Box<dyn Fn() -> u64>
        });
        match self.args.liger {
            OnOff::On => self.train::<Liger<Autodiff<B>>>(&ctx.device, memory),
            OnOff::Off => self.train::<Autodiff<B>>(&ctx.device, memory),
        }
    }
}
