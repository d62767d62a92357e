//! `liger bench --optimizer-step`: one AdamW step over a model's parameters, liger-burn's
//! fused AdamW (one kernel per parameter) against Burn's `AdamW` (a dozen elementwise ops
//! per parameter), on the inner backend (no autodiff), the same random parameters and
//! gradients for every provider.
//!
//! Providers (the CSV `provider` column):
//! - `burn`: `burn::optim::AdamW`, moments in the parameters' dtype;
//! - `liger`: `liger_burn::optim::AdamW` with [`LowPrecisionUpdate::Pure`], moments in
//!   the parameters' dtype (the same state as Burn's);
//! - `liger-master`: f16/bf16 only, [`LowPrecisionUpdate::MasterWeights`]: f32 master
//!   weights and moments, the low-precision parameters written in the same pass.
//!
//! The parameters are the sizes of each `--e2e-models` model's parameter tensors (Llama
//! 3.2 1B: 146 tensors, 1.24 B parameters), or one tensor per `--shape`. A sample is the
//! mean of `--iters` steps over every parameter (the step count keeps growing: bias
//! corrections change, the work does not), synchronized at its end; `--warmup` steps
//! first, the first of which creates the moments.
//!
//! Minimal bytes per parameter, the `GB/s` numerator (Burn's defaults: no AMSGrad): the
//! parameter, gradient and both moments read once and the parameter and both moments
//! written once, `7·s` for parameters of `s` bytes with moments in their dtype (14 B in
//! bf16, 28 B in f32); with master weights `2·s + 24` (the gradient read and the
//! parameter written in `s` bytes, the f32 master and moments read and written).

use super::e2e::E2eModel;
use crate::args::BenchArgs;
use crate::ceiling::CopySpec;
use crate::csv::{self, Row, RunInfo};
use crate::device::{self, Ctx, OnDevice, payload_text};
use crate::measure::{self, Samples, Timing};
use crate::table::{Align, Table, num};
use anyhow::{Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::SimpleOptimizer;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};
use liger_burn::ops::FusedOps;
use liger_burn::optim::{AdamWConfig, LowPrecisionUpdate};
use liger_models::{CausalLm, LigerConfig};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// Learning rate of the steps (irrelevant to the timing).
const LR: f64 = 1e-5;

/// Runs `liger bench --optimizer-step`.
pub fn run(args: BenchArgs) -> Result<ExitCode> {
    if args.iters == 0 || args.repeats == 0 {
        bail!("--iters and --repeats must be at least 1");
    }
    device::dispatch(args.device, OptimizerBench(args))
}

struct OptimizerBench(BenchArgs);

/// Which AdamW runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    Burn,
    Liger,
    LigerMaster,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::Burn => "burn",
            Provider::Liger => "liger",
            Provider::LigerMaster => "liger-master",
        }
    }

    /// Minimal bytes per parameter of `elem_size` bytes.
    fn bytes_per_param(self, elem_size: usize) -> usize {
        match self {
            Provider::Burn | Provider::Liger => 7 * elem_size,
            Provider::LigerMaster => 2 * elem_size + 24,
        }
    }

    fn describe(self, dtype: DType) -> String {
        match self {
            Provider::Burn => format!("burn::optim::AdamW, moments in {dtype:?}"),
            Provider::Liger => format!("liger-burn fused AdamW, moments in {dtype:?}"),
            Provider::LigerMaster => {
                format!("liger-burn fused AdamW, f32 master weights and moments, {dtype:?} copy")
            }
        }
    }
}

/// The parameter sizes of a model, in visit order.
fn model_sizes<B: FusedOps>(
    model: E2eModel,
    layers: Option<usize>,
    dtype: DType,
    device: &B::Device,
) -> Vec<usize> {
    struct Sizes(Vec<usize>);
    impl<B: Backend> ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.shape().num_elements());
        }
    }
    // Built in `dtype` and dropped: only the shapes are kept.
    let built = CausalLm::<B>::init(&model.config(layers), LigerConfig::none(), dtype, device);
    let mut sizes = Sizes(Vec::new());
    built.visit(&mut sizes);
    sizes.0
}

