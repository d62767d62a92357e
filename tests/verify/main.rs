//! Integration suite of liger-verify: the convergence comparison of fused against stock training.

mod convergence;
mod elementwise_geometry;
mod op_filter;
mod rounding;
