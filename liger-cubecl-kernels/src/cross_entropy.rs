//! Cross entropy over rows of logits with integer targets: the per-row loss and the
//! logits gradient in one kernel.
//!
//! For a row with target `y` (neither `ignore_index` nor out of `[0, V)`), logits `x`,
//! `z = softcap · tanh(x / softcap)` (or `z = x`), `lse = logsumexp(z)`, class weights `w`
//! (all one without weights) and `Σw = Σ_c w_c`:
//!
//! - `loss = (1-ε) w_y (lse - z_y) + (ε/V) (lse · Σw - Σ_c w_c z_c) + λ lse²`
//! - `z_loss = λ lse²`
//! - `grad_c = s · (1 - (z_c/softcap)²) · ((1-ε) w_y (p_c - δ_cy) + (ε/V)(p_c Σw - w_c) + 2λ lse p_c)`
//!
//! with `p = softmax(z)` and `s` the device-side gradient scale (e.g. `1/Σ w_y` for a mean),
//! one for every row or one per row. The z-loss term `2λ lse p_c` may take its own scale
//! `s_z` instead (a mean divides the z-loss by the number of non-ignored rows).
//! Other rows get loss 0 and a zero gradient row, and their target is never used as an index.
//!
//! Pass 1 reads the row once with an online max and rescaled sum of `exp` (plus `Σ w_c z_c`
//! under label smoothing); pass 2 reads it again (or the registers, for rows of at most
//! [`MAX_CACHED_CHUNKS`](crate::launch::MAX_CACHED_CHUNKS) vectors per unit) and writes the
//! gradient. The gradient may be written over the logits (`in_place`): each element is
//! read and then written by the same unit, after every read of the row's first pass.

use crate::counters::{self, Kernel};
use crate::launch::{
    KernelError, LaunchConfig, RowLaunch, array, check_float_dtype, multiprocessors,
};
use crate::reduce::{
    ReduceOp, cube_reduce, nan_max, rescale_running_max, shifted_exp, vector_max, vector_sum,
};
use cubecl::ir::{ElemType, IntKind};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Vectors each unit loads before using any, on rows too long to keep in registers.
const STREAM_UNROLL: usize = 4;

/// `softcap · tanh(x / softcap)` when `softcapped`, else `x`.
#[cube]
fn cap<N: Size>(x: Vector<f32, N>, softcap: f32, #[comptime] softcapped: bool) -> Vector<f32, N> {
    if softcapped {
        Vector::tanh(x * Vector::new(1.0f32 / softcap)) * Vector::new(softcap)
    } else {
        x
    }
}

