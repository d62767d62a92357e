//! `liger bench --e2e`: whole training steps of Llama-3.2-1B- and Qwen2.5-1.5B-shaped
//! models (random weights) with liger on (`Liger<Autodiff<B>>`, `LigerConfig::all()`)
//! and off (`Autodiff<B>`, `LigerConfig::none()`: stock Burn), over sequence lengths:
//! tokens/s, step time and peak pool memory, and the longest sequence each mode fits.
//!
//! Every case (model × seq × mode) runs in a child process (this binary with the hidden
//! `--e2e-case MODEL:SEQ:BATCH:on|off`, see [`super::e2e_case`] for what it measures),
//! so an out-of-memory panic or abort is recorded as `oom`, another failure as `error`,
//! and a case past `--e2e-timeout` is killed and recorded as `timeout`; the run goes on.
//! Once a mode fails at some length its longer lengths are `skipped` (they need more
//! memory and time, not less). Lengths run in ascending order, off then on at each.
//!
//! - tokens/s = batch × seq / (p50 of the timed steps' wall times).
//! - peak reserved = the device memory the steps held, CUDA context excluded, over the
//!   timed steps and one more synchronized step, the pool emptied before the last warm-up
//!   step: on CUDA the high-water mark of its stream-ordered pool, from which cubecl-cuda
//!   allocates (`peak_device_reserved_MiB`; every `--memory-pool` measured alike, like
//!   PyTorch's `max_memory_reserved`); elsewhere the CubeCL pool's bytes reserved at their
//!   largest (`peak_reserved_MiB`, also written on CUDA). Peak in use = the largest bytes
//!   in live allocations read after each timed step and after each phase of the last step
//!   (see [`super::e2e_case`]).
//! - `--memory-pool` picks the pool ([`crate::pool`]); every case's process gets it.
//!
//! Attention: the off mode's is eager (as transformers' `eager`; Burn 0.21's autodiff
//! `attention` falls back to the same composition), so each layer keeps its `[batch,
//! heads, seq, seq]` f32 softmax and probabilities for the backward, a term quadratic in
//! the sequence. The on mode's is liger-burn's
//! [`attention`](liger_burn::functional::attention): the same math, the probabilities
//! recomputed block by block in the backward, nothing quadratic kept.
//! `--e2e-liger-attention off` gives the on mode eager attention too, so the two modes
//! differ only in the fused kernels (RMSNorm, RoPE, SwiGLU, softmax, the loss).
//!
//! CSV (`--csv`, appended per case as it finishes, header written when the file is new):
//! the bench layout of [`crate::csv`], one row per metric: kernel = model, provider =
//! `liger-burn` (liger on) or `burn` (liger off), mode = `train_step`, x = seq, metric =
//! `tokens/s` (p20/p80 from the step-time quantiles), `step_ms`, `peak_reserved_MiB`,
//! `peak_in_use_MiB`, `peak_device_reserved_MiB` and `peak_device_used_MiB` (CUDA), `loss`
//! (the last step's); config starts with `status=...`, and a case
//! that did not finish has one `tokens/s` row with empty numbers and its reason. The
//! PyTorch anchor (scripts/device/anchor_e2e.py; providers `torch`, `torch+liger-kernel`)
//! writes the same rows with the same meaning, so scripts/plot_e2e.py draws them together.

use super::e2e_case::{self, CaseOutput, RESULT_PREFIX};
use crate::args::{BenchArgs, OnOff};
use crate::csv::{self, Row, RunInfo};
use crate::measure::quantile;
use crate::table::{Align, Table, num};
use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use liger_models::{ModelConfig, ModelType};
use std::io::Write;
use std::process::{Command, ExitCode, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

const GIB: f64 = (1u64 << 30) as f64;

const MIB: f64 = (1u64 << 20) as f64;

/// A case is not started with less of `--e2e-budget` left than this (process start,
/// model building and compilation alone take about as long on a GPU).
const MIN_CASE_TIME: Duration = Duration::from_secs(30);

/// A model of the end-to-end benchmark (random weights, the named model's shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum E2eModel {
    /// Llama 3.2 1B: 16 layers, hidden 2048, 32/8 heads of 64, MLP 8192, vocabulary
    /// 128256, tied embeddings (1.24B parameters).
    #[value(name = "llama3.2-1b")]
    Llama32_1b,
    /// Qwen2.5 1.5B: 28 layers, hidden 1536, 12/2 heads of 128, MLP 8960, vocabulary
    /// 151936, q/k/v biases, tied embeddings (1.54B parameters).
    #[value(name = "qwen2.5-1.5b")]
    Qwen25_1_5b,
    /// Llama 3 8B's shapes: 32 layers, hidden 4096, 32/8 heads of 128, MLP 14336,
    /// vocabulary 128256, untied (8.03B parameters; with --e2e-lora-rank, issue 15's
    /// "8B with LoRA at 4K tokens" case).
    #[value(name = "llama3-8b")]
    Llama3_8b,
    /// liger-models' tiny Llama (vocabulary 128, hidden 64, 2 layers): for CPU checks.
    #[value(name = "tiny-llama")]
    TinyLlama,
    /// liger-models' tiny Qwen3 (q/k norms): for CPU checks.
    #[value(name = "tiny-qwen3")]
    TinyQwen3,
}

