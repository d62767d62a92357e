//! How a row-wise kernel is laid out on the device: one cube per row (grid-strided),
//! a power-of-two number of units per cube, vectorized loads, and the reduction path.

use cubecl::features::Plane;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

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

/// Whether this runtime's compiler turns CubeCL's fast-math modes into the hardware
/// intrinsics (`__expf`, `__fdividef`): CUDA and HIP. Other compilers attach the modes'
/// assumptions (no NaN, no infinity) to the code instead, which could change what NaN and
/// infinite inputs give.
pub(crate) fn hardware_math_supported<R: Runtime>(client: &ComputeClient<R>) -> bool {
    matches!(R::name(client), "cuda" | "hip")
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

/// Most vectors per unit kept in registers (8 vectors of 8 halves: 64 f32 registers).
pub const MAX_CACHED_CHUNKS: usize = 8;

/// The launch geometry of every kernel in this crate, passed explicitly to each launch
/// function. Results do not depend on it beyond f32 summation order (the suites run
/// several geometries); only speed does.
///
/// [`LaunchConfig::for_device`] is the table callers should use. Its values, and where
/// they were measured:
///
/// | field | value | measured on |
/// |---|---|---|
/// | `reduction` | `Auto` (plane ops where the device has them, else shared memory) | every device |
/// | `forward_vectors_per_unit` | 4 | H200, RMSNorm/LayerNorm 8192×4096 bf16 |
/// | `softmax_forward_vectors_per_unit` | 16 (0.447 ms against 0.566 ms with 4, softmax 8192×32768 bf16) | H200 |
/// | `cross_entropy_cubes_per_sm` | `None`: one cube per row (8192×128256 bf16 without the target check, forward / full: 1.10–1.13 / 2.19–2.26 ms; 1 a multiprocessor 1.48 / 2.79, its kernel reading 5.9 instead of 6.3 GB but at 64% instead of 82% of the DRAM peak; 2 a multiprocessor 1.19 / 2.33) | H200 |
/// | `backward_vectors_per_unit` | 2 (RMSNorm backward 8192×4096 bf16: 0.164 ms against 0.224 ms with 1 and 4 cubes per SM) | H200 |
/// | `backward_units_per_sm` | 512 (`batch.sh norm-sweep`, bf16 at widths 1536, 2048 and 4096 against 256 and 1024: the fastest for LayerNorm at all three and RMSNorm at 1536; RMSNorm at 2048 and 4096 is faster at 1024) | H200 |
/// | `elementwise` | see [`ElementwiseConfig`] | H200 |
/// | `rope` | see [`RopeConfig`] | H200 |
/// | `optimizer` | the `elementwise` values (not swept yet) | — |
///
/// Other devices get the same values: no other device has been swept yet, and the
/// values only set how much work each unit does, which every device runs correctly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Which cross-unit reduction the row kernels use.
    pub reduction: ReductionPath,
    /// Row-kernel forwards: each unit walks about this many vectors of a row (one cube
    /// per row).
    pub forward_vectors_per_unit: usize,
    /// Softmax and cross-entropy forwards over wide rows: fewer, busier units.
    pub softmax_forward_vectors_per_unit: usize,
    /// Cross entropy (loss and backward): at most this many cubes per multiprocessor, each
    /// walking rows in turn (`None`: one cube per row). Fewer rows in flight let a row stay
    /// in L2 between the kernel's two passes over it, but also keep fewer loads in flight
    /// (see the table for which wins).
    pub cross_entropy_cubes_per_sm: Option<usize>,
    /// Row-kernel backwards, which walk many rows per cube for the weight-gradient partials.
    pub backward_vectors_per_unit: usize,
    /// Units per multiprocessor of a row-kernel backward: its cubes per multiprocessor are
    /// this over the units of one cube (at least one). Each cube writes one f32 row of
    /// weight-gradient partials, so the partials grow with it.
    pub backward_units_per_sm: usize,
    /// The elementwise kernel (activations, gated units).
    pub elementwise: ElementwiseConfig,
    /// The rotary-embedding kernel.
    pub rope: RopeConfig,
    /// The fused optimizer step ([`crate::adamw`]), an elementwise kernel over four to six
    /// streams.
    pub optimizer: ElementwiseConfig,
}

