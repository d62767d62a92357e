//! RoPE in the conformance suite: the f64 reference, the case table and the case runner.
//!
//! A case is `(rows, width) = (batch · seq, head_dim)`; the rest of its dimensions (heads
//! of q and k, whether the tables are per batch, how q and k are laid out in memory) come
//! from the table [`CASES`], so reports still read `tokens × head_dim`.

use super::bounds::{Expected, U32, flush, unit_roundoff};
use super::{Comparison, HostCase, Op, Rng, host_input, poison, to_f64};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::functional;
use liger_burn::ops::{FusedOps, RopeLayout};

/// How q and k sit in memory when handed to the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeInputLayout {
    /// Contiguous `[batch, heads, seq, head_dim]`.
    Contiguous,
    /// `[batch, seq, heads, head_dim]` viewed through `swap_dims(1, 2)` (as attention
    /// code gets them from a projection).
    Transposed,
    /// Slices of one fused `[batch, seq, q_heads + 2·kv_heads, head_dim]` QKV projection
    /// (a buffer offset for k), then `swap_dims(1, 2)`.
    FusedQkv,
}

/// The dimensions of one RoPE case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeCase {
    /// Batch size.
    pub batch: usize,
    /// Heads of q.
    pub q_heads: usize,
    /// Heads of k.
    pub kv_heads: usize,
    /// Sequence length.
    pub seq: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// cos/sin are `[batch, seq, head_dim]` (else `[1, seq, head_dim]`).
    pub batched_tables: bool,
    /// Memory layout of q and k.
    pub input: RopeInputLayout,
}

const fn case(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    seq: usize,
    head_dim: usize,
    batched_tables: bool,
    input: RopeInputLayout,
) -> RopeCase {
    RopeCase {
        batch,
        q_heads,
        kv_heads,
        seq,
        head_dim,
        batched_tables,
        input,
    }
}

use RopeInputLayout::{Contiguous, FusedQkv, Transposed};

/// The quick sweep: head_dim 2, 6, 32, 64, 96, 128, 130; seq 1, odd and long; batch > 1
/// with shared and per-batch tables; grouped-query heads (and more k heads than q heads);
/// head counts that are not multiples of the heads a unit handles; every memory layout.
pub const CASES: &[RopeCase] = &[
    case(1, 1, 1, 1, 2, false, Contiguous),
    case(2, 4, 2, 3, 6, true, Transposed),
    case(3, 3, 1, 7, 64, false, Transposed),
    case(2, 2, 2, 5, 128, true, Contiguous),
    case(1, 4, 4, 9, 130, false, FusedQkv),
    case(4, 8, 2, 33, 128, false, FusedQkv),
    case(2, 2, 1, 1, 64, true, Transposed),
    case(3, 5, 3, 17, 96, true, FusedQkv),
    case(1, 2, 6, 4, 32, false, Contiguous),
    // More work items (140 000) than units launched on a device that does not report
    // its multiprocessors (512 cubes of 256), so units walk several items.
    case(1, 1, 1, 70_000, 2, false, Transposed),
];

/// Added by the full sweep: the Llama-3 8B training shape and other realistic ones.
pub const FULL_CASES: &[RopeCase] = &[
    case(4, 32, 8, 2048, 128, false, Transposed),
    case(2, 16, 16, 1000, 64, true, FusedQkv),
    case(1, 28, 4, 777, 128, false, Transposed),
];

/// `(batch · seq, head_dim)` of every case of the sweep.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let full = if quick { &[][..] } else { FULL_CASES };
    CASES
        .iter()
        .chain(full)
        .map(|c| (c.batch * c.seq, c.head_dim))
        .collect()
}

/// The case of `(rows, width)`: from the tables, else one sequence of `rows` tokens with
/// two q heads and one k head.
pub fn case_of(rows: usize, width: usize) -> RopeCase {
    CASES
        .iter()
        .chain(FULL_CASES)
        .find(|c| c.batch * c.seq == rows && c.head_dim == width)
        .copied()
        .unwrap_or(case(1, 2, 1, rows, width, false, Contiguous))
}

/// Partner of element `j` of a row of `d` and the sign of `rot(x)[j] = sign · x[partner]`.
fn partner(j: usize, d: usize, layout: RopeLayout) -> (usize, f64) {
    match layout {
        RopeLayout::RotateHalf if j < d / 2 => (j + d / 2, -1.0),
        RopeLayout::RotateHalf => (j - d / 2, 1.0),
        RopeLayout::Interleaved if j % 2 == 0 => (j + 1, -1.0),
        RopeLayout::Interleaved => (j - 1, 1.0),
    }
}

