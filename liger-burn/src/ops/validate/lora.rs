//! Validation of LoRA inputs: the adapter matrices against the layer they adapt, the
//! adapter's separate input against `x`, the scale.

use super::{LigerError, fail};
use crate::ops::LoraOptions;
use burn::tensor::{DType, Shape, TensorMetadata};

/// A LoRA adapter's tensors and options: `A: [r, d_in]`, `B: [d_out, r]` of one float
/// dtype, `x_a` (when given) shaped and typed like `x`.
pub struct AdapterInputs<'a> {
    /// Op name for messages.
    pub op: &'a str,
    /// `x`'s shape and dtype (the adapter input's must match).
    pub x: (&'a Shape, DType),
    /// The separate adapter input, if any.
    pub adapter_x: Option<(&'a Shape, DType)>,
    /// `A`.
    pub a: (&'a Shape, DType),
    /// `B`.
    pub b: (&'a Shape, DType),
    /// `d_in` and `d_out` of the adapted layer.
    pub d_in: usize,
    /// See `d_in`.
    pub d_out: usize,
    /// Scale and precision.
    pub options: &'a LoraOptions,
}

/// Checks an adapter (see [`AdapterInputs`]).
pub fn adapter(inp: &AdapterInputs) -> Result<(), LigerError> {
    let op = inp.op;
    let (a_shape, a_dtype) = inp.a;
    let (b_shape, b_dtype) = inp.b;
    let describe = || format!("A {a_shape:?} ({a_dtype:?}), B {b_shape:?} ({b_dtype:?})");
    if a_shape.num_dims() != 2 || b_shape.num_dims() != 2 {
        return fail(format!(
            "{op}: the adapter's A must be [r, d_in] and B [d_out, r] (rank 2); got {}",
            describe()
        ));
    }
    let r = a_shape[0];
    if r == 0 {
        return fail(format!(
            "{op}: LoRA rank 0 (A has no rows); the rank must be at least 1; got {}",
            describe()
        ));
    }
    if a_shape[1] != inp.d_in || b_shape[0] != inp.d_out || b_shape[1] != r {
        return fail(format!(
            "{op}: the adapter must be A [r, {}] and B [{}, r] with one r for a layer of \
             d_in {} and d_out {}; got {}",
            inp.d_in,
            inp.d_out,
            inp.d_in,
            inp.d_out,
            describe()
        ));
    }
    if !a_dtype.is_float() || a_dtype != b_dtype {
        return fail(format!(
            "{op}: A and B must have one float dtype; got {}",
            describe()
        ));
    }
    if let Some((s, d)) = inp.adapter_x
        && (s != inp.x.0 || d != inp.x.1)
    {
        return fail(format!(
            "{op}: the adapter's input must be shaped and typed like x {:?} ({:?}); got {s:?} \
             ({d:?})",
            inp.x.0, inp.x.1
        ));
    }
    let s = inp.options.scale;
    if !s.is_finite() {
        return fail(format!(
            "{op}: the LoRA scale must be finite, got {s} ({})",
            describe()
        ));
    }
    Ok(())
}

/// A LoRA linear layer: `x: [..., d_in]`, `weight: [d_in, d_out]` (Burn's `Linear`
/// layout), `bias: [d_out]`, all of `x`'s float dtype, and the adapter. Returns `d_out`.
#[allow(clippy::too_many_arguments)]
pub fn lora_linear(
    op: &str,
    x: (&Shape, DType),
    weight: (&Shape, DType),
    bias: Option<(&Shape, DType)>,
    adapter_x: Option<(&Shape, DType)>,
    a: (&Shape, DType),
    b: (&Shape, DType),
    options: &LoraOptions,
) -> Result<usize, LigerError> {
    let (xs, xd) = x;
    let (ws, wd) = weight;
    super::rows(op, (xs, xd), false)?;
    let d_in = xs[xs.num_dims() - 1];
    if ws.num_dims() != 2 || ws[0] != d_in {
        return fail(format!(
            "{op}: weight must be [d_in, d_out] (Burn's Linear layout) with d_in = {d_in} to \
             match x {xs:?} ({xd:?}); got {ws:?} ({wd:?})"
        ));
    }
    if wd != xd {
        return fail(format!(
            "{op}: weight dtype {wd:?} does not match x dtype {xd:?} (x {xs:?}, weight {ws:?})"
        ));
    }
    let d_out = ws[1];
    if let Some((bs, bd)) = bias
        && (bs.num_dims() != 1 || bs[0] != d_out || bd != xd)
    {
        return fail(format!(
            "{op}: bias must be [{d_out}] of x's dtype {xd:?} to match weight {ws:?}; got {bs:?} \
             ({bd:?})"
        ));
    }
    adapter(&AdapterInputs {
        op,
        x,
        adapter_x,
        a,
        b,
        d_in,
        d_out,
        options,
    })?;
    Ok(d_out)
}

/// [`lora_linear`] on tensors of any layer (Burn primitives, CubeCL or fusion tensors).
#[allow(clippy::too_many_arguments)]
pub fn lora_linear_tensors<T: TensorMetadata>(
    op: &str,
    x: &T,
    weight: &T,
    bias: Option<&T>,
    adapter_x: Option<&T>,
    a: &T,
    b: &T,
    options: &LoraOptions,
) -> Result<usize, LigerError> {
    let meta = |t: &T| (t.shape(), t.dtype());
    let (x, weight, a, b) = (meta(x), meta(weight), meta(a), meta(b));
    let bias = bias.map(meta);
    let adapter_x = adapter_x.map(meta);
    fn r(m: &(Shape, DType)) -> (&Shape, DType) {
        (&m.0, m.1)
    }
    lora_linear(
        op,
        r(&x),
        r(&weight),
        bias.as_ref().map(r),
        adapter_x.as_ref().map(r),
        r(&a),
        r(&b),
        options,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::from(d.to_vec())
    }

    #[test]
    fn rejects_bad_adapters_naming_shapes() {
        let o = LoraOptions::new(2.0);
        let f = DType::F32;
        let ok = lora_linear(
            "lora_linear",
            (&s(&[2, 3, 8]), f),
            (&s(&[8, 5]), f),
            None,
            None,
            (&s(&[4, 8]), f),
            (&s(&[5, 4]), f),
            &o,
        );
        assert_eq!(ok, Ok(5));
        let cases: [(Shape, Shape, &str); 4] = [
            (s(&[0, 8]), s(&[5, 0]), "rank 0"),
            (s(&[4, 7]), s(&[5, 4]), "[4, 7]"),
            (s(&[4, 8]), s(&[5, 3]), "[5, 3]"),
            (s(&[4, 8]), s(&[6, 4]), "d_out 5"),
        ];
        for (a, b, needle) in cases {
            let err = lora_linear(
                "lora_linear",
                (&s(&[2, 3, 8]), f),
                (&s(&[8, 5]), f),
                None,
                None,
                (&a, f),
                (&b, f),
                &o,
            )
            .unwrap_err()
            .0;
            assert!(
                err.contains(needle) && err.contains("lora_linear"),
                "{needle}: {err}"
            );
        }
        let err = lora_linear(
            "lora_linear",
            (&s(&[2, 8]), f),
            (&s(&[8, 5]), f),
            None,
            Some((&s(&[2, 7]), f)),
            (&s(&[4, 8]), f),
            (&s(&[5, 4]), f),
            &o,
        )
        .unwrap_err()
        .0;
        assert!(err.contains("adapter's input"), "{err}");
        let err = lora_linear(
            "lora_linear",
            (&s(&[2, 8]), f),
            (&s(&[8, 5]), f),
            None,
            None,
            (&s(&[4, 8]), f),
            (&s(&[5, 4]), f),
            &LoraOptions::new(f64::NAN),
        )
        .unwrap_err()
        .0;
        assert!(err.contains("scale"), "{err}");
    }
}