/// Geometry of the elementwise kernel (GELU, sigmoid, SwiGLU, GeGLU), forward and backward.
///
/// H200, bf16 8192×14336 SwiGLU (benches/data, `scripts/device/`): 64 units × 1 vector
/// at most 65,535 cubes a launch was the fastest (forward 0.181 ms; 128 × 1 and 256 × 1
/// within 7%; every 4-vector setting slower). Four elements per load (8-byte loads of
/// f16/bf16) keep 32 registers live per unit instead of 48 with eight, and took the SwiGLU
/// forward kernel from 185 to 164 µs (4.30 TB/s, as fast as Burn's `x + y` over the same
/// bytes). The cap makes each cube walk about seven blocks of that buffer: on an H100 the
/// forward took 0.240 ms under it and 0.280 ms with one block a cube (458,752 cubes,
/// `max_cubes: None`; `benches/kernels.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElementwiseConfig {
    /// Units per cube (rounded down to a power of two within the device limit).
    pub units: usize,
    /// Vectors each unit loads per grid step (1..=16).
    pub vectors_per_unit: usize,
    /// Most elements per vectorized load.
    pub max_vector: usize,
    /// Cap on cubes per multiprocessor (a persistent, grid-striding grid); `None`: one
    /// block per cube.
    pub cubes_per_sm: Option<usize>,
    /// Cap on cubes per launch (more blocks are grid-strided; tests use a small one to
    /// reach that path). `None`: one block per cube, in a two-dimensional grid where the
    /// device limits a dimension.
    pub max_cubes: Option<usize>,
    /// Most vectors one launch addresses; larger buffers take several launches over
    /// offset handles (tests use a small one to reach that path). `None`: the 32-bit
    /// index limit.
    pub vectors_per_launch: Option<usize>,
    /// Cap on cubes along the grid's first dimension, below the device's limit (tests use
    /// a small one to reach the two-dimensional grid that large buffers take on devices
    /// with 65,535 cubes a dimension). `None`: the device's limit.
    pub max_cubes_x: Option<usize>,
    /// f16/bf16 activations on CUDA and HIP take the hardware exponential and reciprocal
    /// (`pointwise::activation_exp`, within the error the conformance bounds allow any
    /// device's `exp`). Off by default: it cuts the bf16 SwiGLU forward from about 30 to
    /// 19 instructions an element, but the kernel is not issue-bound (Nsight Compute on an
    /// H200: 48% of the issue peak, as Liger-Kernel's), and it measured no faster on an
    /// H100 (`benches/kernels.md`). f32 and the other runtimes always take the accurate ones.
    pub hardware_math: bool,
}

/// Geometry of the rotary-embedding kernel: 256 units per cube, each rotating
/// `heads_per_unit` heads with one read of its cos/sin vectors, at most `cubes_per_sm`
/// cubes per multiprocessor before units walk several work items.
///
/// H200, bf16 B4 T2048 32q/8kv d128: 4 heads per unit, 16 cubes per multiprocessor
/// (forward 0.074 ms, 2283 GB/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeConfig {
    /// Heads each unit rotates (1..=32).
    pub heads_per_unit: usize,
    /// Cubes per multiprocessor (a persistent grid).
    pub cubes_per_sm: usize,
}

impl LaunchConfig {
    /// The geometry for a device (see the table in the type's docs).
    pub fn for_device(_properties: &cubecl::ir::DeviceProperties) -> Self {
        Self::default()
    }

    /// This geometry with another reduction path.
    pub fn with_reduction(self, reduction: ReductionPath) -> Self {
        Self { reduction, ..self }
    }
}

