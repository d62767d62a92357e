//! RMSNorm and residual-add RMSNorm as stock Burn ops.

use super::{broadcast_row, reciprocal, sum_rows, to_dtype, to_f32};
use crate::ops::{AddRmsNormOutput, NormGrads, RmsNormCasting, RmsNormOptions, RmsNormOutput};
use burn::tensor::{TensorMetadata, backend::Backend, ops::FloatTensor};

/// See [`FusedOps::fused_rms_norm`](crate::ops::FusedOps::fused_rms_norm).
pub fn forward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    options: RmsNormOptions,
) -> RmsNormOutput<B> {
    let dtype = x.dtype();
    let rank = x.shape().num_dims();
    let last = rank - 1;
    let xf = to_f32::<B>(x);
    let mean_square = B::float_mean_dim(B::float_mul(xf.clone(), xf.clone()), last);
    let rstd = reciprocal::<B>(B::float_sqrt(B::float_add_scalar(
        mean_square,
        options.eps.into(),
    )));
    let normalized = B::float_mul(xf, rstd.clone());
    let weight = broadcast_row::<B>(weight, rank);
    let output = match options.casting {
        RmsNormCasting::Llama => {
            let scale = B::float_add_scalar(weight, options.offset.into());
            B::float_mul(to_dtype::<B>(normalized, dtype), scale)
        }
        RmsNormCasting::Gemma => {
            let scale = B::float_add_scalar(to_f32::<B>(weight), options.offset.into());
            to_dtype::<B>(B::float_mul(normalized, scale), dtype)
        }
    };
    RmsNormOutput { output, rstd }
}

/// See [`FusedOps::fused_add_rms_norm`](crate::ops::FusedOps::fused_add_rms_norm).
pub fn add_forward<B: Backend>(
    x: FloatTensor<B>,
    residual: FloatTensor<B>,
    weight: FloatTensor<B>,
    options: RmsNormOptions,
) -> AddRmsNormOutput<B> {
    let sum = B::float_add(x, residual);
    let RmsNormOutput { output, rstd } = forward::<B>(sum.clone(), weight, options);
    AddRmsNormOutput { output, sum, rstd }
}

/// See [`FusedOps::fused_rms_norm_backward`](crate::ops::FusedOps::fused_rms_norm_backward).
pub fn backward<B: Backend>(
    grad_output: FloatTensor<B>,
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    rstd: FloatTensor<B>,
    options: RmsNormOptions,
) -> NormGrads<B> {
    let dtype = x.dtype();
    let weight_dtype = weight.dtype();
    let rank = x.shape().num_dims();
    let last = rank - 1;
    let normalized = B::float_mul(to_f32::<B>(x), rstd.clone());
    let grad = to_f32::<B>(grad_output);
    let scale = B::float_add_scalar(
        to_f32::<B>(broadcast_row::<B>(weight, rank)),
        options.offset.into(),
    );
    let grad_normalized = B::float_mul(grad.clone(), scale);
    let dot = B::float_mean_dim(
        B::float_mul(grad_normalized.clone(), normalized.clone()),
        last,
    );
    let grad_input = B::float_mul(
        B::float_sub(grad_normalized, B::float_mul(normalized.clone(), dot)),
        rstd,
    );
    let grad_weight = sum_rows::<B>(B::float_mul(grad, normalized));
    NormGrads {
        grad_input: to_dtype::<B>(grad_input, dtype),
        grad_weight: to_dtype::<B>(grad_weight, weight_dtype),
        grad_bias: None,
    }
}
