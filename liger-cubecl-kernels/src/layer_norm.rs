//! LayerNorm forward and backward over the last dimension.
//!
//! Forward: one read for the statistics (sums shifted by the row's first element, so
//! the variance keeps its precision when the mean is large), one read to write
//! `y = (x - mean) · rstd · γ + β`. Backward: `x̂ = (x - mean) · rstd`, `g = dy · γ`,
//! `dx = rstd · (g - x̂ · mean(g · x̂) - mean(g))`, `dγ = Σ dy · x̂`, `dβ = Σ dy`, the
//! last two accumulated per cube in f32 and summed by [`crate::partial_sum`].

use crate::counters::{self, Kernel};
use crate::launch::{KernelError, LaunchConfig, RowLaunch, array, check_float_dtype};
use crate::partial_sum::sum_partials;
use crate::reduce::{ReduceOp, cube_reduce, vector_sum};
use cubecl::prelude::*;
use cubecl::server::Handle;

#[cube(launch_unchecked)]
fn layer_norm_forward_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    beta: &Array<Vector<F, N>>,
    output: &mut Array<Vector<F, N>>,
    mean: &mut Array<f32>,
    rstd: &mut Array<f32>,
    rows: u32,
    vectors: u32,
    eps: f32,
    #[comptime] has_bias: bool,
    #[comptime] units: u32,
    #[comptime] cached_chunks: u32,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut cache = Array::<Vector<f32, N>>::new(comptime!(cached_chunks.max(1) as usize));
    let vectors = vectors as usize;
    let width = (vectors * N::value()) as f32;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let first = Vector::<f32, N>::cast_from(x[base]);
        let shift = Vector::<f32, N>::new(first[0]);
        let mut s1 = 0.0f32;
        let mut s2 = 0.0f32;
        if cached_chunks > 0 {
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    let xf = Vector::<f32, N>::cast_from(x[base + j]);
                    cache[c as usize] = xf;
                    let v = xf - shift;
                    s1 += vector_sum::<N>(v);
                    s2 += vector_sum::<N>(v * v);
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                let v = Vector::<f32, N>::cast_from(x[base + j]) - shift;
                s1 += vector_sum::<N>(v);
                s2 += vector_sum::<N>(v * v);
                j += CUBE_DIM as usize;
            }
        }
        let t1 = cube_reduce(s1, &mut scratch, ReduceOp::Sum, use_plane) / width;
        let t2 = cube_reduce(s2, &mut scratch, ReduceOp::Sum, use_plane) / width;
        // Clamps rounding below zero; a NaN (a row holding NaN or an infinity: inf - inf)
        // stays NaN, as PyTorch's variance does (`f32::max` would drop it on some devices).
        let spread = t2 - t1 * t1;
        let var = select(spread < 0.0, 0.0f32, spread);
        let m = first[0] + t1;
        let r = 1.0f32 / f32::sqrt(var + eps);
        if UNIT_POS == 0 {
            mean[row] = m;
            rstd[row] = r;
        }
        if cached_chunks > 0 {
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    output[base + j] =
                        layer_norm_scale::<F, N>(cache[c as usize], gamma, beta, j, m, r, has_bias);
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                let xf = Vector::<f32, N>::cast_from(x[base + j]);
                output[base + j] = layer_norm_scale::<F, N>(xf, gamma, beta, j, m, r, has_bias);
                j += CUBE_DIM as usize;
            }
        }
        row += CUBE_COUNT;
    }
}

/// `(x - mean) · rstd · γ[j] + β[j]` for one vector.
#[cube]
fn layer_norm_scale<F: Float, N: Size>(
    xf: Vector<f32, N>,
    gamma: &Array<Vector<F, N>>,
    beta: &Array<Vector<F, N>>,
    j: usize,
    mean: f32,
    rstd: f32,
    #[comptime] has_bias: bool,
) -> Vector<F, N> {
    let normalized = (xf - Vector::new(mean)) * Vector::new(rstd);
    let mut y = normalized * Vector::<f32, N>::cast_from(gamma[j]);
    if has_bias {
        y += Vector::<f32, N>::cast_from(beta[j]);
    }
    Vector::<F, N>::cast_from(y)
}

