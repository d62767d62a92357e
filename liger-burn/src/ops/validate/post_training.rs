//! Validation of the chunked post-training losses' inputs: a linear head
//! (`x: [S, T, H]`, `weight: [V, H]`, `bias: [V]`, one float dtype), integer targets
//! `[S, T]`, and each loss's own tensors and options.

use super::{LigerError, fail};
use crate::ops::{PreferenceOptions, PreferenceReference};
use burn::tensor::{DType, Shape, TensorMetadata, backend::Backend};

/// A tensor's shape and dtype.
pub type Meta = (Shape, DType);

fn meta<T: TensorMetadata>(t: &T) -> Meta {
    (t.shape(), t.dtype())
}

/// A linear head over sequences: `x: [S, T, H]` (named `x_name`), `weight: [V, H]`,
/// `bias: [V]`, one float dtype, no empty dimension. Returns `[S, T, H, V]`.
pub fn sequence_head(
    op: &str,
    x_name: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
) -> Result<[usize; 4], LigerError> {
    let ((xs, xd), (ws, wd)) = (x, weight);
    if xs.num_dims() != 3 {
        return fail(format!(
            "{op}: {x_name} must be [sequences, seq_len, hidden] (rank 3), got shape {xs:?} (dtype {xd:?})"
        ));
    }
    if xs.num_elements() == 0 {
        return fail(format!(
            "{op}: empty {x_name} of shape {xs:?} (dtype {xd:?})"
        ));
    }
    if !xd.is_float() {
        return fail(format!(
            "{op}: {x_name} must be a float tensor, got dtype {xd:?} (shape {xs:?})"
        ));
    }
    let h = xs[2];
    if ws.num_dims() != 2 || ws[1] != h || ws[0] == 0 {
        return fail(format!(
            "{op}: the weight of {x_name} must be [V, H] with H = {h} and V ≥ 1 to match {x_name} {xs:?}, got {ws:?} (dtype {wd:?})"
        ));
    }
    if wd != xd {
        return fail(format!(
            "{op}: weight dtype {wd:?} does not match {x_name} dtype {xd:?} ({x_name} {xs:?}, weight {ws:?})"
        ));
    }
    let v = ws[0];
    if let Some((bs, bd)) = bias {
        if bs.num_dims() != 1 || bs[0] != v {
            return fail(format!(
                "{op}: the bias of {x_name} must have shape [{v}] to match its weight {ws:?}, got {bs:?}"
            ));
        }
        if bd != xd {
            return fail(format!(
                "{op}: bias dtype {bd:?} does not match {x_name} dtype {xd:?} (bias {bs:?})"
            ));
        }
    }
    Ok([xs[0], xs[1], h, v])
}

/// Integer `targets` of shape `[s, t]` (named `name`), for `x` of shape `x_shape`.
pub fn sequence_targets(
    op: &str,
    name: &str,
    targets: &Meta,
    [s, t]: [usize; 2],
    x_shape: &Shape,
) -> Result<(), LigerError> {
    let (ts, td) = targets;
    if ts.num_dims() != 2 || ts[0] != s || ts[1] != t {
        return fail(format!(
            "{op}: {name} must be [{s}, {t}] to match x {x_shape:?}, got {ts:?}"
        ));
    }
    if !td.is_int() {
        return fail(format!(
            "{op}: {name} must be an integer tensor, got dtype {td:?} (shape {ts:?})"
        ));
    }
    Ok(())
}

/// Where the preference reference's log-probabilities come from, as shapes and dtypes.
pub enum ReferenceMeta {
    /// None.
    None,
    /// Given log-probabilities.
    LogProbs(Meta),
    /// A reference head: `x`, weight, bias.
    Model(Meta, Meta, Option<Meta>),
}

impl ReferenceMeta {
    /// The shapes and dtypes of `reference`.
    pub fn of<B: Backend>(reference: &PreferenceReference<B>) -> Self {
        match reference {
            PreferenceReference::None => ReferenceMeta::None,
            PreferenceReference::LogProbs(l) => ReferenceMeta::LogProbs(meta(l)),
            PreferenceReference::Model { x, weight, bias } => {
                ReferenceMeta::Model(meta(x), meta(weight), bias.as_ref().map(meta))
            }
        }
    }
}

/// Validates a fused linear preference loss's inputs: `x: [2B, T, H]` with `B ≥ 1` pairs
/// (chosen sequences first), the head, integer `targets: [2B, T]`, a reference of `[2B]`
/// log-probabilities or a head over `[2B, T, H_ref]` with the policy's vocabulary and
/// dtype (DPO only), and the options.
pub fn preference(
    op: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
    targets: &Meta,
    reference: &ReferenceMeta,
    options: &PreferenceOptions,
) -> Result<(), LigerError> {
    options
        .check()
        .map_err(|e| LigerError(format!("{op}: {e}")))?;
    let [s, t, _, v] = sequence_head(op, "x", x, weight, bias)?;
    if s % 2 != 0 {
        return fail(format!(
            "{op}: x must hold the chosen sequences then as many rejected ones ([2B, T, H]), but its {s} sequences are an odd number: the chosen and rejected batches differ (x {:?})",
            x.0
        ));
    }
    sequence_targets(op, "targets", targets, [s, t], &x.0)?;
    if !matches!(reference, ReferenceMeta::None) && !options.loss.uses_reference() {
        return fail(format!(
            "{op}: {} uses no reference model, but reference log-probabilities or a reference head were given",
            options.loss.name()
        ));
    }
    match reference {
        ReferenceMeta::None => Ok(()),
        ReferenceMeta::LogProbs((ls, ld)) => {
            if ls.num_dims() != 1 || ls[0] != s || !ld.is_float() {
                return fail(format!(
                    "{op}: the reference log-probabilities must be a float tensor of shape [{s}] (chosen then rejected, as x {:?}), got shape {ls:?} and dtype {ld:?}",
                    x.0
                ));
            }
            Ok(())
        }
        ReferenceMeta::Model(rx, rw, rb) => {
            let [rs, rt, _, rv] = sequence_head(op, "reference x", rx, rw, rb.as_ref())?;
            if [rs, rt] != [s, t] {
                return fail(format!(
                    "{op}: the reference x must cover the policy's sequences and positions [{s}, {t}, _], got {:?}",
                    rx.0
                ));
            }
            if rv != v {
                return fail(format!(
                    "{op}: the reference head's vocabulary ({rv}, weight {:?}) differs from the policy's ({v}, weight {:?})",
                    rw.0, weight.0
                ));
            }
            if rx.1 != x.1 {
                return fail(format!(
                    "{op}: the reference x dtype {:?} differs from the policy's {:?}",
                    rx.1, x.1
                ));
            }
            Ok(())
        }
    }
}

/// [`preference`] on tensors of any layer.
pub fn preference_tensors<B: Backend>(
    op: &str,
    x: &B::FloatTensorPrimitive,
    weight: &B::FloatTensorPrimitive,
    bias: Option<&B::FloatTensorPrimitive>,
    targets: &B::IntTensorPrimitive,
    reference: &PreferenceReference<B>,
    options: &PreferenceOptions,
) -> Result<(), LigerError> {
    preference(
        op,
        &meta(x),
        &meta(weight),
        bias.map(meta).as_ref(),
        &meta(targets),
        &ReferenceMeta::of(reference),
        options,
    )
}
