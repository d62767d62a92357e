//! `liger bench --attention`: liger-burn's attention, the flash kernels against the
//! blockwise composition, on the same backend, shapes and inputs, in one process.
//!
//! For every `--attention-shape` (`BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM`, causal) and
//! provider (`liger-auto`: `AttentionKernel::Auto`, what a model gets: cuDNN's fused
//! attention on CUDA where it takes the problem, else the flash kernels; `liger-flash`:
//! `AttentionKernel::Flash`, on tensor cores where the device has them for the dtype, else
//! the FMA variant; `liger-blockwise`: `AttentionKernel::Blockwise`)
//! it times `functional::attention` forward (inner backend) and full (forward + `backward()`
//! on `Autodiff<B>`, upstream gradient ones), derives backward = full − forward, and writes
//! the op bench's CSV rows (`kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,
//! date`; kernel `attention`, x the shape) with metrics `ms`, `TFLOP/s` and `MB` (pool
//! growth over one iteration, as the op bench measures memory).
//!
//! FLOPs are counted as FlashAttention counts them: forward `4·b·h·s²·d`, halved under a
//! causal mask; backward 2.5× the forward (its five products against the forward's two);
//! full 3.5×. So the TFLOP/s of both providers and of `scripts/device/sdpa_anchor.py` (torch
//! SDPA, same schema) compare directly.
//!
//! Iterations per sample adapt to the shape: at most `--iters`, and no more than fit in
//! about 0.2 s (one timed iteration after the warmup decides), so 32K sequences finish.

use super::ops::Mode;
use super::{MIB, ProviderResult, mode_mem, mode_times, ms, panic_message};
use crate::args::BenchArgs;
use crate::csv::{self, Row, RunInfo};
use crate::device::{self, Ctx, OnDevice};
use crate::measure::Timing;
use crate::table::{Align, Table, num};
use anyhow::{Result, bail};
use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use liger_burn::functional::attention;
use liger_burn::ops::{AttentionKernel, AttentionOptions, FusedOps};
use liger_cubecl_kernels::attention::FlashVariant;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Instant;

/// One attention problem: `q: [batch, q_heads, seq, head_dim]`, `k, v: [batch, kv_heads,
/// seq, head_dim]`, causal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl AttentionShape {
    /// `BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM`, the CSV's x.
    pub fn label(&self) -> String {
        format!(
            "{}x{}x{}x{}x{}",
            self.batch, self.seq, self.q_heads, self.kv_heads, self.head_dim
        )
    }

    /// FlashAttention's count of the causal forward: `4·b·h·s²·d / 2`.
    pub fn forward_flops(&self) -> f64 {
        let (b, h, s, d) = (
            self.batch as f64,
            self.q_heads as f64,
            self.seq as f64,
            self.head_dim as f64,
        );
        4.0 * b * h * s * s * d / 2.0
    }

    fn flops(&self, mode: Mode) -> f64 {
        self.forward_flops()
            * match mode {
                Mode::Forward => 1.0,
                Mode::Backward => 2.5,
                Mode::Full => 3.5,
            }
    }
}

impl FromStr for AttentionShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: Vec<usize> = s
            .split('x')
            .map(|p| p.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{s}: {e}"))?;
        match v[..] {
            [batch, seq, q_heads, kv_heads, head_dim]
                if v.iter().all(|&x| x > 0) && q_heads % kv_heads == 0 =>
            {
                Ok(Self {
                    batch,
                    seq,
                    q_heads,
                    kv_heads,
                    head_dim,
                })
            }
            _ => Err(format!(
                "{s}: expected BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM, all positive, Q_HEADS a multiple of KV_HEADS"
            )),
        }
    }
}

/// The default shapes: Llama-3.2-1B heads (32 q / 8 kv, head_dim 64), Qwen2.5-1.5B (12 / 2,
/// 128) and 16 / 2 at 128, batch 1 from 1K to 32K tokens, and batch 4 at 1K and 4K.
pub fn default_shapes() -> Vec<AttentionShape> {
    let heads = [(32, 8, 64), (16, 2, 128), (12, 2, 128)];
    let mut shapes = Vec::new();
    for (q_heads, kv_heads, head_dim) in heads {
        for seq in [1024, 2048, 4096, 8192, 16384, 32768] {
            shapes.push(AttentionShape {
                batch: 1,
                seq,
                q_heads,
                kv_heads,
                head_dim,
            });
        }
        for seq in [1024, 4096] {
            shapes.push(AttentionShape {
                batch: 4,
                seq,
                q_heads,
                kv_heads,
                head_dim,
            });
        }
    }
    shapes
}

