//! `liger converge`: the convergence comparison of `tests/convergence.rs` on any device
//! and dtype. Each selected mini model is trained twice from the same seeded parameters
//! on the same token batches (`crate::convergence`): every kernel off on
//! `Autodiff<B>`, then every kernel on on `Liger<Autodiff<B>>`; per-step losses and final
//! parameters are compared within the dtype's tolerances (or the ones given).
//!
//! Prints one table per model (each step's losses, difference and allowance) and the
//! worst entries; exits 1 when a model's runs disagree, its loss did not fall, or a run
//! panicked. With `--control`, a third run (stock again, each batch's sequences
//! reversed) measures the stock path's own rounding noise, and parameter differences no
//! larger than that noise are not counted against liger. With `--gradient-check`, every
//! batch's gradients (liger on and off in the run's dtype, stock in f32) are compared at
//! the start and at the end; that check then decides the verdict.

use crate::args::ConvergeArgs;
use crate::conformance::Rng;
use crate::conformance::linear_cross_entropy::{f32_matmul_error, is_reduced_precision};
use crate::convergence::{
    ConvergenceReport, ConvergenceSetup, NamedParam, ReferenceCheck, Tolerances, TrainRun,
    check_against_precise, compare, initial_params, train_liger_off, train_liger_on,
};
use crate::device::{self, Ctx, OnDevice, payload_text};
use crate::gradient_check::{
    GradientCheck, GradientTriple, OutlierGradient, gradient_triple, liger_gradients,
    outlier_gradients, single_switches, unseen_tokens,
};
use crate::table::{Align, Table, sci};
use anyhow::{Result, bail};
use clap::ValueEnum;
use liger_burn::ops::FusedOps;
use liger_models::ModelType;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// A `--models` value: the mini model of an architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MiniModel {
    /// Llama (llama3 RoPE scaling).
    Llama,
    /// Qwen2 (q/k/v biases, tied embeddings).
    Qwen2,
    /// Qwen3 (per-head q/k RMSNorm, head_dim 24).
    Qwen3,
    /// Mistral (sliding window 4).
    Mistral,
}

impl MiniModel {
    fn model_type(self) -> ModelType {
        match self {
            MiniModel::Llama => ModelType::Llama,
            MiniModel::Qwen2 => ModelType::Qwen2,
            MiniModel::Qwen3 => ModelType::Qwen3,
            MiniModel::Mistral => ModelType::Mistral,
        }
    }
}

/// The smallest loss drop (first pass over the batches minus the last) that counts as
/// "the loss fell": from ln(1031) ≈ 6.94 the mini models reach ~4.6 in 32 steps at lr
/// 2e-3; below this the comparison says nothing about training.
const MIN_LOSS_DROP: f64 = 0.5;

/// Runs `liger converge`.
pub fn run(args: ConvergeArgs) -> Result<ExitCode> {
    if args.steps == 0 || args.batch_size == 0 || args.seq_len < 2 {
        bail!("--steps and --batch-size must be at least 1, --seq-len at least 2");
    }
    if !(args.lr > 0.0) {
        bail!("--lr must be positive");
    }
    if args.f32_reference && args.dtype.dtype() == burn::tensor::DType::F32 {
        bail!("--f32-reference checks a bf16 or f16 run: add --dtype bf16");
    }
    if args.gradient_check && args.dtype.dtype() == burn::tensor::DType::F32 {
        bail!("--gradient-check compares a bf16 or f16 run's gradients with f32: add --dtype bf16");
    }
    if args.control && args.control_jitter {
        bail!("--control and --control-jitter each pick the control run: give one");
    }
    if args.control && args.batch_size < 2 {
        bail!("--control reverses each batch's sequences: it needs --batch-size 2 or more");
    }
    device::dispatch(args.device, Converge(args))
}

struct Converge(ConvergeArgs);

impl Converge {
    /// The setup of `model`: the mini model with the flags applied.
    fn setup(&self, model: MiniModel) -> ConvergenceSetup {
        let a = &self.0;
        let mut s = ConvergenceSetup::mini(model.model_type(), a.dtype.dtype());
        s.seed = a.seed;
        s.steps = a.steps;
        s.lr = a.lr;
        s.batch_size = a.batch_size;
        s.seq_len = a.seq_len;
        s.prompt_len = s.prompt_len.min(a.seq_len - 1);
        s
    }

