//! The functional API: fused ops on `burn::tensor::Tensor`s, for any backend that
//! implements [`FusedOps`] (CubeCL backends fused, every other backend through the exact
//! stock-op composition), with autodiff when the backend has it.
//!
//! Every function validates its inputs first and panics with a message naming the op,
//! the shapes and the dtypes (Burn's convention for invalid tensor input).

use crate::ops::validate::{self, NormInputs};
use crate::ops::{FusedOps, RmsNormOptions};
use burn::tensor::{Tensor, TensorPrimitive};

fn prim<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    x.into_primitive().tensor()
}

fn wrap<B: FusedOps, const D: usize>(x: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn check_norm<B: FusedOps, const D: usize>(
    op: &'static str,
    x: &Tensor<B, D>,
    weight: &Tensor<B, 1>,
    bias: Option<&Tensor<B, 1>>,
) {
    validate::check(validate::norm(&NormInputs {
        op,
        x: (x.shape(), x.dtype()),
        weight: (weight.shape(), weight.dtype()),
        bias: bias.map(|b| (b.shape(), b.dtype())),
        kernel_dtypes: false,
    }));
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * (offset + weight)`.
///
/// - `x`: `[..., d_model]`
/// - `weight`: `[d_model]`
/// - returns `[..., d_model]`
pub fn rms_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    options: RmsNormOptions,
) -> Tensor<B, D> {
    check_norm("rms_norm", &x, &weight, None);
    wrap(B::fused_rms_norm(prim(x), prim(weight), options).output)
}

/// Residual add then RMSNorm in one pass.
///
/// - `x`, `residual`: `[..., d_model]`
/// - `weight`: `[d_model]`
/// - returns `(rms_norm(x + residual), x + residual)`, both `[..., d_model]`
pub fn fused_add_rms_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    residual: Tensor<B, D>,
    weight: Tensor<B, 1>,
    options: RmsNormOptions,
) -> (Tensor<B, D>, Tensor<B, D>) {
    validate::check(validate::same_shape_dtype(
        "fused_add_rms_norm",
        ("x", &x.shape(), x.dtype()),
        ("residual", &residual.shape(), residual.dtype()),
    ));
    check_norm("fused_add_rms_norm", &x, &weight, None);
    let out = B::fused_add_rms_norm(prim(x), prim(residual), prim(weight), options);
    (wrap(out.output), wrap(out.sum))
}

/// LayerNorm over the last dimension: `(x - mean) / sqrt(var + eps) * gamma + beta`.
///
/// - `x`: `[..., d_model]`
/// - `gamma`, `beta`: `[d_model]`
/// - returns `[..., d_model]`
pub fn layer_norm<B: FusedOps, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
) -> Tensor<B, D> {
    check_norm("layer_norm", &x, &gamma, beta.as_ref());
    wrap(B::fused_layer_norm(prim(x), prim(gamma), beta.map(prim), eps).output)
}

fn along_last<B: FusedOps, const D: usize>(
    op: &str,
    x: Tensor<B, D>,
    dim: usize,
    f: impl FnOnce(burn::tensor::ops::FloatTensor<B>) -> burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    assert!(
        dim < D,
        "{op}: dim {dim} is out of range for a tensor of rank {D} (shape {:?})",
        x.shape()
    );
    validate::check(validate::rows(op, (&x.shape(), x.dtype()), false));
    if dim == D - 1 {
        wrap(f(prim(x)))
    } else {
        // The kernels reduce the last dimension; other dims go through a transpose.
        wrap::<B, D>(f(prim(x.swap_dims(dim, D - 1)))).swap_dims(dim, D - 1)
    }
}

/// Softmax along `dim` (fused along the last dimension). `x`: any shape; same shape out.
pub fn softmax<B: FusedOps, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    along_last("softmax", x, dim, B::fused_softmax)
}

/// Log-softmax along `dim` (fused along the last dimension). `x`: any shape; same shape out.
pub fn log_softmax<B: FusedOps, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    along_last("log_softmax", x, dim, B::fused_log_softmax)
}

fn glu<B: FusedOps, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    activation: crate::ops::GluActivation,
) -> Tensor<B, D> {
    validate::check(validate::elementwise(
        activation.op_name(),
        &[
            ("gate", &gate.shape(), gate.dtype()),
            ("up", &up.shape(), up.dtype()),
        ],
        false,
    ));
    wrap(B::fused_glu(prim(gate), prim(up), activation))
}

/// SwiGLU, the gated unit of the Llama/Qwen/Mistral MLP: `silu(gate) * up`, in one pass
/// (forward and backward), computed in f32 and rounded once.
///
/// - `gate`, `up`: `[..., d_ff]` (e.g. `[batch, seq, d_ff]`), same shape and dtype
/// - returns `[..., d_ff]`
pub fn swiglu<B: FusedOps, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    glu(gate, up, crate::ops::GluActivation::Silu)
}

/// GeGLU, the gated unit of the Gemma MLP: `gelu_tanh(gate) * up` with PyTorch's
/// `gelu(approximate="tanh")`, in one pass (forward and backward).
///
/// - `gate`, `up`: `[..., d_ff]` (e.g. `[batch, seq, d_ff]`), same shape and dtype
/// - returns `[..., d_ff]`
pub fn geglu<B: FusedOps, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    glu(gate, up, crate::ops::GluActivation::GeluTanh)
}

/// Exact GELU, `0.5 x (1 + erf(x / sqrt(2)))`, with the exact derivative in the backward.
/// `x`: any shape (not empty); same shape out. On `Liger<_>` backends Burn's own
/// `burn::tensor::activation::gelu` runs the same kernel.
pub fn gelu<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    validate::check(validate::rows("gelu", (&x.shape(), x.dtype()), false));
    wrap(B::fused_gelu(prim(x)))
}

/// Sigmoid, `1 / (1 + exp(-x))`; the backward works from the output. `x`: any shape (not
/// empty); same shape out. On `Liger<_>` backends Burn's own
/// `burn::tensor::activation::sigmoid` runs the same kernel.
pub fn sigmoid<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    validate::check(validate::rows("sigmoid", (&x.shape(), x.dtype()), false));
    wrap(B::fused_sigmoid(prim(x)))
}
