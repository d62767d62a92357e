//! The one piece every fused primitive shares in the fusion stream: a custom operation
//! (`CustomOpIr`) that, when the stream reaches it, runs `B`'s fused primitive on the
//! handles of its declared inputs and registers the results as its declared outputs.
//!
//! When the inner backend's queue is handed on: [`crate::hand_off`].

use crate::hand_off::HandOff;
use crate::ops::FusedOps;
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use core::fmt::Debug;
use core::marker::PhantomData;

/// The handles of a running custom operation.
pub(crate) type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// What a custom operation runs: `B`'s primitive on the inputs it declared (in order),
/// returning its float outputs in declaration order.
pub(crate) trait CustomKernel<B: FusionBackend>:
    Clone + Debug + Send + Sync + 'static
{
    fn run(&self, inputs: &[TensorIr], handles: &mut Handles<B>) -> Vec<B::FloatTensorPrimitive>;
}

/// The float tensors of `inputs`, in order (for kernels whose inputs are all float).
pub(crate) fn float_inputs<B: FusionBackend>(
    inputs: &[TensorIr],
    handles: &mut Handles<B>,
) -> std::vec::IntoIter<B::FloatTensorPrimitive> {
    inputs
        .iter()
        .map(|t| handles.get_float_tensor::<B>(t))
        .collect::<Vec<_>>()
        .into_iter()
}

#[derive(Clone, Debug)]
struct CustomOp<B, K> {
    desc: CustomOpIr,
    kernel: K,
    /// The registering thread's test overrides: the stream runs on another thread.
    #[cfg(feature = "test-hooks")]
    hooks: crate::test_hooks::Captured,
    /// Hand the inner backend's queue on once the kernel is queued.
    hand_off_kernel: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedOps, K: CustomKernel<B>> Operation<B::FusionRuntime>
    for CustomOp<B, K>
{
    fn execute(&self, handles: &mut Handles<B>) {
        #[cfg(feature = "test-hooks")]
        let outputs =
            crate::test_hooks::within(&self.hooks, || self.kernel.run(&self.desc.inputs, handles));
        #[cfg(not(feature = "test-hooks"))]
        let outputs = self.kernel.run(&self.desc.inputs, handles);
        assert_eq!(
            outputs.len(),
            self.desc.outputs.len(),
            "custom op {}: the kernel returned another number of outputs than declared",
            self.desc.id
        );
        let device = self
            .hand_off_kernel
            .then(|| outputs.first().map(B::float_device))
            .flatten();
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&ir.id, tensor);
        }
        if let Some(device) = device {
            B::hand_off_queued(&device);
        }
    }
}

/// Registers `kernel` as the custom operation `id` on `inputs` (validated at the API entry,
/// eagerly: the stream runs later); returns its outputs, of the given shapes and dtypes,
/// in order.
pub(crate) fn register<B: FusionBackend + FusedOps, K: CustomKernel<B>>(
    id: &'static str,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outputs: &[(Shape, DType)],
    kernel: K,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect::<Vec<_>>();
    let inputs = inputs.into_iter().map(|t| t.into_ir()).collect::<Vec<_>>();
    let desc = CustomOpIr::new(id, &inputs, &outputs);
    let hand_off = crate::hand_off::current();
    let outputs = client.register(
        streams,
        OperationIr::Custom(desc.clone()),
        CustomOp::<B, K> {
            desc,
            kernel,
            #[cfg(feature = "test-hooks")]
            hooks: crate::test_hooks::capture(),
            hand_off_kernel: hand_off != HandOff::Runtime,
            _backend: PhantomData,
        },
    );
    if hand_off == HandOff::Operations {
        client.flush_queue();
    }
    outputs
}
