//! Flash attention (FlashAttention-2's algorithm), forward and backward, on tensor cores
//! through CubeCL's `cmma` or on plain FMA units, one source for both.
//!
//! # Math
//!
//! `out_i = Σ_j p_ij v_j`, `p_ij = exp(s_ij - lse_i)`, `s_ij = scale · q_i·k_j` over the keys
//! `j` query `i` sees ([`AttentionMask`]); `lse_i = log Σ_j exp(s_ij)`. Grouped-query
//! attention: query head `h` reads key/value head `h / (q_heads / kv_heads)`; nothing is
//! repeated in memory. Nothing `[seq, seq]`-sized is allocated: a cube holds one block of
//! scores at a time in shared memory.
//!
//! Forward (one cube per query block, query head and batch): the key blocks the mask lets
//! the block see are streamed; per block `S = Q·Kᵀ` (f32), then the online softmax in f32
//! (running max `m`, running sum `l`), `P = exp(S - m)` rounded to the input dtype (as the
//! reference rounds its probabilities before `P·V`), `O += P·V` in f32. The output is
//! `O / l` in the input dtype, and `lse = m + ln l` (f32, `[batch, q_heads, seq]`) is kept
//! for the backward.
//!
//! The running max is updated lazily: a row's `m` moves (and its `O`, `l` are rescaled by
//! `exp(m_old - m_new)`) only when the block's max exceeds it by more than
//! [`RESCALE_THRESHOLD`]; otherwise the block's `exp(s - m)` is up to `e^5.5 ≈ 245`,
//! harmless in f32 and in f16/bf16 (relative rounding does not depend on magnitude). The
//! result is the same function (the final `O / l` and `m + ln l` do not depend on which
//! `m` was used); it saves the tensor-core path most of its accumulator round trips
//! through shared memory (below).
//!
//! Backward (FA2): `D_i = Σ_e dO_ie · O_ie` (f32) first ([`attention_row_dot`]); then one
//! cube per key block, key/value head and batch walks the query blocks of every query
//! head of its group, recomputes `P` from `lse`, and accumulates `dV += Pᵀ·dO` and
//! `dK += dSᵀ·Q` (`dS = P ∘ (dP - D)`, `dP = dO·Vᵀ`) in f32, writing `dK·scale` and `dV`
//! once: the group's heads are summed in the cube, with no atomics, deterministically.
//! A separate kernel per query block and query head walks the key blocks for
//! `dQ = scale · dS·K` (deterministic too; it recomputes `S` and `dP`).
//!
//! # Masks and skipped blocks
//!
//! [`AttentionMask`] is comptime (each combination its own kernel): causal (`j ≤ i`),
//! sliding window (`i - window < j`, Mistral), documents (`doc[i] == doc[j]`, from an int
//! `[batch, seq]` tensor of document ids: packed rows). Blocks the mask hides entirely are
//! never touched: causal skips the key blocks past the query block, the window those
//! before it, documents those whose id range (per block `[min, max]`, from
//! [`document_ranges`]) does not meet the query block's. Document ids rather than
//! `cu_seqlens`: they are per row of the batch (every packed row has its own boundaries),
//! their shape alone validates them, the kernel reads them where it needs them, and any
//! ids work (non-adjacent pieces of one document see each other); with non-decreasing
//! ids (documents laid end to end) the ranges skip every block outside the documents.
//!
//! A query that sees no key (impossible with these masks, which always show a query
//! itself; possible only through bad ids or shapes) gets output 0, `lse =`
//! [`NO_KEY_LSE`], and zero gradients, as Burn's own attention defines it. A NaN among a
//! query's visible scores (a NaN or infinite input) makes its output, `lse` and
//! probabilities NaN, so its gradients and those of the keys and values it sees are NaN, as
//! in PyTorch; through a hidden key's zero probability (`0 · NaN` in a tile's product) a
//! NaN may also reach another query's gradients, as in FlashAttention-2.
//!
//! # Tensor cores (`cmma`) and the plain path
//!
//! [`FlashGeometry::tensor_cores`] is comptime. With it, each plane (warp) of the cube owns
//! 16-row strips: `S` strips are `cmma` products of 16×16×16 `f16`/`bf16` fragments loaded
//! from shared memory (`K` as a column-major B operand: `Kᵀ` for free) into f32
//! accumulators, stored to a shared f32 tile for the softmax; `P` (input dtype, shared) is
//! the A operand of `O += P·V`, whose accumulator fragments stay in registers across the
//! whole key loop. `cmma` fragments are opaque, so a row rescale of `O` goes through
//! shared memory (store, scale rows, load back), and only in the rare steps where some
//! row's lazy max moved (a cube-wide flag). The plain path runs the same kernels with the
//! products as FMA loops over the same shared tiles and `O` in per-unit registers: it
//! runs anywhere (lavapipe in CI) and tests every part but the fragment calls.
//!
//! Shared tiles are padded by 16 bytes per row (fewer bank conflicts; `cmma` strides stay
//! multiples of 8 elements and tile starts 32-byte aligned).
//!
//! # Register-resident products ([`FlashVariant::Mma`], module `attention_mma`)
//!
//! Where PTX's `mma.sync` layouts hold (CUDA, f16/bf16, sm_80+) the same three kernels run
//! with every product as m16n8k16 `mma.sync` on registers: a score tile's C registers
//! are, rounded, the A operand of the next product, so `S`, `P`, `dP`, `dS` and the
//! accumulators never touch shared memory, and the row statistics are quad shuffles.
//! Operands come from the staged tiles by `ldmatrix`. This is the variant the Burn glue
//! picks first; `cmma` remains for devices with cooperative matrices but other layouts.
//! On CUDA their compiled source is patched so that each `2^x` is the bare
//! `ex2.approx.ftz.f32` ([`FlashPlan::exp2_flush_to_zero`]).

use crate::counters::{self, Kernel};
use crate::launch::{KernelError, check_float_dtype, hardware_math_supported};
use crate::patched_launch::{KernelArgs, PatchedTask, SourcePatch};
use cubecl::cmma;
use cubecl::ir::features::AtomicUsage;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use cubecl::server::Handle;

#[path = "attention_mma.rs"]
mod mma;

/// A row's running max moves only when a block's max exceeds it by more than this (natural
/// log units): the exponentials of a block stay below `e^5.5 ≈ 245`. See the module docs.
pub const RESCALE_THRESHOLD: f32 = 5.5;

/// The largest head dimension whose plans take [`FlashPlan::exp2_flush_to_zero`]: on the
/// H200 the patch shortens head_dim 64's forward and leaves the backward as it is, but
/// lengthens head_dim 128's forward although its step issues fewer instructions
/// (`benches/attention.md` has the measurements).
pub const EXP2_FLUSH_TO_ZERO_MAX_HEAD_DIM: usize = 64;

/// `lse` of a query that sees no key: the backward's probabilities of that row are 0.
pub const NO_KEY_LSE: f32 = f32::MAX;

/// Which keys a query sees; each combination compiles its own kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttentionMask {
    /// Query `i` sees keys `j ≤ i`.
    pub causal: bool,
    /// Query `i` sees keys `j > i - window` (the window's size is a launch value).
    pub window: bool,
    /// Query `i` sees keys of its own document only (`doc[i] == doc[j]`).
    pub documents: bool,
}

/// The comptime geometry of one flash kernel.
///
/// The cube keeps `own_rows` rows for its whole life (queries in the forward and dQ
/// kernels, keys in the dK/dV kernel) and streams `step_rows` rows per step (keys, or
/// queries). Score tiles are `[queries, keys]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashGeometry {
    /// Rows kept by the cube.
    pub own_rows: u32,
    /// Rows streamed per step.
    pub step_rows: u32,
    /// Units per cube (`planes × 32` with tensor cores).
    pub units: u32,
    /// Planes per cube (tensor cores: each owns `own_rows / 16 / planes` strips).
    pub planes: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Elements per vector of the input/output tensors and the q/k/v tiles.
    pub vector: u32,
    /// `cmma` products (else FMA loops).
    pub tensor_cores: bool,
    /// Register-resident `mma.sync` products ([`FlashVariant::Mma`]).
    pub mma: bool,
    /// Score tile rows (queries).
    pub s_rows: u32,
    /// Score tile columns (keys).
    pub s_cols: u32,
    /// `exp` and `ln` through the hardware's approximate exponential (`__expf`, as
    /// FlashAttention's `exp2f` under fast math) instead of the libm-accurate call; CUDA and
    /// HIP only, where the flag changes nothing else (SPIR-V would also assume no NaN).
    pub fast_exp: bool,
    /// The register-mma dK/dV kernel also sums dQ, by f32 atomic adds (see
    /// [`FlashPlan::atomic_dq`]); the dQ kernel is then not launched.
    pub atomic_dq: bool,
    /// With `atomic_dq`: a step's `dQ` waits for the next step's barrier, from a second
    /// `dSᵀ` buffer, instead of following a cube sync of its own (see
    /// [`MmaTiling::deferred_dq`]).
    pub deferred_dq: bool,
    /// With `atomic_dq`: the dK/dV kernel in FlashAttention-2's warp layout (see
    /// [`KernelTiling::warp_grid`]).
    pub warp_grid: bool,
}

impl FlashGeometry {
    /// Vectors per head row.
    pub fn dv(&self) -> u32 {
        self.head_dim / self.vector
    }
    /// Row stride of the q/k/v tiles, in vectors (16 bytes of padding for 2-byte inputs).
    pub fn stride(&self) -> u32 {
        self.dv() + (8 / self.vector).max(1)
    }
    /// Row stride of the f32 score tiles, in elements.
    pub fn s_stride(&self) -> u32 {
        self.s_cols + 4
    }
    /// Row stride of the input-dtype probability tiles, in elements.
    pub fn p_stride(&self) -> u32 {
        self.s_cols + 8
    }
    /// Row stride of the f32 accumulator bounce tile, in elements.
    pub fn o_stride(&self) -> u32 {
        self.head_dim + 4
    }
    /// 16-row m-tiles each plane owns (register mma: the products of a step share each
    /// B operand loaded from shared memory among them).
    pub fn plane_tiles(&self) -> u32 {
        self.own_rows / 16 / self.planes
    }
    /// How the dK/dV kernel's planes share a step's `dQ = dS·K` (register mma, with
    /// [`Self::atomic_dq`]): `(query tiles a plane, column parts, key parts)`. The step's
    /// 16-row query tiles go to the planes in groups of one or two; the planes of one
    /// group split the head's 16-column tiles into as many parts as divide evenly, then
    /// the cube's keys (each part's sum added on its own). Of the two, the one that loads
    /// fewer `ldmatrix` operands a product (a plane loads, for each 16-key chunk, one A
    /// operand a query tile and one B operand a 16-column tile); one query tile where they
    /// tie. `None` where the planes do not split evenly.
    pub fn dq_split(&self) -> Option<(u32, u32, u32)> {
        let query_tiles = self.step_rows / 16;
        let head_tiles = self.head_dim / 16;
        let mut best: Option<(u32, (u32, u32, u32))> = None;
        for per_plane in [1u32, 2] {
            if query_tiles == 0 || !query_tiles.is_multiple_of(per_plane) {
                continue;
            }
            let groups = query_tiles / per_plane;
            if !self.planes.is_multiple_of(groups) {
                continue;
            }
            let per_group = self.planes / groups;
            let Some(cols) = (1..=per_group)
                .rev()
                .find(|c| per_group.is_multiple_of(*c) && head_tiles.is_multiple_of(*c))
            else {
                continue;
            };
            let keys = per_group / cols;
            if !(self.own_rows / 16).is_multiple_of(keys) {
                continue;
            }
            // Loads per product, scaled to integers: (A + B loads) / products, where a
            // chunk's products are `per_plane · 2 · col_tiles` (two 8-column C tiles a
            // B load).
            let col_tiles = head_tiles / cols;
            let cost = 1000 * (per_plane + col_tiles) / (per_plane * col_tiles);
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, (per_plane, cols, keys)));
            }
        }
        best.map(|(_, split)| split)
    }

    /// Query rows per score tile unit group in the softmax (`units / s_rows` units a row).
    fn units_per_row(&self) -> u32 {
        self.units / self.s_rows
    }
}

/// Which kernel a geometry is for (they keep different tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashKernel {
    /// The forward.
    Forward,
    /// dK and dV.
    BackwardKv,
    /// dQ.
    BackwardQ,
}

