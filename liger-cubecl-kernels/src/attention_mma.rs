//! The flash kernels with register-resident products ([`FlashVariant::Mma`]): scores,
//! probabilities and accumulators never leave registers, as in FlashAttention-2. The
//! forward, dQ and dK/dV do the parent module's math (see its docs) unchanged.
//!
//! Products are PTX `mma.sync` m16n8k16 (f16/bf16 into f32) through CubeCL's manual MMA,
//! whose per-lane layout is fixed by PTX (lane `4g + t`, `g = lane / 4`, `t = lane % 4`):
//! - A (16×16): registers `(row g, cols 2t, 2t+1)`, `(g + 8, 2t..)`, `(g, 2t + 8..)`,
//!   `(g + 8, 2t + 8..)`;
//! - B (16×8): `(rows 2t, 2t+1; col g)` and `(rows 2t + 8, 2t + 9; col g)`;
//! - C (16×8, f32): `(row g, cols 2t, 2t+1)` and `(row g + 8, cols 2t, 2t+1)`.
//!
//! Two neighbouring 8-column C tiles of `S` are therefore exactly one A operand of the
//! next product: `P = exp(S - m)` goes from the score registers, rounded to the input
//! dtype, straight into `O += P·V` with no trip through shared memory. A row's values sit
//! in the four lanes of a quad, so its max and sum are two `shuffle_xor`s.
//!
//! Each plane owns 16 rows of the cube (queries; keys in dK/dV). The cube streams the
//! other rows through two row-major shared-memory buffers (rows padded by 16 bytes, so
//! the 8 rows of an `ldmatrix` phase hit 32 banks), filled by asynchronous 16-byte copies
//! (`cp.async`) completed on a cube barrier: the next step's rows land while this step
//! computes, and the barrier's phase replaces the two cube syncs of a step. Operands come from
//! the tiles by `ldmatrix.x4`: an A operand or the B operands of two C tiles a load; the
//! products over the head (`X·Yᵀ`) take `Y`'s 8×8 blocks as they are, the products over
//! the step (`W·Z`) take `Z`'s transposed (`.trans`). The kernels index with 64-bit
//! addresses: a lane's `ldmatrix` address is then its own part plus a constant per load,
//! which the loads take as an immediate offset (a 32-bit index is widened after the
//! addition, so the compiler could not fold the constant and would compute each address). As in the parent module: f32 scores,
//! the forward's lazy rescale, `P` rounded to the input dtype before `P·V`, `l` summed
//! from the unrounded `P`, `dS` rounded once before its products.

use super::{
    AttentionMask, FlashGeometry, FlashKernel, RESCALE_THRESHOLD, block_fully_visible,
    documents_meet, flash_math, key_block_range, query_block_range, visible,
};
use cubecl::cmma::MmaDefinition;
use cubecl::ir::MatrixIdent;
use cubecl::prelude::barrier::{Barrier, copy_async};
use cubecl::prelude::*;

/// Two elements: one 32-bit register of f16/bf16, or half an f32 C register pair.
type Pair = Const<2>;

/// `log₂ e`: the exponentials take base 2, with `log₂ e` folded into the softmax scale.
const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// `2^x`. Under fast math (CUDA) `powf(2, x)` compiles to `__powf(2.0f, x)`, which NVRTC
/// folds to the bare `ex2.approx` (FlashAttention's `exp2f`): with `log₂ e` in the
/// scale, one multiply a score fewer than `__expf(x)`, which multiplies by `log₂ e`
/// itself. Elsewhere `exp(x·ln 2)`.
#[cube]
fn exp2(x: f32, #[comptime] fast: bool) -> f32 {
    if comptime!(fast) {
        f32::powf(2.0f32, x)
    } else {
        f32::exp(x * comptime!(core::f32::consts::LN_2))
    }
}

/// Bytes of shared memory of a kernel (`elem`-byte inputs): row-major tiles of
/// [`FlashGeometry::stride`] vectors a row (16 bytes of padding: the 8 rows of an
/// `ldmatrix` phase hit 32 banks); the streamed tiles twice (one being filled by
/// `cp.async` while the other is read), and the cube's barrier (8 bytes, placed at a
/// 128-byte boundary).
pub(super) fn shared_bytes(g: &FlashGeometry, kernel: FlashKernel, elem: usize) -> usize {
    let row = (g.stride() * g.vector) as usize * elem;
    let own = g.own_rows as usize * row;
    let step = g.step_rows as usize * row;
    let barrier = 128;
    barrier
        + match kernel {
            // q (then the output), k and v twice.
            FlashKernel::Forward => own + 4 * step,
            // q (then dQ), dO, k and v twice.
            FlashKernel::BackwardQ => 2 * own + 4 * step,
            // The warp grid: k, v (then dK, dV); q, dO, lse and D of the step twice; P
            // and dS of a step.
            FlashKernel::BackwardKv if g.warp_grid => {
                let scores = (g.step_rows * grid_stride(g) * g.vector) as usize * elem;
                2 * own + 4 * step + 4 * g.step_rows as usize * 4 + 2 * scores
            }
            // k, v (then dK, dV); q, dO, lse and D of the step twice; dSᵀ of a step (twice
            // when deferred).
            FlashKernel::BackwardKv => {
                let ds = if g.atomic_dq {
                    let buffers = if g.deferred_dq { 2 } else { 1 };
                    buffers * (g.own_rows * ds_stride(g) * g.vector) as usize * elem
                } else {
                    0
                };
                2 * own + 4 * step + 4 * g.step_rows as usize * 4 + ds
            }
        }
}

/// Row stride, in vectors, of the dK/dV kernel's `[keys, queries]` tile of a step's `dSᵀ`
/// (16 bytes of padding, as the other tiles).
pub(super) fn ds_stride(g: &FlashGeometry) -> u32 {
    g.step_rows / g.vector + 1
}

/// Row stride, in vectors, of the warp grid's `[queries, keys]` tiles of a step's `P` and
/// `dS` (16 bytes of padding, as the other tiles).
pub(super) fn grid_stride(g: &FlashGeometry) -> u32 {
    g.own_rows / g.vector + 1
}

/// Starts the asynchronous copies (`cp.async`, one vector of 16 bytes a copy) of rows
/// `row0..row0 + rows` of the `[seq, head_dim]` slab at vector `base` of `src` into rows
/// `tile_row0..` of the row-major tile `tile`; rows at or past `seq` are stored as zeros.
/// The rows are there for every unit once the unit has committed the copies to the
/// cube's barrier (`commit_copy_async`) and the barrier's phase has completed.
///
/// Where a row's vectors divide the cube's units, a unit copies one column of every
/// `units / dv`-th row, so both of its addresses are its own part, computed once, plus a
/// constant per copy, which the copies take as an immediate offset; a block inside the
/// slab (all but the last) is copied without a test per row.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_rows_async<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    base: usize,
    row0: u32,
    seq: u32,
    tile: &mut SharedMemory<Vector<F, N>>,
    tile_row0: u32,
    #[comptime] rows: u32,
    #[comptime] g: FlashGeometry,
) {
    let dv = comptime!(g.dv());
    let stride = comptime!(g.stride());
    if comptime!(g.units.is_multiple_of(g.dv())) {
        let r0 = UNIT_POS / dv;
        let c0 = UNIT_POS % dv;
        let from0 = base + ((row0 + r0) * dv + c0) as usize;
        let at0 = ((tile_row0 + r0) * stride + c0) as usize;
        if row0 + rows <= seq {
            copy_row_passes::<F, N>(src, from0, r0, seq, tile, at0, rows, false, g);
        } else {
            copy_row_passes::<F, N>(src, from0, r0 + row0, seq, tile, at0, rows, true, g);
        }
    } else {
        let total = comptime!(rows * g.dv());
        #[unroll]
        for e in 0..comptime!(total.div_ceil(g.units)) {
            let i = UNIT_POS + e * comptime!(g.units);
            if i < total {
                let r = i / dv;
                let c = i % dv;
                let at = ((tile_row0 + r) * stride + c) as usize;
                let row = row0 + r;
                let from = base + (row * dv + c) as usize;
                copy_vector_async::<F, N>(src, from, tile, at, row < seq, g.vector);
            }
        }
    }
}

/// The copies of [`copy_rows_async`]: pass `e` copies the row `e · units / dv` after the
/// unit's first (`r0`; its position in the slab when `checked`, which stores zeros for rows
/// at or past `seq`). A last pass that only some units' rows reach tests the row against
/// the block.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_row_passes<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    from0: usize,
    r0: u32,
    seq: u32,
    tile: &mut SharedMemory<Vector<F, N>>,
    at0: usize,
    #[comptime] rows: u32,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
) {
    let rows_per_pass = comptime!(g.units / g.dv());
    let first = UNIT_POS / comptime!(g.dv());
    #[unroll]
    for e in 0..comptime!(rows.div_ceil(rows_per_pass)) {
        let step = comptime!(e * rows_per_pass);
        let from = from0 + comptime!((step * g.dv()) as usize);
        let at = at0 + comptime!((step * g.stride()) as usize);
        let mut copy = true;
        if comptime!(step + rows_per_pass > rows) {
            copy = first + step < rows;
        }
        if copy {
            let mut in_slab = true;
            if comptime!(checked) {
                in_slab = r0 + step < seq;
            }
            copy_vector_async::<F, N>(src, from, tile, at, in_slab, g.vector);
        }
    }
}

/// One vector `src[from]` into `tile[at]` by `cp.async` where its row is in the slab
/// (`in_slab`), zeros otherwise.
#[cube]
fn copy_vector_async<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    from: usize,
    tile: &mut SharedMemory<Vector<F, N>>,
    at: usize,
    in_slab: bool,
    #[comptime] vector: u32,
) {
    if in_slab {
        copy_async(
            &src.slice(from, from + 1),
            &mut tile.slice_mut(at, at + 1),
            vector,
        );
    } else {
        tile[at] = Vector::<F, N>::new(F::new(0.0));
    }
}

/// [`copy_rows_async`] for `rows` per-row f32 values (4-byte copies) into `dst` from
/// `dst0`, `fill` past `seq`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_row_values_async(
    src: &Array<f32>,
    base: usize,
    row0: u32,
    seq: u32,
    dst: &mut SharedMemory<f32>,
    dst0: u32,
    fill: f32,
    #[comptime] rows: u32,
    #[comptime] units: u32,
) {
    #[unroll]
    for e in 0..comptime!(rows.div_ceil(units)) {
        let r = UNIT_POS + e * units;
        if r < rows {
            let at = (dst0 + r) as usize;
            let row = row0 + r;
            if row < seq {
                let from = base + row as usize;
                copy_async(
                    &src.slice(from, from + 1),
                    &mut dst.slice_mut(at, at + 1),
                    comptime!(1u32),
                );
            } else {
                dst[at] = fill;
            }
        }
    }
}

/// The first block of `from..end` whose rows meet the documents `doc_lo..=doc_hi` (per
/// `ranges`, pairs from pair `at0`), `end` when none does; `from` without documents.
#[cube]
fn next_live_block(
    from: u32,
    end: u32,
    ranges: &Array<i32>,
    at0: u32,
    doc_lo: i32,
    doc_hi: i32,
    #[comptime] mask: AttentionMask,
) -> u32 {
    let mut b = from;
    if comptime!(mask.documents) {
        loop {
            if b >= end {
                break;
            }
            if documents_meet(ranges, ((at0 + b) * 2u32) as usize, doc_lo, doc_hi) {
                break;
            }
            b += 1;
        }
    }
    b
}

/// `acc[at..at + 2] += a·b`: one m16n8k16 product into the C registers `at`, `at + 1`.
#[cube]
fn mma<F: Float>(
    a: &Array<Vector<F, Pair>>,
    b: &Array<Vector<F, Pair>>,
    acc: &mut Array<Vector<f32, Pair>>,
    #[comptime] at: usize,
) {
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let mut c = Array::<Vector<f32, Pair>>::new(2usize);
    c[0] = acc[at];
    c[1] = acc[at + 1];
    def.execute_inplace(a, b, &mut c);
    acc[at] = c[0];
    acc[at + 1] = c[1];
}

