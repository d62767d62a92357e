//! # liger-verify
//!
//! Everything that checks liger-burn rather than ships with it (`publish = false`):
//!
//! - [`conformance`]: every fused op, forward and every gradient, against an independent
//!   f64 reference over a sweep of odd shapes (`liger check`);
//! - [`convergence`] and [`gradient_check`]: mini models trained with the fused kernels on
//!   and off from the same start (`liger converge`);
//! - [`bench`]: fused against stock Burn, single ops and whole training steps
//!   (`liger bench`), with the CSV rows of `benches/data/`.
//!
//! The `liger` binary (crate `liger-cli`) parses [`args`] and calls the runners here on
//! the device that [`device::dispatch`] picks.

// A build without any device feature compiles (and says so at run time), unwarned.
#![cfg_attr(
    not(any(
        feature = "vulkan",
        feature = "wgpu",
        feature = "cuda",
        feature = "rocm",
        feature = "ndarray"
    )),
    allow(dead_code, unused)
)]

pub mod args;
pub mod bench;
pub mod ceiling;
pub mod check;
pub mod conformance;
pub mod converge;
pub mod convergence;
pub mod csv;
pub mod device;
pub mod dtype;
pub mod gradient_check;
pub mod measure;
pub mod pool;
pub mod table;
