//! `liger bench --op matmul`: the models' GEMMs, liger (`Liger<B>`, whose matmul is
//! `fused_matmul`: cuBLASLt on CUDA) against stock Burn (`B`) in the same process.
//!
//! Shapes are `MxKxN` (`[m, k] · [k, n]`); by default the GEMMs of a training step at
//! 4096 tokens of Llama-3.2-1B (hidden 2048, intermediate 8192, kv 512, vocabulary 128256)
//! and Qwen2.5-1.5B (1536, 8960, 256, 151936): the projections, the MLP, the LM head and
//! the LM head's weight gradient (`[V, tokens] · [tokens, H]`).
//!
//! Rows (the bench's CSV layout), per shape:
//! - kernel `matmul`, providers `liger` / `burn` on the device's backend (fusion):
//!   `forward` (`x·w`), `full` (forward and `y.backward()` on `Liger<Autodiff<B>>` /
//!   `Autodiff<B>`: two more products) and `backward` (full − forward); `ms` and
//!   `TFLOP/s` (`2mkn` per product).
//! - on CUDA, each product alone on the plain CubeCL backend, for both of liger's
//!   ordering protocols and Burn's matmul: kernel `matmul` (`x·w`, mode `forward`),
//!   `matmul_grad_lhs` (`g·wᵀ`) and `matmul_grad_rhs` (`xᵀ·g`, mode `backward`);
//!   providers `liger-stream-memory-operations`, `liger-host-synchronization`, `burn`.
//!
//! - on CUDA, both gradients (`g·wᵀ`, `xᵀ·g`) as one `fused_matmul_backward` call
//!   (provider `liger-pair`: one chain under one ordering) and as two products
//!   (`liger-separate`): kernel `matmul_grads`, mode `backward`.
//!
//! And once, on CUDA, the per-call cost of the ordering (kernel `matmul_call`, shape
//! `64x64x64`, metric `us`): many tiny products in a row with each protocol, with Burn's
//! matmul, and with no per-call ordering at all (`cublaslt-unordered`: the products back
//! to back between one host synchronization before and one after); `overhead_us` rows are
//! a protocol's time per call minus that baseline's, `caller_us` rows the calling
//! thread's time inside each call, and `host_*_us` rows the device thread's host time per
//! product in each phase of the protocol (`cublaslt::HostTimes`). The products timed alone
//! name the calling thread's time per call in their config (`caller_us`).

use super::ops::Shape;
use crate::args::BenchArgs;
use crate::csv::{self, Row, RunInfo};
use crate::device::{Ctx, OnDevice};
use crate::measure::{self, Samples, Timing};
use crate::table::{Align, Table, num};
use anyhow::{Result, bail};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor, TensorPrimitive};
use liger_burn::Liger;
use liger_burn::cube::matmul_counts;
use liger_burn::ops::FusedOps;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// A named GEMM `[m, k] · [k, n]`.
#[derive(Clone, Debug)]
struct Gemm {
    name: String,
    m: usize,
    k: usize,
    n: usize,
}

impl Gemm {
    fn new(name: &str, m: usize, k: usize, n: usize) -> Self {
        Self {
            name: name.into(),
            m,
            k,
            n,
        }
    }

    fn label(&self) -> String {
        format!("{}x{}x{}", self.m, self.k, self.n)
    }

    /// FLOPs of one product.
    fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }

    /// Bytes of `x`, `w` and `g` (or `y`).
    fn bytes(&self, e: usize) -> usize {
        (self.m * self.k + self.k * self.n + self.m * self.n) * e
    }
}

/// Tokens per step of the default shapes.
const TOKENS: usize = 4096;