/// Bytes of shared memory a kernel of geometry `g` uses for inputs of `elem` bytes.
pub fn shared_bytes(g: &FlashGeometry, kernel: FlashKernel, elem: usize) -> usize {
    if g.mma {
        return mma::shared_bytes(g, kernel, elem);
    }
    let tile = |rows: u32| rows as usize * g.stride() as usize * g.vector as usize * elem;
    let s_tile = g.s_rows as usize * g.s_stride() as usize * 4;
    let p_tile = g.s_rows as usize * g.p_stride() as usize * elem;
    // The accumulator's bounce through shared memory: tensor cores only.
    let bounce = if g.tensor_cores {
        g.own_rows as usize * g.o_stride() as usize * 4
    } else {
        0
    };
    let rows = |n: u32| n as usize * 4;
    match kernel {
        // q, k, v, p, scratch (scores or the O bounce), two reductions, row scale, flag.
        FlashKernel::Forward => {
            tile(g.own_rows)
                + 2 * tile(g.step_rows)
                + p_tile
                + s_tile.max(bounce)
                + 2 * g.units as usize * 4
                + rows(g.own_rows)
                + 4
        }
        // k, v, q, dO, p, dS, scratch (S and dP, or the bounce), lse and D of the step.
        FlashKernel::BackwardKv => {
            2 * tile(g.own_rows)
                + 2 * tile(g.step_rows)
                + 2 * p_tile
                + (2 * s_tile).max(bounce)
                + 2 * rows(g.step_rows)
                + rows(g.own_rows)
        }
        // q, dO, k, v, dS, scratch, lse and D of the own rows.
        FlashKernel::BackwardQ => {
            2 * tile(g.own_rows)
                + 2 * tile(g.step_rows)
                + p_tile
                + (2 * s_tile).max(bounce)
                + 3 * rows(g.own_rows)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------

/// Whether query `qpos` sees key `kpos`.
#[cube]
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn visible(
    qpos: u32,
    kpos: u32,
    seq: u32,
    window: u32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] mask: AttentionMask,
) -> bool {
    let mut v = qpos < seq && kpos < seq;
    if comptime!(mask.causal) {
        v = v && kpos <= qpos;
    }
    if comptime!(mask.window) {
        v = v && kpos + window > qpos;
    }
    if comptime!(mask.documents) {
        if v {
            v = doc_ids[doc_base + qpos as usize] == doc_ids[doc_base + kpos as usize];
        }
    }
    v
}

/// Copies rows `row0..row0 + rows` of a `[seq, head_dim]` slab starting at vector `base`
/// into `tile` (zeros past `seq`).
#[cube]
fn load_rows<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    base: usize,
    row0: u32,
    seq: u32,
    tile: &mut SharedMemory<Vector<F, N>>,
    #[comptime] rows: u32,
    #[comptime] g: FlashGeometry,
) {
    let dv = comptime!(g.dv());
    let stride = comptime!(g.stride());
    let total = comptime!(rows * g.dv());
    let mut i = UNIT_POS;
    while i < total {
        let r = i / dv;
        let c = i % dv;
        let row = row0 + r;
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if row < seq {
            value = src[base + (row * dv + c) as usize];
        }
        tile[(r * stride + c) as usize] = value;
        i += comptime!(g.units);
    }
}

/// Copies `rows` per-row f32 values starting at row `row0` of `src` (at `base`) into
/// `dst`, `fill` past `seq`.
#[cube]
fn load_row_values(
    src: &Array<f32>,
    base: usize,
    row0: u32,
    seq: u32,
    dst: &mut SharedMemory<f32>,
    fill: f32,
    #[comptime] rows: u32,
    #[comptime] units: u32,
) {
    let mut i = UNIT_POS;
    while i < rows {
        let row = row0 + i;
        let mut value = fill;
        if row < seq {
            value = src[base + row as usize];
        }
        dst[i as usize] = value;
        i += units;
    }
}

/// `out[offset + r·s_stride + c] = Σ_e a[r, e]·b[c, e]` for `r < rows`, `c < cols`: a score
/// tile (`a`, `b`: `[rows | cols, head_dim]` tiles).
#[cube]
fn scores<F: Float, N: Size>(
    a: &SharedMemory<Vector<F, N>>,
    b: &SharedMemory<Vector<F, N>>,
    out: &mut SharedMemory<f32>,
    #[comptime] offset: u32,
    #[comptime] rows: u32,
    #[comptime] cols: u32,
    #[comptime] g: FlashGeometry,
) {
    let stride = comptime!(g.stride());
    let s_stride = comptime!(g.s_stride());
    if comptime!(g.tensor_cores) {
        let elems = comptime!(g.stride() * g.vector);
        let a_len = a.len();
        let b_len = b.len();
        let o_len = out.len();
        let plane = UNIT_POS / PLANE_DIM;
        let strips = comptime!(rows / 16 / g.planes);
        let col_tiles = comptime!(cols / 16);
        let k_tiles = comptime!(g.head_dim / 16);
        let k_step = comptime!(16 / g.vector);
        #[unroll]
        for s in 0..strips {
            let strip = plane * strips + s;
            let mut accs = Sequence::<cmma::Matrix<f32>>::new();
            #[unroll]
            for _n in 0..col_tiles {
                accs.push(cmma::Matrix::<f32>::from_value(
                    cmma::MatrixIdent::Accumulator,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::Undefined,
                    0.0,
                ));
            }
            #[unroll]
            for kk in 0..k_tiles {
                let a_frag = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        cmma::MatrixIdent::A,
                        16usize,
                        16usize,
                        16usize,
                        cmma::MatrixLayout::RowMajor,
                    )
                };
                let a_start = (strip * 16 * stride + kk * k_step) as usize;
                cmma::load(&a_frag, &a.slice(a_start, a_len), elems);
                #[unroll]
                for n in 0..col_tiles {
                    // B[k = e, n = c] = b[c, e]: a row-major `b` is a column-major B.
                    let b_frag = unsafe {
                        cmma::Matrix::<F>::uninitialized(
                            cmma::MatrixIdent::B,
                            16usize,
                            16usize,
                            16usize,
                            cmma::MatrixLayout::ColMajor,
                        )
                    };
                    let b_start = (n * 16 * stride + kk * k_step) as usize;
                    cmma::load(&b_frag, &b.slice(b_start, b_len), elems);
                    let acc = accs.index(comptime!(n as usize));
                    cmma::execute::<F, F, f32, f32>(&a_frag, &b_frag, acc, acc);
                }
            }
            #[unroll]
            for n in 0..col_tiles {
                let o_start = (offset + strip * 16 * s_stride + n * 16) as usize;
                cmma::store(
                    &mut out.slice_mut(o_start, o_len),
                    accs.index(comptime!(n as usize)),
                    s_stride,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
    } else {
        let dv = comptime!(g.dv());
        let total = comptime!(rows * cols);
        let mut i = UNIT_POS;
        while i < total {
            let r = i / cols;
            let c = i % cols;
            let mut acc = Vector::<f32, N>::new(0.0);
            for e in 0..dv {
                acc += Vector::<f32, N>::cast_from(a[(r * stride + e) as usize])
                    * Vector::<f32, N>::cast_from(b[(c * stride + e) as usize]);
            }
            let mut sum = 0.0f32;
            #[unroll]
            for l in 0..N::value() {
                sum += acc[l];
            }
            out[(offset + r * s_stride + c) as usize] = sum;
            i += comptime!(g.units);
        }
    }
}

/// The f32 `[own_rows, head_dim]` accumulator of a cube: `cmma` fragments (each plane its
/// 16-row strips, `head_dim / 16` fragments a strip) or per-unit registers (unit `u` holds
/// vectors `u, u + units, …` of the row-major tile).
#[derive(CubeType)]
struct Accumulator<N: Size> {
    fragments: Sequence<cmma::Matrix<f32>>,
    registers: Array<Vector<f32, N>>,
}

/// f32 scratch elements: `tiles` score tiles, or the accumulator's bounce (tensor cores).
fn scratch_len(g: &FlashGeometry, tiles: u32) -> u32 {
    let scores = tiles * g.s_rows * g.s_stride();
    if g.tensor_cores {
        scores.max(g.own_rows * g.o_stride())
    } else {
        scores
    }
}

/// Registers per unit on the plain path.
fn registers_per_unit(g: &FlashGeometry) -> u32 {
    (g.own_rows * g.dv()).div_ceil(g.units)
}

#[cube]
fn accumulator_new<N: Size>(#[comptime] g: FlashGeometry) -> Accumulator<N> {
    let mut fragments = Sequence::<cmma::Matrix<f32>>::new();
    let mut registers = Array::<Vector<f32, N>>::new(comptime!(if g.tensor_cores {
        1usize
    } else {
        registers_per_unit(&g) as usize
    }));
    if comptime!(g.tensor_cores) {
        let count = comptime!(g.own_rows / 16 / g.planes * (g.head_dim / 16));
        #[unroll]
        for _i in 0..count {
            fragments.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                16usize,
                16usize,
                16usize,
                cmma::MatrixLayout::Undefined,
                0.0,
            ));
        }
    } else {
        #[unroll]
        for i in 0..comptime!(registers_per_unit(&g)) {
            registers[i as usize] = Vector::<f32, N>::new(0.0);
        }
    }
    Accumulator::<N> {
        fragments,
        registers,
    }
}

/// `acc += A·B`: `A` is `[own_rows, inner]` from the input-dtype tile `a` (row-major with
/// stride `p_stride`, or its transpose when `a_transposed`: `A[m, k] = a[k, m]`), `B` is
/// `[inner, head_dim]`, the row-major tile `b`.
#[cube]
fn accumulate<F: Float, N: Size>(
    acc: &mut Accumulator<N>,
    a: &SharedMemory<F>,
    b: &SharedMemory<Vector<F, N>>,
    #[comptime] a_transposed: bool,
    #[comptime] inner: u32,
    #[comptime] g: FlashGeometry,
) {
    let stride = comptime!(g.stride());
    let p_stride = comptime!(g.p_stride());
    if comptime!(g.tensor_cores) {
        let elems = comptime!(g.stride() * g.vector);
        let a_len = a.len();
        let b_len = b.len();
        let plane = UNIT_POS / PLANE_DIM;
        let strips = comptime!(g.own_rows / 16 / g.planes);
        let d_tiles = comptime!(g.head_dim / 16);
        let k_tiles = comptime!(inner / 16);
        let d_step = comptime!(16 / g.vector);
        #[unroll]
        for s in 0..strips {
            let strip = plane * strips + s;
            #[unroll]
            for kk in 0..k_tiles {
                let a_frag = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        cmma::MatrixIdent::A,
                        16usize,
                        16usize,
                        16usize,
                        comptime!(if a_transposed {
                            cmma::MatrixLayout::ColMajor
                        } else {
                            cmma::MatrixLayout::RowMajor
                        }),
                    )
                };
                let mut a_start = strip * 16 * p_stride + kk * 16;
                if comptime!(a_transposed) {
                    a_start = kk * 16 * p_stride + strip * 16;
                }
                cmma::load(&a_frag, &a.slice(a_start as usize, a_len), p_stride);
                #[unroll]
                for n in 0..d_tiles {
                    let b_frag = unsafe {
                        cmma::Matrix::<F>::uninitialized(
                            cmma::MatrixIdent::B,
                            16usize,
                            16usize,
                            16usize,
                            cmma::MatrixLayout::RowMajor,
                        )
                    };
                    let b_start = (kk * 16 * stride + n * d_step) as usize;
                    cmma::load(&b_frag, &b.slice(b_start, b_len), elems);
                    let frag = acc.fragments.index(comptime!((s * d_tiles + n) as usize));
                    cmma::execute::<F, F, f32, f32>(&a_frag, &b_frag, frag, frag);
                }
            }
        }
    } else {
        let dv = comptime!(g.dv());
        let total = comptime!(g.own_rows * g.dv());
        #[unroll]
        for e in 0..comptime!(registers_per_unit(&g)) {
            let idx = UNIT_POS + e * comptime!(g.units);
            if idx < total {
                let r = idx / dv;
                let cv = idx % dv;
                let mut sum = acc.registers[e as usize];
                for kk in 0..inner {
                    let mut a_at = r * p_stride + kk;
                    if comptime!(a_transposed) {
                        a_at = kk * p_stride + r;
                    }
                    let p = f32::cast_from(a[a_at as usize]);
                    sum += Vector::<f32, N>::cast_from(b[(kk * stride + cv) as usize])
                        * Vector::<f32, N>::new(p);
                }
                acc.registers[e as usize] = sum;
            }
        }
    }
}

