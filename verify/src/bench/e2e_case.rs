//! One case of `liger bench --e2e`, run in its own process (the hidden `--e2e-case`
//! argument): build the model, train a few steps, print the measurement as one
//! `E2E_RESULT {json}` line on stdout. A process per case is what lets the parent record
//! an out-of-memory abort or a hang as that case's status and go on, and it starts every
//! case from an empty device pool.
//!
//! What is measured (see also [`super::e2e`]; scripts/device/anchor_e2e.py measures
//! PyTorch the same way):
//! - a training step = `model.loss(ids, labels)` (forward + next-token loss) +
//!   `loss.backward()` + `GradientsParams::from_grads` + an AdamW step (liger-burn's fused
//!   AdamW with liger on, Burn's with liger off; see [`optimizer_impl`]), then a device
//!   synchronization; its wall time, per step.
//! - `--e2e-warmup` untimed steps first (JIT compilation, autotune, pool growth), the
//!   pool emptied before the last of them (a cleanup: pages with no live allocation go back
//!   to the device), so it regrows to what a step needs from a clean pool and the timed
//!   steps do not pay that growth; then `--e2e-steps` timed ones, each timed alone (sync,
//!   clock, step, sync, clock), the pool's usage read after each; then one more step, the
//!   memory step, synchronized and read after the forward + loss (the activations kept for
//!   the backward are alive), after the backward and after the optimizer step.
//! - peak reserved = the largest pool `bytes_reserved` read over the timed steps and the
//!   memory step. No cleanup runs between, and pages are only given back by a cleanup, so
//!   it also covers the transient buffers inside each step: the device memory the steps
//!   held in the pool (parameters, AdamW moments, activations, gradients, fragmentation),
//!   not counting the CUDA context and the runtime's own allocations (PyTorch's
//!   `max_memory_reserved` over the same steps).
//! - peak in use = the largest pool `bytes_in_use` of the same reads (CubeCL keeps no
//!   high-water mark of it: a lower bound of the true peak, read where PyTorch's
//!   `memory_allocated` is read by the anchor).
//! - losses: every step's, read after the last one.

use super::e2e::{E2eCase, LigerMode};
use crate::args::BenchArgs;
use crate::convergence::SplitMix64;
use crate::device::{self, Ctx, DevicePoolUsage, OnDevice, PoolUsage, payload_text};
use anyhow::Result;
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_burn::optim::LowPrecisionUpdate;
use liger_models::{CausalLm, LigerConfig};
use serde::{Deserialize, Serialize};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::Instant;

/// The prefix of the result line on stdout.
pub const RESULT_PREFIX: &str = "E2E_RESULT ";

/// The default AdamW learning rate of the benchmark steps (`--e2e-lr`; irrelevant to the
/// timing; small so the random model stays finite).
pub const DEFAULT_LR: f64 = 1e-5;

/// The optimizer of the steps as the CSV's config names it: `AdamWConfig::new()`'s
/// defaults (Burn's and liger-burn's are the same; tested in `super::e2e`) and learning
/// rate `lr`. The PyTorch anchor trains with the same.
pub fn optimizer(lr: f64) -> String {
    format!("adamw:lr={lr:e}:betas=0.9/0.999:eps=1e-5:wd=1e-4")
}

/// Which AdamW a mode runs, as the CSV's `optimizer_impl` names it: liger-burn's fused
/// step (`liger-fused`) with liger on, Burn's (`burn`) with liger off.
pub fn optimizer_impl(mode: LigerMode) -> &'static str {
    match mode {
        LigerMode::On => "liger-fused",
        LigerMode::Off => "burn",
    }
}

/// Where a mode's AdamW keeps its state, as the CSV's `optimizer_state` names it: the
/// moments' dtype, or `f32-master` (f32 master weights and moments) for the liger-on mode
/// with `--e2e-master-weights on` in f16/bf16.
pub fn optimizer_state(args: &BenchArgs, mode: LigerMode) -> String {
    let low = matches!(args.dtype.dtype(), DType::F16 | DType::BF16);
    if mode == LigerMode::On && args.e2e_master_weights.on() && low {
        "f32-master".into()
    } else {
        args.dtype.to_string()
    }
}

