//! Integration suite of liger-verify: the convergence comparison of fused against stock training.

mod convergence;
mod op_filter;
mod rounding;
