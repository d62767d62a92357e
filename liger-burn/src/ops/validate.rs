//! Input validation: bad input is a clear error naming the op, the shapes and the dtypes,
//! raised before any work is queued.
//!
//! Validation runs once, at the API entry (functional, nn, optim, and `Liger<B>`'s
//! overrides of Burn's primitives); the [`FusedOps`](crate::ops::FusedOps) primitives
//! assume validated input, as Burn's `FloatTensorOps` do. The dtypes a backend's fused
//! primitives take ([`FusedOps::fused_dtype_supported`](crate::ops::FusedOps::fused_dtype_supported))
//! reach the checks through [`kernel_dtypes`] and [`fused_dtype`].

use burn::tensor::{DType, Shape};

/// A rejected input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LigerError(pub String);

impl core::fmt::Display for LigerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LigerError {}

fn fail<T>(msg: String) -> Result<T, LigerError> {
    Err(LigerError(msg))
}

/// Whether the fused kernels read this dtype.
pub fn kernel_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Flex32)
}

/// The `kernel_dtypes` condition of the checks below for a tensor of `dtype` on `B`:
/// whether its dtype must be one the kernels read, i.e. `B`'s fused primitives do not take
/// it (every backend takes the kernels' dtypes: see
/// [`FusedOps::fused_dtype_supported`](crate::ops::FusedOps::fused_dtype_supported)).
pub fn kernel_dtypes<B: crate::ops::FusedOps>(dtype: DType) -> bool {
    !B::fused_dtype_supported(dtype)
}

/// A tensor `name` of `shape` whose dtype the backend's fused primitives must take:
/// `supported` is [`FusedOps::fused_dtype_supported`](crate::ops::FusedOps::fused_dtype_supported)
/// of it. For entries whose other checks have no `kernel_dtypes` condition.
pub fn fused_dtype(
    op: &str,
    name: &str,
    t: (&Shape, DType),
    supported: bool,
) -> Result<(), LigerError> {
    let (shape, dtype) = t;
    if !supported {
        return fail(format!(
            "{op}: unsupported dtype {dtype:?} for the fused kernels (f32, f16 and bf16 are supported; {name} {shape:?})"
        ));
    }
    Ok(())
}

/// A row-wise op's input: rank ≥ 1, no empty dimension, a float dtype (one the kernels
/// read when `kernel_dtypes`).
pub fn rows(op: &str, x: (&Shape, DType), kernel_dtypes: bool) -> Result<(), LigerError> {
    let (shape, dtype) = x;
    if shape.num_dims() == 0 {
        return fail(format!(
            "{op}: input must have at least one dimension, got a scalar (dtype {dtype:?})"
        ));
    }
    if shape.num_elements() == 0 {
        return fail(format!(
            "{op}: empty input of shape {shape:?} (dtype {dtype:?})"
        ));
    }
    if !dtype.is_float() {
        return fail(format!(
            "{op}: input must be a float tensor, got dtype {dtype:?} (shape {shape:?})"
        ));
    }
    if kernel_dtypes && !kernel_dtype(dtype) {
        return fail(format!(
            "{op}: unsupported dtype {dtype:?} for the fused kernels (f32, f16 and bf16 are supported; shape {shape:?})"
        ));
    }
    Ok(())
}

/// Two tensors that must agree in shape and dtype (e.g. `x` and `grad_output`).
pub fn same_shape_dtype(
    op: &str,
    a: (&str, &Shape, DType),
    b: (&str, &Shape, DType),
) -> Result<(), LigerError> {
    if a.1 != b.1 || a.2 != b.2 {
        return fail(format!(
            "{op}: {} has shape {:?} and dtype {:?} but {} has shape {:?} and dtype {:?}; they must match",
            a.0, a.1, a.2, b.0, b.1, b.2
        ));
    }
    Ok(())
}

/// A normalization's inputs: `x: [..., d]`, `weight: [d]`, `bias: [d]`, same dtype.
pub struct NormInputs {
    /// Op name for messages.
    pub op: &'static str,
    /// `x` shape and dtype.
    pub x: (Shape, DType),
    /// Weight shape and dtype.
    pub weight: (Shape, DType),
    /// Bias shape and dtype, if any.
    pub bias: Option<(Shape, DType)>,
    /// Whether the dtypes must be ones the kernels read.
    pub kernel_dtypes: bool,
}

/// Validates a normalization's inputs.
pub fn norm(inputs: &NormInputs) -> Result<(), LigerError> {
    let op = inputs.op;
    let (x_shape, x_dtype) = (&inputs.x.0, inputs.x.1);
    rows(op, (x_shape, x_dtype), inputs.kernel_dtypes)?;
    let d = x_shape[x_shape.num_dims() - 1];
    let params =
        core::iter::once(("weight", &inputs.weight)).chain(inputs.bias.iter().map(|b| ("bias", b)));
    for (name, (shape, dtype)) in params {
        if shape.num_dims() != 1 || shape[0] != d {
            return fail(format!(
                "{op}: {name} must have shape [{d}] to match the last dimension of x {x_shape:?}, got {shape:?}"
            ));
        }
        if *dtype != x_dtype {
            return fail(format!(
                "{op}: {name} dtype {dtype:?} does not match x dtype {x_dtype:?} (x {x_shape:?}, {name} {shape:?})"
            ));
        }
    }
    Ok(())
}

