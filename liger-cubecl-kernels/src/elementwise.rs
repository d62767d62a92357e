//! The one elementwise kernel and its launch geometry, shared by every memory-bound
//! elementwise op (the gated activations of [`crate::glu`], the activations of
//! [`crate::activation`], their math in [`crate::pointwise`]), forward and backward.
//!
//! One skeleton, so vectorization, unrolling, tail handling and grid striding are written
//! once: each unit loads `vectors_per_unit` vectors of every input into registers first
//! (all loads in flight before any arithmetic or store, whatever the compiler assumes
//! about aliasing), then computes in f32 and stores. A cube covers
//! `units × vectors_per_unit` consecutive vectors, unit `u` taking vectors
//! `u, u + units, ...` of the block (coalesced). Up to the configured cap every block gets
//! its own cube (in a two-dimensional grid where the device limits one dimension); past it
//! the cubes stride over the buffer. The per-element
//! math is a comptime choice (`Pass` and [`Activation`]), so each op compiles to its own
//! kernel without copies of this code.

use crate::launch::{
    ElementwiseConfig, KernelError, array, check_float_dtype, hardware_math_supported,
};
use crate::pointwise::{self, Activation};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// What the elementwise kernel computes, and from which buffers (`in*`, `out*` in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    /// `out0 = act(in0) * in1` (gate, up).
    Glu,
    /// `out0 = in0 * in2 * act'(in1)`, `out1 = in0 * act(in1)` (grad, gate, up).
    GluBackward,
    /// [`Pass::GluBackward`] and `out2 = act(in1) * in2`: the unit the forward computed,
    /// recomputed from the loads the backward makes anyway.
    GluBackwardUnit,
    /// `out0 = act(in0)`.
    Unary,
    /// `out0 = in0 * act'(in1)` (grad, saved), `saved` being what
    /// [`pointwise::grad_from_saved`] takes: the input, or the output for sigmoid.
    UnaryBackward,
}

impl Pass {
    /// Input buffers the pass reads.
    pub(crate) fn inputs(self) -> usize {
        match self {
            Pass::Unary => 1,
            Pass::Glu | Pass::UnaryBackward => 2,
            Pass::GluBackward | Pass::GluBackwardUnit => 3,
        }
    }

    /// Output buffers the pass writes.
    pub(crate) fn outputs(self) -> usize {
        match self {
            Pass::GluBackward => 2,
            Pass::GluBackwardUnit => 3,
            _ => 1,
        }
    }
}

/// Most vectors one launch addresses: indices stay below 2³¹ in the kernel's 32-bit
/// arithmetic (grid striding adds at most one grid to an index below this bound); larger
/// buffers are covered by several launches over offset handles.
const MAX_VECTORS_PER_LAUNCH: usize = 1 << 30;

/// Launch geometry of the elementwise kernel over a contiguous buffer.
#[derive(Clone, Copy, Debug)]
pub struct ElementwiseLaunch {
    /// Elements per vectorized load: the widest the device loads that divides the length,
    /// at most [`ElementwiseConfig::max_vector`].
    pub vector_size: usize,
    /// Units per cube.
    pub units: u32,
    /// Vectors each unit handles per grid step.
    pub vectors_per_unit: u32,
    /// Most cubes one launch uses (more blocks are grid-strided).
    pub max_cubes: usize,
    /// Most cubes along the grid's first dimension (the device's limit); larger grids
    /// take a second dimension, so each block still gets its own cube.
    pub max_cubes_x: usize,
}

