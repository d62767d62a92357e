//! The command-line arguments of the verification commands (`liger check`, `liger bench`,
//! `liger converge`), shared by the `liger` binary and the runners in this crate.

use crate::bench;
use crate::converge;
use crate::device::DeviceKind;
use crate::dtype::DtypeArg;
use clap::{Args, ValueEnum};

/// `on` / `off`: every switch of the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

impl OnOff {
    /// Whether the switch is on.
    pub fn on(self) -> bool {
        self == OnOff::On
    }
}

/// `--elementwise-geometry`: fields of [`liger_cubecl_kernels::ElementwiseConfig`] to
/// override, and the text they came from (for the CSV's config column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementwiseGeometry {
    /// The flag's value, as given.
    pub text: String,
    units: Option<usize>,
    vectors_per_unit: Option<usize>,
    max_vector: Option<usize>,
    max_cubes: Option<Option<usize>>,
    cubes_per_sm: Option<Option<usize>>,
    hardware_math: Option<bool>,
}

impl ElementwiseGeometry {
    /// Parses `units=N,vectors_per_unit=N,max_vector=N,max_cubes=N|none,
    /// cubes_per_sm=N|none,hardware_math=on|off` (any subset).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut geometry = ElementwiseGeometry {
            text: text.to_string(),
            units: None,
            vectors_per_unit: None,
            max_vector: None,
            max_cubes: None,
            cubes_per_sm: None,
            hardware_math: None,
        };
        for field in text.split(',').filter(|f| !f.is_empty()) {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| format!("`{field}` is not KEY=VALUE"))?;
            let number = || {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{key}: `{value}` is not a positive integer"))
            };
            match key {
                "units" => geometry.units = Some(number()?),
                "vectors_per_unit" => geometry.vectors_per_unit = Some(number()?),
                "max_vector" => geometry.max_vector = Some(number()?),
                "max_cubes" if value == "none" => geometry.max_cubes = Some(None),
                "max_cubes" => geometry.max_cubes = Some(Some(number()?)),
                "cubes_per_sm" if value == "none" => geometry.cubes_per_sm = Some(None),
                "cubes_per_sm" => geometry.cubes_per_sm = Some(Some(number()?)),
                "hardware_math" => {
                    geometry.hardware_math = Some(match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(format!("hardware_math: `{value}` is not on or off")),
                    })
                }
                _ => {
                    return Err(format!(
                        "unknown field `{key}` (units, vectors_per_unit, max_vector, max_cubes, \
                         cubes_per_sm, hardware_math)"
                    ));
                }
            }
        }
        Ok(geometry)
    }

    /// `config` with the fields given.
    pub fn apply(&self, config: &mut liger_cubecl_kernels::ElementwiseConfig) {
        if let Some(units) = self.units {
            config.units = units;
        }
        if let Some(vectors) = self.vectors_per_unit {
            config.vectors_per_unit = vectors;
        }
        if let Some(vector) = self.max_vector {
            config.max_vector = vector;
        }
        if let Some(cubes) = self.max_cubes {
            config.max_cubes = cubes;
        }
        if let Some(cubes) = self.cubes_per_sm {
            config.cubes_per_sm = cubes;
        }
        if let Some(hardware_math) = self.hardware_math {
            config.hardware_math = hardware_math;
        }
    }
}

/// `--hand-off`: [`liger_burn::fusion::HandOff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HandOffArg {
    /// The runtimes' batching.
    Runtime,
    /// Each fused kernel's launch.
    Kernels,
    /// Each fused op as it is queued, and its kernel's launch.
    Operations,
}

impl HandOffArg {
    /// The hand-off `arg` asks for, or liger-burn's default.
    pub fn resolve(arg: Option<Self>) -> liger_burn::fusion::HandOff {
        use liger_burn::fusion::HandOff;
        match arg {
            None => liger_burn::fusion::HAND_OFF,
            Some(HandOffArg::Runtime) => HandOff::Runtime,
            Some(HandOffArg::Kernels) => HandOff::Kernels,
            Some(HandOffArg::Operations) => HandOff::Operations,
        }
    }

    /// The CSV's name of `hand_off`.
    pub fn name(hand_off: liger_burn::fusion::HandOff) -> &'static str {
        use liger_burn::fusion::HandOff;
        match hand_off {
            HandOff::Runtime => "runtime",
            HandOff::Kernels => "kernels",
            HandOff::Operations => "operations",
        }
    }
}

