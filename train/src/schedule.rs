//! The learning-rate schedule: linear warmup, then cosine decay to a floor.
//!
//! For optimizer step `s` (1-based) of `total`, with `w` warmup steps, peak `lr` and floor
//! `min = lr · min_lr_ratio`:
//!
//! - `s ≤ w`: `lr · s / w` (the first step already moves; transformers' schedule, which
//!   starts at 0, spends its first step at lr 0);
//! - `s > w`: `min + (lr − min) · ½ (1 + cos(π · (s − w) / (total − w)))`, which is `lr`
//!   right after warmup and `min` at the last step.

use serde::{Deserialize, Serialize};

/// Warmup + cosine schedule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate, reached at the end of warmup.
    pub peak_lr: f64,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
    /// Steps of linear warmup.
    pub warmup_steps: usize,
    /// Total optimizer steps of the run.
    pub total_steps: usize,
}

impl LrSchedule {
    /// Learning rate of optimizer step `step` (1-based).
    pub fn lr(&self, step: usize) -> f64 {
        let min = self.peak_lr * self.min_lr_ratio;
        if step <= self.warmup_steps {
            return self.peak_lr * step as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        min + (self.peak_lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }

    /// Checks the values make sense; returns what does not.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.peak_lr > 0.0 && self.peak_lr.is_finite()) {
            return Err(format!("--lr must be positive, got {}", self.peak_lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(format!(
                "--min-lr-ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        if self.total_steps == 0 {
            return Err("the run has no step (--steps or --epochs)".into());
        }
        Ok(())
    }
}
