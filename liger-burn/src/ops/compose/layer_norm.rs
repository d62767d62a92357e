//! LayerNorm as stock Burn ops.

use super::{broadcast_row, reciprocal, sum_rows, to_dtype, to_f32};
use crate::ops::{LayerNormOutput, NormGrads};
use burn::tensor::{TensorMetadata, backend::Backend, ops::FloatTensor};

/// See [`FusedOps::fused_layer_norm`](crate::ops::FusedOps::fused_layer_norm).
pub fn forward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    eps: f64,
) -> LayerNormOutput<B> {
    let dtype = x.dtype();
    let rank = x.shape().num_dims();
    let last = rank - 1;
    let xf = to_f32::<B>(x);
    let mean = B::float_mean_dim(xf.clone(), last);
    let centered = B::float_sub(xf, mean.clone());
    let var = B::float_mean_dim(B::float_mul(centered.clone(), centered.clone()), last);
    let rstd = reciprocal::<B>(B::float_sqrt(B::float_add_scalar(var, eps.into())));
    let gamma = to_f32::<B>(broadcast_row::<B>(gamma, rank));
    let mut out = B::float_mul(B::float_mul(centered, rstd.clone()), gamma);
    if let Some(beta) = beta {
        out = B::float_add(out, to_f32::<B>(broadcast_row::<B>(beta, rank)));
    }
    LayerNormOutput {
        output: to_dtype::<B>(out, dtype),
        mean,
        rstd,
    }
}

/// See [`FusedOps::fused_layer_norm_backward`](crate::ops::FusedOps::fused_layer_norm_backward).
pub fn backward<B: Backend>(
    grad_output: FloatTensor<B>,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
    has_bias: bool,
) -> NormGrads<B> {
    let dtype = x.dtype();
    let gamma_dtype = gamma.dtype();
    let rank = x.shape().num_dims();
    let last = rank - 1;
    let normalized = B::float_mul(B::float_sub(to_f32::<B>(x), mean), rstd.clone());
    let grad = to_f32::<B>(grad_output);
    let scaled = B::float_mul(grad.clone(), to_f32::<B>(broadcast_row::<B>(gamma, rank)));
    let c1 = B::float_mean_dim(B::float_mul(normalized.clone(), scaled.clone()), last);
    let c2 = B::float_mean_dim(scaled.clone(), last);
    let grad_input = B::float_mul(
        B::float_sub(
            scaled,
            B::float_add(B::float_mul(normalized.clone(), c1), c2),
        ),
        rstd,
    );
    let grad_weight = sum_rows::<B>(B::float_mul(grad.clone(), normalized));
    let grad_bias = has_bias.then(|| to_dtype::<B>(sum_rows::<B>(grad), gamma_dtype));
    NormGrads {
        grad_input: to_dtype::<B>(grad_input, dtype),
        grad_weight: to_dtype::<B>(grad_weight, gamma_dtype),
        grad_bias,
    }
}