/// RoPE of one tensor `x: [batch, heads, seq, d]` with tables `[bc, seq, d]`
/// (`bc` 1 or batch). Forward `out[j] = cos[j]·x[j] + sin[j]·rot(x)[j]`; backward the
/// transpose of that linear map applied to `x` (the upstream gradient), scattered entry
/// by entry: `dx[j] += cos[j]·g[j]`, `dx[partner(j)] += sign(j)·sin[j]·g[j]`.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    x: &[f64],
    dims: [usize; 4],
    cos: &[f64],
    sin: &[f64],
    batched_tables: bool,
    layout: RopeLayout,
    backward: bool,
) -> Vec<f64> {
    rotate(x, dims, cos, sin, batched_tables, layout, backward, false)
}

/// [`reference`], or with `magnitudes` the same sums of the terms' absolute values.
#[allow(clippy::too_many_arguments)]
fn rotate(
    x: &[f64],
    dims: [usize; 4],
    cos: &[f64],
    sin: &[f64],
    batched_tables: bool,
    layout: RopeLayout,
    backward: bool,
    magnitudes: bool,
) -> Vec<f64> {
    let [batch, heads, seq, d] = dims;
    let f = |v: f64| if magnitudes { v.abs() } else { v };
    let mut out = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                let row = ((b * heads + h) * seq + s) * d;
                let table = ((if batched_tables { b } else { 0 }) * seq + s) * d;
                for j in 0..d {
                    let (p, sign) = partner(j, d, layout);
                    let (c, sn) = (cos[table + j], sin[table + j]);
                    if backward {
                        out[row + j] += f(c * x[row + j]);
                        out[row + p] += f(sign * sn * x[row + j]);
                    } else {
                        out[row + j] += f(c * x[row + j]) + f(sn * sign * x[row + p]);
                    }
                }
            }
        }
    }
    out
}

/// The reference of one rotated tensor with its bounds: each element is a sum of two
/// products of dtype values computed in f32 (two roundings of `u₃₂` on the terms'
/// magnitudes) and stored (`u|e|` and a flush).
#[allow(clippy::too_many_arguments)]
fn expected(
    name: &'static str,
    dtype: DType,
    x: &[f64],
    dims: [usize; 4],
    cos: &[f64],
    sin: &[f64],
    batched_tables: bool,
    layout: RopeLayout,
    backward: bool,
) -> Expected {
    let u = unit_roundoff(dtype);
    let values = rotate(x, dims, cos, sin, batched_tables, layout, backward, false);
    let mags = rotate(x, dims, cos, sin, batched_tables, layout, backward, true);
    let bounds = values
        .iter()
        .zip(&mags)
        .map(|(e, m)| u * e.abs() + 2.0 * U32 * m + flush(dtype, *e))
        .collect();
    Expected::new(name, values, bounds, dims[0] * dims[1] * dims[2])
}

/// The expected q, k and their gradients of case `c` from rounded values.
#[allow(clippy::too_many_arguments)]
fn case_expected(
    c: &RopeCase,
    dtype: DType,
    layout: RopeLayout,
    [q, k, cos, sin, gq, gk]: [&[f64]; 6],
) -> Vec<Expected> {
    let (b, s, d) = (c.batch, c.seq, c.head_dim);
    let qdims = [b, c.q_heads, s, d];
    let kdims = [b, c.kv_heads, s, d];
    let bt = c.batched_tables;
    vec![
        expected("q", dtype, q, qdims, cos, sin, bt, layout, false),
        expected("k", dtype, k, kdims, cos, sin, bt, layout, false),
        expected("grad_q", dtype, gq, qdims, cos, sin, bt, layout, true),
        expected("grad_k", dtype, gk, kdims, cos, sin, bt, layout, true),
    ]
}

fn layout_of(op: Op) -> RopeLayout {
    if op == Op::RopeInterleaved {
        RopeLayout::Interleaved
    } else {
        RopeLayout::RotateHalf
    }
}

/// See [`super::host_case`]: the case's tensors drawn contiguous (the layout in memory
/// only matters on the device); no reduction over rows.
pub(super) fn host_case(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    rng: &mut Rng,
    _live: usize,
) -> HostCase {
    let c = case_of(rows, width);
    let (b, s, d) = (c.batch, c.seq, c.head_dim);
    let bc = if c.batched_tables { b } else { 1 };
    let nq = b * c.q_heads * s * d;
    let nk = b * c.kv_heads * s * d;
    let mut draw = |n: usize, lo: f64, hi: f64| host_input(&rng.vec(n, lo, hi, 0.0), dtype);
    let q = draw(nq, -2.0, 2.0);
    let k = draw(nk, -2.0, 2.0);
    let cos = draw(bc * s * d, -1.0, 1.0);
    let sin = draw(bc * s * d, -1.0, 1.0);
    let gq = draw(nq, -1.5, 1.5);
    let gk = draw(nk, -1.5, 1.5);
    let expected = case_expected(&c, dtype, layout_of(op), [&q, &k, &cos, &sin, &gq, &gk]);
    HostCase {
        without_last_rows: expected.clone(),
        expected,
    }
}

