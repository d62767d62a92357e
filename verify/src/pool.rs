//! `--memory-pool`: how CubeCL's device memory pool serves a training process.
//!
//! **Why.** On CUDA (and HIP), CubeCL 0.10 builds every device's pool from
//! `MemoryConfiguration::default()`, i.e. the `SubSlices` preset: `DeviceService::init` of
//! `CudaServer` takes `RuntimeOptions::default()` and nothing public lets a program pass
//! another `MemoryConfiguration` (only the wgpu runtime has `init_setup(.., RuntimeOptions)`).
//! `SubSlices` sizes its pools from the device: `max_page_size` = device memory / 4 (35.1
//! GiB on an H200, 19.9 GiB on an H100 80GB); pools of pages of 1/4, 1/16, ... of that,
//! down to the first below 32 MiB, take slices up to page/2, page/4, page/8, ... (H200:
//! 8.78 GiB pages for slices up to 4.39 GiB, 2.19 GiB pages up to 562 MiB, 562 MiB pages
//! up to 70 MiB, ...), and a last pool has pages of `max_page_size`. An allocation goes to
//! the first pool that takes its size; when none of that pool's pages has room, a whole
//! new page is allocated (a 1 GiB gradient takes an 8.78 GiB page on an H200), and a page
//! goes back to the device only when an explicit cleanup finds it entirely free. A
//! Llama-3.2-1B step at 4K tokens held 27.8 GiB of pages for 12.1 GiB of live tensors
//! (the largest of three samples; H200, 2026-11-22); which pools held the difference was
//! not measured, but page tails of this layout can hold that much.
//!
//! What a process *can* set programmatically is CubeCL's runtime configuration, once,
//! before the first device is created (`CubeClRuntimeConfig::set`): its
//! `memory.persistent_memory` switches the allocation mode of every pool. `exact` sets it
//! to `enforced`: every allocation then goes to the pool's "persistent" part, where each
//! buffer is its own device allocation of exactly the requested size (rounded up to the
//! 512-byte alignment) and a freed buffer is reused only by a request of that same
//! rounded size. A training step at fixed shapes asks for the same sizes every step, so
//! after the first step nothing new is allocated, and what is held is, for each size, the
//! most buffers of that size alive at once: no page tails, no page of another size class.
//! What it can still hold beyond the live bytes is the buffers of sizes whose peaks come
//! at different times (e.g. activation sizes free during the backward while the gradients,
//! of other sizes, are allocated).
//!
//! `release` is `exact` plus a release of the pool's free buffers back to the device at
//! points where much has just been freed: each decoder layer of the backward (once the
//! gradient reaches the layer's input, its activations are dropped;
//! `liger_burn::functional::memory_release_point`) and after each optimizer step. On CUDA,
//! cubecl-cuda allocates and frees with `cuMemAllocAsync`/`cuMemFreeAsync` on its stream,
//! so what goes back lands in CUDA's stream-ordered pool, set here to keep it
//! (`liger_burn::cube::cuda_pool::keep_freed_memory`): the weight gradients the backward
//! allocates next, of sizes no activation had, reuse the activations' memory without a new
//! mapping and without a synchronization. The device memory then held is that pool's,
//! which the benchmarks read from CUDA's counters. On other runtimes the buffers go back to
//! the driver's allocator as it is.
//!
//! **When not to use it.** Shapes that change from step to step (padding each batch to
//! its own longest row) add new sizes every step and nothing is reused across sizes: the
//! pool grows until an explicit `memory_cleanup` (which frees every unused buffer). Use it
//! with fixed shapes (`liger train --packing`, the e2e benchmark).
//!
//! The rest of the configuration (cubecl.toml in the current directory or a parent, the
//! CUBECL_* variables) is read as CubeCL would read it, and kept.

use anyhow::{Result, bail};
use clap::ValueEnum;
use cubecl::config::memory::PersistentMemory;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use std::sync::OnceLock;

/// A `--memory-pool` value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum MemoryPool {
    /// `release` on CUDA (`--device cuda`, or `auto` in a build with CUDA), whose
    /// stream-ordered pool serves any size from what is released, so a step holds about
    /// what it uses whether its shapes are fixed or not; `default` on every other device,
    /// whose allocators that has not been measured on ([`MemoryPool::resolve`]).
    Auto,
    /// CubeCL's default pools (`SubSlices` on CUDA/HIP: slices of large pages; freed
    /// pages are kept until an explicit cleanup).
    #[default]
    Default,
    /// Every allocation exactly sized and reused only for the same size (CubeCL's
    /// persistent pool, enforced): no page tails; for steps of fixed shapes.
    Exact,
    /// `exact`, with the free buffers handed back to the device at each decoder layer of
    /// the backward and after each optimizer step, so memory freed by one size serves
    /// another (on CUDA through its stream-ordered pool, which keeps it); for steps of
    /// fixed shapes.
    Release,
}

