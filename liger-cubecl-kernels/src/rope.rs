//! Rotary position embedding (RoPE) of q and k in one launch, forward and backward.
//!
//! Forward: `out = x · cos + rot(x) · sin` per row of `head_dim`, where `rot` pairs
//! element `a` with a partner `b` and gives `rot(x)[a] = -x[b]`, `rot(x)[b] = x[a]`:
//! - rotate-half (Hugging Face): pairs `(j, j + d/2)`;
//! - interleaved (Burn's `RotaryEncoding`): pairs `(2i, 2i + 1)`.
//!
//! Backward is the exact transpose for any `cos`/`sin` tables:
//! `dx = g · cos + rotᵀ(g · sin)` with `rotᵀ = -rot`, i.e. per pair
//! `dx[a] = g[a]·cos[a] + g[b]·sin[b]`, `dx[b] = g[b]·cos[b] - g[a]·sin[a]`
//! (a rotation by `-θ` when the tables are cos/sin of angles shared by the pair).
//! The same kernel runs both, with a comptime `backward` flag.
//!
//! Work split: one work item is one `(batch, position, pair of vectors)` and a group of
//! up to `heads_per_unit` heads of q or of k. The unit reads its cos/sin vectors once and
//! applies them to every head of the group: all the group's loads are issued before the
//! first store (independent loads in flight), then each head is rotated and written.
//! Rotate-half units hold vectors `j` and `j + d/(2N)` (both halves of the pairs);
//! interleaved units hold one vector whose lanes pair up (`N` even), or two scalars when
//! the vector width is one. q and k are read through their strides (non-contiguous views
//! such as `[b, s, h, d].swap_dims(1, 2)` need no copy; the last dimension must be dense);
//! outputs are contiguous `[batch, heads, seq, head_dim]`.

use crate::counters::{self, Kernel};
use crate::launch::{KernelError, LaunchConfig, check_float_dtype};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube.
pub const ROPE_UNITS: u32 = 256;

/// Swaps the lanes of each pair `(2i, 2i + 1)` of a vector.
#[cube]
fn swap_pairs<N: Size>(v: Vector<f32, N>) -> Vector<f32, N> {
    let lanes = N::value();
    let mut r = Vector::<f32, N>::empty();
    #[unroll]
    for i in 0..comptime!(lanes / 2) {
        r[2 * i] = v[2 * i + 1];
        r[2 * i + 1] = v[2 * i];
    }
    r
}

/// The sin factor of the lane-paired (interleaved) path: `out = x · cos + swap(x) · s'`.
/// Forward `s'[2i] = -sin[2i]`, `s'[2i+1] = sin[2i+1]`; backward (the transpose)
/// `s'[2i] = sin[2i+1]`, `s'[2i+1] = -sin[2i]`.
#[cube]
fn paired_sin<N: Size>(s: Vector<f32, N>, #[comptime] backward: bool) -> Vector<f32, N> {
    let lanes = N::value();
    let mut r = Vector::<f32, N>::empty();
    #[unroll]
    for i in 0..comptime!(lanes / 2) {
        if backward {
            r[2 * i] = s[2 * i + 1];
            r[2 * i + 1] = -s[2 * i];
        } else {
            r[2 * i] = -s[2 * i];
            r[2 * i + 1] = s[2 * i + 1];
        }
    }
    r
}

