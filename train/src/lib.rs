//! # liger-train
//!
//! Training of [`liger_models`] causal LMs on any backend with liger-burn's fused ops:
//! supervised fine-tuning from JSONL (the `liger train` job).

// The `liger train` SFT job, one concept per module.
pub mod batching;
pub mod bundled;
pub mod checkpoint;
pub mod clipping;
pub mod config;
pub mod data;
pub mod error;
pub mod method;
pub mod metrics;
pub mod progress;
pub mod prompt;
pub mod rng;
pub mod schedule;
pub mod tokenizer;
pub mod trainer;

pub use error::{LineError, TrainError};
pub use trainer::{Run, TrainConfig, train};
