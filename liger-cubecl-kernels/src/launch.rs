//! How a row-wise kernel is laid out on the device: one cube per row (grid-strided),
//! a power-of-two number of units per cube, vectorized loads, and the reduction path.

use cubecl::features::Plane;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which cross-unit reduction the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReductionPath {
    /// Plane (warp/subgroup) operations when the device has them, else shared memory.
    Auto,
    /// Plane operations even where CubeCL does not advertise them (it hides subgroups on
    /// CPU adapters such as lavapipe, whose subgroups work): for tests on such devices.
    Plane,
    /// Shared-memory tree only.
    Shared,
}

static REDUCTION_PATH: AtomicU8 = AtomicU8::new(0);

/// Forces a reduction path for every later launch (tests run both paths on one device).
pub fn set_reduction_path(path: ReductionPath) {
    let v = match path {
        ReductionPath::Auto => 0,
        ReductionPath::Plane => 1,
        ReductionPath::Shared => 2,
    };
    REDUCTION_PATH.store(v, Ordering::Relaxed);
}

/// The reduction path in force.
pub fn reduction_path() -> ReductionPath {
    match REDUCTION_PATH.load(Ordering::Relaxed) {
        1 => ReductionPath::Plane,
        2 => ReductionPath::Shared,
        _ => ReductionPath::Auto,
    }
}

/// Problems a launch refuses before touching the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The element type is not one the kernels read.
    UnsupportedDtype { op: &'static str, dtype: String },
    /// A row is wider than the kernel can hold its per-unit accumulators for.
    RowTooWide {
        op: &'static str,
        width: usize,
        max: usize,
    },
    /// The problem or the device is outside what the kernel handles.
    Unsupported { op: &'static str, reason: String },
}

impl core::fmt::Display for KernelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KernelError::UnsupportedDtype { op, dtype } => {
                write!(
                    f,
                    "{op}: unsupported dtype {dtype} (the fused kernels read f32, f16 and bf16)"
                )
            }
            KernelError::RowTooWide { op, width, max } => {
                write!(
                    f,
                    "{op}: row width {width} exceeds the kernel's maximum of {max}"
                )
            }
            KernelError::Unsupported { op, reason } => write!(f, "{op}: unsupported: {reason}"),
        }
    }
}

impl std::error::Error for KernelError {}

/// Checks that `dtype` is one of the float types the kernels read.
pub fn check_float_dtype(op: &'static str, dtype: StorageType) -> Result<(), KernelError> {
    match dtype.elem_type() {
        ElemType::Float(FloatKind::F32 | FloatKind::F16 | FloatKind::BF16 | FloatKind::Flex32) => {
            Ok(())
        }
        other => Err(KernelError::UnsupportedDtype {
            op,
            dtype: format!("{other:?}"),
        }),
    }
}

/// Forward kernels: each unit walks about this many vectors of a row (one cube per row).
pub const FORWARD_VECTORS_PER_UNIT: usize = 4;
/// Softmax forward over wide rows: sixteen vectors per unit (fewer, busier units) measured
/// fastest on the H200 (8192×32768 bf16: 0.447 ms against 0.566 ms with four; see
/// benches/results/*/sweep.log).
pub const SOFTMAX_FORWARD_VECTORS_PER_UNIT: usize = 16;

/// Backward kernels walk many rows per cube (for the weight-gradient partials): two
/// vectors per unit and two cubes per multiprocessor measured fastest on the H200
/// (8192×4096 bf16: RMSNorm backward 0.164 ms against 0.224 ms with one vector per unit
/// and four cubes per multiprocessor; see benches/results/*/sweep.log).
pub const BACKWARD_VECTORS_PER_UNIT: usize = 2;
/// Backward cubes per multiprocessor (each writes one f32 row of weight-gradient partials).
pub const PARTIALS_PER_SM: usize = 2;

/// Most vectors per unit kept in registers (8 vectors of 8 halves: 64 f32 registers).
pub const MAX_CACHED_CHUNKS: usize = 8;

