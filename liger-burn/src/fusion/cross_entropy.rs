//! Cross entropy in the fusion stream: one custom operation with float and int inputs.

use crate::ops::{CrossEntropyOptions, CrossEntropyRows, FusedOps, validate};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use core::marker::PhantomData;

#[derive(Clone, Debug)]
struct CrossEntropyOp<B> {
    desc: CustomOpIr,
    options: CrossEntropyOptions,
    weighted: bool,
    with_grad: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedOps> Operation<B::FusionRuntime> for CrossEntropyOp<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        // Inputs: logits, targets, [class_weight], [grad_scale].
        let inputs = &self.desc.inputs;
        let logits = handles.get_float_tensor::<B>(&inputs[0]);
        let targets = handles.get_int_tensor::<B>(&inputs[1]);
        let mut next = 2;
        let class_weight = self.weighted.then(|| {
            next += 1;
            handles.get_float_tensor::<B>(&inputs[next - 1])
        });
        let grad_scale = self
            .with_grad
            .then(|| handles.get_float_tensor::<B>(&inputs[next]));
        let rows = B::fused_cross_entropy(logits, targets, class_weight, grad_scale, self.options);
        // Outputs: loss, [z_loss], [grad_logits].
        let mut outputs = self.desc.outputs.iter();
        let mut register = |tensor| {
            let ir = outputs.next().expect("custom op declared its outputs");
            handles.register_float_tensor::<B>(&ir.id, tensor);
        };
        register(rows.loss);
        if let Some(z) = rows.z_loss {
            register(z);
        }
        if let Some(g) = rows.grad_logits {
            register(g);
        }
    }
}

pub(crate) fn forward<B: FusionBackend + FusedOps>(
    logits: FusionTensor<B::FusionRuntime>,
    targets: FusionTensor<B::FusionRuntime>,
    class_weight: Option<FusionTensor<B::FusionRuntime>>,
    grad_scale: Option<FusionTensor<B::FusionRuntime>>,
    options: CrossEntropyOptions,
) -> CrossEntropyRows<burn_fusion::Fusion<B>> {
    // Validated here, eagerly: the stream executes later.
    validate::check(validate::cross_entropy_tensors(
        "cross_entropy",
        &logits,
        &targets,
        class_weight.as_ref(),
        grad_scale.as_ref(),
        true,
        &options,
    ));
    let shape = logits.shape();
    let dtype = logits.dtype();
    let rows = shape[0];
    let client = logits.client.clone();
    let weighted = class_weight.is_some();
    let with_grad = grad_scale.is_some();
    let mut inputs = vec![logits, targets];
    inputs.extend(class_weight);
    inputs.extend(grad_scale);
    let mut out_specs = vec![(Shape::new([rows]), DType::F32)];
    if options.return_z_loss {
        out_specs.push((Shape::new([rows]), DType::F32));
    }
    if with_grad {
        out_specs.push((shape, dtype));
    }
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs = out_specs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect::<Vec<_>>();
    let inputs = inputs.into_iter().map(|t| t.into_ir()).collect::<Vec<_>>();
    let desc = CustomOpIr::new("liger_cross_entropy", &inputs, &outputs);
    let mut outs = client
        .register(
            streams,
            OperationIr::Custom(desc.clone()),
            CrossEntropyOp::<B> {
                desc,
                options,
                weighted,
                with_grad,
                _backend: PhantomData,
            },
        )
        .into_iter();
    let loss = outs.next().expect("loss output");
    let z_loss = options
        .return_z_loss
        .then(|| outs.next().expect("z_loss output"));
    let grad_logits = with_grad.then(|| outs.next().expect("grad output"));
    CrossEntropyRows {
        loss,
        z_loss,
        grad_logits,
    }
}
