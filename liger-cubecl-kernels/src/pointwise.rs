//! The per-element math of the elementwise kernel ([`crate::elementwise`]), in f32: the
//! activations — exact GELU (erf), sigmoid, and the SiLU and tanh-GELU of the gated units
//! ([`crate::glu`]) — with their derivatives, and the gated units' forward and backward.
//!
//! Exact GELU is `x Φ(x)` with the normal CDF `Φ` from an `erfc` accurate to 1.1e-7
//! *relative* (so the lower tail keeps its digits), not from `1 + erf`.
//! Sigmoid is evaluated in the stable split form: with `e = exp(-|x|)`,
//! `σ(|x|) = 1 / (1 + e)` and `σ(-|x|) = e / (1 + e)`, so neither `σ(x)` nor `1 - σ(x)`
//! is ever formed by cancellation and `exp` never overflows. The tanh-GELU uses the
//! identity `(1 + tanh(u)) / 2 = σ(2u)`, which is exactly PyTorch's
//! `gelu(approximate="tanh")`, `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, without
//! the overflow or cancellation of a `tanh` written with exponentials.

use cubecl::prelude::*;

/// A pointwise activation, a comptime choice of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x · σ(x)`.
    Silu,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
    /// `0.5 x (1 + erf(x / √2))`, the exact GELU (Burn's `gelu`).
    Gelu,
    /// `σ(x) = 1 / (1 + exp(-x))`.
    Sigmoid,
}

/// `√(2/π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation.
const GELU_TANH_COEFF: f32 = 0.044_715;
/// `1/√2`.
const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `1/d` with the division relaxed to the hardware's approximate reciprocal (CUDA's
/// `__fdividef`, about 2 ulp; SPIR-V's `AllowRecip`). Only called with `d` in `[1, 2]`,
/// so the flags' no-infinity and unsigned-zero assumptions hold.
#[cube(fast_math = FastMath::AllowReciprocal
    | FastMath::ReducedPrecision
    | FastMath::UnsignedZero
    | FastMath::NotInf)]
fn approximate_reciprocal<N: Size>(d: Vector<f32, N>) -> Vector<f32, N> {
    Vector::new(1.0f32) / d
}

/// `1/d` for `d` in `[1, 2]`, within one f32 ulp: the approximate reciprocal refined by one
/// Newton step. On an H200 the IEEE division was a multi-instruction sequence with a slow
/// path that made the SwiGLU forward issue-bound and held it at 63 registers; this takes
/// it to 48 with the same f32 errors against f64 (benches/results/2026-11-22-h200-712cd8c/).
#[cube]
fn reciprocal_in_one_to_two<N: Size>(d: Vector<f32, N>) -> Vector<f32, N> {
    // One Newton step squares the approximation's relative error (2⁻²² → 2⁻⁴⁴); the
    // residual `1 - d·r` is formed by one fused multiply-add, exactly.
    let r = approximate_reciprocal::<N>(d);
    r + r * (Vector::new(1.0f32) - d * r)
}

/// `exp(x)` by the hardware exponential (CUDA's `__expf`: `ex2.approx` of `x·log₂e`),
/// within `2 + 1.17|x|` f32 ulp, inside the `3 + 2|x|` the conformance bounds allow any
/// device's `exp`.
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
fn hardware_exp<N: Size>(x: Vector<f32, N>) -> Vector<f32, N> {
    Vector::exp(x)
}

/// The activations' `exp`: the hardware exponential when `hardware_math`, else the
/// accurate one.
///
/// `hardware_math` is for f16/bf16 results on CUDA and HIP ([`hardware_math_for`]), when
/// `ElementwiseConfig::hardware_math` asks for it (off by default). Where
/// `exp(-|x|)` is a normal f32 (`|x| < 87.3`) the hardware one is within 104 ulp, a
/// relative 2⁻¹⁶·³: a 40th of f16's unit roundoff and a 300th of bf16's, so the stored
/// result differs from the accurate path's only where the f32 value lies that close to a
/// rounding boundary. f32 results keep the accurate `exp`, as PyTorch's kernels do. With
/// the unrefined reciprocal ([`activation_reciprocal`]) it takes the bf16 SwiGLU forward
/// from about 30 to 19 instructions an element (static SASS for sm_90a, 237 against 154
/// in the loop over four elements, both bounds-check branches).
#[cube]
fn activation_exp<N: Size>(x: Vector<f32, N>, #[comptime] hardware_math: bool) -> Vector<f32, N> {
    if hardware_math {
        hardware_exp::<N>(x)
    } else {
        Vector::exp(x)
    }
}