/// Stores the fragments to `bounce` (`[own_rows, o_stride]` f32, row-major).
#[cube]
fn fragments_to_shared<N: Size>(
    acc: &Accumulator<N>,
    bounce: &mut SharedMemory<f32>,
    #[comptime] g: FlashGeometry,
) {
    let o_stride = comptime!(g.o_stride());
    let len = bounce.len();
    let plane = UNIT_POS / PLANE_DIM;
    let strips = comptime!(g.own_rows / 16 / g.planes);
    let d_tiles = comptime!(g.head_dim / 16);
    #[unroll]
    for s in 0..strips {
        let strip = plane * strips + s;
        #[unroll]
        for n in 0..d_tiles {
            let start = (strip * 16 * o_stride + n * 16) as usize;
            cmma::store(
                &mut bounce.slice_mut(start, len),
                acc.fragments.index(comptime!((s * d_tiles + n) as usize)),
                o_stride,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
}

/// Multiplies every row `r` of the accumulator by `row_scale[r]`. Tensor cores: through
/// `bounce` (free when called; free again on return).
#[cube]
fn scale_rows<N: Size>(
    acc: &mut Accumulator<N>,
    row_scale: &SharedMemory<f32>,
    bounce: &mut SharedMemory<f32>,
    #[comptime] g: FlashGeometry,
) {
    if comptime!(g.tensor_cores) {
        let o_stride = comptime!(g.o_stride());
        fragments_to_shared::<N>(acc, bounce, g);
        sync_cube();
        let total = comptime!(g.own_rows * g.head_dim);
        let mut i = UNIT_POS;
        while i < total {
            let r = i / comptime!(g.head_dim);
            let c = i % comptime!(g.head_dim);
            let at = (r * o_stride + c) as usize;
            bounce[at] = bounce[at] * row_scale[r as usize];
            i += comptime!(g.units);
        }
        sync_cube();
        let len = bounce.len();
        let plane = UNIT_POS / PLANE_DIM;
        let strips = comptime!(g.own_rows / 16 / g.planes);
        let d_tiles = comptime!(g.head_dim / 16);
        #[unroll]
        for s in 0..strips {
            let strip = plane * strips + s;
            #[unroll]
            for n in 0..d_tiles {
                let start = (strip * 16 * o_stride + n * 16) as usize;
                cmma::load_with_layout(
                    acc.fragments.index(comptime!((s * d_tiles + n) as usize)),
                    &bounce.slice(start, len),
                    o_stride,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
    } else {
        let dv = comptime!(g.dv());
        let total = comptime!(g.own_rows * g.dv());
        #[unroll]
        for e in 0..comptime!(registers_per_unit(&g)) {
            let idx = UNIT_POS + e * comptime!(g.units);
            if idx < total {
                let r = idx / dv;
                acc.registers[e as usize] =
                    acc.registers[e as usize] * Vector::<f32, N>::new(row_scale[r as usize]);
            }
        }
    }
}

/// Writes `acc[r] · row_factor[r] · factor` (rows `row0 + r < seq`) to the `[seq, head_dim]`
/// slab at vector `base` of `out`, in the output dtype. `row_factor` is read only when
/// `per_row`. Tensor cores: through `bounce` (free when called; free again on return).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_accumulator<F: Float, N: Size>(
    acc: &Accumulator<N>,
    out: &mut Array<Vector<F, N>>,
    base: usize,
    row0: u32,
    seq: u32,
    row_factor: &SharedMemory<f32>,
    factor: f32,
    bounce: &mut SharedMemory<f32>,
    #[comptime] per_row: bool,
    #[comptime] g: FlashGeometry,
) {
    let dv = comptime!(g.dv());
    let total = comptime!(g.own_rows * g.dv());
    if comptime!(g.tensor_cores) {
        let o_stride = comptime!(g.o_stride());
        fragments_to_shared::<N>(acc, bounce, g);
        sync_cube();
        let mut i = UNIT_POS;
        while i < total {
            let r = i / dv;
            let cv = i % dv;
            let row = row0 + r;
            if row < seq {
                let mut f = factor;
                if comptime!(per_row) {
                    f *= row_factor[r as usize];
                }
                let mut value = Vector::<f32, N>::empty();
                #[unroll]
                for l in 0..N::value() {
                    value[l] = bounce[(r * o_stride) as usize + cv as usize * N::value() + l] * f;
                }
                out[base + (row * dv + cv) as usize] = Vector::<F, N>::cast_from(value);
            }
            i += comptime!(g.units);
        }
        sync_cube();
    } else {
        #[unroll]
        for e in 0..comptime!(registers_per_unit(&g)) {
            let idx = UNIT_POS + e * comptime!(g.units);
            if idx < total {
                let r = idx / dv;
                let cv = idx % dv;
                let row = row0 + r;
                if row < seq {
                    let mut f = factor;
                    if comptime!(per_row) {
                        f *= row_factor[r as usize];
                    }
                    out[base + (row * dv + cv) as usize] = Vector::<F, N>::cast_from(
                        acc.registers[e as usize] * Vector::<f32, N>::new(f),
                    );
                }
            }
        }
    }
}

/// First and one-past-last key block a query block `[q0, q0 + rows)` can see (causal and
/// window; documents are checked per block).
#[cube]
fn key_block_range(
    q0: u32,
    seq: u32,
    window: u32,
    #[comptime] rows: u32,
    #[comptime] cols: u32,
    #[comptime] mask: AttentionMask,
) -> (u32, u32) {
    let mut first = 0u32;
    if comptime!(mask.window) {
        // The block's first query sees keys j > q0 - window.
        if q0 + 1 > window {
            first = (q0 + 1 - window) / cols;
        }
    }
    let mut end = seq;
    if comptime!(mask.causal) {
        end = min(seq, q0 + rows);
    }
    (first, end.div_ceil(cols))
}

/// First and one-past-last query block a key block `[k0, k0 + rows)` is seen by.
#[cube]
fn query_block_range(
    k0: u32,
    seq: u32,
    window: u32,
    #[comptime] rows: u32,
    #[comptime] step: u32,
    #[comptime] mask: AttentionMask,
) -> (u32, u32) {
    let mut first = 0u32;
    if comptime!(mask.causal) {
        first = k0 / step;
    }
    let mut end = seq;
    if comptime!(mask.window) {
        // The block's last key is seen by queries i < k_last + window.
        end = min(seq, k0 + rows - 1 + window);
    }
    (first, end.div_ceil(step))
}

/// Whether the documents of block `block` (of the `[batch, blocks, 2]` range table) meet
/// `[lo, hi]`.
#[cube]
fn documents_meet(ranges: &Array<i32>, at: usize, lo: i32, hi: i32) -> bool {
    ranges[at] <= hi && ranges[at + 1] >= lo
}

/// Whether every query of `[q0, q0 + rows)` sees every key of `[k0, k0 + cols)`, so the
/// block needs no per-element mask (windows and documents are always checked).
#[cube]
fn block_fully_visible(
    q0: u32,
    k0: u32,
    seq: u32,
    #[comptime] rows: u32,
    #[comptime] cols: u32,
    #[comptime] mask: AttentionMask,
) -> bool {
    let mut all = q0 + rows <= seq && k0 + cols <= seq;
    if comptime!(mask.causal) {
        all = all && k0 + cols <= q0 + 1;
    }
    if comptime!(mask.window || mask.documents) {
        all = false;
    }
    all
}

/// The score column of a forward step that unit `lane` of row `r` handles at its `j`th
/// turn. Rows sit `s_stride` floats apart, a multiple of 4 (`cmma` stores need it), so
/// the 32 rows of a plane walking one column in step would hit 8 banks; starting each row
/// at its own column, they hit 32.
#[cube]
fn row_column(r: u32, lane: u32, j: u32, #[comptime] g: FlashGeometry) -> u32 {
    let upr = comptime!(g.units_per_row());
    let cols_per_unit = comptime!(g.step_rows / g.units_per_row());
    lane + ((j + r) % cols_per_unit) * upr
}

/// Pass 1 of a forward step's online softmax over unit `lane`'s columns of row `r`:
/// rewrites each score scaled (the floor where hidden, when `checked`) and returns their
/// max. Two running maxima, so the chain of dependent `max`es is half as long.
#[cube]
#[allow(clippy::too_many_arguments)]
fn scale_row_scores(
    scratch: &mut SharedMemory<f32>,
    r: u32,
    lane: u32,
    qpos: u32,
    k0: u32,
    seq: u32,
    window: u32,
    scale: f32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) -> f32 {
    let cols_per_unit = comptime!(g.step_rows / g.units_per_row());
    let mut max_a = f32::min_value();
    let mut max_b = f32::min_value();
    if comptime!(cols_per_unit % 2 == 0) {
        #[unroll]
        for j in 0..comptime!(cols_per_unit / 2) {
            let c = row_column(r, lane, 2 * j, g);
            let x = scale_score(
                scratch, r, c, qpos, k0, seq, window, scale, doc_ids, doc_base, checked, g, mask,
            );
            max_a = f32::max(max_a, x);
            let c = row_column(r, lane, 2 * j + 1, g);
            let x = scale_score(
                scratch, r, c, qpos, k0, seq, window, scale, doc_ids, doc_base, checked, g, mask,
            );
            max_b = f32::max(max_b, x);
        }
    } else {
        #[unroll]
        for j in 0..cols_per_unit {
            let c = row_column(r, lane, j, g);
            let x = scale_score(
                scratch, r, c, qpos, k0, seq, window, scale, doc_ids, doc_base, checked, g, mask,
            );
            max_a = f32::max(max_a, x);
        }
    }
    f32::max(max_a, max_b)
}

/// Score `(r, c)` scaled, written back and returned; the floor where hidden (`checked`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn scale_score(
    scratch: &mut SharedMemory<f32>,
    r: u32,
    c: u32,
    qpos: u32,
    k0: u32,
    seq: u32,
    window: u32,
    scale: f32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) -> f32 {
    let at = (r * comptime!(g.s_stride()) + c) as usize;
    let mut x = f32::min_value();
    if comptime!(checked) {
        if visible(qpos, k0 + c, seq, window, doc_ids, doc_base, mask) {
            x = scratch[at] * scale;
        }
    } else {
        x = scratch[at] * scale;
    }
    scratch[at] = x;
    x
}

/// Pass 2: `p = exp(x - m)` over unit `lane`'s columns of row `r` (0 where pass 1 left
/// the floor, when `checked`; a NaN score stays NaN), rounded into `p_tile`; returns their
/// sum (two running sums, as the maxima).
#[cube]
fn exponentiate_row<F: Float>(
    scratch: &SharedMemory<f32>,
    p_tile: &mut SharedMemory<F>,
    r: u32,
    lane: u32,
    m: f32,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
) -> f32 {
    let cols_per_unit = comptime!(g.step_rows / g.units_per_row());
    let mut sum_a = 0.0f32;
    let mut sum_b = 0.0f32;
    if comptime!(cols_per_unit % 2 == 0) {
        #[unroll]
        for j in 0..comptime!(cols_per_unit / 2) {
            sum_a += exponentiate_score::<F>(
                scratch,
                p_tile,
                r,
                row_column(r, lane, 2 * j, g),
                m,
                checked,
                g,
            );
            sum_b += exponentiate_score::<F>(
                scratch,
                p_tile,
                r,
                row_column(r, lane, 2 * j + 1, g),
                m,
                checked,
                g,
            );
        }
    } else {
        #[unroll]
        for j in 0..cols_per_unit {
            sum_a += exponentiate_score::<F>(
                scratch,
                p_tile,
                r,
                row_column(r, lane, j, g),
                m,
                checked,
                g,
            );
        }
    }
    sum_a + sum_b
}

/// `p = exp(x - m)` of score `(r, c)` (0 where pass 1 left the floor, when `checked`),
/// rounded into `p_tile` and returned.
#[cube]
fn exponentiate_score<F: Float>(
    scratch: &SharedMemory<f32>,
    p_tile: &mut SharedMemory<F>,
    r: u32,
    c: u32,
    m: f32,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
) -> f32 {
    let x = scratch[(r * comptime!(g.s_stride()) + c) as usize];
    let mut p = f32::exp(x - m);
    // An equality, not `!=`: some compilers make `!=` ordered, false for a NaN score,
    // which must stay NaN.
    if comptime!(checked) {
        if x == f32::min_value() {
            p = 0.0;
        }
    }
    p_tile[(r * comptime!(g.p_stride()) + c) as usize] = F::cast_from(p);
    p
}

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------

#[cube(launch_unchecked, fast_math = flash_math(&g))]
#[allow(clippy::too_many_arguments)]
fn flash_forward_kernel<F: Float, N: Size>(
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
    let units = comptime!(g.units);
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
    let mut k_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bc * g.stride()) as usize), 128usize);
    let mut v_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bc * g.stride()) as usize), 128usize);
    let mut p_tile =
        SharedMemory::<F>::new_aligned(comptime!((br * g.p_stride()) as usize), 128usize);
    let mut scratch =
        SharedMemory::<f32>::new_aligned(comptime!(scratch_len(&g, 1) as usize), 128usize);
    let mut red_max = SharedMemory::<f32>::new(comptime!(units as usize));
    let mut red_sum = SharedMemory::<f32>::new(comptime!(units as usize));
    let mut row_scale = SharedMemory::<f32>::new(comptime!(br as usize));
    let mut flag = SharedMemory::<u32>::new(1usize);

    load_rows::<F, N>(q, q_base, q0, seq, &mut q_tile, br, g);

    // Softmax ownership: `upr` consecutive units per query row, each `bc / upr` columns.
    let upr = comptime!(g.units_per_row());
    let r = UNIT_POS / upr;
    let lane = UNIT_POS % upr;
    let qpos = q0 + r;
    let mut m_used = f32::min_value();
    let mut l = 0.0f32;

    let mut acc = accumulator_new::<N>(g);

    let k_blocks = seq.div_ceil(bc);
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * q_blocks + qb) * 2u32) as usize;
        doc_lo = q_ranges[at];
        doc_hi = q_ranges[at + 1];
    }
    let (kb_first, kb_end) = key_block_range(q0, seq, window, br, bc, mask);
    for kb in kb_first..kb_end {
        let mut live = true;
        if comptime!(mask.documents) {
            live = documents_meet(
                k_ranges,
                ((batch * k_blocks + kb) * 2u32) as usize,
                doc_lo,
                doc_hi,
            );
        }
        if live {
            let k0 = kb * bc;
            // The previous step is done with the k/v tiles, the scratch and the flag.
            sync_cube();
            load_rows::<F, N>(k, kv_base, k0, seq, &mut k_tile, bc, g);
            load_rows::<F, N>(v, kv_base, k0, seq, &mut v_tile, bc, g);
            if UNIT_POS == 0 {
                flag[0] = 0u32;
            }
            sync_cube();
            scores::<F, N>(&q_tile, &k_tile, &mut scratch, 0u32, br, bc, g);
            sync_cube();

            // Online softmax of the block's rows. Each unit rewrites its own scores scaled,
            // or the floor where hidden, so the second pass reads them back (shared memory,
            // not `cols_per_unit` registers a unit). A block every query sees whole skips
            // the mask.
            let interior = block_fully_visible(q0, k0, seq, br, bc, mask);
            let local_max = if interior {
                scale_row_scores(
                    &mut scratch,
                    r,
                    lane,
                    qpos,
                    k0,
                    seq,
                    window,
                    scale,
                    doc_ids,
                    doc_base,
                    false,
                    g,
                    mask,
                )
            } else {
                scale_row_scores(
                    &mut scratch,
                    r,
                    lane,
                    qpos,
                    k0,
                    seq,
                    window,
                    scale,
                    doc_ids,
                    doc_base,
                    true,
                    g,
                    mask,
                )
            };
            red_max[UNIT_POS as usize] = local_max;
            sync_cube();
            let mut row_max = f32::min_value();
            #[unroll]
            for i in 0..upr {
                row_max = f32::max(row_max, red_max[(r * upr + i) as usize]);
            }
            let mut alpha = 1.0f32;
            if row_max > m_used + comptime!(RESCALE_THRESHOLD) {
                alpha = f32::exp(m_used - row_max);
                m_used = row_max;
            }
            let local_sum = if interior {
                exponentiate_row::<F>(&scratch, &mut p_tile, r, lane, m_used, false, g)
            } else {
                exponentiate_row::<F>(&scratch, &mut p_tile, r, lane, m_used, true, g)
            };
            red_sum[UNIT_POS as usize] = local_sum;
            if lane == 0 {
                row_scale[r as usize] = alpha;
                if alpha != 1.0 {
                    flag[0] = 1u32;
                }
            }
            sync_cube();
            let mut row_sum = 0.0f32;
            #[unroll]
            for i in 0..upr {
                row_sum += red_sum[(r * upr + i) as usize];
            }
            l = l * alpha + row_sum;

            // O = diag(alpha)·O + P·V (the scratch is free: P is in p_tile).
            if comptime!(g.tensor_cores) {
                if flag[0] == 1u32 {
                    scale_rows::<N>(&mut acc, &row_scale, &mut scratch, g);
                }
            } else {
                scale_rows::<N>(&mut acc, &row_scale, &mut scratch, g);
            }
            accumulate::<F, N>(&mut acc, &p_tile, &v_tile, false, bc, g);
        }
    }

    // 1/l per row (0 for a row that saw no key), and lse: both NaN where `l` is (a NaN
    // score), which the backward's probabilities `exp(x - lse)` then carry.
    sync_cube();
    if lane == 0 {
        let mut inv = 1.0f32 / l;
        let mut value = m_used + f32::ln(l);
        if l == 0.0 {
            inv = 0.0;
            value = f32::max_value();
        }
        row_scale[r as usize] = inv;
        if qpos < seq {
            lse[row_base + qpos as usize] = value;
        }
    }
    sync_cube();
    store_accumulator::<F, N>(
        &acc,
        out,
        q_base,
        q0,
        seq,
        &row_scale,
        1.0,
        &mut scratch,
        true,
        g,
    );
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------

/// `D_i = Σ_e dO_ie · O_ie` (f32) for every row of `[rows, head_dim]`: `lanes` units a row.
#[cube(launch_unchecked)]
fn attention_row_dot_kernel<F: Float, N: Size>(
    output: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    dot: &mut Array<f32>,
    rows: u32,
    #[comptime] dv: u32,
    #[comptime] lanes: u32,
    #[comptime] units: u32,
    #[define(F)] _dtype: StorageType,
) {
    let mut partial = SharedMemory::<f32>::new(comptime!(units as usize));
    let rows_per_cube = comptime!(units / lanes);
    let r = UNIT_POS / lanes;
    let lane = UNIT_POS % lanes;
    let row = CUBE_POS_X * rows_per_cube + r;
    let mut acc = Vector::<f32, N>::new(0.0);
    if row < rows {
        let base = row as usize * dv as usize;
        let mut c = lane;
        while c < dv {
            acc += Vector::<f32, N>::cast_from(output[base + c as usize])
                * Vector::<f32, N>::cast_from(grad[base + c as usize]);
            c += lanes;
        }
    }
    let mut sum = 0.0f32;
    #[unroll]
    for i in 0..N::value() {
        sum += acc[i];
    }
    partial[UNIT_POS as usize] = sum;
    sync_cube();
    if lane == 0 && row < rows {
        let mut total = 0.0f32;
        for i in 0..lanes {
            total += partial[(r * lanes + i) as usize];
        }
        dot[row as usize] = total;
    }
}

/// Per block of `block` positions of each `[batch, seq]` row of ids: `[min, max]`.
#[cube(launch_unchecked)]
fn document_ranges_kernel(
    ids: &Array<i32>,
    ranges: &mut Array<i32>,
    seq: u32,
    blocks: u32,
    total: u32,
    block: u32,
) {
    let item = ABSOLUTE_POS as u32;
    if item < total {
        let batch = item / blocks;
        let b = item % blocks;
        let start = b * block;
        let end = min(seq, start + block);
        let base = batch as usize * seq as usize;
        let mut lo = ids[base + start as usize];
        let mut hi = lo;
        for p in start + 1..end {
            let id = ids[base + p as usize];
            lo = min(lo, id);
            hi = max(hi, id);
        }
        ranges[item as usize * 2] = lo;
        ranges[item as usize * 2 + 1] = hi;
    }
}