// `v`, `w` get placeholders before the comptime choice of where to read them from.
#[allow(unused_assignments, clippy::too_many_arguments)]
#[cube(launch_unchecked)]
fn cross_entropy_kernel<F: Float, I: Int, N: Size>(
    logits: &Array<Vector<F, N>>,
    grad: &mut Array<Vector<F, N>>,
    targets: &Array<I>,
    class_weight: &Array<Vector<f32, N>>,
    weight_sum: &Array<f32>,
    grad_scale: &Array<f32>,
    z_grad_scale: &Array<f32>,
    loss: &mut Array<f32>,
    z_loss: &mut Array<f32>,
    rows: u32,
    vectors: u32,
    ignore_index: InputScalar,
    smoothing: f32,
    lse_square_scale: f32,
    softcap: f32,
    #[comptime] has_ignore: bool,
    #[comptime] weighted: bool,
    #[comptime] smoothed: bool,
    #[comptime] softcapped: bool,
    #[comptime] write_z: bool,
    #[comptime] compute_grad: bool,
    #[comptime] per_row_scale: bool,
    #[comptime] z_scaled: bool,
    #[comptime] in_place: bool,
    #[comptime] units: u32,
    #[comptime] cached_chunks: u32,
    #[comptime] use_plane: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut cache = Array::<Vector<f32, N>>::new(comptime!(cached_chunks.max(1) as usize));
    let vectors = vectors as usize;
    let width = vectors * N::value();
    let vocab = width as f32;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let t = targets[row];
        // Every unit reads the same target, so `valid` is uniform over the cube; still, no
        // barrier sits under it (some compilers reject barriers under data-dependent
        // branches): invalid rows run the reductions over an empty range instead.
        let mut valid = t >= I::new(0) && t < I::cast_from(width);
        if has_ignore {
            valid = valid && t != ignore_index.get::<I>();
        }
        let mut limit = 0usize;
        if valid {
            limit = vectors;
        }
        // The target's logit and weight, read directly (never indexed when invalid).
        let mut z_y = 0.0f32;
        let mut w_y = 1.0f32;
        let mut y_vec = vectors;
        let mut y_lane = 0usize;
        if valid {
            let y = usize::cast_from(t);
            y_vec = y / N::value();
            y_lane = y % N::value();
            let mut v = Vector::<f32, N>::new(0.0);
            if in_place {
                v = Vector::<f32, N>::cast_from(grad[base + y_vec]);
            } else {
                v = Vector::<f32, N>::cast_from(logits[base + y_vec]);
            }
            let zv = cap::<N>(v, softcap, softcapped);
            let mut wv = Vector::<f32, N>::new(1.0);
            if weighted {
                wv = class_weight[y_vec];
            }
            #[unroll]
            for k in 0..N::value() {
                if y_lane == k as usize {
                    z_y = zv[k];
                    w_y = wv[k];
                }
            }
        }

        // Pass 1: online max / sum of exp, and Σ w_c z_c for label smoothing.
        let mut local_max = f32::min_value();
        let mut local_sum = 0.0f32;
        let mut local_wz = 0.0f32;
        if cached_chunks > 0 {
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < limit {
                    let mut v = Vector::<f32, N>::new(0.0);
                    if in_place {
                        v = Vector::<f32, N>::cast_from(grad[base + j]);
                    } else {
                        v = Vector::<f32, N>::cast_from(logits[base + j]);
                    }
                    let z = cap::<N>(v, softcap, softcapped);
                    cache[c as usize] = z;
                    local_max = nan_max(local_max, vector_max::<N>(z));
                    if smoothed {
                        if weighted {
                            local_wz += vector_sum::<N>(z * class_weight[j]);
                        } else {
                            local_wz += vector_sum::<N>(z);
                        }
                    }
                }
            }
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < limit {
                    local_sum += vector_sum::<N>(shifted_exp::<N>(
                        cache[c as usize] - Vector::new(local_max),
                    ));
                }
            }
        } else {
            // Streamed rows: STREAM_UNROLL vectors are loaded before any is used, so each
            // unit keeps several loads in flight (one at a time left the H200 at a third
            // of its bandwidth), and the online max is rescaled once per block.
            let stride = CUBE_DIM as usize;
            let mut j0 = UNIT_POS as usize;
            while j0 < limit {
                let mut block = Array::<Vector<f32, N>>::new(STREAM_UNROLL);
                #[unroll]
                for u in 0..STREAM_UNROLL {
                    let j = j0 + u * stride;
                    // Past the row: the lowest finite value, which never raises the block
                    // max above a real logit (the block's first vector is in range).
                    let mut z = Vector::<f32, N>::new(f32::min_value());
                    if j < limit {
                        let mut v = Vector::<f32, N>::new(0.0);
                        if in_place {
                            v = Vector::<f32, N>::cast_from(grad[base + j]);
                        } else {
                            v = Vector::<f32, N>::cast_from(logits[base + j]);
                        }
                        z = cap::<N>(v, softcap, softcapped);
                        if smoothed {
                            if weighted {
                                local_wz += vector_sum::<N>(z * class_weight[j]);
                            } else {
                                local_wz += vector_sum::<N>(z);
                            }
                        }
                    }
                    block[u] = z;
                }
                let mut block_max = vector_max::<N>(block[0]);
                #[unroll]
                for u in 1..STREAM_UNROLL {
                    block_max = nan_max(block_max, vector_max::<N>(block[u]));
                }
                rescale_running_max(block_max, &mut local_max, &mut local_sum);
                // Only the row's vectors: the padding equals the running max of a row that
                // holds nothing above it (only -inf), where exp(pad - max) would add 1.
                #[unroll]
                for u in 0..STREAM_UNROLL {
                    if j0 + u * stride < limit {
                        local_sum +=
                            vector_sum::<N>(shifted_exp::<N>(block[u] - Vector::new(local_max)));
                    }
                }
                j0 += stride * STREAM_UNROLL;
            }
        }
        let row_max = cube_reduce(local_max, &mut scratch, ReduceOp::Max, use_plane);
        let rescaled = local_sum * f32::exp(local_max - row_max);
        let row_sum = cube_reduce(rescaled, &mut scratch, ReduceOp::Sum, use_plane);
        let mut sum_wz = 0.0f32;
        if smoothed {
            sum_wz = cube_reduce(local_wz, &mut scratch, ReduceOp::Sum, use_plane);
        }
        let lse = row_max + f32::ln(row_sum);
        // The z-loss squares torch.logsumexp, which is +inf on a row holding +inf and no
        // NaN (it shifts by 0 when the max is infinite); `lse` is NaN there (exp(inf -
        // inf)), as F.cross_entropy's log-softmax is, so the loss and gradient stay NaN.
        let lse_z = select(row_max.is_inf(), row_max, lse);
        let mut sum_w = vocab;
        if weighted {
            sum_w = weight_sum[0];
        }
        let mut eps = 0.0f32;
        if smoothed {
            eps = smoothing;
        }

        if UNIT_POS == 0 {
            let mut ce = 0.0f32;
            let mut zl = 0.0f32;
            if valid {
                ce = (1.0f32 - eps) * w_y * (lse - z_y);
                if smoothed {
                    ce += eps / vocab * (lse * sum_w - sum_wz);
                }
                zl = lse_square_scale * lse_z * lse_z;
            }
            loss[row] = ce + zl;
            if write_z {
                z_loss[row] = zl;
            }
        }

        // Pass 2: the gradient, `p_c · coef_p - b · w_c - a · δ_cy`, times the softcap chain.
        if compute_grad {
            let mut s = grad_scale[0];
            if per_row_scale {
                s = grad_scale[row];
            }
            let mut s_z = s;
            if z_scaled {
                s_z = z_grad_scale[0];
            }
            let a = (1.0f32 - eps) * w_y * s;
            let b = eps / vocab * s;
            let coef_p = a + b * sum_w + 2.0f32 * lse_square_scale * lse * s_z;
            if valid {
                if cached_chunks > 0 {
                    #[unroll]
                    for c in 0..cached_chunks {
                        let j = UNIT_POS as usize + c as usize * units as usize;
                        if j < vectors {
                            let g = grad_value::<F, N>(
                                cache[c as usize],
                                class_weight,
                                j,
                                y_vec,
                                y_lane,
                                lse,
                                coef_p,
                                a,
                                b,
                                softcap,
                                weighted,
                                smoothed,
                                softcapped,
                            );
                            grad[base + j] = g;
                        }
                    }
                } else {
                    // Loads of a block first, then its stores (see pass 1).
                    let stride = CUBE_DIM as usize;
                    let mut j0 = UNIT_POS as usize;
                    while j0 < vectors {
                        let mut block = Array::<Vector<f32, N>>::new(STREAM_UNROLL);
                        #[unroll]
                        for u in 0..STREAM_UNROLL {
                            let j = j0 + u * stride;
                            let mut v = Vector::<f32, N>::new(0.0);
                            if j < vectors {
                                if in_place {
                                    v = Vector::<f32, N>::cast_from(grad[base + j]);
                                } else {
                                    v = Vector::<f32, N>::cast_from(logits[base + j]);
                                }
                            }
                            block[u] = v;
                        }
                        #[unroll]
                        for u in 0..STREAM_UNROLL {
                            let j = j0 + u * stride;
                            if j < vectors {
                                let z = cap::<N>(block[u], softcap, softcapped);
                                grad[base + j] = grad_value::<F, N>(
                                    z,
                                    class_weight,
                                    j,
                                    y_vec,
                                    y_lane,
                                    lse,
                                    coef_p,
                                    a,
                                    b,
                                    softcap,
                                    weighted,
                                    smoothed,
                                    softcapped,
                                );
                            }
                        }
                        j0 += stride * STREAM_UNROLL;
                    }
                }
            } else {
                let mut j = UNIT_POS as usize;
                while j < vectors {
                    grad[base + j] = Vector::<F, N>::cast_from(Vector::<f32, N>::new(0.0));
                    j += CUBE_DIM as usize;
                }
            }
        }
        row += CUBE_COUNT;
    }
}