impl ElementwiseLaunch {
    /// Geometry for `len` elements of `elem_size` bytes.
    ///
    /// The vector size only has to divide `len`, not the row width: the op is elementwise
    /// and the buffer contiguous, and its start is aligned (Burn allocates aligned and
    /// only makes zero-copy slice views at offsets that are multiples of the memory
    /// alignment), so `[rows, 7]` still gets full-width loads when `rows · 7` allows.
    pub fn new<R: Runtime>(
        client: &ComputeClient<R>,
        config: &ElementwiseConfig,
        len: usize,
        elem_size: usize,
    ) -> Self {
        let max_vector = config.max_vector.max(1);
        let vector_size = client
            .io_optimized_vector_sizes(elem_size)
            .find(|v| *v <= max_vector && len.is_multiple_of(*v))
            .unwrap_or(1);
        let props = client.properties();
        let hw_units = props
            .hardware
            .max_units_per_cube
            .min(props.hardware.max_cube_dim.0)
            .max(1) as usize;
        let units = config.units.clamp(1, hw_units);
        let units = prev_power_of_two(units as u32);
        let vectors_per_unit = config.vectors_per_unit.clamp(1, 16) as u32;
        let (count_x, count_y, _) = props.hardware.max_cube_count;
        let max_cubes_x = config
            .max_cubes_x
            .map_or(count_x as usize, |m| m.min(count_x as usize))
            .max(1);
        let mut max_cubes = max_cubes_x.saturating_mul((count_y as usize).max(1));
        // Without a cap one block per cube (cubes retire as they finish, no loop); a cap in
        // cubes, or in cubes per multiprocessor, makes a grid that strides instead.
        if let Some(per_sm) = config.cubes_per_sm.filter(|c| *c > 0) {
            max_cubes = max_cubes
                .min(crate::launch::multiprocessors(client) * per_sm)
                .max(1);
        }
        let max_cubes = config
            .max_cubes
            .map_or(max_cubes, |m| m.clamp(1, max_cubes));
        Self {
            vector_size,
            units,
            vectors_per_unit,
            max_cubes,
            max_cubes_x,
        }
    }

    /// Vectors one cube covers per grid step.
    pub fn block(&self) -> usize {
        self.units as usize * self.vectors_per_unit as usize
    }

    /// Cubes for `vectors` vectors (at most `max_cubes`; the rest is grid-strided).
    pub fn cubes(&self, vectors: usize) -> usize {
        vectors.div_ceil(self.block()).clamp(1, self.max_cubes)
    }

    /// The grid for `vectors` vectors: [`Self::cubes`] cubes, in rows of at most
    /// `max_cubes_x`. The kernel numbers cubes linearly (`CUBE_POS`, `CUBE_COUNT`), and
    /// the rows are balanced so the grid exceeds `cubes` by fewer cubes than it has rows.
    pub fn cube_count(&self, vectors: usize) -> CubeCount {
        let cubes = self.cubes(vectors);
        let rows = cubes.div_ceil(self.max_cubes_x);
        CubeCount::Static(cubes.div_ceil(rows) as u32, rows as u32, 1)
    }
}