/// Whether the activations of a kernel storing `dtype` take the hardware exponential and
/// reciprocal: f16/bf16 results where the runtime compiles them to intrinsics
/// (`supported`, [`crate::launch::hardware_math_supported`]).
pub(crate) fn hardware_math_for(supported: bool, dtype: StorageType) -> bool {
    use cubecl::ir::{ElemType, FloatKind};
    supported
        && matches!(
            dtype,
            StorageType::Scalar(ElemType::Float(FloatKind::F16 | FloatKind::BF16))
        )
}

/// `1/d` for `d` in `[1, 2]`: the hardware reciprocal alone (about 2 f32 ulp) when
/// `hardware_math`, else refined to within one f32 ulp of the exact quotient.
#[cube]
fn activation_reciprocal<N: Size>(
    d: Vector<f32, N>,
    #[comptime] hardware_math: bool,
) -> Vector<f32, N> {
    if hardware_math {
        approximate_reciprocal::<N>(d)
    } else {
        reciprocal_in_one_to_two::<N>(d)
    }
}

/// `σ(x)` and `1 - σ(x)`, both without cancellation.
#[cube]
fn sigmoid_pair<N: Size>(
    x: Vector<f32, N>,
    sig: &mut Vector<f32, N>,
    complement: &mut Vector<f32, N>,
    #[comptime] hardware_math: bool,
) {
    // `0 - v`, not `-v`: CubeCL's CUDA target has no unary minus on vector types.
    let e = activation_exp::<N>(Vector::new(0.0f32) - Vector::abs(x), hardware_math);
    let large = activation_reciprocal::<N>(Vector::new(1.0) + e, hardware_math);
    let small = e * large;
    let negative = x.less_than(Vector::new(0.0));
    *sig = select_many(negative, small, large);
    *complement = select_many(negative, large, small);
}

/// `√(2/π) (x + 0.044715 x³)`, the tanh argument.
#[cube]
fn gelu_tanh_arg<N: Size>(x: Vector<f32, N>) -> Vector<f32, N> {
    Vector::new(SQRT_2_OVER_PI) * (x + Vector::new(GELU_TANH_COEFF) * x * x * x)
}

/// `erfc(z)` for `z ≥ 0`, to a relative error below 1.1e-7 for every `z` (Numerical
/// Recipes' Chebyshev fit, `erfcc`), plus the f32 rounding of `z²` in the exponent.
#[cube]
fn erfc_nonnegative<N: Size>(z: Vector<f32, N>, #[comptime] hardware_math: bool) -> Vector<f32, N> {
    let t = Vector::<f32, N>::new(1.0) / (Vector::new(1.0) + Vector::new(0.5f32) * z);
    let mut p = Vector::<f32, N>::new(0.170_872_77);
    p = p * t + Vector::new(-0.822_152_23);
    p = p * t + Vector::new(1.488_515_87);
    p = p * t + Vector::new(-1.135_203_98);
    p = p * t + Vector::new(0.278_868_07);
    p = p * t + Vector::new(-0.186_288_06);
    p = p * t + Vector::new(0.096_784_18);
    p = p * t + Vector::new(0.374_091_96);
    p = p * t + Vector::new(1.000_023_68);
    p = p * t + Vector::new(-1.265_512_23);
    t * activation_exp::<N>(p - z * z, hardware_math)
}

/// `Φ(x) = (1 + erf(x / √2)) / 2 = erfc(-x / √2) / 2`.
///
/// The lower tail `Φ(-|x|) = erfc(|x| / √2) / 2` is computed directly, never as
/// `1 + erf(x / √2)` with `erf` near `-1`: GELU and its derivative keep their relative
/// accuracy for negative inputs (where `1 + erf` would cancel to a few ulps of 1, and a
/// device's `erf` may be an absolute-error polynomial: CubeCL's SPIR-V/WGSL `erf` is).
#[cube]
fn normal_cdf<N: Size>(x: Vector<f32, N>, #[comptime] hardware_math: bool) -> Vector<f32, N> {
    let lower = Vector::new(0.5f32)
        * erfc_nonnegative::<N>(Vector::abs(x) * Vector::new(FRAC_1_SQRT_2), hardware_math);
    select_many(
        x.less_than(Vector::new(0.0)),
        lower,
        Vector::new(1.0) - lower,
    )
}

