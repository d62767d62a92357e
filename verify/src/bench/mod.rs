//! `liger bench`: the fused ops (provider `liger`, `liger_burn::functional`) against the
//! stock Burn path (provider `burn`: `burn::nn::RmsNorm`, `burn::nn::LayerNorm`,
//! `burn::tensor::activation::{softmax, log_softmax}`), on the same backend `B`, the
//! same shapes and inputs, in the same run. The stock path runs on plain `B` /
//! `Autodiff<B>`, never on `liger_burn::Liger<..>` (which would route it to the kernels).
//!
//! Modes:
//! - `forward`: inner backend `B`, no autodiff, inputs without gradient.
//! - `full`: forward + backward on `Autodiff<B>`: inputs and weights require grad,
//!   the backward starts from gradients of the outputs made once per input set, as the
//!   PyTorch anchor's `grad_outputs` (see [`upstream`]); a scalar loss from Burn's seed.
//! - `backward`: derived, full − forward: quantiles of the differences of every pair of
//!   full and forward samples.
//!
//! Metrics: `ms` (per iteration), `MB` (growth of the CubeCL pool's `bytes_reserved`
//! over one iteration after a cleanup, outputs and gradients still alive: the peak pool
//! growth; MiB), `GB/s` (the op's minimal bytes, see [`bytes`], over the time; 1e9 B/s).
//! A `copy` row gives the measured bandwidth ceiling of the same run (see [`crate::ceiling`]).
//!
//! Inputs rotate among several sets (at least two, more for small shapes so that a
//! rotation is several times an L2 cache), so consecutive iterations never share an
//! input: repeated runs would otherwise measure the cache, and Burn's fusion could fuse
//! the shared reads of consecutive iterations into one kernel.
//!
//! `--e2e` benchmarks whole training steps of 1B-class models instead: see [`e2e`];
//! `--op matmul` the models' matrix products: see [`matmul`].
//! `--optimizer-step` one AdamW step over a model's parameters: see [`optimizer`].

pub mod attention;
pub mod e2e;
pub(crate) mod e2e_case;
mod matmul;
mod ops;
mod optimizer;
mod upstream;

pub use ops::{BenchOp, Shape};

use crate::args::{BenchArgs, HandOffArg};
use crate::ceiling::CopySpec;
use crate::csv::{self, Row, RunInfo};
use crate::device::{self, Ctx, OnDevice, PoolUsage};
use crate::dtype::DtypeArg;
use crate::measure::{self, Samples, Timing};
use crate::table::{Align, Table, num};
use anyhow::{Result, bail};
use burn::backend::Autodiff;
use indicatif::{ProgressBar, ProgressStyle};
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::override_launch_config;
use liger_cubecl_kernels::LaunchConfig;
use ops::{Inputs, Mode, Provider, Stock, apply, bytes, differentiated, elements, flops};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// Input rotation: at least this many bytes of inputs per rotation (several times the
/// L2 of current GPUs: 50 MB on an H100/H200).
const ROTATION_BYTES: usize = 256 << 20;
/// At most this many input sets.
const MAX_SETS: usize = 16;

/// Runs `liger bench`.
pub fn run(mut args: BenchArgs) -> Result<ExitCode> {
    // A concrete pool, which the rows name and the e2e cases' processes are given.
    args.memory_pool = args.memory_pool.resolve(args.device);
    crate::pool::configure(args.memory_pool)?;
    // Fused ops register on this thread (single ops and e2e cases alike).
    let _hand_off = liger_burn::test_hooks::override_hand_off(HandOffArg::resolve(args.hand_off));
    if args.optimizer_step {
        return optimizer::run(args);
    }
    if args.e2e || args.e2e_case.is_some() {
        return e2e::run(args);
    }
    if args.attention {
        return attention::run(args);
    }
    if args.reduction == crate::args::ReductionArg::Both {
        bail!("--reduction both is for `liger check`; bench takes auto, plane or shared");
    }
    ops::set_check_targets(args.check_targets.on());
    ops::set_head_grad(args.head_grad.accumulation());
    ops::set_backward_units_per_sm(args.backward_units_per_sm);
    ops::set_cross_entropy_cubes_per_sm(args.cross_entropy_cubes_per_sm);
    ops::set_elementwise_geometry(
        args.elementwise_geometry
            .as_ref()
            .map(|g| g.text.replace(',', ";")),
    );
    if args.iters == 0 || args.repeats == 0 {
        bail!("--iters and --repeats must be at least 1");
    }
    if args.op.contains(&BenchOp::Matmul) {
        if args.op.len() > 1 {
            bail!("--op matmul runs on its own (its shapes are MxKxN); drop the other ops");
        }
        return device::dispatch(args.device, matmul::MatmulBench(args));
    }
    device::dispatch(args.device, Bench(args))
}