/// The LoRA settings of `--e2e-lora-rank` (alpha 2·rank, no dropout, f32 adapters: the
/// anchor's PEFT configuration), `None` without it. Panics naming the flag on a bad
/// target list or rank 0.
pub fn lora_config(args: &BenchArgs) -> Option<liger_models::LoraConfig> {
    let rank = args.e2e_lora_rank?;
    let targets = liger_models::LoraTarget::parse_list(&args.e2e_lora_targets)
        .unwrap_or_else(|e| panic!("--e2e-lora-targets: {e}"));
    let lora = liger_models::LoraConfig {
        targets,
        ..liger_models::LoraConfig::new(rank, 2.0 * rank as f64)
    };
    lora.validate()
        .unwrap_or_else(|e| panic!("--e2e-lora-rank: {e}"));
    Some(lora)
}

/// The adapter's folder in a `--e2e-save-start` case folder (PEFT's files).
pub const START_ADAPTER: &str = "adapter";
/// The token ids' file in a `--e2e-save-start` case folder: `{"input_ids": [[...], ...]}`,
/// `[batch, seq]`; the labels are the ids.
pub const START_TOKENS: &str = "tokens.json";

/// The folder of `case` under `--e2e-save-start` (`MODEL_BATCHxSEQ`, the name the anchor's
/// `--start` looks for): the model as a Hugging Face checkpoint, its LoRA adapter, and the
/// tokens every step trains on.
pub fn start_dir_name(case: &E2eCase) -> String {
    format!("{}_{}x{}", case.model.name(), case.batch, case.seq)
}

/// What a case process reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CaseOutput {
    /// `ok`, `oom` or `error`.
    pub status: String,
    /// The backend's name (the `gpu` column when `--gpu` is not given).
    pub backend: String,
    /// Parameters of the model.
    pub params: usize,
    /// Tokens per step (batch × seq).
    pub tokens: usize,
    /// Wall time of each timed step, ms.
    pub step_ms: Vec<f64>,
    /// Peak pool bytes reserved over the memory step (None without a CubeCL pool).
    pub peak_reserved: Option<u64>,
    /// Peak pool bytes in use over the memory step.
    pub peak_in_use: Option<u64>,
    /// Peak device memory held by the allocator beneath CubeCL's pool (CUDA's
    /// stream-ordered pool) over the timed steps and the memory step; None elsewhere.
    #[serde(default)]
    pub peak_device_reserved: Option<u64>,
    /// Peak of that allocator's allocations (CubeCL's buffers, free or not), same span.
    #[serde(default)]
    pub peak_device_used: Option<u64>,
    /// Loss of the memory step (a finite number shows the step computed something).
    pub loss: Option<f64>,
    /// Loss of every step: warm-up, timed, memory step (None where it could not be read;
    /// a non-finite loss is written as null by serde_json, so also None).
    #[serde(default)]
    pub losses: Vec<Option<f64>>,
    /// Wall time of the memory step's phases, ms: forward + loss, backward, optimizer
    /// step (each ended by a device synchronization, so each is the phase's whole cost).
    #[serde(default)]
    pub phase_ms: Vec<f64>,
    /// Time of the same phases up to the synchronization that ends each, ms: how long the
    /// bench's thread took to hand the phase's work to Burn (which may still hold some of
    /// it in its fusion stream, and CubeCL's device thread launches it). A phase whose
    /// time here is close to its wall time either waited inside (a read back to the host)
    /// or kept the GPU waiting on this thread.
    #[serde(default)]
    pub phase_host_ms: Vec<f64>,
    /// Why the case failed, first lines.
    pub detail: String,
}

/// Runs the case of `--e2e-case` and prints its result line.
pub fn run(args: BenchArgs, case: E2eCase) -> Result<ExitCode> {
    device::dispatch(args.device, CaseRun { args, case })
}

struct CaseRun {
    args: BenchArgs,
    case: E2eCase,
}