impl E2eModel {
    /// Name on the command line and in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            E2eModel::Llama32_1b => "llama3.2-1b",
            E2eModel::Qwen25_1_5b => "qwen2.5-1.5b",
            E2eModel::Llama3_8b => "llama3-8b",
            E2eModel::TinyLlama => "tiny-llama",
            E2eModel::TinyQwen3 => "tiny-qwen3",
        }
    }

    /// The configuration, with `layers` decoder layers when given.
    pub fn config(self, layers: Option<usize>) -> ModelConfig {
        let c = match self {
            E2eModel::Llama32_1b => ModelConfig::llama3_2_1b(),
            E2eModel::Qwen25_1_5b => ModelConfig::qwen2_5_1_5b(),
            E2eModel::Llama3_8b => ModelConfig::llama3_1_8b(),
            E2eModel::TinyLlama => ModelConfig::tiny(ModelType::Llama),
            E2eModel::TinyQwen3 => ModelConfig::tiny(ModelType::Qwen3),
        };
        match layers {
            Some(n) => c.with_layers(n),
            None => c,
        }
    }
}

/// Liger on or off in one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LigerMode {
    /// `Autodiff<B>`, every kernel switch off.
    Off,
    /// `Liger<Autodiff<B>>`, every kernel switch on.
    On,
}

impl LigerMode {
    fn name(self) -> &'static str {
        match self {
            LigerMode::Off => "off",
            LigerMode::On => "on",
        }
    }

    /// The `provider` column: `burn` (stock Burn) or `liger-burn`.
    fn provider(self) -> &'static str {
        match self {
            LigerMode::Off => "burn",
            LigerMode::On => "liger-burn",
        }
    }
}

/// One case: `MODEL:SEQ:BATCH:on|off` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E2eCase {
    /// The model.
    pub model: E2eModel,
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Liger on or off.
    pub liger: LigerMode,
}

impl std::fmt::Display for E2eCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.model.name(),
            self.seq,
            self.batch,
            self.liger.name()
        )
    }
}

