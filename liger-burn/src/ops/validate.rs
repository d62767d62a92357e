//! Input validation shared by every layer: bad input is a clear error naming the op,
//! the shapes and the dtypes, raised before any kernel is launched.

use burn::tensor::{DType, Shape, TensorMetadata};

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

/// [`norm`] on tensors of any layer (Burn primitives, CubeCL or fusion tensors).
pub fn norm_tensors<T: TensorMetadata>(
    op: &'static str,
    x: &T,
    weight: &T,
    bias: Option<&T>,
    kernel_dtypes: bool,
) -> Result<(), LigerError> {
    norm(&NormInputs {
        op,
        x: (x.shape(), x.dtype()),
        weight: (weight.shape(), weight.dtype()),
        bias: bias.map(|b| (b.shape(), b.dtype())),
        kernel_dtypes,
    })
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

/// [`elementwise`] on tensors of any layer (Burn primitives, CubeCL or fusion tensors).
pub fn elementwise_tensors<T: TensorMetadata>(
    op: &str,
    tensors: &[(&str, &T)],
    kernel_dtypes: bool,
) -> Result<(), LigerError> {
    let meta: Vec<(&str, Shape, DType)> = tensors
        .iter()
        .map(|(name, t)| (*name, t.shape(), t.dtype()))
        .collect();
    let refs: Vec<(&str, &Shape, DType)> = meta.iter().map(|(n, s, d)| (*n, s, *d)).collect();
    elementwise(op, &refs, kernel_dtypes)
}
mod rope;
pub use rope::{RopeInputs, rope, rope_tensors};