/// `P` and `dS = P ∘ (dP - D)` of a `[queries, keys]` step from the scores `S` (at 0 of
/// `scratch`) and `dP` (at `dp_offset`), rounded to the input dtype: `dS` into `ds_tile`,
/// `P` into `p_tile` when `with_p`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn probabilities_and_ds<F: Float>(
    scratch: &SharedMemory<f32>,
    lse_rows: &SharedMemory<f32>,
    d_rows: &SharedMemory<f32>,
    p_tile: &mut SharedMemory<F>,
    ds_tile: &mut SharedMemory<F>,
    q0: u32,
    k0: u32,
    seq: u32,
    window: u32,
    scale: f32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] dp_offset: u32,
    #[comptime] with_p: bool,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) {
    let cols = comptime!(g.s_cols);
    let total = comptime!(g.s_rows * g.s_cols);
    if comptime!(g.units.is_multiple_of(cols) && total.is_multiple_of(g.units)) {
        // Each unit keeps one column and steps down the rows: the loop unrolls, and a
        // block every query sees whole skips the mask.
        if block_fully_visible(q0, k0, seq, g.s_rows, cols, mask) {
            probabilities_and_ds_by_column::<F>(
                scratch, lse_rows, d_rows, p_tile, ds_tile, q0, k0, seq, window, scale, doc_ids,
                doc_base, dp_offset, with_p, false, g, mask,
            );
        } else {
            probabilities_and_ds_by_column::<F>(
                scratch, lse_rows, d_rows, p_tile, ds_tile, q0, k0, seq, window, scale, doc_ids,
                doc_base, dp_offset, with_p, true, g, mask,
            );
        }
    } else {
        let mut i = UNIT_POS;
        while i < total {
            probability_and_ds_at::<F>(
                scratch,
                lse_rows,
                d_rows,
                p_tile,
                ds_tile,
                i / cols,
                i % cols,
                q0,
                k0,
                seq,
                window,
                scale,
                doc_ids,
                doc_base,
                dp_offset,
                with_p,
                true,
                g,
                mask,
            );
            i += comptime!(g.units);
        }
    }
}

/// [`probabilities_and_ds`] with each unit on one column, `units / s_cols` rows apart;
/// the mask is applied only when `checked`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn probabilities_and_ds_by_column<F: Float>(
    scratch: &SharedMemory<f32>,
    lse_rows: &SharedMemory<f32>,
    d_rows: &SharedMemory<f32>,
    p_tile: &mut SharedMemory<F>,
    ds_tile: &mut SharedMemory<F>,
    q0: u32,
    k0: u32,
    seq: u32,
    window: u32,
    scale: f32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] dp_offset: u32,
    #[comptime] with_p: bool,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) {
    let cols = comptime!(g.s_cols);
    let rows_apart = comptime!(g.units / g.s_cols);
    let c = UNIT_POS % cols;
    let r0 = UNIT_POS / cols;
    #[unroll]
    for e in 0..comptime!(g.s_rows * g.s_cols / g.units) {
        probability_and_ds_at::<F>(
            scratch,
            lse_rows,
            d_rows,
            p_tile,
            ds_tile,
            r0 + e * rows_apart,
            c,
            q0,
            k0,
            seq,
            window,
            scale,
            doc_ids,
            doc_base,
            dp_offset,
            with_p,
            checked,
            g,
            mask,
        );
    }
}

/// `P` and `dS` of score `(r, c)` of a step (see [`probabilities_and_ds`]); the mask is
/// applied only when `checked`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn probability_and_ds_at<F: Float>(
    scratch: &SharedMemory<f32>,
    lse_rows: &SharedMemory<f32>,
    d_rows: &SharedMemory<f32>,
    p_tile: &mut SharedMemory<F>,
    ds_tile: &mut SharedMemory<F>,
    r: u32,
    c: u32,
    q0: u32,
    k0: u32,
    seq: u32,
    window: u32,
    scale: f32,
    doc_ids: &Array<i32>,
    doc_base: usize,
    #[comptime] dp_offset: u32,
    #[comptime] with_p: bool,
    #[comptime] checked: bool,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
) {
    let lse = lse_rows[r as usize];
    let at = (r * comptime!(g.s_stride()) + c) as usize;
    // A row that saw no key has `lse` = NO_KEY_LSE: its exponentials are 0 as they are.
    let mut p = f32::exp(scratch[at] * scale - lse);
    if comptime!(checked) {
        if !visible(q0 + r, k0 + c, seq, window, doc_ids, doc_base, mask) {
            p = 0.0;
        }
    }
    let ds = p * (scratch[at + dp_offset as usize] - d_rows[r as usize]);
    let pt = (r * comptime!(g.p_stride()) + c) as usize;
    if comptime!(with_p) {
        p_tile[pt] = F::cast_from(p);
    }
    ds_tile[pt] = F::cast_from(ds);
}

#[cube(launch_unchecked, fast_math = flash_math(&g))]
#[allow(clippy::too_many_arguments)]
fn flash_backward_kv_kernel<F: Float, N: Size>(
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
    seq: u32,
    q_heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    #[comptime] g: FlashGeometry,
    #[comptime] mask: AttentionMask,
    #[define(F)] _dtype: StorageType,
) {
    let bk = comptime!(g.own_rows);
    let bq = comptime!(g.step_rows);
    let dv = comptime!(g.dv());
    // Heaviest (first, under a causal mask) key blocks first (see `flash_cube_count`).
    let kb = CUBE_POS_Y;
    let kv_head = CUBE_POS_X % kv_heads;
    let batch = CUBE_POS_X / kv_heads;
    let group = q_heads / kv_heads;
    let k0 = kb * bk;
    let seq_len = seq as usize;
    let kv_base = (batch * kv_heads + kv_head) as usize * seq_len * dv as usize;
    let doc_base = batch as usize * seq_len;
    let s_len = comptime!(g.s_rows * g.s_stride());

    let mut k_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    let mut v_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    let mut q_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    let mut do_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    let mut p_tile =
        SharedMemory::<F>::new_aligned(comptime!((bq * g.p_stride()) as usize), 128usize);
    let mut ds_tile =
        SharedMemory::<F>::new_aligned(comptime!((bq * g.p_stride()) as usize), 128usize);
    let mut scratch =
        SharedMemory::<f32>::new_aligned(comptime!(scratch_len(&g, 2) as usize), 128usize);
    let mut lse_rows = SharedMemory::<f32>::new(comptime!(bq as usize));
    let mut d_rows = SharedMemory::<f32>::new(comptime!(bq as usize));
    let unit_rows = SharedMemory::<f32>::new(comptime!(bk as usize));

    load_rows::<F, N>(k, kv_base, k0, seq, &mut k_tile, bk, g);
    load_rows::<F, N>(v, kv_base, k0, seq, &mut v_tile, bk, g);

    let mut acc_k = accumulator_new::<N>(g);
    let mut acc_v = accumulator_new::<N>(g);

    let k_blocks = seq.div_ceil(bk);
    let q_blocks = seq.div_ceil(bq);
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * k_blocks + kb) * 2u32) as usize;
        doc_lo = k_ranges[at];
        doc_hi = k_ranges[at + 1];
    }
    let (qb_first, qb_end) = query_block_range(k0, seq, window, bk, bq, mask);
    for h in 0..group {
        let head = kv_head * group + h;
        let q_base = (batch * q_heads + head) as usize * seq_len * dv as usize;
        let row_base = (batch * q_heads + head) as usize * seq_len;
        for qb in qb_first..qb_end {
            let mut live = true;
            if comptime!(mask.documents) {
                live = documents_meet(
                    q_ranges,
                    ((batch * q_blocks + qb) * 2u32) as usize,
                    doc_lo,
                    doc_hi,
                );
            }
            if live {
                let q0 = qb * bq;
                sync_cube();
                load_rows::<F, N>(q, q_base, q0, seq, &mut q_tile, bq, g);
                load_rows::<F, N>(grad, q_base, q0, seq, &mut do_tile, bq, g);
                load_row_values(
                    lse,
                    row_base,
                    q0,
                    seq,
                    &mut lse_rows,
                    f32::max_value(),
                    bq,
                    comptime!(g.units),
                );
                load_row_values(
                    dot,
                    row_base,
                    q0,
                    seq,
                    &mut d_rows,
                    0.0,
                    bq,
                    comptime!(g.units),
                );
                sync_cube();
                // S = Q·Kᵀ and dP = dO·Vᵀ, [queries, keys].
                scores::<F, N>(&q_tile, &k_tile, &mut scratch, 0u32, bq, bk, g);
                scores::<F, N>(&do_tile, &v_tile, &mut scratch, s_len, bq, bk, g);
                sync_cube();
                probabilities_and_ds::<F>(
                    &scratch,
                    &lse_rows,
                    &d_rows,
                    &mut p_tile,
                    &mut ds_tile,
                    q0,
                    k0,
                    seq,
                    window,
                    scale,
                    doc_ids,
                    doc_base,
                    s_len,
                    true,
                    g,
                    mask,
                );
                sync_cube();
                // dV += Pᵀ·dO, dK += dSᵀ·Q (scaled once at the end).
                accumulate::<F, N>(&mut acc_v, &p_tile, &do_tile, true, bq, g);
                accumulate::<F, N>(&mut acc_k, &ds_tile, &q_tile, true, bq, g);
            }
        }
    }
    sync_cube();
    store_accumulator::<F, N>(
        &acc_k,
        grad_k,
        kv_base,
        k0,
        seq,
        &unit_rows,
        scale,
        &mut scratch,
        false,
        g,
    );
    store_accumulator::<F, N>(
        &acc_v,
        grad_v,
        kv_base,
        k0,
        seq,
        &unit_rows,
        1.0,
        &mut scratch,
        false,
        g,
    );
}

#[cube(launch_unchecked, fast_math = flash_math(&g))]
#[allow(clippy::too_many_arguments)]
fn flash_backward_q_kernel<F: Float, N: Size>(
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
    let s_len = comptime!(g.s_rows * g.s_stride());

    let mut q_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    let mut do_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bq * g.stride()) as usize), 128usize);
    let mut k_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    let mut v_tile =
        SharedMemory::<Vector<F, N>>::new_aligned(comptime!((bk * g.stride()) as usize), 128usize);
    let mut ds_tile =
        SharedMemory::<F>::new_aligned(comptime!((bq * g.p_stride()) as usize), 128usize);
    let mut scratch =
        SharedMemory::<f32>::new_aligned(comptime!(scratch_len(&g, 2) as usize), 128usize);
    let mut lse_rows = SharedMemory::<f32>::new(comptime!(bq as usize));
    let mut d_rows = SharedMemory::<f32>::new(comptime!(bq as usize));
    let unit_rows = SharedMemory::<f32>::new(comptime!(bq as usize));
    // Never read: dQ does not need P.
    let mut unused_p = SharedMemory::<F>::new(1usize);

    load_rows::<F, N>(q, q_base, q0, seq, &mut q_tile, bq, g);
    load_rows::<F, N>(grad, q_base, q0, seq, &mut do_tile, bq, g);
    load_row_values(
        lse,
        row_base,
        q0,
        seq,
        &mut lse_rows,
        f32::max_value(),
        bq,
        comptime!(g.units),
    );
    load_row_values(
        dot,
        row_base,
        q0,
        seq,
        &mut d_rows,
        0.0,
        bq,
        comptime!(g.units),
    );

    let mut acc = accumulator_new::<N>(g);

    let k_blocks = seq.div_ceil(bk);
    let mut doc_lo = 0i32;
    let mut doc_hi = 0i32;
    if comptime!(mask.documents) {
        let at = ((batch * q_blocks + qb) * 2u32) as usize;
        doc_lo = q_ranges[at];
        doc_hi = q_ranges[at + 1];
    }
    let (kb_first, kb_end) = key_block_range(q0, seq, window, bq, bk, mask);
    for kb in kb_first..kb_end {
        let mut live = true;
        if comptime!(mask.documents) {
            live = documents_meet(
                k_ranges,
                ((batch * k_blocks + kb) * 2u32) as usize,
                doc_lo,
                doc_hi,
            );
        }
        if live {
            let k0 = kb * bk;
            sync_cube();
            load_rows::<F, N>(k, kv_base, k0, seq, &mut k_tile, bk, g);
            load_rows::<F, N>(v, kv_base, k0, seq, &mut v_tile, bk, g);
            sync_cube();
            scores::<F, N>(&q_tile, &k_tile, &mut scratch, 0u32, bq, bk, g);
            scores::<F, N>(&do_tile, &v_tile, &mut scratch, s_len, bq, bk, g);
            sync_cube();
            probabilities_and_ds::<F>(
                &scratch,
                &lse_rows,
                &d_rows,
                &mut unused_p,
                &mut ds_tile,
                q0,
                k0,
                seq,
                window,
                scale,
                doc_ids,
                doc_base,
                s_len,
                false,
                g,
                mask,
            );
            sync_cube();
            // dQ += dS·K (scaled once at the end).
            accumulate::<F, N>(&mut acc, &ds_tile, &k_tile, false, bk, g);
        }
    }
    sync_cube();
    store_accumulator::<F, N>(
        &acc,
        grad_q,
        q_base,
        q0,
        seq,
        &unit_rows,
        scale,
        &mut scratch,
        false,
        g,
    );
}

// ---------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------

/// How the flash kernels compute their products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashVariant {
    /// Register-resident `mma.sync` m16n8k16 products (PTX layouts: CUDA with f16/bf16
    /// on sm_80 and later; module `attention_mma`).
    Mma,
    /// `cmma` 16×16×16 fragments of the input dtype with f32 accumulators (tensor cores).
    TensorCores,
    /// FMA loops on every unit: any device (lavapipe), any float dtype.
    Fma,
}

/// Units of one `cmma` plane: the tensor-core geometries assume 32-wide planes.
const CMMA_PLANE: u32 = 32;

