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

pub use launch::{
    ElementwiseConfig, KernelError, LaunchConfig, ReductionPath, RopeConfig, RowLaunch,
};

/// Counts kernel launches per op on the calling thread, so tests can prove the fused
/// path ran. Test-only: with the `launch-counters` feature off (the default) recording
/// compiles to nothing and every count reads 0.
pub mod counters {
    macro_rules! counters {
        ($($name:ident),* $(,)?) => {
            /// Every counted kernel.
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
            #[allow(non_camel_case_types, missing_docs)]
            #[repr(usize)]
            pub enum Kernel { $($name),* }
            impl Kernel {
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
    );

    #[cfg(feature = "launch-counters")]
    std::thread_local! {
        static COUNTS: std::cell::RefCell<Vec<u64>> =
            std::cell::RefCell::new(vec![0; Kernel::ALL.len()]);
    }

    /// Records one launch on this thread.
    #[inline]
    pub fn record(kernel: Kernel) {
        #[cfg(feature = "launch-counters")]
        COUNTS.with(|c| c.borrow_mut()[kernel as usize] += 1);
        #[cfg(not(feature = "launch-counters"))]
        let _ = kernel;
    }

    /// Launches of `kernel` on this thread since it started (0 without `launch-counters`).
    pub fn get(kernel: Kernel) -> u64 {
        #[cfg(feature = "launch-counters")]
        return COUNTS.with(|c| c.borrow()[kernel as usize]);
        #[cfg(not(feature = "launch-counters"))]
        {
            let _ = kernel;
            0
        }
    }

    /// Whether this build counts launches.
    pub const ENABLED: bool = cfg!(feature = "launch-counters");
}
