//! Gradient checkpointing of decoder layers (transformers' `gradient_checkpointing`): in the
//! forward each layer runs without recording a graph and keeps only its input; its output
//! becomes a leaf of the graph that follows. [`LayerTape::backward`] then backpropagates
//! the loss to the last layer's output, and layer by layer, last first, runs the layer's
//! forward again on its input, backpropagates through that graph alone, and hands the
//! input's gradient on to the layer before. One layer's activations are alive at a time.
//!
//! Burn 0.21's autodiff cannot run a backward inside another one (its graph cleanup locks
//! every graph, the running one included), so the layers' backwards run one after the
//! other here, each a backward of its own, and their gradients are summed by parameter.

use crate::attention::AttentionInputs;
use crate::decoder_layer::DecoderLayer;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use liger_burn::ops::FusedOps;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// One checkpointed layer: its input, its output (a leaf), the layer and what its
/// attention reads.
struct Segment<B: FusedOps> {
    input: Tensor<B, 3>,
    input_tracked: bool,
    output: Tensor<B, 3>,
    layer: DecoderLayer<B>,
    inputs: AttentionInputs<B>,
}

/// The checkpointed layers of the forwards since the last [`backward`](Self::backward),
/// in order. Clones share it. Type-erased so the model's inner (non-autodiff) module
/// carries the same field.
#[derive(Clone, Default)]
pub struct LayerTape(Arc<Mutex<Vec<Box<dyn Any + Send>>>>);

impl std::fmt::Debug for LayerTape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayerTape({} layers)", self.len())
    }
}

impl LayerTape {
    fn segments(&self) -> std::sync::MutexGuard<'_, Vec<Box<dyn Any + Send>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many layers wait for a backward.
    pub fn len(&self) -> usize {
        self.segments().len()
    }

    /// Whether no layer waits for a backward.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `layer.forward(x, inputs)` without recording its graph when it would be recorded
    /// (`x_tracked`: `x` needs a gradient, or a parameter of `layer` does): the layer and
    /// `x` are kept for [`backward`](Self::backward) and the output is a fresh leaf.
    /// Otherwise the layer runs as usual. Returns the output and whether it is tracked.
    ///
    /// - `x`: `[batch, seq, hidden]` → `[batch, seq, hidden]`
    pub fn forward<B: FusedOps>(
        &self,
        layer: &DecoderLayer<B>,
        x: Tensor<B, 3>,
        x_tracked: bool,
        inputs: &AttentionInputs<B>,
    ) -> (Tensor<B, 3>, bool) {
        if !(x_tracked || trains(layer)) {
            return (layer.forward(x, inputs), false);
        }
        let output = layer
            .clone()
            .map(&mut Leaves { tracked: false })
            .forward(untracked(x.clone()), inputs)
            .require_grad();
        self.segments().push(Box::new(Segment {
            input: x,
            input_tracked: x_tracked,
            output: output.clone(),
            layer: layer.clone(),
            inputs: inputs.clone(),
        }));
        (output, true)
    }