fn prev_power_of_two(x: u32) -> u32 {
    if x <= 1 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

#[cube(launch_unchecked)]
fn elementwise_kernel<F: Float, N: Size>(
    in0: &Array<Vector<F, N>>,
    in1: &Array<Vector<F, N>>,
    in2: &Array<Vector<F, N>>,
    out0: &mut Array<Vector<F, N>>,
    out1: &mut Array<Vector<F, N>>,
    out2: &mut Array<Vector<F, N>>,
    len: u32,
    #[comptime] pass: Pass,
    #[comptime] act: Activation,
    #[comptime] units: u32,
    #[comptime] vectors_per_unit: u32,
    #[comptime] hardware_math: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let block = comptime!((units * vectors_per_unit) as usize);
    let mut start = CUBE_POS * block;
    while start < len {
        // Whole blocks skip the per-vector bounds checks; only the last one has a tail.
        if start + block <= len {
            elementwise_block::<F, N>(
                in0,
                in1,
                in2,
                out0,
                out1,
                out2,
                start,
                len,
                pass,
                act,
                units,
                vectors_per_unit,
                hardware_math,
                false,
            );
        } else {
            elementwise_block::<F, N>(
                in0,
                in1,
                in2,
                out0,
                out1,
                out2,
                start,
                len,
                pass,
                act,
                units,
                vectors_per_unit,
                hardware_math,
                true,
            );
        }
        start += CUBE_COUNT * block;
    }
}

/// One cube's block of `units × vectors_per_unit` vectors from `start`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn elementwise_block<F: Float, N: Size>(
    in0: &Array<Vector<F, N>>,
    in1: &Array<Vector<F, N>>,
    in2: &Array<Vector<F, N>>,
    out0: &mut Array<Vector<F, N>>,
    out1: &mut Array<Vector<F, N>>,
    out2: &mut Array<Vector<F, N>>,
    start: usize,
    len: usize,
    #[comptime] pass: Pass,
    #[comptime] act: Activation,
    #[comptime] units: u32,
    #[comptime] vectors_per_unit: u32,
    #[comptime] hardware_math: bool,
    #[comptime] checked: bool,
) {
    let two = comptime!(pass.inputs() >= 2);
    let three = comptime!(pass.inputs() >= 3);
    let unit = comptime!(pass == Pass::GluBackwardUnit);
    let mut r0 = Array::<Vector<F, N>>::new(vectors_per_unit as usize);
    let mut r1 = Array::<Vector<F, N>>::new(vectors_per_unit as usize);
    let mut r2 = Array::<Vector<F, N>>::new(vectors_per_unit as usize);
    let first = start + UNIT_POS as usize;
    // Every load first (kept in the input dtype: half the registers for f16/bf16)...
    #[unroll]
    for k in 0..vectors_per_unit {
        let i = first + k as usize * units as usize;
        if !checked || i < len {
            r0[k as usize] = in0[i];
            if two {
                r1[k as usize] = in1[i];
            }
            if three {
                r2[k as usize] = in2[i];
            }
        }
    }
    // ...then f32 math and the stores.
    #[unroll]
    for k in 0..vectors_per_unit {
        let i = first + k as usize * units as usize;
        if !checked || i < len {
            let a = Vector::<f32, N>::cast_from(r0[k as usize]);
            match pass {
                Pass::Glu => {
                    let u = Vector::<f32, N>::cast_from(r1[k as usize]);
                    out0[i] = Vector::<F, N>::cast_from(pointwise::glu_forward::<N>(
                        a,
                        u,
                        act,
                        hardware_math,
                    ));
                }
                Pass::GluBackward | Pass::GluBackwardUnit => {
                    let gate = Vector::<f32, N>::cast_from(r1[k as usize]);
                    let up = Vector::<f32, N>::cast_from(r2[k as usize]);
                    let mut grad_gate = Vector::<f32, N>::new(0.0);
                    let mut grad_up = Vector::<f32, N>::new(0.0);
                    pointwise::glu_backward::<N>(
                        a,
                        gate,
                        up,
                        &mut grad_gate,
                        &mut grad_up,
                        act,
                        hardware_math,
                    );
                    out0[i] = Vector::<F, N>::cast_from(grad_gate);
                    out1[i] = Vector::<F, N>::cast_from(grad_up);
                    if unit {
                        out2[i] = Vector::<F, N>::cast_from(pointwise::glu_forward::<N>(
                            gate,
                            up,
                            act,
                            hardware_math,
                        ));
                    }
                }
                Pass::Unary => {
                    out0[i] =
                        Vector::<F, N>::cast_from(pointwise::value::<N>(a, act, hardware_math));
                }
                Pass::UnaryBackward => {
                    let saved = Vector::<f32, N>::cast_from(r1[k as usize]);
                    out0[i] = Vector::<F, N>::cast_from(
                        a * pointwise::grad_from_saved::<N>(saved, act, hardware_math),
                    );
                }
            }
        }
    }
}