impl FromStr for E2eCase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}`: expected MODEL:SEQ:BATCH:on|off");
        let parts: Vec<&str> = s.split(':').collect();
        let [model, seq, batch, liger] = parts[..] else {
            return Err(bad());
        };
        Ok(E2eCase {
            model: E2eModel::from_str(model, false)?,
            seq: seq.parse().map_err(|_| bad())?,
            batch: batch.parse().map_err(|_| bad())?,
            liger: match liger {
                "on" => LigerMode::On,
                "off" => LigerMode::Off,
                _ => return Err(bad()),
            },
        })
    }
}

/// How a case ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Measured.
    Ok,
    /// An allocation failed (panic or abort with an out-of-memory message).
    Oom,
    /// Another failure (panic, abort, signal, no result line).
    Error,
    /// No result within `--e2e-timeout`; the process was killed.
    Timeout,
    /// Not run: the same mode failed at a shorter sequence.
    Skipped,
    /// Finished, but with less memory in use than eager attention must keep for the
    /// backward (see [`eager_attention_floor`]): the step cannot have computed what it
    /// claims. Counted as a failure of the mode.
    Invalid,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Skipped => "skipped",
            Status::Invalid => "invalid",
        }
    }
}

/// The outcome of one case.
#[derive(Clone, Debug)]
struct CaseResult {
    case: E2eCase,
    status: Status,
    /// Why it failed or was skipped.
    detail: String,
    /// The child's measurement (with status `ok`).
    output: Option<CaseOutput>,
    /// Wall time of the child process, seconds.
    wall_s: f64,
}

impl CaseResult {
    fn step_ms(&self) -> Option<f64> {
        let o = self.output.as_ref()?;
        (!o.step_ms.is_empty()).then(|| quantile(&o.step_ms, 0.5))
    }

    fn tokens_per_s(&self) -> Option<f64> {
        Some(self.output.as_ref()?.tokens as f64 / (self.step_ms()? / 1e3))
    }

    /// Peak memory held: the device allocator's counter where it has one (CUDA), else
    /// CubeCL's pool's reserved bytes.
    fn peak_mib(&self) -> Option<f64> {
        let o = self.output.as_ref()?;
        Some(o.peak_device_reserved.or(o.peak_reserved)? as f64 / MIB)
    }

    fn in_use_mib(&self) -> Option<f64> {
        Some(self.output.as_ref()?.peak_in_use? as f64 / MIB)
    }
}

/// Runs `liger bench --e2e` (or, with `--e2e-case`, one case in this process).
pub fn run(args: BenchArgs) -> Result<ExitCode> {
    if let Some(spec) = &args.e2e_case {
        let case: E2eCase = spec.parse().map_err(anyhow::Error::msg)?;
        return e2e_case::run(args, case);
    }
    if args.e2e_steps == 0 || args.e2e_batch == 0 {
        bail!("--e2e-steps and --e2e-batch must be at least 1");
    }
    if args.e2e_seq.iter().any(|&s| s < 2) {
        bail!("--e2e-seq: every length must be at least 2 (the loss is over next tokens)");
    }
    if args.reduction == crate::args::ReductionArg::Both {
        bail!("--reduction both is for `liger check`; bench takes auto, plane or shared");
    }
    if let Some(rank) = args.e2e_lora_rank {
        if rank == 0 {
            bail!("--e2e-lora-rank must be at least 1");
        }
        liger_models::LoraTarget::parse_list(&args.e2e_lora_targets)
            .map_err(|e| anyhow::anyhow!("--e2e-lora-targets: {e}"))?;
    }
    let mut models = args.e2e_models.clone();
    models.dedup();
    let mut seqs = args.e2e_seq.clone();
    seqs.sort_unstable();
    seqs.dedup();
    let timeout = Duration::from_secs(args.e2e_timeout);
    let budget = args.e2e_budget.map(Duration::from_secs);
    let started = Instant::now();
    let exe = std::env::current_exe().context("locating this binary to run the cases")?;

    println!(
        "e2e:       training step = forward + loss + backward + AdamW step, synchronized; \
         {} warmup + {} timed steps per case, batch {}, {}, device {}, one process per case \
         (timeout {} s)",
        args.e2e_warmup, args.e2e_steps, args.e2e_batch, args.dtype, args.device, args.e2e_timeout
    );
    println!(
        "autotune:  {} (Burn's kernel autotune in this build; both modes share it)",
        if cfg!(feature = "autotune") {
            "on: the first step of each new shape compiles and times every matmul candidate"
        } else {
            "off: one fixed matmul kernel per problem, as Burn without its `autotune` feature"
        }
    );
    println!(
        "modes:     liger on = Liger<Autodiff<B>> + LigerConfig::all() (fused RMSNorm, RoPE, \
         SwiGLU, softmax, fused linear cross entropy with the head's weight gradient summed          in {}{}; the targets checked on the host, not read back); off = Autodiff<B> + LigerConfig::none()",
        match args.e2e_head_grad {
            crate::args::HeadGradArg::WeightDtype => "the weight dtype",
            crate::args::HeadGradArg::F32 => "f32",
        },
        if args.e2e_liger_attention.on() {
            ", attention"
        } else {
            "; --e2e-liger-attention off: eager attention"
        }
    );
    println!(
        "optimizer: AdamW lr {:e}, Burn's AdamWConfig defaults; on = liger-burn's fused AdamW \
         (one kernel per parameter), {}; off = Burn's AdamW, moments in {}",
        args.e2e_lr,
        if args.e2e_master_weights.on() {
            "f32 master weights and moments".to_string()
        } else {
            format!("moments in {}", args.dtype)
        },
        args.dtype
    );
    if let Some(lora) = e2e_case::lora_config(&args) {
        println!(
            "lora:      rank {}, alpha {} on {} (adapters f32, base frozen in {}: only the \
             adapters get gradients and AdamW state); on = liger-burn's LoRA op, off = the \
             stock composition",
            lora.rank,
            lora.alpha,
            lora.targets
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(","),
            args.dtype
        );
    }
    println!(
        "memory:    pool {}; peak reserved = device memory held over the timed steps and one \
         more step (pool emptied before the last warm-up step): CUDA's pool high-water mark on \
         CUDA, else the CubeCL pool's bytes reserved; in use read after each timed step and \
         after forward+loss, backward and optimizer of the last",
        args.memory_pool.describe()
    );
    println!(
        "attention: off = eager ([batch, heads, seq, seq] f32 softmax and probabilities kept per \
         layer for the backward: quadratic in the sequence); on = {}",
        if args.e2e_liger_attention.on() {
            "liger-burn's attention (same math, probabilities recomputed block by block in the \
             backward: linear in the sequence)"
        } else {
            "eager too (--e2e-liger-attention off): it bounds the longest sequence of both modes"
        }
    );
    for &m in &models {
        let c = m.config(args.e2e_layers);
        println!(
            "model:     {} ({} layers, hidden {}, {}/{} heads of {}, vocab {}, {:.3}M parameters)",
            m.name(),
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.vocab_size,
            c.num_params() as f64 / 1e6
        );
    }

    let commit = args
        .commit
        .clone()
        .unwrap_or_else(|| env!("LIGER_BUILD_COMMIT").to_string());
    let date = csv::utc_date();
    let mut backend: Option<String> = None;
    let mut results: Vec<CaseResult> = Vec::new();
    let modes: Vec<(usize, LigerMode)> = [LigerMode::Off, LigerMode::On]
        .into_iter()
        .enumerate()
        .filter(|(_, m)| {
            let want = if *m == LigerMode::On {
                OnOff::On
            } else {
                OnOff::Off
            };
            args.e2e_modes.contains(&want)
        })
        .collect();
    let total = models.len() * seqs.len() * modes.len();
    for &model in &models {
        // The first failure of each mode: later lengths of that mode are skipped.
        let mut failed: [Option<(usize, Status)>; 2] = [None, None];
        for &seq in &seqs {
            for &(slot, liger) in &modes {
                let case = E2eCase {
                    model,
                    seq,
                    batch: args.e2e_batch,
                    liger,
                };
                // What is left of --e2e-budget bounds this case's time limit too.
                let left = budget.map(|b| b.saturating_sub(started.elapsed()));
                let skip = match (failed[slot], left) {
                    (Some((at, status)), _) => Some(format!("{} at seq {at}", status.name())),
                    (None, Some(left)) if left < MIN_CASE_TIME => {
                        Some("--e2e-budget spent".to_string())
                    }
                    _ => None,
                };
                let result = match skip {
                    Some(detail) => CaseResult {
                        case,
                        status: Status::Skipped,
                        detail,
                        output: None,
                        wall_s: 0.0,
                    },
                    None => check_floor(
                        run_child(&exe, &args, case, left.map_or(timeout, |l| l.min(timeout))),
                        &args,
                    ),
                };
                if result.status != Status::Ok && result.status != Status::Skipped {
                    failed[slot] = Some((seq, result.status));
                }
                if let Some(o) = &result.output {
                    backend.get_or_insert_with(|| o.backend.clone());
                }
                print_progress(results.len() + 1, total, &result);
                if let Some(path) = &args.csv {
                    let run = RunInfo {
                        gpu: args
                            .gpu
                            .clone()
                            .or_else(|| backend.clone())
                            .unwrap_or_else(|| args.device.to_string()),
                        commit: commit.clone(),
                        date: date.clone(),
                    };
                    csv::append(path, &csv_rows(&result, &args), &run)?;
                }
                results.push(result);
            }
        }
    }

    println!();
    print!("{}", render(&results));
    for &model in &models {
        print!("{}", summary(model, &results, &seqs, args.e2e_warmup));
    }
    if let Some(path) = &args.csv {
        println!(
            "csv: rows of {} cases appended to {}",
            results.len(),
            path.display()
        );
    }
    // Out of memory, timeouts and skips are results; errors are failures of the run.
    let errors = results.iter().filter(|r| r.status == Status::Error).count();
    Ok(if errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The arguments that make the child run `case` as this run would.
fn child_args(args: &BenchArgs, case: E2eCase) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "bench".into(),
        "--e2e-case".into(),
        case.to_string(),
        "--device".into(),
        args.device.name().into(),
        "--dtype".into(),
        args.dtype.name().into(),
        "--e2e-warmup".into(),
        args.e2e_warmup.to_string(),
        "--e2e-steps".into(),
        args.e2e_steps.to_string(),
        "--e2e-lr".into(),
        args.e2e_lr.to_string(),
    ];
    if let Some(dir) = &args.e2e_save_start {
        a.extend(["--e2e-save-start".into(), dir.display().to_string()]);
    }
    if let Some(v) = args.reduction.to_possible_value() {
        a.extend(["--reduction".into(), v.get_name().into()]);
    }
    if let Some(n) = args.e2e_layers {
        a.extend(["--e2e-layers".into(), n.to_string()]);
    }
    if !args.e2e_liger_attention.on() {
        a.extend(["--e2e-liger-attention".into(), "off".into()]);
    }
    if args.e2e_master_weights.on() {
        a.extend(["--e2e-master-weights".into(), "on".into()]);
    }
    if args.e2e_gradient_checkpointing.on() {
        a.extend(["--e2e-gradient-checkpointing".into(), "on".into()]);
    }
    if args.e2e_profile_range.on() {
        a.extend(["--e2e-profile-range".into(), "on".into()]);
    }
    if let Some(r) = args.e2e_lora_rank {
        a.extend([
            "--e2e-lora-rank".into(),
            r.to_string(),
            "--e2e-lora-targets".into(),
            args.e2e_lora_targets.clone(),
        ]);
    }
    a.extend(["--e2e-head-grad".into(), args.e2e_head_grad.name().into()]);
    if let Some(v) = args.e2e_matmul_ordering.to_possible_value() {
        a.extend(["--e2e-matmul-ordering".into(), v.get_name().into()]);
    }
    a.extend(["--memory-pool".into(), args.memory_pool.name().into()]);
    if let Some(v) = args.hand_off.and_then(|h| h.to_possible_value()) {
        a.extend(["--hand-off".into(), v.get_name().into()]);
    }
    a
}

/// Whether a mode runs eager attention (probabilities kept for the backward) rather than
/// liger-burn's (nothing `[seq, seq]` kept): the off mode always, the on mode with
/// `--e2e-liger-attention off`.
fn eager_attention(args: &BenchArgs, liger: LigerMode) -> bool {
    liger == LigerMode::Off || !args.e2e_liger_attention.on()
}

/// The attention a mode runs, as the CSV names it: `eager` or `recompute`.
fn attention_name(args: &BenchArgs, liger: LigerMode) -> &'static str {
    if eager_attention(args, liger) {
        "eager"
    } else {
        "recompute"
    }
}

/// Runs `case` in a child process with a time limit and classifies how it ended.
fn run_child(
    exe: &std::path::Path,
    args: &BenchArgs,
    case: E2eCase,
    timeout: Duration,
) -> CaseResult {
    let start = Instant::now();
    let failed = |status: Status, detail: String, start: Instant| CaseResult {
        case,
        status,
        detail,
        output: None,
        wall_s: start.elapsed().as_secs_f64(),
    };
    // Output goes to files, not pipes: a child that writes a lot cannot block on a
    // full pipe while this process only polls for its exit.
    let dir = std::env::temp_dir();
    let stem = format!(
        "liger-e2e-{}-{}",
        std::process::id(),
        case.to_string().replace(':', "-")
    );
    let out_path = dir.join(format!("{stem}.out"));
    let err_path = dir.join(format!("{stem}.err"));
    let mut child = match spawn(exe, child_args(args, case), &out_path, &err_path) {
        Ok(c) => c,
        Err(e) => {
            let what = format!(
                "starting {} (logs in {}): {e}",
                exe.display(),
                dir.display()
            );
            return failed(Status::Error, what, start);
        }
    };
    let exit = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return failed(Status::Error, format!("waiting for the case: {e}"), start),
        }
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    let Some(exit) = exit else {
        return failed(
            Status::Timeout,
            format!("no result within {} s; killed", timeout.as_secs()),
            start,
        );
    };
    let reported = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .and_then(|json| serde_json::from_str::<CaseOutput>(json).ok());
    // An allocation that fails on one of the runtime's threads panics there; the main
    // thread then only sees "the server is in an invalid state". The first
    // out-of-memory line of stderr names the cause.
    let oom_line = stderr
        .lines()
        .find(|l| e2e_case::is_oom(l))
        .map(|l| shorten(l.trim(), 200));
    if let Some(out) = reported {
        let (status, detail) = match (out.status.as_str(), &oom_line) {
            ("ok", _) => (Status::Ok, out.detail.clone()),
            ("oom", _) => (Status::Oom, out.detail.clone()),
            (_, Some(line)) => (Status::Oom, format!("{line} (then: {})", out.detail)),
            _ => (Status::Error, out.detail.clone()),
        };
        return CaseResult {
            case,
            status,
            detail,
            output: (status == Status::Ok).then_some(out),
            wall_s: start.elapsed().as_secs_f64(),
        };
    }
    // No result line: the process died (abort, signal) before printing one.
    let tail: Vec<&str> = stderr
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let detail = format!(
        "{}: {}",
        describe_exit(&exit),
        oom_line.clone().unwrap_or_else(|| tail.join(" | "))
    );
    let status = if oom_line.is_some() || e2e_case::is_oom(&stdout) {
        Status::Oom
    } else {
        Status::Error
    };
    failed(status, shorten(&detail, 400), start)
}

/// Starts `exe args` with stdout and stderr going to the two files.
fn spawn(
    exe: &std::path::Path,
    args: Vec<String>,
    out_path: &std::path::Path,
    err_path: &std::path::Path,
) -> std::io::Result<std::process::Child> {
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out_path)?)
        .stderr(std::fs::File::create(err_path)?)
        .spawn()
}

/// `exit code N` or `killed by signal N`.
fn describe_exit(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    match status.code() {
        Some(c) => format!("exit code {c}"),
        None => "ended without a code".into(),
    }
}

fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_string(),
    }
}

/// One line per finished case (the run takes minutes; logs show where it is).
fn print_progress(index: usize, total: usize, r: &CaseResult) {
    let c = &r.case;
    let what = match r.status {
        Status::Ok => format!(
            "ok: {} tokens/s, step {} ms, peak {} MiB, loss {}",
            num(r.tokens_per_s(), 0),
            num(r.step_ms(), 1),
            num(r.peak_mib(), 0),
            num(r.output.as_ref().and_then(|o| o.loss), 4)
        ),
        other => format!("{}: {}", other.name(), r.detail),
    };
    println!(
        "[{index}/{total}] {} seq {} batch {} liger {}: {what} ({:.0} s)",
        c.model.name(),
        c.seq,
        c.batch,
        c.liger.name(),
        r.wall_s
    );
    let _ = std::io::stdout().flush();
}

/// The CSV rows of a case (see the module doc): one per metric when it ran, else one
/// `tokens/s` row with empty numbers.
fn csv_rows(r: &CaseResult, args: &BenchArgs) -> Vec<Row> {
    let nan = f64::NAN;
    let mut config = format!(
        "status={} batch={} dtype={} warmup={} steps={} optimizer={} optimizer_impl={} \
         optimizer_state={} attention={} autotune={} memory_pool={}{}",
        r.status.name(),
        r.case.batch,
        args.dtype,
        args.e2e_warmup,
        args.e2e_steps,
        e2e_case::optimizer(args.e2e_lr),
        e2e_case::optimizer_impl(r.case.liger),
        e2e_case::optimizer_state(args, r.case.liger),
        attention_name(args, r.case.liger),
        if cfg!(feature = "autotune") {
            "on"
        } else {
            "off"
        },
        args.memory_pool.name(),
        if r.case.liger == LigerMode::On {
            format!(
                " head_grad={} hand_off={}",
                args.e2e_head_grad.name(),
                crate::args::HandOffArg::name(crate::args::HandOffArg::resolve(args.hand_off))
            )
        } else {
            String::new()
        }
    );
    if args.e2e_matmul_ordering != crate::args::MatmulOrderingArg::Auto
        && let Some(v) = args.e2e_matmul_ordering.to_possible_value()
    {
        config.push_str(&format!(" matmul_ordering={}", v.get_name()));
    }
    if let Some(n) = args.e2e_layers {
        config.push_str(&format!(" layers={n}"));
    }
    if args.e2e_gradient_checkpointing.on() {
        config.push_str(" gradient_checkpointing=layers");
    }
    if let Some(lora) = e2e_case::lora_config(args) {
        config.push_str(&format!(
            " lora=r{}:alpha{}:{}",
            lora.rank,
            lora.alpha,
            lora.targets
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join("+")
        ));
    }
    let out = r.output.as_ref();
    if let Some(o) = out.filter(|o| o.params > 0) {
        config.push_str(&format!(" params={}", o.params));
    }
    if let Some(loss) = out.and_then(|o| o.loss) {
        config.push_str(&format!(" loss={loss:.4}"));
    }
    if let Some(o) = out.filter(|o| !o.losses.is_empty()) {
        let losses: Vec<String> = o
            .losses
            .iter()
            .map(|l| l.map_or("nan".into(), |v| format!("{v:.4}")))
            .collect();
        config.push_str(&format!(" losses={}", losses.join("/")));
    }
    if let Some(p) = out.map(|o| &o.phase_ms).filter(|p| p.len() == 3) {
        config.push_str(&format!(
            " phases_ms=fwd:{:.1}/bwd:{:.1}/opt:{:.1}",
            p[0], p[1], p[2]
        ));
    }
    if let Some(p) = out.map(|o| &o.phase_host_ms).filter(|p| p.len() == 3) {
        config.push_str(&format!(
            " phases_host_ms=fwd:{:.1}/bwd:{:.1}/opt:{:.1}",
            p[0], p[1], p[2]
        ));
    }
    config.push_str(" memory=cubecl-pool");
    if !r.detail.is_empty() {
        config.push_str(&format!(" detail={}", shorten(&r.detail, 200)));
    }
    let row = |metric: &str, v: [f64; 3]| Row {
        kernel: r.case.model.name().into(),
        provider: r.case.liger.provider().into(),
        mode: "train_step".into(),
        metric: metric.into(),
        x: r.case.seq.to_string(),
        p50: v[0],
        p20: v[1],
        p80: v[2],
        config: config.clone(),
    };
    let Some(o) = out.filter(|o| r.status == Status::Ok && !o.step_ms.is_empty()) else {
        return vec![row("tokens/s", [nan; 3])];
    };
    let t = [0.5, 0.2, 0.8].map(|q| quantile(&o.step_ms, q));
    // The 20th percentile of a rate is at the 80th of the time.
    let tokens = o.tokens as f64;
    let mut rows = vec![
        row(
            "tokens/s",
            [tokens / t[0], tokens / t[2], tokens / t[1]].map(|v| v * 1e3),
        ),
        row("step_ms", t),
    ];
    if let Some(b) = o.peak_reserved {
        rows.push(row("peak_reserved_MiB", [b as f64 / MIB; 3]));
    }
    if let Some(b) = o.peak_in_use {
        rows.push(row("peak_in_use_MiB", [b as f64 / MIB; 3]));
    }
    if let Some(b) = o.peak_device_reserved {
        rows.push(row("peak_device_reserved_MiB", [b as f64 / MIB; 3]));
    }
    if let Some(b) = o.peak_device_used {
        rows.push(row("peak_device_used_MiB", [b as f64 / MIB; 3]));
    }
    if let Some(l) = o.loss {
        rows.push(row("loss", [l; 3]));
    }
    rows
}

/// Every case, one row.
fn render(results: &[CaseResult]) -> String {
    let mut table = Table::new(&[
        ("model", Align::Left),
        ("seq", Align::Right),
        ("batch", Align::Right),
        ("liger", Align::Left),
        ("status", Align::Left),
        ("tokens/s", Align::Right),
        ("step ms p50", Align::Right),
        ("peak MiB", Align::Right),
        ("in use MiB", Align::Right),
        ("note", Align::Left),
    ]);
    for r in results {
        table.row(vec![
            r.case.model.name().into(),
            r.case.seq.to_string(),
            r.case.batch.to_string(),
            r.case.liger.name().into(),
            r.status.name().into(),
            num(r.tokens_per_s(), 0),
            num(r.step_ms(), 1),
            num(r.peak_mib(), 0),
            num(r.in_use_mib(), 0),
            shorten(&r.detail, 80),
        ]);
    }
    table.render()
}

/// Bytes eager attention must keep for the backward, at least: every layer's f32 softmax
/// output and its probabilities in the activation dtype, `[batch, q_heads, seq, seq]` each
/// (Burn's autodiff keeps more: the softmax's input too). `None` for a mode whose attention
/// keeps nothing quadratic.
pub(crate) fn eager_attention_floor(args: &BenchArgs, case: &E2eCase) -> Option<u64> {
    if !eager_attention(args, case.liger) {
        return None;
    }
    let c = case.model.config(args.e2e_layers);
    let scores = (c.num_hidden_layers * case.batch * c.num_attention_heads) as u64
        * (case.seq as u64).pow(2);
    Some(scores * (4 + args.dtype.dtype().size() as u64))
}

/// Marks an `ok` case whose peak memory in use is below [`eager_attention_floor`] as
/// `invalid`. On the H200 with Burn 0.21, Llama-3.2-1B's stock step at 8K and 16K tokens
/// finished with 130 and 117 GB in use where its probabilities alone need 192 and 768 GiB.
fn check_floor(mut r: CaseResult, args: &BenchArgs) -> CaseResult {
    let (Some(floor), Some(in_use)) = (
        eager_attention_floor(args, &r.case),
        r.output.as_ref().and_then(|o| o.peak_in_use),
    ) else {
        return r;
    };
    if r.status == Status::Ok && in_use < floor {
        r.status = Status::Invalid;
        r.detail = format!(
            "{:.1} GiB in use, less than the {:.1} GiB eager attention keeps for the backward \
             (f32 softmax + probabilities of every layer): the step cannot have computed them",
            in_use as f64 / GIB,
            floor as f64 / GIB
        );
    }
    r
}

/// The result of `model` at `seq` in `mode`.
fn find(
    results: &[CaseResult],
    model: E2eModel,
    seq: usize,
    mode: LigerMode,
) -> Option<&CaseResult> {
    results
        .iter()
        .find(|r| r.case.model == model && r.case.seq == seq && r.case.liger == mode)
}

/// Longest sequence each mode fits, on/off ratios per length, and the goals.
fn summary(model: E2eModel, results: &[CaseResult], seqs: &[usize], warmup: usize) -> String {
    let ok = |seq: usize, mode| find(results, model, seq, mode).filter(|r| r.status == Status::Ok);
    let longest = |mode| {
        seqs.iter()
            .copied()
            .filter(|&s| ok(s, mode).is_some())
            .max()
    };
    // The first length where the mode failed (oom, timeout, error): its limit. Without
    // one, the limit lies above the longest length it ran.
    let failure = |mode| {
        seqs.iter().find_map(|&s| {
            find(results, model, s, mode)
                .filter(|r| {
                    matches!(
                        r.status,
                        Status::Oom | Status::Timeout | Status::Error | Status::Invalid
                    )
                })
                .map(|r| (s, r.status))
        })
    };
    let fits = |mode| match (longest(mode), failure(mode)) {
        (None, Some((s, st))) => format!("none ({} at {s})", st.name()),
        (None, None) => "none (not run)".to_string(),
        (Some(l), Some((s, st))) => format!("{l} ({} at {s})", st.name()),
        (Some(l), None) => format!(">= {l} (no failure up to {l}; longer not run)"),
    };
    let mut out = format!(
        "\n{}: longest sequence that fits: liger off {}, liger on {}\n",
        model.name(),
        fits(LigerMode::Off),
        fits(LigerMode::On)
    );
    let mut common = None;
    for &seq in seqs {
        if let (Some(on), Some(off)) = (ok(seq, LigerMode::On), ok(seq, LigerMode::Off)) {
            let tps = on
                .tokens_per_s()
                .zip(off.tokens_per_s())
                .map(|(a, b)| a / b);
            let mem = on.peak_mib().zip(off.peak_mib()).map(|(a, b)| a / b);
            let loss = |r: &CaseResult| r.output.as_ref().and_then(|o| o.loss);
            let phases = |p: Option<&Vec<f64>>| match p {
                Some(p) if p.len() == 3 => format!("{:.0}/{:.0}/{:.0}", p[0], p[1], p[2]),
                _ => "-".into(),
            };
            let wall = |r: &CaseResult| phases(r.output.as_ref().map(|o| &o.phase_ms));
            let host = |r: &CaseResult| phases(r.output.as_ref().map(|o| &o.phase_host_ms));
            out.push_str(&format!(
                "  seq {seq}: memory step forward/backward/optimizer ms: on {} (host queued {}) / off {} (host queued {})\n",
                wall(on),
                host(on),
                wall(off),
                host(off)
            ));
            out.push_str(&format!(
                "  seq {seq}: on/off tokens/s {}x, peak memory {}x; loss after {} AdamW steps: on {} / off {}\n",
                num(tps, 2),
                num(mem, 2),
                on.output.as_ref().map_or(0, |o| o.step_ms.len()) + warmup,
                num(loss(on), 4),
                num(loss(off), 4)
            ));
            common = Some((seq, tps, mem));
        }
    }
    let goal = |met: Option<bool>| match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    match common {
        Some((seq, tps, mem)) => out.push_str(&format!(
            "  goals at seq {seq} (longest both fit): tokens/s >= 1.2x: {} ({}x); peak memory <= 0.5x: {} ({}x)\n",
            goal(tps.map(|r| r >= 1.2)),
            num(tps, 2),
            goal(mem.map(|r| r <= 0.5)),
            num(mem, 2)
        )),
        None => out.push_str("  no length where both modes ran: no ratio\n"),
    }
    let max_ratio = match (longest(LigerMode::On), longest(LigerMode::Off)) {
        _ if failure(LigerMode::Off).is_none() => {
            "not measured (liger off did not fail; add longer --e2e-seq)".to_string()
        }
        (Some(on), Some(off)) => {
            let r = on as f64 / off as f64;
            match failure(LigerMode::On) {
                Some(_) => format!("{} ({r:.2}x)", goal(Some(r >= 2.0))),
                // liger on's own limit is above what ran: the ratio is a lower bound.
                None if r >= 2.0 => format!("met (>= {r:.2}x; liger on did not fail)"),
                None => format!("not measured (>= {r:.2}x; liger on did not fail)"),
            }
        }
        _ => "not measured (a mode fit no length)".into(),
    };
    out.push_str(&format!("  goal max sequence >= 2x: {max_ratio}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_round_trips() {
        for spec in ["llama3.2-1b:16384:1:on", "tiny-qwen3:64:2:off"] {
            let case: E2eCase = spec.parse().unwrap();
            assert_eq!(case.to_string(), spec);
        }
        assert!("llama3.2-1b:1024:1".parse::<E2eCase>().is_err());
        assert!("llama3.2-1b:x:1:on".parse::<E2eCase>().is_err());
        assert!("gpt:1024:1:on".parse::<E2eCase>().is_err());
    }

    #[test]
    fn allocation_failures_are_oom() {
        assert!(e2e_case::is_oom(
            "called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 268435456"
        ));
        assert!(e2e_case::is_oom(
            "An out-of-memory error happened during launch"
        ));
        assert!(e2e_case::is_oom("memory allocation of 1024 bytes failed"));
        assert!(!e2e_case::is_oom("device synchronization failed"));
    }

    fn bench_args(extra: &[&str]) -> BenchArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Bench {
            #[command(flatten)]
            args: BenchArgs,
        }
        let mut argv = vec!["bench", "--e2e", "--dtype", "bf16"];
        argv.extend_from_slice(extra);
        Bench::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn lora_flags_reach_the_case_processes_and_the_csv_config() {
        let case: E2eCase = "tiny-llama:32:1:on".parse().unwrap();
        let plain = bench_args(&[]);
        assert!(e2e_case::lora_config(&plain).is_none());
        assert!(!child_args(&plain, case).iter().any(|a| a.contains("lora")));
        let args = bench_args(&["--e2e-lora-rank", "8", "--e2e-lora-targets", "q,v,lm_head"]);
        let child = child_args(&args, case);
        let at = child.iter().position(|a| a == "--e2e-lora-rank").unwrap();
        assert_eq!(child[at + 1], "8");
        assert_eq!(child[at + 3], "q,v,lm_head");
        let lora = e2e_case::lora_config(&args).unwrap();
        assert_eq!((lora.rank, lora.alpha), (8, 16.0));
        assert_eq!(
            lora.targets,
            [
                liger_models::LoraTarget::Q,
                liger_models::LoraTarget::V,
                liger_models::LoraTarget::LmHead
            ]
        );
    }

    fn ok_case(spec: &str, in_use_gib: f64) -> CaseResult {
        CaseResult {
            case: spec.parse().unwrap(),
            status: Status::Ok,
            detail: String::new(),
            output: Some(CaseOutput {
                peak_in_use: Some((in_use_gib * GIB) as u64),
                ..Default::default()
            }),
            wall_s: 1.0,
        }
    }

    #[test]
    fn optimizer_name_is_the_adamw_config() {
        let c = serde_json::to_value(burn::optim::AdamWConfig::new()).unwrap();
        let f = |k: &str| c[k].as_f64().unwrap() as f32;
        assert_eq!(
            e2e_case::optimizer(e2e_case::DEFAULT_LR),
            format!(
                "adamw:lr={:e}:betas={}/{}:eps={:e}:wd={:e}",
                e2e_case::DEFAULT_LR,
                f("beta_1"),
                f("beta_2"),
                f("epsilon"),
                f("weight_decay")
            )
        );
        // The liger-on mode's fused AdamW has the same defaults.
        let ours = serde_json::to_value(liger_burn::optim::AdamWConfig::new()).unwrap();
        for key in ["beta_1", "beta_2", "epsilon", "weight_decay", "amsgrad"] {
            assert_eq!(ours[key], c[key], "{key}");
        }
    }

    #[test]
    fn csv_rows_are_bench_rows() {
        let args = bench_args(&["--memory-pool", "exact"]);
        let mut r = ok_case("llama3.2-1b:4096:1:on", 12.0);
        let o = r.output.as_mut().unwrap();
        o.tokens = 4096;
        o.step_ms = vec![800.0, 1000.0, 900.0];
        o.peak_reserved = Some(14 << 30);
        o.loss = Some(11.25);
        o.losses = vec![Some(11.5), None, Some(11.25)];
        let rows = csv_rows(&r, &args);
        let metrics: Vec<&str> = rows.iter().map(|r| r.metric.as_str()).collect();
        assert_eq!(
            metrics,
            [
                "tokens/s",
                "step_ms",
                "peak_reserved_MiB",
                "peak_in_use_MiB",
                "loss"
            ]
        );
        for row in &rows {
            assert_eq!(
                (
                    row.kernel.as_str(),
                    row.provider.as_str(),
                    row.mode.as_str()
                ),
                ("llama3.2-1b", "liger-burn", "train_step")
            );
            assert_eq!(row.x, "4096");
            assert!(row.config.starts_with("status=ok batch=1 dtype=bf16"));
            assert!(row.config.contains(" memory_pool=exact"), "{}", row.config);
            assert!(
                row.config
                    .contains(" optimizer_impl=liger-fused optimizer_state=bf16 "),
                "{}",
                row.config
            );
            assert!(row.config.contains(" losses=11.5000/nan/11.2500"));
        }
        // tokens/s from the median step; its 20th percentile from the 80th of the time.
        assert!((rows[0].p50 - 4096.0 / 0.9).abs() < 1e-9);
        assert!((rows[0].p20 - 4096.0 / 0.96).abs() < 1e-9);
        assert!((rows[0].p80 - 4096.0 / 0.84).abs() < 1e-9);
        assert_eq!(rows[2].p50, 14.0 * 1024.0);
        // A case that did not finish: one tokens/s row with empty numbers.
        let mut failed = ok_case("qwen2.5-1.5b:16384:1:off", 0.0);
        failed.status = Status::Oom;
        failed.detail = "can't allocate buffer".into();
        failed.output = None;
        let rows = csv_rows(&failed, &args);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].provider, "burn");
        assert!(rows[0].p50.is_nan());
        assert!(rows[0].config.starts_with("status=oom"));
        assert!(rows[0].config.ends_with("detail=can't allocate buffer"));
    }

    #[test]
    fn eager_steps_below_the_attention_floor_are_invalid() {
        let args = bench_args(&[]);
        // Llama-3.2-1B at 8K: 16 layers x 32 heads x 8192^2 scores x (4 + 2) bytes = 192 GiB.
        let case: E2eCase = "llama3.2-1b:8192:1:off".parse().unwrap();
        assert_eq!(
            eager_attention_floor(&args, &case),
            Some(16 * 32 * 8192 * 8192 * 6)
        );
        // The H200's stock step at 8K: 127 GiB in use.
        let r = check_floor(ok_case("llama3.2-1b:8192:1:off", 127.4), &args);
        assert_eq!(r.status, Status::Invalid);
        assert!(r.detail.contains("192.0 GiB"), "{}", r.detail);
        // At 4K (48 GiB needed) 97 GiB in use is plausible.
        let r = check_floor(ok_case("llama3.2-1b:4096:1:off", 97.0), &args);
        assert_eq!(r.status, Status::Ok);
        // liger-burn's attention keeps nothing quadratic; with it off, the on mode is eager.
        let r = check_floor(ok_case("llama3.2-1b:8192:1:on", 20.0), &args);
        assert_eq!(r.status, Status::Ok);
        let eager_on = bench_args(&["--e2e-liger-attention", "off"]);
        let r = check_floor(ok_case("llama3.2-1b:8192:1:on", 20.0), &eager_on);
        assert_eq!(r.status, Status::Invalid);
    }
}