/// The models' GEMMs at [`TOKENS`] tokens.
fn model_gemms() -> Vec<Gemm> {
    let mut gemms = Vec::new();
    for (model, h, ffn, kv, vocab) in [
        ("llama3.2-1b", 2048, 8192, 512, 128_256),
        ("qwen2.5-1.5b", 1536, 8960, 256, 151_936),
    ] {
        let t = TOKENS;
        gemms.extend([
            Gemm::new(&format!("{model}:q_proj/o_proj"), t, h, h),
            Gemm::new(&format!("{model}:k_proj/v_proj"), t, h, kv),
            Gemm::new(&format!("{model}:gate_proj/up_proj"), t, h, ffn),
            Gemm::new(&format!("{model}:down_proj"), t, ffn, h),
            Gemm::new(&format!("{model}:lm_head"), t, h, vocab),
            Gemm::new(&format!("{model}:lm_head_weight_grad"), vocab, t, h),
        ]);
    }
    gemms
}

/// Input sets rotated through (as the other ops' benchmarks: consecutive iterations
/// never share an input).
const ROTATION_BYTES: usize = 256 << 20;
const MAX_SETS: usize = 16;

/// `liger bench --op matmul`.
pub struct MatmulBench(pub BenchArgs);

/// One measured provider: samples (seconds per iteration) and the liger products per
/// iteration that ran on a vendor library.
struct Measured {
    samples: Samples,
    vendor_per_iter: f64,
}

impl OnDevice for MatmulBench {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = self.0;
        let dtype = args.dtype.dtype();
        let e = args.dtype.size();
        ctx.describe(None);
        if let Some(code) =
            crate::device::require_dtype::<B>(&ctx.device, dtype, args.dtype, "benchmark", "")
        {
            return Ok(code);
        }
        let gemms = if args.shape.is_empty() {
            model_gemms()
        } else {
            let mut gemms = Vec::new();
            for Shape(d) in &args.shape {
                if d.len() != 3 {
                    bail!("--shape {}: matmul takes MxKxN", Shape(d.clone()).label());
                }
                gemms.push(Gemm::new("custom", d[0], d[1], d[2]));
            }
            gemms
        };
        let timing = Timing {
            warmup: args.warmup,
            iters: args.iters,
            repeats: args.repeats,
        };
        let vendor = B::fused_matmul_uses_vendor_library(&ctx.device, dtype);
        println!(
            "matmul:    liger's products on {}",
            if vendor {
                "a vendor library (cuBLASLt)"
            } else {
                "the backend's own matmul (no vendor library for this device and dtype)"
            }
        );
        #[cfg(feature = "cuda")]
        if vendor && ctx.kind == crate::device::DeviceKind::Cuda {
            println!("ordering:  {}", cuda::orderings_summary());
        }
        let run = RunInfo {
            gpu: args.gpu.clone().unwrap_or_else(|| B::name(&ctx.device)),
            commit: args
                .commit
                .clone()
                .unwrap_or_else(|| env!("LIGER_BUILD_COMMIT").to_string()),
            date: csv::utc_date(),
        };
        let base = format!(
            "dtype={} iters={} repeats={} warmup={} autotune={} hand_off={}",
            args.dtype,
            timing.iters,
            timing.repeats,
            timing.warmup,
            if cfg!(feature = "autotune") {
                "on"
            } else {
                "off"
            },
            crate::args::HandOffArg::name(crate::args::HandOffArg::resolve(args.hand_off))
        );
        let mut table = Table::new(&[
            ("product", Align::Left),
            ("mode", Align::Left),
            ("provider", Align::Left),
            ("ms", Align::Right),
            ("TFLOP/s", Align::Right),
        ]);
        let mut csv_rows = 0;
        let mut failures = 0;
        let mut emit = |rows: Vec<Row>, table: &mut Table| -> Result<()> {
            for r in &rows {
                if r.metric == "ms" {
                    let tflops = rows
                        .iter()
                        .find(|t| {
                            t.metric == "TFLOP/s"
                                && t.provider == r.provider
                                && t.mode == r.mode
                                && t.kernel == r.kernel
                        })
                        .map(|t| t.p50);
                    table.row(vec![
                        format!("  {}", r.kernel),
                        r.mode.clone(),
                        r.provider.clone(),
                        num(Some(r.p50), 4),
                        num(tflops, 1),
                    ]);
                } else if r.metric == "us"
                    || r.metric == "overhead_us"
                    || r.metric.starts_with("host_")
                {
                    table.row(vec![
                        format!("  {}", r.kernel),
                        r.metric.clone(),
                        r.provider.clone(),
                        format!("{:.2} us", r.p50),
                        "-".into(),
                    ]);
                }
            }
            if let Some(path) = &args.csv {
                csv::append(path, &rows, &run)?;
                csv_rows += rows.len();
            }
            Ok(())
        };