/// Whether a failure message is an allocation failure (CubeCL's `OutOfMemory` launch
/// error and `BufferTooBig` "can't allocate buffer", CUDA's `CUDA_ERROR_OUT_OF_MEMORY`,
/// wgpu's "Out of memory", the allocator's "memory allocation of N bytes failed").
pub fn is_oom(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "out of memory",
        "out-of-memory",
        "outofmemory",
        "can't allocate",
        "cannot allocate",
        "could not allocate",
        "buffertoobig",
        "memory allocation of",
    ]
    .iter()
    .any(|p| t.contains(p))
}

impl OnDevice for CaseRun {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = &self.args;
        let path = args.reduction.paths()[0];
        let _geometry = liger_burn::test_hooks::override_launch_config(
            liger_cubecl_kernels::LaunchConfig::default().with_reduction(path),
        );
        set_matmul_ordering::<B>(&ctx.device, args.e2e_matmul_ordering)?;
        let mut out = CaseOutput {
            backend: B::name(&ctx.device),
            tokens: self.case.batch * self.case.seq,
            ..Default::default()
        };
        let dtype = args.dtype.dtype();
        if !B::supports_dtype(&ctx.device, dtype) {
            out.status = "error".into();
            out.detail = format!("{} not supported on this device", args.dtype);
        } else {
            // The panic hook still prints to stderr, which the parent keeps for the log.
            let result = catch_unwind(AssertUnwindSafe(|| match self.case.liger {
                LigerMode::On => {
                    let liger = LigerConfig {
                        attention: args.e2e_liger_attention.on(),
                        head_grad_accumulation: args.e2e_head_grad.accumulation(),
                        // The ids are drawn on the host inside the vocabulary, as
                        // `liger_train::train` checks its labels there before training.
                        check_targets: false,
                        ..LigerConfig::all()
                    };
                    let optim = liger_burn::optim::AdamWConfig::new()
                        .with_low_precision(if args.e2e_master_weights.on() {
                            LowPrecisionUpdate::MasterWeights
                        } else {
                            LowPrecisionUpdate::Pure
                        })
                        .init::<Liger<Autodiff<B>>, CausalLm<Liger<Autodiff<B>>>>();
                    measure::<Liger<Autodiff<B>>, B, _>(&ctx, args, &self.case, liger, optim)
                }
                LigerMode::Off => {
                    let optim = AdamWConfig::new().init::<Autodiff<B>, CausalLm<Autodiff<B>>>();
                    measure::<Autodiff<B>, B, _>(&ctx, args, &self.case, LigerConfig::none(), optim)
                }
            }));
            match result {
                Ok(m) => {
                    out = CaseOutput {
                        status: "ok".into(),
                        backend: out.backend,
                        tokens: out.tokens,
                        ..m
                    }
                }
                Err(payload) => {
                    let msg = payload_text(payload.as_ref());
                    out.status = if is_oom(&msg) { "oom" } else { "error" }.into();
                    out.detail = msg.lines().take(3).collect::<Vec<_>>().join(" | ");
                }
            }
        }
        println!("{RESULT_PREFIX}{}", serde_json::to_string(&out)?);
        Ok(ExitCode::SUCCESS)
    }
}

/// Peak pool usage over samples.
#[derive(Default)]
struct Peak {
    reserved: u64,
    in_use: u64,
    device: Option<DevicePoolUsage>,
}

impl Peak {
    fn add(&mut self, u: PoolUsage) {
        self.reserved = self.reserved.max(u.reserved);
        self.in_use = self.in_use.max(u.in_use);
        // The device counters are high-water marks already: the last read is the peak.
        if u.device.is_some() {
            self.device = u.device;
        }
    }
}

