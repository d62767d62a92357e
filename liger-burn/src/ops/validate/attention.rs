//! Validation of attention's inputs: `q: [batch, q_heads, seq, head_dim]`,
//! `k, v: [batch, kv_heads, seq, head_dim]` with `q_heads` a multiple of `kv_heads`, one
//! float dtype, `mask: [seq, seq]`, int `document_ids: [batch, seq]`, a window of at least
//! one key, nothing empty.

use super::{LigerError, fail};
use burn::tensor::{DType, Shape};

/// Attention's inputs, for messages and checks.
pub struct AttentionInputs {
    /// Op name for messages.
    pub op: &'static str,
    /// Shape and dtype of q, k and v.
    pub q: (Shape, DType),
    /// k.
    pub k: (Shape, DType),
    /// v.
    pub v: (Shape, DType),
    /// Shape of the boolean mask, when one is given.
    pub mask: Option<Shape>,
    /// Shape and dtype of the document ids, when given.
    pub document_ids: Option<(Shape, DType)>,
    /// The sliding window of the options.
    pub window: Option<usize>,
}

/// Validates attention's inputs.
pub fn attention(inputs: &AttentionInputs) -> Result<(), LigerError> {
    let op = inputs.op;
    let (q, k, v) = (&inputs.q, &inputs.k, &inputs.v);
    let describe = || {
        format!(
            "q {:?} ({:?}), k {:?} ({:?}), v {:?} ({:?}), mask {:?}, document_ids {:?}, window {:?}",
            q.0, q.1, k.0, k.1, v.0, v.1, inputs.mask, inputs.document_ids, inputs.window
        )
    };
    for (name, (shape, dtype)) in [("q", q), ("k", k), ("v", v)] {
        if shape.num_dims() != 4 {
            return fail(format!(
                "{op}: {name} must be [batch, heads, seq, head_dim]; got {}",
                describe()
            ));
        }
        if shape.num_elements() == 0 {
            return fail(format!("{op}: empty {name}; got {}", describe()));
        }
        if !dtype.is_float() {
            return fail(format!(
                "{op}: {name} must be a float tensor; got {}",
                describe()
            ));
        }
    }
    if q.1 != k.1 || q.1 != v.1 {
        return fail(format!(
            "{op}: q, k and v must share one dtype; got {}",
            describe()
        ));
    }
    let (qd, kd, vd) = (q.0.to_vec(), k.0.to_vec(), v.0.to_vec());
    if kd != vd {
        return fail(format!(
            "{op}: k and v must have the same shape; got {}",
            describe()
        ));
    }
    if qd[0] != kd[0] || qd[2] != kd[2] || qd[3] != kd[3] {
        return fail(format!(
            "{op}: q, k and v must agree in batch, seq and head_dim; got {}",
            describe()
        ));
    }
    if qd[1] % kd[1] != 0 {
        return fail(format!(
            "{op}: q_heads ({}) must be a multiple of kv_heads ({}); got {}",
            qd[1],
            kd[1],
            describe()
        ));
    }
    if inputs
        .mask
        .as_ref()
        .is_some_and(|m| m.to_vec() != [qd[2], qd[2]])
    {
        return fail(format!(
            "{op}: mask must be [seq, seq] = [{0}, {0}]; got {1}",
            qd[2],
            describe()
        ));
    }
    if let Some((shape, dtype)) = &inputs.document_ids {
        if shape.to_vec() != [qd[0], qd[2]] {
            return fail(format!(
                "{op}: document_ids must be [batch, seq] = [{}, {}]; got {}",
                qd[0],
                qd[2],
                describe()
            ));
        }
        if !dtype.is_int() && !dtype.is_uint() {
            return fail(format!(
                "{op}: document_ids must be an int tensor; got {}",
                describe()
            ));
        }
    }
    if inputs.window == Some(0) {
        return fail(format!(
            "{op}: a sliding window of 0 keys hides every key (the window counts the query \
             itself: use at least 1); got {}",
            describe()
        ));
    }
    Ok(())
}