/// Which implementation a provider runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionProvider {
    /// What a model gets (`AttentionKernel::Auto`): cuDNN on CUDA where it runs the problem,
    /// else the flash kernels; the rows say which (`library=`).
    Auto,
    /// The flash kernels (`AttentionKernel::Flash`).
    Flash,
    /// The blockwise composition (`AttentionKernel::Blockwise`).
    Blockwise,
}

impl AttentionProvider {
    fn name(self) -> &'static str {
        match self {
            AttentionProvider::Auto => "liger-auto",
            AttentionProvider::Flash => "liger-flash",
            AttentionProvider::Blockwise => "liger-blockwise",
        }
    }

    fn kernel(self) -> AttentionKernel {
        match self {
            AttentionProvider::Auto => AttentionKernel::Auto,
            AttentionProvider::Flash => AttentionKernel::Flash,
            AttentionProvider::Blockwise => AttentionKernel::Blockwise,
        }
    }
}

/// Runs `liger bench --attention`.
pub fn run(args: BenchArgs) -> Result<ExitCode> {
    if args.iters == 0 || args.repeats == 0 {
        bail!("--iters and --repeats must be at least 1");
    }
    device::dispatch(args.device, Bench(args))
}

struct Bench(BenchArgs);

/// One iteration's upper bound on a sample's length: more iterations than fit are not run.
const SAMPLE_SECONDS: f64 = 0.2;

/// Iterations per sample for a step that took `one` seconds, at most `max`.
fn iterations(one: f64, max: usize) -> usize {
    ((SAMPLE_SECONDS / one.max(1e-6)) as usize).clamp(1, max.max(1))
}

/// Warmup, then the timing with iterations per sample chosen from one timed iteration.
fn measure<B: FusedOps, H>(
    ctx: &Ctx<B>,
    timing: Timing,
    mut step: impl FnMut(usize) -> H,
) -> (super::Measured, usize) {
    for i in 0..timing.warmup.max(1) {
        drop(step(i));
        ctx.sync();
    }
    let start = Instant::now();
    let held = step(0);
    ctx.sync();
    let one = start.elapsed().as_secs_f64();
    drop(held);
    let iters = iterations(one, timing.iters);
    let timing = Timing {
        warmup: 0,
        iters,
        ..timing
    };
    // One iteration's outputs held at a time beyond the first: attention's outputs and
    // gradients are large at long sequences.
    (super::measure_step(ctx, timing, 2, false, step), iters)
}

/// The measurements of one shape.
struct Group {
    shape: AttentionShape,
    variant: Option<FlashVariant>,
    /// Per provider: its result, the iterations per sample (forward, full), and whether
    /// a vendor library (cuDNN) ran its calls.
    results: Vec<(AttentionProvider, ProviderResult, [usize; 2], bool)>,
}