/// Two f32 values as a pair.
#[cube]
fn pair(x0: f32, x1: f32) -> Vector<f32, Pair> {
    let mut v = Vector::<f32, Pair>::empty();
    v[0] = x0;
    v[1] = x1;
    v
}

/// `x` with element 0 kept where query `q0` sees key `k0` and element 1 where `q1` sees
/// `k1`, `fill` where hidden: a boundary block's mask on a pair of C registers, as selects.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mask_pair(
    x: Vector<f32, Pair>,
    q0: u32,
    k0: u32,
    q1: u32,
    k1: u32,
    fill: f32,
    seq: u32,
    window: u32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] mask: AttentionMask,
) -> Vector<f32, Pair> {
    pair(
        select(
            visible(q0, k0, seq, window, doc_ids, doc_base, mask),
            x[0],
            fill,
        ),
        select(
            visible(q1, k1, seq, window, doc_ids, doc_base, mask),
            x[1],
            fill,
        ),
    )
}

/// A boundary block's mask on a plane's C tiles, as selects: `tiles` m-tiles of
/// `col_tiles` 8-column tiles (pair `2n + h` of m-tile `t` at `t · 2 · col_tiles`), the
/// lane's rows `row0 + 16t + 8h` and columns `col0 + 8n` and the next; hidden elements
/// become `fill`. Rows are queries and columns keys (`S`), or the other way round with
/// `keys_in_rows` (`Sᵀ`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn mask_tiles(
    acc: &mut Array<Vector<f32, Pair>>,
    row0: u32,
    col0: u32,
    fill: f32,
    seq: u32,
    window: u32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] tiles: u32,
    #[comptime] col_tiles: u32,
    #[comptime] keys_in_rows: bool,
    #[comptime] mask: AttentionMask,
) {
    // Rows' tiles innermost for `Sᵀ`, columns' for `S`: the order the kernels' registers
    // were allocated for (the other order spills more in dK/dV).
    #[unroll]
    for i in 0..comptime!(tiles * col_tiles) {
        let t = comptime!(if keys_in_rows {
            i % tiles
        } else {
            i / col_tiles
        });
        let n = comptime!(if keys_in_rows {
            i / tiles
        } else {
            i % col_tiles
        });
        let col = col0 + n * 8;
        #[unroll]
        for h in 0..2u32 {
            let row = row0 + t * 16 + h * 8;
            let at = comptime!((t * 2 * col_tiles + 2 * n + h) as usize);
            // The pair's query and key positions: its second element is the next column.
            let q = if comptime!(keys_in_rows) { col } else { row };
            let k = if comptime!(keys_in_rows) { row } else { col };
            let next_q = comptime!(keys_in_rows as u32);
            let next_k = comptime!(!keys_in_rows as u32);
            acc[at] = mask_pair(
                acc[at],
                q,
                k,
                q + next_q,
                k + next_k,
                fill,
                seq,
                window,
                doc_ids,
                doc_base,
                mask,
            );
        }
    }
}

/// Max over the four lanes of a quad (one row of a C tile).
#[cube]
fn quad_max(x: f32) -> f32 {
    let x = f32::max(x, plane_shuffle_xor(x, 1u32));
    f32::max(x, plane_shuffle_xor(x, 2u32))
}

/// Sum over the four lanes of a quad.
#[cube]
fn quad_sum(x: f32) -> f32 {
    let x = x + plane_shuffle_xor(x, 1u32);
    x + plane_shuffle_xor(x, 2u32)
}

/// Four 8×8 matrices of 16-bit elements from the row-major tile `tile` (`stride` vectors
/// of 8 a row) by one `ldmatrix.x4` (`.trans` when `transpose`): lane `l` names the row of
/// matrix `l / 8` at vector `lane_at + offset`, the lane's part of the address once per
/// tile and the loop's part a constant (64-bit addresses, so the loads take the constant
/// as an immediate offset); register `m` of every lane comes from matrix
/// `m`, holding its elements `(l / 4, 2·(l % 4) ..+2)` (transposed: `(2·(l % 4) ..+2, l / 4)`).
#[cube]
fn ldmatrix_x4<F: Float, N: Size>(
    tile: &SharedMemory<Vector<F, N>>,
    lane_at: usize,
    #[comptime] offset: usize,
    #[comptime] transpose: bool,
) -> Array<Vector<F, Pair>> {
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let at = lane_at + offset;
    def.load_matrix::<Vector<F, N>, Pair>(
        &tile.slice(at, at + 1),
        MatrixIdent::B,
        4usize,
        transpose,
    )
}

/// The forward (see the module docs and the parent module's); launched by
/// `flash_attention` for [`FlashVariant::Mma`] plans.
#[cube(launch_unchecked, fast_math = flash_math(&g), address_type = "u64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_forward_mma_kernel<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    doc_ids: &Array<i32>,
    q_ranges: &Array<i32>,
    k_ranges: &Array<i32>,
    out: &mut Array<Vector<F, N>>,
    lse: &mut Array<f32>,
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[define(F)] _dtype: StorageType,
) {
    let br = comptime!(g.own_rows);
    let bc = comptime!(g.step_rows);
    let dv = comptime!(g.dv());
    // C tiles of a strip: of the keys (S) and of the head (O).
    let key_tiles = comptime!(g.step_rows / 8);
    let head_tiles = comptime!(g.head_dim / 8);
    // The exponentials' scale: `exp(x·scale) = 2^(x·scale₂)`.
    let scale2 = scale * LOG2_E;

    let q_blocks = seq.div_ceil(br);
    // Heaviest (last, under a causal mask) query blocks first (see `flash_cube_count`).
    let qb = q_blocks - 1u32 - CUBE_POS_Y;
    let head = CUBE_POS_X % q_heads;
    let batch = CUBE_POS_X / q_heads;
    let kv_head = head / (q_heads / kv_heads);
    let q0 = qb * br;
    let seq_len = seq as usize;
    let q_base = (batch * q_heads + head) as usize * seq_len * dv as usize;
    let kv_base = (batch * kv_heads + kv_head) as usize * seq_len * dv as usize;
    let row_base = (batch * q_heads + head) as usize * seq_len;
    let doc_base = batch as usize * seq_len;

    let mut q_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((br * g.stride()) as usize), 128usize);
    // Two buffers of `bc` rows each: step `i` reads buffer `i % 2` while step `i + 1`'s
    // rows arrive in the other.
    let mut k_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bc * g.stride()) as usize),
        128usize,
    );
    let mut v_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bc * g.stride()) as usize),
        128usize,
    );
    let bar = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let plane = UNIT_POS / 32u32;
    let lane = UNIT_POS_PLANE;
    let gid = lane / 4u32;
    let tid = lane % 4u32;
    // This plane's `16 · tiles` rows of the block (`tiles` m-tiles of 16); the lane's rows
    // are `gid` and `gid + 8` of each m-tile.
    let tiles = comptime!(g.plane_tiles());
    let strip0 = plane * comptime!(16 * g.plane_tiles());
    let qpos0 = q0 + strip0 + gid;

    // m-tile `t`'s C registers: O at `t · 2 · head_tiles`, S and P at `t · 2 · key_tiles`.
    let mut o = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * head_tiles) as usize));
    #[unroll]
    for i in 0..comptime!(tiles * 2 * head_tiles) {
        o[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    let mut s = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * key_tiles) as usize));
    let mut pv = Array::<Vector<F, Pair>>::new(comptime!((tiles * 2 * key_tiles) as usize));
    // Running max of the raw scores (lazy) and the lane's part of the running sum of
    // each of the lane's rows: `2t` (row `gid` of m-tile `t`) and `2t + 1` (row `gid + 8`).
    let mut m = Array::<f32>::new(comptime!(2 * tiles as usize));
    let mut l = Array::<f32>::new(comptime!(2 * tiles as usize));
    #[unroll]
    for r in 0..comptime!(2 * tiles) {
        m[r as usize] = f32::min_value();
        l[r as usize] = 0.0f32;
    }

    let k_blocks = seq.div_ceil(bc);
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * q_blocks + qb) * 2u32) as usize;
        doc_lo = q_ranges[at];
        doc_hi = q_ranges[at + 1];
    }
    let (kb_first, kb_end) = key_block_range(q0, seq, window, br, bc, mask);
    let k_at0 = batch * k_blocks;
    // The pipeline: Q and the first live step's K/V are copied in before the loop; each
    // step waits for its rows (the barrier's phase, which also says every plane is done
    // with the other buffer), starts the next live step's copies into that buffer, and
    // computes while they land.
    let mut kb = next_live_block(kb_first, kb_end, k_ranges, k_at0, doc_lo, doc_hi, mask);
    copy_rows_async::<F, N>(q, q_base, q0, seq, &mut q_tile, 0u32, br, g);
    if kb < kb_end {
        copy_rows_async::<F, N>(k, kv_base, kb * bc, seq, &mut k_tile, 0u32, bc, g);
        copy_rows_async::<F, N>(v, kv_base, kb * bc, seq, &mut v_tile, 0u32, bc, g);
    }
    bar.commit_copy_async();
    let mut buf = 0u32;
    while kb < kb_end {
        bar.arrive_and_wait();
        let next = next_live_block(kb + 1, kb_end, k_ranges, k_at0, doc_lo, doc_hi, mask);
        if next < kb_end {
            let other = (1u32 - buf) * bc;
            copy_rows_async::<F, N>(k, kv_base, next * bc, seq, &mut k_tile, other, bc, g);
            copy_rows_async::<F, N>(v, kv_base, next * bc, seq, &mut v_tile, other, bc, g);
        }
        bar.commit_copy_async();
        let k0 = kb * bc;

        // A strip entirely before the block's first key (causal) has nothing to do.
        let mut strip_live = true;
        if comptime!(mask.causal) {
            strip_live = q0 + strip0 + comptime!(16 * g.plane_tiles() - 1) >= k0;
        }
        if strip_live {
            // S = Q·Kᵀ (B[e, key] = K[key, e]: a pair of K's row is one B register).
            row_products::<F, N>(&q_tile, strip0, &k_tile, buf * bc, &mut s, g);
            let interior = block_fully_visible(
                q0 + strip0,
                k0,
                seq,
                comptime!(16 * g.plane_tiles()),
                bc,
                mask,
            );
            let floor = f32::min_value();
            // A boundary block's hidden scores to the floor, behind one branch for the
            // whole step.
            if !interior {
                mask_tiles(
                    &mut s,
                    qpos0,
                    k0 + 2 * tid,
                    floor,
                    seq,
                    window,
                    doc_ids,
                    doc_base,
                    tiles,
                    key_tiles,
                    false,
                    mask,
                );
            }
            #[unroll]
            for t in 0..tiles {
                let at = comptime!(t * 2 * key_tiles);
                let lo_row = comptime!(2 * t as usize);
                let hi_row = comptime!(2 * t as usize + 1);

                // The rows' block max of the raw scores (the scale is positive: the max
                // commutes with it, and it joins the exponent's FFMA below).
                let mut max_lo = floor;
                let mut max_hi = floor;
                #[unroll]
                for n in 0..key_tiles {
                    let lo = s[(at + 2 * n) as usize];
                    let hi = s[(at + 2 * n + 1) as usize];
                    max_lo = f32::max(max_lo, f32::max(lo[0], lo[1]));
                    max_hi = f32::max(max_hi, f32::max(hi[0], hi[1]));
                }
                max_lo = quad_max(max_lo);
                max_hi = quad_max(max_hi);

                // Lazy rescale (the running max `m` is in raw score units): a quad's lanes
                // agree on the max, so the branch is per quad.
                let o_at = comptime!(t * 2 * head_tiles);
                let m_lo = m[lo_row];
                if (max_lo - m_lo) * scale > comptime!(RESCALE_THRESHOLD) {
                    let alpha = exp2((m_lo - max_lo) * scale2, g.fast_exp);
                    m[lo_row] = max_lo;
                    l[lo_row] *= alpha;
                    #[unroll]
                    for dn in 0..head_tiles {
                        o[(o_at + 2 * dn) as usize] =
                            o[(o_at + 2 * dn) as usize] * Vector::<f32, Pair>::new(alpha);
                    }
                }
                let m_hi = m[hi_row];
                if (max_hi - m_hi) * scale > comptime!(RESCALE_THRESHOLD) {
                    let alpha = exp2((m_hi - max_hi) * scale2, g.fast_exp);
                    m[hi_row] = max_hi;
                    l[hi_row] *= alpha;
                    #[unroll]
                    for dn in 0..head_tiles {
                        o[(o_at + 2 * dn + 1) as usize] =
                            o[(o_at + 2 * dn + 1) as usize] * Vector::<f32, Pair>::new(alpha);
                    }
                }

                // P = 2^(x·scale₂ − m·scale₂) = exp(x·scale − m·scale), rounded for P·V. A
                // row whose max is still the floor has seen no visible key: every x there
                // is hidden (the floor) or NaN, and subtracting the largest float instead
                // gives 0 for the hidden and keeps NaN (a hidden key of a row with a
                // visible one gives 2^(floor·scale₂ − m·scale₂) = 0 as is).
                let mut ms_lo = m[lo_row] * scale2;
                let mut ms_hi = m[hi_row] * scale2;
                if m[lo_row] == floor {
                    ms_lo = f32::max_value();
                }
                if m[hi_row] == floor {
                    ms_hi = f32::max_value();
                }
                let mut l_lo = l[lo_row];
                let mut l_hi = l[hi_row];
                #[unroll]
                for n in 0..key_tiles {
                    let lo = s[(at + 2 * n) as usize];
                    let hi = s[(at + 2 * n + 1) as usize];
                    let p0 = exp2(lo[0] * scale2 - ms_lo, g.fast_exp);
                    let p1 = exp2(lo[1] * scale2 - ms_lo, g.fast_exp);
                    let p2 = exp2(hi[0] * scale2 - ms_hi, g.fast_exp);
                    let p3 = exp2(hi[1] * scale2 - ms_hi, g.fast_exp);
                    l_lo += p0 + p1;
                    l_hi += p2 + p3;
                    pv[(at + 2 * n) as usize] = Vector::<F, Pair>::cast_from(pair(p0, p1));
                    pv[(at + 2 * n + 1) as usize] = Vector::<F, Pair>::cast_from(pair(p2, p3));
                }
                l[lo_row] = l_lo;
                l[hi_row] = l_hi;
            }

            // O += P·V: C tiles 2j, 2j+1 of P are the A operand of key step j;
            // B[key, d] = V[key, d]: V's 8×8 blocks transposed.
            step_products::<F, N>(&pv, &v_tile, buf * bc, &mut o, g);
        }
        kb = next;
        buf = 1u32 - buf;
    }
    // Every copy has landed and every plane is done with the tiles.
    bar.arrive_and_wait();

    // Per row: 1/l (0 for a row that saw no key) and lse; then O / l through the q tile
    // (free: the strips' Q is in registers), and whole vectors out.
    #[unroll]
    for t in 0..tiles {
        let qpos_lo = qpos0 + t * 16;
        let qpos_hi = qpos_lo + 8u32;
        let lo_row = comptime!(2 * t as usize);
        let hi_row = comptime!(2 * t as usize + 1);
        let l_lo = quad_sum(l[lo_row]);
        let l_hi = quad_sum(l[hi_row]);
        // NaN where `l` is (a NaN score): the backward's probabilities carry it.
        let mut inv_lo = 1.0f32 / l_lo;
        let mut inv_hi = 1.0f32 / l_hi;
        let mut lse_lo = m[lo_row] * scale + f32::ln(l_lo);
        let mut lse_hi = m[hi_row] * scale + f32::ln(l_hi);
        if l_lo == 0.0 {
            inv_lo = 0.0;
            lse_lo = f32::max_value();
        }
        if l_hi == 0.0 {
            inv_hi = 0.0;
            lse_hi = f32::max_value();
        }
        if tid == 0 {
            if qpos_lo < seq {
                lse[row_base + qpos_lo as usize] = lse_lo;
            }
            if qpos_hi < seq {
                lse[row_base + qpos_hi as usize] = lse_hi;
            }
        }
        rows_to_tile::<F, N>(
            &o,
            comptime!(t * 2 * head_tiles),
            &mut q_tile,
            strip0 + t * 16,
            inv_lo,
            inv_hi,
            g,
        );
    }
    sync_cube();
    tile_to_rows::<F, N>(&q_tile, out, q_base, q0, seq, g);
}