/// The dtype the fused linear cross entropy sums the LM head's weight gradient in over its
/// chunks (`liger_burn::ops::WeightGradAccumulation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HeadGradArg {
    /// The weight's dtype, as Liger-Kernel: no f32 `[vocab, hidden]` accumulator, one
    /// rounding per chunk of tokens.
    WeightDtype,
    /// An f32 accumulator (`4·vocab·hidden` bytes while the loss runs), rounded once at the
    /// end.
    F32,
}

impl HeadGradArg {
    /// The library's option.
    pub fn accumulation(self) -> liger_burn::ops::WeightGradAccumulation {
        match self {
            HeadGradArg::WeightDtype => liger_burn::ops::WeightGradAccumulation::WeightDtype,
            HeadGradArg::F32 => liger_burn::ops::WeightGradAccumulation::F32,
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            HeadGradArg::WeightDtype => "weight-dtype",
            HeadGradArg::F32 => "f32",
        }
    }
}

/// How cuBLASLt's products are ordered against CubeCL's stream on CUDA
/// (`liger_burn::cube::cublaslt::MatmulOrdering`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MatmulOrderingArg {
    /// The device's default (device-side waits where the driver allows them).
    Auto,
    /// The products run on the CUDA stream CubeCL launches the step's kernels on (found
    /// through CUPTI), with nothing around them.
    CubeclStream,
    /// The host synchronizes the two streams around each product (slower; what a profiler
    /// that serializes launches, such as Nsight Compute, needs).
    HostSynchronization,
    /// The driver's context-wide events (CUDA 12.5+) wait on the device; no kernel
    /// takes part.
    ContextEvents,
    /// Liger's flag kernels spin on the device.
    FlagKernels,
    /// The driver's stream memory operations wait on the device.
    StreamMemoryOperations,
}

/// Which cross-unit reduction the kernels use (CubeCL devices only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReductionArg {
    /// Plane (warp/subgroup) operations where the device has them, else shared memory.
    Auto,
    /// Plane operations (shared memory on devices without them).
    Plane,
    /// Shared-memory tree only.
    Shared,
    /// `check` only: the suite twice, plane path then shared-memory path.
    Both,
}

