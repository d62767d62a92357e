//! Devices: which backend runs on which `--device`, whether it is compiled in and
//! present, and what the CubeCL client says about it (plane support, pool memory).
//!
//! | `--device` | backend `B`                          | device                       |
//! |------------|--------------------------------------|------------------------------|
//! | `cuda`     | `burn::backend::Cuda` (fusion)       | `CudaDevice::default()`      |
//! | `rocm`     | `burn::backend::Rocm` (fusion)       | `RocmDevice::default()`      |
//! | `vulkan`   | `burn::backend::Wgpu` (fusion)       | `WgpuDevice::DefaultDevice`  |
//! | `wgpu`     | `burn::backend::Wgpu` (fusion)       | `WgpuDevice::DefaultDevice`  |
//! | `wgpu-cpu` | `burn::backend::Wgpu` (fusion)       | `WgpuDevice::Cpu` (lavapipe) |
//! | `ndarray`  | `burn::backend::NdArray` (fallback)  | CPU                          |
//!
//! `auto` (the default) takes the first of cuda, rocm, vulkan, ndarray that is compiled
//! in and answers the probe.
//!
//! Commands are generic over the backend ([`OnDevice::run`]); [`dispatch`] picks it.

use crate::ceiling::{self, CopyResult, CopySpec};
use anyhow::{Result, bail};
use burn::tensor::{Tensor, backend::Backend};
use clap::ValueEnum;
use liger_burn::ops::FusedOps;
use liger_cubecl_kernels::ReductionPath;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// A `--device` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// The first compiled-in device that answers: cuda, rocm, vulkan, then ndarray.
    Auto,
    /// NVIDIA GPU through CUDA (feature `cuda`).
    Cuda,
    /// AMD GPU through ROCm/HIP (feature `rocm`).
    Rocm,
    /// The default wgpu adapter, SPIR-V on Vulkan (feature `vulkan`).
    Vulkan,
    /// The default wgpu adapter (feature `wgpu` or `vulkan`).
    Wgpu,
    /// wgpu's CPU adapter: Mesa lavapipe, the CI device (feature `vulkan` or `wgpu`).
    WgpuCpu,
    /// Burn's NdArray CPU backend: the stock-op fallback, no kernels (feature `ndarray`).
    Ndarray,
}

impl DeviceKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Auto => "auto",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
            DeviceKind::Vulkan => "vulkan",
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::WgpuCpu => "wgpu-cpu",
            DeviceKind::Ndarray => "ndarray",
        }
    }

    /// The cargo feature(s) that compile this device in.
    fn features(self) -> &'static str {
        match self {
            DeviceKind::Auto => "any device",
            DeviceKind::Cuda => "`cuda`",
            DeviceKind::Rocm => "`rocm`",
            DeviceKind::Vulkan | DeviceKind::Wgpu | DeviceKind::WgpuCpu => "`vulkan` or `wgpu`",
            DeviceKind::Ndarray => "`ndarray`",
        }
    }

    /// What the device needs to be present.
    fn needs(self) -> &'static str {
        match self {
            DeviceKind::Auto => "one of the devices compiled in",
            DeviceKind::Cuda => "an NVIDIA GPU with its driver (libcuda) installed",
            DeviceKind::Rocm => "an AMD GPU with ROCm/HIP installed",
            DeviceKind::Vulkan | DeviceKind::Wgpu => {
                "a GPU adapter wgpu can open (Vulkan, Metal or DX12 driver)"
            }
            DeviceKind::WgpuCpu => {
                "a CPU Vulkan adapter, e.g. Mesa's lavapipe (Debian/Ubuntu: mesa-vulkan-drivers)"
            }
            DeviceKind::Ndarray => "nothing",
        }
    }
}