struct Bench(BenchArgs);

/// Pool growth over one iteration, bytes.
#[derive(Clone, Copy, Debug)]
struct MemGrowth {
    reserved: i64,
    in_use: i64,
}

/// One provider in one mode.
#[derive(Clone, Debug)]
struct Measured {
    samples: Samples,
    /// The host's seconds per iteration inside the iterations ([`measure::Timed::host`]).
    host: Samples,
    mem: Option<MemGrowth>,
    /// liger-cubecl-kernels launches per iteration (from its launch counters): proves
    /// which path ran (the stock provider must show 0; the fused one on a CubeCL device > 0).
    launches: f64,
}

/// Fused-kernel launches so far (every counted kernel).
fn fused_launches() -> u64 {
    use liger_cubecl_kernels::counters::{Kernel, get};
    Kernel::ALL.iter().map(|&k| get(k)).sum()
}

/// Both measured modes of one provider (or the panic that stopped it).
#[derive(Clone, Debug)]
struct ProviderResult {
    forward: Result<Measured, String>,
    full: Result<Measured, String>,
}

/// Times `step` and measures one iteration's pool growth.
fn measure_step<B: FusedOps, H>(
    ctx: &Ctx<B>,
    timing: Timing,
    hold: usize,
    submit: bool,
    mut step: impl FnMut(usize) -> H,
) -> Measured {
    let sync = || ctx.sync();
    // The submission is host work of the iteration: the host column includes it.
    let mut step = |i| {
        let held = step(i);
        if submit {
            B::submit_queued(&ctx.device);
        }
        held
    };
    let launches_before = fused_launches();
    let measure::Timed {
        wall: samples,
        host,
    } = measure::time(
        timing,
        hold,
        &sync,
        &|| B::submit_queued(&ctx.device),
        &mut step,
    );
    ctx.sync();
    let iterations = timing.warmup + timing.iters.max(1) * timing.repeats.max(1);
    let launches = (fused_launches() - launches_before) as f64 / iterations as f64;
    let mem = ctx.cube.as_ref().map(|cube| {
        ctx.sync();
        cube.cleanup();
        ctx.sync();
        let before: PoolUsage = cube.usage();
        let held = step(0);
        ctx.sync();
        let after = cube.usage();
        drop(held);
        MemGrowth {
            reserved: after.reserved as i64 - before.reserved as i64,
            in_use: after.in_use as i64 - before.in_use as i64,
        }
    });
    Measured {
        samples,
        host,
        mem,
        launches,
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    device::payload_text(p.as_ref())
}

/// Everything measured for one op and shape.
struct Group {
    op: BenchOp,
    shape: Shape,
    sets: usize,
    hold_fwd: usize,
    hold_full: usize,
    liger: ProviderResult,
    burn: ProviderResult,
}

impl OnDevice for Bench {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = self.0;
        let dtype = args.dtype.dtype();
        let e = args.dtype.size();
        let path = args.reduction.paths()[0];
        let mut geometry = LaunchConfig::default().with_reduction(path);
        if let Some(units) = args.backward_units_per_sm {
            geometry.backward_units_per_sm = units.max(1);
        }
        if let Some(cubes) = args.cross_entropy_cubes_per_sm {
            geometry.cross_entropy_cubes_per_sm = Some(cubes.max(1));
        }
        if let Some(elementwise) = &args.elementwise_geometry {
            elementwise.apply(&mut geometry.elementwise);
        }
        let _geometry = override_launch_config(geometry);
        ctx.describe(Some(path));
        if let Some(code) =
            crate::device::require_dtype::<B>(&ctx.device, dtype, args.dtype, "benchmark", "")
        {
            return Ok(code);
        }
        let autotune = cfg!(feature = "autotune");
        println!(
            "timing:    warmup {} + {} samples x {} iterations; p50 [p20, p80] over samples",
            args.warmup, args.repeats, args.iters
        );
        if !autotune && ctx.cube.is_some() {
            println!(
                "WARNING:   Burn autotune is off in this build: stock Burn reductions use a fixed \
                 default strategy, not what a default `burn` dependency runs (on an H200, bf16, \
                 the stock path measured 1.3-5x slower without it). For numbers to publish, \
                 build with `--features autotune` (config column says autotune=on/off)."
            );
        }

        let mut ops: Vec<BenchOp> = Vec::new();
        for &op in &args.op {
            let expand: &[BenchOp] = if op == BenchOp::All {
                &BenchOp::EACH
            } else {
                std::slice::from_ref(&op)
            };
            for &o in expand {
                if !ops.contains(&o) {
                    ops.push(o);
                }
            }
        }
        let mut plan: Vec<(BenchOp, Shape)> = Vec::new();
        for &op in &ops {
            if args.shape.is_empty() {
                plan.push((op, op.default_shape()));
            } else {
                for s in &args.shape {
                    if !op.accepts(s) {
                        bail!(
                            "--shape {}: {} takes {}",
                            s.label(),
                            op.name(),
                            op.shape_form()
                        );
                    }
                    plan.push((op, s.clone()));
                }
            }
        }

        let timing = Timing {
            warmup: args.warmup,
            iters: args.iters,
            repeats: args.repeats,
        };
        let pb = ProgressBar::new((plan.len() * 4 + 1) as u64);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len}  {msg}",
            )
            .expect("progress template"),
        );

        // The ceiling first: the copy.
        pb.set_message(format!("copy {} MiB", args.copy_mib));
        let copy_spec = CopySpec {
            dtype,
            elem_size: e,
            bytes: args.copy_mib << 20,
            inputs: 1,
            max_alloc: ctx.cube.as_ref().map(|c| c.max_alloc),
            timing,
        };
        let copy = catch_unwind(AssertUnwindSafe(|| (ctx.copy)(&copy_spec))).map_err(panic_message);
        if let Some(cube) = &ctx.cube {
            cube.cleanup();
        }
        // The two-input ceiling (`x + y`), for the gated units' forward, which reads two
        // tensors per one it writes.
        let add_spec = CopySpec {
            inputs: 2,
            ..copy_spec
        };
        let add = catch_unwind(AssertUnwindSafe(|| (ctx.copy)(&add_spec))).map_err(panic_message);
        pb.inc(1);
        if let Some(cube) = &ctx.cube {
            cube.cleanup();
        }

        let notes = Notes {
            dtype: args.dtype,
            timing,
            autotune,
            path: format!("{path:?}").to_lowercase(),
            submit: args.submit_each_iteration.on(),
            hand_off: HandOffArg::resolve(args.hand_off),
            memory_pool: args.memory_pool,
        };
        let run = RunInfo {
            gpu: args.gpu.clone().unwrap_or_else(|| B::name(&ctx.device)),
            commit: args
                .commit
                .clone()
                .unwrap_or_else(|| env!("LIGER_BUILD_COMMIT").to_string()),
            date: csv::utc_date(),
        };
        // Rows are appended as each group finishes, so a later group that brings the
        // process down (an allocation the driver refuses) keeps the earlier ones.
        let mut rows = Vec::new();
        let ceiling = copy_rows(&copy, &copy_spec, &notes, &mut rows);
        let add_ceiling = copy_rows(&add, &add_spec, &notes, &mut rows);
        let mut csv_rows = 0;
        let mut flush = |rows: &mut Vec<Row>| -> Result<()> {
            if let Some(path) = &args.csv {
                csv::append(path, rows, &run)?;
                csv_rows += rows.len();
            }
            rows.clear();
            Ok(())
        };
        flush(&mut rows)?;

        let mut groups = Vec::new();
        let mut failures = 0;
        for (op, shape) in &plan {
            let op = *op;
            let (in_elems, out_elems) = elements(op, shape);
            let sets = ROTATION_BYTES
                .div_ceil((in_elems * e).max(1))
                .clamp(2, MAX_SETS);
            let max_hold = args.iters.max(args.warmup).max(1);
            // Outputs held until their work is handed to the device (see [`crate::measure`]).
            let hold_bytes = args.hold_gib << 30;
            let submit = notes.submit;
            let hold_fwd = (hold_bytes / (out_elems * e).max(1)).clamp(1, max_hold);
            let hold_full =
                (hold_bytes / ((out_elems + 2 * in_elems) * e).max(1)).clamp(1, max_hold);

            let inner: Vec<Inputs<B>> = (0..sets)
                .map(|_| Inputs::random(op, shape, dtype, &ctx.device))
                .collect();
            let ad: Vec<Inputs<Autodiff<B>>> = inner.iter().map(Inputs::autodiff).collect();
            let stock_inner: Vec<Stock<B>> = inner
                .iter()
                .map(|i| Stock::new(op, i, shape, &ctx.device))
                .collect();
            let stock_ad: Vec<Stock<Autodiff<B>>> = ad
                .iter()
                .map(|i| Stock::new(op, i, shape, &ctx.device))
                .collect();
            // The upstream gradients of each set, made once, as the anchor's.
            let upstream: Vec<Vec<Option<_>>> = inner
                .iter()
                .zip(&stock_inner)
                .map(|(i, s)| {
                    upstream::ones(differentiated(op, &apply::<B>(op, Provider::Liger, i, s)))
                })
                .collect();
            ctx.sync();

            let run_provider = |provider: Provider| -> ProviderResult {
                let label = format!("{} {} {}", op.name(), shape.label(), provider.name());
                pb.set_message(format!("{label} forward"));
                let forward = catch_unwind(AssertUnwindSafe(|| {
                    measure_step(&ctx, timing, hold_fwd, submit, |i| {
                        let k = i % sets;
                        apply::<B>(op, provider, &inner[k], &stock_inner[k])
                    })
                }))
                .map_err(panic_message);
                pb.inc(1);
                if let Some(cube) = &ctx.cube {
                    cube.cleanup();
                }
                pb.set_message(format!("{label} full"));
                let full = catch_unwind(AssertUnwindSafe(|| {
                    measure_step(&ctx, timing, hold_full, submit, |i| {
                        let k = i % sets;
                        let outs = apply::<Autodiff<B>>(op, provider, &ad[k], &stock_ad[k]);
                        let grads =
                            upstream::root(differentiated(op, &outs), &upstream[k]).backward();
                        (outs, grads)
                    })
                }))
                .map_err(panic_message);
                pb.inc(1);
                if let Some(cube) = &ctx.cube {
                    cube.cleanup();
                }
                ProviderResult { forward, full }
            };
            let liger = run_provider(Provider::Liger);
            let burn = run_provider(Provider::Burn);
            drop((inner, ad, stock_inner, stock_ad, upstream));
            if let Some(cube) = &ctx.cube {
                ctx.sync();
                cube.cleanup();
            }
            let group = Group {
                op,
                shape: shape.clone(),
                sets,
                hold_fwd,
                hold_full,
                liger,
                burn,
            };
            failures += group_rows(&group, e, &notes, &mut rows);
            flush(&mut rows)?;
            groups.push(group);
        }
        pb.finish_and_clear();

        if let Ok(c) = &add {
            println!(
                "add ceiling:  {:.1} GB/s  (x+y: two reads and one write, the gated units' forward pattern; {:.3} ms p50)",
                add_ceiling.unwrap_or(f64::NAN),
                c.samples.quantile(0.5) * 1e3
            );
        }
        print!("{}", render(&groups, ctx.cube.is_some(), e, ceiling, &copy));
        if let Some(path) = &args.csv {
            println!("csv: {csv_rows} rows appended to {}", path.display());
        }
        Ok(if failures > 0 || copy.is_err() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// What every row's `config` says.
struct Notes {
    dtype: DtypeArg,
    timing: Timing,
    autotune: bool,
    path: String,
    /// Each timed iteration's queued work submitted at its end (`--submit-each-iteration`).
    submit: bool,
    /// When fused ops hand queued work on (`--hand-off`).
    hand_off: liger_burn::fusion::HandOff,
    /// CubeCL's device memory pool (`--memory-pool`, resolved).
    memory_pool: crate::pool::MemoryPool,
}

impl Notes {
    fn base(&self) -> String {
        format!(
            "dtype={} iters={} repeats={} warmup={} autotune={} memory_pool={}",
            self.dtype,
            self.timing.iters,
            self.timing.repeats,
            self.timing.warmup,
            if self.autotune { "on" } else { "off" },
            self.memory_pool.name()
        )
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// `[p50, p20, p80]` in ms.
fn ms(q: [f64; 3]) -> [f64; 3] {
    q.map(|s| s * 1e3)
}

/// Bandwidth quantiles from time quantiles `[t50, t20, t80]`: the 20th percentile of
/// the bandwidth is at the 80th of the time.
fn gbps(bytes: usize, t: [f64; 3]) -> [f64; 3] {
    let b = bytes as f64 / 1e9;
    [b / t[0], b / t[2], b / t[1]]
}

/// What identifies a row, less the metric.
struct Key<'a> {
    kernel: &'a str,
    provider: &'a str,
    mode: Mode,
    x: &'a str,
}

impl Key<'_> {
    /// The row of `metric` with quantiles `[p50, p20, p80]`.
    fn row(&self, metric: &str, v: [f64; 3], config: String) -> Row {
        Row {
            kernel: self.kernel.into(),
            provider: self.provider.into(),
            mode: self.mode.name().into(),
            metric: metric.into(),
            x: self.x.into(),
            p50: v[0],
            p20: v[1],
            p80: v[2],
            config,
        }
    }
}

/// CSV rows of the copy; returns the ceiling (GB/s at the median) when it ran.
fn copy_rows(
    copy: &Result<crate::ceiling::CopyResult, String>,
    spec: &CopySpec,
    notes: &Notes,
    rows: &mut Vec<Row>,
) -> Option<f64> {
    let c = copy.as_ref().ok()?;
    let x = format!("{}MiB", (c.elems * spec.elem_size) as f64 / MIB);
    let (kernel, op) = match spec.inputs {
        1 => ("copy", "op=x+1 bytes=read+write"),
        _ => ("add", "op=x+y bytes=2*read+write"),
    };
    let config = format!(
        "{} {op} backend=plain-cube(no fusion) elems={}",
        notes.base(),
        c.elems
    );
    let t = c.samples.p50_20_80();
    let key = Key {
        kernel,
        provider: "burn",
        mode: Mode::Forward,
        x: &x,
    };
    rows.push(key.row("ms", ms(t), config.clone()));
    let bw = gbps(c.bytes_moved as usize, t);
    rows.push(key.row("GB/s", bw, config));
    Some(bw[0])
}

/// Time quantiles `[p50, p20, p80]` of one mode of one provider. `backward` is derived:
/// the quantiles of every difference `full_i - forward_j` over the two sets of samples
/// (the distribution of the difference of two independent timings), so they stay ordered.
fn mode_times(p: &ProviderResult, mode: Mode) -> Option<[f64; 3]> {
    let fwd = p.forward.as_ref().ok().map(|m| &m.samples);
    let full = p.full.as_ref().ok().map(|m| &m.samples);
    match mode {
        Mode::Forward => fwd.map(Samples::p50_20_80),
        Mode::Full => full.map(Samples::p50_20_80),
        Mode::Backward => {
            let (f, u) = (fwd?, full?);
            let diffs: Vec<f64> =
                u.0.iter()
                    .flat_map(|a| f.0.iter().map(move |b| a - b))
                    .collect();
            Some([0.5, 0.2, 0.8].map(|q| measure::quantile(&diffs, q)))
        }
    }
}

/// The host's time quantiles `[p50, p20, p80]` per iteration of a measured mode
/// (`None` for the derived backward).
fn mode_host(p: &ProviderResult, mode: Mode) -> Option<[f64; 3]> {
    match mode {
        Mode::Forward => p.forward.as_ref().ok().map(|m| m.host.p50_20_80()),
        Mode::Full => p.full.as_ref().ok().map(|m| m.host.p50_20_80()),
        Mode::Backward => None,
    }
}

fn mode_mem(p: &ProviderResult, mode: Mode) -> Option<MemGrowth> {
    match mode {
        Mode::Forward => p.forward.as_ref().ok()?.mem,
        Mode::Full => p.full.as_ref().ok()?.mem,
        Mode::Backward => None,
    }
}

/// CSV rows of one group; returns how many provider/mode measurements failed.
fn group_rows(g: &Group, e: usize, notes: &Notes, rows: &mut Vec<Row>) -> usize {
    let x = g.shape.label();
    let mut failures = 0;
    for (provider, res) in [(Provider::Liger, &g.liger), (Provider::Burn, &g.burn)] {
        failures += res.forward.is_err() as usize + res.full.is_err() as usize;
        for mode in [Mode::Forward, Mode::Backward, Mode::Full] {
            let Some(t) = mode_times(res, mode) else {
                continue;
            };
            let hold = if mode == Mode::Forward {
                g.hold_fwd
            } else {
                g.hold_full
            };
            let mut config = format!(
                "{} sets={} hold={} submit={} hand_off={}",
                notes.base(),
                g.sets,
                hold,
                if notes.submit {
                    "each-iteration"
                } else {
                    "runtime"
                },
                HandOffArg::name(notes.hand_off)
            );
            if mode != Mode::Forward {
                // The backward starts from gradients made once per set (`upstream`), not
                // from Burn's seed of ones filled in each iteration.
                config.push_str(" upstream=given");
            }
            if provider == Provider::Liger {
                config.push_str(&format!(" reduction={}", notes.path));
                if let Some(units) = ops::backward_units_per_sm() {
                    config.push_str(&format!(" backward_units_per_sm={units}"));
                }
                if let Some(cubes) = ops::cross_entropy_cubes_per_sm() {
                    config.push_str(&format!(" cross_entropy_cubes_per_sm={cubes}"));
                }
                if let Some(elementwise) = ops::elementwise_geometry() {
                    config.push_str(&format!(" elementwise={elementwise}"));
                }
                if matches!(
                    g.op,
                    BenchOp::CrossEntropy | BenchOp::FusedLinearCrossEntropy
                ) && !ops::check_targets()
                {
                    config.push_str(" check_targets=off");
                }
                if g.op == BenchOp::FusedLinearCrossEntropy
                    && ops::head_grad() == liger_burn::ops::WeightGradAccumulation::WeightDtype
                {
                    config.push_str(" head_grad=weight-dtype");
                }
            }
            let launches = match mode {
                Mode::Forward => res.forward.as_ref().ok().map(|m| m.launches),
                _ => res.full.as_ref().ok().map(|m| m.launches),
            };
            if let Some(l) = launches {
                config.push_str(&format!(" fused_launches_per_iter={l}"));
            }
            match mode {
                Mode::Forward => config.push_str(" grad=none"),
                Mode::Backward => config.push_str(" derived=full-forward grad=ones(y.backward)"),
                Mode::Full => config.push_str(" grad=ones(y.backward)"),
            }
            let key = Key {
                kernel: g.op.name(),
                provider: provider.name(),
                mode,
                x: &x,
            };
            rows.push(key.row("ms", ms(t), config.clone()));
            if let Some(h) = mode_host(res, mode) {
                rows.push(key.row(
                    "host ms",
                    ms(h),
                    format!(
                        "{config} host=seconds inside the iterations, synchronizations excluded"
                    ),
                ));
            }
            if let Some((b, formula)) = bytes(g.op, mode, &g.shape, e) {
                rows.push(key.row(
                    "GB/s",
                    gbps(b, t),
                    format!("{config} bytes={b} ({formula}; stats f32)"),
                ));
            }
            if let Some(f) = flops(g.op, mode, &g.shape) {
                let tflops = [t[0], t[2], t[1]].map(|t| f / 1e12 / t);
                rows.push(key.row(
                    "TFLOP/s",
                    tflops,
                    format!("{config} flops={f:.4e} (matrix products only)"),
                ));
            }
            if let Some(m) = mode_mem(res, mode) {
                let v = m.reserved as f64 / MIB;
                rows.push(key.row(
                    "MB",
                    [v; 3],
                    format!(
                        "{config} MB=MiB growth of pool bytes_reserved over one iteration in_use={:+.1}MiB",
                        m.in_use as f64 / MIB
                    ),
                ));
            }
        }
    }
    failures
}

/// The terminal table.
fn render(
    groups: &[Group],
    cube: bool,
    e: usize,
    ceiling: Option<f64>,
    copy: &Result<crate::ceiling::CopyResult, String>,
) -> String {
    let mut out = String::new();
    match copy {
        Ok(c) => out.push_str(&format!(
            "copy ceiling: {:.1} GB/s  (x+1 over {:.0} MiB, {:.3} ms p50, plain backend without fusion)\n",
            ceiling.unwrap_or(f64::NAN),
            (c.elems * e) as f64 / MIB,
            c.samples.quantile(0.5) * 1e3
        )),
        Err(msg) => out.push_str(&format!("copy ceiling: FAILED ({msg})\n")),
    }
    let mut table = Table::new(&[
        ("mode", Align::Left),
        ("liger ms", Align::Right),
        ("burn ms", Align::Right),
        ("speedup", Align::Right),
        ("liger MB", Align::Right),
        ("burn MB", Align::Right),
        ("liger GB/s", Align::Right),
        ("burn GB/s", Align::Right),
        ("liger %copy", Align::Right),
        ("liger host ms", Align::Right),
    ]);
    for g in groups {
        table.title(format!("{} {}", g.op.name(), g.shape.label()));
        for (name, res) in [("liger", &g.liger), ("burn", &g.burn)] {
            for (mode, r) in [("forward", &res.forward), ("full", &res.full)] {
                match r {
                    Err(msg) => table.title(format!(
                        "  {name} {mode} FAILED: {}",
                        msg.lines().next().unwrap_or("")
                    )),
                    Ok(m) if name == "burn" && m.launches > 0.0 => table.title(format!(
                        "  WARNING: burn {mode} launched fused kernels ({} per iteration): not the stock path",
                        m.launches
                    )),
                    Ok(m) if name == "liger" && cube && m.launches == 0.0 => table.title(format!(
                        "  WARNING: liger {mode} launched no fused kernel: not the fused path"
                    )),
                    Ok(_) => {}
                }
            }
        }
        for mode in [Mode::Forward, Mode::Backward, Mode::Full] {
            let tl = mode_times(&g.liger, mode).map(|t| t[0]);
            let tb = mode_times(&g.burn, mode).map(|t| t[0]);
            let b = bytes(g.op, mode, &g.shape, e).map(|(b, _)| b);
            let bw = |t: Option<f64>| Some(b? as f64 / 1e9 / t?);
            let mem = |p: &ProviderResult| mode_mem(p, mode).map(|m| m.reserved as f64 / MIB);
            let speedup = match (tl, tb) {
                (Some(l), Some(b)) => Some(b / l),
                _ => None,
            };
            let pct = match (bw(tl), ceiling) {
                (Some(a), Some(c)) => Some(100.0 * a / c),
                _ => None,
            };
            table.row(vec![
                format!("  {}", mode.name()),
                num(tl.map(|t| t * 1e3), 4),
                num(tb.map(|t| t * 1e3), 4),
                speedup
                    .map(|s| format!("{s:.2}x"))
                    .unwrap_or_else(|| "-".into()),
                num(mem(&g.liger), 1),
                num(mem(&g.burn), 1),
                num(bw(tl), 1),
                num(bw(tb), 1),
                pct.map(|p| format!("{p:.0}%"))
                    .unwrap_or_else(|| "-".into()),
                num(mode_host(&g.liger, mode).map(|h| h[0] * 1e3), 4),
            ]);
        }
    }
    out.push_str(&table.render());
    out
}