impl Default for LaunchConfig {
    fn default() -> Self {
        LaunchConfig {
            reduction: ReductionPath::Auto,
            forward_vectors_per_unit: 4,
            softmax_forward_vectors_per_unit: 16,
            cross_entropy_cubes_per_sm: None,
            backward_vectors_per_unit: 2,
            backward_units_per_sm: 512,
            elementwise: ElementwiseConfig {
                units: 64,
                vectors_per_unit: 1,
                max_vector: 4,
                cubes_per_sm: None,
                max_cubes: Some(65_535),
                vectors_per_launch: None,
                max_cubes_x: None,
                hardware_math: false,
            },
            rope: RopeConfig {
                heads_per_unit: 4,
                cubes_per_sm: 16,
            },
            optimizer: ElementwiseConfig {
                units: 64,
                vectors_per_unit: 1,
                max_vector: 4,
                cubes_per_sm: None,
                max_cubes: Some(65_535),
                vectors_per_launch: None,
                max_cubes_x: None,
                hardware_math: false,
            },
        }
    }
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
    /// `max_cubes` cubes, about `vectors_per_unit` vectors walked by each unit, reducing
    /// across units by `reduction`.
    pub fn new<R: Runtime>(
        client: &ComputeClient<R>,
        rows: usize,
        width: usize,
        elem_size: usize,
        max_cubes: usize,
        vectors_per_unit: usize,
        reduction: ReductionPath,
    ) -> Self {
        let props = client.properties();
        let vector_size = vector_size(client, width, elem_size);
        let vectors = width / vector_size;
        let hw_max = props
            .hardware
            .max_units_per_cube
            .min(props.hardware.max_cube_dim.0)
            .max(1);
        // Enough units that each walks about `vectors_per_unit` vectors, within the device limit.
        let wanted = (vectors.div_ceil(vectors_per_unit.max(1))).clamp(32, 1024) as u32;
        let units = prev_power_of_two(wanted.min(hw_max));
        let plane_ok = client.features().plane.contains(Plane::Ops)
            && props.hardware.plane_size_max >= 1
            && units >= props.hardware.plane_size_max;
        let use_plane = match reduction {
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
        config: &LaunchConfig,
        rows: usize,
        width: usize,
        dtype: StorageType,
    ) -> Result<(Self, usize), KernelError> {
        check_float_dtype(op, dtype)?;
        let mut launch = Self::new(
            client,
            rows,
            width,
            dtype.size(),
            usize::MAX,
            config.backward_vectors_per_unit,
            config.reduction,
        );
        launch.cubes = launch
            .cubes
            .min(partial_cubes(client, config, rows, launch.units));
        let chunks = launch.chunks(width);
        if chunks > MAX_BACKWARD_CHUNKS {
            let max = MAX_BACKWARD_CHUNKS * launch.units as usize * launch.vector_size;
            return Err(KernelError::RowTooWide { op, width, max });
        }
        Ok((launch, chunks))
    }
}

/// The device's multiprocessors, for grids sized per multiprocessor (32 where the device
/// does not report them, as wgpu's adapters do not).
pub fn multiprocessors<R: Runtime>(client: &ComputeClient<R>) -> usize {
    client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(32) as usize
}

/// Upper bound on cubes of `units` units for kernels that accumulate per-cube partials
/// (weight gradients): `backward_units_per_sm` units per multiprocessor, so narrow rows
/// (small cubes) still keep enough loads in flight, and the partial buffer stays small.
pub fn partial_cubes<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    rows: usize,
    units: u32,
) -> u32 {
    let sms = multiprocessors(client);
    let per_sm = (config.backward_units_per_sm / units.max(1) as usize).max(1);
    rows.min(sms * per_sm).clamp(1, 65_535) as u32
}

/// The widest vectorized load of `elem_size`-byte items the device favours that divides
/// `width` (1 when none does).
pub fn vector_size<R: Runtime>(client: &ComputeClient<R>, width: usize, elem_size: usize) -> usize {
    client
        .io_optimized_vector_sizes(elem_size)
        .filter(|v| width.is_multiple_of(*v))
        .max()
        .unwrap_or(1)
}

/// Builds an array argument over a contiguous buffer of `len` items.
pub(crate) fn array<R: Runtime>(handle: &cubecl::server::Handle, len: usize) -> ArrayArg<R> {
    // Safety: every caller passes the item count of a buffer it allocated or was given
    // with that exact size (checked by the Burn glue before launch).
    unsafe { ArrayArg::from_raw_parts(handle.clone(), len) }
}