/// A normalization's `eps`: positive and finite (`rsqrt(var + eps)` of a constant row is
/// infinite with `eps = 0`, NaN with `eps < 0`). `x` is the input's shape, for the message.
pub fn eps(op: &str, eps: f64, x: Option<&Shape>) -> Result<(), LigerError> {
    if !(eps.is_finite() && eps > 0.0) {
        let shape = x.map(|s| format!(" (x {s:?})")).unwrap_or_default();
        return fail(format!(
            "{op}: eps must be positive and finite, got {eps}{shape}; use the model's value \
             (e.g. 1e-6 or 1e-5, `rms_norm_eps` or `layer_norm_eps` in a Hugging Face config)"
        ));
    }
    Ok(())
}

/// Panics with the error's message: the Burn convention for invalid tensor input.
pub(crate) fn check(result: Result<(), LigerError>) {
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// An elementwise op's tensors: the first is checked like [`rows`] (rank ≥ 1, not empty,
/// a float dtype, one the kernels read when `kernel_dtypes`), every other must have its
/// shape and dtype. Names are for messages (`gate`, `up`, `grad_output`, ...).
pub fn elementwise(
    op: &str,
    tensors: &[(&str, &Shape, DType)],
    kernel_dtypes: bool,
) -> Result<(), LigerError> {
    let Some(&(_, shape, dtype)) = tensors.first() else {
        return Ok(());
    };
    for &other in &tensors[1..] {
        same_shape_dtype(op, tensors[0], other)?;
    }
    rows(op, (shape, dtype), kernel_dtypes)
}

/// The weight of a GLU-linear op (`swiglu_linear`): `[d_ff, d_out]` with `d_ff` the
/// gate's last dimension, `d_out ≥ 1`, the gate's dtype.
pub fn glu_linear_weight(
    op: &str,
    gate: (&Shape, DType),
    weight: (&Shape, DType),
) -> Result<(), LigerError> {
    let d_ff = gate.0.as_slice().last().copied().unwrap_or(0);
    let dims = weight.0.as_slice();
    if dims.len() != 2 || dims[0] != d_ff || dims[1] == 0 || weight.1 != gate.1 {
        return fail(format!(
            "{op}: weight has shape {:?} and dtype {:?}; with gate {:?} ({:?}) it must be \
             [{d_ff}, d_out] (d_out ≥ 1, Burn's Linear layout: the gate's last dimension \
             first) in {:?}",
            dims,
            weight.1,
            gate.0.as_slice(),
            gate.1,
            gate.1
        ));
    }
    Ok(())
}

mod adamw;
mod attention;
mod lora;
mod matmul;
mod post_training;
mod rope;
pub use adamw::{AdamWInputs, adamw_step, adamw_step_tensors};
pub use attention::{AttentionInputs, attention};
pub use lora::{AdapterInputs, adapter, lora_linear, lora_linear_tensors};
pub use matmul::{matmul, matmul_tensors};
pub use post_training::{
    Meta, ReferenceMeta, distill, divergence, grpo, kto, preference, row_head, sequence_head,
    sequence_targets,
};
pub use rope::{RopeInputs, rope};
/// A cross-entropy call's inputs: `logits: [N, V]`, `targets: [N]` (integers),
/// `class_weight: [V]`, `grad_scale: [1]` or `[N]`, `z_loss_scale: [1]` (with a `[1]`
/// `grad_scale`).
pub struct CrossEntropyInputs {
    /// Op name for messages.
    pub op: &'static str,
    /// Logits shape and dtype.
    pub logits: (Shape, DType),
    /// Targets shape and dtype.
    pub targets: (Shape, DType),
    /// Class weights shape and dtype, if any.
    pub class_weight: Option<(Shape, DType)>,
    /// Gradient scale shape and dtype (`[1]` or `[N]`), if any.
    pub grad_scale: Option<(Shape, DType)>,
    /// Shape and dtype of the z-loss part's gradient scale (`[1]`), if any.
    pub z_loss_scale: Option<(Shape, DType)>,
    /// Whether the logits dtype must be one the kernels read.
    pub kernel_dtypes: bool,
}

/// Validates a cross-entropy call's inputs and options.
pub fn cross_entropy(
    inputs: &CrossEntropyInputs,
    options: &crate::ops::CrossEntropyOptions,
) -> Result<(), LigerError> {
    let op = inputs.op;
    let (shape, dtype) = (&inputs.logits.0, inputs.logits.1);
    if shape.num_dims() != 2 {
        return fail(format!(
            "{op}: logits must be [N, V] (rank 2), got shape {shape:?} (dtype {dtype:?})"
        ));
    }
    rows(op, (shape, dtype), inputs.kernel_dtypes)?;
    let (n, v) = (shape[0], shape[1]);
    let (t_shape, t_dtype) = (&inputs.targets.0, inputs.targets.1);
    if !(t_dtype.is_int() || t_dtype.is_uint()) {
        return fail(format!(
            "{op}: targets must be an integer tensor, got dtype {t_dtype:?} (targets {t_shape:?}, logits {shape:?} {dtype:?})"
        ));
    }
    if t_shape.num_dims() != 1 || t_shape[0] != n {
        return fail(format!(
            "{op}: targets must have shape [{n}] to match logits {shape:?}, got {t_shape:?} (dtype {t_dtype:?})"
        ));
    }
    if let Some((w_shape, w_dtype)) = &inputs.class_weight {
        if w_shape.num_dims() != 1 || w_shape[0] != v {
            return fail(format!(
                "{op}: class_weight must have shape [{v}] to match logits {shape:?}, got {w_shape:?} (dtype {w_dtype:?})"
            ));
        }
        if !w_dtype.is_float() {
            return fail(format!(
                "{op}: class_weight must be a float tensor, got dtype {w_dtype:?} (shape {w_shape:?})"
            ));
        }
    }
    if let Some((s_shape, s_dtype)) = &inputs.grad_scale {
        let one = s_shape.num_elements() == 1;
        let per_row = s_shape.num_dims() == 1 && s_shape[0] == n;
        if !(one || per_row) || !s_dtype.is_float() {
            return fail(format!(
                "{op}: grad_scale must be a float tensor of shape [1] or [{n}] (logits {shape:?}), got shape {s_shape:?} and dtype {s_dtype:?}"
            ));
        }
    }
    if let Some((z_shape, z_dtype)) = &inputs.z_loss_scale {
        let uniform = inputs
            .grad_scale
            .as_ref()
            .is_none_or(|(s, _)| s.num_elements() == 1);
        if z_shape.num_elements() != 1 || !z_dtype.is_float() || !uniform {
            return fail(format!(
                "{op}: z_loss_scale must be a float tensor of shape [1], with a grad_scale of shape [1] (logits {shape:?}), got shape {z_shape:?} and dtype {z_dtype:?}"
            ));
        }
    }
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return fail(format!(
            "{op}: label_smoothing must be in [0, 1], got {eps} (logits {shape:?})"
        ));
    }
    if !options.lse_square_scale.is_finite() {
        return fail(format!(
            "{op}: lse_square_scale must be finite, got {} (logits {shape:?})",
            options.lse_square_scale
        ));
    }
    if let Some(c) = options.softcap
        && !(c.is_finite() && c > 0.0)
    {
        return fail(format!(
            "{op}: softcap must be positive and finite, got {c} (logits {shape:?})"
        ));
    }
    Ok(())
}