/// `acc = X·Yᵀ` for this plane's `16 · plane_tiles` rows from `strip0` of the row-major
/// tile `x` and the `step_rows` rows `y_row0..` of the row-major tile `y`: the A
/// registers of each m-tile of `X` are its 8×8 blocks (one `ldmatrix.x4` a head step,
/// loaded where used rather than kept: the registers go to the accumulators), and so are
/// `Y`'s B registers (B[e, n] = Y[n, e]), one `ldmatrix.x4` for two C tiles, shared by the
/// m-tiles. `acc` holds `2 · step_rows / 8` C registers an m-tile, m-tile after m-tile.
#[cube]
fn row_products<F: Float, N: Size>(
    x: &SharedMemory<Vector<F, N>>,
    strip0: u32,
    y: &SharedMemory<Vector<F, N>>,
    y_row0: u32,
    acc: &mut Array<Vector<f32, Pair>>,
    #[comptime] g: FlashGeometry,
) {
    let tiles = comptime!(g.plane_tiles());
    let c_tiles = comptime!(g.step_rows / 8);
    let lane = UNIT_POS_PLANE;
    let m = lane / 8u32;
    let stride = comptime!(g.stride());
    // The lane's rows and columns of its matrices (see `ldmatrix_x4`); the m-tile, head
    // step and key tile add constants.
    let a_at = ((strip0 + (m % 2) * 8 + lane % 8u32) * stride + m / 2) as usize;
    let b_at = ((y_row0 + (m / 2) * 8 + lane % 8u32) * stride + m % 2) as usize;
    let mut a_all = Array::<Vector<F, Pair>>::new(comptime!(4 * tiles as usize));
    let mut a = Array::<Vector<F, Pair>>::new(4usize);
    let mut b0 = Array::<Vector<F, Pair>>::new(2usize);
    let mut b1 = Array::<Vector<F, Pair>>::new(2usize);
    #[unroll]
    for i in 0..comptime!(tiles * 2 * c_tiles) {
        acc[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    #[unroll]
    for kk in 0..comptime!(g.head_dim / 16) {
        #[unroll]
        for t in 0..tiles {
            let regs = ldmatrix_x4::<F, N>(
                x,
                a_at,
                comptime!((t * 16 * g.stride() + kk * 2) as usize),
                false,
            );
            #[unroll]
            for i in 0..4u32 {
                a_all[(4 * t + i) as usize] = regs[i as usize];
            }
        }
        #[unroll]
        for n2 in 0..comptime!(g.step_rows / 16) {
            // Matrices: rows of tile 2·n2 at head columns 0-7, 8-15; then tile 2·n2 + 1.
            let regs = ldmatrix_x4::<F, N>(
                y,
                b_at,
                comptime!((n2 * 16 * g.stride() + kk * 2) as usize),
                false,
            );
            b0[0] = regs[0];
            b0[1] = regs[1];
            b1[0] = regs[2];
            b1[1] = regs[3];
            #[unroll]
            for t in 0..tiles {
                #[unroll]
                for i in 0..4u32 {
                    a[i as usize] = a_all[(4 * t + i) as usize];
                }
                mma::<F>(&a, &b0, acc, comptime!((t * 2 * c_tiles + 4 * n2) as usize));
                mma::<F>(
                    &a,
                    &b1,
                    acc,
                    comptime!((t * 2 * c_tiles + 4 * n2 + 2) as usize),
                );
            }
        }
    }
}

/// `acc += W·Z` for this plane's `16 · plane_tiles` rows: `w` the rows' `[rows,
/// step_rows]` operand as C registers rounded to pairs (`2 · step_rows / 8` an m-tile),
/// `z` the `step_rows` rows `z_row0..` of a row-major tile: B[k, n] = Z[k, n] pairs along
/// `k`, the transposed 8×8 blocks; one `ldmatrix.x4.trans` gives two C tiles' operands,
/// shared by the m-tiles. `acc` holds `2 · head_dim / 8` C registers an m-tile.
#[cube]
fn step_products<F: Float, N: Size>(
    w: &Array<Vector<F, Pair>>,
    z: &SharedMemory<Vector<F, N>>,
    z_row0: u32,
    acc: &mut Array<Vector<f32, Pair>>,
    #[comptime] g: FlashGeometry,
) {
    let tiles = comptime!(g.plane_tiles());
    let w_tiles = comptime!(g.step_rows / 8);
    let acc_tiles = comptime!(g.head_dim / 8);
    let lane = UNIT_POS_PLANE;
    let m = lane / 8u32;
    let stride = comptime!(g.stride());
    // The lane's row and column of its matrix (see `ldmatrix_x4`).
    let z_at = ((z_row0 + (m % 2) * 8 + lane % 8u32) * stride + m / 2) as usize;
    let mut a = Array::<Vector<F, Pair>>::new(4usize);
    let mut b0 = Array::<Vector<F, Pair>>::new(2usize);
    let mut b1 = Array::<Vector<F, Pair>>::new(2usize);
    #[unroll]
    for j in 0..comptime!(g.step_rows / 16) {
        // Matrices: rows 0-7, 8-15 of the step at head tile 2·dn2, then at 2·dn2 + 1.
        #[unroll]
        for dn2 in 0..comptime!(g.head_dim / 16) {
            let regs = ldmatrix_x4::<F, N>(
                z,
                z_at,
                comptime!((j * 16 * g.stride() + 2 * dn2) as usize),
                true,
            );
            b0[0] = regs[0];
            b0[1] = regs[1];
            b1[0] = regs[2];
            b1[1] = regs[3];
            #[unroll]
            for t in 0..tiles {
                #[unroll]
                for i in 0..4u32 {
                    a[i as usize] = w[(t * 2 * w_tiles + 4 * j + i) as usize];
                }
                mma::<F>(
                    &a,
                    &b0,
                    acc,
                    comptime!((t * 2 * acc_tiles + 4 * dn2) as usize),
                );
                mma::<F>(
                    &a,
                    &b1,
                    acc,
                    comptime!((t * 2 * acc_tiles + 4 * dn2 + 2) as usize),
                );
            }
        }
    }
}

/// One dK/dV step's `dQ = dS·K` for this plane's share of the step's queries, added to
/// `grad_q_sum` (f32 pairs of `[rows, head_dim]`, query row `q_row0` first) by atomic adds
/// (unscaled: the sum is multiplied by the scale once, as it is cast to dQ). Rows `ds_row0..` of the cube's `[keys, queries]` tile `ds` hold `dSᵀ`
/// (every plane's keys: the caller makes sure they are all written); the A operands
/// `dS[query, key]` are its 8×8 blocks transposed (`ldmatrix.trans`), the B operands
/// `K[key, e]` those of `k_tile`.
/// The planes share the products as [`FlashGeometry::dq_split`] says: the step's 16-row
/// query tiles in groups of one or two, then the head's columns, then the cube's keys. Under a causal
/// mask, 16-key chunks after the step's last query (`q_last`) hold only zeros and are
/// skipped.
#[cube]
#[allow(clippy::too_many_arguments)]
fn dq_products<F: Float, N: Size>(
    ds: &SharedMemory<Vector<F, N>>,
    ds_row0: u32,
    k_tile: &SharedMemory<Vector<F, N>>,
    grad_q_sum: &mut Array<Atomic<Vector<f32, Pair>>>,
    q_row0: usize,
    q0: u32,
    q_last: u32,
    k0: u32,
    seq: u32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) {
    let query_mtiles = comptime!(g.step_rows / 16);
    let (per_plane, col_parts, key_parts) = comptime!(g.dq_split().unwrap());
    let groups = comptime!(query_mtiles / per_plane);
    let cols = comptime!(g.head_dim / col_parts);
    let key_chunks = comptime!(g.own_rows / 16 / key_parts);
    // C registers (f32 pairs) of one query tile: two a column tile of 8.
    let acc_regs = comptime!(cols / 4);
    let stride = comptime!(g.stride());
    let ds_rows = comptime!(ds_stride(&g));
    let plane = UNIT_POS / 32u32;
    let lane = UNIT_POS_PLANE;
    let m = lane / 8u32;
    // This plane's query tiles: `per_plane` from `qm · per_plane`.
    let qm = plane % groups;
    let share = plane / groups;
    let col0 = (share % col_parts) * cols;
    // This plane's keys: 16-key chunks `chunk0..chunk0 + key_chunks` of the cube's.
    let chunk0 = (share / col_parts) * key_chunks;
    // The lane's rows and columns of its matrices (see `ldmatrix_x4`): of dSᵀ, keys
    // `(m / 2) · 8..` at queries `(m % 2) · 8..` of the plane's first query tile
    // (registers a0..a3 after the transpose; the next tile 16 queries on); of K as in
    // `step_products`.
    let ds_at = ((ds_row0 + chunk0 * 16 + (m / 2) * 8 + lane % 8u32) * ds_rows
        + qm * comptime!(2 * per_plane)
        + m % 2) as usize;
    let k_at = ((chunk0 * 16 + (m % 2) * 8 + lane % 8u32) * stride + col0 / 8 + m / 2) as usize;
    let mut acc = Array::<Vector<f32, Pair>>::new(comptime!((per_plane * acc_regs) as usize));
    #[unroll]
    for i in 0..comptime!(per_plane * acc_regs) {
        acc[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    let mut b0 = Array::<Vector<F, Pair>>::new(2usize);
    let mut b1 = Array::<Vector<F, Pair>>::new(2usize);
    #[unroll]
    for kk in 0..key_chunks {
        let mut live = true;
        if comptime!(mask.causal) {
            live = q_last >= k0 + (chunk0 + kk) * 16;
        }
        if live {
            // The plane's query tiles' A operands, four registers each: each B operand
            // (two 8-column tiles of K) serves them all.
            let mut a = Array::<Vector<F, Pair>>::new(comptime!((4 * per_plane) as usize));
            #[unroll]
            for t in 0..per_plane {
                let regs = ldmatrix_x4::<F, N>(
                    ds,
                    ds_at,
                    comptime!((kk * 16 * ds_rows + 2 * t) as usize),
                    true,
                );
                #[unroll]
                for r in 0..4u32 {
                    a[comptime!((4 * t + r) as usize)] = regs[r as usize];
                }
            }
            #[unroll]
            for dn2 in 0..comptime!(cols / 16) {
                let regs = ldmatrix_x4::<F, N>(
                    k_tile,
                    k_at,
                    comptime!((kk * 16 * g.stride() + 2 * dn2) as usize),
                    true,
                );
                b0[0] = regs[0];
                b0[1] = regs[1];
                b1[0] = regs[2];
                b1[1] = regs[3];
                #[unroll]
                for t in 0..per_plane {
                    let mut a_t = Array::<Vector<F, Pair>>::new(4usize);
                    #[unroll]
                    for r in 0..4u32 {
                        a_t[r as usize] = a[comptime!((4 * t + r) as usize)];
                    }
                    let at = comptime!(t * acc_regs + 4 * dn2);
                    mma::<F>(&a_t, &b0, &mut acc, comptime!(at as usize));
                    mma::<F>(&a_t, &b1, &mut acc, comptime!((at + 2) as usize));
                }
            }
        }
    }
    let row_pairs = comptime!(g.head_dim / 2);
    let lo0 = q0 + qm * comptime!(16 * per_plane) + lane / 4u32;
    // The lane's first pair of its row `lo0`, once; each C tile's pair (and the rows 8
    // and 16 on) a constant after it.
    let at_lo = (q_row0 + lo0 as usize) * row_pairs as usize + (col0 / 2 + lane % 4u32) as usize;
    // A step inside the sequence adds every row with no test (one address for all);
    // the last step tests each row.
    if q0 + comptime!(g.step_rows) <= seq {
        dq_atomic_adds(grad_q_sum, &acc, at_lo, lo0, seq, false, per_plane, cols, g);
    } else {
        dq_atomic_adds(grad_q_sum, &acc, at_lo, lo0, seq, true, per_plane, cols, g);
    }
}

/// Adds a plane's dQ share `acc` (`per_plane` query tiles of `cols` columns, C registers)
/// to `grad_q_sum` from pair `at_lo` (the lane's first row `lo0`); with `checked`, only
/// the rows before `seq`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn dq_atomic_adds(
    grad_q_sum: &mut Array<Atomic<Vector<f32, Pair>>>,
    acc: &Array<Vector<f32, Pair>>,
    at_lo: usize,
    lo0: u32,
    seq: u32,
    #[comptime] checked: bool,
    #[comptime] per_plane: u32,
    #[comptime] cols: u32,
    #[comptime] g: FlashGeometry,
) {
    let row_pairs = comptime!(g.head_dim / 2);
    let acc_regs = comptime!(cols / 4);
    #[unroll]
    for t in 0..per_plane {
        #[unroll]
        for h in 0..2u32 {
            let mut live = true;
            if comptime!(checked) {
                live = lo0 + comptime!(16 * t + 8 * h) < seq;
            }
            if live {
                #[unroll]
                for dn in 0..comptime!(cols / 8) {
                    let at = at_lo + comptime!(((16 * t + 8 * h) * row_pairs + dn * 4) as usize);
                    grad_q_sum[at].fetch_add(acc[comptime!((t * acc_regs + 2 * dn + h) as usize)]);
                }
            }
        }
    }
}

/// Writes one m-tile's 16 rows (`row0..`) of `acc` (`2 · head_dim / 8` C registers from
/// `at`) times `factor_lo` / `factor_hi` (the lane's rows `l / 4` and `l / 4 + 8`) into
/// the row-major tile `tile`, in the input dtype, a pair at a time.
#[cube]
fn rows_to_tile<F: Float, N: Size>(
    acc: &Array<Vector<f32, Pair>>,
    #[comptime] at: u32,
    tile: &mut SharedMemory<Vector<F, N>>,
    row0: u32,
    factor_lo: f32,
    factor_hi: f32,
    #[comptime] g: FlashGeometry,
) {
    let pairs_per_row = comptime!(g.stride() * g.vector / 2);
    let lane = UNIT_POS_PLANE;
    let len = tile.len();
    let mut view = tile.slice_mut(0usize, len).with_vector_size::<Pair>();
    let lo_row = row0 + lane / 4u32;
    #[unroll]
    for dn in 0..comptime!(g.head_dim / 8) {
        let lo = (lo_row * pairs_per_row + dn * 4 + lane % 4u32) as usize;
        let hi = lo + (8 * pairs_per_row) as usize;
        view[lo] = Vector::<F, Pair>::cast_from(
            acc[(at + 2 * dn) as usize] * Vector::<f32, Pair>::new(factor_lo),
        );
        view[hi] = Vector::<F, Pair>::cast_from(
            acc[(at + 2 * dn + 1) as usize] * Vector::<f32, Pair>::new(factor_hi),
        );
    }
}

/// Stores rows `0..own_rows` of the row-major tile `tile` to rows `row0..` (those below
/// `seq`) of the `[seq, head_dim]` slab at vector `base` of `out`.
#[cube]
fn tile_to_rows<F: Float, N: Size>(
    tile: &SharedMemory<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    base: usize,
    row0: u32,
    seq: u32,
    #[comptime] g: FlashGeometry,
) {
    let dv = comptime!(g.dv());
    let stride = comptime!(g.stride());
    let total = comptime!(g.own_rows * g.dv());
    let mut i = UNIT_POS;
    while i < total {
        let r = i / dv;
        let c = i % dv;
        let row = row0 + r;
        if row < seq {
            out[base + (row * dv + c) as usize] = tile[(r * stride + c) as usize];
        }
        i += comptime!(g.units);
    }
}

/// dQ of the backward (the parent module's dQ kernel with register-resident products):
/// per key block `S = Q·Kᵀ` and `dP = dO·Vᵀ` from registers, `P = exp(S·scale − lse)`,
/// `dS = P ∘ (dP − D)` rounded to the input dtype straight into the A operand of
/// `dQ += dS·K`; `dQ · scale` stored once.
#[cube(launch_unchecked, fast_math = flash_math(&g), address_type = "u64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_backward_q_mma_kernel<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    dot: &Array<f32>,
    doc_ids: &Array<i32>,
    q_ranges: &Array<i32>,
    k_ranges: &Array<i32>,
    grad_q: &mut Array<Vector<F, N>>,
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[define(F)] _dtype: StorageType,
) {
    let bq = comptime!(g.own_rows);
    let bk = comptime!(g.step_rows);
    let dv = comptime!(g.dv());
    let key_tiles = comptime!(g.step_rows / 8);
    let head_tiles = comptime!(g.head_dim / 8);
    // The exponentials' scale: `exp(x·scale) = 2^(x·scale₂)`.
    let scale2 = scale * LOG2_E;
    let fast = comptime!(g.fast_exp);
    let q_blocks = seq.div_ceil(bq);
    // Heaviest (last, under a causal mask) query blocks first (see `flash_cube_count`).
    let qb = q_blocks - 1u32 - CUBE_POS_Y;
    let head = CUBE_POS_X % q_heads;
    let batch = CUBE_POS_X / q_heads;
    let kv_head = head / (q_heads / kv_heads);
    let q0 = qb * bq;
    let seq_len = seq as usize;
    let q_base = (batch * q_heads + head) as usize * seq_len * dv as usize;
    let kv_base = (batch * kv_heads + kv_head) as usize * seq_len * dv as usize;
    let row_base = (batch * q_heads + head) as usize * seq_len;
    let doc_base = batch as usize * seq_len;

    let mut q_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    let mut do_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    // Two buffers of `bk` rows each (see the forward).
    let mut k_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bk * g.stride()) as usize),
        128usize,
    );
    let mut v_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bk * g.stride()) as usize),
        128usize,
    );
    let bar = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let plane = UNIT_POS / 32u32;
    let lane = UNIT_POS_PLANE;
    let tid = lane % 4u32;
    // This plane's m-tiles and the lane's rows, as in the forward.
    let tiles = comptime!(g.plane_tiles());
    let strip0 = plane * comptime!(16 * g.plane_tiles());
    let qpos0 = q0 + strip0 + lane / 4u32;

    // lse and D of the lane's rows: `2t` (row `gid` of m-tile `t`) and `2t + 1`.
    let mut row_lse = Array::<f32>::new(comptime!(2 * tiles as usize));
    let mut row_d = Array::<f32>::new(comptime!(2 * tiles as usize));
    #[unroll]
    for r in 0..comptime!(2 * tiles) {
        let qpos = qpos0 + (r / 2) * 16 + (r % 2) * 8;
        let mut lse_r = f32::max_value();
        let mut d_r = 0.0f32;
        if qpos < seq {
            lse_r = lse[row_base + qpos as usize];
            d_r = dot[row_base + qpos as usize];
        }
        row_lse[r as usize] = lse_r;
        row_d[r as usize] = d_r;
    }

    let mut dq = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * head_tiles) as usize));
    #[unroll]
    for i in 0..comptime!(tiles * 2 * head_tiles) {
        dq[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    let mut s = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * key_tiles) as usize));
    let mut dp = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * key_tiles) as usize));
    let mut ds = Array::<Vector<F, Pair>>::new(comptime!((tiles * 2 * key_tiles) as usize));

    let k_blocks = seq.div_ceil(bk);
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * q_blocks + qb) * 2u32) as usize;
        doc_lo = q_ranges[at];
        doc_hi = q_ranges[at + 1];
    }
    let (kb_first, kb_end) = key_block_range(q0, seq, window, bq, bk, mask);
    let k_at0 = batch * k_blocks;
    // The forward's pipeline; Q and dO stay in shared memory (their A operands are loaded
    // where used).
    let mut kb = next_live_block(kb_first, kb_end, k_ranges, k_at0, doc_lo, doc_hi, mask);
    copy_rows_async::<F, N>(q, q_base, q0, seq, &mut q_tile, 0u32, bq, g);
    copy_rows_async::<F, N>(grad, q_base, q0, seq, &mut do_tile, 0u32, bq, g);
    if kb < kb_end {
        copy_rows_async::<F, N>(k, kv_base, kb * bk, seq, &mut k_tile, 0u32, bk, g);
        copy_rows_async::<F, N>(v, kv_base, kb * bk, seq, &mut v_tile, 0u32, bk, g);
    }
    bar.commit_copy_async();
    let mut buf = 0u32;
    while kb < kb_end {
        bar.arrive_and_wait();
        let next = next_live_block(kb + 1, kb_end, k_ranges, k_at0, doc_lo, doc_hi, mask);
        if next < kb_end {
            let other = (1u32 - buf) * bk;
            copy_rows_async::<F, N>(k, kv_base, next * bk, seq, &mut k_tile, other, bk, g);
            copy_rows_async::<F, N>(v, kv_base, next * bk, seq, &mut v_tile, other, bk, g);
        }
        bar.commit_copy_async();
        let k0 = kb * bk;

        let mut strip_live = true;
        if comptime!(mask.causal) {
            strip_live = q0 + strip0 + comptime!(16 * g.plane_tiles() - 1) >= k0;
        }
        if strip_live {
            row_products::<F, N>(&q_tile, strip0, &k_tile, buf * bk, &mut s, g);
            row_products::<F, N>(&do_tile, strip0, &v_tile, buf * bk, &mut dp, g);
            let interior = block_fully_visible(
                q0 + strip0,
                k0,
                seq,
                comptime!(16 * g.plane_tiles()),
                bk,
                mask,
            );
            #[unroll]
            for t in 0..tiles {
                let qpos_lo = qpos0 + t * 16;
                let qpos_hi = qpos_lo + 8u32;
                let at = comptime!(t * 2 * key_tiles);
                let lse_lo = row_lse[comptime!(2 * t as usize)];
                let lse_hi = row_lse[comptime!(2 * t as usize + 1)];
                // `exp(s·scale − lse) = 2^(s·scale₂ − lse·log₂ e)`.
                let lse2_lo = lse_lo * LOG2_E;
                let lse2_hi = lse_hi * LOG2_E;
                let d_lo = row_d[comptime!(2 * t as usize)];
                let d_hi = row_d[comptime!(2 * t as usize + 1)];
                #[unroll]
                for n in 0..key_tiles {
                    let kpos = k0 + n * 8 + 2 * tid;
                    let s_lo = s[(at + 2 * n) as usize];
                    let s_hi = s[(at + 2 * n + 1) as usize];
                    let dp_lo = dp[(at + 2 * n) as usize];
                    let dp_hi = dp[(at + 2 * n + 1) as usize];
                    // A row that saw no key has `lse` = NO_KEY_LSE, `lse·log₂ e` = +∞:
                    // its exponentials are 0 as they are.
                    let mut p0 = exp2(s_lo[0] * scale2 - lse2_lo, fast);
                    let mut p1 = exp2(s_lo[1] * scale2 - lse2_lo, fast);
                    let mut p2 = exp2(s_hi[0] * scale2 - lse2_hi, fast);
                    let mut p3 = exp2(s_hi[1] * scale2 - lse2_hi, fast);
                    if !interior {
                        if !visible(qpos_lo, kpos, seq, window, doc_ids, doc_base, mask) {
                            p0 = 0.0;
                        }
                        if !visible(qpos_lo, kpos + 1, seq, window, doc_ids, doc_base, mask) {
                            p1 = 0.0;
                        }
                        if !visible(qpos_hi, kpos, seq, window, doc_ids, doc_base, mask) {
                            p2 = 0.0;
                        }
                        if !visible(qpos_hi, kpos + 1, seq, window, doc_ids, doc_base, mask) {
                            p3 = 0.0;
                        }
                    }
                    ds[(at + 2 * n) as usize] = Vector::<F, Pair>::cast_from(pair(
                        p0 * (dp_lo[0] - d_lo),
                        p1 * (dp_lo[1] - d_lo),
                    ));
                    ds[(at + 2 * n + 1) as usize] = Vector::<F, Pair>::cast_from(pair(
                        p2 * (dp_hi[0] - d_hi),
                        p3 * (dp_hi[1] - d_hi),
                    ));
                }
            }
            // dQ += dS·K (B[key, e] = K[key, e]: a pair of Kᵀ's row).
            step_products::<F, N>(&ds, &k_tile, buf * bk, &mut dq, g);
        }
        kb = next;
        buf = 1u32 - buf;
    }
    bar.arrive_and_wait();

    #[unroll]
    for t in 0..tiles {
        rows_to_tile::<F, N>(
            &dq,
            comptime!(t * 2 * head_tiles),
            &mut q_tile,
            strip0 + t * 16,
            scale,
            scale,
            g,
        );
    }
    sync_cube();
    tile_to_rows::<F, N>(&q_tile, grad_q, q_base, q0, seq, g);
}

