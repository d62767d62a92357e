//! Per-step metrics, the `<output>/train_log.csv` file, and the end-of-run summary.

use crate::error::TrainError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the metrics file in the output directory.
pub const LOG_FILE: &str = "train_log.csv";

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based).
    pub step: usize,
    /// Epoch of its last micro-batch (0-based).
    pub epoch: usize,
    /// Mean loss over the step's trained tokens (all micro-batches).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Whether the gradients were scaled down.
    pub clipped: bool,
    /// Real (non-padding) tokens processed.
    pub tokens: usize,
    /// Tokens in the loss.
    pub trained_tokens: usize,
    /// Wall time of the step, seconds.
    pub seconds: f64,
    /// `tokens / seconds`.
    pub tokens_per_second: f64,
    /// Device pool memory reserved after the step, bytes (`None` when the backend has no pool).
    pub memory_bytes: Option<u64>,
    /// The method's metrics (TRL's names), averaged over the step's micro-batches as the
    /// loss is; empty for SFT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<(String, f64)>,
}

const HEADER: &str = "step,epoch,loss,lr,grad_norm,clipped,tokens,trained_tokens,seconds,tokens_per_second,memory_mib";

impl StepMetrics {
    /// The CSV row (no newline): the fixed columns, then the method's metrics.
    pub fn csv_row(&self) -> String {
        let mut row = format!(
            "{},{},{},{:e},{},{},{},{},{:.4},{:.1},{}",
            self.step,
            self.epoch,
            self.loss,
            self.lr,
            self.grad_norm,
            self.clipped as u8,
            self.tokens,
            self.trained_tokens,
            self.seconds,
            self.tokens_per_second,
            self.memory_bytes
                .map(|b| format!("{:.1}", b as f64 / (1 << 20) as f64))
                .unwrap_or_default()
        );
        for (_, v) in &self.extra {
            row.push_str(&format!(",{v}"));
        }
        row
    }
}

/// Appends one row per step to `train_log.csv`, flushed each time (a crash keeps the rows).
pub struct CsvLog {
    file: std::fs::File,
    path: PathBuf,
}

impl CsvLog {
    /// Creates (replacing) `output/train_log.csv` with the header and the rows of `history`
    /// (the steps before a resume).
    pub fn create(output: &Path, history: &[StepMetrics]) -> Result<Self, TrainError> {
        Self::create_with(output, history, &[])
    }

    /// [`create`](Self::create) with a column per method metric (`extra`, in
    /// [`StepMetrics::extra`]'s order) after the fixed ones.
    pub fn create_with(
        output: &Path,
        history: &[StepMetrics],
        extra: &[String],
    ) -> Result<Self, TrainError> {
        let path = output.join(LOG_FILE);
        let mut file = std::fs::File::create(&path).map_err(|e| TrainError::io(&path, e))?;
        let mut text = String::from(HEADER);
        for name in extra {
            text.push(',');
            text.push_str(name);
        }
        text.push('\n');
        for m in history {
            text.push_str(&m.csv_row());
            text.push('\n');
        }
        file.write_all(text.as_bytes())
            .map_err(|e| TrainError::io(&path, e))?;
        Ok(CsvLog { file, path })
    }

    /// Appends `m`.
    pub fn append(&mut self, m: &StepMetrics) -> Result<(), TrainError> {
        writeln!(self.file, "{}", m.csv_row())
            .and_then(|_| self.file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The end of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSummary {
    /// Steps run in this process.
    pub steps: usize,
    /// Step reached (equal to `steps` unless resumed).
    pub last_step: usize,
    /// Real tokens processed in this process.
    pub tokens: usize,
    /// Wall time of the training loop, seconds (checkpoint writing included).
    pub seconds: f64,
    /// Loss of the first step of this process.
    pub first_loss: f64,
    /// Loss of the last step.
    pub last_loss: f64,
    /// Largest device pool reservation seen, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// The final checkpoint.
    pub checkpoint: PathBuf,
    /// The metrics file.
    pub log: PathBuf,
    /// Every step's metrics of this process.
    pub history: Vec<StepMetrics>,
}

impl TrainSummary {
    /// Tokens per second over the run.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

/// `12.3 MiB`, or `n/a` without a memory pool.
pub fn format_memory(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        None => "n/a".into(),
    }
}
