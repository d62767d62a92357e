//! [`FusedOps`] for `Fusion<B>`: each fused primitive is registered in the fusion stream
//! as one custom operation (`CustomOpIr`), so it is ordered with the surrounding lazily
//! fused ops and executes `B`'s fused kernel when the stream reaches it.
//!
//! Inputs are validated here, eagerly: the stream executes later (possibly on another
//! thread), and bad input must fail where the user called the op.

mod adamw;
mod attention;
mod cross_entropy;
mod custom_op;
mod glu;
mod matmul;
mod rope;

use crate::ops::validate;
use crate::ops::{
    AddRmsNormOutput, FusedOps, LayerNormOutput, NormGrads, RmsNormOptions, RmsNormOutput,
    row_stat_shape,
};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::TensorIr;
use custom_op::{CustomKernel, Handles, float_inputs};

/// Which fused primitive a custom operation runs, with its options.
#[derive(Clone, Debug)]
enum FusedKind {
    RmsNorm(RmsNormOptions),
    AddRmsNorm(RmsNormOptions),
    RmsNormBackward(RmsNormOptions),
    LayerNorm { eps: f64, has_bias: bool },
    LayerNormBackward { has_bias: bool },
    Softmax { log: bool },
    SoftmaxBackward { log: bool },
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for FusedKind {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        match self.clone() {
            FusedKind::RmsNorm(options) => {
                let (x, w) = (next(), next());
                let out = B::fused_rms_norm(x, w, options);
                vec![out.output, out.rstd]
            }
            FusedKind::AddRmsNorm(options) => {
                let (x, r, w) = (next(), next(), next());
                let out = B::fused_add_rms_norm(x, r, w, options);
                vec![out.output, out.sum, out.rstd]
            }
            FusedKind::RmsNormBackward(options) => {
                let (g, x, w, rstd) = (next(), next(), next(), next());
                let grads = B::fused_rms_norm_backward(g, x, w, rstd, options);
                vec![grads.grad_input, grads.grad_weight]
            }
            FusedKind::LayerNorm { eps, has_bias } => {
                let (x, gamma) = (next(), next());
                let beta = has_bias.then(&mut next);
                let out = B::fused_layer_norm(x, gamma, beta, eps);
                vec![out.output, out.mean, out.rstd]
            }
            FusedKind::LayerNormBackward { has_bias } => {
                let (g, x, gamma, mean, rstd) = (next(), next(), next(), next(), next());
                let grads = B::fused_layer_norm_backward(g, x, gamma, mean, rstd, has_bias);
                let mut out = vec![grads.grad_input, grads.grad_weight];
                out.extend(grads.grad_bias);
                out
            }
            FusedKind::Softmax { log } => {
                let x = next();
                vec![if log {
                    B::fused_log_softmax(x)
                } else {
                    B::fused_softmax(x)
                }]
            }
            FusedKind::SoftmaxBackward { log } => {
                let (g, y) = (next(), next());
                vec![if log {
                    B::fused_log_softmax_backward(g, y)
                } else {
                    B::fused_softmax_backward(g, y)
                }]
            }
        }
    }
}

/// Registers one fused primitive in the stream; returns its outputs in declaration order.
fn register<B: FusionBackend + FusedOps>(
    id: &'static str,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outputs: &[(Shape, DType)],
    kind: FusedKind,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    custom_op::register::<B, _>(id, inputs, outputs, kind)
}

fn norm_check<R: FusionRuntime>(
    op: &'static str,
    x: &FusionTensor<R>,
    weight: &FusionTensor<R>,
    bias: Option<&FusionTensor<R>>,
) {
    validate::check(validate::norm_tensors(op, x, weight, bias, true));
}

fn same<R: FusionRuntime>(
    op: &'static str,
    a: (&str, &FusionTensor<R>),
    b: (&str, &FusionTensor<R>),
) {
    validate::check(validate::same_shape_dtype(
        op,
        (a.0, &a.1.shape(), a.1.dtype()),
        (b.0, &b.1.shape(), b.1.dtype()),
    ));
}