/// `steps` AdamW steps of `optim` over every parameter; the states carry over.
fn step_all<B: Backend, O: SimpleOptimizer<B>>(
    optim: &O,
    params: &mut [Option<Tensor<B, 1>>],
    grads: &[Tensor<B, 1>],
    states: &mut [Option<O::State<1>>],
) {
    for ((param, grad), state) in params.iter_mut().zip(grads).zip(states.iter_mut()) {
        let p = param
            .take()
            .expect("every parameter is present between steps");
        let (p, s) = optim.step(LR, p, grad.clone(), state.take());
        *param = Some(p);
        *state = s;
    }
}

/// Times the steps of `optim` over fresh copies of `params`.
fn time_provider<B: FusedOps, O: SimpleOptimizer<B>>(
    ctx: &Ctx<B>,
    timing: Timing,
    optim: &O,
    params: &[Tensor<B, 1>],
    grads: &[Tensor<B, 1>],
) -> Samples {
    // Copies the optimizer owns alone (the fused step then updates them in place).
    let mut owned: Vec<Option<Tensor<B, 1>>> = params
        .iter()
        .map(|p| Some(p.clone().add_scalar(0.0)))
        .collect();
    let mut states: Vec<Option<O::State<1>>> = params.iter().map(|_| None).collect();
    ctx.sync();
    let samples = measure::time(
        timing,
        timing.iters.max(timing.warmup).max(1),
        &|| ctx.sync(),
        &|| B::submit_queued(&ctx.device),
        |_| step_all(optim, &mut owned, grads, &mut states),
    )
    .wall;
    drop((owned, states));
    ctx.sync();
    samples
}