        for g in &gemms {
            table.title(format!("{} {}", g.name, g.label()));
            let sets = ROTATION_BYTES
                .div_ceil(g.bytes(e).max(1))
                .clamp(2, MAX_SETS);
            let max_hold = args.iters.max(args.warmup).max(1);
            let hold_bytes = args.hold_gib << 30;
            let hold_fwd = (hold_bytes / (g.m * g.n * e).max(1)).clamp(1, max_hold);
            let hold_full = (hold_bytes / (2 * g.bytes(e)).max(1)).clamp(1, max_hold);
            let config = |extra: &str| format!("{base} gemm={} sets={sets} {extra}", g.name);
            let mut rows = Vec::new();
            let mut record = |kernel: &str,
                              provider: &str,
                              mode: &str,
                              result: Result<[f64; 3], String>,
                              products: f64,
                              config: String,
                              rows: &mut Vec<Row>| match result {
                Ok(t) => {
                    let ms = t.map(|s| s * 1e3);
                    let tf = [t[0], t[2], t[1]].map(|s| products * g.flops() / 1e12 / s);
                    for (metric, v) in [("ms", ms), ("TFLOP/s", tf)] {
                        rows.push(Row {
                            kernel: kernel.into(),
                            provider: provider.into(),
                            mode: mode.into(),
                            metric: metric.into(),
                            x: g.label(),
                            p50: v[0],
                            p20: v[1],
                            p80: v[2],
                            config: format!("{config} flops={:.4e}", products * g.flops()),
                        });
                    }
                }
                Err(msg) => {
                    failures += 1;
                    eprintln!("{} {kernel} {mode} {provider} FAILED: {msg}", g.label());
                }
            };

            // Liger<B> against B, forward and autodiff.
            let xs: Vec<Tensor<B, 2>> = (0..sets)
                .map(|_| random(&ctx.device, [g.m, g.k], dtype))
                .collect();
            let ws: Vec<Tensor<B, 2>> = (0..sets)
                .map(|_| random(&ctx.device, [g.k, g.n], dtype))
                .collect();
            ctx.sync();
            let sync = || ctx.sync();
            let submit = || B::submit_queued(&ctx.device);
            let time = |hold: usize, step: &mut dyn FnMut(usize) -> Box<dyn std::any::Any>| {
                catch_unwind(AssertUnwindSafe(|| {
                    let before = matmul_counts().vendor;
                    let samples = measure::time(timing, hold, &sync, &submit, step).wall;
                    sync();
                    let iterations = timing.warmup + timing.iters.max(1) * timing.repeats.max(1);
                    Measured {
                        samples,
                        vendor_per_iter: (matmul_counts().vendor - before) as f64
                            / iterations as f64,
                    }
                }))
                .map_err(|p| crate::device::payload_text(p.as_ref()))
            };
            let liger_fwd = time(hold_fwd, &mut |i| {
                let k = i % sets;
                Box::new(lift::<B, Liger<B>>(&xs[k]).matmul(lift::<B, Liger<B>>(&ws[k])))
            });
            let burn_fwd = time(hold_fwd, &mut |i| {
                let k = i % sets;
                Box::new(xs[k].clone().matmul(ws[k].clone()))
            });
            let liger_full = time(hold_full, &mut |i| {
                let k = i % sets;
                let x = lift::<B, Liger<Autodiff<B>>>(&xs[k]).require_grad();
                let w = lift::<B, Liger<Autodiff<B>>>(&ws[k]).require_grad();
                let y = x.matmul(w);
                Box::new((y.clone(), y.backward()))
            });
            let burn_full = time(hold_full, &mut |i| {
                let k = i % sets;
                let x = Tensor::<Autodiff<B>, 2>::from_inner(xs[k].clone()).require_grad();
                let w = Tensor::<Autodiff<B>, 2>::from_inner(ws[k].clone()).require_grad();
                let y = x.matmul(w);
                Box::new((y.clone(), y.backward()))
            });
            drop((xs, ws));
            for (provider, fwd, full, hold) in [
                ("liger", liger_fwd, liger_full, (hold_fwd, hold_full)),
                ("burn", burn_fwd, burn_full, (hold_fwd, hold_full)),
            ] {
                let note = |m: &Result<Measured, String>, hold: usize| {
                    config(&format!(
                        "backend=fusion hold={hold} vendor_products_per_iter={}",
                        m.as_ref().map_or(f64::NAN, |m| m.vendor_per_iter)
                    ))
                };
                let q = |m: &Result<Measured, String>| {
                    m.as_ref()
                        .map(|m| m.samples.p50_20_80())
                        .map_err(|e| e.clone())
                };
                record(
                    "matmul",
                    provider,
                    "forward",
                    q(&fwd),
                    1.0,
                    note(&fwd, hold.0),
                    &mut rows,
                );
                record(
                    "matmul",
                    provider,
                    "full",
                    q(&full),
                    3.0,
                    note(&full, hold.1),
                    &mut rows,
                );
                if let (Ok(f), Ok(u)) = (&fwd, &full) {
                    let diffs: Vec<f64> = u
                        .samples
                        .0
                        .iter()
                        .flat_map(|a| f.samples.0.iter().map(move |b| a - b))
                        .collect();
                    let t = [0.5, 0.2, 0.8].map(|p| measure::quantile(&diffs, p));
                    record(
                        "matmul",
                        provider,
                        "backward",
                        Ok(t),
                        2.0,
                        config("backend=fusion derived=full-forward grad=ones(y.backward)"),
                        &mut rows,
                    );
                }
            }

            #[cfg(feature = "cuda")]
            if ctx.kind == crate::device::DeviceKind::Cuda {
                cuda::products(
                    g,
                    dtype,
                    sets,
                    timing,
                    hold_fwd,
                    &config,
                    &mut |kernel, provider, mode, result, c| {
                        record(kernel, provider, mode, result, 1.0, c, &mut rows)
                    },
                );
                cuda::gradient_pair(
                    g,
                    dtype,
                    sets,
                    timing,
                    hold_fwd,
                    &config,
                    &mut |kernel, provider, mode, result, c| {
                        record(kernel, provider, mode, result, 2.0, c, &mut rows)
                    },
                );
            }
            emit(rows, &mut table)?;
        }