impl ReductionArg {
    /// The kernel paths this choice runs, in order.
    pub fn paths(self) -> Vec<liger_cubecl_kernels::ReductionPath> {
        use liger_cubecl_kernels::ReductionPath as P;
        match self {
            ReductionArg::Auto => vec![P::Auto],
            ReductionArg::Plane => vec![P::Plane],
            ReductionArg::Shared => vec![P::Shared],
            ReductionArg::Both => vec![P::Plane, P::Shared],
        }
    }
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Element type of the inputs and outputs (accumulation is always f32).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Only the ops whose name contains NAME, or the op named NAME alone when written
    /// `=NAME`: e.g. `rms_norm` selects the three RMSNorm variants, `fused_linear` fused
    /// linear cross entropy and every fused post-training loss, `=cross_entropy` the plain
    /// cross entropy alone. All ops when absent; a NAME that selects none lists them.
    #[arg(long, value_name = "NAME")]
    pub op: Option<String>,
    /// Quick sweep (shapes a software rasterizer runs in seconds) instead of the full one.
    #[arg(long)]
    pub quick: bool,
    /// Reduction path of the kernels; `both` runs the suite on the plane path, then on
    /// the shared-memory path. Ignored on ndarray (no kernels).
    #[arg(long, value_enum, default_value_t = ReductionArg::Auto)]
    pub reduction: ReductionArg,
    /// Seed of the random inputs; overrides LIGER_SEED. From the clock when neither is set.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// The elementwise kernels' launch geometry to check under, as `liger bench
    /// --elementwise-geometry` takes it (`units=N,vectors_per_unit=N,max_vector=N,...`):
    /// a geometry is checked here before it becomes a default. The library's when absent.
    #[arg(long, value_name = "FIELDS", value_parser = ElementwiseGeometry::parse)]
    pub elementwise_geometry: Option<ElementwiseGeometry>,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Element type of inputs, outputs and weights (accumulation is always f32).
    #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
    pub dtype: DtypeArg,
    /// Ops to benchmark (comma list or repeated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub op: Vec<bench::BenchOp>,
    /// Shapes (comma list or repeated), sizes joined by `x` and read per op: norms,
    /// softmax, log_softmax, swiglu, geglu `ROWSxWIDTH` (leading dims multiply into rows,
    /// e.g. 4x2048x4096); rope `BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM`; cross_entropy `NxV`;
    /// fused_linear_cross_entropy `NxHxV`; matmul `MxKxN`. Every shape is run for every selected op, so
    /// pick ops of one form with it. Default per op: norms 8192x4096, softmax and
    /// log_softmax 8192x32768, rope 4x2048x32x8x128, swiglu and geglu 8192x14336,
    /// cross_entropy 8192x128256, fused_linear_cross_entropy 8192x4096x128256.
    #[arg(long, value_delimiter = ',', value_name = "SHAPE")]
    pub shape: Vec<bench::Shape>,
    /// Untimed iterations before the samples (JIT compilation and autotune out of the numbers).
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Iterations per timed sample (the sample is their mean).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Timed samples; p50, p20 and p80 are taken over them.
    #[arg(long, default_value_t = 10)]
    pub repeats: usize,
    /// Append one row per measurement to this CSV file (header written when it is created).
    #[arg(long, value_name = "PATH")]
    pub csv: Option<std::path::PathBuf>,
    /// `gpu` column of the CSV. Default: the backend's name.
    #[arg(long, value_name = "NAME", env = "LIGER_GPU_NAME")]
    pub gpu: Option<String>,
    /// `commit` column of the CSV. Default: the git commit this binary was built from.
    #[arg(long, value_name = "HASH", env = "LIGER_COMMIT")]
    pub commit: Option<String>,
    /// Size of the copy that measures the bandwidth ceiling (`x + 1` on a tensor of this
    /// many MiB: reads and writes it once). Capped at the device's largest allocation.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub copy_mib: u64,
    /// Outputs and gradients of up to this many GiB are held (at least one iteration's);
    /// when that many are pending the timing loop hands the queued work to the device,
    /// without waiting for it, and releases them, as the PyTorch anchors release theirs.
    /// The device is synchronized only around each sample. The `hold` CSV column records
    /// the count.
    #[arg(long, default_value_t = 4, value_name = "GIB")]
    pub hold_gib: usize,
    /// Reduction path of the fused kernels.
    #[arg(long, value_enum, default_value_t = ReductionArg::Auto)]
    pub reduction: ReductionArg,
    /// Units per multiprocessor of the norms' backward kernels (`LaunchConfig::
    /// backward_units_per_sm`; default: the device table's), to sweep it; the CSV config
    /// records a value given here.
    #[arg(long, value_name = "N")]
    pub backward_units_per_sm: Option<usize>,
    /// Cubes per multiprocessor of the cross-entropy kernels (`LaunchConfig::
    /// cross_entropy_cubes_per_sm`; default: one cube per row), to sweep it; the CSV config
    /// records a value given here.
    #[arg(long, value_name = "N")]
    pub cross_entropy_cubes_per_sm: Option<usize>,
    /// Geometry of the elementwise kernels (SwiGLU, GeGLU, GELU, sigmoid:
    /// `LaunchConfig::elementwise`), to sweep it: comma-separated `units=N`,
    /// `vectors_per_unit=N`, `max_vector=N`, `max_cubes=N|none` (`none`: one block per
    /// cube), `cubes_per_sm=N|none` (a persistent grid of N cubes per multiprocessor) and
    /// `hardware_math=on|off` (f16/bf16 activations on CUDA/HIP with the hardware `exp`
    /// and reciprocal, or the accurate ones, the default); fields left out keep the
    /// default. The CSV config records a value given here.
    #[arg(long, value_name = "FIELDS", value_parser = ElementwiseGeometry::parse)]
    pub elementwise_geometry: Option<ElementwiseGeometry>,
    /// cross_entropy / fused_linear_cross_entropy (liger): validate the targets before the
    /// kernel (`CrossEntropyOptions::check_targets`, on by default: one device-to-host read
    /// per call). `off` measures what that check costs; the CSV config says which ran.
    #[arg(long, value_enum, default_value_t = OnOff::On, value_name = "on|off")]
    pub check_targets: OnOff,
    /// fused_linear_cross_entropy (liger): the dtype the weight gradient is summed in over
    /// the chunks (`CrossEntropyOptions::weight_grad_accumulation`): `f32` (the library's
    /// default; an f32 `[vocab, hidden]` accumulator while the loss runs) or `weight-dtype`
    /// (Liger-Kernel's, and `liger train`'s default). The CSV config says when it was
    /// `weight-dtype`.
    #[arg(
        long,
        value_enum,
        default_value = "f32",
        value_name = "f32|weight-dtype"
    )]
    pub head_grad: HeadGradArg,
    /// Single ops: `on` submits each timed iteration's queued work at its end
    /// (`FusedOps::submit_queued`, both providers), as the stream of other operations in a
    /// training step keeps the queues moving; the host then pays a blocking hand-off per
    /// iteration. `off` (default) leaves it to Burn's fusion stream and CubeCL 0.10, which
    /// hand queued tasks to their device threads 32 at a time or at a synchronization, as
    /// a user's loop of one op gets them. The CSV config says which ran.
    #[arg(long, value_enum, default_value_t = OnOff::Off, value_name = "on|off")]
    pub submit_each_iteration: OnOff,
    /// When fused ops on a fusion backend, and vendor products queued on CubeCL's device
    /// thread (cuBLASLt), hand queued work to the device's threads
    /// (`liger_burn::fusion::HandOff`): `runtime` leaves it to the runtimes' batching of
    /// 32 tasks, `kernels` hands on each fused kernel's launch and each vendor product,
    /// `operations` also each fused op as it is queued. Default: liger-burn's
    /// (`liger_burn::fusion::HAND_OFF`).
    /// For single ops and the liger-on e2e steps alike; the CSV config says which ran.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub hand_off: Option<HandOffArg>,
    /// End-to-end training steps instead of single ops: for each --e2e-models model
    /// (random weights), each --e2e-seq length and liger off / on, time
    /// forward + loss + backward + AdamW step (synchronized) and read the peak pool memory;
    /// print tokens/s, step time (p50), peak memory, the longest sequence each mode fits
    /// and the on/off ratios. Each case runs in a child process of this binary, so an
    /// out-of-memory abort or a hang is recorded (oom / error / timeout) and the run goes
    /// on; once a mode fails at a length, its longer lengths are skipped. With --csv, rows
    /// in the bench layout: kernel = model, provider = liger-burn (on) or burn (off), mode
    /// = train_step, x = seq, metrics tokens/s, step_ms, peak_reserved_MiB,
    /// peak_in_use_MiB, loss, and status=... first in config; the same rows as the PyTorch
    /// anchor scripts/device/anchor_e2e.py writes (providers torch, torch+liger-kernel).
    /// Uses --device, --dtype (bf16 by default; f32 on lavapipe), --reduction, --csv,
    /// --gpu, --commit, --memory-pool; ignores --op, --shape and the op timing flags.
    #[arg(long)]
    pub e2e: bool,
    /// liger-burn's attention instead of the ops: the flash kernels against the blockwise
    /// composition (see --attention-provider), causal, for each --attention-shape;
    /// forward, backward and full ms, TFLOP/s (FlashAttention's FLOP count) and memory,
    /// the op CSV layout (kernel `attention`). Uses --device, --dtype, --warmup, --iters
    /// (the most per sample; fewer at long sequences), --repeats, --csv, --gpu, --commit.
    #[arg(long)]
    pub attention: bool,
    /// --attention: shapes `BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM` (comma list). Default:
    /// 32/8 heads at head_dim 64, 16/2 and 12/2 at 128, batch 1 at 1K-32K tokens and batch
    /// 4 at 1K and 4K.
    #[arg(long, value_delimiter = ',', value_name = "SHAPE")]
    pub attention_shape: Vec<bench::attention::AttentionShape>,
    /// --attention: implementations to run (comma list), in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "auto,flash,blockwise",
        value_name = "PROVIDER"
    )]
    pub attention_provider: Vec<bench::attention::AttentionProvider>,
    /// --e2e: models, comma list: llama3.2-1b, qwen2.5-1.5b (the 1B-class shapes),
    /// llama3-8b (with --e2e-lora-rank: an 8B model's weights in bf16 are 15 GiB, its full
    /// fine-tuning state does not fit one GPU), tiny-llama, tiny-qwen3 (tiny models for a
    /// CPU check of the harness).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "llama3.2-1b,qwen2.5-1.5b",
        value_name = "MODEL"
    )]
    pub e2e_models: Vec<bench::e2e::E2eModel>,
    /// --e2e: sequence lengths (tokens per sequence), comma list, run in ascending order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,2048,4096,8192,16384",
        value_name = "SEQ"
    )]
    pub e2e_seq: Vec<usize>,
    /// --e2e: which modes run, comma list: `off` (stock Burn), `on` (liger-burn). Leave
    /// out `off` when the comparison is with PyTorch's anchor (scripts/device/anchor.sh).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "off,on",
        value_name = "on|off"
    )]
    pub e2e_modes: Vec<OnOff>,
    /// --e2e: sequences per step (the same for every length).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub e2e_batch: usize,
    /// --e2e: untimed steps first in each case (JIT compilation, autotune, pool growth).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub e2e_warmup: usize,
    /// --e2e: timed steps per case (tokens/s and step time from their median); one more
    /// step after them reads the memory.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub e2e_steps: usize,
    /// --e2e: AdamW's learning rate (the PyTorch anchor's --lr). The default is small so a
    /// random model stays finite over a timing run; a loss comparison (--e2e-save-start)
    /// wants one at which the steps visibly learn, e.g. 1e-4 for LoRA.
    #[arg(long, default_value_t = bench::e2e_case::DEFAULT_LR, value_name = "LR")]
    pub e2e_lr: f64,
    /// --e2e: write each case's starting point under DIR/MODEL_BATCHxSEQ: the random model
    /// as a Hugging Face checkpoint, its LoRA adapter as PEFT's files (adapter/), and the
    /// token ids every step trains on (tokens.json). The PyTorch anchor's --start DIR then
    /// trains from the same point, so the two runs' per-step losses (the CSV's losses=)
    /// can be compared step by step (scripts/compare_losses.py).
    #[arg(long, value_name = "DIR")]
    pub e2e_save_start: Option<std::path::PathBuf>,
    /// --e2e: seconds a case may take, model building and warmup included, before its
    /// process is killed and the case recorded as `timeout`.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub e2e_timeout: u64,
    /// --e2e: seconds for the whole run: no case starts once less than 30 s of it is
    /// left (those cases are recorded as `skipped`), and a case's time limit is cut to
    /// what is left, so the table and summary still print within an outer time limit.
    /// Unlimited when absent.
    #[arg(long, value_name = "SECONDS")]
    pub e2e_budget: Option<u64>,
    /// --e2e: decoder layers of every model instead of the preset's (e.g. to fit a time
    /// limit; the per-layer shapes are kept).
    #[arg(long, value_name = "N")]
    pub e2e_layers: Option<usize>,
    /// --e2e: the attention of the liger-on mode: `on` = liger-burn's attention, which
    /// recomputes its probabilities in the backward (memory linear in the sequence); `off`
    /// = eager attention as in the off mode, so that the two modes differ only in the fused
    /// kernels. The off mode is always eager (stock Burn).
    #[arg(long, value_enum, default_value = "on", value_name = "on|off")]
    pub e2e_liger_attention: OnOff,
    /// --e2e: the liger-on mode's AdamW (liger-burn's fused step) keeps f32 master weights
    /// and f32 moments (mixed precision, `liger train`'s default) instead of moments in
    /// --dtype, the state of the off mode's Burn AdamW and of PyTorch's. No effect in f32.
    #[arg(long, value_enum, default_value = "off", value_name = "on|off")]
    pub e2e_master_weights: OnOff,
    /// --e2e: the dtype the liger-on mode's fused linear cross entropy sums the LM head's
    /// weight gradient in over its chunks of tokens: `weight-dtype` (the models' default,
    /// Liger-Kernel's: one rounding per chunk, no f32 `[vocab, hidden]` accumulator) or
    /// `f32` (one rounding in all).
    #[arg(
        long,
        value_enum,
        default_value = "weight-dtype",
        value_name = "weight-dtype|f32"
    )]
    pub e2e_head_grad: HeadGradArg,
    /// --e2e on CUDA: how cuBLASLt's products are ordered against CubeCL's stream; `auto`
    /// is the device's default (context events where the driver has them);
    /// `host-synchronization` runs under any profiler (Nsight Compute's serialized
    /// launches never release the flag protocols' waits).
    #[arg(long, value_enum, default_value = "auto", value_name = "ORDERING")]
    pub e2e_matmul_ordering: MatmulOrderingArg,
    /// --e2e on CUDA: the timed steps inside the driver's profiler range
    /// (cuProfilerStart/Stop), so `ncu --profile-from-start off` records their kernels and
    /// nothing of the model's initialization or the other steps.
    #[arg(long, value_enum, default_value = "off", value_name = "on|off")]
    pub e2e_profile_range: OnOff,
    /// --e2e: both modes with gradient checkpointing, as `liger train
    /// --gradient-checkpointing` (each decoder layer recomputed in the backward).
    #[arg(long, value_enum, default_value = "off", value_name = "on|off")]
    pub e2e_gradient_checkpointing: OnOff,
    /// --e2e: LoRA fine-tuning steps instead of full fine-tuning: every model frozen with
    /// rank-N adapters (alpha 2N, no dropout, f32, PEFT's initialization) on
    /// --e2e-lora-targets; only the adapters get gradients and AdamW state. Both modes: the
    /// liger-on mode through liger-burn's LoRA op (and the LM head's adapter, if any,
    /// inside the fused linear cross entropy), the off mode through the stock composition.
    /// The PyTorch anchor's counterpart: scripts/device/anchor_e2e.py --lora-rank N (PEFT).
    #[arg(long, value_name = "N")]
    pub e2e_lora_rank: Option<usize>,
    /// --e2e with --e2e-lora-rank: the adapted projections, comma list (q, k, v, o, gate,
    /// up, down, lm_head, all-linear).
    #[arg(long, default_value = "all-linear", value_name = "LIST")]
    pub e2e_lora_targets: String,
    /// Time one AdamW step over a model's parameters instead of ops: liger-burn's fused
    /// AdamW (moments in --dtype; and, for f16/bf16, with f32 master weights) against Burn's
    /// AdamW, over the parameter sizes of each --e2e-models model (with --e2e-layers), or
    /// one parameter per --shape when given. Per step: ms, and GB/s of the minimal bytes
    /// (parameter, gradient and moments read once, parameter and moments written once)
    /// against the measured copy. Uses --warmup, --iters (steps per sample), --repeats,
    /// --csv (kernel adamw_step, mode optimizer, x = model or shapes).
    #[arg(long)]
    pub optimizer_step: bool,
    /// CubeCL's device memory pool in this process (and, with --e2e, in every case's):
    /// `default` = CubeCL's own pools (on CUDA, slices of pages of device memory / 4^k,
    /// kept until a cleanup); `exact` = every allocation exactly sized and reused by the
    /// same size only (CubeCL's persistent pool, enforced), meant for fixed shapes;
    /// `release` = `exact`, the free buffers handed back to the device at each decoder
    /// layer of the backward and after each optimizer step (--e2e), so memory one size
    /// frees serves another (on CUDA through its stream-ordered pool, set to keep it);
    /// `auto` = `release` on CUDA, `default` elsewhere (what `liger train` uses). Set
    /// through CubeCL's runtime configuration before the device is created (other
    /// cubecl.toml settings are kept).
    #[arg(long, value_enum, default_value_t = crate::pool::MemoryPool::Default, value_name = "POOL")]
    pub memory_pool: crate::pool::MemoryPool,
    /// Internal: run one --e2e case (MODEL:SEQ:BATCH:on|off) in this process and print
    /// its result line.
    #[arg(long, hide = true, value_name = "CASE")]
    pub e2e_case: Option<String>,
}

