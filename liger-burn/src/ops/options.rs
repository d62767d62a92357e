//! Options of the fused primitives, shared by every layer (kernels, autodiff, modules).

/// Where the RMSNorm computation is rounded back to the input dtype.
///
/// The two conventions the reference implementations use; they only differ for
/// half-precision inputs (for f32 inputs both give the same result).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum RmsNormCasting {
    /// Hugging Face Llama: `rstd` in f32, `x * rstd` cast back to the input dtype,
    /// then multiplied by the weight in the input dtype.
    #[default]
    Llama,
    /// Hugging Face Gemma: everything in f32 (`x * rstd * (offset + w)`), cast once at the end.
    Gemma,
}

/// Options of [`rms_norm`](crate::functional::rms_norm).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RmsNormOptions {
    /// Added to the mean square before the reciprocal square root.
    pub eps: f64,
    /// Added to the weight before the multiply (`0` for Llama, `1` for Gemma's `1 + w`).
    pub offset: f64,
    /// Rounding convention.
    pub casting: RmsNormCasting,
}

impl Default for RmsNormOptions {
    fn default() -> Self {
        Self::llama(1e-6)
    }
}

impl RmsNormOptions {
    /// Llama/Qwen/Mistral convention: no offset, Llama casting.
    pub fn llama(eps: f64) -> Self {
        Self {
            eps,
            offset: 0.0,
            casting: RmsNormCasting::Llama,
        }
    }
    /// Gemma convention: `1 + w`, all in f32.
    pub fn gemma(eps: f64) -> Self {
        Self {
            eps,
            offset: 1.0,
            casting: RmsNormCasting::Gemma,
        }
    }
}

/// The activation of a gated linear unit `act(gate) * up`
/// ([`swiglu`](crate::functional::swiglu), [`geglu`](crate::functional::geglu)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum GluActivation {
    /// SwiGLU (Llama, Qwen, Mistral): `silu(gate) * up`, `silu(x) = x * sigmoid(x)`.
    Silu,
    /// GeGLU (Gemma): `gelu_tanh(gate) * up` with PyTorch's `gelu(approximate="tanh")`,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

impl GluActivation {
    /// The op's name in messages and reports: `swiglu` or `geglu`.
    pub fn op_name(self) -> &'static str {
        match self {
            GluActivation::Silu => "swiglu",
            GluActivation::GeluTanh => "geglu",
        }
    }

    /// The name of its backward: `swiglu_backward` or `geglu_backward`.
    pub fn backward_name(self) -> &'static str {
        match self {
            GluActivation::Silu => "swiglu_backward",
            GluActivation::GeluTanh => "geglu_backward",
        }
    }
}

/// Which elements [`rope`](crate::functional::rope) rotates together.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum RopeLayout {
    /// Hugging Face Llama/Qwen/Mistral: pairs `(j, j + d/2)`,
    /// `out = x·cos + rotate_half(x)·sin` with `rotate_half(x) = [-x[d/2..], x[..d/2]]`.
    /// Tables repeat the `d/2` frequencies: `cos[j] = cos[j + d/2]`.
    #[default]
    RotateHalf,
    /// Burn's `burn::nn::RotaryEncoding` (and the original RoFormer/Meta Llama code):
    /// pairs `(2i, 2i + 1)`, `rot(x)[2i] = -x[2i+1]`, `rot(x)[2i+1] = x[2i]`.
    /// Tables repeat each frequency for its pair: `cos[2i] = cos[2i + 1]`.
    Interleaved,
}

/// Llama 3.1 frequency scaling (`rope_scaling` with `rope_type = "llama3"` in a
/// Hugging Face config), as `transformers`' `_compute_llama3_parameters` applies it to
/// the inverse frequencies `1 / theta^(2i/d)`: wavelengths longer than
/// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, shorter
/// than `original_max_position_embeddings / high_freq_factor` are kept, and the band in
/// between is interpolated smoothly.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Llama3RopeScaling {
    /// Divisor of the low frequencies (`8` for Llama 3.1, `32` for Llama 3.2 1B/3B).
    pub factor: f64,
    /// `1` in Llama 3.1.
    pub low_freq_factor: f64,
    /// `4` in Llama 3.1.
    pub high_freq_factor: f64,
    /// Context length of pre-training (`8192` in Llama 3.1).
    pub original_max_position_embeddings: usize,
}

impl Llama3RopeScaling {
    /// Llama 3.1's values: factor 8, low 1, high 4, original context 8192.
    pub fn llama3_1() -> Self {
        Self {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    /// The scaled inverse frequency for an unscaled one.
    pub fn scale(&self, inv_freq: f64) -> f64 {
        let old = self.original_max_position_embeddings as f64;
        let low_freq_wavelen = old / self.low_freq_factor;
        let high_freq_wavelen = old / self.high_freq_factor;
        let wavelen = 2.0 * core::f64::consts::PI / inv_freq;
        if wavelen > low_freq_wavelen {
            inv_freq / self.factor
        } else if wavelen < high_freq_wavelen {
            inv_freq
        } else {
            let smooth = (old / wavelen - self.low_freq_factor)
                / (self.high_freq_factor - self.low_freq_factor);
            (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        }
    }
}