/// Launches the elementwise kernel over `len` elements of `dtype`.
///
/// `inputs` and `outputs` are contiguous buffers of `len` elements, as many as `pass`
/// reads and writes. Buffers of more than 2³⁰ vectors are covered by several launches
/// over offset handles (so the kernel's 32-bit indices never overflow).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<R: Runtime>(
    op: &'static str,
    client: &ComputeClient<R>,
    config: &ElementwiseConfig,
    inputs: &[&Handle],
    outputs: &[&Handle],
    len: usize,
    pass: Pass,
    act: Activation,
    dtype: StorageType,
) -> Result<(), KernelError> {
    check_float_dtype(op, dtype)?;
    assert_eq!(inputs.len(), pass.inputs(), "{op}: inputs of {pass:?}");
    assert_eq!(outputs.len(), pass.outputs(), "{op}: outputs of {pass:?}");
    if len == 0 {
        return Ok(());
    }
    let geometry = ElementwiseLaunch::new(client, config, len, dtype.size());
    let hardware_math = pointwise::hardware_math_for(
        config.hardware_math && hardware_math_supported(client),
        dtype,
    );
    let vector_size = geometry.vector_size;
    let vectors = len / vector_size;
    let vector_bytes = (vector_size * dtype.size()) as u64;
    // Bindings a pass does not touch (comptime-skipped) point at one small scratch buffer.
    let dummy = client.empty(vector_bytes as usize);
    let per_launch = config
        .vectors_per_launch
        .map_or(MAX_VECTORS_PER_LAUNCH, |v| {
            let align = client.properties().memory.alignment.max(1) as usize;
            v.next_multiple_of(align).min(MAX_VECTORS_PER_LAUNCH)
        });
    let mut done = 0usize;
    while done < vectors {
        let count = (vectors - done).min(per_launch);
        let offset = done as u64 * vector_bytes;
        let slice = |h: &Handle| {
            if offset == 0 {
                array::<R>(h, count)
            } else {
                array::<R>(&h.clone().offset_start(offset), count)
            }
        };
        let input = |k: usize| {
            inputs
                .get(k)
                .map_or_else(|| array::<R>(&dummy, 1), |h| slice(h))
        };
        let output = |k: usize| {
            outputs
                .get(k)
                .map_or_else(|| array::<R>(&dummy, 1), |h| slice(h))
        };
        // Safety: each bound array is `count` vectors of a buffer of at least
        // `done + count` vectors (the callers pass buffers of `len` elements), every
        // index the kernel touches is below `count`, and the dummy bindings are never
        // accessed (the pass is comptime).
        unsafe {
            elementwise_kernel::launch_unchecked::<R>(
                client,
                geometry.cube_count(count),
                CubeDim::new_1d(geometry.units),
                vector_size,
                input(0),
                input(1),
                input(2),
                output(0),
                output(1),
                output(2),
                count as u32,
                pass,
                act,
                geometry.units,
                geometry.vectors_per_unit,
                hardware_math,
                dtype,
            );
        }
        done += count;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(max_cubes: usize, max_cubes_x: usize) -> ElementwiseLaunch {
        ElementwiseLaunch {
            vector_size: 4,
            units: 64,
            vectors_per_unit: 1,
            max_cubes,
            max_cubes_x,
        }
    }

    fn dims(count: CubeCount) -> (usize, usize) {
        match count {
            CubeCount::Static(x, y, z) => {
                assert_eq!(z, 1);
                (x as usize, y as usize)
            }
            CubeCount::Dynamic(_) => panic!("the elementwise grid is static"),
        }
    }

    /// Every block gets a cube, within the first dimension's limit, with fewer spare
    /// cubes than rows; a cap keeps the grid at the cap (the cubes then stride).
    #[test]
    fn grid_covers_every_block_within_the_limits() {
        for max_cubes_x in [1, 3, 7, 65_535, (1 << 31) - 1] {
            for blocks in [
                1, 2, 3, 64, 65, 65_535, 65_536, 131_071, 458_752, 16_777_216,
            ] {
                let g = geometry(usize::MAX, max_cubes_x);
                let (x, y) = dims(g.cube_count(blocks * g.block() - 1));
                assert!(x <= max_cubes_x, "{blocks} blocks: {x} cubes a row");
                assert!(x * y >= blocks, "{blocks} blocks: grid {x}×{y}");
                assert!(x * y - blocks < y, "{blocks} blocks: grid {x}×{y}");
            }
            for cap in [1, 2, 5, 1000] {
                let g = geometry(cap, max_cubes_x);
                let (x, y) = dims(g.cube_count(1 << 20));
                assert!(x <= max_cubes_x && x * y >= cap && x * y - cap < y);
            }
        }
    }
}

/// What the CUDA runtime is given for the gated units, in every pass: the hardware
/// exponential and reciprocal where `hardware_math` is on (f16/bf16 results with
/// `ElementwiseConfig::hardware_math`), the accurate ones otherwise (pointwise's
/// `activation_exp`).
#[cfg(test)]
mod codegen {
    use super::*;
    use crate::cuda_source::{cuda_source, dump};
    use cubecl::ir::{ElemType, FloatKind};
    use cubecl::prelude::{KernelLauncher, KernelSettings};
    use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    type R = WgpuRuntime;

    /// The CUDA source of the elementwise kernel for `pass` over `dtype` (vectors of four).
    fn source(pass: Pass, dtype: StorageType, hardware_math: bool) -> String {
        let client = R::client(&WgpuDevice::DefaultDevice);
        let (n, units, vectors_per_unit) = (4usize, 64u32, 1u32);
        let settings = KernelSettings::default().cube_dim(CubeDim::new_1d(units));
        let h = client.empty(64);
        let mut launcher = KernelLauncher::<R>::new(settings.clone());
        launcher.with_scope(|scope| {
            scope.device_properties(client.properties());
            scope.register_size::<DynamicSize<elementwise_kernel::_N>>(n);
            scope.register_type::<DynamicScalar<elementwise_kernel::_F>>(dtype);
        });
        let mut array = || {
            // Safety: the kernel is expanded and compiled, never launched.
            let arg = unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), 4) };
            <Array<Vector<elementwise_kernel::F, elementwise_kernel::N>> as LaunchArg>::register(
                arg,
                &mut launcher,
            )
        };
        let buffers = [array(), array(), array(), array(), array(), array()];
        let [in0, in1, in2, out0, out1, out2] = buffers;
        let len = <u32 as LaunchArg>::register(1u32, &mut launcher);
        let kernel = elementwise_kernel::ElementwiseKernel::<R>::new(
            settings,
            client.clone(),
            in0,
            in1,
            in2,
            out0,
            out1,
            out2,
            len,
            n,
            pass,
            Activation::Silu,
            units,
            vectors_per_unit,
            hardware_math,
            dtype,
        );
        let source = cuda_source(kernel.define());
        dump(
            &format!("elementwise_{pass:?}_{dtype}_{hardware_math}"),
            &source,
        );
        source
    }

    fn float(kind: FloatKind) -> StorageType {
        ElemType::Float(kind).into()
    }

    #[test]
    fn half_results_take_the_hardware_exponential_on_cuda() {
        let (f32_, f16_, bf16_) = (
            float(FloatKind::F32),
            float(FloatKind::F16),
            float(FloatKind::BF16),
        );
        assert!(pointwise::hardware_math_for(true, bf16_));
        assert!(pointwise::hardware_math_for(true, f16_));
        assert!(!pointwise::hardware_math_for(true, f32_));
        assert!(!pointwise::hardware_math_for(false, bf16_));
        for pass in [Pass::Glu, Pass::GluBackward, Pass::GluBackwardUnit] {
            let fast = source(pass, bf16_, true);
            assert!(fast.contains("__expf("), "{pass:?}: no __expf:\n{fast}");
            assert!(!fast.contains("exp("), "{pass:?}: an accurate exp:\n{fast}");
            for dtype in [bf16_, f32_] {
                let accurate = source(pass, dtype, false);
                assert!(accurate.contains("exp("), "{pass:?}: no exp:\n{accurate}");
                assert!(
                    !accurate.contains("__expf("),
                    "{pass:?}: a hardware exp:\n{accurate}"
                );
            }
            // The accurate reciprocal is refined by a Newton step, `r + r·(1 − d·r)`; the
            // hardware one is the intrinsic alone. Without that difference the hardware
            // source would be the longer one (`__expf(` for `exp(`).
            let accurate = source(pass, bf16_, false);
            assert!(
                fast.len() < accurate.len(),
                "{pass:?}: the hardware path is no shorter"
            );
        }
    }
}