/// The launch geometry of each kernel, by variant and head dimension.
///
/// | variant | kernel | head_dim | own rows | step rows | units |
/// |---|---|---|---|---|---|
/// | tensor cores | forward | ≤ 64 | 128 queries | 64 keys | 256 (8 planes, 1 strip each) |
/// | tensor cores | forward | > 64 | 64 queries | 64 keys | 128 (4 planes, 1 strip each) |
/// | tensor cores | dK/dV | any | 64 keys | 64 queries | 128 |
/// | tensor cores | dQ | any | 64 queries | 64 keys | 128 |
/// | tensor cores, less shared memory | each | any | halved (the forward also quartered; [`cmma_tilings`]) | halved | halved |
/// | register mma | forward | ≤ 64 | 64 queries | 64 keys | 128 (4 planes, 1 m-tile each) |
/// | register mma | forward | > 64 | 128 queries | 64 keys | 128 (4 planes, 2 m-tiles each) |
/// | register mma | dK/dV | ≤ 64 | 128 keys | 32 queries | 128 (4 planes, 2 m-tiles each) |
/// | register mma | dK/dV | > 64 | 128 keys | 64 queries | 256 (8 planes, 1 m-tile each) |
/// | register mma | dQ | any | 64 queries | 32 keys | 128 (4 planes, 1 m-tile each) |
/// | FMA | all | any | `fma_rows` | `fma_rows` | 64 |
///
/// Register mma ([`MmaTiling`], explicit configuration with this default): each plane
/// owns 16-row m-tiles whose scores and accumulators stay in registers. Every B operand a
/// plane loads from shared memory (`ldmatrix`) feeds one product per m-tile, so two
/// m-tiles halve the shared-memory traffic per product (and, in the dK/dV kernel, the
/// atomic dQ adds per key); the backward kernels hold two accumulators and two score
/// tiles, which with two m-tiles take 255 registers and spill a little at head_dim 64
/// and more at 128, where they keep one. More planes a cube share each streamed tile
/// among more rows; CUDA bounds a
/// kernel's registers by its cube's size only (`__launch_bounds__(units)`), so 8 planes
/// (256 units, up to 255 registers) run as one cube of 8 warps an SM where 4-plane cubes
/// of 181-255 registers run two, and 12 planes hold a kernel to 168 registers (12 warps
/// an SM), which the dK/dV kernel at head_dim 64 spills and measured slower. The
/// measurements behind each default are in `benches/attention.md`. Shared memory
/// ([`shared_bytes`]: the streamed tiles twice) at bf16 and the defaults: forward 45 KiB
/// (head_dim 64) / 102 KiB (128); dK/dV with dQ summed atomically 65 / 173 KiB (dQ
/// deferred at 128: a second `dSᵀ` buffer); dQ 36 / 68 KiB.
///
/// Tensor cores: each plane owns 16-row strips of the cube's rows; 64-key steps keep a
/// step's score strips at four accumulator fragments per plane, and the `O` fragments of
/// head_dim 128 at eight. At head_dim 64 the forward keeps 128 queries, as FlashAttention-2
/// does, so each key/value tile loaded serves twice as many queries, with a plane per
/// strip: the softmax and the fragment loads are chains of dependent instructions, and
/// more planes per cube hide their latency (each holds half the fragments and softmax
/// columns of a 2-strip plane). Shared memory per cube ([`shared_bytes`]) at bf16:
/// forward 91 KiB (head_dim 64) / 95 KiB (128), dK/dV
/// 90 / 123 KiB, dQ 78 / 113 KiB; where a device offers less, each kernel takes the
/// largest of its smaller tilings that fits ([`cmma_tilings`]). The FMA path exists for correctness on devices without
/// cooperative matrices: its blocks are the largest of 16, 8 or 4 rows whose tiles fit the
/// device's shared memory (lavapipe has 32 KiB: 16 rows up to head_dim 64 in f32).
pub fn flash_geometry(
    kernel: FlashKernel,
    variant: FlashVariant,
    head_dim: usize,
    vector: usize,
    fma_rows: u32,
) -> FlashGeometry {
    let tiling = match variant {
        FlashVariant::TensorCores => MmaTiling::cmma_default(head_dim),
        FlashVariant::Mma | FlashVariant::Fma => MmaTiling::for_head_dim(head_dim),
    };
    tiled_geometry(kernel, variant, head_dim, vector, fma_rows, tiling)
}

/// [`flash_geometry`] with the register-mma kernels tiled by `tiling`.
fn tiled_geometry(
    kernel: FlashKernel,
    variant: FlashVariant,
    head_dim: usize,
    vector: usize,
    fma_rows: u32,
    tiling: MmaTiling,
) -> FlashGeometry {
    let (own, step, planes, tensor_cores) = match variant {
        FlashVariant::Mma | FlashVariant::TensorCores => {
            let t = tiling.of(kernel);
            (16 * t.planes * t.plane_tiles, t.step_rows, t.planes, true)
        }
        FlashVariant::Fma => (fma_rows, fma_rows, 2, false),
    };
    let units = planes * CMMA_PLANE;
    let (s_rows, s_cols) = match kernel {
        FlashKernel::BackwardKv => (step, own),
        FlashKernel::Forward | FlashKernel::BackwardQ => (own, step),
    };
    FlashGeometry {
        own_rows: own,
        step_rows: step,
        units,
        planes,
        head_dim: head_dim as u32,
        vector: vector as u32,
        tensor_cores,
        mma: variant == FlashVariant::Mma,
        s_rows,
        s_cols,
        fast_exp: false,
        atomic_dq: false,
        deferred_dq: false,
        warp_grid: false,
    }
}

/// The math modes of a flash kernel: fast `exp`/`ln` where [`FlashGeometry::fast_exp`].
pub fn flash_math(g: &FlashGeometry) -> enumset::EnumSet<FastMath> {
    if g.fast_exp {
        FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
    } else {
        enumset::EnumSet::empty()
    }
}

/// Whether the device runs `cmma` 16×16×16 products of `dtype` into f32 on 32-wide planes.
pub fn tensor_cores_supported<R: Runtime>(client: &ComputeClient<R>, dtype: StorageType) -> bool {
    let props = client.properties();
    let plane_ok =
        props.hardware.plane_size_min == CMMA_PLANE && props.hardware.plane_size_max == CMMA_PLANE;
    let half = matches!(
        dtype.elem_type(),
        ElemType::Float(FloatKind::F16 | FloatKind::BF16)
    );
    let f32_type: StorageType = ElemType::Float(FloatKind::F32).into();
    plane_ok
        && half
        && props.features.matmul.cmma.iter().any(|c| {
            c.a_type == dtype
                && c.b_type == dtype
                && c.cd_type == f32_type
                && (c.m, c.n, c.k) == (16, 16, 16)
        })
}

/// Whether the device runs manual (register-level) m16n8k16 products of `dtype` into f32
/// with PTX's register layouts, which [`FlashVariant::Mma`]'s forward assumes: CUDA only
/// (other runtimes' manual products lay registers out differently).
pub fn register_mma_supported<R: Runtime>(client: &ComputeClient<R>, dtype: StorageType) -> bool {
    let f32_type: StorageType = ElemType::Float(FloatKind::F32).into();
    R::name(client) == "cuda"
        && client.properties().features.matmul.mma.iter().any(|c| {
            c.a_type == dtype
                && c.b_type == dtype
                && c.cd_type == f32_type
                && (c.m, c.n, c.k) == (16, 8, 16)
        })
}

/// Whether the device adds pairs of f32 atomically in global memory (one `red.v2.f32`;
/// CUDA sm_90+), which [`FlashPlan::atomic_dq`] needs.
pub fn atomic_pairs_supported<R: Runtime>(client: &ComputeClient<R>) -> bool {
    let pair = Type::new(StorageType::Atomic(ElemType::Float(FloatKind::F32))).with_vector_size(2);
    client
        .properties()
        .atomic_type_usage(pair)
        .contains(AtomicUsage::Add)
}

/// Largest head dimension the kernels take (a multiple of 16).
pub const MAX_HEAD_DIM: usize = 256;

/// Planes of a register-mma cube unless its [`KernelTiling`] says otherwise.
const MMA_PLANES: u32 = 4;

/// How one register-mma kernel tiles its rows: each of the cube's `planes` planes owns
/// `plane_tiles` m-tiles of 16 rows (queries; keys in dK/dV) and the cube streams
/// `step_rows` rows a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelTiling {
    /// 16-row m-tiles a plane owns: 1 or 2.
    pub plane_tiles: u32,
    /// Rows streamed a step: 16, 32, 48 or 64; the forward also 128.
    pub step_rows: u32,
    /// Planes of a cube: 4; the forward and dK/dV kernels also take 8 or 12. CUDA compiles a kernel
    /// for the cube's size only (`__launch_bounds__(units)`), so more planes a cube is
    /// how a kernel is held to fewer registers a unit: 12 planes leave 168 registers to
    /// each of 384 units, where 4 planes may take 255 and fit two cubes (8 planes) an SM.
    pub planes: u32,
    /// dK/dV only, with dQ summed atomically: the planes share each step as
    /// FlashAttention-2's warps do instead of owning 16 keys each. On 8 planes, 128 keys a
    /// cube and 64-query steps (one m-tile a plane, 8 planes, 64-row steps), scores and
    /// `dP` as 32×32 blocks on a 2 × 4 grid of planes, `P` and `dS` through shared memory,
    /// `dV` and `dK` as 32 keys × half the head on a 4 × 2 grid, `dQ` as 32 queries × a
    /// quarter of the head: each operand loaded from shared memory serves two m-tiles and
    /// four or more C tiles (144 `ldmatrix.x4` a plane a step at head_dim 128 against 176).
    /// Without atomic dQ (a deterministic plan) the kernel keeps its strips.
    pub warp_grid: bool,
}

impl KernelTiling {
    /// `plane_tiles` m-tiles a plane, `step_rows` rows a step, 4 planes.
    pub const fn new(plane_tiles: u32, step_rows: u32) -> Self {
        Self {
            plane_tiles,
            step_rows,
            planes: MMA_PLANES,
            warp_grid: false,
        }
    }

    /// This tiling with `planes` planes a cube.
    pub const fn with_planes(self, planes: u32) -> Self {
        Self { planes, ..self }
    }

    /// The dK/dV kernel's warp grid (see [`Self::warp_grid`]): 8 planes, one m-tile each,
    /// 64-query steps.
    pub const fn warp_grid() -> Self {
        Self {
            plane_tiles: 1,
            step_rows: 64,
            planes: 8,
            warp_grid: true,
        }
    }
}

/// The tiling of the three tensor-core kernels, register mma ([`FlashVariant::Mma`]) or
/// `cmma` ([`FlashVariant::TensorCores`]); the FMA kernels ignore it. For register mma
/// [`MmaTiling::for_head_dim`] is the default and others are for tuning (see
/// [`FlashPlan::with_tiling`]); for `cmma`, [`flash_plan`] takes the largest of
/// [`cmma_tilings`] that fits the device's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaTiling {
    /// The forward: rows are queries, steps keys.
    pub forward: KernelTiling,
    /// dQ: rows are queries, steps keys.
    pub backward_q: KernelTiling,
    /// dK/dV: rows are keys, steps queries.
    pub backward_kv: KernelTiling,
    /// Where dQ is summed atomically in the dK/dV kernel ([`FlashPlan::atomic_dq`]): each
    /// step's `dQ = dS·K` runs after the next step's barrier, reading a second `dSᵀ`
    /// buffer (one cube sync a step fewer, 12 KiB more shared memory at head_dim 64),
    /// rather than after a cube sync of its own in the same step.
    pub deferred_dq: bool,
}

impl MmaTiling {
    /// The default tiling at `head_dim` (see [`flash_geometry`]): the fastest of the
    /// candidates of the `flash_tilings_timed` test (bf16, causal, 4K and 16K tokens) under
    /// the longest-first launch order, or, where they trade places between lengths, the
    /// fastest at 16K (`benches/logs/flash_tilings_bff5ab1_h100.log`, an H100, whose SMs
    /// are the H200's; `benches/attention.md`). Head_dim 64 runs two m-tiles a plane in
    /// every kernel but dQ; at head_dim 128 dK/dV takes the warp grid
    /// ([`KernelTiling::warp_grid`]), which loads 18% fewer operands from shared memory a
    /// step than the 8-plane strips (static SASS); with dQ from its own kernel
    /// (deterministic plans) it keeps the strips, dQ deferred.
    pub fn for_head_dim(head_dim: usize) -> Self {
        if head_dim <= 64 {
            Self {
                forward: KernelTiling::new(2, 64),
                backward_q: KernelTiling::new(1, 32),
                backward_kv: KernelTiling::new(2, 32),
                deferred_dq: false,
            }
        } else if head_dim == 128 {
            Self {
                forward: KernelTiling::new(2, 64),
                backward_q: KernelTiling::new(1, 32),
                backward_kv: KernelTiling::warp_grid(),
                deferred_dq: true,
            }
        } else {
            Self {
                forward: KernelTiling::new(2, 64),
                backward_q: KernelTiling::new(1, 32),
                backward_kv: KernelTiling::new(1, 64).with_planes(8),
                deferred_dq: true,
            }
        }
    }

    /// The `cmma` kernels' default: the first of each kernel's [`cmma_tilings`].
    pub fn cmma_default(head_dim: usize) -> Self {
        let first = |kernel| cmma_tilings(kernel, head_dim)[0];
        Self {
            forward: first(FlashKernel::Forward),
            backward_q: first(FlashKernel::BackwardQ),
            backward_kv: first(FlashKernel::BackwardKv),
            deferred_dq: false,
        }
    }

    /// The tiling of `kernel`.
    pub fn of(&self, kernel: FlashKernel) -> KernelTiling {
        match kernel {
            FlashKernel::Forward => self.forward,
            FlashKernel::BackwardQ => self.backward_q,
            FlashKernel::BackwardKv => self.backward_kv,
        }
    }

    fn of_mut(&mut self, kernel: FlashKernel) -> &mut KernelTiling {
        match kernel {
            FlashKernel::Forward => &mut self.forward,
            FlashKernel::BackwardQ => &mut self.backward_q,
            FlashKernel::BackwardKv => &mut self.backward_kv,
        }
    }
}

/// How the flash kernels run attention of one head dimension and dtype on one device:
/// the variant, the vector width and the FMA block size. From [`flash_plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashPlan {
    /// Tensor cores or FMA.
    pub variant: FlashVariant,
    /// Head dimension.
    pub head_dim: usize,
    /// Elements per vector load (divides `head_dim`, at most 8).
    pub vector: usize,
    /// Rows of the FMA path's blocks.
    pub fma_rows: u32,
    /// See [`FlashGeometry::fast_exp`].
    pub fast_exp: bool,
    /// The tensor-core kernels' tiling (register mma or `cmma`).
    pub tiling: MmaTiling,
    /// The register-mma backward sums dQ inside the dK/dV kernel, as FlashAttention-2
    /// does: each step's `dS·K` is added to an f32 buffer by atomic adds, which saves the
    /// dQ kernel's second pass over the scores (`S = Q·Kᵀ` and `dP = dO·Vᵀ` computed once,
    /// 5 products a step instead of 7). The order of the additions then varies from run
    /// to run, so dQ may differ in its last bits between runs; `false` (see
    /// [`FlashPlan::deterministic`]) runs the dQ kernel instead, whose sums have a fixed
    /// order. Applies where the device adds f32 pairs atomically (CUDA sm_90+) and the
    /// dK/dV step is 16, 32 or 64 rows (see [`Self::sums_dq_atomically`]).
    pub atomic_dq: bool,
    /// The kernels' compiled CUDA source has every `2^x` as the bare hardware
    /// `ex2.approx.ftz.f32` instead of `ex2.approx.f32` with its fix-up for subnormal
    /// results: about a tenth fewer instructions a step in the register-mma kernels. A
    /// probability below `2^-126` of its row's largest becomes 0 instead of subnormal,
    /// invisible to every f32 sum and f16/bf16 product, as under FlashAttention-2's
    /// `--use_fast_math`. Set by [`flash_plan`] for [`FlashVariant::Mma`] on CUDA up to
    /// [`EXP2_FLUSH_TO_ZERO_MAX_HEAD_DIM`]; kernels without `2^x` (the others) launch the
    /// same code either way.
    pub exp2_flush_to_zero: bool,
}

impl FlashPlan {
    /// The rewrite of the kernels' compiled source this plan asks for.
    fn source_patch(&self) -> Option<SourcePatch> {
        self.exp2_flush_to_zero
            .then_some(SourcePatch::Exp2FlushToZero)
    }