/// Starts the copies of one dK/dV step: rows `q0..q0 + step_rows` of query head `head`'s
/// Q, dO, lse and D into rows `row0..` of the step's tiles (see [`copy_rows_async`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_query_step<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    dot: &Array<f32>,
    head: u32,
    batch: u32,
    q_heads: u32,
    q0: u32,
    seq: u32,
    q_tile: &mut SharedMemory<Vector<F, N>>,
    do_tile: &mut SharedMemory<Vector<F, N>>,
    lse_rows: &mut SharedMemory<f32>,
    d_rows: &mut SharedMemory<f32>,
    row0: u32,
    #[comptime] g: FlashGeometry,
) {
    let bq = comptime!(g.step_rows);
    let row_base = (batch * q_heads + head) as usize * seq as usize;
    let q_base = row_base * comptime!(g.dv() as usize);
    copy_rows_async::<F, N>(q, q_base, q0, seq, q_tile, row0, bq, g);
    copy_rows_async::<F, N>(grad, q_base, q0, seq, do_tile, row0, bq, g);
    copy_row_values_async(
        lse,
        row_base,
        q0,
        seq,
        lse_rows,
        row0,
        f32::max_value(),
        bq,
        g.units,
    );
    copy_row_values_async(dot, row_base, q0, seq, d_rows, row0, 0.0, bq, g.units);
}

