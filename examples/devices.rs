//! The backends an example can run on: which ones this build has (cargo features of
//! liger-examples) and whether each one's device opens on this machine.
//!
//! Shared by the examples (`mod devices;`). Every example is generic over the backend
//! (a [`Job`]); [`run_on`] instantiates it with the Burn backend of a [`Target`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use liger_burn::ops::FusedOps;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

/// A Burn backend and device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `burn::backend::Cuda`, GPU 0 (feature `cuda`).
    Cuda,
    /// `burn::backend::Rocm`, GPU 0 (feature `rocm`).
    Rocm,
    /// `burn::backend::Wgpu` on wgpu's default adapter: a GPU, or a CPU adapter such as
    /// Mesa's lavapipe when there is none (feature `vulkan` or `wgpu`).
    Wgpu,
    /// `burn::backend::Wgpu` on wgpu's CPU adapter: Mesa's lavapipe, the CI device
    /// (feature `vulkan` or `wgpu`).
    WgpuCpu,
    /// `burn::backend::NdArray` (f32): no CubeCL, so liger-burn runs its exact composition
    /// of stock ops (feature `ndarray`).
    NdArray,
}

impl Target {
    /// Short name, for tables and log lines.
    pub fn name(self) -> &'static str {
        match self {
            Target::Cuda => "cuda",
            Target::Rocm => "rocm",
            Target::Wgpu => "wgpu",
            Target::WgpuCpu => "wgpu-cpu",
            Target::NdArray => "ndarray",
        }
    }

    /// What the device needs to open, said when it does not.
    fn needs(self) -> &'static str {
        match self {
            Target::Cuda => "an NVIDIA GPU and its driver",
            Target::Rocm => "an AMD GPU and ROCm/HIP",
            Target::Wgpu => "a Vulkan, Metal or DX12 adapter",
            Target::WgpuCpu => {
                "a CPU Vulkan adapter: Mesa's lavapipe (apt-get install mesa-vulkan-drivers)"
            }
            Target::NdArray => "nothing",
        }
    }

    /// Every target this build has, in the order the examples prefer them (GPUs first).
    pub fn compiled() -> Vec<Target> {
        let mut targets = Vec::new();
        if cfg!(feature = "cuda") {
            targets.push(Target::Cuda);
        }
        if cfg!(feature = "rocm") {
            targets.push(Target::Rocm);
        }
        if cfg!(any(feature = "vulkan", feature = "wgpu")) {
            targets.push(Target::Wgpu);
            targets.push(Target::WgpuCpu);
        }
        if cfg!(feature = "ndarray") {
            targets.push(Target::NdArray);
        }
        targets
    }
}

/// Work generic over the backend: `B` is the plain backend of the target (wrap it in
/// `Autodiff` and `Liger` as the job needs).
pub trait Job {
    /// What the job returns.
    type Output;
    /// Runs on `device` of backend `B`.
    fn run<B: FusedOps>(&mut self, target: Target, device: B::Device) -> Self::Output;
}

/// Runs `job` on `target` once its device answered a probe; `Err` says why it could not.
pub fn run_on<J: Job>(target: Target, job: &mut J) -> Result<J::Output, String> {
    match target {
        #[cfg(feature = "cuda")]
        Target::Cuda => probed::<burn::backend::Cuda, J>(target, Default::default(), job),
        #[cfg(feature = "rocm")]
        Target::Rocm => probed::<burn::backend::Rocm, J>(target, Default::default(), job),
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        Target::Wgpu => probed::<burn::backend::Wgpu, J>(
            target,
            burn::backend::wgpu::WgpuDevice::DefaultDevice,
            job,
        ),
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        Target::WgpuCpu => {
            probed::<burn::backend::Wgpu, J>(target, burn::backend::wgpu::WgpuDevice::Cpu, job)
        }
        #[cfg(feature = "ndarray")]
        Target::NdArray => probed::<burn::backend::NdArray, J>(target, Default::default(), job),
        #[allow(unreachable_patterns)]
        other => Err(format!("{} is not compiled into this build", other.name())),
    }
}

/// Runs `job` on the first target in `order` whose device opens, printing why the ones
/// before it were skipped. `None` when none opens.
pub fn run_on_first<J: Job>(order: &[Target], job: &mut J) -> Option<(Target, J::Output)> {
    for &target in order {
        match run_on(target, job) {
            Ok(out) => return Some((target, out)),
            Err(why) => println!("skipped: {why}"),
        }
    }
    None
}

fn probed<B: FusedOps, J: Job>(
    target: Target,
    device: B::Device,
    job: &mut J,
) -> Result<J::Output, String> {
    probe::<B>(target, &device)?;
    Ok(job.run::<B>(target, device))
}

/// Adds 1 to a small tensor on the device and reads it back, with the panics of a missing
/// driver or adapter caught: they become the `Err` text instead of a backtrace. CubeCL
/// opens devices on its own threads, so the panic hook collects every thread's message
/// (the first one is the cause) while the probe runs.
fn probe<B: Backend>(target: Target, device: &B::Device) -> Result<(), String> {
    let messages: Arc<Mutex<Vec<String>>> = Arc::default();
    let previous_hook = std::panic::take_hook();
    {
        let messages = messages.clone();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(mut m) = messages.lock() {
                m.push(panic_text(info.payload()));
            }
        }));
    }
    let answer = catch_unwind(AssertUnwindSafe(|| {
        (Tensor::<B, 1>::from_floats([1.0, 2.0], device) + 1.0)
            .into_data()
            .to_vec::<f32>()
    }));
    std::panic::set_hook(previous_hook);
    let cause = match answer {
        Ok(Ok(values)) if values == [2.0, 3.0] => return Ok(()),
        Ok(Ok(values)) => format!("answered 1 + [1, 2] = {values:?}"),
        Ok(Err(err)) => format!("could not read a tensor back: {err:?}"),
        Err(payload) => messages
            .lock()
            .ok()
            .and_then(|m| m.first().cloned())
            .unwrap_or_else(|| panic_text(payload.as_ref())),
    };
    let cause = cause.lines().next().unwrap_or_default();
    let cause: String = cause.chars().take(200).collect();
    Err(format!(
        "{} did not open (it needs {}): {cause}",
        target.name(),
        target.needs()
    ))
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
