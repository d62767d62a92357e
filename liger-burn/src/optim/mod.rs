//! Optimizers whose per-parameter update is one fused kernel launch, drop-in replacements
//! for Burn's: [`AdamW`] implements Burn's `SimpleOptimizer`, so `OptimizerAdaptor` drives
//! it over any module and its records are saved and loaded by Burn's recorders.

mod adamw;

pub use adamw::{AdamW, AdamWConfig, AdamWState, AdamWStateItem, LowPrecisionUpdate};