    /// Backpropagates `loss` through the graph of its forward and through every layer
    /// kept since the last call, and returns the gradients of `module`'s parameters
    /// (`GradientsParams::from_grads(loss.backward(), module)` without checkpointing).
    /// The tape is empty afterwards.
    ///
    /// # Panics
    /// When a kept layer belongs to another backend than `B` (cannot happen through
    /// [`CausalLm`](crate::model::CausalLm)).
    pub fn backward<B, M>(&self, loss: Tensor<B, 1>, module: &M) -> GradientsParams
    where
        B: AutodiffBackend + FusedOps,
        M: AutodiffModule<B>,
        DecoderLayer<B>: AutodiffModule<B>,
    {
        let kept = std::mem::take(&mut *self.segments());
        if kept.is_empty() {
            return GradientsParams::from_grads(loss.backward(), module);
        }
        let mut segments: Vec<Segment<B>> = kept
            .into_iter()
            .map(|s| {
                *s.downcast::<Segment<B>>()
                    .expect("LayerTape::backward: a kept layer of another backend")
            })
            .collect();
        let mut total = GradientsParams::new();
        // The gradient reaching each remaining layer's output, by index in `segments`.
        let mut pending: Vec<Option<Tensor<B::InnerBackend, 3>>> = vec![None; segments.len()];
        absorb(loss.backward(), &segments, &mut pending, &mut total, module);
        // Last layer first; each layer's kept tensors are dropped once it is done, as the
        // forward's activations would be (PyTorch frees a checkpoint's input likewise).
        while let Some(s) = segments.pop() {
            let Some(grad) = pending.pop().flatten() else {
                continue;
            };
            let tracked = s.input_tracked;
            let x = untracked(s.input.clone());
            let x = if tracked { x.require_grad() } else { x };
            let layer = s.layer.map(&mut Leaves { tracked: true });
            let y = layer.forward(x.clone(), &s.inputs);
            // `sum(y · grad)` has gradient `grad` at `y`.
            let grads = (y * Tensor::from_inner(grad)).sum().backward();
            let grad_x = if tracked { x.grad(&grads) } else { None };
            add_into(
                &mut total,
                GradientsParams::from_grads(grads, &layer),
                &layer,
            );
            if let Some(grad_x) = grad_x {
                // The input's own graph: the layer before (through its release point), or
                // the embedding for the first layer.
                let upstream = (s.input * Tensor::from_inner(grad_x)).sum();
                absorb(
                    upstream.backward(),
                    &segments,
                    &mut pending,
                    &mut total,
                    module,
                );
            }
        }
        total
    }
}

/// Takes the gradients of the remaining layers' outputs out of a backward's gradients
/// (adding them to `pending`), then `module`'s parameters' gradients (into `total`).
fn absorb<B, M>(
    mut grads: B::Gradients,
    segments: &[Segment<B>],
    pending: &mut [Option<Tensor<B::InnerBackend, 3>>],
    total: &mut GradientsParams,
    module: &M,
) where
    B: AutodiffBackend + FusedOps,
    M: AutodiffModule<B>,
{
    for (s, p) in segments.iter().zip(pending.iter_mut()) {
        if let Some(g) = s.output.grad_remove(&mut grads) {
            *p = Some(match p.take() {
                Some(a) => a + g,
                None => g,
            });
        }
    }
    add_into(total, GradientsParams::from_grads(grads, module), module);
}

/// `x`'s values in a new tensor outside every graph (`detach` keeps a leaf's
/// `require_grad`).
fn untracked<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.set_require_grad(false)
}

/// Whether a parameter of `module` requires a gradient.
pub(crate) fn trains<B: Backend, M: Module<B>>(module: &M) -> bool {
    struct Any(bool);
    impl<B: Backend> ModuleVisitor<B> for Any {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0 |= param.val().is_require_grad();
        }
    }
    let mut v = Any(false);
    module.visit(&mut v);
    v.0
}

/// Every parameter as a new leaf of its own graph, keeping its id (so gradients taken
/// through it are the parameter's): untracked, or `tracked` when it required a gradient.
struct Leaves {
    tracked: bool,
}

impl<B: Backend> ModuleMapper<B> for Leaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, value, mapper) = param.consume();
        let trains = self.tracked && value.is_require_grad();
        let value = untracked(value);
        let value = if trains { value.require_grad() } else { value };
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Adds `more`'s gradients of `module`'s parameters into `total`.
fn add_into<B: AutodiffBackend, M: Module<B>>(
    total: &mut GradientsParams,
    mut more: GradientsParams,
    module: &M,
) {
    struct Add<'a, B: AutodiffBackend> {
        total: &'a mut GradientsParams,
        more: &'a mut GradientsParams,
        _backend: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Add<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let id: ParamId = param.id;
            if let Some(g) = self.more.remove::<B::InnerBackend, D>(id) {
                let sum = match self.total.remove::<B::InnerBackend, D>(id) {
                    Some(a) => a + g,
                    None => g,
                };
                self.total.register::<B::InnerBackend, D>(id, sum);
            }
        }
    }
    module.visit(&mut Add::<B> {
        total,
        more: &mut more,
        _backend: std::marker::PhantomData,
    });
}
