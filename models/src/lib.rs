//! # liger-models
//!
//! Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3 and Mistral decoder-only causal LMs for Burn 0.21,
//! generic over any backend with liger-burn's fused ops (`B: FusedOps`: `Liger<…>`, the
//! CubeCL backends, NdArray; wrap in `Autodiff` to train), with each fused kernel switchable
//! ([`LigerConfig`]) and Hugging Face checkpoints loaded and saved.
//!
//! ```ignore
//! use liger_models::{CausalLm, LigerConfig, evaluate};
//! let model = CausalLm::<B>::load("Llama-3.2-1B", DType::BF16, LigerConfig::default(), &device)?;
//! let logits = model.forward(input_ids);            // [batch, seq, vocab]
//! let loss = model.loss(input_ids, labels);         // [1], labels -100 = ignored
//! let report = evaluate(&model, vec![vec![1, 2, 3]])?; // per-token losses
//! model.save("out")?;                               // config.json + model.safetensors
//! ```
//!
//! One concept per module: [`config`] (config.json), [`liger_config`] (kernel switches),
//! [`kernels`] (the switchable ops), [`rope`] (cos/sin tables), [`attention`], [`mlp`],
//! [`decoder_layer`], [`model`], [`params`] (where parameters come from), [`loading`],
//! [`saving`], [`names`] (Hugging Face parameter names), [`packing`] (documents packed in
//! rows), [`eval`], [`projection`] (the linear layers, with an optional LoRA adapter),
//! [`lora`] (LoRA fine-tuning and PEFT's adapter files).

pub mod attention;
pub mod config;
pub mod decoder_layer;
pub mod eager_attention;
pub mod error;
pub mod eval;
pub mod gradient_checkpointing;
pub mod kernels;
pub mod liger_config;
pub mod loading;
pub mod lora;
pub mod mlp;
pub mod model;
pub mod names;
pub mod packing;
pub mod params;
pub mod projection;
pub mod rope;
pub mod saving;

pub use config::{ModelConfig, ModelType, RopeScaling};
pub use error::ModelError;
pub use eval::{EvalReport, evaluate, evaluate_in_batches};
pub use kernels::IGNORE_INDEX;
pub use liger_config::LigerConfig;
pub use loading::{Checkpoint, LoadReport};
pub use lora::{LoraConfig, LoraTarget};
pub use model::CausalLm;
pub use names::HfParam;
pub use packing::Documents;