    /// The geometry of `kernel`.
    pub fn geometry(&self, kernel: FlashKernel) -> FlashGeometry {
        let g = tiled_geometry(
            kernel,
            self.variant,
            self.head_dim,
            self.vector,
            self.fma_rows,
            self.tiling,
        );
        FlashGeometry {
            fast_exp: self.fast_exp,
            atomic_dq: kernel == FlashKernel::BackwardKv && self.sums_dq_atomically(),
            deferred_dq: kernel == FlashKernel::BackwardKv
                && self.sums_dq_atomically()
                && self.tiling.deferred_dq
                && !self.tiling.backward_kv.warp_grid,
            warp_grid: kernel == FlashKernel::BackwardKv
                && self.sums_dq_atomically()
                && self.tiling.backward_kv.warp_grid,
            ..g
        }
    }

    /// Whether the backward sums dQ by atomic adds in the dK/dV kernel: [`Self::atomic_dq`]
    /// where it applies (a dK/dV step of 16, 32 or 64 rows whose products split evenly
    /// among the cube's planes, see [`FlashGeometry::dq_split`]).
    pub fn sums_dq_atomically(&self) -> bool {
        let step = self.tiling.backward_kv.step_rows;
        let kv = tiled_geometry(
            FlashKernel::BackwardKv,
            self.variant,
            self.head_dim,
            self.vector,
            self.fma_rows,
            self.tiling,
        );
        self.atomic_dq
            && self.variant == FlashVariant::Mma
            && matches!(step, 16 | 32 | 64)
            && kv.dq_split().is_some()
    }

    /// This plan with dQ from its own kernel, in a fixed order of additions: the backward's
    /// gradients are then the same bits on every run (see [`Self::atomic_dq`]).
    pub fn deterministic(self) -> Self {
        Self {
            atomic_dq: false,
            ..self
        }
    }

    /// This plan with its tensor-core kernels tiled by `tiling`, checked as
    /// [`flash_plan`] checks its own: for register mma, m-tiles 1 or 2, steps of 16 to 64
    /// rows in 16s, 4 planes a cube (8 or 12 also for the forward and dK/dV); for `cmma`,
    /// one of [`cmma_tilings`]; for both, every kernel's units and shared memory on this
    /// device. The FMA kernels take no tiling.
    pub fn with_tiling<R: Runtime>(
        self,
        client: &ComputeClient<R>,
        dtype: StorageType,
        tiling: MmaTiling,
    ) -> Result<FlashPlan, KernelError> {
        let op = "flash_attention";
        for kernel in FLASH_KERNELS {
            let t = tiling.of(kernel);
            let taken = match self.variant {
                FlashVariant::Mma => {
                    let planes_ok = match kernel {
                        FlashKernel::Forward | FlashKernel::BackwardKv => {
                            matches!(t.planes, 4 | 8 | 12)
                        }
                        FlashKernel::BackwardQ => t.planes == MMA_PLANES,
                    };
                    // The forward's 128-key steps keep one m-tile's scores in 64
                    // registers a lane; the backward's two score tiles would take twice that.
                    let steps_ok = match kernel {
                        FlashKernel::Forward => {
                            (16..=64).contains(&t.step_rows)
                                || t.step_rows == 128 && t.plane_tiles == 1
                        }
                        FlashKernel::BackwardQ | FlashKernel::BackwardKv => {
                            (16..=64).contains(&t.step_rows)
                        }
                    };
                    // FlashAttention-2's grid: dK/dV's 8 planes of 32×32 score blocks,
                    // a quarter of the head a plane's dQ (16 columns or more).
                    let grid_ok = !t.warp_grid
                        || kernel == FlashKernel::BackwardKv
                            && t == KernelTiling::warp_grid()
                            && matches!(self.head_dim, 64 | 128);
                    (1..=2).contains(&t.plane_tiles)
                        && t.step_rows.is_multiple_of(16)
                        && steps_ok
                        && planes_ok
                        && grid_ok
                }
                FlashVariant::TensorCores => cmma_tilings(kernel, self.head_dim).contains(&t),
                FlashVariant::Fma => false,
            };
            if !taken {
                return Err(KernelError::Unsupported {
                    op,
                    reason: format!(
                        "{:?} {kernel:?} tiling {t:?} (register mma: 1 or 2 m-tiles a plane, steps of 16 to 64 rows in 16s, the forward also 128 with one m-tile, 4 planes, the forward and dK/dV also 8 or 12; the warp grid: dK/dV only, KernelTiling::warp_grid(), head_dim 64 or 128; cmma: one of cmma_tilings; FMA: none)",
                        self.variant
                    ),
                });
            }
            let units = t.planes * CMMA_PLANE;
            let max_units = client.properties().hardware.max_units_per_cube;
            if units > max_units {
                return Err(KernelError::Unsupported {
                    op,
                    reason: format!(
                        "{kernel:?} tiling {t:?} needs {units} units a cube; the device has {max_units}"
                    ),
                });
            }
        }
        let plan = FlashPlan { tiling, ..self };
        match too_big(
            &plan,
            dtype,
            client.properties().hardware.max_shared_memory_size,
        ) {
            None => Ok(plan),
            Some((kernel, bytes)) => Err(KernelError::Unsupported {
                op,
                reason: format!(
                    "{kernel:?} needs {bytes} bytes of shared memory with {tiling:?}; the device has {}",
                    client.properties().hardware.max_shared_memory_size
                ),
            }),
        }
    }
}

/// The three flash kernels.
const FLASH_KERNELS: [FlashKernel; 3] = [
    FlashKernel::Forward,
    FlashKernel::BackwardKv,
    FlashKernel::BackwardQ,
];

/// The first kernel of `plan` whose shared memory exceeds `max` bytes, with its bytes.
fn too_big(plan: &FlashPlan, dtype: StorageType, max: usize) -> Option<(FlashKernel, usize)> {
    FLASH_KERNELS
        .iter()
        .map(|k| (*k, shared_bytes(&plan.geometry(*k), *k, dtype.size())))
        .find(|(_, bytes)| *bytes > max)
}

/// Plans `variant` for attention of `head_dim` in `dtype` on this device, checking the
/// dtype, the head dimension (a multiple of 16, at most [`MAX_HEAD_DIM`]), `cmma` support
/// for tensor cores, the units per cube, and every kernel's shared memory.
pub fn flash_plan<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    dtype: StorageType,
    variant: FlashVariant,
) -> Result<FlashPlan, KernelError> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    flash_plan_within(client, head_dim, dtype, variant, max_shared)
}

/// [`flash_plan`] with every kernel's shared memory held to `max_shared` bytes (at most
/// the device's): the plan another device with that limit would get (Vulkan on NVIDIA
/// offers 48 KiB a cube), so that its tilings can be tested where they are not the
/// default.
pub fn flash_plan_within<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    dtype: StorageType,
    variant: FlashVariant,
    max_shared: usize,
) -> Result<FlashPlan, KernelError> {
    let op = "flash_attention";
    let max_shared = max_shared.min(client.properties().hardware.max_shared_memory_size);
    let unsupported = |reason: String| Err(KernelError::Unsupported { op, reason });
    check_float_dtype(op, dtype)?;
    if head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > MAX_HEAD_DIM {
        return unsupported(format!(
            "head_dim {head_dim} (the flash kernels take multiples of 16 up to {MAX_HEAD_DIM})"
        ));
    }
    if variant != FlashVariant::Fma && !tensor_cores_supported(client, dtype) {
        return unsupported(format!(
            "no 16x16x16 cooperative-matrix product of {dtype:?} into f32 on 32-wide planes on this device"
        ));
    }
    if variant == FlashVariant::Mma && !register_mma_supported(client, dtype) {
        return unsupported(format!(
            "no register-level m16n8k16 product of {dtype:?} into f32 with PTX layouts on this device (CUDA sm_80+)"
        ));
    }
    let props = client.properties();
    let vector = client
        .io_optimized_vector_sizes(dtype.size())
        .filter(|v| *v <= 8 && head_dim.is_multiple_of(*v))
        .max()
        .unwrap_or(1);
    if variant == FlashVariant::Mma && vector * dtype.size() != 16 {
        return unsupported(format!(
            "vectors of {vector} {dtype:?} (the register-level kernels stage and `ldmatrix` 16-byte rows)"
        ));
    }
    let candidates: &[u32] = match variant {
        FlashVariant::TensorCores | FlashVariant::Mma => &[16],
        FlashVariant::Fma => &[16, 8, 4],
    };
    let tiling = match variant {
        FlashVariant::TensorCores => {
            cmma_tiling_within(head_dim, vector, dtype.size(), max_shared).map_err(
                |(kernel, bytes)| KernelError::Unsupported {
                    op,
                    reason: format!(
                        "{kernel:?} needs {bytes} bytes of shared memory at head_dim {head_dim} with its smallest cmma tiling; the limit is {max_shared}"
                    ),
                },
            )?
        }
        FlashVariant::Mma | FlashVariant::Fma => MmaTiling::for_head_dim(head_dim),
    };
    let mut last = None;
    for &fma_rows in candidates {
        let plan = FlashPlan {
            variant,
            head_dim,
            vector,
            fma_rows,
            fast_exp: hardware_math_supported(client),
            tiling,
            atomic_dq: variant == FlashVariant::Mma && atomic_pairs_supported(client),
            exp2_flush_to_zero: variant == FlashVariant::Mma
                && R::name(client) == "cuda"
                && head_dim <= EXP2_FLUSH_TO_ZERO_MAX_HEAD_DIM,
        };
        let units = plan.geometry(FlashKernel::Forward).units;
        if units > props.hardware.max_units_per_cube {
            return unsupported(format!(
                "{units} units per cube; the device allows {}",
                props.hardware.max_units_per_cube
            ));
        }
        match too_big(&plan, dtype, max_shared) {
            None => return Ok(plan),
            Some(too_big) => last = Some(too_big),
        }
    }
    let (kernel, bytes) = last.expect("at least one candidate");
    unsupported(format!(
        "{kernel:?} needs {bytes} bytes of shared memory at head_dim {head_dim}; the limit is {max_shared}"
    ))
}

/// The `cmma` kernels' tilings of `kernel` at `head_dim`, largest first: one 16-row strip
/// a plane, and as many rows kept as streamed (the forward at head_dim ≤ 64 keeps twice
/// as many queries, as FlashAttention-2 does, so each key/value tile serves more of them).
/// The first is the default where it fits; the smaller ones are for devices with less
/// shared memory a cube (Vulkan on NVIDIA: 48 KiB), the score and accumulator tiles of
/// a cube shrinking with its rows. The backward stops at two planes: with one (16 rows)
/// it measured slower than the FMA kernels (through Vulkan on the H200 at head_dim 128,
/// `benches/attention.md`), so a device that cannot fit two runs those instead.
pub fn cmma_tilings(kernel: FlashKernel, head_dim: usize) -> &'static [KernelTiling] {
    const fn t(planes: u32, step_rows: u32) -> KernelTiling {
        KernelTiling::new(1, step_rows).with_planes(planes)
    }
    const WIDE_FORWARD: &[KernelTiling] = &[t(8, 64), t(4, 32), t(2, 16)];
    const FORWARD: &[KernelTiling] = &[t(4, 64), t(2, 32), t(1, 16)];
    const BACKWARD: &[KernelTiling] = &[t(4, 64), t(2, 32)];
    match kernel {
        FlashKernel::Forward if head_dim <= 64 => WIDE_FORWARD,
        FlashKernel::Forward => FORWARD,
        FlashKernel::BackwardKv | FlashKernel::BackwardQ => BACKWARD,
    }
}

/// The largest [`cmma_tilings`] of each kernel whose shared memory fits `max_shared`
/// bytes, or the kernel whose smallest does not, with its bytes.
fn cmma_tiling_within(
    head_dim: usize,
    vector: usize,
    elem: usize,
    max_shared: usize,
) -> Result<MmaTiling, (FlashKernel, usize)> {
    let mut tiling = MmaTiling::cmma_default(head_dim);
    for kernel in FLASH_KERNELS {
        let bytes_with = |t: KernelTiling| {
            let mut candidate = tiling;
            *candidate.of_mut(kernel) = t;
            let g = tiled_geometry(
                kernel,
                FlashVariant::TensorCores,
                head_dim,
                vector,
                16,
                candidate,
            );
            shared_bytes(&g, kernel, elem)
        };
        let tilings = cmma_tilings(kernel, head_dim);
        let chosen = tilings
            .iter()
            .copied()
            .find(|t| bytes_with(*t) <= max_shared)
            .ok_or_else(|| (kernel, bytes_with(tilings[tilings.len() - 1])))?;
        *tiling.of_mut(kernel) = chosen;
    }
    Ok(tiling)
}

/// One attention problem: contiguous `q: [batch, q_heads, seq, head_dim]`,
/// `k, v: [batch, kv_heads, seq, head_dim]` (`q_heads` a multiple of `kv_heads`).
#[derive(Clone, Copy, Debug)]
pub struct FlashProblem {
    /// Batch.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Sequence length (queries and keys).
    pub seq: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Factor of the scores.
    pub scale: f64,
    /// Which keys a query sees.
    pub mask: AttentionMask,
    /// The sliding window's size when `mask.window` (at least 1).
    pub window: usize,
}

impl FlashProblem {
    fn check(&self, op: &'static str) -> Result<(), KernelError> {
        let bad = |reason: String| Err(KernelError::Unsupported { op, reason });
        if self.batch == 0 || self.q_heads == 0 || self.kv_heads == 0 || self.seq == 0 {
            return bad(format!("empty problem {self:?}"));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "q_heads {} is not a multiple of kv_heads {}",
                self.q_heads, self.kv_heads
            ));
        }
        if self.mask.window && self.window == 0 {
            return bad("a sliding window of 0 keys hides every key".into());
        }
        // The kernels take row maxima of the unscaled scores.
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            return bad(format!(
                "scale {} (the flash kernels take a positive, finite scale)",
                self.scale
            ));
        }
        let rows = self.batch * self.q_heads * self.seq * self.head_dim;
        if rows > u32::MAX as usize || self.seq + self.window > u32::MAX as usize {
            return bad(format!("{self:?} exceeds 32-bit positions"));
        }
        Ok(())
    }
}

/// The buffers of the forward (contiguous, dtype `dtype` unless said otherwise).
#[derive(Clone, Copy, Debug)]
pub struct FlashForwardArgs<'a> {
    /// `[batch, q_heads, seq, head_dim]`.
    pub q: &'a Handle,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub k: &'a Handle,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub v: &'a Handle,
    /// `[batch, seq]` i32 document ids, when `mask.documents`.
    pub document_ids: Option<&'a Handle>,
    /// Output `[batch, q_heads, seq, head_dim]`.
    pub output: &'a Handle,
    /// Output `[batch, q_heads, seq]` f32: `lse_i = log Σ_j exp(s_ij)` ([`NO_KEY_LSE`] for a
    /// query that sees no key).
    pub lse: &'a Handle,
}