/// The dK/dV kernels' steps: (query head, query block) pairs, the live query blocks of
/// each of the cube's query heads in turn (heads `head..head_end` of the kv head's group).
#[derive(CubeType)]
struct QuerySteps {
    /// The current step's head (within the group) and query block.
    head: u32,
    block: u32,
    head_end: u32,
    /// A head's first live query block, and the end of its blocks.
    first: u32,
    end: u32,
    /// The batch row's first pair of query-block document ranges, and the documents of
    /// the cube's keys.
    ranges_at: u32,
    doc_lo: i32,
    doc_hi: i32,
}

/// The first step of key block `kb`'s cube over heads `head..head_end` (`head_end` when
/// none is live).
#[cube]
#[allow(clippy::too_many_arguments)]
fn query_steps(
    k_ranges: &Array<i32>,
    q_ranges: &Array<i32>,
    batch: u32,
    kb: u32,
    seq: u32,
    window: u32,
    head: u32,
    head_end: u32,
    #[comptime] bk: u32,
    #[comptime] bq: u32,
    #[comptime] mask: AttentionMask,
) -> QuerySteps {
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * seq.div_ceil(bk) + kb) * 2u32) as usize;
        doc_lo = k_ranges[at];
        doc_hi = k_ranges[at + 1];
    }
    let (from, end) = query_block_range(kb * bk, seq, window, bk, bq, mask);
    let ranges_at = batch * seq.div_ceil(bq);
    let first = next_live_block(from, end, q_ranges, ranges_at, doc_lo, doc_hi, mask);
    let mut h = head;
    if first >= end {
        h = head_end;
    }
    QuerySteps {
        head: h,
        block: first,
        head_end,
        first,
        end,
        ranges_at,
        doc_lo,
        doc_hi,
    }
}

/// The step after `steps`' current one: `(head, block)`.
#[cube]
fn next_query_step(
    steps: &QuerySteps,
    q_ranges: &Array<i32>,
    #[comptime] mask: AttentionMask,
) -> (u32, u32) {
    let mut head = steps.head;
    let mut block = next_live_block(
        steps.block + 1,
        steps.end,
        q_ranges,
        steps.ranges_at,
        steps.doc_lo,
        steps.doc_hi,
        mask,
    );
    if block >= steps.end {
        head = steps.head + 1;
        block = steps.first;
    }
    (head, block)
}

/// dK and dV of the backward (the parent module's dK/dV kernel with register-resident
/// products): per query block of each query head of the group, `Sᵀ = K·Qᵀ` and
/// `dPᵀ = V·dOᵀ` ([keys, queries], rows of this plane's 16 keys), `Pᵀ = exp(Sᵀ·scale − lse)`
/// and `dSᵀ = Pᵀ ∘ (dPᵀ − D)` rounded to the input dtype straight into the A operands of
/// `dV += Pᵀ·dO` and `dK += dSᵀ·Q`; the group's heads summed in registers, `dK · scale`
/// and `dV` stored once (dK and dV without atomics: deterministic). With [`FlashGeometry::atomic_dq`]
/// each step's `dSᵀ` also goes through shared memory into `dQ += dS·K`, added to
/// `grad_q_sum` by atomic adds (see `dq_products`). With [`FlashGeometry::warp_grid`] the
/// planes share each step in FlashAttention-2's layout instead (see `backward_kv_grid`).
#[cube(launch_unchecked, fast_math = flash_math(&g), address_type = "u64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_backward_kv_mma_kernel<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    dot: &Array<f32>,
    doc_ids: &Array<i32>,
    q_ranges: &Array<i32>,
    k_ranges: &Array<i32>,
    grad_k: &mut Array<Vector<F, N>>,
    grad_v: &mut Array<Vector<F, N>>,
    partial_k: &mut Array<Vector<f32, Pair>>,
    partial_v: &mut Array<Vector<f32, Pair>>,
    grad_q_sum: &mut Array<Atomic<Vector<f32, Pair>>>,
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    part_pairs: u32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[comptime] parts: u32,
    #[define(F)] _dtype: StorageType,
) {
    if comptime!(g.warp_grid) {
        backward_kv_grid::<F, N>(
            q, k, v, grad, lse, dot, doc_ids, q_ranges, k_ranges, grad_k, grad_v, partial_k,
            partial_v, grad_q_sum, seq, q_heads, kv_heads, window, scale, part_pairs, g, mask,
            parts,
        );
    } else {
        backward_kv_strips::<F, N>(
            q, k, v, grad, lse, dot, doc_ids, q_ranges, k_ranges, grad_k, grad_v, partial_k,
            partial_v, grad_q_sum, seq, q_heads, kv_heads, window, scale, part_pairs, g, mask,
            parts,
        );
    }
}

