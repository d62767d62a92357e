//! RoPE on CubeCL tensors: q and k (or their gradients) rotated in one launch.
//!
//! q and k are read through their strides when the last dimension is dense (the usual
//! `[b, s, h, d] → swap_dims(1, 2)` view needs no copy); otherwise they are made
//! contiguous first. The vector width is the widest that divides half the head dim
//! (rotate-half) or the head dim (interleaved) and every stride and buffer offset.

use super::{empty_like, launched};
use crate::ops::RopeLayout;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::rope::{
    RopeKernelLayout, RopeOperand, RopeProblem, rope as launch_rope, rope_vector_size,
};

/// A rotated tensor ready for the kernel: dense along the last dimension.
struct Prepared<R: CubeRuntime> {
    input: CubeTensor<R>,
    /// Batch, head and position strides in elements (`0` for a dimension of size one).
    strides: [usize; 3],
    output: CubeTensor<R>,
}

fn operand<R: CubeRuntime>(p: &Prepared<R>) -> RopeOperand<'_> {
    RopeOperand {
        input: &p.input.handle,
        strides: p.strides,
        heads: p.input.shape()[1],
        output: &p.output.handle,
    }
}

fn prepare<R: CubeRuntime>(x: CubeTensor<R>) -> Prepared<R> {
    let shape = x.shape();
    let dense_last = shape[3] == 1 || x.meta.strides()[3] == 1;
    let x = if dense_last { x } else { into_contiguous(x) };
    let strides = [0, 1, 2].map(|i| {
        if shape[i] == 1 {
            0
        } else {
            x.meta.strides()[i]
        }
    });
    let output = empty_like(&x, shape, x.dtype);
    Prepared {
        input: x,
        strides,
        output,
    }
}

/// Rotates q and/or k (forward, or backward with their gradients); returns the rotated
/// tensors, contiguous `[batch, heads, seq, head_dim]`, present where the input is.
pub(crate) fn rope<R: CubeRuntime>(
    q: Option<CubeTensor<R>>,
    k: Option<CubeTensor<R>>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    layout: RopeLayout,
    backward: bool,
) -> (Option<CubeTensor<R>>, Option<CubeTensor<R>>) {
    if q.is_none() && k.is_none() {
        return (None, None);
    }
    let shape: Shape = q.as_ref().or(k.as_ref()).map(|t| t.shape()).unwrap();
    let (batch, seq, head_dim) = (shape[0], shape[2], shape[3]);
    let cos = into_contiguous(cos);
    let sin = into_contiguous(sin);
    let tables_batched = cos.shape()[0] != 1;
    let q = q.map(prepare);
    let k = k.map(prepare);
    let any = &q.as_ref().or(k.as_ref()).unwrap().input;
    let (client, dtype) = (any.client.clone(), any.dtype);
    let kernel_layout = match layout {
        RopeLayout::RotateHalf => RopeKernelLayout::RotateHalf,
        RopeLayout::Interleaved => RopeKernelLayout::Interleaved,
    };
    let elem = dtype.size();
    // Every stride (in elements) and offset (in bytes) must be a whole number of vectors.
    let offsets = q
        .iter()
        .chain(k.iter())
        .map(|p| &p.input)
        .chain([&cos, &sin])
        .map(|t| t.handle.offset_start.unwrap_or(0) as usize / elem.max(1))
        .chain(q.iter().chain(k.iter()).flat_map(|p| p.strides))
        .collect::<Vec<_>>();
    let mut vector_size = rope_vector_size(&client, head_dim, kernel_layout, elem);
    while vector_size > 1 && offsets.iter().any(|o| o % vector_size != 0) {
        vector_size /= 2;
    }
    launched(launch_rope::<R>(
        &client,
        &super::launch_config(&client),
        q.as_ref().map(operand),
        k.as_ref().map(operand),
        &cos.handle,
        &sin.handle,
        RopeProblem {
            batch,
            seq,
            head_dim,
            tables_batched,
            layout: kernel_layout,
            backward,
            vector_size,
        },
        dtype.into(),
    ));
    (q.map(|p| p.output), k.map(|p| p.output))
}