/// The buffers of the backward.
#[derive(Clone, Copy, Debug)]
pub struct FlashBackwardArgs<'a> {
    /// Gradient of the output, `[batch, q_heads, seq, head_dim]`.
    pub grad_output: &'a Handle,
    /// `[batch, q_heads, seq, head_dim]`.
    pub q: &'a Handle,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub k: &'a Handle,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub v: &'a Handle,
    /// The forward's output, `[batch, q_heads, seq, head_dim]`.
    pub output: &'a Handle,
    /// The forward's `lse`, `[batch, q_heads, seq]` f32.
    pub lse: &'a Handle,
    /// `[batch, seq]` i32 document ids, when `mask.documents`.
    pub document_ids: Option<&'a Handle>,
    /// Output `[batch, q_heads, seq, head_dim]`.
    pub grad_q: &'a Handle,
    /// Output `[batch, kv_heads, seq, head_dim]` (summed over each group's query heads).
    pub grad_k: &'a Handle,
    /// Output `[batch, kv_heads, seq, head_dim]`.
    pub grad_v: &'a Handle,
}

fn arr<R: Runtime>(handle: &Handle, len: usize) -> ArrayArg<R> {
    // Safety: the callers pass buffers of at least `len` items (the Burn glue allocates
    // outputs of exactly these shapes and checks the inputs' shapes before launch).
    unsafe { ArrayArg::from_raw_parts(handle.clone(), len.max(1)) }
}

/// Launches a flash kernel (`path::to::kernel_module => KernelType`, the items its
/// `#[cube(launch_unchecked)]` generates) over `count` cubes of `g.units` units: through
/// the generated `launch_unchecked`, or, where `patch` is `Some`, through a
/// [`PatchedTask`] with the same arguments gathered by [`KernelArgs`] (`address`: the
/// kernel's declared address type). The arguments come in declaration order: arrays, each
/// with the kind of its items (`io`: the input dtype in vectors of `n`; `f32s`; `i32s`;
/// `pairs`: f32 pairs; `atomic_pairs`), then scalars, then comptime values. Unsafe as the
/// generated launch.
macro_rules! launch_flash {
    (@item io) => { Vector<generated::F, generated::N> };
    (@item f32s) => { f32 };
    (@item i32s) => { i32 };
    (@item pairs) => { Vector<f32, Const<2>> };
    (@item atomic_pairs) => { Atomic<Vector<f32, Const<2>>> };
    ($client:ident, $count:expr, $g:expr, $address:expr, $n:expr, $dtype:expr, $patch:expr,
     $($m:ident)::+ => $kernel:ident,
     [$($kind:ident($handle:expr, $len:expr)),* $(,)?],
     [$($scalar:expr),* $(,)?],
     [$($comptime:expr),* $(,)?]) => {{
        use $($m)::+ as generated;
        let dim = CubeDim::new_1d($g.units);
        match $patch {
            None => generated::launch_unchecked::<R>(
                $client,
                $count,
                dim,
                $n,
                $(arr($handle, $len),)*
                $($scalar,)*
                $($comptime,)*
                $dtype,
            ),
            Some(patch) => {
                let address: AddressType = $address;
                let mut gathered = KernelArgs::new($client, address);
                gathered.scope().register_type::<DynamicScalar<generated::_F>>($dtype);
                gathered.scope().register_size::<DynamicSize<generated::_N>>($n);
                let settings = KernelSettings::default().cube_dim(dim).address_type(address);
                let kernel = generated::$kernel::<R>::new(
                    settings,
                    $client.clone(),
                    $(gathered.array::<R, launch_flash!(@item $kind)>(arr($handle, $len)),)*
                    $(gathered.scalar($scalar),)*
                    $n,
                    $($comptime,)*
                    $dtype,
                );
                let task = PatchedTask::<R::Compiler, _>::new(kernel, address, patch);
                gathered.launch_unchecked($client, $count, Box::new(task));
            }
        }
    }};
}

/// The grid of a one-dimensional kernel over `len` items, one a unit, 256 units a cube.
fn elementwise_grid<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    len: usize,
) -> Result<(CubeCount, CubeDim), KernelError> {
    const UNITS: u32 = 256;
    let count = cube_count(client, op, len.div_ceil(UNITS as usize), 1, 1)?;
    Ok((count, CubeDim::new_1d(UNITS)))
}

fn cube_count<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: usize,
    y: usize,
    z: usize,
) -> Result<CubeCount, KernelError> {
    let (mx, my, mz) = client.properties().hardware.max_cube_count;
    if x > mx as usize || y > my as usize || z > mz as usize {
        return Err(KernelError::Unsupported {
            op,
            reason: format!("grid {x}×{y}×{z} exceeds the device's {mx}×{my}×{mz}"),
        });
    }
    Ok(CubeCount::Static(x as u32, y as u32, z as u32))
}

/// The flash kernels' grid: `CUBE_POS_X` walks the `heads · batch` (head, batch) pairs,
/// `CUBE_POS_Y` the `blocks` row blocks, which each kernel numbers heaviest first under a
/// causal mask. Cubes start in the order of their linear index (x fastest), so every head's
/// heaviest block starts before any head's next: longest first over the whole launch, where
/// head-major order would start the last head's heaviest blocks near the end and leave the
/// other SMs idle while they finish.
fn flash_cube_count<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    blocks: usize,
    heads: usize,
    batch: usize,
) -> Result<CubeCount, KernelError> {
    cube_count(client, op, heads * batch, blocks, 1)
}

/// `[batch, ceil(seq / block), 2]` i32: each block's `[min, max]` document id.
pub fn document_ranges<R: Runtime>(
    client: &ComputeClient<R>,
    ids: &Handle,
    batch: usize,
    seq: usize,
    block: usize,
) -> Handle {
    let blocks = seq.div_ceil(block);
    let total = batch * blocks;
    let ranges = client.empty(total * 2 * 4);
    let units = 128u32;
    // Safety: `ids` holds `batch · seq` i32 (checked by the callers); `ranges` was just
    // allocated for `total · 2`; the kernel reads and writes only inside both.
    unsafe {
        document_ranges_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static((total as u32).div_ceil(units), 1, 1),
            CubeDim::new_1d(units),
            arr(ids, batch * seq),
            arr(&ranges, total * 2),
            seq as u32,
            blocks as u32,
            total as u32,
            block as u32,
        );
    }
    ranges
}

/// Document range tables of blocks of `a` and `b` positions, or one-item placeholders.
fn ranges_for<R: Runtime>(
    client: &ComputeClient<R>,
    p: &FlashProblem,
    ids: Option<&Handle>,
    a: u32,
    b: u32,
) -> Result<(Handle, Handle, Handle), KernelError> {
    match (p.mask.documents, ids) {
        (true, Some(ids)) => Ok((
            ids.clone(),
            document_ranges(client, ids, p.batch, p.seq, a as usize),
            document_ranges(client, ids, p.batch, p.seq, b as usize),
        )),
        (true, None) => Err(KernelError::Unsupported {
            op: "flash_attention",
            reason: "the document mask needs document ids".into(),
        }),
        (false, _) => {
            let empty = || client.empty(4);
            Ok((empty(), empty(), empty()))
        }
    }
}

/// Whether `plan` was made for `p`'s head dimension (and, for the register-mma and
/// tensor-core variants, for a 2-byte `dtype`): a plan of another problem would index
/// its buffers wrongly.
fn plan_matches(
    op: &'static str,
    plan: &FlashPlan,
    p: &FlashProblem,
    dtype: StorageType,
) -> Result<(), KernelError> {
    if plan.head_dim != p.head_dim || !p.head_dim.is_multiple_of(plan.vector) {
        return Err(KernelError::Unsupported {
            op,
            reason: format!(
                "a plan for head_dim {} used at head_dim {}",
                plan.head_dim, p.head_dim
            ),
        });
    }
    if plan.variant != FlashVariant::Fma && dtype.size() != 2 {
        return Err(KernelError::Unsupported {
            op,
            reason: format!("a {:?} plan used for {dtype:?}", plan.variant),
        });
    }
    Ok(())
}

/// Flash attention forward: writes `output` and `lse` (see the module docs).
pub fn flash_attention<R: Runtime>(
    client: &ComputeClient<R>,
    args: FlashForwardArgs<'_>,
    p: FlashProblem,
    variant: FlashVariant,
    dtype: StorageType,
) -> Result<(), KernelError> {
    p.check("flash_attention")?;
    let plan = flash_plan(client, p.head_dim, dtype, variant)?;
    flash_attention_planned(client, args, p, &plan, dtype)
}

/// [`flash_attention`] with an explicit plan (of this device, `p.head_dim` and `dtype`:
/// [`flash_plan`], then [`FlashPlan::with_tiling`] to tune).
pub fn flash_attention_planned<R: Runtime>(
    client: &ComputeClient<R>,
    args: FlashForwardArgs<'_>,
    p: FlashProblem,
    plan: &FlashPlan,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let op = "flash_attention";
    p.check(op)?;
    plan_matches(op, plan, &p, dtype)?;
    let n = plan.vector;
    let g = plan.geometry(FlashKernel::Forward);
    let (ids, q_ranges, k_ranges) =
        ranges_for(client, &p, args.document_ids, g.own_rows, g.step_rows)?;
    let q_len = p.batch * p.q_heads * p.seq * p.head_dim / n;
    let kv_len = p.batch * p.kv_heads * p.seq * p.head_dim / n;
    let q_blocks = p.seq.div_ceil(g.own_rows as usize);
    let count = flash_cube_count(client, op, q_blocks, p.q_heads, p.batch)?;
    let table = |b: u32| p.batch * p.seq.div_ceil(b as usize) * 2;
    let patch = plan.source_patch();
    // The two variants take the same arguments.
    macro_rules! launch {
        ($address:expr, $($kernel:tt)+) => {
            launch_flash!(
                client, count, g, $address, n, dtype, patch,
                $($kernel)+,
                [
                    io(args.q, q_len),
                    io(args.k, kv_len),
                    io(args.v, kv_len),
                    i32s(&ids, if p.mask.documents { p.batch * p.seq } else { 1 }),
                    i32s(&q_ranges, if p.mask.documents { table(g.own_rows) } else { 1 }),
                    i32s(&k_ranges, if p.mask.documents { table(g.step_rows) } else { 1 }),
                    io(args.output, q_len),
                    f32s(args.lse, p.batch * p.q_heads * p.seq),
                ],
                [
                    p.seq as u32,
                    p.q_heads as u32,
                    p.kv_heads as u32,
                    p.window as u32,
                    p.scale as f32,
                ],
                [g, p.mask]
            )
        };
    }
    // Safety: every buffer holds the items passed with it (see `arr`); the kernel indexes
    // inside `[batch, heads, seq, head_dim]` (rows past `seq` are never read or written).
    unsafe {
        if g.mma {
            launch!(AddressType::U64, mma::flash_forward_mma_kernel => FlashForwardMmaKernel);
        } else {
            launch!(AddressType::U32, flash_forward_kernel => FlashForwardKernel);
        }
    }
    counters::record(Kernel::flash_attention_forward);
    Ok(())
}

/// Flash attention backward: writes `grad_q`, `grad_k`, `grad_v` (see the module docs).
pub fn flash_attention_backward<R: Runtime>(
    client: &ComputeClient<R>,
    args: FlashBackwardArgs<'_>,
    p: FlashProblem,
    variant: FlashVariant,
    dtype: StorageType,
) -> Result<(), KernelError> {
    p.check("flash_attention_backward")?;
    let plan = flash_plan(client, p.head_dim, dtype, variant)?;
    flash_attention_backward_planned(client, args, p, &plan, dtype)
}