/// Validates a linear cross entropy's inputs: `x: [N, H]`, `weight: [V, H]` and
/// `bias: [V]` of one float dtype, integer `targets: [N]`, `class_weight: [V]`.
pub fn linear_cross_entropy(
    op: &'static str,
    x: (Shape, DType),
    weight: (Shape, DType),
    bias: Option<(Shape, DType)>,
    targets: (Shape, DType),
    class_weight: Option<(Shape, DType)>,
    options: &crate::ops::CrossEntropyOptions,
) -> Result<(), LigerError> {
    let (x_shape, x_dtype) = (&x.0, x.1);
    let (w_shape, w_dtype) = (&weight.0, weight.1);
    if x_shape.num_dims() != 2 {
        return fail(format!(
            "{op}: x must be [N, H] (rank 2), got shape {x_shape:?} (dtype {x_dtype:?})"
        ));
    }
    rows(op, (x_shape, x_dtype), false)?;
    if w_shape.num_dims() != 2 || w_shape[1] != x_shape[1] {
        return fail(format!(
            "{op}: weight must be [V, H] with H = {} to match x {x_shape:?}, got {w_shape:?} (dtype {w_dtype:?})",
            x_shape[1]
        ));
    }
    if w_shape[0] == 0 {
        return fail(format!(
            "{op}: empty weight of shape {w_shape:?} (x {x_shape:?})"
        ));
    }
    if w_dtype != x_dtype {
        return fail(format!(
            "{op}: weight dtype {w_dtype:?} does not match x dtype {x_dtype:?} (x {x_shape:?}, weight {w_shape:?})"
        ));
    }
    let v = w_shape[0];
    if let Some((b_shape, b_dtype)) = &bias {
        if b_shape.num_dims() != 1 || b_shape[0] != v {
            return fail(format!(
                "{op}: bias must have shape [{v}] to match weight {w_shape:?}, got {b_shape:?}"
            ));
        }
        if *b_dtype != x_dtype {
            return fail(format!(
                "{op}: bias dtype {b_dtype:?} does not match x dtype {x_dtype:?} (bias {b_shape:?})"
            ));
        }
    }
    // The rest is the cross entropy of the `[N, V]` logits.
    cross_entropy(
        &CrossEntropyInputs {
            op,
            logits: (Shape::new([x_shape[0], v]), x_dtype),
            targets,
            class_weight,
            grad_scale: None,
            z_loss_scale: None,
            kernel_dtypes: false,
        },
        options,
    )
}
