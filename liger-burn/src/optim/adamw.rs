//! AdamW with the update of [`FusedOps::fused_adamw_step`]: Burn 0.21's `AdamW` numbers
//! (same formula, same scalars; bit for bit on the stock-op fallback in f32) in one kernel
//! launch per parameter on CubeCL backends, and mixed-precision training of f16/bf16
//! parameters from f32 master weights.
//!
//! ```ignore
//! use liger_burn::optim::AdamWConfig;
//! let mut optim = AdamWConfig::new().with_weight_decay(0.01).init::<B, MyModel<B>>();
//! let model = optim.step(lr, model, grads); // burn::optim::Optimizer
//! ```
//!
//! # Against PyTorch's `torch.optim.AdamW`
//!
//! The same update: decoupled weight decay `p·(1 - lr·wd)` on the old parameter, moments
//! `m = β₁m + (1-β₁)g`, `v = β₂v + (1-β₂)g²`, ε added to the bias-corrected root
//! `√(v/(1-β₂ᵗ))`, AMSGrad's maximum taken over `v` before the bias correction. Rounding
//! differs: PyTorch folds the bias corrections into the step size,
//! `p -= lr/(1-β₁ᵗ) · m / (√v/√(1-β₂ᵗ) + ε)`, and computes them in f64 on the host; Burn,
//! and so this optimizer, divides the moments by `1 - βᵗ` computed in f32. The defaults
//! differ: [`AdamWConfig`] keeps Burn's (ε 1e-5, weight decay 1e-4) where PyTorch has
//! ε 1e-8 and weight decay 1e-2. Cautious weight decay is Burn's, not PyTorch's. On a
//! bf16 model PyTorch keeps the moments in bf16 and updates the bf16 weights
//! ([`LowPrecisionUpdate::Pure`]); each op rounds to bf16 there and in Burn's `AdamW`,
//! where the fused step computes in f32 and rounds once.
//!
//! Its record is Burn's `AdamWState` (field `momentum`, an `AdaptiveMomentumState`) plus an
//! optional `master` tensor ([`AdamWStateItem`]), so a record of Burn's `AdamW` loads into
//! it (the master copy is then taken from the parameter at the next step).

use crate::ops::{AdamWMoments, AdamWStepOptions, FusedOps, validate};
use burn::config::Config;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use serde::{Deserialize, Serialize};

/// How [`AdamW`] updates f16 and bf16 parameters (f32 parameters are updated the same way
/// under both).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LowPrecisionUpdate {
    /// Mixed precision (PyTorch AMP, Hugging Face Trainer's `bf16=True`): the optimizer
    /// state holds an f32 master copy of the parameter and f32 moments; each step updates
    /// the master in f32 from the low-precision gradient, and the parameter becomes the
    /// master rounded to its dtype (written in the same pass). Costs 12 bytes of state
    /// per parameter, like f32 training.
    MasterWeights,
    /// The parameter and the moments stay in the parameter's dtype (Burn's and PyTorch's
    /// `AdamW` on a bf16 model): updates smaller than half an ulp of the parameter round
    /// to nothing. At lr 2e-5 a bf16 weight above about 0.01 in magnitude never changes.
    Pure,
}

/// Configuration of [`AdamW`]: Burn's `AdamWConfig` (same fields, same defaults) plus
/// [`LowPrecisionUpdate`].
#[derive(Config, Debug)]
pub struct AdamWConfig {
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the bias-corrected root of the second moment.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay (<https://arxiv.org/abs/2510.12402>).
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// AMSGrad.
    #[config(default = false)]
    pub amsgrad: bool,
    /// Per-tensor gradient clipping, applied by Burn's `OptimizerAdaptor`.
    pub grad_clipping: Option<GradientClippingConfig>,
    /// How f16 and bf16 parameters are updated.
    #[config(default = "LowPrecisionUpdate::MasterWeights")]
    pub low_precision: LowPrecisionUpdate,
}

impl AdamWConfig {
    /// The optimizer.
    pub fn build(&self) -> AdamW {
        AdamW {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            cautious_weight_decay: self.cautious_weight_decay,
            amsgrad: self.amsgrad,
            low_precision: self.low_precision,
        }
    }

    /// The optimizer for a module, driven by Burn's `OptimizerAdaptor` (with the gradient
    /// clipping of the config).
    pub fn init<B, M>(&self) -> OptimizerAdaptor<AdamW, M, B>
    where
        B: AutodiffBackend,
        B::InnerBackend: FusedOps,
        M: AutodiffModule<B>,
    {
        let mut optim = OptimizerAdaptor::from(self.build());
        if let Some(config) = &self.grad_clipping {
            optim = optim.with_grad_clipping(config.init());
        }
        optim
    }
}

/// AdamW (decoupled weight decay), one fused step per parameter; see the module docs.
#[derive(Clone, Debug)]
pub struct AdamW {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    cautious_weight_decay: bool,
    amsgrad: bool,
    low_precision: LowPrecisionUpdate,
}

impl AdamW {
    /// Whether a parameter of `dtype` is updated through an f32 master copy.
    pub fn uses_master_weights(&self, dtype: DType) -> bool {
        self.low_precision == LowPrecisionUpdate::MasterWeights
            && matches!(dtype, DType::F16 | DType::BF16)
    }