/// The dK/dV kernel's body where each plane owns 16 keys an m-tile (see
/// [`flash_backward_kv_mma_kernel`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn backward_kv_strips<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    dot: &Array<f32>,
    doc_ids: &Array<i32>,
    q_ranges: &Array<i32>,
    k_ranges: &Array<i32>,
    grad_k: &mut Array<Vector<F, N>>,
    grad_v: &mut Array<Vector<F, N>>,
    partial_k: &mut Array<Vector<f32, Pair>>,
    partial_v: &mut Array<Vector<f32, Pair>>,
    grad_q_sum: &mut Array<Atomic<Vector<f32, Pair>>>,
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    part_pairs: u32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[comptime] parts: u32,
) {
    let bk = comptime!(g.own_rows);
    let bq = comptime!(g.step_rows);
    let dv = comptime!(g.dv());
    let query_tiles = comptime!(g.step_rows / 8);
    // Heaviest (first, under a causal mask) key blocks first (see `flash_cube_count`).
    let kb = CUBE_POS_Y;
    // With `parts` > 1 each cube takes `group / parts` of the group's query heads and
    // writes f32 partial sums (see `flash_backward_kv_parts`).
    let head_part = CUBE_POS_X % (kv_heads * parts);
    let kv_head = head_part / parts;
    let part = head_part % parts;
    let batch = CUBE_POS_X / (kv_heads * parts);
    let group = q_heads / kv_heads;
    let heads_per_part = group / parts;
    let k0 = kb * bk;
    let seq_len = seq as usize;
    let kv_base = (batch * kv_heads + kv_head) as usize * seq_len * dv as usize;
    let doc_base = batch as usize * seq_len;

    let mut k_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    let mut v_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    // Two buffers of each streamed tile (see the forward).
    let mut q_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bq * g.stride()) as usize),
        128usize,
    );
    let mut do_tile = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime!((2 * bq * g.stride()) as usize),
        128usize,
    );
    // dSᵀ of a step, `[keys, queries]`, for dQ (see `dq_products`). Deferred: twice, a
    // step writing one buffer while the previous step's dQ reads the other after the
    // barrier that says every plane wrote it (no sync of its own).
    let ds_buffers = comptime!(if g.deferred_dq { 2u32 } else { 1u32 });
    let ds_len = comptime!(if g.atomic_dq {
        (ds_buffers * bk * ds_stride(&g)) as usize
    } else {
        1usize
    });
    let mut ds_tile = SharedMemory::<Vector<F, N>>::new_aligned(ds_len, 128usize);
    let mut lse_rows = SharedMemory::<f32>::new_aligned(comptime!(2 * bq as usize), 16usize);
    let mut d_rows = SharedMemory::<f32>::new_aligned(comptime!(2 * bq as usize), 16usize);
    let bar = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let plane = UNIT_POS / 32u32;
    let lane = UNIT_POS_PLANE;
    let tid = lane % 4u32;
    // This plane's m-tiles of keys; the lane's keys are `gid` and `gid + 8` of each.
    let tiles = comptime!(g.plane_tiles());
    let head_tiles = comptime!(g.head_dim / 8);
    // The exponentials' scale: `exp(x·scale) = 2^(x·scale₂)`.
    let scale2 = scale * LOG2_E;
    let fast = comptime!(g.fast_exp);
    let strip0 = plane * comptime!(16 * g.plane_tiles());
    let kpos0 = k0 + strip0 + lane / 4u32;

    let mut dk = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * head_tiles) as usize));
    let mut dvv = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * head_tiles) as usize));
    #[unroll]
    for i in 0..comptime!(tiles * 2 * head_tiles) {
        dk[i as usize] = Vector::<f32, Pair>::new(0.0);
        dvv[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    let mut st = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * query_tiles) as usize));
    let mut dpt = Array::<Vector<f32, Pair>>::new(comptime!((tiles * 2 * query_tiles) as usize));
    let mut pt = Array::<Vector<F, Pair>>::new(comptime!((tiles * 2 * query_tiles) as usize));
    let mut dst = Array::<Vector<F, Pair>>::new(comptime!((tiles * 2 * query_tiles) as usize));

    // The steps are (head, query block) pairs, the live query blocks of each of this
    // part's heads in turn, pipelined as in the forward: a step's Q, dO, lse and D arrive
    // in one buffer while the previous step computes on the other.
    let mut steps = query_steps(
        k_ranges,
        q_ranges,
        batch,
        kb,
        seq,
        window,
        part * heads_per_part,
        (part + 1) * heads_per_part,
        bk,
        bq,
        mask,
    );
    copy_rows_async::<F, N>(k, kv_base, k0, seq, &mut k_tile, 0u32, bk, g);
    copy_rows_async::<F, N>(v, kv_base, k0, seq, &mut v_tile, 0u32, bk, g);
    if steps.head < steps.head_end {
        copy_query_step::<F, N>(
            q,
            grad,
            lse,
            dot,
            kv_head * group + steps.head,
            batch,
            q_heads,
            steps.block * bq,
            seq,
            &mut q_tile,
            &mut do_tile,
            &mut lse_rows,
            &mut d_rows,
            0u32,
            g,
        );
    }
    bar.commit_copy_async();
    let mut buf = 0u32;
    // The step whose dQ is still to be summed (deferred dQ): its head and first query.
    let mut pending = false;
    let mut pending_h = 0u32;
    let mut pending_q0 = 0u32;
    while steps.head < steps.head_end {
        bar.arrive_and_wait();
        let (next_h, next_qb) = next_query_step(&steps, q_ranges, mask);
        if next_h < steps.head_end {
            copy_query_step::<F, N>(
                q,
                grad,
                lse,
                dot,
                kv_head * group + next_h,
                batch,
                q_heads,
                next_qb * bq,
                seq,
                &mut q_tile,
                &mut do_tile,
                &mut lse_rows,
                &mut d_rows,
                (1u32 - buf) * bq,
                g,
            );
        }
        bar.commit_copy_async();
        if comptime!(g.deferred_dq) {
            if pending {
                let q_row0 = (batch * q_heads + kv_head * group + pending_h) as usize * seq_len;
                dq_products::<F, N>(
                    &ds_tile,
                    (1u32 - buf) * bk,
                    &k_tile,
                    grad_q_sum,
                    q_row0,
                    pending_q0,
                    pending_q0 + bq - 1,
                    k0,
                    seq,
                    g,
                    mask,
                );
            }
        }
        let h = steps.head;
        let q0 = steps.block * bq;
        let row0 = buf * bq;

        // A strip of keys after the block's last query (causal) has nothing to do.
        let mut strip_live = true;
        if comptime!(mask.causal) {
            strip_live = q0 + bq - 1 >= k0 + strip0;
        }
        if strip_live {
            // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, [keys, queries].
            row_products::<F, N>(&k_tile, strip0, &q_tile, row0, &mut st, g);
            row_products::<F, N>(&v_tile, strip0, &do_tile, row0, &mut dpt, g);
            let interior = block_fully_visible(
                q0,
                k0 + strip0,
                seq,
                bq,
                comptime!(16 * g.plane_tiles()),
                mask,
            );
            // This lane's two queries (columns) of C tile n are `2 · tid` and the next
            // after `8n`: their `lse` and `D` from the lane's first, a constant after it.
            let row_at = (row0 + 2 * tid) as usize;
            // Pᵀ = exp(Sᵀ·scale − lse) into `st` (0 as it is for a query that saw no key:
            // NO_KEY_LSE·log₂ e = +∞).
            #[unroll]
            for n in 0..query_tiles {
                let lse0 = lse_rows[row_at + comptime!((n * 8) as usize)];
                let lse1 = lse_rows[row_at + comptime!((n * 8 + 1) as usize)];
                // `exp(s·scale − lse) = 2^(s·scale₂ − lse·log₂ e)`.
                let lse2_0 = lse0 * LOG2_E;
                let lse2_1 = lse1 * LOG2_E;
                #[unroll]
                for t in 0..tiles {
                    let at = comptime!((t * 2 * query_tiles + 2 * n) as usize);
                    let s_lo = st[at];
                    let s_hi = st[at + 1];
                    st[at] = pair(
                        exp2(s_lo[0] * scale2 - lse2_0, fast),
                        exp2(s_lo[1] * scale2 - lse2_1, fast),
                    );
                    st[at + 1] = pair(
                        exp2(s_hi[0] * scale2 - lse2_0, fast),
                        exp2(s_hi[1] * scale2 - lse2_1, fast),
                    );
                }
            }
            // A boundary block's hidden pairs, behind one branch for the whole step.
            if !interior {
                mask_tiles(
                    &mut st,
                    kpos0,
                    q0 + 2 * tid,
                    0.0,
                    seq,
                    window,
                    doc_ids,
                    doc_base,
                    tiles,
                    query_tiles,
                    true,
                    mask,
                );
            }
            // Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − D), rounded.
            #[unroll]
            for n in 0..query_tiles {
                let d0 = d_rows[row_at + comptime!((n * 8) as usize)];
                let d1 = d_rows[row_at + comptime!((n * 8 + 1) as usize)];
                #[unroll]
                for t in 0..tiles {
                    let at = comptime!((t * 2 * query_tiles + 2 * n) as usize);
                    let p_lo = st[at];
                    let p_hi = st[at + 1];
                    let dp_lo = dpt[at];
                    let dp_hi = dpt[at + 1];
                    pt[at] = Vector::<F, Pair>::cast_from(p_lo);
                    pt[at + 1] = Vector::<F, Pair>::cast_from(p_hi);
                    dst[at] = Vector::<F, Pair>::cast_from(pair(
                        p_lo[0] * (dp_lo[0] - d0),
                        p_lo[1] * (dp_lo[1] - d1),
                    ));
                    dst[at + 1] = Vector::<F, Pair>::cast_from(pair(
                        p_hi[0] * (dp_hi[0] - d0),
                        p_hi[1] * (dp_hi[1] - d1),
                    ));
                }
            }
            if comptime!(g.atomic_dq) {
                // This plane's keys of dSᵀ into the cube's tile, a pair a register: the
                // lane's first pair once, each register's a constant after it.
                let ds_pairs = comptime!(ds_stride(&g) * g.vector / 2);
                let ds_row0 = (buf % ds_buffers) * bk;
                let ds_at = ((ds_row0 + strip0 + lane / 4u32) * ds_pairs + tid) as usize;
                let mut view = ds_tile.slice_mut(0usize, ds_len).with_vector_size::<Pair>();
                #[unroll]
                for n in 0..query_tiles {
                    #[unroll]
                    for t in 0..tiles {
                        let at = comptime!((t * 2 * query_tiles + 2 * n) as usize);
                        let lo = ds_at + comptime!((t * 16 * ds_pairs + n * 4) as usize);
                        view[lo] = dst[at];
                        view[lo + comptime!((8 * ds_pairs) as usize)] = dst[at + 1];
                    }
                }
            }
            // dV += Pᵀ·dO and dK += dSᵀ·Q (B[query, e]: a pair of dOᵀ's / Qᵀ's row).
            step_products::<F, N>(&pt, &do_tile, row0, &mut dvv, g);
            step_products::<F, N>(&dst, &q_tile, row0, &mut dk, g);
        }
        if comptime!(g.atomic_dq && !g.deferred_dq) {
            // Every plane's dSᵀ is in the tile; the next step's barrier says every plane
            // is done reading it before it is written again.
            sync_cube();
            let q_row0 = (batch * q_heads + kv_head * group + h) as usize * seq_len;
            dq_products::<F, N>(
                &ds_tile,
                0u32,
                &k_tile,
                grad_q_sum,
                q_row0,
                q0,
                q0 + bq - 1,
                k0,
                seq,
                g,
                mask,
            );
        }
        pending = true;
        pending_h = h;
        pending_q0 = q0;
        steps.head = next_h;
        steps.block = next_qb;
        buf = 1u32 - buf;
    }
    bar.arrive_and_wait();
    if comptime!(g.deferred_dq) {
        if pending {
            let q_row0 = (batch * q_heads + kv_head * group + pending_h) as usize * seq_len;
            dq_products::<F, N>(
                &ds_tile,
                (1u32 - buf) * bk,
                &k_tile,
                grad_q_sum,
                q_row0,
                pending_q0,
                pending_q0 + bq - 1,
                k0,
                seq,
                g,
                mask,
            );
        }
        // The K tile is read above and written with dK below.
        sync_cube();
    }

    if comptime!(parts > 1) {
        // This part's f32 sums, straight from the C registers: `[parts, batch · kv_heads ·
        // seq, head_dim]` as pairs, `part_pairs` pairs a part.
        let row_pairs = comptime!(g.head_dim / 2);
        let rows_base = (batch * kv_heads + kv_head) * seq;
        #[unroll]
        for t in 0..tiles {
            let kpos_lo = kpos0 + t * 16;
            let kpos_hi = kpos_lo + 8u32;
            #[unroll]
            for dn in 0..head_tiles {
                let lo = comptime!((t * 2 * head_tiles + 2 * dn) as usize);
                if kpos_lo < seq {
                    let at = (part * part_pairs + (rows_base + kpos_lo) * row_pairs + dn * 4 + tid)
                        as usize;
                    partial_k[at] = dk[lo] * Vector::<f32, Pair>::new(scale);
                    partial_v[at] = dvv[lo];
                }
                if kpos_hi < seq {
                    let at = (part * part_pairs + (rows_base + kpos_hi) * row_pairs + dn * 4 + tid)
                        as usize;
                    partial_k[at] = dk[lo + 1] * Vector::<f32, Pair>::new(scale);
                    partial_v[at] = dvv[lo + 1];
                }
            }
        }
    } else {
        #[unroll]
        for t in 0..tiles {
            let at = comptime!(t * 2 * head_tiles);
            rows_to_tile::<F, N>(&dk, at, &mut k_tile, strip0 + t * 16, scale, scale, g);
            rows_to_tile::<F, N>(&dvv, at, &mut v_tile, strip0 + t * 16, 1.0, 1.0, g);
        }
        sync_cube();
        tile_to_rows::<F, N>(&k_tile, grad_k, kv_base, k0, seq, g);
        tile_to_rows::<F, N>(&v_tile, grad_v, kv_base, k0, seq, g);
    }
}