impl DeviceKind {
    /// Whether this build has the device.
    fn compiled(self) -> bool {
        match self {
            DeviceKind::Auto => true,
            DeviceKind::Cuda => cfg!(feature = "cuda"),
            DeviceKind::Rocm => cfg!(feature = "rocm"),
            DeviceKind::Vulkan | DeviceKind::Wgpu | DeviceKind::WgpuCpu => {
                cfg!(any(feature = "vulkan", feature = "wgpu"))
            }
            DeviceKind::Ndarray => cfg!(feature = "ndarray"),
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Pool memory of a CubeCL client, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolUsage {
    /// Bytes the pools hold from the device (pages), used or not.
    pub reserved: u64,
    /// Bytes in live allocations.
    pub in_use: u64,
    /// The device allocator's own counters, where the runtime's pool takes its buffers
    /// from one (CUDA's stream-ordered pool): the device memory actually held.
    pub device: Option<DevicePoolUsage>,
}

/// High-water marks of the device allocator beneath CubeCL's pool (CUDA's stream-ordered
/// pool), bytes, since the last [`CubeInfo::trim_device_pool`].
#[derive(Clone, Copy, Debug, Default)]
pub struct DevicePoolUsage {
    /// The most device memory it held.
    pub reserved_high: u64,
    /// The most its allocations (CubeCL's buffers, free or not) took at once.
    pub used_high: u64,
}

/// Hooks on the device allocator beneath CubeCL's pool.
struct DevicePool {
    usage: Box<dyn Fn() -> DevicePoolUsage>,
    trim: Box<dyn Fn()>,
}

/// What the CubeCL client of a device tells, and the memory hooks it offers.
pub struct CubeInfo {
    /// The runtime's own name for the device (`cuda`, `wgpu<vulkan>`, ...).
    pub runtime: String,
    /// Plane (warp/subgroup) operations available.
    pub plane_ops: bool,
    /// Smallest plane size the device reports.
    pub plane_size_min: u32,
    /// Largest plane size the device reports.
    pub plane_size_max: u32,
    /// Largest single allocation, bytes.
    pub max_alloc: u64,
    usage: Box<dyn Fn() -> PoolUsage>,
    cleanup: Box<dyn Fn()>,
    device_pool: Option<DevicePool>,
}

impl CubeInfo {
    #[cfg_attr(
        not(any(
            feature = "vulkan",
            feature = "wgpu",
            feature = "cuda",
            feature = "rocm"
        )),
        allow(dead_code)
    )]
    fn of<R: cubecl::Runtime>(device: &R::Device) -> Self {
        let client = R::client(device);
        let props = client.properties();
        let plane_ops = client
            .features()
            .plane
            .contains(cubecl::features::Plane::Ops);
        let usage_client = client.clone();
        let cleanup_client = client.clone();
        CubeInfo {
            runtime: R::name(&client).to_string(),
            plane_ops,
            plane_size_min: props.hardware.plane_size_min,
            plane_size_max: props.hardware.plane_size_max,
            max_alloc: props.memory.max_page_size,
            usage: Box::new(move || {
                let u = usage_client
                    .memory_usage()
                    .expect("reading the memory usage of the CubeCL client");
                PoolUsage {
                    reserved: u.bytes_reserved,
                    in_use: u.bytes_in_use,
                    device: None,
                }
            }),
            cleanup: Box::new(move || cleanup_client.memory_cleanup()),
            device_pool: None,
        }
    }

    /// Adds the counters of CUDA device `ordinal`'s stream-ordered pool, from which
    /// cubecl-cuda allocates; under `--memory-pool release` the pool is also set to keep
    /// what CubeCL gives back ([`liger_burn::cube::cuda_pool::keep_freed_memory`]).
    #[cfg(feature = "cuda")]
    fn with_cuda_pool(mut self, ordinal: usize) -> Result<Self> {
        use liger_burn::cube::cuda_pool;
        if crate::pool::configured() == crate::pool::MemoryPool::Release {
            cuda_pool::keep_freed_memory(ordinal).map_err(anyhow::Error::msg)?;
        }
        cuda_pool::usage(ordinal).map_err(anyhow::Error::msg)?;
        self.device_pool = Some(DevicePool {
            usage: Box::new(move || {
                let u = cuda_pool::usage(ordinal)
                    .expect("reading the counters of the CUDA memory pool");
                DevicePoolUsage {
                    reserved_high: u.reserved_high,
                    used_high: u.used_high,
                }
            }),
            trim: Box::new(move || {
                cuda_pool::trim(ordinal).expect("trimming the CUDA memory pool");
            }),
        });
        Ok(self)
    }

    /// Current pool usage (call after a sync so queued work is accounted).
    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            device: self.device_pool.as_ref().map(|p| (p.usage)()),
            ..(self.usage)()
        }
    }

    /// Returns the memory the device allocator beneath CubeCL's pool holds unused and
    /// restarts its high-water marks (after a [`cleanup`](Self::cleanup) and a sync: the
    /// marks then start from what is live). Nothing where there is no such allocator.
    pub fn trim_device_pool(&self) {
        if let Some(p) = &self.device_pool {
            (p.trim)()
        }
    }

    /// Releases the pool pages that hold no live allocation.
    pub fn cleanup(&self) {
        (self.cleanup)()
    }

    /// Which reduction the kernels take on this device under `path`, in words. Mirrors
    /// `liger_cubecl_kernels::RowLaunch::new`: `Auto` takes plane ops where CubeCL
    /// advertises `Plane::Ops`, `Plane` takes them regardless (CubeCL hides the working
    /// subgroups of CPU adapters such as lavapipe), and either needs at least a plane's
    /// worth of units per cube (launches use 32 to 1024 units).
    pub fn reduction_in_use(&self, path: ReductionPath) -> String {
        let planes = format!(
            "plane size {}..{}",
            self.plane_size_min, self.plane_size_max
        );
        let has_plane = self.plane_ops && self.plane_size_max >= 1;
        match path {
            ReductionPath::Shared => format!(
                "shared-memory tree (forced; device has {})",
                if has_plane {
                    format!("plane ops, {planes}")
                } else {
                    "no advertised plane ops".into()
                }
            ),
            ReductionPath::Auto if has_plane => format!(
                "plane ops (auto; {planes}; launches with fewer units than a plane use the shared-memory tree)"
            ),
            ReductionPath::Auto => {
                "shared-memory tree (auto: CubeCL advertises no plane ops on this device)".into()
            }
            ReductionPath::Plane => format!(
                "plane ops (forced{}; {planes}; launches with fewer units than a plane use the shared-memory tree)",
                if self.plane_ops {
                    ""
                } else {
                    ", although CubeCL does not advertise them on this device"
                }
            ),
        }
    }
}