/// Launch-geometry overrides for tuning sweeps on a device, read once from the
/// environment: `LIGER_FWD_VPU`, `LIGER_BWD_VPU` (vectors per unit), `LIGER_PARTIALS_PER_SM`
/// (backward cubes per multiprocessor), `LIGER_MAX_CACHED` (register-cached chunks),
/// `LIGER_EW_UNITS`, `LIGER_EW_VPU`, `LIGER_EW_CUBES_PER_SM`, `LIGER_EW_MAX_VECTOR`
/// (elementwise kernels' units per cube, vectors per unit, grid cap, elements per load),
/// `LIGER_ROPE_HEADS` (heads per RoPE unit), `LIGER_ROPE_CUBES_PER_SM` (RoPE cube cap).
/// Unset means the constants above. Results do not depend on them beyond f32 rounding
/// (tests cover the geometries they produce); only speed does.
pub(crate) fn tuning(name: &str, default: usize) -> usize {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static VALUES: OnceLock<HashMap<String, usize>> = OnceLock::new();
    let values = VALUES.get_or_init(|| {
        [
            "LIGER_FWD_VPU",
            "LIGER_BWD_VPU",
            "LIGER_PARTIALS_PER_SM",
            "LIGER_MAX_CACHED",
            "LIGER_EW_UNITS",
            "LIGER_EW_VPU",
            "LIGER_ROPE_HEADS",
            "LIGER_ROPE_CUBES_PER_SM",
            "LIGER_EW_CUBES_PER_SM",
            "LIGER_EW_MAX_VECTOR",
        ]
        .iter()
        .filter_map(|k| {
            std::env::var(k)
                .ok()?
                .parse()
                .ok()
                .map(|v| (k.to_string(), v))
        })
        .collect()
    });
    values
        .get(name)
        .copied()
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// Launch geometry of a row-wise kernel.
#[derive(Clone, Copy, Debug)]
pub struct RowLaunch {
    /// Cubes launched; each walks rows `CUBE_POS, CUBE_POS + CUBE_COUNT, ...`.
    pub cubes: u32,
    /// Units per cube (a power of two).
    pub units: u32,
    /// Elements per vectorized load; divides the row width.
    pub vector_size: usize,
    /// Whether the cube reduction uses plane operations.
    pub use_plane: bool,
}

impl RowLaunch {
    /// Geometry for `rows` rows of `width` elements of `elem_size` bytes, at most
    /// `max_cubes` cubes, about `vectors_per_unit` vectors walked by each unit.
    pub fn new<R: Runtime>(
        client: &ComputeClient<R>,
        rows: usize,
        width: usize,
        elem_size: usize,
        max_cubes: usize,
        vectors_per_unit: usize,
    ) -> Self {
        let props = client.properties();
        let vector_size = client
            .io_optimized_vector_sizes(elem_size)
            .filter(|v| width % v == 0)
            .max()
            .unwrap_or(1);
        let vectors = width / vector_size;
        let hw_max = props
            .hardware
            .max_units_per_cube
            .min(props.hardware.max_cube_dim.0)
            .max(1);
        // Enough units that each walks about `vectors_per_unit` vectors, within the device limit.
        let vectors_per_unit = match vectors_per_unit {
            FORWARD_VECTORS_PER_UNIT => tuning("LIGER_FWD_VPU", FORWARD_VECTORS_PER_UNIT),
            SOFTMAX_FORWARD_VECTORS_PER_UNIT => {
                tuning("LIGER_FWD_VPU", SOFTMAX_FORWARD_VECTORS_PER_UNIT)
            }
            BACKWARD_VECTORS_PER_UNIT => tuning("LIGER_BWD_VPU", BACKWARD_VECTORS_PER_UNIT),
            other => other,
        };
        let wanted = (vectors.div_ceil(vectors_per_unit.max(1))).clamp(32, 1024) as u32;
        let units = prev_power_of_two(wanted.min(hw_max));
        let plane_ok = client.features().plane.contains(Plane::Ops)
            && props.hardware.plane_size_max >= 1
            && units >= props.hardware.plane_size_max;
        let use_plane = match reduction_path() {
            ReductionPath::Shared => false,
            ReductionPath::Auto => plane_ok,
            ReductionPath::Plane => units >= props.hardware.plane_size_max,
        };
        let max_count = props.hardware.max_cube_count.0.max(1) as usize;
        let cubes = rows.min(max_cubes).min(max_count).min(65_535).max(1) as u32;
        Self {
            cubes,
            units,
            vector_size,
            use_plane,
        }
    }

    /// Vectors per row.
    pub fn vectors(&self, width: usize) -> usize {
        width / self.vector_size
    }

    /// Per-unit accumulator slots a kernel that keeps one per walked vector needs.
    pub fn chunks(&self, width: usize) -> usize {
        self.vectors(width).div_ceil(self.units as usize).max(1)
    }

    /// Chunks a forward kernel keeps in registers between its passes, or `0` when the row
    /// is too wide to cache (then it is read again, mostly from L2).
    pub fn cached_chunks(&self, width: usize) -> u32 {
        let chunks = self.chunks(width);
        if chunks <= MAX_CACHED_CHUNKS {
            chunks as u32
        } else {
            0
        }
    }

    pub(crate) fn count(&self) -> CubeCount {
        CubeCount::Static(self.cubes, 1, 1)
    }

    pub(crate) fn dim(&self) -> CubeDim {
        CubeDim::new_1d(self.units)
    }
}

fn prev_power_of_two(x: u32) -> u32 {
    if x <= 1 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

/// Most vectors a unit walks in a backward kernel (its per-unit gradient accumulators).
pub const MAX_BACKWARD_CHUNKS: usize = 32;

impl RowLaunch {
    /// Geometry of a backward kernel that accumulates one f32 row of weight-gradient
    /// partials per cube: checks `dtype` and that the per-unit accumulators fit.
    /// Returns the geometry and its chunks (vectors per unit).
    pub fn backward<R: Runtime>(
        op: &'static str,
        client: &ComputeClient<R>,
        rows: usize,
        width: usize,
        dtype: StorageType,
    ) -> Result<(Self, usize), KernelError> {
        check_float_dtype(op, dtype)?;
        let launch = Self::new(
            client,
            rows,
            width,
            dtype.size(),
            partial_cubes(client, rows),
            BACKWARD_VECTORS_PER_UNIT,
        );
        let chunks = launch.chunks(width);
        if chunks > MAX_BACKWARD_CHUNKS {
            let max = MAX_BACKWARD_CHUNKS * launch.units as usize * launch.vector_size;
            return Err(KernelError::RowTooWide { op, width, max });
        }
        Ok((launch, chunks))
    }
}

/// Upper bound on cubes for kernels that accumulate per-cube partials (weight gradients):
/// a few per multiprocessor, so the partial buffer stays small.
pub fn partial_cubes<R: Runtime>(client: &ComputeClient<R>, rows: usize) -> usize {
    let sms = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(32) as usize;
    rows.min(sms * tuning("LIGER_PARTIALS_PER_SM", PARTIALS_PER_SM))
        .max(1)
}

/// Builds an array argument over a contiguous buffer of `len` items.
pub(crate) fn array<R: Runtime>(handle: &cubecl::server::Handle, len: usize) -> ArrayArg<R> {
    // Safety: every caller passes the item count of a buffer it allocated or was given
    // with that exact size (checked by the Burn glue before launch).
    unsafe { ArrayArg::from_raw_parts(handle.clone(), len) }
}