#[cube(launch_unchecked)]
fn layer_norm_backward_kernel<F: Float, N: Size>(
    grad: &Array<Vector<F, N>>,
    x: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    grad_x: &mut Array<Vector<F, N>>,
    grad_gamma_partials: &mut Array<Vector<f32, N>>,
    grad_beta_partials: &mut Array<Vector<f32, N>>,
    rows: u32,
    vectors: u32,
    #[comptime] has_bias: bool,
    #[comptime] units: u32,
    #[comptime] chunks: u32,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut dgamma = Array::<Vector<f32, N>>::new(chunks as usize);
    let mut dbeta = Array::<Vector<f32, N>>::new(chunks as usize);
    #[unroll]
    for c in 0..chunks {
        dgamma[c as usize] = Vector::new(0.0);
        dbeta[c as usize] = Vector::new(0.0);
    }
    let vectors = vectors as usize;
    let width = (vectors * N::value()) as f32;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let m = Vector::<f32, N>::new(mean[row]);
        let r = Vector::<f32, N>::new(rstd[row]);
        let mut s1 = 0.0f32;
        let mut s2 = 0.0f32;
        #[unroll]
        for c in 0..chunks {
            let j = UNIT_POS as usize + c as usize * units as usize;
            if j < vectors {
                let xhat = (Vector::<f32, N>::cast_from(x[base + j]) - m) * r;
                let g = Vector::<f32, N>::cast_from(grad[base + j])
                    * Vector::<f32, N>::cast_from(gamma[j]);
                s1 += vector_sum::<N>(g * xhat);
                s2 += vector_sum::<N>(g);
            }
        }
        let c1 =
            Vector::<f32, N>::new(cube_reduce(s1, &mut scratch, ReduceOp::Sum, use_plane) / width);
        let c2 =
            Vector::<f32, N>::new(cube_reduce(s2, &mut scratch, ReduceOp::Sum, use_plane) / width);
        #[unroll]
        for c in 0..chunks {
            let j = UNIT_POS as usize + c as usize * units as usize;
            if j < vectors {
                let dy = Vector::<f32, N>::cast_from(grad[base + j]);
                let xhat = (Vector::<f32, N>::cast_from(x[base + j]) - m) * r;
                let g = dy * Vector::<f32, N>::cast_from(gamma[j]);
                grad_x[base + j] = Vector::<F, N>::cast_from((g - xhat * c1 - c2) * r);
                dgamma[c as usize] += dy * xhat;
                if has_bias {
                    dbeta[c as usize] += dy;
                }
            }
        }
        row += CUBE_COUNT;
    }
    #[unroll]
    for c in 0..chunks {
        let j = UNIT_POS as usize + c as usize * units as usize;
        if j < vectors {
            grad_gamma_partials[CUBE_POS * vectors + j] = dgamma[c as usize];
            if has_bias {
                grad_beta_partials[CUBE_POS * vectors + j] = dbeta[c as usize];
            }
        }
    }
}

/// LayerNorm forward. `x, output: [rows, width]`, `gamma, beta: [width]` (all `dtype`),
/// `mean, rstd: [rows]` f32.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    x: &Handle,
    gamma: &Handle,
    beta: Option<&Handle>,
    output: &Handle,
    mean: &Handle,
    rstd: &Handle,
    rows: usize,
    width: usize,
    eps: f32,
    dtype: StorageType,
) -> Result<(), KernelError> {
    check_float_dtype("layer_norm", dtype)?;
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
    let dummy;
    let beta_arg = match beta {
        Some(beta) => array(beta, vectors),
        None => {
            dummy = client.empty(dtype.size() * launch.vector_size);
            array(&dummy, 1)
        }
    };
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        layer_norm_forward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(x, n),
            array(gamma, vectors),
            beta_arg,
            array(output, n),
            array(mean, rows),
            array(rstd, rows),
            rows as u32,
            vectors as u32,
            eps,
            beta.is_some(),
            launch.units,
            launch.cached_chunks(width),
            launch.use_plane,
            dtype,
        );
    }
    counters::record(Kernel::layer_norm_forward);
    Ok(())
}

/// LayerNorm backward: writes `grad_x: [rows, width]`, `grad_gamma: [width]` and, when
/// `grad_beta` is given, `grad_beta: [width]`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    x: &Handle,
    gamma: &Handle,
    mean: &Handle,
    rstd: &Handle,
    grad_x: &Handle,
    grad_gamma: &Handle,
    grad_beta: Option<&Handle>,
    rows: usize,
    width: usize,
    dtype: StorageType,
) -> Result<(), KernelError> {
    let (launch, chunks) =
        RowLaunch::backward("layer_norm_backward", client, config, rows, width, dtype)?;
    let vectors = launch.vectors(width);
    let n = rows * vectors;
    let parts = launch.cubes as usize;
    let partial_bytes = parts * width * core::mem::size_of::<f32>();
    let gamma_partials = client.empty(partial_bytes);
    let beta_partials = if grad_beta.is_some() {
        client.empty(partial_bytes)
    } else {
        client.empty(4 * launch.vector_size)
    };
    let beta_len = if grad_beta.is_some() {
        parts * vectors
    } else {
        1
    };
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        layer_norm_backward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(grad, n),
            array(x, n),
            array(gamma, vectors),
            array(mean, rows),
            array(rstd, rows),
            array(grad_x, n),
            array(&gamma_partials, parts * vectors),
            array(&beta_partials, beta_len),
            rows as u32,
            vectors as u32,
            grad_beta.is_some(),
            launch.units,
            chunks as u32,
            launch.use_plane,
            dtype,
        );
    }
    sum_partials(
        client,
        &gamma_partials,
        grad_gamma,
        parts,
        width,
        launch.vector_size,
        dtype,
    );
    if let Some(grad_beta) = grad_beta {
        sum_partials(
            client,
            &beta_partials,
            grad_beta,
            parts,
            width,
            launch.vector_size,
            dtype,
        );
    }
    counters::record(Kernel::layer_norm_backward);
    Ok(())
}