    /// The dtype of the moments of a parameter of `dtype`.
    pub fn state_dtype(&self, dtype: DType) -> DType {
        if self.uses_master_weights(dtype) {
            DType::F32
        } else {
            dtype
        }
    }
}

/// The state of one parameter: Burn's `AdamWState` plus the f32 master copy of a
/// low-precision parameter under [`LowPrecisionUpdate::MasterWeights`].
#[derive(Clone)]
pub struct AdamWState<B: Backend, const D: usize> {
    /// Step count and moments (the moments in f32 under master weights, else in the
    /// parameter's dtype).
    pub momentum: AdaptiveMomentumState<B, D>,
    /// The f32 master copy of an f16/bf16 parameter (master weights only).
    pub master: Option<Tensor<B, D>>,
}

/// The serialized [`AdamWState`]: the item of Burn's `AdamWState` (field `momentum`) and
/// `master`, which a record of Burn's `AdamW` lacks (it then reads as `None`, and the
/// master copy is taken from the parameter at the next step).
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct AdamWStateItem<B: Backend, const D: usize, S: PrecisionSettings> {
    /// Step count and moments.
    pub momentum: <AdaptiveMomentumState<B, D> as Record<B>>::Item<S>,
    /// The master copy.
    #[serde(default)]
    pub master: Option<<Tensor<B, D> as Record<B>>::Item<S>>,
}

impl<B: Backend, const D: usize, S: PrecisionSettings> Clone for AdamWStateItem<B, D, S> {
    fn clone(&self) -> Self {
        Self {
            momentum: self.momentum.clone(),
            master: self.master.clone(),
        }
    }
}

impl<B: Backend, const D: usize> Record<B> for AdamWState<B, D> {
    type Item<S: PrecisionSettings> = AdamWStateItem<B, D, S>;

    fn into_item<S: PrecisionSettings>(self) -> Self::Item<S> {
        AdamWStateItem {
            momentum: self.momentum.into_item(),
            master: self.master.map(Record::into_item),
        }
    }

    fn from_item<S: PrecisionSettings>(item: Self::Item<S>, device: &B::Device) -> Self {
        Self {
            momentum: Record::from_item(item.momentum, device),
            master: item.master.map(|m| Record::from_item(m, device)),
        }
    }
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `t` in `dtype` (records load back in the backend's default float type).
fn cast<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype { t } else { t.cast(dtype) }
}

impl<B: FusedOps> SimpleOptimizer<B> for AdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        param: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let dtype = param.dtype();
        let master_weights = self.uses_master_weights(dtype);
        let state_dtype = self.state_dtype(dtype);
        let (time, moments, master) = match state {
            None => (1, None, None),
            Some(AdamWState { momentum, master }) => {
                let max_moment_2 = self.amsgrad.then(|| {
                    // A record written without AMSGrad: the running maximum starts at zero,
                    // so this step's is the new second moment, as in Burn.
                    momentum
                        .max_moment_2
                        .unwrap_or_else(|| momentum.moment_2.zeros_like())
                });
                let moments = AdamWMoments {
                    moment_1: primitive(cast(momentum.moment_1, state_dtype)),
                    moment_2: primitive(cast(momentum.moment_2, state_dtype)),
                    max_moment_2: max_moment_2.map(|m| primitive(cast(m, state_dtype))),
                };
                (momentum.time + 1, Some(moments), master)
            }
        };
        let target = match (master_weights, master) {
            (true, Some(master)) => cast(master, DType::F32),
            (true, None) => param.cast(DType::F32),
            (false, _) => param,
        };
        let options = AdamWStepOptions {
            lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            cautious_weight_decay: self.cautious_weight_decay,
            amsgrad: self.amsgrad,
            time,
            state_dtype,
            copy_dtype: master_weights.then_some(dtype),
        };
        let (target, grad) = (primitive(target), primitive(grad));
        validate::check(validate::adamw_step_tensors(
            &target,
            &grad,
            moments
                .as_ref()
                .map(|m| (&m.moment_1, &m.moment_2, m.max_moment_2.as_ref())),
            &options,
            false,
        ));
        let out = B::fused_adamw_step(target, grad, moments, options);
        let (param, master) = match out.param_copy {
            Some(copy) => (tensor(copy), Some(tensor(out.param))),
            None => (tensor(out.param), None),
        };
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: tensor(out.moments.moment_1),
            moment_2: tensor(out.moments.moment_2),
            max_moment_2: out.moments.max_moment_2.map(tensor),
        };
        (param, Some(AdamWState { momentum, master }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state.master = state.master.map(|t| t.to_device(device));
        state
    }
}