/// The pool [`configure`] set in this process (`default` before it runs).
static CONFIGURED: OnceLock<MemoryPool> = OnceLock::new();

/// The pool this process's CubeCL devices were given ([`configure`]).
pub fn configured() -> MemoryPool {
    CONFIGURED.get().copied().unwrap_or_default()
}

impl MemoryPool {
    /// The pool `auto` stands for on `device` (every other value is itself).
    pub fn resolve(self, device: crate::device::DeviceKind) -> MemoryPool {
        use crate::device::DeviceKind;
        match (self, device) {
            (MemoryPool::Auto, DeviceKind::Cuda) => MemoryPool::Release,
            (MemoryPool::Auto, DeviceKind::Auto) if cfg!(feature = "cuda") => MemoryPool::Release,
            (MemoryPool::Auto, _) => MemoryPool::Default,
            (pool, _) => pool,
        }
    }

    /// Whether training with this pool marks each decoder layer's input as a
    /// `memory_release_point` and releases the free buffers after each optimizer step.
    pub fn releases_in_step(self) -> bool {
        self == MemoryPool::Release
    }

    /// The name on the command line and in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            MemoryPool::Auto => "auto",
            MemoryPool::Default => "default",
            MemoryPool::Exact => "exact",
            MemoryPool::Release => "release",
        }
    }

    /// What this pool does, in words, for the run's header.
    pub fn describe(self) -> &'static str {
        match self {
            MemoryPool::Auto => "auto (release on CUDA, default elsewhere)",
            MemoryPool::Default => {
                "default (CubeCL's SubSlices pools: slices of pages of device memory / 4^k, \
                 k = 1..7; a page is kept until a cleanup finds it empty)"
            }
            MemoryPool::Exact => {
                "exact (CubeCL persistent pool enforced: one buffer per allocation of exactly \
                 its size, reused by the same size only)"
            }
            MemoryPool::Release => {
                "release (exact-size buffers, the free ones handed back to the device at each \
                 decoder layer of the backward and after each optimizer step; on CUDA into its \
                 stream-ordered pool, which keeps them for any size)"
            }
        }
    }
}

/// Applies `pool` to this process's CubeCL runtime configuration. Must run before any
/// device is created (the configuration is read once and then fixed); `default` leaves
/// the configuration alone.
pub fn configure(pool: MemoryPool) -> Result<()> {
    // `auto` as for `--device auto`; callers that know the device resolve it first.
    let pool = pool.resolve(crate::device::DeviceKind::Auto);
    let enforced = match pool {
        MemoryPool::Auto | MemoryPool::Default => return Ok(()),
        MemoryPool::Exact | MemoryPool::Release => PersistentMemory::Enforced,
    };
    if CubeClRuntimeConfig::storage().lock().is_some() {
        bail!(
            "--memory-pool {}: CubeCL's configuration was already read in this process; \
             it can only be set before the first device is created",
            pool.name()
        );
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.memory.persistent_memory = enforced;
    CubeClRuntimeConfig::set(config);
    let _ = CONFIGURED.set(pool);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::MemoryPool;
    use crate::device::DeviceKind;

    #[test]
    fn auto_is_release_on_cuda_and_default_elsewhere() {
        assert_eq!(
            MemoryPool::Auto.resolve(DeviceKind::Cuda),
            MemoryPool::Release
        );
        for device in [
            DeviceKind::WgpuCpu,
            DeviceKind::Vulkan,
            DeviceKind::Rocm,
            DeviceKind::Ndarray,
        ] {
            assert_eq!(
                MemoryPool::Auto.resolve(device),
                MemoryPool::Default,
                "{device:?}"
            );
        }
        let expected = if cfg!(feature = "cuda") {
            MemoryPool::Release
        } else {
            MemoryPool::Default
        };
        assert_eq!(MemoryPool::Auto.resolve(DeviceKind::Auto), expected);
        for pool in [MemoryPool::Default, MemoryPool::Exact, MemoryPool::Release] {
            assert_eq!(pool.resolve(DeviceKind::Cuda), pool);
            assert_eq!(pool.resolve(DeviceKind::WgpuCpu), pool);
        }
    }
}