impl<B: FusionBackend + FusedOps> FusedOps for Fusion<B> {
    fn fused_rms_norm(
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> RmsNormOutput<Self> {
        norm_check("rms_norm", &x, &weight, None);
        let (shape, dtype) = (x.shape(), x.dtype());
        let outs = [(row_stat_shape(&shape), DType::F32)];
        let [output, rstd]: [_; 2] = register::<B>(
            "liger_rms_norm",
            vec![x, weight],
            &[(shape, dtype), outs[0].clone()],
            FusedKind::RmsNorm(options),
        )
        .try_into()
        .unwrap();
        RmsNormOutput { output, rstd }
    }

    fn fused_add_rms_norm(
        x: FusionTensor<B::FusionRuntime>,
        residual: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> AddRmsNormOutput<Self> {
        same("fused_add_rms_norm", ("x", &x), ("residual", &residual));
        norm_check("fused_add_rms_norm", &x, &weight, None);
        let (shape, dtype) = (x.shape(), x.dtype());
        let [output, sum, rstd]: [_; 3] = register::<B>(
            "liger_add_rms_norm",
            vec![x, residual, weight],
            &[
                (shape.clone(), dtype),
                (shape.clone(), dtype),
                (row_stat_shape(&shape), DType::F32),
            ],
            FusedKind::AddRmsNorm(options),
        )
        .try_into()
        .unwrap();
        AddRmsNormOutput { output, sum, rstd }
    }

    fn fused_rms_norm_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
        weight: FusionTensor<B::FusionRuntime>,
        rstd: FusionTensor<B::FusionRuntime>,
        options: RmsNormOptions,
    ) -> NormGrads<Self> {
        same(
            "rms_norm_backward",
            ("grad_output", &grad_output),
            ("x", &x),
        );
        norm_check("rms_norm_backward", &x, &weight, None);
        let outs = [(x.shape(), x.dtype()), (weight.shape(), weight.dtype())];
        let [grad_input, grad_weight]: [_; 2] = register::<B>(
            "liger_rms_norm_backward",
            vec![grad_output, x, weight, rstd],
            &outs,
            FusedKind::RmsNormBackward(options),
        )
        .try_into()
        .unwrap();
        NormGrads {
            grad_input,
            grad_weight,
            grad_bias: None,
        }
    }

    fn fused_layer_norm(
        x: FusionTensor<B::FusionRuntime>,
        gamma: FusionTensor<B::FusionRuntime>,
        beta: Option<FusionTensor<B::FusionRuntime>>,
        eps: f64,
    ) -> LayerNormOutput<Self> {
        norm_check("layer_norm", &x, &gamma, beta.as_ref());
        let (shape, dtype) = (x.shape(), x.dtype());
        let has_bias = beta.is_some();
        let mut inputs = vec![x, gamma];
        inputs.extend(beta);
        let stat = (row_stat_shape(&shape), DType::F32);
        let [output, mean, rstd]: [_; 3] = register::<B>(
            "liger_layer_norm",
            inputs,
            &[(shape, dtype), stat.clone(), stat],
            FusedKind::LayerNorm { eps, has_bias },
        )
        .try_into()
        .unwrap();
        LayerNormOutput { output, mean, rstd }
    }

    fn fused_layer_norm_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
        gamma: FusionTensor<B::FusionRuntime>,
        mean: FusionTensor<B::FusionRuntime>,
        rstd: FusionTensor<B::FusionRuntime>,
        has_bias: bool,
    ) -> NormGrads<Self> {
        same(
            "layer_norm_backward",
            ("grad_output", &grad_output),
            ("x", &x),
        );
        norm_check("layer_norm_backward", &x, &gamma, None);
        let mut outs = vec![(x.shape(), x.dtype()), (gamma.shape(), gamma.dtype())];
        if has_bias {
            outs.push((gamma.shape(), gamma.dtype()));
        }
        let mut grads = register::<B>(
            "liger_layer_norm_backward",
            vec![grad_output, x, gamma, mean, rstd],
            &outs,
            FusedKind::LayerNormBackward { has_bias },
        )
        .into_iter();
        NormGrads {
            grad_input: grads.next().unwrap(),
            grad_weight: grads.next().unwrap(),
            grad_bias: grads.next(),
        }
    }

    fn fused_softmax(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        softmax::<B>(x, false)
    }

    fn fused_log_softmax(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        softmax::<B>(x, true)
    }