/// Random q `[batch, q_heads, seq, d]` and k `[batch, kv_heads, seq, d]` of `dtype`, laid
/// out in memory as the case says.
fn rotated_inputs<B: Backend>(
    c: &RopeCase,
    rng: &mut Rng,
    dtype: DType,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let (b, s, d) = (c.batch, c.seq, c.head_dim);
    let make = |values: Vec<f32>, shape: [usize; 4]| {
        Tensor::<B, 4>::from_data(TensorData::new(values, shape), device).cast(dtype)
    };
    match c.input {
        Contiguous => (
            make(
                rng.vec(b * c.q_heads * s * d, -2.0, 2.0, 0.0),
                [b, c.q_heads, s, d],
            ),
            make(
                rng.vec(b * c.kv_heads * s * d, -2.0, 2.0, 0.0),
                [b, c.kv_heads, s, d],
            ),
        ),
        Transposed => (
            make(
                rng.vec(b * c.q_heads * s * d, -2.0, 2.0, 0.0),
                [b, s, c.q_heads, d],
            )
            .swap_dims(1, 2),
            make(
                rng.vec(b * c.kv_heads * s * d, -2.0, 2.0, 0.0),
                [b, s, c.kv_heads, d],
            )
            .swap_dims(1, 2),
        ),
        FusedQkv => {
            let heads = c.q_heads + 2 * c.kv_heads;
            let qkv = make(rng.vec(b * s * heads * d, -2.0, 2.0, 0.0), [b, s, heads, d]);
            (
                qkv.clone().narrow(2, 0, c.q_heads).swap_dims(1, 2),
                qkv.narrow(2, c.q_heads, c.kv_heads).swap_dims(1, 2),
            )
        }
    }
}

/// Runs one RoPE case through `Autodiff<B>`: rotated q and k and both gradients (with a
/// random upstream gradient) against [`reference`].
pub(super) fn run_case<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let layout = layout_of(op);
    let c = case_of(rows, width);
    let (b, s, d) = (c.batch, c.seq, c.head_dim);
    let bc = if c.batched_tables { b } else { 1 };
    let (q, k) = rotated_inputs::<B>(&c, rng, dtype, device);
    let (qr, kr) = (to_f64(q.clone()), to_f64(k.clone()));
    // Arbitrary tables (not cos/sin of angles): the op and its transpose are defined for
    // any values, and generic tables catch a backward that assumes a pure rotation.
    let table = |rng: &mut Rng| {
        Tensor::<B, 3>::from_data(
            TensorData::new(rng.vec(bc * s * d, -1.0, 1.0, 0.0), [bc, s, d]),
            device,
        )
        .cast(dtype)
    };
    let (cos, sin) = (table(rng), table(rng));
    let (cr, sr) = (to_f64(cos.clone()), to_f64(sin.clone()));
    let nq = b * c.q_heads * s * d;
    let nk = b * c.kv_heads * s * d;
    let grad = |n: usize, heads: usize, rng: &mut Rng| {
        let t = Tensor::<B, 4>::from_data(
            TensorData::new(rng.vec(n, -1.5, 1.5, 0.0), [b, heads, s, d]),
            device,
        )
        .cast(dtype);
        let r = to_f64(t.clone());
        (t, r)
    };
    let (gq, gqr) = grad(nq, c.q_heads, rng);
    let (gk, gkr) = grad(nk, c.kv_heads, rng);

    let q = Tensor::<A<B>, 4>::from_inner(q).require_grad();
    let k = Tensor::<A<B>, 4>::from_inner(k).require_grad();
    poison::<B>(&[nq, nk, nq, nk], dtype, device);
    let (qo, ko) = functional::rope(
        q.clone(),
        k.clone(),
        Tensor::from_inner(cos),
        Tensor::from_inner(sin),
        layout,
    );
    let loss =
        (qo.clone() * Tensor::from_inner(gq)).sum() + (ko.clone() * Tensor::from_inner(gk)).sum();
    let grads = loss.backward();
    let actual = [
        to_f64(qo.inner()),
        to_f64(ko.inner()),
        to_f64(q.grad(&grads).expect("q has a gradient")),
        to_f64(k.grad(&grads).expect("k has a gradient")),
    ];
    case_expected(&c, dtype, layout, [&qr, &kr, &cr, &sr, &gqr, &gkr])
        .iter()
        .zip(&actual)
        .map(|(e, a)| e.check(a))
        .collect()
}