        #[cfg(feature = "cuda")]
        if ctx.kind == crate::device::DeviceKind::Cuda {
            table.title("per-call cost of the ordering: 64x64x64".to_string());
            let rows = cuda::overhead(dtype, timing, &base);
            emit(rows, &mut table)?;
        }

        print!("{}", table.render());
        if let Some(path) = &args.csv {
            println!("csv: {csv_rows} rows appended to {}", path.display());
        }
        Ok(if failures > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}

fn random<BB: Backend>(device: &BB::Device, shape: [usize; 2], dtype: DType) -> Tensor<BB, 2> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), (device, dtype))
}

/// The same buffer as a tensor of another backend with `B`'s primitives (`Liger<B>`,
/// `Liger<Autodiff<B>>` through `Autodiff`'s leaf).
fn lift<B: FusedOps, T: LiftFrom<B>>(x: &Tensor<B, 2>) -> Tensor<T, 2> {
    T::lift(x.clone())
}

/// Tensors of `B` as tensors of a wrapper of `B`.
trait LiftFrom<B: Backend>: Backend {
    fn lift(x: Tensor<B, 2>) -> Tensor<Self, 2>;
}

impl<B: FusedOps> LiftFrom<B> for Liger<B> {
    fn lift(x: Tensor<B, 2>) -> Tensor<Self, 2> {
        Tensor::from_primitive(TensorPrimitive::Float(x.into_primitive().tensor()))
    }
}

