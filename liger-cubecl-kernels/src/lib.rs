//! # liger-cubecl-kernels
//!
//! Liger-Kernel's fused LLM-training kernels written once in CubeCL, so they compile
//! for CUDA, ROCm and wgpu (Vulkan/Metal). Runtime-generic, no Burn types: every
//! launch function takes a [`ComputeClient`](cubecl::prelude::ComputeClient), contiguous
//! row-major buffers (`Handle`s), the problem size and the element type.
//!
//! All kernels read `f32`, `f16` or `bf16` and accumulate in `f32`. Rows of any width
//! work (not only powers of two). Cross-unit reductions use plane (warp/subgroup)
//! operations where the device has them and a shared-memory tree otherwise; see
//! [`reduce`].

pub mod activation;
pub mod attention;
pub mod cross_entropy;
pub mod elementwise;
pub mod glu;
pub mod launch;
pub mod layer_norm;
pub mod partial_sum;
pub mod reduce;
pub mod rms_norm;
pub mod rope;
pub mod softmax;

pub use elementwise::set_elementwise_limits;
pub use launch::{KernelError, ReductionPath, RowLaunch, set_reduction_path};

/// Counts kernel launches per op, so tests can prove the fused path ran.
pub mod counters {
    use std::sync::atomic::{AtomicU64, Ordering};

    macro_rules! counters {
        ($($name:ident),* $(,)?) => {
            #[allow(non_upper_case_globals)]
            mod statics { use super::AtomicU64; $(pub static $name: AtomicU64 = AtomicU64::new(0);)* }
            /// Every counted kernel.
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
            #[allow(non_camel_case_types, missing_docs)]
            pub enum Kernel { $($name),* }
            impl Kernel {
                fn slot(self) -> &'static AtomicU64 { match self { $(Kernel::$name => &statics::$name),* } }
                /// Every kernel, for reports.
                pub const ALL: &'static [Kernel] = &[$(Kernel::$name),*];
            }
        };
    }
    counters!(
        rms_norm_forward,
        rms_norm_backward,
        add_rms_norm_forward,
        layer_norm_forward,
        layer_norm_backward,
        softmax_forward,
        softmax_backward,
        log_softmax_forward,
        log_softmax_backward,
        swiglu_forward,
        swiglu_backward,
        geglu_forward,
        geglu_backward,
        gelu_forward,
        gelu_backward,
        sigmoid_forward,
        sigmoid_backward,
        rope_forward,
        rope_backward,
        cross_entropy,
        cross_entropy_backward,
        flash_attention_forward,
        flash_attention_backward,
    );

    /// Records one launch.
    pub fn record(kernel: Kernel) {
        kernel.slot().fetch_add(1, Ordering::Relaxed);
    }
    /// Launches of `kernel` since the process started.
    pub fn get(kernel: Kernel) -> u64 {
        kernel.slot().load(Ordering::Relaxed)
    }
}