/// The gradient of one vector of a valid row (see the module docs).
#[allow(clippy::too_many_arguments)]
#[cube]
fn grad_value<F: Float, N: Size>(
    z: Vector<f32, N>,
    class_weight: &Array<Vector<f32, N>>,
    j: usize,
    y_vec: usize,
    y_lane: usize,
    lse: f32,
    coef_p: f32,
    a: f32,
    b: f32,
    softcap: f32,
    #[comptime] weighted: bool,
    #[comptime] smoothed: bool,
    #[comptime] softcapped: bool,
) -> Vector<F, N> {
    let p = shifted_exp::<N>(z - Vector::new(lse));
    let mut g = p * Vector::new(coef_p);
    if smoothed {
        if weighted {
            g -= class_weight[j] * Vector::new(b);
        } else {
            g -= Vector::new(b);
        }
    }
    if j == y_vec {
        #[unroll]
        for k in 0..N::value() {
            if y_lane == k as usize {
                g[k] -= a;
            }
        }
    }
    if softcapped {
        let t = z * Vector::new(1.0f32 / softcap);
        g *= Vector::new(1.0f32) - t * t;
    }
    Vector::<F, N>::cast_from(g)
}

/// Options of the cross-entropy kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyKernelOptions {
    /// Target value of rows that are skipped (loss 0, zero gradient).
    pub ignore_index: i64,
    /// Label smoothing `ε` in `[0, 1]`.
    pub label_smoothing: f32,
    /// z-loss scale `λ` (`λ · lse²` is added to each row's loss).
    pub lse_square_scale: f32,
    /// Logit soft-capping `c · tanh(x / c)`, when set (`c > 0`).
    pub softcap: Option<f32>,
}

