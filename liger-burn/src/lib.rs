//! # liger-burn
//!
//! Liger-Kernel's fused, exact, memory-lean LLM-training kernels for Burn.
//!
//! - [`ops::FusedOps`]: the fused primitives, with exact stock-op fallbacks on every backend.
//! - [`Liger`]: a backend decorator that routes Burn's own `softmax`, `log_softmax`,
//!   `layer_norm`, `gelu` and `sigmoid` primitives (and so `burn::nn` modules) to the
//!   fused kernels.
//! - [`functional`] and [`nn`]: the user-facing API.
//! - [`optim`]: AdamW with a fused update, and mixed-precision master weights.

pub mod autodiff;
pub mod backend;
pub mod cube;
mod fallback;
pub mod functional;
pub mod fusion;
mod hand_off;
pub mod nn;
pub mod ops;
pub mod optim;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;

pub use backend::Liger;
