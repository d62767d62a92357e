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
pub mod adamw;
pub mod attention;
pub mod cross_entropy;
#[cfg(test)]
mod cuda_source;
pub mod distill_rows;
pub mod elementwise;
pub mod embedding;
pub mod glu;
pub mod launch;
pub mod layer_norm;
pub mod partial_sum;
mod patched_launch;
pub mod pointwise;
pub mod reduce;
pub mod rms_norm;
pub mod rope;
pub mod softmax;

pub use launch::{
    ElementwiseConfig, KernelError, LaunchConfig, ReductionPath, RopeConfig, RowLaunch,
};

/// Counts kernel launches per op, so tests can prove the fused path ran. Test-only: with
/// the `launch-counters` feature off (the default) recording compiles to nothing and every
/// count reads 0.
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
        target_stats,
        distill_rows,
        matmul_vendor,
        matmul_vendor_epilogue,
        matmul_vendor_queued,
        matmul_vendor_backward_pair,
        matmul_backend,
        adamw_step,
        adamw_step_in_place,
        embedding_backward,
        flash_attention_forward,
        flash_attention_backward,
        flash_attention_dq,
        vendor_work_queued,
    );

    // Launches are counted per scope: each thread starts in a scope of its own, and a
    // launch made on another thread for it (Burn's fusion stream runs its operations on
    // the device's runner thread) is counted in the scope the caller was in, which the
    // caller's glue carries over with [`enter_scope`].
    #[cfg(feature = "launch-counters")]
    mod scoped {
        use std::collections::HashMap;
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicU64, Ordering};

        static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);
        pub(super) static COUNTS: Mutex<Option<HashMap<(u64, usize), u64>>> = Mutex::new(None);
        std::thread_local! {
            pub(super) static SCOPE: std::cell::Cell<u64> =
                std::cell::Cell::new(NEXT_SCOPE.fetch_add(1, Ordering::Relaxed));
        }
    }

    /// The counting scope of the calling thread (0 without `launch-counters`).
    pub fn scope() -> u64 {
        #[cfg(feature = "launch-counters")]
        return scoped::SCOPE.with(|s| s.get());
        #[cfg(not(feature = "launch-counters"))]
        0
    }

    /// Counts this thread's launches in `scope` until the guard is dropped.
    pub fn enter_scope(scope: u64) -> ScopeGuard {
        #[cfg(feature = "launch-counters")]
        return ScopeGuard(scoped::SCOPE.with(|s| s.replace(scope)));
        #[cfg(not(feature = "launch-counters"))]
        ScopeGuard(scope)
    }

    /// Restores the thread's previous counting scope when dropped.
    pub struct ScopeGuard(#[allow(dead_code)] u64);

    impl Drop for ScopeGuard {
        fn drop(&mut self) {
            #[cfg(feature = "launch-counters")]
            scoped::SCOPE.with(|s| s.set(self.0));
        }
    }

    /// Records one launch in the calling thread's scope.
    #[inline]
    pub fn record(kernel: Kernel) {
        #[cfg(feature = "launch-counters")]
        {
            let key = (scope(), kernel as usize);
            let mut counts = scoped::COUNTS.lock().unwrap_or_else(|e| e.into_inner());
            *counts
                .get_or_insert_with(Default::default)
                .entry(key)
                .or_default() += 1;
        }
        #[cfg(not(feature = "launch-counters"))]
        let _ = kernel;
    }

    /// Launches of `kernel` counted in the calling thread's scope (0 without
    /// `launch-counters`).
    pub fn get(kernel: Kernel) -> u64 {
        #[cfg(feature = "launch-counters")]
        {
            let key = (scope(), kernel as usize);
            let counts = scoped::COUNTS.lock().unwrap_or_else(|e| e.into_inner());
            counts
                .as_ref()
                .and_then(|c| c.get(&key))
                .copied()
                .unwrap_or(0)
        }
        #[cfg(not(feature = "launch-counters"))]
        {
            let _ = kernel;
            0
        }
    }

    /// Whether this build counts launches.
    pub const ENABLED: bool = cfg!(feature = "launch-counters");
}