/// `acc += A·B` over the 16-row chunks `lo..hi` of a reduction of `chunks` (chunks
/// outside are skipped): A's `m_tiles` 16-row tiles from the row-major tile `a` of
/// `a_stride` vectors a row (rows the output rows from `a_row0`, columns the reduction
/// from vector `a_col0`; with `a_transposed` rows the reduction from `a_row0` and columns
/// the output rows from vector `a_col0`, its 8×8 blocks loaded transposed), B's `cols`
/// columns from the row-major tile `b` (rows the reduction from `b_row0`, columns from
/// vector `b_col0`; transposed blocks, as in `step_products`). Each B load serves every
/// m-tile. `acc` holds `2 · cols / 8` C registers an m-tile, m-tile after m-tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn tile_products<F: Float, N: Size>(
    a: &SharedMemory<Vector<F, N>>,
    a_row0: u32,
    a_col0: u32,
    b: &SharedMemory<Vector<F, N>>,
    b_row0: u32,
    b_col0: u32,
    acc: &mut Array<Vector<f32, Pair>>,
    lo: u32,
    hi: u32,
    #[comptime] a_stride: u32,
    #[comptime] a_transposed: bool,
    #[comptime] b_stride: u32,
    #[comptime] m_tiles: u32,
    #[comptime] cols: u32,
    #[comptime] chunks: u32,
) {
    let c_tiles = comptime!(cols / 8);
    let lane = UNIT_POS_PLANE;
    let m = lane / 8u32;
    // The lane's row and column of its matrix (see `ldmatrix_x4`): A's output rows
    // `(m % 2) · 8..` at reduction columns `(m / 2) · 8..` (transposed: reduction rows
    // `(m / 2) · 8..` at output columns `(m % 2) · 8..`), registers a0..a3 either way;
    // B's as in `step_products`.
    let mut a_at = ((a_row0 + (m % 2) * 8 + lane % 8u32) * a_stride + a_col0 + m / 2) as usize;
    if comptime!(a_transposed) {
        a_at = ((a_row0 + (m / 2) * 8 + lane % 8u32) * a_stride + a_col0 + m % 2) as usize;
    }
    let b_at = ((b_row0 + (m % 2) * 8 + lane % 8u32) * b_stride + b_col0 + m / 2) as usize;
    let mut b0 = Array::<Vector<F, Pair>>::new(2usize);
    let mut b1 = Array::<Vector<F, Pair>>::new(2usize);
    #[unroll]
    for kk in 0..chunks {
        if kk >= lo && kk < hi {
            let mut a_all = Array::<Vector<F, Pair>>::new(comptime!((4 * m_tiles) as usize));
            #[unroll]
            for t in 0..m_tiles {
                let offset = comptime!(if a_transposed {
                    kk * 16 * a_stride + 2 * t
                } else {
                    t * 16 * a_stride + 2 * kk
                });
                let regs = ldmatrix_x4::<F, N>(a, a_at, comptime!(offset as usize), a_transposed);
                #[unroll]
                for r in 0..4u32 {
                    a_all[comptime!((4 * t + r) as usize)] = regs[r as usize];
                }
            }
            #[unroll]
            for dn2 in 0..comptime!(cols / 16) {
                let regs = ldmatrix_x4::<F, N>(
                    b,
                    b_at,
                    comptime!((kk * 16 * b_stride + 2 * dn2) as usize),
                    true,
                );
                b0[0] = regs[0];
                b0[1] = regs[1];
                b1[0] = regs[2];
                b1[1] = regs[3];
                #[unroll]
                for t in 0..m_tiles {
                    let mut a_t = Array::<Vector<F, Pair>>::new(4usize);
                    #[unroll]
                    for r in 0..4u32 {
                        a_t[r as usize] = a_all[comptime!((4 * t + r) as usize)];
                    }
                    let at = comptime!(t * 2 * c_tiles + 4 * dn2);
                    mma::<F>(&a_t, &b0, acc, comptime!(at as usize));
                    mma::<F>(&a_t, &b1, acc, comptime!((at + 2) as usize));
                }
            }
        }
    }
}

