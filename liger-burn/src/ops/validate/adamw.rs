//! Validation of an AdamW step's inputs: a parameter, its gradient and the moments, all of
//! one shape; float dtypes (ones the kernel reads when `kernel_dtypes`); the moments of one
//! dtype, with the AMSGrad maximum exactly when AMSGrad is on; a step count from 1.

use super::{LigerError, fail, kernel_dtype};
use crate::ops::AdamWStepOptions;
use burn::tensor::{DType, Shape, TensorMetadata};

/// An AdamW step's inputs, for messages and checks.
pub struct AdamWInputs<'a> {
    /// Parameter shape and dtype.
    pub param: (Shape, DType),
    /// Gradient shape and dtype.
    pub grad: (Shape, DType),
    /// Shapes and dtypes of `moment_1`, `moment_2` and `max_moment_2`, when moments are
    /// given.
    pub moments: Option<[Option<(Shape, DType)>; 3]>,
    /// The step's options.
    pub options: &'a AdamWStepOptions,
    /// Whether the dtypes must be ones the kernel reads.
    pub kernel_dtypes: bool,
}

/// Validates an AdamW step's inputs.
pub fn adamw_step(inputs: &AdamWInputs<'_>) -> Result<(), LigerError> {
    const OP: &str = "adamw_step";
    let options = inputs.options;
    let (shape, param_dtype) = (&inputs.param.0, inputs.param.1);
    let dtype_ok = |d: DType| d.is_float() && (!inputs.kernel_dtypes || kernel_dtype(d));
    let what = if inputs.kernel_dtypes {
        "f32, f16 or bf16"
    } else {
        "a float dtype"
    };
    let mut named = vec![
        ("param", Some(inputs.param.clone())),
        ("grad", Some(inputs.grad.clone())),
    ];
    if let Some([m, v, vmax]) = &inputs.moments {
        named.push(("moment_1", m.clone()));
        named.push(("moment_2", v.clone()));
        if options.amsgrad {
            named.push(("max_moment_2", vmax.clone()));
        } else if let Some((s, d)) = vmax {
            return fail(format!(
                "{OP}: max_moment_2 ({s:?}, {d:?}) was given but AMSGrad is off"
            ));
        }
    }
    for (name, meta) in &named {
        let Some((s, d)) = meta else {
            return fail(format!(
                "{OP}: {name} is missing (AMSGrad keeps the running maximum of moment_2; \
                 param {shape:?} {param_dtype:?})"
            ));
        };
        if s != shape {
            return fail(format!(
                "{OP}: {name} has shape {s:?} but param has shape {shape:?}; they must match"
            ));
        }
        if !dtype_ok(*d) {
            return fail(format!(
                "{OP}: {name} has dtype {d:?}, expected {what} (shape {s:?})"
            ));
        }
    }
    if let Some([Some((_, m)), Some((_, v)), vmax]) = &inputs.moments {
        let vmax = vmax.as_ref().map(|x| x.1);
        if m != v || vmax.is_some_and(|x| x != *m) {
            return fail(format!(
                "{OP}: the moments must have one dtype, got moment_1 {m:?}, moment_2 {v:?}, \
                 max_moment_2 {vmax:?} (param {shape:?} {param_dtype:?})"
            ));
        }
    }
    for (name, d) in [
        ("state_dtype", Some(options.state_dtype)),
        ("copy_dtype", options.copy_dtype),
    ] {
        if let Some(d) = d
            && !dtype_ok(d)
        {
            return fail(format!(
                "{OP}: {name} is {d:?}, expected {what} (param {shape:?} {param_dtype:?})"
            ));
        }
    }
    if options.time == 0 {
        return fail(format!(
            "{OP}: time is 0; steps count from 1 (param {shape:?} {param_dtype:?})"
        ));
    }
    Ok(())
}

/// [`adamw_step`] on tensors of any layer (Burn primitives, CubeCL or fusion tensors):
/// `moments` is `(moment_1, moment_2, max_moment_2)`.
pub fn adamw_step_tensors<T: TensorMetadata>(
    param: &T,
    grad: &T,
    moments: Option<(&T, &T, Option<&T>)>,
    options: &AdamWStepOptions,
    kernel_dtypes: bool,
) -> Result<(), LigerError> {
    let meta = |t: &T| (t.shape(), t.dtype());
    adamw_step(&AdamWInputs {
        param: meta(param),
        grad: meta(grad),
        moments: moments.map(|(m, v, x)| [Some(meta(m)), Some(meta(v)), x.map(meta)]),
        options,
        kernel_dtypes,
    })
}