/// `act(x)`.
#[cube]
pub(crate) fn value<N: Size>(
    x: Vector<f32, N>,
    #[comptime] act: Activation,
    #[comptime] hardware_math: bool,
) -> Vector<f32, N> {
    let mut sig = Vector::<f32, N>::new(0.0);
    let mut complement = Vector::<f32, N>::new(0.0);
    match act {
        Activation::Silu => {
            sigmoid_pair::<N>(x, &mut sig, &mut complement, hardware_math);
            x * sig
        }
        Activation::GeluTanh => {
            let u = gelu_tanh_arg::<N>(x);
            sigmoid_pair::<N>(u + u, &mut sig, &mut complement, hardware_math);
            x * sig
        }
        Activation::Gelu => x * normal_cdf::<N>(x, hardware_math),
        Activation::Sigmoid => {
            sigmoid_pair::<N>(x, &mut sig, &mut complement, hardware_math);
            sig
        }
    }
}

/// `act(x)` and `act'(x)` sharing their exponentials.
#[cube]
pub(crate) fn value_and_grad<N: Size>(
    x: Vector<f32, N>,
    value: &mut Vector<f32, N>,
    grad: &mut Vector<f32, N>,
    #[comptime] act: Activation,
    #[comptime] hardware_math: bool,
) {
    let one = Vector::<f32, N>::new(1.0);
    let mut sig = Vector::<f32, N>::new(0.0);
    let mut complement = Vector::<f32, N>::new(0.0);
    match act {
        Activation::Silu => {
            // (x σ)' = σ + x σ (1 - σ)
            sigmoid_pair::<N>(x, &mut sig, &mut complement, hardware_math);
            *value = x * sig;
            *grad = sig * (one + x * complement);
        }
        Activation::GeluTanh => {
            // g = x σ(2u): g' = σ + 2 x σ (1 - σ) u', u' = √(2/π) (1 + 3 · 0.044715 x²)
            let u = gelu_tanh_arg::<N>(x);
            sigmoid_pair::<N>(u + u, &mut sig, &mut complement, hardware_math);
            let du =
                Vector::new(SQRT_2_OVER_PI) * (one + Vector::new(3.0 * GELU_TANH_COEFF) * x * x);
            *value = x * sig;
            *grad = sig + Vector::new(2.0f32) * x * sig * complement * du;
        }
        Activation::Gelu => {
            // (x Φ)' = Φ + x φ, φ(x) = exp(-x²/2) / √(2π)
            let cdf = normal_cdf::<N>(x, hardware_math);
            let pdf = Vector::new(FRAC_1_SQRT_2PI)
                * activation_exp::<N>(Vector::new(-0.5f32) * x * x, hardware_math);
            *value = x * cdf;
            *grad = cdf + x * pdf;
        }
        Activation::Sigmoid => {
            sigmoid_pair::<N>(x, &mut sig, &mut complement, hardware_math);
            *value = sig;
            *grad = sig * complement;
        }
    }
}

/// `act'` from what the backward keeps: the input `x`, except for sigmoid, whose
/// derivative `y (1 - y)` is taken from the output `y` (as Burn's `sigmoid_backward`).
#[cube]
pub(crate) fn grad_from_saved<N: Size>(
    saved: Vector<f32, N>,
    #[comptime] act: Activation,
    #[comptime] hardware_math: bool,
) -> Vector<f32, N> {
    let mut value = Vector::<f32, N>::new(0.0);
    let mut grad = Vector::<f32, N>::new(0.0);
    match act {
        Activation::Sigmoid => {
            grad = saved * (Vector::new(1.0) - saved);
        }
        _ => {
            value_and_grad::<N>(saved, &mut value, &mut grad, act, hardware_math);
        }
    }
    grad
}

/// `act(gate) · up` for one vector, in f32.
#[cube]
pub(crate) fn glu_forward<N: Size>(
    gate: Vector<f32, N>,
    up: Vector<f32, N>,
    #[comptime] act: Activation,
    #[comptime] hardware_math: bool,
) -> Vector<f32, N> {
    value::<N>(gate, act, hardware_math) * up
}

/// `grad_gate = grad · up · act'(gate)`, `grad_up = grad · act(gate)` for one vector.
#[cube]
pub(crate) fn glu_backward<N: Size>(
    grad: Vector<f32, N>,
    gate: Vector<f32, N>,
    up: Vector<f32, N>,
    grad_gate: &mut Vector<f32, N>,
    grad_up: &mut Vector<f32, N>,
    #[comptime] act: Activation,
    #[comptime] hardware_math: bool,
) {
    let mut value = Vector::<f32, N>::new(0.0);
    let mut derivative = Vector::<f32, N>::new(0.0);
    value_and_grad::<N>(gate, &mut value, &mut derivative, act, hardware_math);
    *grad_gate = grad * up * derivative;
    *grad_up = grad * value;
}