/// The dK/dV kernel's body in FlashAttention-2's warp layout ([`FlashGeometry::warp_grid`]:
/// 8 planes, 128 keys a cube, 64-query steps, dQ summed atomically). A step's `S = Q·Kᵀ`
/// and `dP = dO·Vᵀ` are 32×32 blocks on a 2 × 4 grid of planes (queries × keys); `P =
/// exp(S·scale − lse)` and `dS = P ∘ (dP − D)`, rounded to the input dtype, go to two
/// `[queries, keys]` tiles; after a cube sync `dV += Pᵀ·dO` and `dK += dSᵀ·Q` run on a 4 × 2
/// grid (32 keys × half the head a plane, held across the steps) and `dQ = dS·K` on a 2 ×
/// 4 grid (32 queries × a quarter of the head), added to `grad_q_sum` atomically. Under a
/// causal mask a score block after its last query is zeros without products, and the
/// products skip 16-row chunks that hold only zeros.
#[cube]
#[allow(clippy::too_many_arguments)]
fn backward_kv_grid<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    lse: &Array<f32>,
    dot: &Array<f32>,
    doc_ids: &Array<i32>,
    q_ranges: &Array<i32>,
    k_ranges: &Array<i32>,
    grad_k: &mut Array<Vector<F, N>>,
    grad_v: &mut Array<Vector<F, N>>,
    partial_k: &mut Array<Vector<f32, Pair>>,
    partial_v: &mut Array<Vector<f32, Pair>>,
    grad_q_sum: &mut Array<Atomic<Vector<f32, Pair>>>,
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    part_pairs: u32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[comptime] parts: u32,
) {
    let bk = comptime!(g.own_rows);
    let bq = comptime!(g.step_rows);
    let stride = comptime!(g.stride());
    let ps_stride = comptime!(grid_stride(&g));
    let half = comptime!(g.head_dim / 2);
    let quarter = comptime!(g.head_dim / 4);
    // Heaviest (first, under a causal mask) key blocks first (see `flash_cube_count`).
    let kb = CUBE_POS_Y;
    let head_part = CUBE_POS_X % (kv_heads * parts);
    let kv_head = head_part / parts;
    let part = head_part % parts;
    let batch = CUBE_POS_X / (kv_heads * parts);
    let group = q_heads / kv_heads;
    let heads_per_part = group / parts;
    let k0 = kb * bk;
    let seq_len = seq as usize;
    let kv_base = (batch * kv_heads + kv_head) as usize * seq_len * comptime!(g.dv() as usize);
    let doc_base = batch as usize * seq_len;

    let mut k_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * stride) as usize), 128usize);
    let mut v_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * stride) as usize), 128usize);
    let mut q_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((2 * bq * stride) as usize), 128usize);
    let mut do_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((2 * bq * stride) as usize), 128usize);
    let scores_len = comptime!((bq * ps_stride) as usize);
    let mut p_tile = SharedMemory::<Vector<F, N>>::new_aligned(scores_len, 128usize);
    let mut ds_tile = SharedMemory::<Vector<F, N>>::new_aligned(scores_len, 128usize);
    let mut lse_rows = SharedMemory::<f32>::new_aligned(comptime!(2 * bq as usize), 16usize);
    let mut d_rows = SharedMemory::<f32>::new_aligned(comptime!(2 * bq as usize), 16usize);
    let bar = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let plane = UNIT_POS / 32u32;
    let lane = UNIT_POS_PLANE;
    let gid = lane / 4u32;
    let tid = lane % 4u32;
    // Scores and dQ: queries `sq · 32..` of the step; keys `sk · 32..` of the cube
    // (scores), columns `sk · quarter..` (dQ).
    let sq = plane / 4u32;
    let sk = plane % 4u32;
    // dV and dK: keys `ok · 32..`, columns `oc · half..`.
    let ok = plane / 2u32;
    let oc = plane % 2u32;
    let scale2 = scale * LOG2_E;
    let fast = comptime!(g.fast_exp);
    // `row_products` on a 32×32 block: two m-tiles of queries, 32 keys.
    let block = comptime!(FlashGeometry {
        own_rows: 32,
        planes: 1,
        units: 32,
        step_rows: 32,
        ..g
    });
    // C registers (f32 pairs): a 32×32 block's, and dV's or dK's (two m-tiles of half
    // the head).
    let block_regs = comptime!(2 * 2 * 32 / 8);
    let acc_regs = comptime!(2 * 2 * half / 8);
    let mut dk = Array::<Vector<f32, Pair>>::new(comptime!(acc_regs as usize));
    let mut dvv = Array::<Vector<f32, Pair>>::new(comptime!(acc_regs as usize));
    #[unroll]
    for i in 0..acc_regs {
        dk[i as usize] = Vector::<f32, Pair>::new(0.0);
        dvv[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
    let mut s = Array::<Vector<f32, Pair>>::new(comptime!(block_regs as usize));
    let mut dp = Array::<Vector<f32, Pair>>::new(comptime!(block_regs as usize));
    let ps_pairs = comptime!(ps_stride * g.vector / 2);

    let mut steps = query_steps(
        k_ranges,
        q_ranges,
        batch,
        kb,
        seq,
        window,
        part * heads_per_part,
        (part + 1) * heads_per_part,
        bk,
        bq,
        mask,
    );
    copy_rows_async::<F, N>(k, kv_base, k0, seq, &mut k_tile, 0u32, bk, g);
    copy_rows_async::<F, N>(v, kv_base, k0, seq, &mut v_tile, 0u32, bk, g);
    if steps.head < steps.head_end {
        copy_query_step::<F, N>(
            q,
            grad,
            lse,
            dot,
            kv_head * group + steps.head,
            batch,
            q_heads,
            steps.block * bq,
            seq,
            &mut q_tile,
            &mut do_tile,
            &mut lse_rows,
            &mut d_rows,
            0u32,
            g,
        );
    }
    bar.commit_copy_async();
    let mut buf = 0u32;
    while steps.head < steps.head_end {
        bar.arrive_and_wait();
        let (next_h, next_qb) = next_query_step(&steps, q_ranges, mask);
        if next_h < steps.head_end {
            copy_query_step::<F, N>(
                q,
                grad,
                lse,
                dot,
                kv_head * group + next_h,
                batch,
                q_heads,
                next_qb * bq,
                seq,
                &mut q_tile,
                &mut do_tile,
                &mut lse_rows,
                &mut d_rows,
                (1u32 - buf) * bq,
                g,
            );
        }
        bar.commit_copy_async();
        let h = steps.head;
        let q0 = steps.block * bq;
        let row0 = buf * bq;
        // This plane's score block: queries from `sq0`, keys from `sk0`.
        let sq0 = q0 + sq * 32u32;
        let sk0 = k0 + sk * 32u32;
        // The lane's first pair in the P and dS tiles; each register's a constant after it.
        let ps_at = ((sq * 32u32 + gid) * ps_pairs + sk * 16u32 + tid) as usize;
        let mut p_view = p_tile
            .slice_mut(0usize, scores_len)
            .with_vector_size::<Pair>();
        let mut ds_view = ds_tile
            .slice_mut(0usize, scores_len)
            .with_vector_size::<Pair>();
        let mut block_live = true;
        if comptime!(mask.causal) {
            block_live = sq0 + 31u32 >= sk0;
        }
        if block_live {
            row_products::<F, N>(
                &q_tile,
                row0 + sq * 32u32,
                &k_tile,
                sk * 32u32,
                &mut s,
                block,
            );
            row_products::<F, N>(
                &do_tile,
                row0 + sq * 32u32,
                &v_tile,
                sk * 32u32,
                &mut dp,
                block,
            );
            // P = exp(S·scale − lse) = 2^(S·scale₂ − lse·log₂ e) (0 as it is for a query
            // that saw no key: NO_KEY_LSE·log₂ e = +∞); a row's four keys' pairs share its
            // lse.
            #[unroll]
            for t in 0..2u32 {
                #[unroll]
                for hh in 0..2u32 {
                    let r =
                        (row0 + sq * 32u32 + gid) as usize + comptime!((16 * t + 8 * hh) as usize);
                    let lse2 = lse_rows[r] * LOG2_E;
                    #[unroll]
                    for c in 0..4u32 {
                        let at = comptime!((t * 8 + 2 * c + hh) as usize);
                        let x = s[at];
                        s[at] = pair(
                            exp2(x[0] * scale2 - lse2, fast),
                            exp2(x[1] * scale2 - lse2, fast),
                        );
                    }
                }
            }
            if !block_fully_visible(sq0, sk0, seq, 32u32, 32u32, mask) {
                mask_tiles(
                    &mut s,
                    sq0 + gid,
                    sk0 + 2 * tid,
                    0.0,
                    seq,
                    window,
                    doc_ids,
                    doc_base,
                    2u32,
                    4u32,
                    false,
                    mask,
                );
            }
            // dS = P ∘ (dP − D); both rounded into their tiles.
            #[unroll]
            for t in 0..2u32 {
                #[unroll]
                for hh in 0..2u32 {
                    let r =
                        (row0 + sq * 32u32 + gid) as usize + comptime!((16 * t + 8 * hh) as usize);
                    let d = d_rows[r];
                    #[unroll]
                    for c in 0..4u32 {
                        let at = comptime!((t * 8 + 2 * c + hh) as usize);
                        let to =
                            ps_at + comptime!((((16 * t + 8 * hh) * ps_pairs) + 4 * c) as usize);
                        let p = s[at];
                        let x = dp[at];
                        p_view[to] = Vector::<F, Pair>::cast_from(p);
                        ds_view[to] = Vector::<F, Pair>::cast_from(pair(
                            p[0] * (x[0] - d),
                            p[1] * (x[1] - d),
                        ));
                    }
                }
            }
        } else {
            #[unroll]
            for i in 0..16u32 {
                let t = comptime!(i / 8);
                let hh = comptime!((i / 4) % 2);
                let c = comptime!(i % 4);
                let to = ps_at + comptime!((((16 * t + 8 * hh) * ps_pairs) + 4 * c) as usize);
                p_view[to] = Vector::<F, Pair>::new(F::new(0.0));
                ds_view[to] = Vector::<F, Pair>::new(F::new(0.0));
            }
        }
        sync_cube();
        // dV += Pᵀ·dO and dK += dSᵀ·Q over the step's 16-query chunks that reach this
        // plane's keys (causal: the chunks before them hold only zeros).
        let q_chunks = comptime!(bq / 16);
        let mut q_lo = 0u32;
        if comptime!(mask.causal) {
            let first_key = k0 + ok * 32u32;
            if first_key > q0 {
                q_lo = (first_key - q0) / 16u32;
            }
        }
        tile_products::<F, N>(
            &p_tile,
            0u32,
            ok * comptime!(32 / g.vector),
            &do_tile,
            row0,
            oc * comptime!(half / g.vector),
            &mut dvv,
            q_lo,
            q_chunks,
            ps_stride,
            true,
            stride,
            2u32,
            half,
            q_chunks,
        );
        tile_products::<F, N>(
            &ds_tile,
            0u32,
            ok * comptime!(32 / g.vector),
            &q_tile,
            row0,
            oc * comptime!(half / g.vector),
            &mut dk,
            q_lo,
            q_chunks,
            ps_stride,
            true,
            stride,
            2u32,
            half,
            q_chunks,
        );
        // dQ = dS·K for queries `sq0..` and a quarter of the head, over the cube's 16-key
        // chunks up to the block's last query (causal).
        let key_chunks = comptime!(bk / 16);
        let mut k_hi = 0u32;
        if comptime!(mask.causal) {
            let q_last = sq0 + 31u32;
            if q_last >= k0 {
                k_hi = (q_last - k0) / 16u32 + 1u32;
                if k_hi > key_chunks {
                    k_hi = key_chunks;
                }
            }
        } else {
            k_hi = key_chunks;
        }
        if k_hi > 0u32 {
            let mut dq = Array::<Vector<f32, Pair>>::new(comptime!((2 * 2 * quarter / 8) as usize));
            #[unroll]
            for i in 0..comptime!(2 * 2 * quarter / 8) {
                dq[i as usize] = Vector::<f32, Pair>::new(0.0);
            }
            tile_products::<F, N>(
                &ds_tile,
                sq * 32u32,
                0u32,
                &k_tile,
                0u32,
                sk * comptime!(quarter / g.vector),
                &mut dq,
                0u32,
                k_hi,
                ps_stride,
                false,
                stride,
                2u32,
                quarter,
                key_chunks,
            );
            let q_row0 = (batch * q_heads + kv_head * group + h) as usize * seq_len;
            let row_pairs = comptime!(g.head_dim / 2);
            let lo0 = sq0 + gid;
            let at_lo = (q_row0 + lo0 as usize) * row_pairs as usize
                + (sk * comptime!(quarter / 2) + tid) as usize;
            if q0 + bq <= seq {
                dq_atomic_adds(grad_q_sum, &dq, at_lo, lo0, seq, false, 2u32, quarter, g);
            } else {
                dq_atomic_adds(grad_q_sum, &dq, at_lo, lo0, seq, true, 2u32, quarter, g);
            }
        }
        steps.head = next_h;
        steps.block = next_qb;
        buf = 1u32 - buf;
    }
    bar.arrive_and_wait();

    // The plane's keys `ok · 32 + 16t + 8hh + gid`, columns `oc · half + 8c + 2 · tid`.
    let c_tiles = comptime!(half / 8);
    if comptime!(parts > 1) {
        let row_pairs = comptime!(g.head_dim / 2);
        let rows_base = (batch * kv_heads + kv_head) * seq;
        #[unroll]
        for i in 0..comptime!(2 * 2 * c_tiles) {
            let t = comptime!(i / (2 * c_tiles));
            let c = comptime!((i / 2) % c_tiles);
            let hh = comptime!(i % 2);
            let kpos = k0 + ok * 32u32 + gid + comptime!(16 * t + 8 * hh);
            if kpos < seq {
                let at = (part * part_pairs
                    + (rows_base + kpos) * row_pairs
                    + oc * comptime!(half / 2)
                    + tid) as usize
                    + comptime!((4 * c) as usize);
                let from = comptime!((t * 2 * c_tiles + 2 * c + hh) as usize);
                partial_k[at] = dk[from] * Vector::<f32, Pair>::new(scale);
                partial_v[at] = dvv[from];
            }
        }
    } else {
        let pairs_per_row = comptime!(stride * g.vector / 2);
        let tile_len = comptime!((bk * stride) as usize);
        let at0 = ((ok * 32u32 + gid) * pairs_per_row + oc * comptime!(half / 2) + tid) as usize;
        {
            let mut k_view = k_tile
                .slice_mut(0usize, tile_len)
                .with_vector_size::<Pair>();
            let mut v_view = v_tile
                .slice_mut(0usize, tile_len)
                .with_vector_size::<Pair>();
            #[unroll]
            for i in 0..comptime!(2 * 2 * c_tiles) {
                let t = comptime!(i / (2 * c_tiles));
                let c = comptime!((i / 2) % c_tiles);
                let hh = comptime!(i % 2);
                let to = at0 + comptime!((((16 * t + 8 * hh) * pairs_per_row) + 4 * c) as usize);
                let from = comptime!((t * 2 * c_tiles + 2 * c + hh) as usize);
                k_view[to] =
                    Vector::<F, Pair>::cast_from(dk[from] * Vector::<f32, Pair>::new(scale));
                v_view[to] = Vector::<F, Pair>::cast_from(dvv[from]);
            }
        }
        sync_cube();
        tile_to_rows::<F, N>(&k_tile, grad_k, kv_base, k0, seq, g);
        tile_to_rows::<F, N>(&v_tile, grad_v, kv_base, k0, seq, g);
    }
}

/// `out[i] = 0` for the `len` pairs of `out`.
#[cube(launch_unchecked)]
pub(super) fn zero_pairs_kernel(out: &mut Array<Vector<f32, Pair>>, len: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        out[i as usize] = Vector::<f32, Pair>::new(0.0);
    }
}

/// `out[i] = factor · Σ_p partial[p · len + i]` in the output dtype: the dK/dV parts of
/// [`flash_backward_kv_mma_kernel`] summed in a fixed order (deterministic), or its
/// atomically summed dQ times the scale.
#[cube(launch_unchecked)]
pub(super) fn partial_sum_kernel<F: Float, N: Size>(
    partial: &Array<Vector<f32, N>>,
    out: &mut Array<Vector<F, N>>,
    len: u32,
    factor: f32,
    #[comptime] parts: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as u32;
    if i < len {
        let mut sum = partial[i as usize];
        #[unroll]
        for p in 1..parts {
            sum += partial[(p * len + i) as usize];
        }
        out[i as usize] = Vector::<F, N>::cast_from(sum * Vector::<f32, N>::new(factor));
    }
}

/// How many parts the dK/dV kernel splits each group's query heads into: the fewest that
/// give at least `TARGET_PLANES` planes over the grid of `cubes` cubes of `planes` planes
/// (the grid is otherwise `key blocks × kv_heads × batch`, a few cubes an SM when there
/// are few kv heads: 128 cubes of 4 planes at 4K tokens and 2 kv heads), a divisor of
/// `group`. Parts cost an f32 buffer of `parts` times dK and dV.
pub(super) fn flash_backward_kv_parts(cubes: usize, planes: usize, group: usize) -> usize {
    const TARGET_PLANES: usize = 4096;
    (1..=group)
        .filter(|p| group.is_multiple_of(*p))
        .find(|p| cubes * planes * p >= TARGET_PLANES)
        .unwrap_or(group)
}
