//! Softmax and log-softmax over the last dimension, forward and backward.
//!
//! Forward reads each row twice: once with an online max/sum (each unit rescales its
//! running sum when its max grows, then the cube combines), once to write
//! `exp(x - max) / sum` or `x - max - ln(sum)`. Backward works from the saved output:
//! softmax `dx = y · (dy - Σ dy·y)`, log-softmax `dx = dy - exp(y) · Σ dy`.

use crate::counters::{self, Kernel};
use crate::launch::{KernelError, LaunchConfig, RowLaunch, array, check_float_dtype};
use crate::reduce::{
    ReduceOp, cube_reduce, nan_max, online_update, shifted_exp, vector_max, vector_sum,
};
use cubecl::prelude::*;
use cubecl::server::Handle;

#[cube(launch_unchecked)]
fn softmax_forward_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    output: &mut Array<Vector<F, N>>,
    rows: u32,
    vectors: u32,
    #[comptime] log: bool,
    #[comptime] units: u32,
    #[comptime] cached_chunks: u32,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let mut cache = Array::<Vector<f32, N>>::new(comptime!(cached_chunks.max(1) as usize));
    let vectors = vectors as usize;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        // A finite floor instead of -inf: WGSL rejects infinite literals.
        let mut local_max = f32::min_value();
        let mut local_sum = 0.0f32;
        if cached_chunks > 0 {
            // Max first, then one exp per element: softmax keeps exp(x - local_max) in
            // registers and rescales it in the second pass instead of exponentiating again.
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    let v = Vector::<f32, N>::cast_from(x[base + j]);
                    cache[c as usize] = v;
                    local_max = nan_max(local_max, vector_max::<N>(v));
                }
            }
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    let e = shifted_exp::<N>(cache[c as usize] - Vector::new(local_max));
                    local_sum += vector_sum::<N>(e);
                    if !log {
                        cache[c as usize] = e;
                    }
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                online_update::<N>(
                    Vector::<f32, N>::cast_from(x[base + j]),
                    &mut local_max,
                    &mut local_sum,
                );
                j += CUBE_DIM as usize;
            }
        }
        let row_max = cube_reduce(local_max, &mut scratch, ReduceOp::Max, use_plane);
        let rescaled = local_sum * f32::exp(local_max - row_max);
        let row_sum = cube_reduce(rescaled, &mut scratch, ReduceOp::Sum, use_plane);
        // log: y = x - (max + ln(sum)); else y = exp(x - max) / sum.
        let shift = if log {
            row_max + f32::ln(row_sum)
        } else {
            row_max
        };
        let inv = 1.0f32 / row_sum;
        if cached_chunks > 0 {
            let scale = Vector::<f32, N>::new(f32::exp(local_max - row_max) * inv);
            #[unroll]
            for c in 0..cached_chunks {
                let j = UNIT_POS as usize + c as usize * units as usize;
                if j < vectors {
                    if log {
                        output[base + j] =
                            Vector::<F, N>::cast_from(cache[c as usize] - Vector::new(shift));
                    } else {
                        output[base + j] = Vector::<F, N>::cast_from(cache[c as usize] * scale);
                    }
                }
            }
        } else {
            let mut j = UNIT_POS as usize;
            while j < vectors {
                output[base + j] = softmax_value::<F, N>(
                    Vector::<f32, N>::cast_from(x[base + j]),
                    shift,
                    inv,
                    log,
                );
                j += CUBE_DIM as usize;
            }
        }
        row += CUBE_COUNT;
    }
}

#[cube]
fn softmax_value<F: Float, N: Size>(
    v: Vector<f32, N>,
    shift: f32,
    inv: f32,
    #[comptime] log: bool,
) -> Vector<F, N> {
    if log {
        Vector::<F, N>::cast_from(v - Vector::new(shift))
    } else {
        Vector::<F, N>::cast_from(shifted_exp::<N>(v - Vector::new(shift)) * Vector::new(inv))
    }
}

#[cube(launch_unchecked)]
fn softmax_backward_kernel<F: Float, N: Size>(
    grad: &Array<Vector<F, N>>,
    output: &Array<Vector<F, N>>,
    grad_x: &mut Array<Vector<F, N>>,
    rows: u32,
    vectors: u32,
    #[comptime] log: bool,
    #[comptime] units: u32,
    #[comptime] use_plane: bool,
    #[define(F)] _dtype: StorageType,
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let vectors = vectors as usize;
    let mut row = CUBE_POS;
    while row < rows as usize {
        let base = row * vectors;
        let mut acc = 0.0f32;
        let mut j = UNIT_POS as usize;
        while j < vectors {
            let g = Vector::<f32, N>::cast_from(grad[base + j]);
            if log {
                acc += vector_sum::<N>(g);
            } else {
                acc += vector_sum::<N>(g * Vector::<f32, N>::cast_from(output[base + j]));
            }
            j += CUBE_DIM as usize;
        }
        let total = Vector::<f32, N>::new(cube_reduce(acc, &mut scratch, ReduceOp::Sum, use_plane));
        let mut j = UNIT_POS as usize;
        while j < vectors {
            let g = Vector::<f32, N>::cast_from(grad[base + j]);
            let y = Vector::<f32, N>::cast_from(output[base + j]);
            let dx = if log {
                g - Vector::exp(y) * total
            } else {
                y * (g - total)
            };
            grad_x[base + j] = Vector::<F, N>::cast_from(dx);
            j += CUBE_DIM as usize;
        }
        row += CUBE_COUNT;
    }
}

/// Softmax (`log = false`) or log-softmax (`log = true`) forward.
/// `x, output: [rows, width]` of `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn softmax_forward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    x: &Handle,
    output: &Handle,
    rows: usize,
    width: usize,
    log: bool,
    dtype: StorageType,
) -> Result<(), KernelError> {
    check_float_dtype(if log { "log_softmax" } else { "softmax" }, dtype)?;
    let launch = RowLaunch::new(
        client,
        rows,
        width,
        dtype.size(),
        usize::MAX,
        config.softmax_forward_vectors_per_unit,
        config.reduction,
    );
    let n = rows * launch.vectors(width);
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        softmax_forward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(x, n),
            array(output, n),
            rows as u32,
            launch.vectors(width) as u32,
            log,
            launch.units,
            launch.cached_chunks(width),
            launch.use_plane,
            dtype,
        );
    }
    counters::record(if log {
        Kernel::log_softmax_forward
    } else {
        Kernel::softmax_forward
    });
    Ok(())
}

/// Softmax or log-softmax backward from the forward's output.
/// `grad, output, grad_x: [rows, width]` of `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn softmax_backward<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    grad: &Handle,
    output: &Handle,
    grad_x: &Handle,
    rows: usize,
    width: usize,
    log: bool,
    dtype: StorageType,
) -> Result<(), KernelError> {
    check_float_dtype(
        if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        },
        dtype,
    )?;
    let launch = RowLaunch::new(
        client,
        rows,
        width,
        dtype.size(),
        usize::MAX,
        config.forward_vectors_per_unit,
        config.reduction,
    );
    let n = rows * launch.vectors(width);
    // Safety: every array length above is the item count of a buffer sized for
    // exactly these rows and widths (validated by the callers); indices stay below them.
    unsafe {
        softmax_backward_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            array(grad, n),
            array(output, n),
            array(grad_x, n),
            rows as u32,
            launch.vectors(width) as u32,
            log,
            launch.units,
            launch.use_plane,
            dtype,
        );
    }
    counters::record(if log {
        Kernel::log_softmax_backward
    } else {
        Kernel::softmax_backward
    });
    Ok(())
}