/// Runs the copy that gives the bandwidth ceiling.
pub type CopyFn = Box<dyn Fn(&CopySpec) -> CopyResult>;

/// A device ready to run on, with backend `B`.
pub struct Ctx<B: Backend> {
    /// The `--device` value.
    pub kind: DeviceKind,
    /// The Burn device.
    pub device: B::Device,
    /// CubeCL client information and memory hooks (`None` on ndarray).
    pub cube: Option<CubeInfo>,
    /// The copy ceiling, timed on the backend without fusion (one elementwise kernel
    /// per op, so neither dead-output elimination nor cross-iteration fusion applies).
    pub copy: CopyFn,
}

impl<B: Backend> Ctx<B> {
    /// Waits for every queued operation (fusion stream flushed, device synchronized).
    pub fn sync(&self) {
        B::sync(&self.device).expect("device synchronization failed");
    }

    /// Prints backend, device and reduction-path lines (shared by the subcommands).
    pub fn describe(&self, path: Option<ReductionPath>) {
        println!("device:    {} ({})", self.kind, B::name(&self.device));
        match &self.cube {
            Some(cube) => {
                println!("runtime:   {}", cube.runtime);
                println!(
                    "planes:    ops {}, size {}..{}",
                    if cube.plane_ops { "yes" } else { "no" },
                    cube.plane_size_min,
                    cube.plane_size_max
                );
                if let Some(path) = path {
                    println!("reduction: {}", cube.reduction_in_use(path));
                }
            }
            None => println!("reduction: n/a (stock-op fallback, no fused kernels)"),
        }
    }
}

/// A command generic over the backend.
pub trait OnDevice {
    /// Runs on `ctx`.
    fn run<B: FusedOps>(self, ctx: Ctx<B>) -> Result<ExitCode>;
}

