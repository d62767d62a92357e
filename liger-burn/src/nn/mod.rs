//! Modules built on the fused ops. Records keep Burn's layout (same struct and field
//! names), so checkpoints of `burn::nn::{RmsNorm, LayerNorm}` load unchanged.

mod layer_norm;
mod rms_norm;

pub use layer_norm::{LayerNorm, LayerNormConfig};
pub use rms_norm::{RmsNorm, RmsNormConfig};

mod cross_entropy;

pub use cross_entropy::{CrossEntropyLoss, CrossEntropyLossConfig};

mod linear_cross_entropy;

pub use linear_cross_entropy::{LinearCrossEntropyLoss, LinearCrossEntropyLossConfig};
