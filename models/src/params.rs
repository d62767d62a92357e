//! Where a model's parameters come from when it is built: random initialization or a
//! checkpoint. The modules are built by one code path ([`ParamSource`]) that asks for every
//! tensor by its Hugging Face name and shape, so the names and shapes that loading checks
//! and saving writes are those the modules were built with.

use crate::error::ModelError;
use crate::projection::Projection;
use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::{DType, Distribution, Tensor, backend::Backend};
use liger_burn::nn::RmsNorm;
use liger_burn::ops::{FusedOps, RmsNormCasting};

/// How a parameter is initialized when it is not loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation (linear and embedding weights).
    Normal(f64),
    /// Zeros (biases).
    Zeros,
    /// Ones (norm weights).
    Ones,
}

/// Provides each parameter, by Hugging Face name and Hugging Face shape.
pub trait ParamSource<B: Backend> {
    /// The tensor `name` of `shape` (Hugging Face layout: `[out, in]` for linear weights),
    /// on the model's device, in the model's dtype.
    fn tensor<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Result<Tensor<B, D>, ModelError>;
}

/// Random initialization like transformers' `_init_weights`: linear and embedding weights
/// normal with std `initializer_range` (0.02), biases zero, norm weights one.
#[derive(Clone, Debug)]
pub struct RandomInit<B: Backend> {
    /// Device of the parameters.
    pub device: B::Device,
    /// Dtype of the parameters.
    pub dtype: DType,
}

impl<B: Backend> ParamSource<B> for RandomInit<B> {
    fn tensor<const D: usize>(
        &mut self,
        _name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Result<Tensor<B, D>, ModelError> {
        let opts = (&self.device, DType::F32);
        let t: Tensor<B, D> = match init {
            Init::Normal(std) => Tensor::random(shape, Distribution::Normal(0.0, std), opts),
            Init::Zeros => Tensor::zeros(shape, opts),
            Init::Ones => Tensor::ones(shape, opts),
        };
        Ok(t.cast(self.dtype))
    }
}

/// Standard deviation of transformers' default initialization.
pub(crate) const INIT_STD: f64 = 0.02;

/// A decoder [`Projection`] (no adapter) from `{prefix}.weight` and `{prefix}.bias`, as
/// [`linear`].
pub(crate) fn projection<B: FusedOps, S: ParamSource<B>>(
    src: &mut S,
    prefix: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
) -> Result<Projection<B>, ModelError> {
    let Linear { weight, bias } = linear(src, prefix, d_in, d_out, bias)?;
    Ok(Projection {
        weight,
        bias,
        lora: None,
    })
}

/// A `Linear` from `{prefix}.weight` (`[d_out, d_in]`, transposed into Burn's `[d_in,
/// d_out]` as a view, so the `[d_out, d_in]` storage is kept) and `{prefix}.bias`.
pub(crate) fn linear<B: Backend, S: ParamSource<B>>(
    src: &mut S,
    prefix: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
) -> Result<Linear<B>, ModelError> {
    let weight = src
        .tensor(
            &format!("{prefix}.weight"),
            [d_out, d_in],
            Init::Normal(INIT_STD),
        )?
        .transpose();
    let bias = if bias {
        Some(Param::from_tensor(src.tensor(
            &format!("{prefix}.bias"),
            [d_out],
            Init::Zeros,
        )?))
    } else {
        None
    };
    Ok(Linear {
        weight: Param::from_tensor(weight),
        bias,
    })
}

/// An `Embedding` from `{prefix}.weight`, `[vocab, hidden]`.
pub(crate) fn embedding<B: Backend, S: ParamSource<B>>(
    src: &mut S,
    prefix: &str,
    vocab: usize,
    hidden: usize,
) -> Result<Embedding<B>, ModelError> {
    let weight = src.tensor(
        &format!("{prefix}.weight"),
        [vocab, hidden],
        Init::Normal(INIT_STD),
    )?;
    Ok(Embedding {
        weight: Param::from_tensor(weight),
    })
}

/// liger-burn's `RmsNorm` (record field `gamma`) from `{prefix}.weight`, `[dim]`.
pub(crate) fn rms_norm<B: FusedOps, S: ParamSource<B>>(
    src: &mut S,
    prefix: &str,
    dim: usize,
    eps: f64,
) -> Result<RmsNorm<B>, ModelError> {
    let gamma = src.tensor(&format!("{prefix}.weight"), [dim], Init::Ones)?;
    Ok(RmsNorm {
        gamma: Param::from_tensor(gamma),
        epsilon: eps,
        offset: 0.0,
        casting: RmsNormCasting::Llama,
    })
}