#[derive(Args, Debug)]
pub struct ConvergeArgs {
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Dtype of the parameters and activations. Default tolerances: f32 = Liger-Kernel's
    /// f32 ones (loss atol 1e-8 rtol 2e-5, parameters atol 5e-3 rtol 1e-5); bf16 and f16 =
    /// its bf16 ones (loss atol 1e-3 rtol 1e-2, parameters atol 1e-2 rtol 1e-2). Note: on
    /// CUDA, Burn runs f32 matmuls in TF32, where the fused linear cross entropy's chunked
    /// matmuls and the stock full one round differently; widen with the flags below if
    /// f32 there differs by ~1e-3.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Mini models to train (comma list): llama, qwen2, qwen3, mistral.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "llama,qwen3",
        value_name = "MODEL"
    )]
    pub models: Vec<converge::MiniModel>,
    /// AdamW steps per run (one batch each; 4 distinct batches, cycled). The loss must
    /// fall by 0.5 from the first pass over the batches to the last (32 steps at the
    /// default lr do, with a margin; 8 do not).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub steps: usize,
    /// AdamW learning rate (constant; weight decay 0.01).
    #[arg(long, default_value_t = 2e-3, value_name = "LR")]
    pub lr: f64,
    /// Seed of the initial parameters (drawn on the host, the same on every device) and
    /// of the token batches.
    #[arg(long, default_value_t = 42, value_name = "N")]
    pub seed: u64,
    /// Reduction path of liger's kernels in the `on` run (`both`: plane). Running the same
    /// comparison on both paths shows how much of the on/off difference is summation order.
    #[arg(long, value_enum, default_value_t = ReductionArg::Auto)]
    pub reduction: ReductionArg,
    /// Also train the stock path a second time with each batch's sequences in reverse
    /// order: the same loss and gradients mathematically, summed in another order. Its
    /// differences from the first stock run are the stock path's own rounding noise,
    /// printed beside liger's. A parameter tensor with elements outside tolerance then
    /// still agrees when liger's largest difference there is no larger than the control's
    /// (the stock path differs from itself by as much); losses are never excused. Needs
    /// --batch-size 2 or more.
    #[arg(long)]
    pub control: bool,
    /// Like --control, but the second stock run starts with every parameter one unit in
    /// the last place (of --dtype) away from the usual start, up or down at random, and
    /// sums in the usual order: how far a rounding-sized difference alone carries two
    /// stock runs apart over the steps.
    #[arg(long)]
    pub control_jitter: bool,
    /// bf16/f16: also train the stock path in f32 from exactly the same (rounded) start,
    /// and set both low-precision runs against it where they disagree. A parameter tensor
    /// with elements outside tolerance then still agrees when, at those elements, liger's
    /// run is no farther from the f32 run than the stock run is (the stock path's own
    /// rounding is the larger error there); losses are never excused. Decides the verdict
    /// when given (over --control).
    #[arg(long)]
    pub f32_reference: bool,
    /// bf16/f16: compute every batch's gradients with liger on and off in the run's dtype
    /// and with the stock path in f32, at the start and at liger off's final parameters,
    /// and print each parameter's normwise gradient error against f32, pooled over the
    /// batches (the output projection's rows of tokens no batch shows, whose gradient is
    /// made of near-zero probabilities, apart). Liger's gradients fail where their error
    /// exceeds max(1.5 x stock's, 2u), u the dtype's unit roundoff: a bias in a fused
    /// gradient shows here before any optimizer step, and the same gradients with one
    /// kernel switch at a time then say which kernel it comes from. Decides the verdict
    /// when given (over --f32-reference and --control): with --control-jitter, parameter
    /// tensors out of tolerance are excused only when every gradient passed at both points
    /// and their difference is no larger than the jitter control's on the same tensor
    /// (stock's own drift from a start one rounding away); without it the parameters are
    /// not judged and only the losses and the gradients decide (the report says so).
    /// Losses are never excused.
    #[arg(long)]
    pub gradient_check: bool,
    /// Sequences per batch.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub batch_size: usize,
    /// Tokens per sequence (the first 6 of each are a masked prompt).
    #[arg(long, default_value_t = 48, value_name = "N")]
    pub seq_len: usize,
    /// Loss tolerance, absolute (default: the dtype's).
    #[arg(long, value_name = "X")]
    pub loss_atol: Option<f64>,
    /// Loss tolerance, relative to the liger-off loss (default: the dtype's).
    #[arg(long, value_name = "X")]
    pub loss_rtol: Option<f64>,
    /// Final-parameter tolerance per element, absolute (default: the dtype's).
    #[arg(long, value_name = "X")]
    pub param_atol: Option<f64>,
    /// Final-parameter tolerance per element, relative (default: the dtype's).
    #[arg(long, value_name = "X")]
    pub param_rtol: Option<f64>,
}
