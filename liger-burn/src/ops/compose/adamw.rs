//! One AdamW step as stock Burn ops: Burn 0.21's `AdamW` (`burn-optim`, `optim/adamw.rs`)
//! op for op, with the same scalars in the same precisions, so on f32 tensors it gives
//! Burn's numbers bit for bit. Tensors of other dtypes are widened to f32 (f64 stays f64),
//! updated, and rounded once to their own dtypes: the fused kernel's contract.

use super::to_dtype;
use crate::ops::{AdamWMoments, AdamWStepOptions, AdamWStepOutput};
use burn::tensor::{
    DType, Shape, Tensor, TensorMetadata, TensorPrimitive, backend::Backend, ops::FloatTensor,
};

/// `x` as a flat `[n]` tensor of `dtype`.
fn flat<B: Backend>(x: FloatTensor<B>, dtype: DType) -> Tensor<B, 1> {
    let n = x.shape().num_elements();
    let x = B::float_reshape(to_dtype::<B>(x, dtype), Shape::new([n]));
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// `t` back to `shape`, rounded to `dtype`.
fn shaped<B: Backend>(t: Tensor<B, 1>, shape: &Shape, dtype: DType) -> FloatTensor<B> {
    to_dtype::<B>(
        B::float_reshape(t.into_primitive().tensor(), shape.clone()),
        dtype,
    )
}

/// The bias corrections `1 - β₁ᵗ` and `1 - β₂ᵗ`, in f32 with `powi`, as Burn computes them.
pub(crate) fn bias_corrections(options: &AdamWStepOptions) -> (f32, f32) {
    let t = options.time.min(i32::MAX as usize) as i32;
    (1.0 - options.beta_1.powi(t), 1.0 - options.beta_2.powi(t))
}

/// See [`FusedOps::fused_adamw_step`](crate::ops::FusedOps::fused_adamw_step).
pub fn step<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<AdamWMoments<B>>,
    options: AdamWStepOptions,
) -> AdamWStepOutput<B> {
    let shape = param.shape();
    let param_dtype = param.dtype();
    let state_dtype = moments
        .as_ref()
        .map_or(options.state_dtype, |m| m.moment_1.dtype());
    let compute = if [param_dtype, grad.dtype(), state_dtype].contains(&DType::F64) {
        DType::F64
    } else {
        DType::F32
    };
    let grad = flat::<B>(grad, compute);
    let tensor = flat::<B>(param, compute);
    let factor_1 = 1.0 - options.beta_1;
    let factor_2 = 1.0 - options.beta_2;
    let (moment_1, moment_2, max_moment_2) = match moments {
        Some(state) => {
            let moment_1 = flat::<B>(state.moment_1, compute)
                .mul_scalar(options.beta_1)
                .add(grad.clone().mul_scalar(factor_1));
            let moment_2 = flat::<B>(state.moment_2, compute)
                .mul_scalar(options.beta_2)
                .add(grad.square().mul_scalar(factor_2));
            let max_moment_2 = state
                .max_moment_2
                .filter(|_| options.amsgrad)
                .map(|max| flat::<B>(max, compute).max_pair(moment_2.clone()));
            (moment_1, moment_2, max_moment_2)
        }
        None => {
            let moment_1 = grad.clone().mul_scalar(factor_1);
            let moment_2 = grad.square().mul_scalar(factor_2);
            let max_moment_2 = options.amsgrad.then(|| moment_2.clone());
            (moment_1, moment_2, max_moment_2)
        }
    };
    let (correction_1, correction_2) = bias_corrections(&options);
    let moment_1_corrected = moment_1.clone().div_scalar(correction_1);
    let moment_2_corrected = max_moment_2
        .as_ref()
        .unwrap_or(&moment_2)
        .clone()
        .div_scalar(correction_2);
    let delta = moment_1_corrected.div(moment_2_corrected.sqrt().add_scalar(options.epsilon));

    let decay_rate = options.lr * options.weight_decay as f64;
    let decayed = if decay_rate == 0.0 {
        tensor
    } else if options.cautious_weight_decay {
        // No decay where the parameter and the updated first moment differ in sign.
        let tensor_pos = tensor.clone().greater_equal_elem(0.0);
        let moment_pos = moment_1.clone().greater_equal_elem(0.0);
        let differ = tensor_pos.not_equal(moment_pos);
        tensor.clone() - tensor.mul_scalar(decay_rate).mask_fill(differ, 0.0)
    } else {
        tensor.mul_scalar(1.0 - decay_rate)
    };
    let updated = decayed - delta.mul_scalar(options.lr);

    let param_copy = options
        .copy_dtype
        .map(|dtype| shaped::<B>(updated.clone(), &shape, dtype));
    AdamWStepOutput {
        param: shaped::<B>(updated, &shape, param_dtype),
        moments: AdamWMoments {
            moment_1: shaped::<B>(moment_1, &shape, state_dtype),
            moment_2: shaped::<B>(moment_2, &shape, state_dtype),
            max_moment_2: max_moment_2.map(|m| shaped::<B>(m, &shape, state_dtype)),
        },
        param_copy,
    }
}