/// Rotates heads `h0..h_end` of one tensor at one `(batch, position, pair)`.
///
/// `base` is the input offset of head 0 at this batch and position, `out_base` the output
/// offset of head 0, `a`/`b` the two vectors of the pair (`b` unused when `in_vector`),
/// `ca, cb, sa, sb` the coefficient vectors (`out_a = x_a·ca + x_b·sa`,
/// `out_b = x_b·cb + x_a·sb` on the two-vector path; `out = x·ca + swap(x)·sa` when
/// `in_vector`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn rotate_heads<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    base: usize,
    head_stride: usize,
    out_base: usize,
    out_head_stride: usize,
    h0: usize,
    h_end: usize,
    a: usize,
    b: usize,
    ca: Vector<f32, N>,
    cb: Vector<f32, N>,
    sa: Vector<f32, N>,
    sb: Vector<f32, N>,
    #[comptime] heads: u32,
    #[comptime] in_vector: bool,
) {
    let mut xa = Array::<Vector<F, N>>::new(heads as usize);
    let mut xb =
        Array::<Vector<F, N>>::new(comptime!(if in_vector { 1usize } else { heads as usize }));
    // Every load of the group first, so they are all in flight together.
    #[unroll]
    for i in 0..heads {
        let h = h0 + i as usize;
        if h < h_end {
            let at = base + h * head_stride;
            xa[i as usize] = x[at + a];
            if !in_vector {
                xb[i as usize] = x[at + b];
            }
        }
    }
    #[unroll]
    for i in 0..heads {
        let h = h0 + i as usize;
        if h < h_end {
            let at = out_base + h * out_head_stride;
            let va = Vector::<f32, N>::cast_from(xa[i as usize]);
            if in_vector {
                out[at + a] = Vector::<F, N>::cast_from(va * ca + swap_pairs::<N>(va) * sa);
            } else {
                let vb = Vector::<f32, N>::cast_from(xb[i as usize]);
                out[at + a] = Vector::<F, N>::cast_from(va * ca + vb * sa);
                out[at + b] = Vector::<F, N>::cast_from(vb * cb + va * sb);
            }
        }
    }
}

// `cb`/`sa`/`sb` get a placeholder before the comptime choice of the pair layout.
#[allow(unused_assignments, clippy::too_many_arguments)]
#[cube(launch_unchecked)]
fn rope_kernel<F: Float, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    cos: &Array<Vector<F, N>>,
    sin: &Array<Vector<F, N>>,
    q_out: &mut Array<Vector<F, N>>,
    k_out: &mut Array<Vector<F, N>>,
    items: u32,
    seq: u32,
    pairs: u32,
    groups: u32,
    q_groups: u32,
    q_heads: u32,
    k_heads: u32,
    row: u32,
    cos_batch: u32,
    q_sb: u32,
    q_sh: u32,
    q_ss: u32,
    k_sb: u32,
    k_sh: u32,
    k_ss: u32,
    a_mul: u32,
    partner: u32,
    #[comptime] backward: bool,
    #[comptime] in_vector: bool,
    #[comptime] heads: u32,
    #[define(F)] _dtype: StorageType,
) {
    let items = items as usize;
    let pairs = pairs as usize;
    let seq = seq as usize;
    let groups = groups as usize;
    let q_groups = q_groups as usize;
    let row = row as usize;
    let mut item = ABSOLUTE_POS;
    while item < items {
        let p = item % pairs;
        let rest = item / pairs;
        let s = rest % seq;
        let rest = rest / seq;
        let g = rest % groups;
        let batch = rest / groups;

        let table = batch * cos_batch as usize + s * row;
        // Coefficients of this pair, read once for every head of the group.
        let a = p * a_mul as usize;
        let b = a + partner as usize;
        let cos_a = Vector::<f32, N>::cast_from(cos[table + a]);
        let sin_a = Vector::<f32, N>::cast_from(sin[table + a]);
        let ca = cos_a;
        let mut cb = cos_a;
        let mut sa = cos_a;
        let mut sb = cos_a;
        if in_vector {
            sa = paired_sin::<N>(sin_a, backward);
        } else {
            cb = Vector::<f32, N>::cast_from(cos[table + b]);
            let sin_b = Vector::<f32, N>::cast_from(sin[table + b]);
            // out_a = x_a·cos_a + x_b·sa, out_b = x_b·cos_b + x_a·sb.
            // `0 - v`, not `-v`: CubeCL's CUDA target has no unary minus on vector types.
            let neg_sin_a = Vector::<f32, N>::new(0.0) - sin_a;
            if backward {
                sa = sin_b;
                sb = neg_sin_a;
            } else {
                sa = neg_sin_a;
                sb = sin_b;
            }
        }

        if g < q_groups {
            let h0 = g * heads as usize;
            let h_end = q_heads as usize;
            let base = batch * q_sb as usize + s * q_ss as usize;
            let out_base = (batch * q_heads as usize * seq + s) * row;
            rotate_heads::<F, N>(
                q,
                q_out,
                base,
                q_sh as usize,
                out_base,
                seq * row,
                h0,
                h_end,
                a,
                b,
                ca,
                cb,
                sa,
                sb,
                heads,
                in_vector,
            );
        } else {
            let h0 = (g - q_groups) * heads as usize;
            let h_end = k_heads as usize;
            let base = batch * k_sb as usize + s * k_ss as usize;
            let out_base = (batch * k_heads as usize * seq + s) * row;
            rotate_heads::<F, N>(
                k,
                k_out,
                base,
                k_sh as usize,
                out_base,
                seq * row,
                h0,
                h_end,
                a,
                b,
                ca,
                cb,
                sa,
                sb,
                heads,
                in_vector,
            );
        }
        item += CUBE_COUNT * CUBE_DIM as usize;
    }
}

