//! RMSNorm forward (optionally fused with the residual add) and backward.
//!
//! Forward: `y = x * rstd * (offset + w)` with `rstd = 1 / sqrt(mean(x²) + eps)` in f32.
//! Llama casting rounds `x * rstd` to the input dtype before the weight multiply; Gemma
//! casting keeps everything in f32 and rounds once. Backward:
//! `dx = rstd * (m - x̂ · mean(m · x̂))` with `m = dy · (offset + w)`, `x̂ = x · rstd`, and
//! `dw = Σ_rows dy · x̂`, accumulated per cube in f32 and summed by [`crate::partial_sum`].

use crate::counters::{self, Kernel};
use crate::launch::{KernelError, LaunchConfig, RowLaunch, array, check_float_dtype};
use crate::partial_sum::sum_partials;
use crate::reduce::{ReduceOp, cube_reduce, vector_sum};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// `x · rstd · (offset + w)` in the requested casting, for one vector.
#[cube]
fn normalize_scale<F: Float, N: Size>(
    x: Vector<f32, N>,
    w: Vector<F, N>,
    rstd: f32,
    offset: f32,
    #[comptime] gemma: bool,
) -> Vector<F, N> {
    let normalized = x * Vector::new(rstd);
    if gemma {
        let scale = Vector::<f32, N>::cast_from(w) + Vector::new(offset);
        Vector::<F, N>::cast_from(normalized * scale)
    } else {
        let scale = w + Vector::<F, N>::cast_from(Vector::<f32, N>::new(offset));
        Vector::<F, N>::cast_from(normalized) * scale
    }
}

#[cube(launch_unchecked)]
fn rms_norm_forward_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    residual: &Array<Vector<F, N>>,
    weight: &Array<Vector<F, N>>,
    output: &mut Array<Vector<F, N>>,
    sum: &mut Array<Vector<F, N>>,
    rstd: &mut Array<f32>,
    rows: u32,
    vectors: u32,
    eps: f32,
    offset: f32,
    #[comptime] add_residual: bool,
    #[comptime] gemma: bool,
    #[comptime] units: u32,
    #[comptime] cached_chunks: u32,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    // With `cached_chunks > 0` each unit keeps its slice of the row in registers between
    // the two passes, so x is read from memory once.
    let mut cache = Array::<Vector<f32, N>>::new(comptime!(cached_chunks.max(1) as usize));
    let vectors = vectors as usize;
    let width = (vectors * N::value()) as f32;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let mut acc = 0.0f32;
        if cached_chunks > 0 {
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    let vf = load_sum::<F, N>(x, residual, sum, base + j, add_residual);
                    cache[c as usize] = vf;
                    acc += vector_sum::<N>(vf * vf);
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                let vf = load_sum::<F, N>(x, residual, sum, base + j, add_residual);
                acc += vector_sum::<N>(vf * vf);
                j += CUBE_DIM as usize;
            }
        }
        let total = cube_reduce(acc, &mut scratch, ReduceOp::Sum, use_plane);
        let r = 1.0f32 / f32::sqrt(total / width + eps);
        if UNIT_POS == 0 {
            rstd[row] = r;
        }
        if cached_chunks > 0 {
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    output[base + j] =
                        normalize_scale::<F, N>(cache[c as usize], weight[j], r, offset, gemma);
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                let v = if add_residual {
                    sum[base + j]
                } else {
                    x[base + j]
                };
                output[base + j] = normalize_scale::<F, N>(
                    Vector::<f32, N>::cast_from(v),
                    weight[j],
                    r,
                    offset,
                    gemma,
                );
                j += CUBE_DIM as usize;
            }
        }
        row += CUBE_COUNT;
    }
}

/// Loads `x[i]` (or `x[i] + residual[i]`, rounded to the input dtype as the unfused add
/// would be, and stored to `sum[i]`) as f32.
#[cube]
fn load_sum<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    residual: &Array<Vector<F, N>>,
    sum: &mut Array<Vector<F, N>>,
    i: usize,
    #[comptime] add_residual: bool,
) -> Vector<f32, N> {
    let mut v = x[i];
    if add_residual {
        v = v + residual[i];
        sum[i] = v;
    }
    Vector::<f32, N>::cast_from(v)
}

