//! The settings that determine the numbers of a run: stored in every checkpoint, and a
//! resume must use the same.

use crate::batching::Layout;
use crate::error::TrainError;
use crate::schedule::LrSchedule;
use liger_burn::optim::{AdamWConfig, LowPrecisionUpdate};
use liger_models::LoraConfig;
use serde::{Deserialize, Serialize};

/// The settings that determine the numbers of a run (stored in every checkpoint; a resume
/// must use the same).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Longest example / packed row, in tokens.
    pub max_length: usize,
    /// Padding or packing.
    pub layout: Layout,
    /// Rows per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Learning-rate schedule (and the total number of steps).
    pub schedule: LrSchedule,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (`None`: no clipping, the norm is still logged).
    pub max_grad_norm: Option<f64>,
    /// Seed of the data order (and of the initialization of a random model).
    pub seed: u64,
    /// Save a checkpoint every this many steps (0: only at the end).
    pub save_every: usize,
    /// f16/bf16 runs: keep the AdamW moments in the parameters' dtype and update the
    /// parameters there, with no f32 master copy (updates below half an ulp are lost).
    /// Off (the default): f32 master weights and moments, forward and backward in the low
    /// dtype. No effect on f32 runs.
    #[serde(default)]
    pub pure_low_precision: bool,
    /// What is trained (SFT, a preference loss, KTO, distillation) and its loss's options.
    #[serde(default)]
    pub method: crate::method::MethodConfig,
    /// LoRA fine-tuning: the base frozen (no gradient, no optimizer state), f32 adapters
    /// on these projections trained, checkpoints holding the adapters only (PEFT's files).
    /// `None`: every parameter trained.
    #[serde(default)]
    pub lora: Option<LoraConfig>,
}

/// `liger train`'s defaults (the README's default run), shared by the command and the
/// tests that repeat that run.
pub mod defaults {
    /// `--max-length`.
    pub const MAX_LENGTH: usize = 256;
    /// `--batch-size`.
    pub const BATCH_SIZE: usize = 8;
    /// `--steps`.
    pub const STEPS: usize = 300;
    /// `--lr` for a randomly initialized model.
    pub const LR_RANDOM: f64 = 3e-3;
    /// `--lr` for a pretrained model (`--model`).
    pub const LR_PRETRAINED: f64 = 2e-5;
    /// `--min-lr-ratio`.
    pub const MIN_LR_RATIO: f64 = 0.1;
    /// `--weight-decay`.
    pub const WEIGHT_DECAY: f64 = 0.01;
    /// `--max-grad-norm`.
    pub const MAX_GRAD_NORM: f64 = 1.0;
    /// `--save-every`.
    pub const SAVE_EVERY: usize = 100;
    /// `--seed`.
    pub const SEED: u64 = 42;

    /// `--warmup-steps` for a run of `total_steps`: 10 %, at most 100.
    pub fn warmup_steps(total_steps: usize) -> usize {
        (total_steps / 10).min(100)
    }
}

impl TrainConfig {
    /// The settings of `liger train --steps total_steps --save-every save_every` with
    /// every other flag at its default (a random model, padded rows): the README's
    /// default run, at another length.
    pub fn random_model_defaults(total_steps: usize, save_every: usize) -> Self {
        TrainConfig {
            max_length: defaults::MAX_LENGTH,
            layout: Layout::Pad,
            batch_size: defaults::BATCH_SIZE,
            grad_accum: 1,
            schedule: LrSchedule {
                peak_lr: defaults::LR_RANDOM,
                min_lr_ratio: defaults::MIN_LR_RATIO,
                warmup_steps: defaults::warmup_steps(total_steps),
                total_steps,
            },
            weight_decay: defaults::WEIGHT_DECAY,
            max_grad_norm: Some(defaults::MAX_GRAD_NORM),
            seed: defaults::SEED,
            save_every,
            pure_low_precision: false,
            method: crate::method::MethodConfig::Sft,
            lora: None,
        }
    }

    /// Checks the values; returns what is wrong, naming the flag.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Config(m));
        if self.batch_size == 0 {
            return bad("--batch-size must be at least 1".into());
        }
        if self.grad_accum == 0 {
            return bad("--grad-accum must be at least 1".into());
        }
        if self.max_length < 2 {
            return bad(format!(
                "--max-length must be at least 2, got {}",
                self.max_length
            ));
        }
        if let Some(n) = self.max_grad_norm
            && !(n > 0.0 && n.is_finite())
        {
            return bad(format!("--max-grad-norm must be positive, got {n}"));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(format!(
                "--weight-decay must be >= 0, got {}",
                self.weight_decay
            ));
        }
        if self.method.paired() && self.layout == Layout::Pack {
            return bad(format!(
                "--method {} trains on pairs of whole sequences: --packing is not available (drop it)",
                self.method.name()
            ));
        }
        self.method
            .check()
            .map_err(|e| TrainError::Config(format!("--method {}: {e}", self.method.name())))?;
        if let Some(lora) = &self.lora {
            lora.validate()
                .map_err(|e| TrainError::Config(format!("{e} (--lora-*)")))?;
            // The post-training losses read the LM head's weight alone: an adapter there
            // would get no gradient.
            if self.method != crate::method::MethodConfig::Sft
                && lora.targets.contains(&liger_models::LoraTarget::LmHead)
            {
                return bad(format!(
                    "--method {} with a LoRA adapter on lm_head: the method's loss takes the \
                     head's weight alone (drop lm_head from --lora-targets)",
                    self.method.name()
                ));
            }
        }
        self.schedule.validate().map_err(TrainError::Config)
    }

    /// The seed of the backend's generator for optimizer step `step` (1-based): LoRA's
    /// dropout masks are drawn from it, so they are a function of the run's seed and the
    /// step, and a resumed run draws the same masks as the uninterrupted one. (Burn's
    /// generator is one per process: another draw from it during a step, by a second run
    /// in the same process, would change that step's masks.)
    pub fn step_seed(&self, step: usize) -> u64 {
        let mut rng = crate::rng::SplitMix64::new(self.seed);
        let key = rng.next_u64();
        crate::rng::SplitMix64::new(key ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
            .next_u64()
    }

    /// liger-burn's fused AdamW with PyTorch's defaults (betas 0.9/0.999, eps 1e-8) and
    /// this weight decay; f16/bf16 parameters through f32 master weights unless
    /// `pure_low_precision`. Clipping is not Burn's (per tensor) but
    /// [`clip_global_norm`](crate::clipping::clip_global_norm).
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig::new()
            .with_beta_1(0.9)
            .with_beta_2(0.999)
            .with_epsilon(1e-8)
            .with_weight_decay(self.weight_decay as f32)
            .with_low_precision(if self.pure_low_precision {
                LowPrecisionUpdate::Pure
            } else {
                LowPrecisionUpdate::MasterWeights
            })
    }
}
