//! One AdamW step on CubeCL tensors: the fused kernel, updating the parameter and the
//! moments in place when this call holds the only handle on each of their buffers, else
//! writing fresh ones (the same bytes moved either way). Tensors of a dtype the kernel
//! does not read (f64) take Burn's update as stock ops.

use super::{empty_like, launched};
use crate::ops::compose::{self, adamw::bias_corrections};
use crate::ops::{AdamWMoments, AdamWStepOptions, AdamWStepOutput, validate};
use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use liger_cubecl_kernels::adamw::{AdamWBuffers, AdamWScalars, adamw_step};

/// The kernel's scalars for `options` (Burn's precisions: see [`AdamWScalars::burn`]).
fn scalars(options: &AdamWStepOptions) -> AdamWScalars {
    let scalars = AdamWScalars::burn(
        options.lr,
        options.beta_1,
        options.beta_2,
        options.epsilon,
        options.weight_decay,
        options.time,
    );
    debug_assert_eq!(
        (scalars.bias_correction_1, scalars.bias_correction_2),
        bias_corrections(options)
    );
    scalars
}

fn handle<R: CubeRuntime>(t: &Option<CubeTensor<R>>) -> Option<&cubecl::server::Handle> {
    t.as_ref().map(|t| &t.handle)
}

pub(crate) fn step<B, R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<AdamWMoments<B>>,
    options: AdamWStepOptions,
) -> AdamWStepOutput<B>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
{
    let state_dtype = moments
        .as_ref()
        .map_or(options.state_dtype, |m| m.moment_1.dtype);
    let dtypes = [param.dtype, grad.dtype, state_dtype];
    if !dtypes
        .into_iter()
        .chain(options.copy_dtype)
        .all(validate::kernel_dtype)
    {
        // f64 (the kernel reads f32, f16 and bf16): Burn's update as stock ops.
        return compose::adamw::step::<B>(param, grad, moments, options);
    }
    let shape = param.shape();
    let len = shape.num_elements();
    let param = into_contiguous(param);
    let grad = into_contiguous(grad);
    let moments = moments.map(|m| {
        [
            Some(into_contiguous(m.moment_1)),
            Some(into_contiguous(m.moment_2)),
            m.max_moment_2.map(into_contiguous),
        ]
    });
    let first = moments.is_none();
    let in_place = param.can_mut() && moments.iter().flatten().flatten().all(|t| t.can_mut());
    let param_out = if in_place {
        param.clone()
    } else {
        empty_like(&param, shape.clone(), param.dtype)
    };
    let fresh = || empty_like(&param, shape.clone(), state_dtype);
    let state_out: [Option<CubeTensor<R>>; 3] = match &moments {
        Some(state) if in_place => state.clone(),
        _ => [Some(fresh()), Some(fresh()), options.amsgrad.then(fresh)],
    };
    let copy = options
        .copy_dtype
        .map(|dtype| empty_like(&param, shape.clone(), dtype));
    let state_in = moments.as_ref();
    launched(adamw_step::<R>(
        &param.client,
        &super::launch_config(&param.client).optimizer,
        &AdamWBuffers {
            param: &param.handle,
            param_dtype: param.dtype.into(),
            grad: &grad.handle,
            grad_dtype: grad.dtype.into(),
            state_in: match state_in {
                Some([m, v, x]) => [handle(m), handle(v), handle(x)],
                None => [None, None, None],
            },
            state_out: [
                handle(&state_out[0]),
                handle(&state_out[1]),
                handle(&state_out[2]),
            ],
            state_dtype: state_dtype.into(),
            param_out: Some(&param_out.handle),
            copy: copy.as_ref().map(|c| (&c.handle, c.dtype.into())),
            in_place,
        },
        len,
        first,
        options.cautious_weight_decay,
        &scalars(&options),
    ));
    let [moment_1, moment_2, max_moment_2] = state_out;
    AdamWStepOutput {
        param: param_out,
        moments: AdamWMoments {
            moment_1: moment_1.expect("the kernel wrote m"),
            moment_2: moment_2.expect("the kernel wrote v"),
            max_moment_2,
        },
        param_copy: copy,
    }
}