/// Where the kernel writes the logits gradient.
#[derive(Clone, Copy, Debug)]
pub enum GradTarget<'a> {
    /// No gradient (forward only).
    None,
    /// Over the logits buffer itself (it must not be shared with anything else).
    InPlace,
    /// Into this `[rows, vocab]` buffer of the logits dtype.
    Into(&'a Handle),
}

/// The buffers of one cross-entropy launch.
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropyBuffers<'a> {
    /// `[rows, vocab]` logits of `dtype`.
    pub logits: &'a Handle,
    /// `[rows]` integer targets of `target_dtype`.
    pub targets: &'a Handle,
    /// `([vocab] f32 class weights, [1] f32 their sum)`, when weighted.
    pub class_weight: Option<(&'a Handle, &'a Handle)>,
    /// `[1]` (every row) or `[rows]` (per row) f32 scale of the gradient, and whether it
    /// is per row; required unless `grad` is [`GradTarget::None`].
    pub grad_scale: Option<(&'a Handle, bool)>,
    /// `[1]` f32 scale of the z-loss part of the gradient when it differs from
    /// `grad_scale` (which must then be `[1]`).
    pub z_loss_scale: Option<&'a Handle>,
    /// Where the gradient goes.
    pub grad: GradTarget<'a>,
    /// `[rows]` f32 per-row loss (z-loss included).
    pub loss: &'a Handle,
    /// `[rows]` f32 per-row z-loss, when wanted.
    pub z_loss: Option<&'a Handle>,
}

/// Whether `dtype` is an integer type the kernel reads targets as.
pub fn check_target_dtype(op: &'static str, dtype: StorageType) -> Result<(), KernelError> {
    match dtype.elem_type() {
        ElemType::Int(IntKind::I32 | IntKind::I64) => Ok(()),
        other => Err(KernelError::UnsupportedDtype {
            op,
            dtype: format!("{other:?} (targets must be i32 or i64)"),
        }),
    }
}

/// Whether `ignore_index` can match a target of `target_dtype`, and the launch scalar that
/// carries it: an index the target type cannot hold matches no target.
pub(crate) fn ignore_index_scalar(
    ignore_index: i64,
    target_dtype: StorageType,
) -> (bool, InputScalar) {
    let has_ignore = match target_dtype.elem_type() {
        ElemType::Int(IntKind::I32) => i32::try_from(ignore_index).is_ok(),
        _ => true,
    };
    let scalar = InputScalar::new(if has_ignore { ignore_index } else { 0 }, target_dtype);
    (has_ignore, scalar)
}