/// Builds the model on autodiff backend `A` (over `B`) and measures the steps of `optim`.
fn measure<A, B, O>(
    ctx: &Ctx<B>,
    args: &BenchArgs,
    case: &E2eCase,
    liger: LigerConfig,
    mut optim: O,
) -> CaseOutput
where
    B: FusedOps,
    A: AutodiffBackend + FusedOps<Device = B::Device>,
    A::InnerBackend: FusedOps,
    CausalLm<A>: AutodiffModule<A>,
    O: Optimizer<CausalLm<A>, A>,
{
    let config = case.model.config(args.e2e_layers);
    let device = &ctx.device;
    // The same weights in both modes (and every run): the memory step's losses of liger
    // on and off can then be compared (see `super::e2e::summary`).
    A::seed(device, 0xE2E);
    let release = args.memory_pool.releases_in_step();
    let mut model = CausalLm::<A>::init(&config, liger, args.dtype.dtype(), device)
        .with_memory_release_per_layer(release)
        .with_gradient_checkpointing(args.e2e_gradient_checkpointing.on());
    let start = args
        .e2e_save_start
        .as_ref()
        .map(|root| root.join(start_dir_name(case)));
    let saved = |what: &str, r: Result<(), liger_models::ModelError>| {
        r.unwrap_or_else(|e| panic!("--e2e-save-start: writing the {what}: {e}"))
    };
    if let Some(dir) = &start {
        saved("model", model.save(dir));
    }
    if let Some(lora) = lora_config(args) {
        model = model
            .with_lora(&lora)
            .unwrap_or_else(|e| panic!("--e2e-lora-rank: {e}"));
        if let Some(dir) = &start {
            saved("adapter", model.save_adapter(dir.join(START_ADAPTER), None));
        }
    }
    let params = config.num_params();
    // Random token ids (uniform over the vocabulary), labels = ids: every position
    // scored, as in pre-training.
    let mut rng = SplitMix64::new(0xE2E);
    let n = case.batch * case.seq;
    let ids: Vec<i64> = (0..n)
        .map(|_| rng.below(config.vocab_size as u64) as i64)
        .collect();
    if let Some(dir) = &start {
        let rows: Vec<&[i64]> = ids.chunks(case.seq).collect();
        let text = serde_json::json!({ "input_ids": rows }).to_string();
        let path = dir.join(START_TOKENS);
        std::fs::write(&path, text + "\n")
            .unwrap_or_else(|e| panic!("--e2e-save-start: writing {}: {e}", path.display()));
    }
    let ids: Tensor<A, 2, Int> =
        Tensor::from_data(TensorData::new(ids, [case.batch, case.seq]), device);
    let labels = ids.clone();

    let mut step = |model: CausalLm<A>, sample: &mut dyn FnMut()| {
        let loss = model.loss(ids.clone(), labels.clone());
        sample();
        let grads = model.backward(loss.clone());
        sample();
        let model = optim.step(args.e2e_lr, model, grads);
        if release {
            // The gradients and the replaced parameters are free now: back to the device,
            // for the next forward's activations.
            A::memory_cleanup(device);
        }
        (model, loss)
    };

    // Gives the pool's free pages back to the device (after queued work is done), and what
    // the device allocator beneath keeps unused; its high-water marks restart there.
    let empty_pool = || {
        ctx.sync();
        if let Some(cube) = &ctx.cube {
            cube.cleanup();
            ctx.sync();
            cube.trim_device_pool();
        }
    };
    let mut losses = Vec::new();
    for i in 0..args.e2e_warmup {
        if i + 1 == args.e2e_warmup {
            empty_pool();
        }
        let t = Instant::now();
        let (m, loss) = step(model, &mut || {});
        model = m;
        losses.push(loss.inner());
        ctx.sync();
        eprintln!("warmup {i}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    if args.e2e_warmup == 0 {
        empty_pool();
    }
    let mut peak = Peak::default();
    let mut step_ms = Vec::with_capacity(args.e2e_steps);
    for i in 0..args.e2e_steps {
        ctx.sync();
        profiler_range(args, true);
        let t = Instant::now();
        let (m, loss) = step(model, &mut || {});
        model = m;
        ctx.sync();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        profiler_range(args, false);
        losses.push(loss.inner());
        if let Some(cube) = &ctx.cube {
            peak.add(cube.usage());
        }
        eprintln!("step {i}: {ms:.1} ms");
        step_ms.push(ms);
    }

    // The memory step, also timed phase by phase (a synchronization ends each phase).
    ctx.sync();
    let mut marks = vec![Instant::now()];
    let mut queued = Vec::new();
    let mut sample = || {
        queued.push(Instant::now());
        ctx.sync();
        marks.push(Instant::now());
        if let Some(cube) = &ctx.cube {
            peak.add(cube.usage());
        }
    };
    let (model, loss) = step(model, &mut sample);
    sample();
    let phase_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    let phase_host_ms: Vec<f64> = marks
        .iter()
        .zip(&queued)
        .map(|(start, end)| (*end - *start).as_secs_f64() * 1e3)
        .collect();
    eprintln!(
        "memory step phases (forward, backward, optimizer): wall ms {phase_ms:.1?}, host queued ms {phase_host_ms:.1?}"
    );
    losses.push(loss.inner());
    let losses: Vec<Option<f64>> = losses
        .into_iter()
        .map(|l| {
            l.into_data()
                .convert::<f64>()
                .to_vec::<f64>()
                .ok()
                .and_then(|v| v.first().copied())
        })
        .collect();
    let loss = losses.last().copied().flatten();
    drop(model);
    let has_pool = ctx.cube.is_some();
    CaseOutput {
        params,
        step_ms,
        peak_reserved: has_pool.then_some(peak.reserved),
        peak_in_use: has_pool.then_some(peak.in_use),
        peak_device_reserved: peak.device.map(|d| d.reserved_high),
        peak_device_used: peak.device.map(|d| d.used_high),
        loss,
        losses,
        phase_ms,
        phase_host_ms,
        ..Default::default()
    }
}

/// With `--e2e-profile-range on`, starts (`start`) or stops the CUDA driver's profiler
/// range; a driver error is printed and the step goes on unprofiled.
fn profiler_range(args: &BenchArgs, start: bool) {
    if !args.e2e_profile_range.on() {
        return;
    }
    #[cfg(not(feature = "cuda"))]
    let _ = start;
    #[cfg(feature = "cuda")]
    {
        use cudarc::driver::sys;
        // The calls act on this thread's current context: the device's primary one, which
        // CubeCL runs on (device 0: the bench's `--device cuda`).
        if let Err(e) = cudarc::driver::CudaContext::new(0).and_then(|c| c.bind_to_thread()) {
            eprintln!("--e2e-profile-range: binding the CUDA context: {e:?}");
        }
        // SAFETY: both calls take no arguments and only toggle the attached profiler's
        // collection for the current context.
        let result = unsafe {
            if start {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
        if result != sys::CUresult::CUDA_SUCCESS {
            eprintln!(
                "--e2e-profile-range: cuProfiler{} returned {result:?}",
                if start { "Start" } else { "Stop" }
            );
        }
    }
}

/// Applies `--e2e-matmul-ordering` on a CUDA device (nothing elsewhere, or for `auto`).
fn set_matmul_ordering<B: FusedOps>(
    device: &B::Device,
    ordering: crate::args::MatmulOrderingArg,
) -> Result<()> {
    use crate::args::MatmulOrderingArg as Arg;
    #[cfg(feature = "cuda")]
    {
        use liger_burn::cube::cublaslt::{MatmulOrdering, set_ordering};
        let chosen = match ordering {
            Arg::Auto => return Ok(()),
            Arg::CubeclStream => MatmulOrdering::CubeclStream,
            Arg::HostSynchronization => MatmulOrdering::HostSynchronization,
            Arg::ContextEvents => MatmulOrdering::ContextEvents,
            Arg::FlagKernels => MatmulOrdering::FlagKernels,
            Arg::StreamMemoryOperations => MatmulOrdering::StreamMemoryOperations,
        };
        let Some(cuda) = (device as &dyn std::any::Any).downcast_ref::<cubecl::cuda::CudaDevice>()
        else {
            anyhow::bail!(
                "--e2e-matmul-ordering {}: CUDA only (use --device cuda, or leave it auto)",
                chosen.name()
            );
        };
        set_ordering(cuda, Some(chosen))
            .map_err(|why| anyhow::anyhow!("--e2e-matmul-ordering {}: {why}", chosen.name()))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        match ordering {
            Arg::Auto => Ok(()),
            other => {
                anyhow::bail!("--e2e-matmul-ordering {other:?}: CUDA only (this build has no CUDA)")
            }
        }
    }
}
