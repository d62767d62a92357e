//! Validation of RoPE's inputs: `q: [batch, q_heads, seq, head_dim]`,
//! `k: [batch, kv_heads, seq, head_dim]`, `cos, sin: [1 or batch, seq, head_dim]`, one
//! float dtype, an even `head_dim`, nothing empty.

use super::{LigerError, fail, kernel_dtype};
use burn::tensor::{DType, Shape};

/// RoPE's inputs, for messages and checks.
pub struct RopeInputs {
    /// Op name for messages.
    pub op: &'static str,
    /// Name, shape and dtype of the rotated tensors (`q`, `k`); absent ones are skipped, at
    /// least one of them is needed.
    pub rotated: [Option<(&'static str, Shape, DType)>; 2],
    /// `cos` shape and dtype.
    pub cos: (Shape, DType),
    /// `sin` shape and dtype.
    pub sin: (Shape, DType),
    /// Whether the dtype must be one the kernels read.
    pub kernel_dtypes: bool,
}

/// Validates RoPE's inputs.
pub fn rope(inputs: &RopeInputs) -> Result<(), LigerError> {
    let op = inputs.op;
    let present: Vec<&(&str, Shape, DType)> = inputs.rotated.iter().flatten().collect();
    let Some(&&(first, ref first_shape, dtype)) = present.first() else {
        return fail(format!("{op}: neither q nor k was given"));
    };
    for (name, shape, dtype) in &present {
        if shape.num_dims() != 4 {
            return fail(format!(
                "{op}: {name} must be [batch, heads, seq, head_dim], got shape {shape:?} (dtype {dtype:?})"
            ));
        }
        if shape.num_elements() == 0 {
            return fail(format!(
                "{op}: empty {name} of shape {shape:?} (dtype {dtype:?})"
            ));
        }
        if !dtype.is_float() {
            return fail(format!(
                "{op}: {name} must be a float tensor, got dtype {dtype:?} (shape {shape:?})"
            ));
        }
        if inputs.kernel_dtypes && !kernel_dtype(*dtype) {
            return fail(format!(
                "{op}: unsupported dtype {dtype:?} for the fused kernels (f32, f16 and bf16 are supported; {name} {shape:?})"
            ));
        }
    }
    let [batch, _, seq, head_dim] = [0, 1, 2, 3].map(|i| first_shape[i]);
    if head_dim % 2 != 0 {
        return fail(format!(
            "{op}: head_dim must be even (elements are rotated in pairs), got {head_dim} ({first} {first_shape:?}, dtype {dtype:?})"
        ));
    }
    if let Some(&&(other, ref other_shape, other_dtype)) = present.get(1) {
        let dims_match =
            other_shape[0] == batch && other_shape[2] == seq && other_shape[3] == head_dim;
        if !dims_match {
            return fail(format!(
                "{op}: {first} {first_shape:?} and {other} {other_shape:?} must agree in batch, seq and head_dim (dtypes {dtype:?}, {other_dtype:?})"
            ));
        }
        if other_dtype != dtype {
            return fail(format!(
                "{op}: {first} dtype {dtype:?} does not match {other} dtype {other_dtype:?} ({first} {first_shape:?}, {other} {other_shape:?})"
            ));
        }
    }
    for (name, (shape, table_dtype)) in [("cos", &inputs.cos), ("sin", &inputs.sin)] {
        let ok = shape.num_dims() == 3
            && (shape[0] == 1 || shape[0] == batch)
            && shape[1] == seq
            && shape[2] == head_dim;
        if !ok {
            return fail(format!(
                "{op}: {name} must have shape [1 or {batch}, {seq}, {head_dim}] to match {first} {first_shape:?}, got {shape:?} (dtype {table_dtype:?})"
            ));
        }
        if *table_dtype != dtype {
            return fail(format!(
                "{op}: {name} dtype {table_dtype:?} does not match {first} dtype {dtype:?} ({name} {shape:?}, {first} {first_shape:?})"
            ));
        }
    }
    if inputs.cos.0 != inputs.sin.0 {
        return fail(format!(
            "{op}: cos {:?} and sin {:?} must have the same shape (dtype {dtype:?})",
            inputs.cos.0, inputs.sin.0
        ));
    }
    Ok(())
}