/// One cube per row (grid-strided; at most `cross_entropy_cubes_per_sm` cubes a
/// multiprocessor when set), the forward softmax geometry: shared by the loss and its
/// backward, which walk the same `[rows, vocab]` buffers.
fn row_launch<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    rows: usize,
    vocab: usize,
    dtype: StorageType,
) -> RowLaunch {
    let max_cubes = config
        .cross_entropy_cubes_per_sm
        .map_or(usize::MAX, |per_sm| {
            (multiprocessors(client) * per_sm).max(1)
        });
    RowLaunch::new(
        client,
        rows,
        vocab,
        dtype.size(),
        max_cubes,
        config.softmax_forward_vectors_per_unit,
        config.reduction,
    )
}

/// Cross entropy over `rows` rows of `vocab` logits: writes the per-row loss (and z-loss),
/// and the gradient when asked (see the module docs for the math).
///
/// `dtype` is the logits' float type, `target_dtype` the targets' int type (i32 or i64).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    buffers: CrossEntropyBuffers<'_>,
    rows: usize,
    vocab: usize,
    options: CrossEntropyKernelOptions,
    dtype: StorageType,
    target_dtype: StorageType,
) -> Result<(), KernelError> {
    const OP: &str = "cross_entropy";
    check_float_dtype(OP, dtype)?;
    check_target_dtype(OP, target_dtype)?;
    let launch = row_launch(client, config, rows, vocab, dtype);
    let vectors = launch.vectors(vocab);
    let n = rows * vectors;
    let compute_grad = !matches!(buffers.grad, GradTarget::None);
    assert!(
        !compute_grad || buffers.grad_scale.is_some(),
        "{OP}: a gradient needs a grad_scale buffer"
    );
    // Bindings a configuration does not use are never touched (comptime branches); each
    // points at its own small scratch buffer, so no buffer is bound twice.
    let scratch = |bytes: usize| client.empty(bytes.max(4));
    let f_dummy = scratch(dtype.size() * launch.vector_size);
    let g_dummy = scratch(dtype.size() * launch.vector_size);
    let w_dummy = scratch(4 * launch.vector_size);
    let ws_dummy = scratch(4);
    let gs_dummy = scratch(4);
    let zs_dummy = scratch(4);
    let z_dummy = scratch(4);
    let in_place = matches!(buffers.grad, GradTarget::InPlace);
    let (logits_arg, grad_arg) = match buffers.grad {
        GradTarget::None => (array::<R>(buffers.logits, n), array::<R>(&g_dummy, 1)),
        GradTarget::InPlace => (array::<R>(&f_dummy, 1), array::<R>(buffers.logits, n)),
        GradTarget::Into(g) => (array::<R>(buffers.logits, n), array::<R>(g, n)),
    };
    let (weight_arg, weight_sum_arg) = match buffers.class_weight {
        Some((w, sum)) => (array::<R>(w, vectors), array::<R>(sum, 1)),
        None => (array::<R>(&w_dummy, 1), array::<R>(&ws_dummy, 1)),
    };
    let per_row_scale = buffers.grad_scale.is_some_and(|(_, per_row)| per_row);
    let grad_scale_arg = match buffers.grad_scale {
        Some((s, true)) => array::<R>(s, rows),
        Some((s, false)) => array::<R>(s, 1),
        None => array::<R>(&gs_dummy, 1),
    };
    assert!(
        buffers.z_loss_scale.is_none() || !per_row_scale,
        "{OP}: a z-loss scale goes with a [1] grad_scale"
    );
    let z_scale_arg = array::<R>(buffers.z_loss_scale.unwrap_or(&zs_dummy), 1);
    let z_arg = match buffers.z_loss {
        Some(z) => array::<R>(z, rows),
        None => array::<R>(&z_dummy, 1),
    };
    let (has_ignore, ignore) = ignore_index_scalar(options.ignore_index, target_dtype);
    let smoothed = options.label_smoothing != 0.0;
    // Safety: every array length above is the item count of a buffer sized for exactly
    // these rows and widths (validated by the callers); indices stay below them, and
    // targets outside [0, vocab) are never used as indices.
    unsafe {
        cross_entropy_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            logits_arg,
            grad_arg,
            array::<R>(buffers.targets, rows),
            weight_arg,
            weight_sum_arg,
            grad_scale_arg,
            z_scale_arg,
            array::<R>(buffers.loss, rows),
            z_arg,
            rows as u32,
            vectors as u32,
            ignore,
            options.label_smoothing,
            options.lse_square_scale,
            options.softcap.unwrap_or(1.0),
            has_ignore,
            buffers.class_weight.is_some(),
            smoothed,
            options.softcap.is_some(),
            buffers.z_loss.is_some(),
            compute_grad,
            per_row_scale,
            buffers.z_loss_scale.is_some(),
            in_place,
            launch.units,
            launch.cached_chunks(vocab),
            launch.use_plane,
            [dtype, target_dtype],
        );
    }
    counters::record(Kernel::cross_entropy);
    Ok(())
}