/// Pair layout of the rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeKernelLayout {
    /// Pairs `(j, j + d/2)` (Hugging Face `rotate_half`).
    RotateHalf,
    /// Pairs `(2i, 2i + 1)` (Burn's `RotaryEncoding`).
    Interleaved,
}

/// The widest vector (elements per load) the kernel can use for rows of `head_dim` of
/// `elem_size`-byte elements in `layout`, when q, k and the tables are dense along the
/// last dimension and their other strides and offsets are multiples of it.
pub fn rope_vector_size<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    layout: RopeKernelLayout,
    elem_size: usize,
) -> usize {
    let unit = match layout {
        // Both vectors of a pair lie in one half.
        RopeKernelLayout::RotateHalf => head_dim / 2,
        RopeKernelLayout::Interleaved => head_dim,
    };
    crate::launch::vector_size(client, unit, elem_size)
}

/// One rotated tensor (`[batch, heads, seq, head_dim]`): input view and dense output.
#[derive(Clone, Copy, Debug)]
pub struct RopeOperand<'a> {
    /// The input buffer (the view's first element at offset 0).
    pub input: &'a Handle,
    /// Input strides in elements: batch, head, position (the last dimension is dense).
    pub strides: [usize; 3],
    /// Heads.
    pub heads: usize,
    /// The contiguous output buffer, `[batch, heads, seq, head_dim]`.
    pub output: &'a Handle,
}

/// The problem of one launch.
#[derive(Clone, Copy, Debug)]
pub struct RopeProblem {
    /// Batch size.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Head dimension (even).
    pub head_dim: usize,
    /// Whether the cos/sin tables are `[batch, seq, head_dim]` (else `[1, seq, head_dim]`).
    pub tables_batched: bool,
    /// Pair layout.
    pub layout: RopeKernelLayout,
    /// Backward (transpose) instead of forward.
    pub backward: bool,
    /// Elements per vector load: a value of [`rope_vector_size`] or a divisor of it that
    /// divides every input stride.
    pub vector_size: usize,
}

fn largest_index(strides: [usize; 3], p: &RopeProblem, heads: usize) -> usize {
    (p.batch - 1) * strides[0] + (heads - 1) * strides[1] + (p.seq - 1) * strides[2] + p.head_dim
}

