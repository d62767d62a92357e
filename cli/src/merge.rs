//! `liger merge`: a PEFT LoRA adapter merged into its base checkpoint, written as a plain
//! Hugging Face checkpoint (liger-models' `merge_checkpoint`).

use crate::MergeArgs;
use anyhow::Result;
use liger_burn::ops::FusedOps;
use liger_models::lora::merge_checkpoint;
use liger_verify::device::{self, Ctx, OnDevice};
use std::process::ExitCode;

/// Runs `liger merge`.
pub fn run(args: MergeArgs) -> Result<ExitCode> {
    device::dispatch(args.device, Merge { args })
}

struct Merge {
    args: MergeArgs,
}

impl OnDevice for Merge {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        let a = &self.args;
        eprintln!("device:    {} ({})", ctx.kind, B::name(&ctx.device));
        if let Some(dtype) = a.dtype
            && let Some(code) = device::require_dtype::<B>(
                &ctx.device,
                dtype.dtype(),
                dtype,
                "merge",
                " (try --dtype f32)",
            )
        {
            return Ok(code);
        }
        let report = merge_checkpoint::<B>(
            &a.base,
            &a.adapter,
            &a.out,
            a.dtype.map(|d| d.dtype()),
            &ctx.device,
        )?;
        let l = &report.lora;
        println!(
            "merged:    {} adapters (rank {}, alpha {}{}, targets {}) into {} in {:?}",
            report.adapters,
            l.rank,
            l.alpha,
            if l.use_rslora { ", rsLoRA" } else { "" },
            l.targets
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(","),
            a.base.display(),
            report.dtype
        );
        if !report.copied.is_empty() {
            println!("copied:    {} from the base", report.copied.join(", "));
        }
        println!("saved:     {}", a.out.display());
        Ok(ExitCode::SUCCESS)
    }
}