/// Backward of the per-row loss, on the gradient the forward stored, in place: row `i` of
/// `grad` becomes `grad_i · r_i / s_i` (`r` the incoming per-row gradient, `s` the scale
/// the forward applied; `0` where `s_i = 0`, whose stored row is zero).
///
/// A row with `r_i = s_i` is left as it is (`x · 1` rounds to `x`) and is never read or
/// written, so a mean or sum followed by `backward()` costs one read of `r` and `s` per
/// row instead of a pass over `[N, V]`, and the host never has to look at `r` to decide.
#[cube(launch_unchecked)]
fn cross_entropy_backward_kernel<F: Float, N: Size>(
    grad: &mut Array<Vector<F, N>>,
    grad_rows: &Array<f32>,
    grad_scale: &Array<f32>,
    rows: u32,
    vectors: u32,
    #[comptime] per_row_scale: bool,
    #[define(F)] _dtype: StorageType,
) {
    let vectors = vectors as usize;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let r = grad_rows[row];
        let mut s = grad_scale[0];
        if per_row_scale {
            s = grad_scale[row];
        }
        // Uniform over the cube (every unit reads the same two values).
        if r != s {
            let mut factor = 0.0f32;
            if s != 0.0 {
                factor = r / s;
            }
            let base = row * vectors;
            let mut j = UNIT_POS as usize;
            while j < vectors {
                let v = Vector::<f32, N>::cast_from(grad[base + j]);
                grad[base + j] = Vector::<F, N>::cast_from(v * Vector::new(factor));
                j += CUBE_DIM as usize;
            }
        }
        row += CUBE_COUNT;
    }
}

/// Scales the `[rows, vocab]` gradient `grad` (of `dtype`, not shared with anything else)
/// in place, row by row, by `grad_rows[i] / grad_scale[i]` (see
/// [`cross_entropy_backward_kernel`]'s docs): `grad_rows` is `[rows]` f32, `grad_scale`
/// `[1]` or `[rows]` f32 (`per_row_scale`).
pub fn cross_entropy_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    grad_rows: &Handle,
    grad_scale: (&Handle, bool),
    rows: usize,
    vocab: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    const OP: &str = "cross_entropy_backward";
    check_float_dtype(OP, dtype)?;
    let launch = row_launch(client, config, rows, vocab, dtype);
    let vectors = launch.vectors(vocab);
    let (scale, per_row_scale) = grad_scale;
    // Safety: `grad` holds `rows × vocab` elements, `grad_rows` `rows` and `grad_scale`
    // `rows` or one (validated by the callers); indices stay below them.
    unsafe {
        cross_entropy_backward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array::<R>(grad, rows * vectors),
            array::<R>(grad_rows, rows),
            array::<R>(scale, if per_row_scale { rows } else { 1 }),
            rows as u32,
            vectors as u32,
            per_row_scale,
            dtype,
        );
    }
    counters::record(Kernel::cross_entropy_backward);
    Ok(())
}