/// [`flash_attention_backward`] with an explicit plan (see [`flash_attention_planned`]).
pub fn flash_attention_backward_planned<R: Runtime>(
    client: &ComputeClient<R>,
    args: FlashBackwardArgs<'_>,
    p: FlashProblem,
    plan: &FlashPlan,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let op = "flash_attention_backward";
    p.check(op)?;
    plan_matches(op, plan, &p, dtype)?;
    let n = plan.vector;
    let rows = p.batch * p.q_heads * p.seq;
    let q_len = rows * p.head_dim / n;
    let kv_len = p.batch * p.kv_heads * p.seq * p.head_dim / n;

    // D = rowsum(dO ∘ O).
    let dot = client.empty(rows * 4);
    let dv = (p.head_dim / n) as u32;
    let lanes = dv.next_power_of_two().min(32);
    let units = 256u32.max(lanes);
    // Safety: `output` and `grad_output` hold `rows · head_dim` elements, `dot` `rows`.
    unsafe {
        attention_row_dot_kernel::launch_unchecked::<R>(
            client,
            cube_count(client, op, rows.div_ceil((units / lanes) as usize), 1, 1)?,
            CubeDim::new_1d(units),
            n,
            arr(args.output, q_len),
            arr(args.grad_output, q_len),
            arr(&dot, rows),
            rows as u32,
            dv,
            lanes,
            units,
            dtype,
        );
    }

    let gkv = plan.geometry(FlashKernel::BackwardKv);
    let gq = plan.geometry(FlashKernel::BackwardQ);
    // Each kernel's document tables: of blocks of its query rows and of its key rows.
    let (ids, kv_q_ranges, kv_k_ranges) =
        ranges_for(client, &p, args.document_ids, gkv.step_rows, gkv.own_rows)?;
    let table = |b: u32| {
        if p.mask.documents {
            p.batch * p.seq.div_ceil(b as usize) * 2
        } else {
            1
        }
    };
    let ids_len = if p.mask.documents { p.batch * p.seq } else { 1 };

    let key_blocks = p.seq.div_ceil(gkv.own_rows as usize);
    let parts = if gkv.mma {
        mma::flash_backward_kv_parts(
            key_blocks * p.kv_heads * p.batch,
            gkv.planes as usize,
            p.q_heads / p.kv_heads,
        )
    } else {
        1
    };
    let kv_count = flash_cube_count(client, op, key_blocks, p.kv_heads * parts, p.batch)?;
    let kv_elems = p.batch * p.kv_heads * p.seq * p.head_dim;
    let (partial_k, partial_v) = if parts > 1 {
        (
            client.empty(parts * kv_elems * 4),
            client.empty(parts * kv_elems * 4),
        )
    } else {
        (client.empty(8), client.empty(8))
    };
    let partial_len = if parts > 1 { parts * kv_elems / 2 } else { 1 };
    // dQ summed by the dK/dV kernel: f32, zeroed first, then cast to the output.
    let (dq_sum, dq_pairs) = if gkv.atomic_dq {
        let len = rows * p.head_dim / 2;
        let sum = client.empty(len * 8);
        let (count, dim) = elementwise_grid(client, op, len)?;
        // Safety: `sum` holds `len` pairs.
        unsafe {
            mma::zero_pairs_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                arr(&sum, len),
                len as u32,
            );
        }
        (sum, len)
    } else {
        (client.empty(8), 1)
    };
    let patch = plan.source_patch();
    // The variants share their arguments; the register-mma kernel takes its parts buffers
    // after the outputs, their stride after the scale and the part count after the mask.
    macro_rules! launch_kv {
        ($address:expr, [$($outs:tt)*], [$($scalars:tt)*], [$($comptime:tt)*], $($kernel:tt)+) => {
            launch_flash!(
                client, kv_count, gkv, $address, n, dtype, patch,
                $($kernel)+,
                [
                    io(args.q, q_len),
                    io(args.k, kv_len),
                    io(args.v, kv_len),
                    io(args.grad_output, q_len),
                    f32s(args.lse, rows),
                    f32s(&dot, rows),
                    i32s(&ids, ids_len),
                    i32s(&kv_q_ranges, table(gkv.step_rows)),
                    i32s(&kv_k_ranges, table(gkv.own_rows)),
                    io(args.grad_k, kv_len),
                    io(args.grad_v, kv_len),
                    $($outs)*
                ],
                [
                    p.seq as u32,
                    p.q_heads as u32,
                    p.kv_heads as u32,
                    p.window as u32,
                    p.scale as f32,
                    $($scalars)*
                ],
                [gkv, p.mask, $($comptime)*]
            )
        };
    }
    // Safety: as in the forward; `dot` holds `rows` f32; the parts buffers hold `parts`
    // f32 copies of dK and dV (written only when `parts > 1`), `dq_sum` an f32 dQ (added
    // to only when `atomic_dq`).
    unsafe {
        if gkv.mma {
            launch_kv!(
                AddressType::U64,
                [
                    pairs(&partial_k, partial_len),
                    pairs(&partial_v, partial_len),
                    atomic_pairs(&dq_sum, dq_pairs),
                ],
                [(kv_elems / 2) as u32],
                [parts as u32],
                mma::flash_backward_kv_mma_kernel => FlashBackwardKvMmaKernel
            );
            if parts > 1 {
                let len = kv_elems / n;
                let (count, dim) = elementwise_grid(client, op, len)?;
                for (partial, out) in [(&partial_k, args.grad_k), (&partial_v, args.grad_v)] {
                    mma::partial_sum_kernel::launch_unchecked::<R>(
                        client,
                        count.clone(),
                        dim,
                        n,
                        arr(partial, parts * len),
                        arr(out, len),
                        len as u32,
                        1.0f32,
                        parts as u32,
                        dtype,
                    );
                }
            }
        } else {
            launch_kv!(
                AddressType::U32,
                [],
                [],
                [],
                flash_backward_kv_kernel => FlashBackwardKvKernel
            );
        }
    }
    if gkv.atomic_dq {
        let (count, dim) = elementwise_grid(client, op, q_len)?;
        // Safety: `dq_sum` holds `rows · head_dim` f32, `grad_q` as many elements.
        unsafe {
            mma::partial_sum_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                n,
                arr(&dq_sum, q_len),
                arr(args.grad_q, q_len),
                q_len as u32,
                p.scale as f32,
                1,
                dtype,
            );
        }
        counters::record(Kernel::flash_attention_backward);
        return Ok(());
    }
    let (_, q_q_ranges, q_k_ranges) =
        ranges_for(client, &p, args.document_ids, gq.own_rows, gq.step_rows)?;
    let q_count = flash_cube_count(
        client,
        op,
        p.seq.div_ceil(gq.own_rows as usize),
        p.q_heads,
        p.batch,
    )?;
    macro_rules! launch_q {
        ($address:expr, $($kernel:tt)+) => {
            launch_flash!(
                client, q_count, gq, $address, n, dtype, patch,
                $($kernel)+,
                [
                    io(args.q, q_len),
                    io(args.k, kv_len),
                    io(args.v, kv_len),
                    io(args.grad_output, q_len),
                    f32s(args.lse, rows),
                    f32s(&dot, rows),
                    i32s(&ids, ids_len),
                    i32s(&q_q_ranges, table(gq.own_rows)),
                    i32s(&q_k_ranges, table(gq.step_rows)),
                    io(args.grad_q, q_len),
                ],
                [
                    p.seq as u32,
                    p.q_heads as u32,
                    p.kv_heads as u32,
                    p.window as u32,
                    p.scale as f32,
                ],
                [gq, p.mask]
            )
        };
    }
    // Safety: as above.
    unsafe {
        if gq.mma {
            launch_q!(AddressType::U64, mma::flash_backward_q_mma_kernel => FlashBackwardQMmaKernel);
        } else {
            launch_q!(AddressType::U32, flash_backward_q_kernel => FlashBackwardQKernel);
        }
    }
    counters::record(Kernel::flash_attention_dq);
    counters::record(Kernel::flash_attention_backward);
    Ok(())
}

#[cfg(test)]
#[path = "attention_codegen.rs"]
mod codegen;

#[cfg(test)]
mod cmma_tiling_tests {
    use super::*;

    /// f16/bf16 inputs in vectors of 8, as the plans take them.
    const ELEM: usize = 2;
    const VECTOR: usize = 8;

    fn bytes(kernel: FlashKernel, head_dim: usize, tiling: MmaTiling) -> usize {
        let g = tiled_geometry(
            kernel,
            FlashVariant::TensorCores,
            head_dim,
            VECTOR,
            16,
            tiling,
        );
        shared_bytes(&g, kernel, ELEM)
    }

    #[test]
    fn each_kernel_takes_the_largest_tiling_that_fits() {
        // The H200's 227 KiB; Vulkan on NVIDIA's 48 KiB, where head_dim 128's backward
        // does not fit two planes.
        for (max, head_dim) in [(232_448usize, 64usize), (232_448, 128), (49_152, 64)] {
            {
                let tiling = cmma_tiling_within(head_dim, VECTOR, ELEM, max)
                    .unwrap_or_else(|e| panic!("head_dim {head_dim}, {max} bytes: {e:?}"));
                for kernel in FLASH_KERNELS {
                    let chosen = tiling.of(kernel);
                    assert!(
                        bytes(kernel, head_dim, tiling) <= max,
                        "{kernel:?} head_dim {head_dim}: {chosen:?} exceeds {max} bytes"
                    );
                    let tilings = cmma_tilings(kernel, head_dim);
                    let at = tilings.iter().position(|t| *t == chosen).unwrap();
                    // Every larger tiling of this kernel would not have fitted.
                    for larger in &tilings[..at] {
                        let mut with = tiling;
                        *with.of_mut(kernel) = *larger;
                        assert!(
                            bytes(kernel, head_dim, with) > max,
                            "{kernel:?} head_dim {head_dim}: {larger:?} fits {max} bytes but {chosen:?} was chosen"
                        );
                    }
                }
            }
        }
        assert_eq!(
            cmma_tiling_within(128, VECTOR, ELEM, 232_448),
            Ok(MmaTiling::cmma_default(128))
        );
    }

    #[test]
    fn too_little_shared_memory_names_the_kernel() {
        let (kernel, needed) = cmma_tiling_within(128, VECTOR, ELEM, 8_192).unwrap_err();
        assert_eq!(kernel, FlashKernel::Forward);
        assert!(needed > 8_192);
        // 48 KiB: head_dim 128's forward fits, its backward on two planes does not.
        let (kernel, needed) = cmma_tiling_within(128, VECTOR, ELEM, 49_152).unwrap_err();
        assert_eq!(kernel, FlashKernel::BackwardKv);
        assert!(needed > 49_152);
    }

    #[test]
    fn rows_kept_and_streamed_keep_the_kernels_assumptions() {
        // One 16-row strip a plane; the backward keeps as many rows as it streams, the
        // forward as many or twice as many.
        for head_dim in [64usize, 128] {
            for kernel in FLASH_KERNELS {
                for t in cmma_tilings(kernel, head_dim) {
                    let own = 16 * t.planes * t.plane_tiles;
                    assert_eq!(t.plane_tiles, 1);
                    match kernel {
                        FlashKernel::Forward => {
                            assert!(own == t.step_rows || own == 2 * t.step_rows, "{t:?}")
                        }
                        _ => assert_eq!(own, t.step_rows, "{kernel:?} {t:?}"),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod mma_tiling_tests {
    use super::*;
    use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    /// A register-mma plan at `head_dim` with its default tiling, as a CUDA device gets it
    /// (built by hand: the wgpu client here has no register mma).
    fn plan(head_dim: usize) -> FlashPlan {
        FlashPlan {
            variant: FlashVariant::Mma,
            head_dim,
            vector: 8,
            fma_rows: 16,
            fast_exp: true,
            tiling: MmaTiling::for_head_dim(head_dim),
            atomic_dq: true,
            exp2_flush_to_zero: head_dim <= EXP2_FLUSH_TO_ZERO_MAX_HEAD_DIM,
        }
    }

    #[test]
    fn tilings_outside_the_kernels_range_are_refused_by_name() {
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        let bf16: StorageType = ElemType::Float(FloatKind::BF16).into();
        let k = KernelTiling::new;
        let base = MmaTiling::for_head_dim(64);
        let refused = [
            // 128-row steps: the forward with one m-tile only, never the backward.
            MmaTiling {
                forward: k(2, 128),
                ..base
            },
            MmaTiling {
                backward_kv: k(1, 128),
                ..base
            },
            MmaTiling {
                backward_q: k(1, 128),
                ..base
            },
            // Steps that are not a multiple of 16, three m-tiles, dQ on 8 planes.
            MmaTiling {
                forward: k(1, 40),
                ..base
            },
            MmaTiling {
                backward_kv: k(3, 32),
                ..base
            },
            MmaTiling {
                backward_q: k(1, 32).with_planes(8),
                ..base
            },
            // The warp grid: dK/dV only, and only as `KernelTiling::warp_grid()`.
            MmaTiling {
                forward: KernelTiling::warp_grid(),
                ..base
            },
            MmaTiling {
                backward_kv: KernelTiling {
                    step_rows: 32,
                    ..KernelTiling::warp_grid()
                },
                ..base
            },
        ];
        for tiling in refused {
            let err = plan(64)
                .with_tiling(&client, bf16, tiling)
                .expect_err("an unsupported tiling");
            let text = err.to_string();
            assert!(
                text.contains("flash_attention") && text.contains("KernelTiling"),
                "{tiling:?}: {text}"
            );
        }
    }

    #[test]
    fn dq_splits_cover_the_step_and_load_the_fewest_operands() {
        let kv = |head_dim: usize, t: KernelTiling| {
            tiled_geometry(
                FlashKernel::BackwardKv,
                FlashVariant::Mma,
                head_dim,
                8,
                16,
                MmaTiling {
                    backward_kv: t,
                    ..MmaTiling::for_head_dim(head_dim)
                },
            )
        };
        // The defaults: head_dim 64 (two m-tiles, 32-query steps on 4 planes) ties and
        // keeps one query tile a plane; head_dim 128 (64-query steps on 8 planes) takes
        // two, 32 columns each: 32 `ldmatrix` a plane a step against 40 with one.
        assert_eq!(
            kv(64, MmaTiling::for_head_dim(64).backward_kv).dq_split(),
            Some((1, 2, 1))
        );
        assert_eq!(
            kv(128, MmaTiling::for_head_dim(128).backward_kv).dq_split(),
            Some((2, 4, 1))
        );
        let k = KernelTiling::new;
        for head_dim in [64usize, 128] {
            for t in [
                k(1, 16),
                k(1, 32),
                k(1, 64),
                k(2, 32),
                k(2, 48),
                k(1, 64).with_planes(8),
                k(1, 16).with_planes(8),
                k(1, 32).with_planes(12),
                k(2, 32).with_planes(12),
            ] {
                let g = kv(head_dim, t);
                let Some((per_plane, cols, keys)) = g.dq_split() else {
                    continue;
                };
                // Every (query tile, column part, key part) has exactly one plane.
                let query_tiles = g.step_rows / 16;
                assert_eq!(query_tiles % per_plane, 0, "{t:?}");
                assert_eq!((query_tiles / per_plane) * cols * keys, g.planes, "{t:?}");
                assert_eq!((g.head_dim / 16) % cols, 0, "{t:?}");
                assert_eq!((g.own_rows / 16) % keys, 0, "{t:?}");
            }
        }
    }

    #[test]
    fn the_warp_grid_needs_atomic_dq_and_a_head_of_64s() {
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        let bf16: StorageType = ElemType::Float(FloatKind::BF16).into();
        let grid = |head_dim: usize| MmaTiling {
            backward_kv: KernelTiling::warp_grid(),
            deferred_dq: true,
            ..MmaTiling::for_head_dim(head_dim)
        };
        for head_dim in [64usize, 128] {
            let plan = FlashPlan {
                tiling: grid(head_dim),
                ..plan(head_dim)
            };
            let g = plan.geometry(FlashKernel::BackwardKv);
            // The grid sums a step's dQ in the step: never deferred.
            assert!(g.warp_grid && g.atomic_dq && !g.deferred_dq, "{g:?}");
            assert_eq!((g.own_rows, g.step_rows, g.planes), (128, 64, 8));
            // 171 KiB at head_dim 128: K and V, Q and dO twice, P and dS.
            let bytes = mma::shared_bytes(&g, FlashKernel::BackwardKv, 2);
            let row = (head_dim + 8) * 2;
            assert_eq!(
                bytes,
                128 + 2 * 128 * row + 4 * 64 * row + 4 * 64 * 4 + 2 * 64 * 136 * 2
            );
            // A deterministic plan keeps the strips (and the dQ kernel).
            let g = plan.deterministic().geometry(FlashKernel::BackwardKv);
            assert!(!g.warp_grid && !g.atomic_dq, "{g:?}");
            // The other kernels never take it.
            assert!(!plan.geometry(FlashKernel::Forward).warp_grid);
        }
        // A head of 80 (a quarter is not a whole number of 16-column tiles) or 256 (dK
        // and dV would take every register).
        for head_dim in [80, 256] {
            let err = plan(head_dim)
                .with_tiling(&client, bf16, grid(head_dim))
                .expect_err("no warp grid");
            assert!(err.to_string().contains("warp grid"), "{err}");
            assert!(!plan(head_dim).tiling.backward_kv.warp_grid);
        }
        assert!(plan(128).tiling.backward_kv.warp_grid);
    }

    #[test]
    fn the_forward_takes_128_key_steps_with_one_m_tile() {
        let client = WgpuRuntime::client(&WgpuDevice::DefaultDevice);
        let bf16: StorageType = ElemType::Float(FloatKind::BF16).into();
        let max_shared = client.properties().hardware.max_shared_memory_size;
        for head_dim in [64usize, 128] {
            let tiling = MmaTiling {
                forward: KernelTiling::new(1, 128),
                ..MmaTiling::for_head_dim(head_dim)
            };
            let plan = plan(head_dim);
            let fits = FLASH_KERNELS.iter().all(|k| {
                let g = FlashPlan { tiling, ..plan }.geometry(*k);
                shared_bytes(&g, *k, 2) <= max_shared
            });
            // Where the device's shared memory is too small for the plan, the refusal
            // names the bytes instead (lavapipe: 32 KiB a workgroup).
            match plan.with_tiling(&client, bf16, tiling) {
                Ok(p) => {
                    assert!(fits);
                    assert_eq!(p.geometry(FlashKernel::Forward).step_rows, 128);
                }
                Err(e) => {
                    assert!(!fits, "{e}");
                    assert!(e.to_string().contains("shared memory"), "{e}");
                }
            }
        }
    }
}