impl OnDevice for OptimizerBench {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = &self.0;
        let dtype = args.dtype.dtype();
        ctx.describe(None);
        if let Some(code) = device::require_dtype::<B>(
            &ctx.device,
            dtype,
            args.dtype,
            "bench",
            " (try --dtype f32)",
        ) {
            return Ok(code);
        }
        let elem_size = dtype.size();
        let timing = Timing {
            warmup: args.warmup.max(1),
            iters: args.iters,
            repeats: args.repeats,
        };
        let copy_spec = CopySpec {
            dtype,
            elem_size,
            bytes: args.copy_mib << 20,
            inputs: 1,
            max_alloc: ctx.cube.as_ref().map(|c| c.max_alloc),
            timing,
        };
        let copy = catch_unwind(AssertUnwindSafe(|| (ctx.copy)(&copy_spec)));
        let copy_gbs = copy
            .as_ref()
            .ok()
            .map(|c| c.bytes_moved as f64 / c.samples.quantile(0.5) / 1e9);
        println!(
            "copy:      x + 1 over {} MiB of {dtype:?}: {} GB/s (the bandwidth ceiling)",
            args.copy_mib,
            num(copy_gbs, 0)
        );
        if let Some(cube) = &ctx.cube {
            cube.cleanup();
        }
        let run = RunInfo {
            gpu: args.gpu.clone().unwrap_or_else(|| B::name(&ctx.device)),
            commit: args
                .commit
                .clone()
                .unwrap_or_else(|| env!("LIGER_BUILD_COMMIT").to_string()),
            date: csv::utc_date(),
        };
        let groups: Vec<(String, Vec<usize>)> = if args.shape.is_empty() {
            args.e2e_models
                .iter()
                .map(|m| {
                    let name = match args.e2e_layers {
                        Some(n) => format!("{}-{n}layers", m.name()),
                        None => m.name().to_string(),
                    };
                    (
                        name,
                        model_sizes::<B>(*m, args.e2e_layers, dtype, &ctx.device),
                    )
                })
                .collect()
        } else {
            let sizes = args.shape.iter().map(|s| s.0.iter().product()).collect();
            let names: Vec<String> = args
                .shape
                .iter()
                .map(|s| {
                    let dims: Vec<String> = s.0.iter().map(|d| d.to_string()).collect();
                    dims.join("x")
                })
                .collect();
            vec![(names.join("+"), sizes)]
        };
        let mut providers = vec![Provider::Burn, Provider::Liger];
        if matches!(dtype, DType::F16 | DType::BF16) {
            providers.push(Provider::LigerMaster);
        }
        let mut failures = 0;
        for (name, sizes) in groups {
            let total: usize = sizes.iter().sum();
            println!(
                "\nparameters: {name}: {} tensors, {total} parameters ({:.3} B), {dtype:?}",
                sizes.len(),
                total as f64 / 1e9
            );
            let params: Vec<Tensor<B, 1>> = sizes
                .iter()
                .map(|&n| {
                    Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 0.02), &ctx.device)
                        .cast(dtype)
                })
                .collect();
            let grads: Vec<Tensor<B, 1>> = sizes
                .iter()
                .map(|&n| {
                    Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 1e-3), &ctx.device)
                        .cast(dtype)
                })
                .collect();
            let mut table = Table::new(&[
                ("provider", Align::Left),
                ("ms p50", Align::Right),
                ("p20", Align::Right),
                ("p80", Align::Right),
                ("bytes/param", Align::Right),
                ("GB/s", Align::Right),
                ("of copy", Align::Right),
                ("floor ms at copy GB/s", Align::Right),
            ]);
            table.title(format!(
                "AdamW step over {name} ({dtype:?}), {} steps per sample, {} samples",
                timing.iters, timing.repeats
            ));
            let mut rows = Vec::new();
            for provider in &providers {
                let provider = *provider;
                let measured = catch_unwind(AssertUnwindSafe(|| match provider {
                    Provider::Burn => {
                        let optim = burn::optim::AdamWConfig::new().build();
                        time_provider(&ctx, timing, &optim, &params, &grads)
                    }
                    Provider::Liger | Provider::LigerMaster => {
                        let optim = AdamWConfig::new()
                            .with_low_precision(if provider == Provider::Liger {
                                LowPrecisionUpdate::Pure
                            } else {
                                LowPrecisionUpdate::MasterWeights
                            })
                            .build();
                        time_provider(&ctx, timing, &optim, &params, &grads)
                    }
                }));
                if let Some(cube) = &ctx.cube {
                    cube.cleanup();
                }
                let per_param = provider.bytes_per_param(elem_size);
                let bytes = (per_param * total) as f64;
                let samples = match measured {
                    Ok(s) => s,
                    Err(p) => {
                        failures += 1;
                        let text = payload_text(p.as_ref());
                        println!(
                            "{}: failed: {}",
                            provider.name(),
                            text.lines().next().unwrap_or("")
                        );
                        continue;
                    }
                };
                let [p50, p20, p80] = samples.p50_20_80().map(|s| s * 1e3);
                let gbs = bytes / (p50 * 1e-3) / 1e9;
                table.row(vec![
                    provider.name().to_string(),
                    format!("{p50:.3}"),
                    format!("{p20:.3}"),
                    format!("{p80:.3}"),
                    per_param.to_string(),
                    format!("{gbs:.1}"),
                    num(copy_gbs.map(|c| 100.0 * gbs / c), 0) + "%",
                    num(copy_gbs.map(|c| bytes / c / 1e6), 3),
                ]);
                let config = format!(
                    "dtype={} params={total} tensors={} warmup={} iters={} repeats={} lr={LR:e} \
                     bytes_per_param={per_param} optimizer={}",
                    args.dtype,
                    sizes.len(),
                    timing.warmup,
                    timing.iters,
                    timing.repeats,
                    provider.describe(dtype).replace(',', ";")
                );
                let row = |metric: &str, v: [f64; 3]| Row {
                    kernel: "adamw_step".into(),
                    provider: provider.name().into(),
                    mode: "optimizer".into(),
                    metric: metric.into(),
                    x: name.clone(),
                    p50: v[0],
                    p20: v[1],
                    p80: v[2],
                    config: config.clone(),
                };
                rows.push(row("ms", [p50, p20, p80]));
                // The 20th percentile of a rate is at the 80th of the time.
                rows.push(row(
                    "GB/s",
                    [p50, p80, p20].map(|t| bytes / (t * 1e-3) / 1e9),
                ));
            }
            println!("{}", table.render());
            if let Some(path) = &args.csv {
                csv::append(path, &rows, &run)?;
            }
            drop((params, grads));
            if let Some(cube) = &ctx.cube {
                cube.cleanup();
            }
        }
        Ok(if failures > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}
