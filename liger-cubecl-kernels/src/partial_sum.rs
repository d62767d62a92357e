//! Second stage of every weight/bias gradient: sum the per-cube f32 partials over cubes.
//!
//! The backward kernels give each cube a slice of the rows and let it accumulate its
//! rows' weight-gradient contributions in registers, then write one f32 row per cube.
//! Summing those rows here keeps the reduction deterministic and needs no float atomics
//! (which many devices lack).

use crate::launch::array;
use cubecl::prelude::*;

/// Columns (vectors) per cube and lanes splitting the parts: a cube of 8 × 32 units
/// reads 8 adjacent vectors of 32 part rows at a time (coalesced 8-vector segments), and
/// the grid has one cube per 8 vectors, so the sum is spread over many multiprocessors.
const COLUMNS: u32 = 8;
const LANES: u32 = 32;

#[cube(launch_unchecked)]
fn sum_partials_kernel<F: Float, N: Size>(
    partials: &Array<Vector<f32, N>>,
    output: &mut Array<Vector<F, N>>,
    parts: u32,
    vectors: u32,
    #[define(F)] _dtype: StorageType,
) {
    let mut lanes = SharedMemory::<Vector<f32, N>>::new((COLUMNS * LANES) as usize);
    let j = CUBE_POS_X as usize * COLUMNS as usize + UNIT_POS_X as usize;
    let mut acc = Vector::<f32, N>::new(0.0);
    if j < vectors as usize {
        let mut p = UNIT_POS_Y as usize;
        while p < parts as usize {
            acc += partials[p * vectors as usize + j];
            p += LANES as usize;
        }
    }
    lanes[(UNIT_POS_Y * COLUMNS + UNIT_POS_X) as usize] = acc;
    sync_cube();
    if UNIT_POS_Y == 0 && j < vectors as usize {
        let mut total = Vector::<f32, N>::new(0.0);
        for lane in 0..LANES {
            total += lanes[(lane * COLUMNS + UNIT_POS_X) as usize];
        }
        output[j] = Vector::<F, N>::cast_from(total);
    }
}

/// `output[j] = sum_p partials[p, j]`, cast to `dtype`.
///
/// `partials: [parts, width]` f32, `output: [width]` of `dtype`; `vector_size` divides `width`.
pub fn sum_partials<R: Runtime>(
    client: &ComputeClient<R>,
    partials: &cubecl::server::Handle,
    output: &cubecl::server::Handle,
    parts: usize,
    width: usize,
    vector_size: usize,
    dtype: StorageType,
) {
    let vectors = width / vector_size;
    let cubes = vectors.div_ceil(COLUMNS as usize) as u32;
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        sum_partials_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_2d(COLUMNS, LANES),
            vector_size,
            array(partials, parts * vectors),
            array(output, vectors),
            parts as u32,
            vectors as u32,
            dtype,
        );
    }
}