fn copy_fn<P: Backend>(device: P::Device) -> CopyFn {
    Box::new(move |spec| ceiling::copy::<P>(&device, spec))
}

/// Builds the backend and device of `kind`, checks the device answers, and runs `cmd`.
pub fn dispatch(kind: DeviceKind, cmd: impl OnDevice) -> Result<ExitCode> {
    let kind = if kind == DeviceKind::Auto {
        pick()?
    } else {
        kind
    };
    match kind {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        DeviceKind::Vulkan | DeviceKind::Wgpu | DeviceKind::WgpuCpu => {
            use burn::backend::wgpu::{Wgpu, WgpuRuntime};
            type Plain = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;
            let device = wgpu_device(kind);
            probe::<Wgpu>(kind, &device)?;
            cmd.run(Ctx::<Wgpu> {
                kind,
                cube: Some(CubeInfo::of::<WgpuRuntime>(&device)),
                copy: copy_fn::<Plain>(device.clone()),
                device,
            })
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            use burn::backend::Cuda;
            use burn::backend::cuda::CudaDevice;
            use cubecl::cuda::CudaRuntime;
            type Plain = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;
            let device = CudaDevice::default();
            probe::<Cuda>(kind, &device)?;
            cmd.run(Ctx::<Cuda> {
                kind,
                cube: Some(CubeInfo::of::<CudaRuntime>(&device).with_cuda_pool(device.index)?),
                copy: copy_fn::<Plain>(device.clone()),
                device,
            })
        }
        #[cfg(feature = "rocm")]
        DeviceKind::Rocm => {
            use burn::backend::Rocm;
            use burn::backend::rocm::RocmDevice;
            use cubecl::hip::HipRuntime;
            type Plain = burn_cubecl::CubeBackend<HipRuntime, f32, i32, u8>;
            let device = RocmDevice::default();
            probe::<Rocm>(kind, &device)?;
            cmd.run(Ctx::<Rocm> {
                kind,
                cube: Some(CubeInfo::of::<HipRuntime>(&device)),
                copy: copy_fn::<Plain>(device.clone()),
                device,
            })
        }
        #[cfg(feature = "ndarray")]
        DeviceKind::Ndarray => {
            use burn::backend::NdArray;
            let device = Default::default();
            probe::<NdArray>(kind, &device)?;
            cmd.run(Ctx::<NdArray> {
                kind,
                cube: None,
                copy: copy_fn::<NdArray>(device),
                device,
            })
        }
        #[allow(unreachable_patterns)]
        other => bail!(
            "device `{other}` is not compiled into this binary; rebuild with the {} feature, \
             e.g. `cargo run --release --bin liger --features {} -- ...`",
            other.features(),
            match other {
                DeviceKind::Vulkan | DeviceKind::Wgpu | DeviceKind::WgpuCpu => "vulkan",
                _ => other.name(),
            }
        ),
    }
}

/// `--device auto`: the first of cuda, rocm, vulkan, ndarray compiled in and present.
fn pick() -> Result<DeviceKind> {
    let mut skipped = Vec::new();
    for kind in [
        DeviceKind::Cuda,
        DeviceKind::Rocm,
        DeviceKind::Vulkan,
        DeviceKind::Ndarray,
    ] {
        if !kind.compiled() {
            continue;
        }
        match probe_kind(kind) {
            Ok(()) => {
                for (k, why) in &skipped {
                    eprintln!("note: --device auto: {k} not usable here ({why})");
                }
                // stderr: `liger eval` keeps stdout for its JSON result.
                eprintln!("auto:      picked {kind}");
                return Ok(kind);
            }
            Err(err) => {
                let why = err
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                skipped.push((kind, why));
            }
        }
    }
    let tried: Vec<String> = skipped
        .iter()
        .map(|(k, why)| format!("{k}: {why}"))
        .collect();
    bail!(
        "--device auto found no usable device in this build (tried: {})",
        if tried.is_empty() {
            "none compiled in".to_string()
        } else {
            tried.join("; ")
        }
    )
}