/// What a loss over integer targets needs of them before its rows run, summed over the
/// `rows` targets by one cube: `weight_scale = 1 / Σ w[y_i]` and `row_scale = 1 / n` over
/// the `n` rows whose target is in `[0, vocab)` and is not `ignore_index` (`w` all one
/// without class weights; each 0 when no row counts), and `out_of_range`, the number of
/// rows whose target is neither `ignore_index` nor in `[0, vocab)`. Counts are f32, exact
/// below 2²⁴ rows.
#[cube(launch_unchecked)]
fn target_stats_kernel<I: Int>(
    targets: &Array<I>,
    class_weight: &Array<f32>,
    weight_scale: &mut Array<f32>,
    row_scale: &mut Array<f32>,
    out_of_range_count: &mut Array<f32>,
    rows: u32,
    vocab: u32,
    ignore_index: InputScalar,
    #[comptime] has_ignore: bool,
    #[comptime] weighted: bool,
    #[comptime] units: u32,
    #[comptime] use_plane: bool,
    #[define(I)] _target: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut weight = 0.0f32;
    let mut counted = 0.0f32;
    let mut out_of_range = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < rows as usize {
        let t = targets[i];
        let mut ignored = false;
        if has_ignore {
            ignored = t == ignore_index.get::<I>();
        }
        let in_range = t >= I::new(0) && t < I::cast_from(vocab);
        if !ignored {
            if in_range {
                counted += 1.0;
                if weighted {
                    weight += class_weight[usize::cast_from(t)];
                } else {
                    weight += 1.0;
                }
            } else {
                out_of_range += 1.0;
            }
        }
        i += CUBE_DIM as usize;
    }
    let weight = cube_reduce(weight, &mut scratch, ReduceOp::Sum, use_plane);
    let counted = cube_reduce(counted, &mut scratch, ReduceOp::Sum, use_plane);
    let out_of_range = cube_reduce(out_of_range, &mut scratch, ReduceOp::Sum, use_plane);
    if UNIT_POS == 0 {
        weight_scale[0] = select(weight == 0.0, 0.0f32, 1.0f32 / weight);
        row_scale[0] = select(counted == 0.0, 0.0f32, 1.0f32 / counted);
        out_of_range_count[0] = out_of_range;
    }
}

/// The statistics of `rows` integer `targets` (i32 or i64, `target_dtype`) a loss needs
/// before its rows run (see [`target_stats_kernel`]), written to `stats` (three `[1]` f32
/// buffers): the mean's scale `1 / Σ w[y]`, the z-loss mean's `1 / n`, and the count of
/// targets that are neither in `[0, vocab)` nor `ignore_index`. `class_weight`: `[vocab]`
/// f32.
pub fn target_stats<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    targets: &Handle,
    class_weight: Option<&Handle>,
    stats: [&Handle; 3],
    rows: usize,
    vocab: usize,
    ignore_index: i64,
    target_dtype: StorageType,
) -> Result<(), KernelError> {
    const OP: &str = "target_stats";
    check_target_dtype(OP, target_dtype)?;
    let vocab = u32::try_from(vocab).map_err(|_| KernelError::Unsupported {
        op: OP,
        reason: format!("a vocabulary of {vocab} classes (at most {})", u32::MAX),
    })?;
    // One cube walks every target (a few thousand integers, read once), as wide as the
    // device allows, so each unit walks few of them.
    let launch = RowLaunch::new(client, 1, rows.max(1), 4, 1, 1, config.reduction);
    let w_dummy = client.empty(4);
    let (has_ignore, ignore) = ignore_index_scalar(ignore_index, target_dtype);
    // Safety: `targets` holds `rows` items, `class_weight` `vocab` (validated by the
    // callers) and is indexed only by targets in `[0, vocab)`; each of `stats` holds 1.
    unsafe {
        target_stats_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            launch.dim(),
            array::<R>(targets, rows.max(1)),
            match class_weight {
                Some(w) => array::<R>(w, vocab as usize),
                None => array::<R>(&w_dummy, 1),
            },
            array::<R>(stats[0], 1),
            array::<R>(stats[1], 1),
            array::<R>(stats[2], 1),
            rows as u32,
            vocab,
            ignore,
            has_ignore,
            class_weight.is_some(),
            launch.units,
            launch.use_plane,
            target_dtype,
        );
    }
    counters::record(Kernel::target_stats);
    Ok(())
}
