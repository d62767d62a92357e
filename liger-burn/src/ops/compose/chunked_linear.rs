//! What the chunked fused-linear losses share: a chunk's logits `x_c Wᵀ (+ b)` through
//! [`FusedOps::fused_matmul`], and the gradients of the linear layer from a chunk's logits
//! gradient `g_c`: `grad_x_c = g_c W`, `grad_W += g_cᵀ x_c` ([`FusedOps::fused_matmul_add`]:
//! on CUDA one cuBLASLt call adding the f32-accumulated product inside the accumulator's
//! buffer), `grad_b += Σ_rows f32(g_c)`, the weight and bias gradients accumulated in f32
//! over the chunks and cast once at the end (see [`super::linear_cross_entropy`] for what
//! that accumulator costs), or the weight gradient summed in its own dtype
//! ([`WeightGradAccumulation::WeightDtype`]).

use super::{to_dtype, to_f32};
use crate::ops::{FusedOps, WeightGradAccumulation};
use burn::tensor::{DType, Tensor, TensorPrimitive, ops::FloatTensor};

pub(crate) fn float<B: FusedOps, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

pub(crate) fn prim<B: FusedOps, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// `a · b` through [`FusedOps::fused_matmul`] (cuBLASLt on CUDA), transposed views as
/// they are.
pub(crate) fn matmul<B: FusedOps>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    float(B::fused_matmul(prim(a), prim(b)))
}

/// A chunk's logits `x_c · weight_t (+ bias)`: `x_c: [m, H]`, `weight_t: [H, V]` (the
/// transposed view of the `[V, H]` weight), `bias: [1, V]`; `[m, V]` in the input dtype.
pub(crate) fn logits<B: FusedOps>(
    x_c: Tensor<B, 2>,
    weight_t: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 2>>,
) -> Tensor<B, 2> {
    let logits = matmul::<B>(x_c, weight_t.clone());
    match bias {
        Some(b) => logits + b.clone(),
        None => logits,
    }
}

/// The accumulators of the weight and bias gradients over the chunks: the bias's in f32,
/// the weight's in f32 or in the chunks' dtype (`accumulation`).
pub(crate) struct LinearGrads<B: FusedOps> {
    weight: Option<Tensor<B, 2>>,
    bias: Option<Tensor<B, 2>>,
    want_weight: bool,
    has_bias: bool,
    accumulation: WeightGradAccumulation,
}

impl<B: FusedOps> LinearGrads<B> {
    /// Empty accumulators (the bias's only when the layer has one).
    pub(crate) fn new(has_bias: bool) -> Self {
        Self::wanted(true, has_bias)
    }

    /// Accumulators of only the gradients wanted: the weight's when `weight`, the bias's
    /// when `bias` (a frozen LM head costs no `[V, H]` gradient).
    pub(crate) fn wanted(weight: bool, bias: bool) -> Self {
        Self {
            weight: None,
            bias: None,
            want_weight: weight,
            has_bias: bias,
            accumulation: WeightGradAccumulation::F32,
        }
    }

    /// The same, the weight gradient summed as `accumulation` says.
    pub(crate) fn with_accumulation(mut self, accumulation: WeightGradAccumulation) -> Self {
        self.accumulation = accumulation;
        self
    }

    /// Accumulates the chunk's weight and bias gradients from its logits gradient
    /// `g: [m, V]` and input `x_c: [m, H]`, and returns its input gradient `g · weight`,
    /// `[m, H]`.
    pub(crate) fn add(
        &mut self,
        g: Tensor<B, 2>,
        x_c: Tensor<B, 2>,
        weight: &Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        let grad_x = matmul::<B>(g.clone(), weight.clone());
        self.accumulate(g, x_c);
        grad_x
    }

    /// Accumulates the chunk's weight and bias gradients (those wanted) from its logits
    /// gradient `g: [m, V]` and input `x_c: [m, H]`, without the input gradient.
    pub(crate) fn accumulate(&mut self, g: Tensor<B, 2>, x_c: Tensor<B, 2>) {
        if self.want_weight {
            let g_t = g.clone().transpose();
            self.weight = Some(match (self.accumulation, self.weight.take()) {
                // The first chunk's product is the sum so far, rounded once to the dtype.
                (WeightGradAccumulation::WeightDtype, None) => matmul::<B>(g_t, x_c.clone()),
                (_, Some(acc)) => {
                    float(B::fused_matmul_add(prim(acc), prim(g_t), prim(x_c.clone())))
                }
                (WeightGradAccumulation::F32, None) => {
                    // Every chunk, the first included, goes through the same f32 addition.
                    let shape = [g_t.dims()[0], x_c.dims()[1]];
                    let acc = Tensor::<B, 2>::zeros(shape, (&g.device(), DType::F32));
                    float(B::fused_matmul_add(prim(acc), prim(g_t), prim(x_c.clone())))
                }
            });
        }
        if self.has_bias {
            let gb = float::<B, 2>(to_f32::<B>(prim(g))).sum_dim(0);
            self.bias = Some(match self.bias.take() {
                Some(acc) => acc + gb,
                None => gb,
            });
        }
    }

    /// The weight gradient in `w_dtype` and the bias gradient (`[V]`) in `b_dtype`, when
    /// a chunk was added.
    pub(crate) fn finish(
        self,
        w_dtype: DType,
        b_dtype: DType,
    ) -> (Option<FloatTensor<B>>, Option<FloatTensor<B>>) {
        let grad_b = self.bias.map(|g| {
            let v = g.dims()[1];
            to_dtype::<B>(prim(g.reshape([v])), b_dtype)
        });
        (self.weight.map(|g| to_dtype::<B>(prim(g), w_dtype)), grad_b)
    }
}