/// Probes `kind` without running anything on it.
fn probe_kind(kind: DeviceKind) -> Result<()> {
    match kind {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        DeviceKind::Vulkan | DeviceKind::Wgpu | DeviceKind::WgpuCpu => {
            probe::<burn::backend::wgpu::Wgpu>(kind, &wgpu_device(kind))
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => probe::<burn::backend::Cuda>(kind, &Default::default()),
        #[cfg(feature = "rocm")]
        DeviceKind::Rocm => probe::<burn::backend::Rocm>(kind, &Default::default()),
        #[cfg(feature = "ndarray")]
        DeviceKind::Ndarray => probe::<burn::backend::NdArray>(kind, &Default::default()),
        #[allow(unreachable_patterns)]
        other => bail!("device `{other}` is not compiled into this binary"),
    }
}

#[cfg(any(feature = "vulkan", feature = "wgpu"))]
fn wgpu_device(kind: DeviceKind) -> burn::backend::wgpu::WgpuDevice {
    use burn::backend::wgpu::WgpuDevice;
    if kind == DeviceKind::WgpuCpu {
        WgpuDevice::Cpu
    } else {
        WgpuDevice::DefaultDevice
    }
}

/// Creates a tiny tensor on the device and reads it back, with panics caught, so a
/// missing driver or adapter is an error, not a backtrace. The panic hook is replaced
/// for the probe: it records the messages of every thread instead of printing them
/// (runtimes initialize on their own threads; the first message is the root cause).
fn probe<B: Backend>(kind: DeviceKind, device: &B::Device) -> Result<()> {
    let messages: Arc<Mutex<Vec<String>>> = Arc::default();
    let hook = std::panic::take_hook();
    {
        let messages = messages.clone();
        std::panic::set_hook(Box::new(move |info| {
            let text = payload_text(info.payload());
            let at = info
                .location()
                .map(|l| format!(" (at {}:{})", l.file(), l.line()))
                .unwrap_or_default();
            if let Ok(mut m) = messages.lock() {
                m.push(format!("{text}{at}"));
            }
        }));
    }
    let result = catch_unwind(AssertUnwindSafe(|| {
        let t = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0], device);
        (t + 1.0).into_data().to_vec::<f32>()
    }));
    std::panic::set_hook(hook);
    match result {
        Ok(Ok(values)) if values == [2.0, 3.0, 4.0] => Ok(()),
        Ok(Ok(values)) => bail!(
            "device `{kind}` answered a probe wrongly (1+[1, 2, 3] gave {values:?}); not using it"
        ),
        Ok(Err(err)) => bail!("device `{kind}`: could not read a probe tensor back: {err:?}"),
        Err(payload) => {
            let mut causes = messages.lock().map(|m| m.clone()).unwrap_or_default();
            if causes.is_empty() {
                causes.push(payload_text(payload.as_ref()));
            }
            causes.dedup();
            let causes: Vec<String> = causes.iter().take(3).map(|c| shorten(c)).collect();
            bail!(
                "device `{kind}` is not present or not usable here (it needs {}).\n  \
                 initializing it failed with: {}",
                kind.needs(),
                causes.join("\n  then: ")
            )
        }
    }
}

/// The message of a panic payload.
/// Prints whether `B` supports `dtype` on `device`; when it does not, says so on stderr
/// (`nothing to {task}`, plus `hint`) and returns the exit code 2 to stop with.
pub fn require_dtype<B: Backend>(
    device: &B::Device,
    dtype: burn::tensor::DType,
    shown: impl std::fmt::Display,
    task: &str,
    hint: &str,
) -> Option<ExitCode> {
    let supported = B::supports_dtype(device, dtype);
    println!(
        "dtype:     {shown} ({})",
        if supported {
            "supported"
        } else {
            "NOT supported"
        }
    );
    if supported {
        return None;
    }
    eprintln!(
        "error: {} does not support {shown} on this device; nothing to {task}{hint}",
        B::name(device)
    );
    Some(ExitCode::from(2))
}

pub fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// First lines of a (possibly long) panic message.
fn shorten(msg: &str) -> String {
    let out: String = msg.lines().take(4).collect::<Vec<_>>().join("\n    ");
    match out.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &out[..cut]),
        None => out,
    }
}
