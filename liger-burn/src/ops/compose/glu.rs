//! Gated linear units `act(gate) * up` (SwiGLU, GeGLU), forward and backward, as stock
//! Burn ops computed in f32 and rounded once to the input dtype (like the kernel).

use super::activation::sigmoid_f32;
use super::{to_dtype, to_f32};
use crate::ops::{FusedOps, GluActivation, GluGrads};
use burn::tensor::{Shape, TensorMetadata, backend::Backend, ops::FloatTensor};

/// `√(2/π)`.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const COEFF: f64 = 0.044_715;

/// `act(x)` and `act'(x)` for f32 `x`.
fn value_and_grad<B: Backend>(
    x: FloatTensor<B>,
    activation: GluActivation,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let one_minus = |t: FloatTensor<B>| B::float_add_scalar(B::float_neg(t), 1.0.into());
    match activation {
        GluActivation::Silu => {
            // silu = x σ, silu' = σ (1 + x (1 - σ))
            let s = sigmoid_f32::<B>(x.clone());
            let value = B::float_mul(x.clone(), s.clone());
            let inner = B::float_add_scalar(B::float_mul(x, one_minus(s.clone())), 1.0.into());
            (value, B::float_mul(s, inner))
        }
        GluActivation::GeluTanh => {
            // g = x (1 + t) / 2 with t = tanh(√(2/π) (x + c x³)):
            // g' = (1 + t) / 2 + x (1 - t²) / 2 · √(2/π) (1 + 3 c x²)
            let x2 = B::float_mul(x.clone(), x.clone());
            let cubic = B::float_mul_scalar(B::float_mul(x2.clone(), x.clone()), COEFF.into());
            let arg = B::float_mul_scalar(B::float_add(x.clone(), cubic), SQRT_2_OVER_PI.into());
            let t = B::float_tanh(arg);
            let half_one_plus =
                B::float_mul_scalar(B::float_add_scalar(t.clone(), 1.0.into()), 0.5.into());
            let value = B::float_mul(x.clone(), half_one_plus.clone());
            let sech2 = one_minus(B::float_mul(t.clone(), t));
            let darg = B::float_mul_scalar(
                B::float_add_scalar(B::float_mul_scalar(x2, (3.0 * COEFF).into()), 1.0.into()),
                SQRT_2_OVER_PI.into(),
            );
            let tail = B::float_mul_scalar(B::float_mul(B::float_mul(x, sech2), darg), 0.5.into());
            (value, B::float_add(half_one_plus, tail))
        }
    }
}

/// `act(gate) * up`.
pub fn forward<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    activation: GluActivation,
) -> FloatTensor<B> {
    let dtype = gate.dtype();
    let (value, _) = value_and_grad::<B>(to_f32::<B>(gate), activation);
    to_dtype::<B>(B::float_mul(value, to_f32::<B>(up)), dtype)
}

/// `grad_gate = grad * up * act'(gate)`, `grad_up = grad * act(gate)`.
pub fn backward<B: Backend>(
    grad: FloatTensor<B>,
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    activation: GluActivation,
) -> GluGrads<B> {
    let dtype = gate.dtype();
    let g = to_f32::<B>(grad);
    let (value, derivative) = value_and_grad::<B>(to_f32::<B>(gate), activation);
    let grad_gate = B::float_mul(B::float_mul(g.clone(), to_f32::<B>(up)), derivative);
    let grad_up = B::float_mul(g, value);
    GluGrads {
        grad_gate: to_dtype::<B>(grad_gate, dtype),
        grad_up: to_dtype::<B>(grad_up, dtype),
    }
}

/// `x: [..., k]` as `[rows, k]` (a view of a contiguous tensor), and its dimensions.
pub(crate) fn as_rows<B: Backend>(x: FloatTensor<B>) -> (FloatTensor<B>, Vec<usize>) {
    let dims = x.shape().as_slice().to_vec();
    let k = *dims.last().expect("rank ≥ 1");
    let rows = dims.iter().product::<usize>() / k.max(1);
    (B::float_reshape(x, Shape::new([rows, k])), dims)
}

/// `x: [..., k]` times `weight: [k, n]` → `[..., n]`: one product over all rows
/// ([`FusedOps::fused_matmul`]).
pub fn rows_times<B: FusedOps>(x: FloatTensor<B>, weight: FloatTensor<B>) -> FloatTensor<B> {
    let (x, mut dims) = as_rows::<B>(x);
    *dims.last_mut().expect("rank ≥ 1") = weight.shape()[1];
    B::float_reshape(B::fused_matmul(x, weight), Shape::from(dims))
}

/// `act(gate) * up` times `weight`: the gated unit, then [`rows_times`].
pub fn linear<B: FusedOps>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    weight: FloatTensor<B>,
    activation: GluActivation,
) -> FloatTensor<B> {
    rows_times::<B>(B::fused_glu(gate, up, activation), weight)
}