impl<B: FusedOps> LiftFrom<B> for Liger<Autodiff<B>> {
    fn lift(x: Tensor<B, 2>) -> Tensor<Self, 2> {
        let ad = Tensor::<Autodiff<B>, 2>::from_inner(x);
        Tensor::from_primitive(TensorPrimitive::Float(ad.into_primitive().tensor()))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    //! The CUDA-only measurements, on the plain CubeCL backend (no fusion): each product
    //! alone with each ordering protocol, and the per-call cost of the ordering.
    use super::{Gemm, random};
    use crate::csv::Row;
    use crate::measure::{self, Timing};
    use burn::backend::cuda::CudaDevice;
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Tensor, TensorPrimitive};
    use cubecl::cuda::CudaRuntime;
    use liger_burn::cube::cublaslt::{MatmulOrdering, host_times};
    use liger_burn::cube::{cublaslt_matmul, cublaslt_repeated_products};
    use liger_burn::ops::FusedOps;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    type Plain = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;

    fn provider(ordering: MatmulOrdering) -> String {
        format!("liger-{}", ordering.name())
    }

    /// The orderings this device runs (the others would only fail, case after case).
    fn available_orderings(device: &CudaDevice) -> Vec<MatmulOrdering> {
        let support = liger_burn::cube::cublaslt::device_support(device);
        MatmulOrdering::ALL
            .into_iter()
            .filter(|&o| support.as_ref().is_ok_and(|s| s.lacks(o).is_none()))
            .collect()
    }

    /// The device's default ordering (the `liger` rows) and why any other is unavailable.
    pub(super) fn orderings_summary() -> String {
        match liger_burn::cube::cublaslt::device_support(&CudaDevice::default()) {
            Err(why) => format!("none ({why})"),
            Ok(s) => {
                let mut line = format!("{} (the liger rows)", s.default_ordering.name());
                for ordering in MatmulOrdering::ALL {
                    if let Some(why) = s.lacks(ordering) {
                        line.push_str(&format!("; no {}: {why}", ordering.name()));
                    }
                }
                line
            }
        }
    }

    /// `a · b` with liger's cuBLASLt path and `ordering`, or Burn's matmul (`None`).
    fn product(
        a: &Tensor<Plain, 2>,
        b: &Tensor<Plain, 2>,
        ordering: Option<MatmulOrdering>,
    ) -> Tensor<Plain, 2> {
        match ordering {
            Some(o) => {
                let out = cublaslt_matmul(
                    a.clone().into_primitive().tensor(),
                    b.clone().into_primitive().tensor(),
                    Some(o),
                )
                .unwrap_or_else(|why| panic!("cuBLASLt ({}): {why}", o.name()));
                Tensor::from_primitive(TensorPrimitive::Float(out))
            }
            None => a.clone().matmul(b.clone()),
        }
    }

    /// `sets` random `x [m, k]`, `w [k, n]` and `g [m, n]` of `gemm`, synchronized.
    #[allow(clippy::type_complexity)]
    fn operand_sets(
        gemm: &Gemm,
        dtype: DType,
        sets: usize,
        device: &CudaDevice,
    ) -> (
        Vec<Tensor<Plain, 2>>,
        Vec<Tensor<Plain, 2>>,
        Vec<Tensor<Plain, 2>>,
    ) {
        let (m, k, n) = (gemm.m, gemm.k, gemm.n);
        let set = |shape: [usize; 2]| (0..sets).map(|_| random(device, shape, dtype)).collect();
        let operands = (set([m, k]), set([k, n]), set([m, n]));
        Plain::sync(device).expect("CUDA synchronization");
        operands
    }