    /// The dtype's tolerances with the flags' overrides. `reduced_matmul`: the device's
    /// f32 matmul was measured at reduced precision (TF32), which puts f16-level rounding
    /// (10 mantissa bits) in every product of both runs, so the half-precision tolerances
    /// apply to f32 too.
    fn tolerances(&self, reduced_matmul: bool) -> Tolerances {
        let a = &self.0;
        let mut t = if reduced_matmul {
            Tolerances::half()
        } else {
            Tolerances::for_dtype(a.dtype.dtype())
        };
        t.loss_atol = a.loss_atol.unwrap_or(t.loss_atol);
        t.loss_rtol = a.loss_rtol.unwrap_or(t.loss_rtol);
        t.param_atol = a.param_atol.unwrap_or(t.param_atol);
        t.param_rtol = a.param_rtol.unwrap_or(t.param_rtol);
        t
    }
}

impl OnDevice for Converge {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        ctx.describe(None);
        let a = &self.0;
        if let Some(code) = device::require_dtype::<B>(
            &ctx.device,
            a.dtype.dtype(),
            a.dtype,
            "train",
            " (try --dtype f32)",
        ) {
            return Ok(code);
        }
        let path = a.reduction.paths()[0];
        let _geometry = liger_burn::test_hooks::override_launch_config(
            liger_cubecl_kernels::LaunchConfig::default().with_reduction(path),
        );
        println!(
            "runs:      liger off = Autodiff<B> + LigerConfig::none(); liger on = Liger<Autodiff<B>> + LigerConfig::all() (reduction path {path:?})"
        );
        let mut models = a.models.clone();
        models.dedup();
        let mut failed = Vec::new();
        for &model in &models {
            let setup = self.setup(model);
            let c = &setup.model;
            println!(
                "\n{}: vocab {}, hidden {}, {} layers, {}/{} heads of {}; {} AdamW steps, lr {:e}, \
                 {} batches of {}x{} tokens, seed {}, {}",
                setup.name,
                c.vocab_size,
                c.hidden_size,
                c.num_hidden_layers,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                setup.steps,
                setup.lr,
                setup.batches,
                setup.batch_size,
                setup.seq_len,
                setup.seed,
                a.dtype
            );
            // Both runs use the backend's matmul: probe its f32 precision at this model's
            // products (Burn's CUDA f32 matmul is TF32 on tensor cores at some shapes).
            let reduced_matmul = a.dtype.dtype() == burn::tensor::DType::F32 && {
                let rows = setup.batch_size * setup.seq_len;
                let mut rng = Rng::new(setup.seed);
                let err = [c.vocab_size, c.intermediate_size, c.hidden_size]
                    .into_iter()
                    .map(|v| f32_matmul_error::<B>((rows, c.hidden_size, v), &ctx.device, &mut rng))
                    .fold(0.0, f64::max);
                let reduced = is_reduced_precision(err);
                if reduced {
                    println!(
                        "matmul:    the device's f32 matmul is reduced precision here (norm-wise \
                         error {err:.1e} against f64, TF32): half-precision tolerances apply"
                    );
                }
                reduced
            };
            let tol = self.tolerances(reduced_matmul);
            println!(
                "tolerance: |on - off| <= atol + rtol*|off|; loss atol {:.0e} rtol {:.0e}, \
                 params atol {:.0e} rtol {:.0e}",
                tol.loss_atol, tol.loss_rtol, tol.param_atol, tol.param_rtol
            );
            let off = guarded_value(|| train_liger_off::<B>(&setup, &ctx.device));
            let on = guarded_value(|| train_liger_on::<B>(&setup, &ctx.device));
            let (off, on) = match (off, on) {
                (Ok(off), Ok(on)) => (off, on),
                (off, on) => {
                    for (name, r) in [("liger off", off), ("liger on", on)] {
                        if let Err(msg) = r {
                            println!("  {name} FAILED: {}", msg.lines().next().unwrap_or(""));
                        }
                    }
                    failed.push(format!("{}: a run failed", setup.name));
                    continue;
                }
            };
            let report = compare(&off, &on, &tol);
            // The control: stock again, summing over each batch in another order.
            // Or stock again from a start one rounding away (`--control-jitter`).
            let control = (a.control || a.control_jitter).then(|| {
                let mut reordered = setup.clone();
                reordered.reverse_rows = a.control;
                reordered.jitter_start = a.control_jitter;
                guarded_value(|| train_liger_off::<B>(&reordered, &ctx.device))
                    .map(|off2| compare(&off, &off2, &tol))
            });
            // The f32 run: stock, from the low-precision run's exact start.
            let precise = a.f32_reference.then(|| {
                let mut f32_setup = setup.clone();
                f32_setup.init_rounding = Some(setup.dtype);
                f32_setup.dtype = burn::tensor::DType::F32;
                guarded_value(|| train_liger_off::<B>(&f32_setup, &ctx.device))
                    .map(|precise| check_against_precise(&off, &on, &precise, &tol))
            });
            print!("{}", step_table(&report));
            // Not a speed comparison: the first run of the process compiles the kernels.
            println!(
                "time: off {:.1}s, on {:.1}s (training loops, kernel compilation included)",
                off.seconds, on.seconds
            );
            print!("{report}");
            let drops = (off.loss_drop(setup.batches), on.loss_drop(setup.batches));
            println!(
                "loss drop (first pass over the batches - last): off {:.4}, on {:.4}",
                drops.0, drops.1
            );
            // Some(whether liger's gradients were as accurate as stock's at both points).
            let gradients_ok = a
                .gradient_check
                .then(|| check_gradients::<B>(&setup, &off, &on, &tol, &ctx.device, &mut failed));
            let control_passed = match &control {
                None => report.passed(),
                Some(Err(msg)) => {
                    println!("control FAILED: {}", msg.lines().next().unwrap_or(""));
                    failed.push(format!("{}: the control run failed", setup.name));
                    report.passed()
                }
                Some(Ok(control)) => {
                    println!(
                        "control (stock vs stock {}): {}",
                        if a.control {
                            "with each batch's sequences reversed"
                        } else {
                            "from a start one ulp (of the dtype) away"
                        },
                        control.to_string().trim_end()
                    );
                    print!("{}", noise_table(&report, control));
                    verdict(
                        "the control",
                        "BEYOND NOISE",
                        "every difference within tolerance or within the stock path's own noise",
                        &report.failures_beyond_noise(control),
                    )
                }
            };
            let passed = match &precise {
                None => control_passed,
                Some(Err(msg)) => {
                    println!("f32 run FAILED: {}", msg.lines().next().unwrap_or(""));
                    failed.push(format!("{}: the f32 reference run failed", setup.name));
                    report.passed()
                }
                Some(Ok(checks)) => {
                    print!("{}", precise_table(checks));
                    verdict(
                        "the f32 run",
                        "FARTHER FROM F32",
                        "every difference within tolerance, or liger the closer run to f32 there",
                        &report.failures_beyond_reference(checks),
                    )
                }
            };
            // The gradient check, when asked, decides (see `failures_beyond_gradients`),
            // with the parameters bounded by stock's own drift when --control-jitter
            // measured it, and not judged otherwise.
            let passed = match gradients_ok {
                None => passed,
                Some(ok) => {
                    let drift = match &control {
                        Some(Ok(c)) if a.control_jitter => Some(c),
                        _ => None,
                    };
                    if drift.is_none() {
                        println!(
                            "parameters: NOT JUDGED: only the losses and the gradient check decide \
                             (--control-jitter bounds the parameter differences by stock's own drift)"
                        );
                    }
                    verdict(
                        "the gradient check",
                        "NOT EXCUSED",
                        if drift.is_some() {
                            "every difference within tolerance, or no larger than stock's own drift \
                             from a start one rounding away, with liger's gradients as accurate as stock's"
                        } else {
                            "every loss within tolerance and liger's gradients as accurate as stock's"
                        },
                        &report.failures_beyond_gradients(ok, drift),
                    )
                }
            };
            if !passed {
                failed.push(format!("{}: liger on differs from liger off", setup.name));
            }
            if !(drops.0 > MIN_LOSS_DROP && drops.1 > MIN_LOSS_DROP) {
                failed.push(format!(
                    "{}: the loss did not fall by {MIN_LOSS_DROP} (off {:.4}, on {:.4})",
                    setup.name, drops.0, drops.1
                ));
            }
        }
        println!();
        if failed.is_empty() {
            println!("converge: {} model(s) agree", models.len());
            Ok(ExitCode::SUCCESS)
        } else {
            for f in &failed {
                println!("FAILED {f}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// `--gradient-check` for one model: prints each point's gradient table (and where a
/// gradient is less accurate, the one-switch attribution; at the end, the elements out of
/// tolerance with their gradients), pushes what failed to `failed`, and returns whether
/// liger's gradients were as accurate as stock's at the start and at the end.
fn check_gradients<B: FusedOps>(
    setup: &ConvergenceSetup,
    off: &TrainRun,
    on: &TrainRun,
    tol: &Tolerances,
    device: &B::Device,
    failed: &mut Vec<String>,
) -> bool {
    let mut ok = true;
    let unseen = unseen_tokens(setup);
    let points: [(&str, bool, Result<Vec<NamedParam>, String>); 2] = [
        (
            "at the start",
            false,
            guarded_value(|| initial_params::<B>(setup, device)),
        ),
        (
            "at liger off's final parameters",
            true,
            Ok(off.params.clone()),
        ),
    ];
    for (when, at_end, params) in points {
        let result = params.and_then(|params| {
            guarded_value(|| {
                let triple = gradient_triple::<B>(setup, &params, device);
                let check = GradientCheck::new(&triple, &unseen, setup.dtype);
                // Which kernel a less accurate gradient comes from: each switch alone
                // against the same stock and f32 gradients.
                let attribution = (!check.failures().is_empty()).then(|| {
                    single_switches()
                        .into_iter()
                        .map(|(name, switches)| {
                            let one = GradientTriple {
                                liger: liger_gradients::<B>(setup, switches, &params, device),
                                stock: triple.stock.clone(),
                                precise: triple.precise.clone(),
                            };
                            (name, GradientCheck::new(&one, &unseen, setup.dtype))
                        })
                        .collect::<Vec<_>>()
                });
                // At the end: the gradients where the runs' parameters differ beyond
                // tolerance.
                let outliers =
                    at_end.then(|| outlier_gradients(&off.params, &on.params, tol, &triple, 12));
                (check, attribution, outliers)
            })
        });
        let (check, attribution, outliers) = match result {
            Ok(r) => r,
            Err(msg) => {
                println!(
                    "gradient check {when} FAILED: {}",
                    msg.lines().next().unwrap_or("")
                );
                failed.push(format!(
                    "{}: the gradient check {when} failed to run",
                    setup.name
                ));
                ok = false;
                continue;
            }
        };
        print!("{}", gradient_table(when, &check));
        if let Some(outliers) = outliers.filter(|o| !o.is_empty()) {
            print!("{}", outlier_table(&outliers));
        }
        if let Some(attribution) = &attribution {
            print!("{}", attribution_table(attribution));
        }
        let worse = check.failures();
        for e in &worse {
            println!(
                "  LESS ACCURATE {}: liger {:.3e} > allowed {:.3e} (stock {:.3e})",
                e.name, e.liger, e.allowed, e.stock
            );
        }
        if worse.is_empty() {
            println!(
                "gradient check {when}: liger's gradients as accurate as stock's \
                 ({} entries within max(1.5x stock, 2u))",
                check.errors.len()
            );
        } else {
            failed.push(format!(
                "{}: {} gradient(s) {when} less accurate than stock's",
                setup.name,
                worse.len()
            ));
            ok = false;
        }
    }
    ok
}

/// Runs `f`, turning a panic into its message.
fn guarded_value<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| payload_text(p.as_ref()))
}

/// Each parameter's normwise gradient error against the f32 gradient, stock and liger.
fn gradient_table(when: &str, check: &GradientCheck) -> String {
    let mut table = Table::new(&[
        ("gradient", Align::Left),
        ("|g f32|", Align::Right),
        ("stock err", Align::Right),
        ("liger err", Align::Right),
        ("allowed", Align::Right),
        ("", Align::Left),
    ]);
    for e in &check.errors {
        table.row(vec![
            e.name.clone(),
            sci(e.norm),
            sci(e.stock),
            sci(e.liger),
            sci(e.allowed),
            if e.passed() { "" } else { "WORSE" }.into(),
        ]);
    }
    format!(
        "gradients of every batch {when} (normwise error against stock f32 at the same parameters, pooled over the batches):\n{}",
        table.render()
    )
}

/// The elements whose final parameters differ beyond tolerance, with their gradient (one
/// pass over the batches) at liger off's final parameters: f32, its size against the
/// tensor's, and both half-precision errors.
fn outlier_table(outliers: &[OutlierGradient]) -> String {
    let mut table = Table::new(&[
        ("element out of tolerance", Align::Left),
        ("|param diff|", Align::Right),
        ("g f32", Align::Right),
        ("|g f32| / rms", Align::Right),
        ("stock err", Align::Right),
        ("liger err", Align::Right),
    ]);
    for o in outliers {
        table.row(vec![
            format!("{}[{}]", o.name, o.index),
            sci(o.param_diff),
            sci(o.precise),
            format!("{:.3}", o.precise.abs() / o.tensor_rms),
            sci(o.stock_error),
            sci(o.liger_error),
        ]);
    }
    format!(
        "their gradients there (summed over the batches; rms = the tensor's f32 gradient rms):\n{}",
        table.render()
    )
}

/// One row per single switch: how many gradients are less accurate than allowed with
/// only that kernel fused, and the worst ratio of its error to stock's.
fn attribution_table(rows: &[(&str, GradientCheck)]) -> String {
    let mut table = Table::new(&[
        ("fused alone", Align::Left),
        ("less accurate", Align::Right),
        ("max liger/stock", Align::Right),
        ("at", Align::Left),
    ]);
    for (name, check) in rows {
        let worst = check
            .errors
            .iter()
            .max_by(|a, b| (a.liger / a.stock).total_cmp(&(b.liger / b.stock)));
        table.row(vec![
            name.to_string(),
            format!("{} of {}", check.failures().len(), check.errors.len()),
            worst.map_or("-".into(), |w| format!("{:.2}", w.liger / w.stock)),
            worst.map_or(String::new(), |w| w.name.clone()),
        ]);
    }
    format!(
        "the same gradients with one switch at a time:\n{}",
        table.render()
    )
}

/// Prints what still fails after an extra run (`marker` before each) and the verdict
/// with it; returns whether nothing is left.
fn verdict(with: &str, marker: &str, agree_because: &str, left: &[String]) -> bool {
    for f in left {
        println!("  {marker} {f}");
    }
    if left.is_empty() {
        println!("verdict with {with}: AGREE ({agree_because})");
    } else {
        println!("verdict with {with}: DIFFER");
    }
    left.is_empty()
}

/// The parameter tensors with elements outside tolerance in either comparison: liger on
/// vs off beside stock vs reordered stock.
fn noise_table(report: &ConvergenceReport, control: &ConvergenceReport) -> String {
    let mut table = Table::new(&[
        ("tensor", Align::Left),
        ("on vs off: outside", Align::Right),
        ("max |diff|", Align::Right),
        ("stock vs stock: outside", Align::Right),
        ("max |diff|", Align::Right),
        ("", Align::Left),
    ]);
    let mut any = false;
    for t in &report.tensors {
        let c = control.tensors.iter().find(|c| c.name == t.name);
        let c_outside = c.map_or(0, |c| c.outside);
        if t.outside == 0 && c_outside == 0 {
            continue;
        }
        any = true;
        let c_max = c.map_or(f64::NAN, |c| c.max_abs);
        table.row(vec![
            t.name.clone(),
            format!("{} of {}", t.outside, t.len),
            sci(t.max_abs),
            format!("{c_outside} of {}", t.len),
            sci(c_max),
            if t.outside > 0 && !(t.max_abs <= c_max) {
                "beyond noise"
            } else {
                ""
            }
            .into(),
        ]);
    }
    if any {
        table.render()
    } else {
        "  no parameter element outside tolerance in either comparison\n".into()
    }
}

/// Where liger on and off disagree beyond tolerance: each element's values in both runs
/// and in the f32 run, and each tensor's largest distance to the f32 run.
fn precise_table(checks: &[ReferenceCheck]) -> String {
    if checks.is_empty() {
        return "f32 run: no parameter element outside tolerance to decide\n".into();
    }
    let mut table = Table::new(&[
        ("element outside tolerance", Align::Left),
        ("liger off", Align::Right),
        ("liger on", Align::Right),
        ("f32 run", Align::Right),
        ("|off - f32|", Align::Right),
        ("|on - f32|", Align::Right),
        ("closer", Align::Left),
    ]);
    for c in checks {
        for &(i, off, on, f32_value) in c.elements.iter().take(8) {
            let (d_off, d_on) = ((off - f32_value).abs(), (on - f32_value).abs());
            table.row(vec![
                format!("{}[{i}]", c.name),
                sci(off),
                sci(on),
                sci(f32_value),
                sci(d_off),
                sci(d_on),
                if d_on <= d_off { "on" } else { "off" }.into(),
            ]);
        }
        table.row(vec![
            format!("{} (max over {} elements)", c.name, c.elements.len()),
            String::new(),
            String::new(),
            String::new(),
            sci(c.reference_error),
            sci(c.candidate_error),
            if c.candidate_error <= c.reference_error {
                "on"
            } else {
                "off"
            }
            .into(),
        ]);
    }
    format!(
        "f32 run (stock, f32, same start) where liger on and off disagree:\n{}",
        table.render()
    )
}

/// One row per step: both losses, their difference, the allowance.
fn step_table(report: &ConvergenceReport) -> String {
    let mut table = Table::new(&[
        ("step", Align::Right),
        ("loss off", Align::Right),
        ("loss on", Align::Right),
        ("|diff|", Align::Right),
        ("allowed", Align::Right),
        ("", Align::Left),
    ]);
    for s in &report.steps {
        table.row(vec![
            s.step.to_string(),
            format!("{:.6}", s.reference),
            format!("{:.6}", s.candidate),
            sci(s.diff),
            sci(s.allowed),
            if s.diff <= s.allowed { "" } else { "FAIL" }.into(),
        ]);
    }
    table.render()
}