// `g`/`n` get a placeholder before the comptime choice of where to read them from.
#[allow(unused_assignments)]
#[cube(launch_unchecked)]
fn rms_norm_backward_kernel<F: Float, N: Size>(
    grad: &Array<Vector<F, N>>,
    x: &Array<Vector<F, N>>,
    weight: &Array<Vector<F, N>>,
    rstd: &Array<f32>,
    grad_x: &mut Array<Vector<F, N>>,
    grad_w_partials: &mut Array<Vector<f32, N>>,
    rows: u32,
    vectors: u32,
    offset: f32,
    #[comptime] gemma: bool,
    #[comptime] units: u32,
    #[comptime] chunks: u32,
    #[comptime] cached: bool,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut dw = Array::<Vector<f32, N>>::new(chunks as usize);
    // When `cached`, dy and x̂ stay in registers between the passes (read once).
    let cache_len = comptime!(if cached { chunks as usize } else { 1usize });
    let mut g_cache = Array::<Vector<f32, N>>::new(cache_len);
    let mut n_cache = Array::<Vector<f32, N>>::new(cache_len);
    #[unroll]
    for c in 0..chunks {
        dw[c as usize] = Vector::new(0.0);
    }
    let vectors = vectors as usize;
    let width = (vectors * N::value()) as f32;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let r = rstd[row];
        let mut acc = 0.0f32;
        #[unroll]
        for c in 0..chunks {
            let j = UNIT_POS as usize + c as usize * units as usize;
            if j < vectors {
                let g = Vector::<f32, N>::cast_from(grad[base + j]);
                let n = Vector::<f32, N>::cast_from(x[base + j]) * Vector::new(r);
                let m = g * (Vector::<f32, N>::cast_from(weight[j]) + Vector::new(offset));
                acc += vector_sum::<N>(m * n);
                if cached {
                    g_cache[c as usize] = g;
                    n_cache[c as usize] = n;
                }
            }
        }
        let dot = cube_reduce(acc, &mut scratch, ReduceOp::Sum, use_plane) / width;
        #[unroll]
        for c in 0..chunks {
            let j = UNIT_POS as usize + c as usize * units as usize;
            if j < vectors {
                let mut g = Vector::<f32, N>::new(0.0);
                let mut n = Vector::<f32, N>::new(0.0);
                if cached {
                    g = g_cache[c as usize];
                    n = n_cache[c as usize];
                } else {
                    g = Vector::<f32, N>::cast_from(grad[base + j]);
                    n = Vector::<f32, N>::cast_from(x[base + j]) * Vector::new(r);
                }
                let m = g * (Vector::<f32, N>::cast_from(weight[j]) + Vector::new(offset));
                grad_x[base + j] =
                    Vector::<F, N>::cast_from((m - n * Vector::new(dot)) * Vector::new(r));
                if gemma {
                    dw[c as usize] += g * n;
                } else {
                    // Llama casting multiplies the weight by x̂ rounded to the input dtype.
                    dw[c as usize] += g * Vector::<f32, N>::cast_from(Vector::<F, N>::cast_from(n));
                }
            }
        }
        row += CUBE_COUNT;
    }
    #[unroll]
    for c in 0..chunks {
        let j = UNIT_POS as usize + c as usize * units as usize;
        if j < vectors {
            grad_w_partials[CUBE_POS * vectors + j] = dw[c as usize];
        }
    }
}

/// Options the RMSNorm kernels take.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormKernelOptions {
    /// Added to the mean square.
    pub eps: f32,
    /// Added to the weight.
    pub offset: f32,
    /// Gemma casting (all f32) instead of Llama casting.
    pub gemma: bool,
}

/// RMSNorm forward over `rows` contiguous rows of `width`.
///
/// `x, output: [rows, width]`, `weight: [width]`, all of `dtype`; `rstd: [rows]` f32.
/// With `residual = Some((residual, sum))`, normalizes `sum = x + residual` and writes it.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    x: &Handle,
    residual: Option<(&Handle, &Handle)>,
    weight: &Handle,
    output: &Handle,
    rstd: &Handle,
    rows: usize,
    width: usize,
    options: RmsNormKernelOptions,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let op = if residual.is_some() {
        "fused_add_rms_norm"
    } else {
        "rms_norm"
    };
    check_float_dtype(op, dtype)?;
    let launch = RowLaunch::new(
        client,
        rows,
        width,
        dtype.size(),
        usize::MAX,
        config.forward_vectors_per_unit,
        config.reduction,
    );
    let vectors = launch.vectors(width);
    let n = rows * vectors;
    // Without a residual the two extra bindings are never touched (comptime branch); they
    // point at a one-element scratch buffer so no buffer is bound twice.
    let dummy;
    let (residual_arg, sum_arg) = match residual {
        Some((res, sum)) => (array(res, n), array(sum, n)),
        None => {
            dummy = client.empty(dtype.size() * launch.vector_size);
            (array(&dummy, 1), array(&dummy, 1))
        }
    };
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        rms_norm_forward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(x, n),
            residual_arg,
            array(weight, vectors),
            array(output, n),
            sum_arg,
            array(rstd, rows),
            rows as u32,
            vectors as u32,
            options.eps,
            options.offset,
            residual.is_some(),
            options.gemma,
            launch.units,
            launch.cached_chunks(width),
            launch.use_plane,
            dtype,
        );
    }
    counters::record(if residual.is_some() {
        Kernel::add_rms_norm_forward
    } else {
        Kernel::rms_norm_forward
    });
    Ok(())
}

/// RMSNorm backward: writes `grad_x` (`[rows, width]`, `dtype`) and `grad_weight`
/// (`[width]`, `weight_dtype`... the same `dtype`).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    x: &Handle,
    weight: &Handle,
    rstd: &Handle,
    grad_x: &Handle,
    grad_weight: &Handle,
    rows: usize,
    width: usize,
    options: RmsNormKernelOptions,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let (launch, chunks) =
        RowLaunch::backward("rms_norm_backward", client, config, rows, width, dtype)?;
    let vectors = launch.vectors(width);
    let n = rows * vectors;
    let parts = launch.cubes as usize;
    let partials = client.empty(parts * width * core::mem::size_of::<f32>());
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        rms_norm_backward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(grad, n),
            array(x, n),
            array(weight, vectors),
            array(rstd, rows),
            array(grad_x, n),
            array(&partials, parts * vectors),
            rows as u32,
            vectors as u32,
            options.offset,
            options.gemma,
            launch.units,
            chunks as u32,
            launch.cached_chunks(width) > 0,
            launch.use_plane,
            dtype,
        );
    }
    sum_partials(
        client,
        &partials,
        grad_weight,
        parts,
        width,
        launch.vector_size,
        dtype,
    );
    counters::record(Kernel::rms_norm_backward);
    Ok(())
}
