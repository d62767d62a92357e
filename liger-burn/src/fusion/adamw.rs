//! One AdamW step in the fusion stream: one custom operation (`CustomOpIr`) that runs the
//! inner backend's fused step when the stream reaches it. A buffer whose last use this is
//! reaches the kernel alone, so the step updates it in place (dtypes the kernel does not
//! read, f64, are left to the inner backend's stock-op update).

use super::custom_op::{self, CustomKernel, Handles, float_inputs};
use crate::ops::{AdamWMoments, AdamWStepOptions, AdamWStepOutput, FusedOps};
use burn::tensor::TensorMetadata;
use burn_fusion::{Fusion, FusionBackend, FusionTensor};
use burn_ir::TensorIr;

type Tensor<B> = FusionTensor<<B as FusionBackend>::FusionRuntime>;

/// The step's options, and whether moments are among the inputs.
#[derive(Clone, Debug)]
struct AdamWStep {
    options: AdamWStepOptions,
    has_moments: bool,
}

impl<B: FusionBackend + FusedOps> CustomKernel<B> for AdamWStep {
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive> {
        let mut inputs = float_inputs::<B>(inputs, handles);
        let mut next = || inputs.next().expect("custom op declared its inputs");
        let (param, grad) = (next(), next());
        let moments = self.has_moments.then(|| AdamWMoments {
            moment_1: next(),
            moment_2: next(),
            max_moment_2: self.options.amsgrad.then(&mut next),
        });
        let out = B::fused_adamw_step(param, grad, moments, self.options);
        let mut outputs = vec![out.param, out.moments.moment_1, out.moments.moment_2];
        outputs.extend(out.moments.max_moment_2);
        outputs.extend(out.param_copy);
        outputs
    }
}

pub(crate) fn step<B: FusionBackend + FusedOps>(
    param: Tensor<B>,
    grad: Tensor<B>,
    moments: Option<AdamWMoments<Fusion<B>>>,
    options: AdamWStepOptions,
) -> AdamWStepOutput<Fusion<B>> {
    let shape = param.shape();
    let state_dtype = moments
        .as_ref()
        .map_or(options.state_dtype, |m| m.moment_1.dtype());
    let mut outputs = vec![
        (shape.clone(), param.dtype()),
        (shape.clone(), state_dtype),
        (shape.clone(), state_dtype),
    ];
    if options.amsgrad {
        outputs.push((shape.clone(), state_dtype));
    }
    if let Some(dtype) = options.copy_dtype {
        outputs.push((shape, dtype));
    }
    let has_moments = moments.is_some();
    let mut inputs = vec![param, grad];
    if let Some(m) = moments {
        inputs.push(m.moment_1);
        inputs.push(m.moment_2);
        inputs.extend(m.max_moment_2.filter(|_| options.amsgrad));
    }
    let mut out = custom_op::register::<B, _>(
        "liger_adamw_step",
        inputs,
        &outputs,
        AdamWStep {
            options,
            has_moments,
        },
    )
    .into_iter();
    let mut next = || out.next().expect("the step's outputs");
    AdamWStepOutput {
        param: next(),
        moments: AdamWMoments {
            moment_1: next(),
            moment_2: next(),
            max_moment_2: options.amsgrad.then(&mut next),
        },
        param_copy: options.copy_dtype.map(|_| next()),
    }
}