    fn fused_softmax_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        softmax_backward::<B>(grad_output, output, false)
    }

    fn fused_log_softmax_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        softmax_backward::<B>(grad_output, output, true)
    }

    fn fused_glu(
        gate: FusionTensor<B::FusionRuntime>,
        up: FusionTensor<B::FusionRuntime>,
        activation: crate::ops::GluActivation,
    ) -> FusionTensor<B::FusionRuntime> {
        glu::glu::<B>(gate, up, activation)
    }

    fn fused_glu_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        gate: FusionTensor<B::FusionRuntime>,
        up: FusionTensor<B::FusionRuntime>,
        activation: crate::ops::GluActivation,
    ) -> crate::ops::GluGrads<Self> {
        glu::glu_backward::<B>(grad_output, gate, up, activation)
    }

    fn fused_gelu(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        glu::unary::<B>(x, glu::ElementwiseKind::Gelu)
    }

    fn fused_gelu_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        x: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        glu::unary_backward::<B>(grad_output, x, glu::ElementwiseKind::GeluBackward)
    }

    fn fused_sigmoid(x: FusionTensor<B::FusionRuntime>) -> FusionTensor<B::FusionRuntime> {
        glu::unary::<B>(x, glu::ElementwiseKind::Sigmoid)
    }

    fn fused_sigmoid_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        output: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        glu::unary_backward::<B>(grad_output, output, glu::ElementwiseKind::SigmoidBackward)
    }

    fn fused_rope(
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        cos: FusionTensor<B::FusionRuntime>,
        sin: FusionTensor<B::FusionRuntime>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeOutput<Self> {
        rope::forward::<B>(q, k, cos, sin, layout)
    }

    fn fused_rope_backward(
        grad_q: Option<FusionTensor<B::FusionRuntime>>,
        grad_k: Option<FusionTensor<B::FusionRuntime>>,
        cos: FusionTensor<B::FusionRuntime>,
        sin: FusionTensor<B::FusionRuntime>,
        layout: crate::ops::RopeLayout,
    ) -> crate::ops::RopeGrads<Self> {
        rope::backward::<B>(grad_q, grad_k, cos, sin, layout)
    }

    fn fused_cross_entropy(
        logits: FusionTensor<B::FusionRuntime>,
        targets: FusionTensor<B::FusionRuntime>,
        class_weight: Option<FusionTensor<B::FusionRuntime>>,
        grad_scale: Option<FusionTensor<B::FusionRuntime>>,
        z_loss_scale: Option<FusionTensor<B::FusionRuntime>>,
        options: crate::ops::CrossEntropyOptions,
    ) -> crate::ops::CrossEntropyRows<Self> {
        cross_entropy::forward::<B>(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        )
    }

    fn fused_cross_entropy_backward(
        grad: FusionTensor<B::FusionRuntime>,
        grad_rows: FusionTensor<B::FusionRuntime>,
        grad_scale: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        cross_entropy::backward::<B>(grad, grad_rows, grad_scale)
    }

    fn fused_matmul(
        lhs: FusionTensor<B::FusionRuntime>,
        rhs: FusionTensor<B::FusionRuntime>,
    ) -> FusionTensor<B::FusionRuntime> {
        matmul::matmul::<B>(lhs, rhs)
    }

    fn fused_matmul_uses_vendor_library(device: &B::Device, dtype: DType) -> bool {
        B::fused_matmul_uses_vendor_library(device, dtype)
    }

    fn fused_adamw_step(
        param: FusionTensor<B::FusionRuntime>,
        grad: FusionTensor<B::FusionRuntime>,
        moments: Option<crate::ops::AdamWMoments<Self>>,
        options: crate::ops::AdamWStepOptions,
    ) -> crate::ops::AdamWStepOutput<Self> {
        adamw::step::<B>(param, grad, moments, options)
    }

    fn fused_attention(
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        v: FusionTensor<B::FusionRuntime>,
        mask: Option<FusionTensor<B::FusionRuntime>>,
        document_ids: Option<FusionTensor<B::FusionRuntime>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionOutput<Self> {
        attention::forward::<B>(q, k, v, mask, document_ids, options)
    }

    fn fused_attention_backward(
        grad_output: FusionTensor<B::FusionRuntime>,
        q: FusionTensor<B::FusionRuntime>,
        k: FusionTensor<B::FusionRuntime>,
        v: FusionTensor<B::FusionRuntime>,
        mask: Option<FusionTensor<B::FusionRuntime>>,
        document_ids: Option<FusionTensor<B::FusionRuntime>>,
        forward: Option<crate::ops::AttentionOutput<Self>>,
        options: crate::ops::AttentionOptions,
    ) -> crate::ops::AttentionGrads<Self> {
        attention::backward::<B>(grad_output, q, k, v, mask, document_ids, forward, options)
    }

    fn flash_attention_available(
        device: &B::Device,
        dtype: DType,
        head_dim: usize,
        options: &crate::ops::AttentionOptions,
    ) -> bool {
        attention::available::<B>(device, dtype, head_dim, options)
    }
}

fn softmax<B: FusionBackend + FusedOps>(
    x: FusionTensor<B::FusionRuntime>,
    log: bool,
) -> FusionTensor<B::FusionRuntime> {
    let op = if log { "log_softmax" } else { "softmax" };
    validate::check(validate::rows(op, (&x.shape(), x.dtype()), true));
    let out = (x.shape(), x.dtype());
    register::<B>(
        if log {
            "liger_log_softmax"
        } else {
            "liger_softmax"
        },
        vec![x],
        &[out],
        FusedKind::Softmax { log },
    )
    .remove(0)
}

fn softmax_backward<B: FusionBackend + FusedOps>(
    grad: FusionTensor<B::FusionRuntime>,
    output: FusionTensor<B::FusionRuntime>,
    log: bool,
) -> FusionTensor<B::FusionRuntime> {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    same(op, ("grad_output", &grad), ("output", &output));
    validate::check(validate::rows(op, (&output.shape(), output.dtype()), true));
    let out = (output.shape(), output.dtype());
    register::<B>(
        if log {
            "liger_log_softmax_backward"
        } else {
            "liger_softmax_backward"
        },
        vec![grad, output],
        &[out],
        FusedKind::SoftmaxBackward { log },
    )
    .remove(0)
}