    /// Each product of `g` alone: `x·w`, `g·wᵀ`, `xᵀ·g` (transposes are views).
    #[allow(clippy::type_complexity)]
    pub(super) fn products(
        gemm: &Gemm,
        dtype: DType,
        sets: usize,
        timing: Timing,
        hold: usize,
        config: &dyn Fn(&str) -> String,
        record: &mut dyn FnMut(&str, &str, &str, Result<[f64; 3], String>, String),
    ) {
        let device = CudaDevice::default();
        let (xs, ws, gs) = operand_sets(gemm, dtype, sets, &device);
        let sync = || Plain::sync(&device).expect("CUDA synchronization");
        let submit = || Plain::submit_queued(&device);
        type Pick = fn(
            &[Tensor<Plain, 2>],
            &[Tensor<Plain, 2>],
            &[Tensor<Plain, 2>],
            usize,
        ) -> (Tensor<Plain, 2>, Tensor<Plain, 2>);
        let cases: [(&str, &str, &str, Pick); 3] = [
            ("matmul", "forward", "x·w", |x, w, _, k| {
                (x[k].clone(), w[k].clone())
            }),
            ("matmul_grad_lhs", "backward", "g·wᵀ", |_, w, g, k| {
                (g[k].clone(), w[k].clone().transpose())
            }),
            ("matmul_grad_rhs", "backward", "xᵀ·g", |x, _, g, k| {
                (x[k].clone().transpose(), g[k].clone())
            }),
        ];
        for (kernel, mode, what, pick) in cases {
            let providers = available_orderings(&device)
                .into_iter()
                .map(|o| (provider(o), Some(o)))
                .chain([("burn".to_string(), None)]);
            for (name, ordering) in providers {
                let timed = catch_unwind(AssertUnwindSafe(|| {
                    measure::time(timing, hold, &sync, &submit, |i| {
                        let (a, b) = pick(&xs, &ws, &gs, i % sets);
                        product(&a, &b, ordering)
                    })
                }))
                .map_err(|p| crate::device::payload_text(p.as_ref()));
                sync();
                // The calling thread's time per call (p50), beside the wall time per call.
                let caller_us = timed
                    .as_ref()
                    .map_or(f64::NAN, |t| t.host.p50_20_80()[0] * 1e6);
                record(
                    kernel,
                    &name,
                    mode,
                    timed.map(|t| t.wall.p50_20_80()),
                    config(&format!(
                        "backend=plain-cube product={what} hold={hold} caller_us={caller_us:.2}"
                    )),
                );
            }
        }
    }

    /// Both gradients of `x·w` from `g` on the device's default ordering: as one
    /// `fused_matmul_backward` call (one chain of two products under one ordering,
    /// provider `liger-pair`) and as two `fused_matmul` calls (`liger-separate`); kernel
    /// `matmul_grads`, mode `backward`.
    #[allow(clippy::type_complexity)]
    pub(super) fn gradient_pair(
        gemm: &Gemm,
        dtype: DType,
        sets: usize,
        timing: Timing,
        hold: usize,
        config: &dyn Fn(&str) -> String,
        record: &mut dyn FnMut(&str, &str, &str, Result<[f64; 3], String>, String),
    ) {
        let device = CudaDevice::default();
        let (xs, ws, gs) = operand_sets(gemm, dtype, sets, &device);
        let sync = || Plain::sync(&device).expect("CUDA synchronization");
        let submit = || Plain::submit_queued(&device);
        let prim = |t: &Tensor<Plain, 2>| t.clone().into_primitive().tensor();
        for (name, paired) in [("liger-pair", true), ("liger-separate", false)] {
            let result = catch_unwind(AssertUnwindSafe(|| {
                measure::time(timing, hold, &sync, &submit, |i| {
                    let k = i % sets;
                    let (x, w, g) = (prim(&xs[k]), prim(&ws[k]), prim(&gs[k]));
                    if paired {
                        Plain::fused_matmul_backward(x, w, g)
                    } else {
                        liger_burn::ops::compose::matmul_backward::<Plain>(x, w, g)
                    }
                })
                .wall
                .p50_20_80()
            }))
            .map_err(|p| crate::device::payload_text(p.as_ref()));
            sync();
            record(
                "matmul_grads",
                name,
                "backward",
                result,
                config(&format!(
                    "backend=plain-cube products=g·wᵀ,xᵀ·g hold={hold}"
                )),
            );
        }
    }

