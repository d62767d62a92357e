//! `liger eval`: per-token next-token losses of a Hugging Face checkpoint (Llama, Qwen2,
//! Qwen3, Mistral) on token sequences, through liger-models.
//!
//! stdout carries only the JSON result, so it can be piped; the device and model lines
//! go to stderr.

use crate::EvalArgs;
use anyhow::{Context, Result, bail};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::{CausalLm, LigerConfig, evaluate_in_batches};
use liger_verify::args::OnOff;
use liger_verify::device::{self, Ctx, OnDevice};
use std::process::ExitCode;

/// The tokens file: `{"input_ids": [[...], ...]}`.
#[derive(serde::Deserialize)]
struct Tokens {
    input_ids: Vec<Vec<u32>>,
}

/// Runs `liger eval`.
pub fn run(args: EvalArgs) -> Result<ExitCode> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let text = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("reading the tokens file {}", args.tokens.display()))?;
    let tokens: Tokens = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected {{\"input_ids\": [[token ids...], ...]}}",
            args.tokens.display()
        )
    })?;
    device::dispatch(
        args.device,
        Eval {
            args,
            input_ids: tokens.input_ids,
        },
    )
}

struct Eval {
    args: EvalArgs,
    input_ids: Vec<Vec<u32>>,
}

impl Eval {
    fn evaluate<B: FusedOps>(self, device: &B::Device, liger: LigerConfig) -> Result<ExitCode> {
        let dtype = self.args.dtype.dtype();
        let model = CausalLm::<B>::load(&self.args.model, dtype, liger, device)?;
        eprintln!(
            "model:     {} ({}, {} layers, {:.1}M parameters) in {}",
            self.args.model.display(),
            model.config.model_type,
            model.config.num_hidden_layers,
            model.config.num_params() as f64 / 1e6,
            self.args.dtype
        );
        eprintln!(
            "kernels:   {}",
            match self.args.liger {
                OnOff::On => "liger (LigerConfig::all() on the Liger<B> backend)",
                OnOff::Off => "stock Burn",
            }
        );
        let report = evaluate_in_batches(&model, self.input_ids, self.args.batch_size)?;
        println!("{}", serde_json::to_string(&report)?);
        Ok(ExitCode::SUCCESS)
    }
}

impl OnDevice for Eval {
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode> {
        eprintln!("device:    {} ({})", ctx.kind, B::name(&ctx.device));
        let dtype = self.args.dtype.dtype();
        if !B::supports_dtype(&ctx.device, dtype) {
            eprintln!(
                "error: {} does not support {} on this device; nothing to evaluate (try --dtype f32)",
                B::name(&ctx.device),
                self.args.dtype
            );
            return Ok(ExitCode::from(2));
        }
        match self.args.liger {
            OnOff::On => self.evaluate::<Liger<B>>(&ctx.device, LigerConfig::all()),
            OnOff::Off => self.evaluate::<B>(&ctx.device, LigerConfig::none()),
        }
    }
}
