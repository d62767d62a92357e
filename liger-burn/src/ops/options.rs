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