/// RoPE forward (`backward = false`) or backward of q and k in one launch.
///
/// `q`/`k` are optional (one-sided gradients): at least one is given. `cos, sin` are
/// contiguous `[1 or batch, seq, head_dim]` of `dtype`, like the inputs and outputs.
pub fn rope<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    q: Option<RopeOperand<'_>>,
    k: Option<RopeOperand<'_>>,
    cos: &Handle,
    sin: &Handle,
    p: RopeProblem,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let op = if p.backward { "rope_backward" } else { "rope" };
    check_float_dtype(op, dtype)?;
    let n = p.vector_size;
    assert!(
        p.head_dim % 2 == 0 && p.head_dim % n == 0,
        "{op}: vector size {n} does not fit head_dim {}",
        p.head_dim
    );
    for operand in q.iter().chain(k.iter()) {
        assert!(
            operand.strides.iter().all(|s| s % n == 0),
            "{op}: input strides {:?} are not multiples of the vector size {n}",
            operand.strides
        );
    }
    if q.is_none() && k.is_none() {
        return Ok(());
    }
    let row = p.head_dim / n;
    let in_vector = p.layout == RopeKernelLayout::Interleaved && n >= 2;
    let (pairs, a_mul, partner) = match p.layout {
        RopeKernelLayout::RotateHalf => {
            assert!(
                (p.head_dim / 2) % n == 0,
                "{op}: vector size {n} does not divide half of head_dim {}",
                p.head_dim
            );
            (row / 2, 1, row / 2)
        }
        RopeKernelLayout::Interleaved if in_vector => (row, 1, 0),
        // Scalar loads: element 2i and its partner 2i + 1.
        RopeKernelLayout::Interleaved => (row / 2, 2, 1),
    };
    let heads_per_unit = config.rope.heads_per_unit.clamp(1, 32);
    let q_heads = q.map_or(0, |o| o.heads);
    let k_heads = k.map_or(0, |o| o.heads);
    let q_groups = q_heads.div_ceil(heads_per_unit);
    let groups = q_groups + k_heads.div_ceil(heads_per_unit);
    let items = p.batch * p.seq * groups * pairs;

    let props = client.properties();
    let units = ROPE_UNITS
        .min(props.hardware.max_units_per_cube)
        .min(props.hardware.max_cube_dim.0)
        .max(1);
    let max_cubes = (crate::launch::multiprocessors(client) * config.rope.cubes_per_sm.max(1))
        .min(props.hardware.max_cube_count.0.max(1) as usize)
        .min(65_535);
    let cubes = items.div_ceil(units as usize).clamp(1, max_cubes) as u32;

    // Absent sides get one-vector scratch buffers: the kernel never touches them (no
    // group of theirs exists), and no buffer is bound twice.
    let scratch = || client.empty(n * dtype.size());
    let (q_in, q_out, q_len, q_strides) = match q {
        Some(o) => (
            o.input.clone(),
            o.output.clone(),
            largest_index(o.strides, &p, o.heads),
            o.strides,
        ),
        None => (scratch(), scratch(), n, [0; 3]),
    };
    let (k_in, k_out, k_len, k_strides) = match k {
        Some(o) => (
            o.input.clone(),
            o.output.clone(),
            largest_index(o.strides, &p, o.heads),
            o.strides,
        ),
        None => (scratch(), scratch(), n, [0; 3]),
    };
    let q_out_len = (p.batch * q_heads * p.seq * p.head_dim).max(n);
    let k_out_len = (p.batch * k_heads * p.seq * p.head_dim).max(n);
    let table_len = if p.tables_batched { p.batch } else { 1 } * p.seq * p.head_dim;
    let v = |x: usize| (x / n) as u32;
    let arr = |h: &Handle, len: usize| {
        // Safety: `len` elements (rounded up to whole vectors) are addressable in every
        // buffer passed here: the callers size outputs exactly and inputs' views span
        // `largest_index` elements from their offset.
        unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), len.div_ceil(n)) }
    };
    // Safety: every index the kernel computes stays below the lengths above (it walks
    // `items` work items, each inside the shapes passed here).
    unsafe {
        rope_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_1d(units),
            n,
            arr(&q_in, q_len),
            arr(&k_in, k_len),
            arr(cos, table_len),
            arr(sin, table_len),
            arr(&q_out, q_out_len),
            arr(&k_out, k_out_len),
            items as u32,
            p.seq as u32,
            pairs as u32,
            groups as u32,
            q_groups as u32,
            q_heads as u32,
            k_heads as u32,
            row as u32,
            if p.tables_batched { row * p.seq } else { 0 } as u32,
            v(q_strides[0]),
            v(q_strides[1]),
            v(q_strides[2]),
            v(k_strides[0]),
            v(k_strides[1]),
            v(k_strides[2]),
            a_mul as u32,
            partner as u32,
            p.backward,
            in_vector,
            heads_per_unit as u32,
            dtype,
        );
    }
    counters::record(if p.backward {
        Kernel::rope_backward
    } else {
        Kernel::rope_forward
    });
    Ok(())
}
