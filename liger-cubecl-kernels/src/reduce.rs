//! The one cross-unit reduction every row kernel uses.
//!
//! Plane path: `plane_sum`/`plane_max` inside each plane, then one partial per plane in
//! shared memory, summed by every unit. Correct for any plane width (32 on NVIDIA, 64 on
//! many AMD parts, whatever a software adapter reports), including a last partial plane.
//! Shared path: a classic tree over `CUBE_DIM` slots (`CUBE_DIM` is a power of two).
//!
//! Maxima propagate NaN, as PyTorch's `max` and `amax` do ([`nan_max`]).

use cubecl::prelude::*;

/// The reduction operator, a comptime choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
}

#[cube]
fn combine(a: f32, b: f32, #[comptime] op: ReduceOp) -> f32 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => nan_max(a, b),
    }
}

/// `max(a, b)`, NaN when either operand is NaN (PyTorch's `max`/`amax`). The device's own
/// max does not propagate NaN: SPIR-V's `FMax` leaves the result undefined for a NaN
/// operand and CUDA's `fmaxf` returns the other operand, so a reduction built on it would
/// drop a row's NaN.
#[cube]
pub fn nan_max(a: f32, b: f32) -> f32 {
    select(a.is_nan(), a, select(b.is_nan(), b, f32::max(a, b)))
}

/// Reduces `value` over every unit of the cube; every unit gets the result.
///
/// `scratch` needs `CUBE_DIM` slots and is free again when this returns.
#[cube]
pub fn cube_reduce(
    value: f32,
    scratch: &mut SharedMemory<f32>,
    #[comptime] op: ReduceOp,
    #[comptime] use_plane: bool,
) -> f32 {
    let mut result = 0.0f32;
    if use_plane {
        let partial = match op {
            ReduceOp::Sum => plane_sum(value),
            // `plane_max` has the device max's NaN behavior (see `nan_max`); the plane sum
            // of the NaN lanes (0 elsewhere) is NaN exactly when one lane is, else adds 0.
            ReduceOp::Max => plane_max(value) + plane_sum(select(value.is_nan(), value, 0.0f32)),
        };
        if UNIT_POS_PLANE == 0 {
            scratch[(UNIT_POS / PLANE_DIM) as usize] = partial;
        }
        sync_cube();
        let planes = CUBE_DIM.div_ceil(PLANE_DIM);
        result += scratch[0];
        for i in 1..planes {
            result = combine(result, scratch[i as usize], op);
        }
        sync_cube();
    } else {
        scratch[UNIT_POS as usize] = value;
        sync_cube();
        let mut stride = CUBE_DIM / 2;
        while stride > 0 {
            if UNIT_POS < stride {
                let a = scratch[UNIT_POS as usize];
                let b = scratch[(UNIT_POS + stride) as usize];
                scratch[UNIT_POS as usize] = combine(a, b, op);
            }
            sync_cube();
            stride /= 2;
        }
        result += scratch[0];
        sync_cube();
    }
    result
}

/// Sum of the lanes of a vector, in f32.
#[cube]
pub fn vector_sum<N: Size>(v: Vector<f32, N>) -> f32 {
    let mut total = 0.0f32;
    #[unroll]
    for i in 0..N::value() {
        total += v[i];
    }
    total
}

/// Maximum of the lanes of a vector; NaN when a lane is NaN.
#[cube]
pub fn vector_max<N: Size>(v: Vector<f32, N>) -> f32 {
    let mut m = v[0];
    #[unroll]
    for i in 1..N::value() {
        m = nan_max(m, v[i]);
    }
    m
}

/// Folds a new maximum candidate into a running `(max, Σ exp(x - max))` pair: the sum is
/// rescaled when the maximum changes. A NaN candidate makes both NaN for good (`!=` holds
/// for NaN, so every later fold keeps them NaN), as a row holding NaN has a NaN max and
/// sum in PyTorch.
#[cube]
pub fn rescale_running_max(candidate: f32, running_max: &mut f32, running_sum: &mut f32) {
    let new_max = nan_max(*running_max, candidate);
    if new_max != *running_max {
        *running_sum *= f32::exp(*running_max - new_max);
        *running_max = new_max;
    }
}

/// `exp(x)` for the shifted exponents of softmax-style rows (`x = z - max ≤ 0`, or
/// `z - lse ≤ 0`): the one place the row kernels take it, so its precision is chosen once.
///
/// Precise `exp` for now. The hardware `exp2` approximation (`fast_math =
/// ReducedPrecision | NotNaN | NotInf` on this function, `__expf` on CUDA, as Triton's
/// `tl.exp`) took the cross-entropy kernel from 835 to 690 µs on the H200 under ncu (the
/// kernel is issue-bound) and passed the f64 conformance suites on lavapipe and CUDA. It
/// was taken out when the fused-linear-cross-entropy parity test against stock Burn failed
/// with it on lavapipe (grad_weight, max rel 2.8e-3); the same test then failed on NdArray,
/// where no kernel runs (its elementwise bound on row sums was too tight; now norm-wise),
/// so the approximation was probably not the cause. To bring back once re-verified.
#[cube]
pub fn shifted_exp<N: Size>(x: Vector<f32, N>) -> Vector<f32, N> {
    Vector::exp(x)
}

/// Folds one vector into a unit's running max and its sum of `exp(x - max)`.
#[cube]
pub fn online_update<N: Size>(v: Vector<f32, N>, local_max: &mut f32, local_sum: &mut f32) {
    rescale_running_max(vector_max::<N>(v), local_max, local_sum);
    *local_sum += vector_sum::<N>(shifted_exp::<N>(v - Vector::new(*local_max)));
}
