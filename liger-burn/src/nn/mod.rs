//! Modules built on the fused ops. Records keep Burn's layout (same struct and field
//! names), so checkpoints of `burn::nn::{RmsNorm, LayerNorm}` load unchanged.

mod glu_mlp;
mod layer_norm;
mod rms_norm;
mod rope;

pub use glu_mlp::{GeGluMlp, GeGluMlpConfig, SwiGluMlp, SwiGluMlpConfig};
pub use layer_norm::{LayerNorm, LayerNormConfig};
pub use rms_norm::{RmsNorm, RmsNormConfig};
pub use rope::{Rope, RopeConfig};

mod cross_entropy;

pub use cross_entropy::{CrossEntropyLoss, CrossEntropyLossConfig};

mod linear_cross_entropy;

pub use linear_cross_entropy::{LinearCrossEntropyLoss, LinearCrossEntropyLossConfig};

mod lora;

pub use lora::{LoraAdapter, LoraAdapterConfig};