    /// Per-call cost of many tiny products with each ordering, Burn's matmul, and the
    /// unordered baseline; rows of `us` per call and `overhead_us` (minus the baseline).
    pub(super) fn overhead(dtype: DType, timing: Timing, base: &str) -> Vec<Row> {
        const SIZE: usize = 64;
        let device = CudaDevice::default();
        let x: Tensor<Plain, 2> = random(&device, [SIZE, SIZE], dtype);
        let w: Tensor<Plain, 2> = random(&device, [SIZE, SIZE], dtype);
        let sync = || Plain::sync(&device).expect("CUDA synchronization");
        let submit = || Plain::submit_queued(&device);
        // Enough calls per sample that the synchronization at its end is amortized.
        let calls = timing.iters.max(1000);
        let tiny = Timing {
            warmup: timing.warmup.max(100),
            iters: calls,
            repeats: timing.repeats,
        };
        let config = format!(
            "{base} backend=plain-cube calls_per_sample={calls} metric=wall time per call, outputs held until the sample's end"
        );
        let label = format!("{SIZE}x{SIZE}x{SIZE}");
        let row = |provider: &str, metric: &str, us: [f64; 3], note: &str| Row {
            kernel: "matmul_call".into(),
            provider: provider.into(),
            mode: "forward".into(),
            metric: metric.into(),
            x: label.clone(),
            p50: us[0],
            p20: us[1],
            p80: us[2],
            config: format!("{config} {note}"),
        };
        let mut rows = Vec::new();
        let baseline: Vec<f64> = (0..timing.repeats.max(1))
            .map(|_| {
                cublaslt_repeated_products(
                    x.clone().into_primitive().tensor(),
                    w.clone().into_primitive().tensor(),
                    calls,
                )
                .unwrap_or_else(|why| panic!("cuBLASLt: {why}"))
            })
            .collect();
        let base_q = measure::Samples(baseline).p50_20_80().map(|s| s * 1e6);
        rows.push(row(
            "cublaslt-unordered",
            "us",
            base_q,
            "products back to back between one host synchronization before and one after",
        ));
        for ordering in available_orderings(&device)
            .into_iter()
            .map(Some)
            .chain([None])
        {
            let name = ordering.map_or("burn".to_string(), provider);
            let host_before = host_times(&device).ok();
            let timed = measure::time(tiny, calls, &sync, &submit, |_| product(&x, &w, ordering));
            let host = host_times(&device)
                .ok()
                .zip(host_before)
                .map(|(after, before)| after.since(&before));
            let q = timed.wall.p50_20_80().map(|s| s * 1e6);
            rows.push(row(&name, "us", q, ""));
            // The calling thread's own time per call: against `us` and the device thread's
            // `host_task_us` it tells which thread a product timed alone waits for.
            rows.push(row(
                &name,
                "caller_us",
                timed.host.p50_20_80().map(|s| s * 1e6),
                "calling thread's time inside the call, per call",
            ));
            if ordering.is_some() {
                rows.push(row(
                    &name,
                    "overhead_us",
                    [q[0] - base_q[0], q[1] - base_q[0], q[2] - base_q[0]],
                    "minus cublaslt-unordered's p50",
                ));
            }
            // Where the device thread's time per product goes (all samples together).
            if let Some(h) = host.filter(|h| h.products > 0) {
                let per = |seconds: f64| seconds * 1e6 / h.products as f64;
                for (metric, seconds) in [
                    ("host_task_us", h.task),
                    ("host_prepare_us", h.prepare),
                    ("host_publish_us", h.publish),
                    ("host_vendor_us", h.vendor),
                    ("host_await_us", h.await_kernel),
                ] {
                    let us = per(seconds);
                    rows.push(row(
                        &name,
                        metric,
                        [us, us, us],
                        &format!(
                            "device thread's host time per product over {} products (mean; the task's includes the others)",
                            h.products
                        ),
                    ));
                }
            }
        }
        rows
    }
}
