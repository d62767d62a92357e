//! Gradient clipping by the global L2 norm over all parameters, as PyTorch's
//! `clip_grad_norm_`: `norm = sqrt(Σ_params Σ g²)`; when `max_norm / (norm + 1e-6) < 1`
//! every gradient is multiplied by that factor. Burn's `GradientClippingConfig::Norm`
//! clips each tensor by its own norm, which changes the direction of the update; this
//! keeps it.
//!
//! The squared sums are computed on the device in f32 (whatever the parameter dtype) and
//! read back once per step.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};
use std::marker::PhantomData;

/// PyTorch's epsilon in the clip coefficient.
pub const CLIP_EPS: f64 = 1e-6;

/// Outcome of [`clip_global_norm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipOutcome {
    /// Global L2 norm of the gradients before clipping.
    pub norm: f64,
    /// Factor the gradients were multiplied by (1 when not clipped).
    pub scale: f64,
}

struct SquaredSums<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sums: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredSums<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let g = g.cast(DType::F32);
            self.sums.push((g.clone() * g).sum());
        }
    }
}

struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: f64,
    _b: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads
                .register::<B::InnerBackend, D>(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Global L2 norm of the gradients of `module`'s parameters (parameters without a
/// gradient count as 0).
pub fn global_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> f64 {
    let mut v = SquaredSums::<B> {
        grads,
        sums: Vec::new(),
    };
    module.visit(&mut v);
    if v.sums.is_empty() {
        return 0.0;
    }
    let total: f64 = Tensor::cat(v.sums, 0).sum().into_scalar().elem();
    total.sqrt()
}

/// Multiplies every gradient of `module`'s parameters by `factor`.
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    let mut v = Scale::<B> {
        grads,
        factor,
        _b: PhantomData,
    };
    module.visit(&mut v);
}

/// Clips `grads` to a global L2 norm of at most `max_norm` (PyTorch's coefficient
/// `max_norm / (norm + 1e-6)`, applied when below 1). `max_norm: None` only measures.
/// A non-finite norm is returned as is, gradients untouched (the caller stops).
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: Option<f64>,
) -> ClipOutcome {
    let norm = global_grad_norm::<B, M>(module, grads);
    let scale = match max_norm {
        Some(max) if norm.is_finite() => (max / (norm + CLIP_EPS)).min(1.0),
        _ => 1.0,
    };
    if scale < 1.0 {
        scale_grads::<B, M>(module, grads, scale);
    }
    ClipOutcome { norm, scale }
}