impl OnDevice for Bench {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = self.0;
        let dtype = args.dtype.dtype();
        ctx.describe(None);
        if let Some(code) =
            device::require_dtype::<B>(&ctx.device, dtype, args.dtype, "benchmark", "")
        {
            return Ok(code);
        }
        let shapes = if args.attention_shape.is_empty() {
            default_shapes()
        } else {
            args.attention_shape.clone()
        };
        let timing = Timing {
            warmup: args.warmup,
            iters: args.iters,
            repeats: args.repeats,
        };
        println!(
            "timing:    warmup {} + {} samples x up to {} iterations (at most ~{SAMPLE_SECONDS} s a sample); p50 [p20, p80]",
            args.warmup, args.repeats, args.iters
        );
        let run = RunInfo {
            gpu: args.gpu.clone().unwrap_or_else(|| B::name(&ctx.device)),
            commit: args
                .commit
                .clone()
                .unwrap_or_else(|| env!("LIGER_BUILD_COMMIT").to_string()),
            date: csv::utc_date(),
        };
        let mut groups = Vec::new();
        let mut failures = 0;
        for shape in &shapes {
            let (b, s, hq, hk, d) = (
                shape.batch,
                shape.seq,
                shape.q_heads,
                shape.kv_heads,
                shape.head_dim,
            );
            let variant =
                B::flash_attention_variant(&ctx.device, dtype, d, &AttentionOptions::causal(d));
            // Inputs rotate among sets (at least two; about 256 MiB of inputs a rotation).
            let bytes = (b * (hq + 2 * hk) * s * d * args.dtype.size()).max(1);
            let sets = (256usize << 20).div_ceil(bytes).clamp(2, 8);
            let random = |h: usize| {
                Tensor::<B, 4>::random([b, h, s, d], Distribution::Normal(0.0, 1.0), &ctx.device)
                    .cast(dtype)
            };
            let inputs: Vec<[Tensor<B, 4>; 3]> = (0..sets)
                .map(|_| [random(hq), random(hk), random(hk)])
                .collect();
            ctx.sync();
            let mut results = Vec::new();
            for &provider in &args.attention_provider {
                let options = AttentionOptions::causal(d).with_kernel(provider.kernel());
                println!("running   {} {}", shape.label(), provider.name());
                let vendor_calls = liger_burn::cube::vendor_attention_calls();
                let forward = catch_unwind(AssertUnwindSafe(|| {
                    measure(&ctx, timing, |i| {
                        let [q, k, v] = inputs[i % sets].clone();
                        attention(q, k, v, None, options)
                    })
                }))
                .map_err(panic_message);
                if let Some(cube) = &ctx.cube {
                    cube.cleanup();
                }
                let full = catch_unwind(AssertUnwindSafe(|| {
                    measure(&ctx, timing, |i| {
                        let [q, k, v] = inputs[i % sets]
                            .clone()
                            .map(|t| Tensor::<Autodiff<B>, 4>::from_inner(t).require_grad());
                        let out = attention(q, k, v, None, options);
                        out.backward()
                    })
                }))
                .map_err(panic_message);
                if let Some(cube) = &ctx.cube {
                    cube.cleanup();
                }
                let iters = [
                    forward.as_ref().map(|m| m.1).unwrap_or(0),
                    full.as_ref().map(|m| m.1).unwrap_or(0),
                ];
                let result = ProviderResult {
                    forward: forward.map(|m| m.0),
                    full: full.map(|m| m.0),
                };
                failures += result.forward.is_err() as usize + result.full.is_err() as usize;
                let vendor = liger_burn::cube::vendor_attention_calls() > vendor_calls;
                results.push((provider, result, iters, vendor));
            }
            drop(inputs);
            if let Some(cube) = &ctx.cube {
                ctx.sync();
                cube.cleanup();
            }
            let group = Group {
                shape: shape.clone(),
                variant,
                results,
            };
            if let Some(path) = &args.csv {
                let runtime = ctx.cube.as_ref().map(|c| c.runtime.as_str());
                csv::append(path, &rows(&group, &args, timing, runtime), &run)?;
            }
            groups.push(group);
        }
        print!("{}", render(&groups));
        Ok(if failures > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}

fn tflops(f: f64, t: [f64; 3]) -> [f64; 3] {
    // The 20th percentile of a rate is at the 80th of the time.
    [f / 1e12 / t[0], f / 1e12 / t[2], f / 1e12 / t[1]]
}

/// The CSV rows of one shape; `runtime` names the CubeCL runtime where there is one
/// (`cuda`, `wgpu<spirv>`: the same kernels through Vulkan).
fn rows(g: &Group, args: &BenchArgs, timing: Timing, runtime: Option<&str>) -> Vec<Row> {
    let x = g.shape.label();
    let runtime = runtime.map(|r| format!(" runtime={r}")).unwrap_or_default();
    let mut out = Vec::new();
    for (provider, res, iters, vendor) in &g.results {
        for mode in [Mode::Forward, Mode::Backward, Mode::Full] {
            let Some(t) = mode_times(res, mode) else {
                continue;
            };
            let launches = match mode {
                Mode::Forward => res.forward.as_ref().ok().map(|m| m.launches),
                _ => res.full.as_ref().ok().map(|m| m.launches),
            };
            let variant = match (provider, g.variant) {
                (AttentionProvider::Flash, Some(FlashVariant::Mma)) => " variant=register_mma",
                (AttentionProvider::Flash, Some(FlashVariant::TensorCores)) => {
                    " variant=tensor_cores"
                }
                (AttentionProvider::Flash, _) => " variant=fma",
                (AttentionProvider::Auto, _) if *vendor => " library=cudnn",
                (AttentionProvider::Auto, Some(FlashVariant::Mma)) => {
                    " library=liger variant=register_mma"
                }
                (AttentionProvider::Auto, _) => " library=liger",
                _ => "",
            };
            let config = format!(
                "dtype={}{runtime} causal=1 iters_fwd={} iters_full={} repeats={} warmup={}{variant} fused_launches_per_iter={} grad={}",
                args.dtype,
                iters[0],
                iters[1],
                timing.repeats,
                timing.warmup,
                launches.unwrap_or(f64::NAN),
                match mode {
                    Mode::Forward => "none",
                    Mode::Backward => "ones(derived=full-forward)",
                    Mode::Full => "ones(y.backward)",
                }
            );
            let row = |metric: &str, v: [f64; 3], config: String| Row {
                kernel: "attention".into(),
                provider: provider.name().into(),
                mode: mode.name().into(),
                metric: metric.into(),
                x: x.clone(),
                p50: v[0],
                p20: v[1],
                p80: v[2],
                config,
            };
            out.push(row("ms", ms(t), config.clone()));
            let f = g.shape.flops(mode);
            out.push(row(
                "TFLOP/s",
                tflops(f, t),
                format!("{config} flops={f:.4e} (FlashAttention count: causal halved; backward 2.5x forward)"),
            ));
            if let Some(m) = mode_mem(res, mode) {
                let v = m.reserved as f64 / MIB;
                out.push(row(
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
    out
}

fn render(groups: &[Group]) -> String {
    let mut table = Table::new(&[
        ("provider / mode", Align::Left),
        ("ms", Align::Right),
        ("TFLOP/s", Align::Right),
        ("MB", Align::Right),
    ]);
    for g in groups {
        table.title(format!(
            "attention {} (causal{})",
            g.shape.label(),
            match g.variant {
                Some(FlashVariant::Mma) => ", register mma",
                Some(FlashVariant::TensorCores) => ", tensor cores",
                _ => "",
            }
        ));
        for (provider, res, _, vendor) in &g.results {
            for (mode, r) in [("forward", &res.forward), ("full", &res.full)] {
                if let Err(msg) = r {
                    table.title(format!(
                        "  {} {mode} FAILED: {}",
                        provider.name(),
                        msg.lines().next().unwrap_or("")
                    ));
                }
            }
            for mode in [Mode::Forward, Mode::Backward, Mode::Full] {
                let t = mode_times(res, mode).map(|t| t[0]);
                let library = match (provider, vendor) {
                    (AttentionProvider::Auto, true) => " (cuDNN)",
                    _ => "",
                };
                table.row(vec![
                    format!("  {}{library} {}", provider.name(), mode.name()),
                    num(t.map(|t| t * 1e3), 4),
                    num(t.map(|t| g.shape.flops(mode) / 1e12 / t), 1),
                    num(mode_mem(res, mode).map(|m| m.reserved as f64 / MIB), 1),
                ]);
            }
        }
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_count_flash_attention_flops() {
        let s: AttentionShape = "1x4096x32x8x64".parse().unwrap();
        assert_eq!(s.label(), "1x4096x32x8x64");
        // 4·1·32·4096²·64 / 2 = 68.7 GFLOP; full 3.5× that.
        assert!((s.forward_flops() - 6.8719476736e10).abs() < 1.0);
        assert!((s.flops(Mode::Full) / s.forward_flops() - 3.5).abs() < 1e-12);
        assert!("1x4096x12x5x128".parse::<AttentionShape>().is_err());
        assert!("1x4096x32x8".parse::<AttentionShape>().is_err());
        assert_eq!(default_shapes().len(), 24);
    }

    #[test]
    fn iterations_fit_a_sample() {
        assert_eq!(iterations(0.001, 50), 50);
        assert_eq!(iterations(0.05, 50), 4);
        assert_eq!(iterations(3.0, 50), 1);
    }
}
