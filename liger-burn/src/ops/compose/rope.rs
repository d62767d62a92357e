//! Rotary position embedding as stock Burn ops (in f32, cast back once).
//!
//! `rot` pairs elements as the layout says and maps a pair `(a, b)` to `(-b, a)`:
//! forward `x·cos + rot(x)·sin`; backward, its transpose `g·cos - rot(g·sin)`
//! (`rotᵀ = -rot`), exact for any tables.

use super::{to_dtype, to_f32};
use crate::ops::{RopeGrads, RopeLayout, RopeOutput};
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive, backend::Backend, ops::FloatTensor};

fn tensor<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// `rot(x)` over the last dimension of `x: [b, h, s, d]`.
fn rotate<B: Backend>(x: Tensor<B, 4>, layout: RopeLayout) -> Tensor<B, 4> {
    let [b, h, s, d] = x.dims();
    match layout {
        RopeLayout::RotateHalf => {
            let first = x.clone().narrow(3, 0, d / 2);
            let second = x.narrow(3, d / 2, d / 2);
            Tensor::cat(vec![second.neg(), first], 3)
        }
        RopeLayout::Interleaved => {
            let pairs = x.reshape([b, h, s, d / 2, 2]);
            let even = pairs.clone().narrow(4, 0, 1);
            let odd = pairs.narrow(4, 1, 1);
            Tensor::cat(vec![odd.neg(), even], 4).reshape([b, h, s, d])
        }
    }
}

/// `[bc, s, d]` → f32 `[bc, 1, s, d]`, broadcasting over heads.
fn table<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 4> {
    tensor::<B, 3>(to_f32::<B>(t)).unsqueeze_dim(1)
}

fn apply<B: Backend>(
    x: FloatTensor<B>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
    layout: RopeLayout,
    backward: bool,
) -> FloatTensor<B> {
    let dtype = x.dtype();
    let x = tensor::<B, 4>(to_f32::<B>(x));
    let out = if backward {
        x.clone() * cos.clone() - rotate(x * sin.clone(), layout)
    } else {
        x.clone() * cos.clone() + rotate(x, layout) * sin.clone()
    };
    to_dtype::<B>(out.into_primitive().tensor(), dtype)
}

/// Forward: `(q·cos + rot(q)·sin, k·cos + rot(k)·sin)`.
pub fn forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    layout: RopeLayout,
) -> RopeOutput<B> {
    let (cos, sin) = (table::<B>(cos), table::<B>(sin));
    RopeOutput {
        q: apply::<B>(q, &cos, &sin, layout, false),
        k: apply::<B>(k, &cos, &sin, layout, false),
    }
}

/// Backward: `g·cos - rot(g·sin)` for each gradient given.
pub fn backward<B: Backend>(
    grad_q: Option<FloatTensor<B>>,
    grad_k: Option<FloatTensor<B>>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    layout: RopeLayout,
) -> RopeGrads<B> {
    if grad_q.is_none() && grad_k.is_none() {
        return RopeGrads {
            grad_q: None,
            grad_k: None,
        };
    }
    let (cos, sin) = (table::<B>(cos), table::<B>(sin));
    RopeGrads {
        grad_q: grad_q.map(|g| apply::<B>(g, &cos, &sin, layout, true)),
        grad_k: grad_k.map(|g| apply::<B>(g, &cos, &sin, layout, true)),
    }
}
