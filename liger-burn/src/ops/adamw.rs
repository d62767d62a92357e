//! The types of [`FusedOps::fused_adamw_step`](super::FusedOps::fused_adamw_step): one
//! AdamW update of one parameter tensor.

use burn::tensor::{DType, backend::Backend, ops::FloatTensor};

/// The hyperparameters and the step of one AdamW update (Burn's `AdamWConfig` fields, plus
/// the learning rate and the step count, which change from step to step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStepOptions {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the bias-corrected root of the second moment.
    pub epsilon: f32,
    /// Decoupled weight decay: the parameter is multiplied by `1 - lr · weight_decay`.
    pub weight_decay: f32,
    /// Cautious weight decay: no decay where the parameter's sign differs from the updated
    /// first moment's (<https://arxiv.org/abs/2510.12402>).
    pub cautious_weight_decay: bool,
    /// AMSGrad: the denominator uses the running maximum of the second moment.
    pub amsgrad: bool,
    /// The step number, from 1 (the bias corrections are `1 - βᵗ`).
    pub time: usize,
    /// Dtype of the moments the first step creates (later steps keep the dtype of the
    /// moments they are given).
    pub state_dtype: DType,
    /// Also return the updated parameter rounded to this dtype (mixed precision: the
    /// parameter is an f32 master copy and this is the low-precision working copy).
    pub copy_dtype: Option<DType>,
}

impl AdamWStepOptions {
    /// Burn's `AdamWConfig` defaults (β 0.9/0.999, ε 1e-5, weight decay 1e-4, no cautious
    /// decay, no AMSGrad) at learning rate `lr` and step `time`, f32 moments, no copy.
    pub fn new(lr: f64, time: usize) -> Self {
        Self {
            lr,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 1e-4,
            cautious_weight_decay: false,
            amsgrad: false,
            time,
            state_dtype: DType::F32,
            copy_dtype: None,
        }
    }
}

/// AdamW's per-parameter state: the moments, each shaped like the parameter, one dtype.
#[derive(Debug, Clone)]
pub struct AdamWMoments<B: Backend> {
    /// First moment `m`.
    pub moment_1: FloatTensor<B>,
    /// Second moment `v`.
    pub moment_2: FloatTensor<B>,
    /// Running maximum of `v` (AMSGrad only).
    pub max_moment_2: Option<FloatTensor<B>>,
}

/// Output of [`FusedOps::fused_adamw_step`](super::FusedOps::fused_adamw_step).
#[derive(Debug, Clone)]
pub struct AdamWStepOutput<B: Backend> {
    /// The updated parameter, shape and dtype of the input parameter.
    pub param: FloatTensor<B>,
    /// The updated moments.
    pub moments: AdamWMoments<B>,
    /// The updated parameter in [`AdamWStepOptions::copy_dtype`], when one was asked for.
    pub param_copy: Option<FloatTensor<B>>,
}

impl<B: Backend> AdamWMoments<B> {
    /// The same moments as tensors of another backend (a decorator's field moves, or
    /// autodiff's untracked wrapping).
    pub fn map<C: Backend>(self, f: impl Fn(FloatTensor<B>) -> FloatTensor<C>) -> AdamWMoments<C> {
        AdamWMoments {
            moment_1: f(self.moment_1),
            moment_2: f(self.moment_2),
            max_moment_2: self.max_moment_2.map(&f),
        }
    }
}

impl<B: Backend> AdamWStepOutput<B> {
    /// The same output as tensors of another backend.
    pub fn map<C: Backend>(
        self,
        f: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
    ) -> AdamWStepOutput<C> {
        AdamWStepOutput {
            param: f(self.param),
            moments: self.moments.map(&f),
            param_copy: self.param_copy.map(&f),
        }
    }
}
