//! `liger check`: the f64 conformance suite of liger-burn on one device and dtype.
//!
//! Runs [`crate::conformance::run_suite`] (through `Autodiff<B>`: outputs and every
//! gradient against the naive f64 reference, each element within an error bound derived
//! from the dtype's rounding), once per reduction path asked for, with the same seed for
//! each path, then prints one row per compared tensor: its largest absolute and relative
//! errors, and the largest error as a fraction of its element's bound (`err/bound`, above
//! 1 where it failed).

use crate::args::CheckArgs;
use crate::conformance::{self, CaseResult, Op, Rng};
use crate::device::{self, Ctx, OnDevice};
use crate::dtype::dtype_name;
use crate::table::{Align, Table, sci};
use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::override_launch_config;
use liger_cubecl_kernels::{LaunchConfig, ReductionPath};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// Runs `liger check`.
pub fn run(args: CheckArgs) -> Result<ExitCode> {
    device::dispatch(args.device, Check(args))
}

struct Check(CheckArgs);

/// The cases of one reduction path, and the panic that stopped it, if any.
struct PathRun {
    path: ReductionPath,
    cases: Vec<CaseResult>,
    panic: Option<String>,
}

impl OnDevice for Check {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let args = self.0;
        let dtype = args.dtype.dtype();
        let filter = args.op.as_deref();
        let ops: Vec<Op> = Op::ALL
            .into_iter()
            .filter(|op| conformance::selects(filter, op.name()))
            .collect();
        if ops.is_empty() {
            let names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
            bail!(
                "--op {:?} matches no op (ops: {})",
                filter.unwrap_or_default(),
                names.join(", ")
            );
        }

        ctx.describe(None);
        if let Some(code) = crate::device::require_dtype::<B>(
            &ctx.device,
            dtype,
            args.dtype,
            "check",
            " (try --dtype f32)",
        ) {
            return Ok(code);
        }
        let paths = match &ctx.cube {
            Some(_) => args.reduction.paths(),
            None => {
                if args.reduction != crate::args::ReductionArg::Auto {
                    println!("note: --reduction ignored on {} (no kernels)", ctx.kind);
                }
                vec![ReductionPath::Auto]
            }
        };
        let seed = args.seed.unwrap_or_else(|| Rng::from_env().seed());
        let sweep = if args.quick { "quick" } else { "full" };
        println!(
            "suite:     {sweep} sweep, ops: {}",
            ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
        );
        println!("seed:      {seed}");
        if let Some(elementwise) = &args.elementwise_geometry {
            println!("elementwise geometry: {}", elementwise.text);
        }

        let per_path: usize = ops
            .iter()
            .map(|&op| conformance::shapes(op, args.quick).len())
            .sum();
        let pb = ProgressBar::new((per_path * paths.len()) as u64);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} cases  {msg}",
            )
            .expect("progress template"),
        );

        let mut runs = Vec::new();
        for &path in &paths {
            let mut geometry = LaunchConfig::default().with_reduction(path);
            if let Some(elementwise) = &args.elementwise_geometry {
                elementwise.apply(&mut geometry.elementwise);
            }
            let _geometry = override_launch_config(geometry);
            if let Some(cube) = &ctx.cube {
                pb.suspend(|| println!("reduction: {}", cube.reduction_in_use(path)));
            }
            let mut cases: Vec<CaseResult> = Vec::new();
            let mut rng = Rng::new(seed);
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                conformance::run_suite::<B>(
                    &ctx.device,
                    dtype,
                    args.quick,
                    filter,
                    &mut rng,
                    |case| {
                        pb.inc(1);
                        let line = format!(
                            "{:?} {} {:?} [{}, {}] {}",
                            path,
                            case.op.name(),
                            case.dtype,
                            case.rows,
                            case.width,
                            if case.passed() { "ok" } else { "FAIL" }
                        );
                        // Logs (no terminal, so no bar): one line per case as it ends, so
                        // a run cut short still says how far it got.
                        if pb.is_hidden() {
                            eprintln!("{line}");
                        }
                        pb.set_message(line);
                        cases.push(case.clone());
                    },
                )
            }));
            let panic = outcome.err().map(|p| device::payload_text(p.as_ref()));
            runs.push(PathRun { path, cases, panic });
        }
        pb.finish_and_clear();

        Ok(report(&runs, paths.len() > 1, seed))
    }
}

fn report(runs: &[PathRun], show_path: bool, seed: u64) -> ExitCode {
    let mut columns = vec![];
    if show_path {
        columns.push(("path", Align::Left));
    }
    columns.extend([
        ("op", Align::Left),
        ("shape", Align::Right),
        ("dtype", Align::Left),
        ("tensor", Align::Left),
        ("max_abs", Align::Right),
        ("max_rel", Align::Right),
        ("err/bound", Align::Right),
        ("result", Align::Left),
    ]);
    let mut table = Table::new(&columns);
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut panics = Vec::new();
    for run in runs {
        for case in &run.cases {
            if case.passed() {
                passed += 1;
            } else {
                failed += 1;
            }
            for c in &case.comparisons {
                let mut row = Vec::new();
                if show_path {
                    row.push(format!("{:?}", run.path).to_lowercase());
                }
                row.extend([
                    case.op.name().to_string(),
                    format!("{}x{}", case.rows, case.width),
                    dtype_name(case.dtype).to_string(),
                    c.tensor.to_string(),
                    sci(c.max_abs),
                    sci(c.max_rel),
                    format!("{:.2}", c.max_used),
                    if c.passed { "PASS" } else { "FAIL" }.to_string(),
                ]);
                table.row(row);
            }
        }
        if let Some(msg) = &run.panic {
            failed += 1;
            panics.push(format!("{:?}: {msg}", run.path));
        }
    }
    print!("{}", table.render());
    for p in &panics {
        println!("PANIC (suite stopped) on path {p}");
    }
    println!("check: {passed} passed, {failed} failed");
    println!("seed: {seed} (rerun with --seed {seed} or LIGER_SEED={seed})");
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
