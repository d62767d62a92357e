//! Validation of the chunked post-training losses' inputs: a linear head
//! (`x: [S, T, H]`, `weight: [V, H]`, `bias: [V]`, one float dtype), integer targets
//! `[S, T]`, and each loss's own tensors and options.

use super::{LigerError, fail};
use crate::ops::{PreferenceOptions, ReferenceInput};
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
    pub fn of<B: Backend>(reference: &ReferenceInput<B>) -> Self {
        match reference {
            ReferenceInput::None => ReferenceMeta::None,
            ReferenceInput::LogProbs(l) => ReferenceMeta::LogProbs(meta(l)),
            ReferenceInput::Model { x, weight, bias } => {
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

/// A linear head over rows: `x: [N, H]` (named `x_name`), `weight: [V, H]`, `bias: [V]`,
/// one float dtype, no empty dimension. Returns `[N, H, V]`.
pub fn row_head(
    op: &str,
    x_name: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
) -> Result<[usize; 3], LigerError> {
    let (xs, xd) = x;
    if xs.num_dims() != 2 {
        return fail(format!(
            "{op}: {x_name} must be [N, H] (rank 2), got shape {xs:?} (dtype {xd:?})"
        ));
    }
    let as_sequences = (Shape::new([1, xs[0], xs[1]]), *xd);
    let [_, n, h, v] = sequence_head(op, x_name, &as_sequences, weight, bias)?;
    Ok([n, h, v])
}

/// Validates a fused linear distillation's inputs: the student's head over `x: [N, H]`,
/// the teacher's over `[N, H_t]` with a vocabulary at least the student's (a larger one
/// pads the student's logits, as Liger-Kernel), one dtype, integer `targets: [N]`, and the
/// options.
#[allow(clippy::too_many_arguments)]
pub fn distill(
    op: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
    teacher: (&Meta, &Meta, Option<&Meta>),
    targets: &Meta,
    options: &crate::ops::DistillOptions,
) -> Result<(), LigerError> {
    options
        .check()
        .map_err(|e| LigerError(format!("{op}: {e}")))?;
    let [n, _, v] = row_head(op, "x", x, weight, bias)?;
    let [tn, _, tv] = row_head(op, "teacher x", teacher.0, teacher.1, teacher.2)?;
    if tn != n {
        return fail(format!(
            "{op}: the teacher x must have the student's {n} rows, got {:?} (student x {:?})",
            teacher.0.0, x.0
        ));
    }
    if tv < v {
        return fail(format!(
            "{op}: the teacher's vocabulary ({tv}, weight {:?}) is smaller than the student's ({v}, weight {:?}): teacher and student must share the vocabulary (a teacher's may only be padded larger)",
            teacher.1.0, weight.0
        ));
    }
    if teacher.0.1 != x.1 {
        return fail(format!(
            "{op}: the teacher x dtype {:?} differs from the student's {:?}",
            teacher.0.1, x.1
        ));
    }
    let (ts, td) = targets;
    if ts.num_dims() != 1 || ts[0] != n || !td.is_int() {
        return fail(format!(
            "{op}: targets must be an integer tensor of shape [{n}] to match x {:?}, got shape {ts:?} and dtype {td:?}",
            x.0
        ));
    }
    Ok(())
}

/// Validates a divergence's inputs: `input: [N, V]` (no empty dimension, a float dtype),
/// `target` of its shape and dtype, integer `labels: [N]`, and the options.
pub fn divergence(
    op: &str,
    input: &Meta,
    target: &Meta,
    labels: Option<&Meta>,
    options: &crate::ops::DivergenceOptions,
) -> Result<(), LigerError> {
    options
        .check()
        .map_err(|e| LigerError(format!("{op}: {e}")))?;
    let (is, id) = input;
    if is.num_dims() != 2 {
        return fail(format!(
            "{op}: input must be [N, V] (rank 2), got shape {is:?} (dtype {id:?})"
        ));
    }
    super::rows(op, (is, *id), false)?;
    super::same_shape_dtype(op, ("input", is, *id), ("target", &target.0, target.1))?;
    if let Some((ls, ld)) = labels
        && (ls.num_dims() != 1 || ls[0] != is[0] || !ld.is_int())
    {
        return fail(format!(
            "{op}: labels must be an integer tensor of shape [{}] to match input {is:?}, got shape {ls:?} and dtype {ld:?}",
            is[0]
        ));
    }
    Ok(())
}

/// A float tensor of exactly `shape` (named `name`), for inputs that go with `x`.
fn float_of_shape(
    op: &str,
    name: &str,
    t: &Meta,
    shape: &[usize],
    x: &Shape,
) -> Result<(), LigerError> {
    let (ts, td) = t;
    if ts.num_dims() != shape.len() || (0..shape.len()).any(|d| ts[d] != shape[d]) || !td.is_float()
    {
        return fail(format!(
            "{op}: {name} must be a float tensor of shape {shape:?} to match x {x:?}, got shape {ts:?} and dtype {td:?}"
        ));
    }
    Ok(())
}

/// A reference of per-sequence (`[S]`) or per-token (`[S, T]`) log-probabilities, or a
/// head over `[S, T, H_ref]` with the policy's vocabulary and dtype.
fn reference_input(
    op: &str,
    reference: &ReferenceMeta,
    given: &[usize],
    x: &Meta,
    v: usize,
) -> Result<(), LigerError> {
    let (s, t) = (x.0[0], x.0[1]);
    match reference {
        ReferenceMeta::None => Ok(()),
        ReferenceMeta::LogProbs(l) => {
            float_of_shape(op, "the reference log-probabilities", l, given, &x.0)
        }
        ReferenceMeta::Model(rx, rw, rb) => {
            let [rs, rt, _, rv] = sequence_head(op, "reference x", rx, rw, rb.as_ref())?;
            if [rs, rt] != [s, t] || rv != v || rx.1 != x.1 {
                return fail(format!(
                    "{op}: the reference head must cover the policy's sequences and positions [{s}, {t}, _] with its vocabulary {v} and dtype {:?}; got x {:?} ({:?}) and weight {:?}",
                    x.1, rx.0, rx.1, rw.0
                ));
            }
            Ok(())
        }
    }
}

/// Validates a fused linear KTO's inputs: the head over `x: [B, T, H]`, integer
/// `targets: [B, T]` and `labels: [B]`, a reference of `[B]` log-probabilities or a head, a
/// `[1]` KL estimate, and the options.
#[allow(clippy::too_many_arguments)]
pub fn kto(
    op: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
    targets: &Meta,
    labels: &Meta,
    reference: &ReferenceMeta,
    kl: Option<&Meta>,
    options: &crate::ops::KtoOptions,
) -> Result<(), LigerError> {
    options
        .check()
        .map_err(|e| LigerError(format!("{op}: {e}")))?;
    let [s, t, _, v] = sequence_head(op, "x", x, weight, bias)?;
    sequence_targets(op, "targets", targets, [s, t], &x.0)?;
    let (ls, ld) = labels;
    if ls.num_dims() != 1 || ls[0] != s || !ld.is_int() {
        return fail(format!(
            "{op}: labels must be an integer tensor of shape [{s}] (1 desirable, 0 undesirable) to match x {:?}, got shape {ls:?} and dtype {ld:?}",
            x.0
        ));
    }
    if let Some(k) = kl {
        float_of_shape(op, "kl", k, &[1], &x.0)?;
    }
    reference_input(op, reference, &[s], x, v)
}

/// Validates a fused linear GRPO's inputs: the head over `x: [B, T, H]`, integer
/// `completion_ids` and `completion_mask` `[B, T]`, `advantages: [B]`, a reference of
/// `[B, T]` log-probabilities or a head (needed when `β ≠ 0`), old log-probabilities
/// `[B, T]`, and the options.
#[allow(clippy::too_many_arguments)]
pub fn grpo(
    op: &str,
    x: &Meta,
    weight: &Meta,
    bias: Option<&Meta>,
    completion_ids: &Meta,
    completion_mask: &Meta,
    advantages: &Meta,
    reference: &ReferenceMeta,
    old_logps: Option<&Meta>,
    options: &crate::ops::GrpoOptions,
) -> Result<(), LigerError> {
    options
        .check()
        .map_err(|e| LigerError(format!("{op}: {e}")))?;
    let [s, t, _, v] = sequence_head(op, "x", x, weight, bias)?;
    sequence_targets(op, "completion_ids", completion_ids, [s, t], &x.0)?;
    sequence_targets(op, "completion_mask", completion_mask, [s, t], &x.0)?;
    float_of_shape(op, "advantages", advantages, &[s], &x.0)?;
    if let Some(o) = old_logps {
        float_of_shape(op, "old_logps", o, &[s, t], &x.0)?;
    }
    if options.beta != 0.0 && matches!(reference, ReferenceMeta::None) {
        return fail(format!(
            "{op}: beta = {} weighs a KL to the reference model, but no reference log-probabilities or head were given (set beta to 0 to train without one)",
            options.beta
        ));
    }
    reference_input(op, reference, &[s, t], x, v)
}
