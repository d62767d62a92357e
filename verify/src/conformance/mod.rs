//! The conformance suite behind `liger check` and the parity tests: every fused op,
//! forward and every gradient, against the naive f64 [`reference`], over a sweep of
//! odd shapes, on any backend and dtype.
//!
//! Inputs are fresh random values each run (seeded from the clock unless `LIGER_SEED`
//! is set; the seed is reported), rounded to the tested dtype before the reference sees
//! them, so only the op's own error is measured. The upstream gradient is random too
//! (never all ones). Output buffers of the same sizes (in the dtype and in f32) are
//! filled with NaN and released right before each op, so a kernel that leaves an element
//! unwritten reads back NaN from the reused pool memory instead of a plausible stale
//! value.
//!
//! Each reference returns, with every expected value, the largest error an
//! implementation of the op's definition may make there, derived from the rounding of
//! the dtype ([`bounds`]); a result passes when every element is finite and within its
//! bound. The wrong-output tests (`wrong_outputs.rs`) show that every comparison rejects
//! zeros, doubled values, missing rows, transposed and shifted results at the widest and
//! tallest shapes of the full sweep, in every dtype.

pub mod attention;
pub mod bounded;
pub mod bounds;
pub mod cross_entropy;
pub mod divergence;
pub mod embedding;
pub mod fused_linear_distill;
pub mod fused_linear_preference;
pub mod fused_linear_rl;
pub mod glu;
pub mod glu_linear;
pub mod linear;
pub mod linear_cross_entropy;
pub mod lora_linear;
pub mod matmul_add;
pub mod reference;
mod rng;
pub mod rope;
pub mod tracked;
#[cfg(test)]
mod wrong_outputs;

pub use bounds::Expected;
pub use rng::Rng;

use bounds::{round_to, unit_roundoff};

use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::functional;
use liger_burn::ops::{FusedOps, RmsNormOptions};

/// A fused op under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RMSNorm, Llama casting.
    RmsNorm,
    /// RMSNorm, Gemma casting with the `1 + w` offset.
    RmsNormGemma,
    /// Residual add + RMSNorm.
    AddRmsNorm,
    /// LayerNorm with bias.
    LayerNorm,
    /// LayerNorm without bias.
    LayerNormNoBias,
    /// Softmax over the last dimension.
    Softmax,
    /// Log-softmax over the last dimension.
    LogSoftmax,
    /// SwiGLU `silu(gate) * up`.
    SwiGlu,
    /// GeGLU `gelu_tanh(gate) * up`.
    GeGlu,
    /// Exact (erf) GELU.
    Gelu,
    /// Sigmoid.
    Sigmoid,
    /// RoPE of q and k, Hugging Face `rotate_half` pairs.
    RopeRotateHalf,
    /// RoPE of q and k, interleaved pairs (Burn's `RotaryEncoding`).
    RopeInterleaved,
    /// Cross entropy (mean, some ignored rows); width = vocabulary.
    CrossEntropy,
    /// Cross entropy with label smoothing and class weights (mean).
    CrossEntropySmoothWeighted,
    /// Cross entropy with z-loss and logit soft-capping (mean, z-loss returned).
    CrossEntropyZLossSoftcap,
    /// Cross entropy, reduction none (per-row upstream gradient), smoothing, weights, z-loss.
    CrossEntropyNone,
    /// Cross entropy, reduction sum, ignore_index inside the vocabulary.
    CrossEntropySum,
    /// Fused linear cross entropy (mean, bias, smoothing, chunks of 8 rows); width = V.
    FusedLinearCrossEntropy,
    /// Fused linear cross entropy, reduction none (per-row upstream gradient), class
    /// weights, z-loss, softcap, chunks of 5 rows.
    FusedLinearCrossEntropyNone,
    /// Fused linear cross entropy, reduction sum, bias, automatic chunks.
    FusedLinearCrossEntropySum,
    /// Fused linear DPO (sigmoid, label smoothing, NLL term) against a reference head with
    /// a bias, one pair per chunk; rows = pairs, width = V.
    FusedLinearDpo,
    /// Every DPO loss type on given reference log-probabilities, averaged, automatic chunks.
    FusedLinearDpoLossTypes,
    /// Fused linear ORPO (Liger-Kernel's defaults), bias, one pair per chunk.
    FusedLinearOrpo,
    /// Fused linear CPO with label smoothing, an ignore_index inside the vocabulary.
    FusedLinearCpo,
    /// Fused linear SimPO with label smoothing, bias, automatic chunks.
    FusedLinearSimpo,
    /// Fused linear distillation, JSD β = 0.5 at τ = 2 with the hard loss, both heads with
    /// a bias, chunks of 8 rows; rows = N, width = V.
    FusedLinearJsd,
    /// Fused linear distillation, forward KL, a teacher vocabulary padded larger.
    FusedLinearForwardKl,
    /// Fused linear distillation, reverse KL at τ = 0.7, automatic chunks.
    FusedLinearReverseKl,
    /// Fused linear distillation, TVD alone, an ignore_index inside the vocabulary.
    FusedLinearTvd,
    /// PyTorch's kl_div with a probability target, batch mean.
    KlDiv,
    /// kl_div with a log-space target, no reduction (an upstream gradient per element).
    KlDivNone,
    /// Liger-Kernel's JSD (β = 0.3) with labels.
    Jsd,
    /// The total variation distance, summed, with labels.
    Tvd,
    /// Fused linear KTO against a reference head with a bias, a KL estimate, TRL's weights,
    /// one sequence per chunk; rows = sequences, width = V.
    FusedLinearKto,
    /// Fused linear KTO on given reference log-probabilities, averaged, automatic chunks.
    FusedLinearKtoAvg,
    /// Fused linear GRPO (loss type grpo), given reference and old log-probabilities, bias,
    /// one sequence per chunk.
    FusedLinearGrpo,
    /// Fused linear GRPO, loss type dapo, a reference head, temperature 0.7.
    FusedLinearDapo,
    /// Fused linear GRPO, loss type dr_grpo, no KL term.
    FusedLinearDrGrpo,
    /// The MLP's down projection on its SwiGLU unit, the unit recomputed in the backward
    /// (`swiglu_linear`); rows = tokens, width = d_ff.
    SwiGluLinear,
    /// The same with GeGLU (`geglu_linear`).
    GeGluLinear,
    /// `acc + lhs·rhs` into an f32 accumulator (`fused_matmul_add`); rows = m, width = n.
    MatmulAdd,
    /// `acc + lhs·rhs` into an accumulator of the inputs' dtype.
    MatmulAddInDtype,
    /// A linear layer with a LoRA adapter (`lora_linear`), PEFT's f32 adapter path, a
    /// bias; rows = tokens, width = d_in.
    LoraLinear,
    /// The same with the adapter path in the activations' dtype and a separate adapter
    /// input (a dropout's output), no bias.
    LoraLinearDropout,
    /// The embedding lookup and its table's gradient (repeated indices summed); rows =
    /// positions, width = the table's row width.
    Embedding,
    /// A linear layer with a bias (`linear`, which `burn::nn::Linear` runs on `Liger<_>`)
    /// and its three gradients; rows = tokens, width = d_out.
    Linear,
    /// Causal attention with grouped-query heads (`attention`, on the flash kernels where
    /// the backend has them) and the gradients of q, k and v; rows = sequence length,
    /// width = head dimension.
    Attention,
    /// The same with Mistral's sliding window.
    AttentionWindow,
    /// The same over packed documents (`attention_with_documents`), deterministic
    /// gradients.
    AttentionDocuments,
    /// Attention without a mask: every query sees every key.
    AttentionBidirectional,
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 51] = [
        Op::RmsNorm,
        Op::RmsNormGemma,
        Op::AddRmsNorm,
        Op::LayerNorm,
        Op::LayerNormNoBias,
        Op::Softmax,
        Op::LogSoftmax,
        Op::SwiGlu,
        Op::GeGlu,
        Op::Gelu,
        Op::Sigmoid,
        Op::RopeRotateHalf,
        Op::RopeInterleaved,
        Op::CrossEntropy,
        Op::CrossEntropySmoothWeighted,
        Op::CrossEntropyZLossSoftcap,
        Op::CrossEntropyNone,
        Op::CrossEntropySum,
        Op::FusedLinearCrossEntropy,
        Op::FusedLinearCrossEntropyNone,
        Op::FusedLinearCrossEntropySum,
        Op::FusedLinearDpo,
        Op::FusedLinearDpoLossTypes,
        Op::FusedLinearOrpo,
        Op::FusedLinearCpo,
        Op::FusedLinearSimpo,
        Op::FusedLinearJsd,
        Op::FusedLinearForwardKl,
        Op::FusedLinearReverseKl,
        Op::FusedLinearTvd,
        Op::KlDiv,
        Op::KlDivNone,
        Op::Jsd,
        Op::Tvd,
        Op::FusedLinearKto,
        Op::FusedLinearKtoAvg,
        Op::FusedLinearGrpo,
        Op::FusedLinearDapo,
        Op::FusedLinearDrGrpo,
        Op::SwiGluLinear,
        Op::GeGluLinear,
        Op::MatmulAdd,
        Op::MatmulAddInDtype,
        Op::LoraLinear,
        Op::LoraLinearDropout,
        Op::Embedding,
        Op::Linear,
        Op::Attention,
        Op::AttentionWindow,
        Op::AttentionDocuments,
        Op::AttentionBidirectional,
    ];

    /// Name used in reports and filters.
    pub fn name(self) -> &'static str {
        match self {
            Op::RmsNorm => "rms_norm",
            Op::RmsNormGemma => "rms_norm_gemma",
            Op::AddRmsNorm => "fused_add_rms_norm",
            Op::LayerNorm => "layer_norm",
            Op::LayerNormNoBias => "layer_norm_no_bias",
            Op::Softmax => "softmax",
            Op::LogSoftmax => "log_softmax",
            Op::SwiGlu => "swiglu",
            Op::GeGlu => "geglu",
            Op::Gelu => "gelu",
            Op::Sigmoid => "sigmoid",
            Op::RopeRotateHalf => "rope_rotate_half",
            Op::RopeInterleaved => "rope_interleaved",
            Op::CrossEntropy => "cross_entropy",
            Op::CrossEntropySmoothWeighted => "cross_entropy_smooth_weighted",
            Op::CrossEntropyZLossSoftcap => "cross_entropy_z_loss_softcap",
            Op::CrossEntropyNone => "cross_entropy_none",
            Op::CrossEntropySum => "cross_entropy_sum",
            Op::FusedLinearCrossEntropy => "fused_linear_cross_entropy",
            Op::FusedLinearCrossEntropyNone => "fused_linear_cross_entropy_none",
            Op::FusedLinearCrossEntropySum => "fused_linear_cross_entropy_sum",
            Op::FusedLinearDpo => "fused_linear_dpo",
            Op::FusedLinearDpoLossTypes => "fused_linear_dpo_loss_types",
            Op::FusedLinearOrpo => "fused_linear_orpo",
            Op::FusedLinearCpo => "fused_linear_cpo",
            Op::FusedLinearSimpo => "fused_linear_simpo",
            Op::FusedLinearJsd => "fused_linear_jsd",
            Op::FusedLinearForwardKl => "fused_linear_forward_kl",
            Op::FusedLinearReverseKl => "fused_linear_reverse_kl",
            Op::FusedLinearTvd => "fused_linear_tvd",
            Op::KlDiv => "kl_div",
            Op::KlDivNone => "kl_div_none",
            Op::Jsd => "jsd",
            Op::Tvd => "tvd",
            Op::FusedLinearKto => "fused_linear_kto",
            Op::FusedLinearKtoAvg => "fused_linear_kto_avg",
            Op::FusedLinearGrpo => "fused_linear_grpo",
            Op::FusedLinearDapo => "fused_linear_dapo",
            Op::FusedLinearDrGrpo => "fused_linear_dr_grpo",
            Op::SwiGluLinear => "swiglu_linear",
            Op::GeGluLinear => "geglu_linear",
            Op::MatmulAdd => "matmul_add",
            Op::MatmulAddInDtype => "matmul_add_in_dtype",
            Op::LoraLinear => "lora_linear",
            Op::LoraLinearDropout => "lora_linear_dropout",
            Op::Embedding => "embedding",
            Op::Linear => "linear",
            Op::Attention => "attention",
            Op::AttentionWindow => "attention_window",
            Op::AttentionDocuments => "attention_documents",
            Op::AttentionBidirectional => "attention_bidirectional",
        }
    }

    fn is_softmax(self) -> bool {
        matches!(self, Op::Softmax | Op::LogSoftmax)
    }

    /// The GLU-linear ops.
    pub fn is_glu_linear(self) -> bool {
        matches!(self, Op::SwiGluLinear | Op::GeGluLinear)
    }

    /// The matmul-add ops.
    pub fn is_matmul_add(self) -> bool {
        matches!(self, Op::MatmulAdd | Op::MatmulAddInDtype)
    }

    /// The LoRA linear ops.
    pub fn is_lora(self) -> bool {
        matches!(self, Op::LoraLinear | Op::LoraLinearDropout)
    }

    /// The attention ops.
    pub fn is_attention(self) -> bool {
        matches!(
            self,
            Op::Attention
                | Op::AttentionWindow
                | Op::AttentionDocuments
                | Op::AttentionBidirectional
        )
    }

    fn is_elementwise(self) -> bool {
        matches!(self, Op::SwiGlu | Op::GeGlu | Op::Gelu | Op::Sigmoid)
    }
}

/// A tolerance of the form `|actual − expected| ≤ atol + rtol·|expected|`, for comparisons
/// outside the conformance suite (two f32 computations of the same quantity in the
/// per-op test suites). The suite itself compares against per-element bounds derived
/// from the rounding of each dtype ([`bounds`]).
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tolerance {
    /// A fixed tolerance, not a derived bound: `n·u₃₂` relative (`1e-4` for sums of up to
    /// `n ≈ 1700` terms) and `1e-5` absolute, plus `2u` relative and f16's smallest normal
    /// for half-precision results. It holds only for results that do not cancel (an
    /// element formed as a difference of larger terms can be off by more), so a check
    /// against the f64 reference uses that reference's per-element bounds instead
    /// ([`Expected::check`]). What still uses it compares against another library's f32
    /// output with no reference of ours mapped to it: the special-value fixture's finite
    /// entries, and a preference metric the reference leaves out.
    pub fn for_dtype(dtype: DType) -> Self {
        let (store, flush) = match dtype {
            DType::BF16 | DType::F16 => (unit_roundoff(dtype), bounds::min_normal(dtype)),
            _ => (0.0, 0.0),
        };
        Tolerance {
            atol: 1e-5 + flush,
            rtol: 1e-4 + 2.0 * store,
        }
    }
}

/// The comparison of one tensor.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Which tensor (`output`, `grad_x`, ...).
    pub tensor: &'static str,
    /// Largest absolute error.
    pub max_abs: f64,
    /// Largest error relative to `|expected|` (over elements with `expected ≠ 0`).
    pub max_rel: f64,
    /// Largest error as a fraction of its allowed bound (above 1: failed there).
    pub max_used: f64,
    /// Elements checked.
    pub len: usize,
    /// Whether every element is within its bound and finite.
    pub passed: bool,
}

/// Compares `actual` with `expected` under `tol`.
pub fn compare(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    tol: Tolerance,
) -> Comparison {
    let allowed: Vec<f64> = expected
        .iter()
        .map(|e| tol.atol + tol.rtol * e.abs())
        .collect();
    bounds::check(tensor, actual, expected, &allowed)
}

/// Compares `actual` with `expected` norm-wise: passes when every element is finite and
/// `‖actual − expected‖₂ / ‖expected‖₂ ≤ bound`.
///
/// For results of a matrix product that the device runs at reduced precision (Burn's
/// CUDA f32 matmul uses TF32 tensor cores: inputs rounded to 10 mantissa bits), where an
/// elementwise bound would have to be as loose as f16's; the norm-wise error of TF32
/// lands near 3e-4, f32's far under 1e-6.
pub fn compare_normwise(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    bound: f64,
) -> Comparison {
    let infinite = vec![f64::INFINITY; expected.len()];
    let mut c = bounds::check(tensor, actual, expected, &infinite);
    let diff: f64 = actual
        .iter()
        .zip(expected)
        .map(|(a, e)| (a - e) * (a - e))
        .sum();
    let norm: f64 = expected.iter().map(|e| e * e).sum();
    let rel = if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    };
    c.max_used = rel / bound;
    c.passed = c.passed && rel <= bound;
    c
}

/// One op at one shape: every tensor compared.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The op.
    pub op: Op,
    /// Rows.
    pub rows: usize,
    /// Row width.
    pub width: usize,
    /// The dtype.
    pub dtype: DType,
    /// One comparison per output and gradient.
    pub comparisons: Vec<Comparison>,
}

impl CaseResult {
    /// All comparisons passed.
    pub fn passed(&self) -> bool {
        self.comparisons.iter().all(|c| c.passed)
    }
}

/// The shape sweep: `quick` keeps sizes a software rasterizer runs in seconds.
pub fn shapes(op: Op, quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (1, 7),
        (3, 33),
        (37, 100),
        (5, 257),
        (2, 1000),
        (300, 64),
        (4, 4097),
    ];
    // More rows than the launch caps cubes at, so rows are grid-strided.
    shapes.push((70_000, 8));
    if op.is_softmax() {
        shapes.push((3, 50_257));
    }
    if !quick {
        shapes.extend([(4096, 4096), (1024, 8192), (64, 14_336)]);
        if op.is_softmax() {
            shapes.extend([(16, 128_256), (8, 151_936), (4, 262_144)]);
        }
    }
    if op.is_elementwise() {
        shapes = glu::shapes(quick);
    }

    if matches!(op, Op::RopeRotateHalf | Op::RopeInterleaved) {
        // (batch · seq, head_dim); the other dimensions come from rope::CASES.
        shapes = rope::shapes(quick);
    }

    if op.is_cross_entropy() {
        return cross_entropy::shapes(op, quick);
    }
    if op.is_linear_cross_entropy() {
        return linear_cross_entropy::shapes(op, quick);
    }
    if op.is_preference() {
        return fused_linear_preference::shapes(op, quick);
    }
    if op.is_distill() {
        return fused_linear_distill::shapes(op, quick);
    }
    if op.is_divergence() {
        return divergence::shapes(op, quick);
    }
    if op.is_rl() {
        return fused_linear_rl::shapes(op, quick);
    }
    if op.is_glu_linear() {
        return glu_linear::shapes(quick);
    }
    if op.is_matmul_add() {
        return matmul_add::shapes(quick);
    }
    if op.is_lora() {
        return lora_linear::shapes(quick);
    }
    if op == Op::Embedding {
        return embedding::shapes(quick);
    }
    if op == Op::Linear {
        return linear::shapes(quick);
    }
    if op.is_attention() {
        return attention::shapes(quick);
    }
    shapes
}

fn to_f64<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(DType::F32)
        .into_data()
        .to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f64::from)
        .collect()
}

/// Values below 2⁻¹³ in magnitude become 0: every input is then zero or a normal number of
/// every dtype (f16's smallest normal is 2⁻¹⁴), so no device flushes an input it reads.
fn no_subnormals(values: Vec<f32>) -> Vec<f32> {
    values
        .into_iter()
        .map(|v| if v.abs() < 2f32.powi(-13) { 0.0 } else { v })
        .collect()
}

/// A device tensor of `dtype` from values, and the values as the device rounded them.
fn input<B: Backend>(
    values: Vec<f32>,
    shape: Vec<usize>,
    dtype: DType,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<f64>) {
    let shape2 = if shape.len() == 1 {
        vec![1, shape[0]]
    } else {
        shape
    };
    let t = Tensor::<B, 2>::from_data(TensorData::new(no_subnormals(values), shape2), device)
        .cast(dtype);
    let rounded = to_f64(t.clone());
    (t, rounded)
}

/// `values` rounded to `dtype` on the host, as [`input`] has the device do it.
pub fn host_input(values: &[f32], dtype: DType) -> Vec<f64> {
    no_subnormals(values.to_vec())
        .into_iter()
        .map(|v| round_to(dtype, f64::from(v)))
        .collect()
}

/// A trainable `[width]` parameter of `dtype` (autodiff leaf) and its rounded values.
fn param<B: Backend>(
    values: Vec<f32>,
    dtype: DType,
    device: &B::Device,
) -> (Tensor<Autodiff<B>, 1>, Vec<f64>) {
    let width = values.len();
    let (t, rounded) = input::<B>(values, vec![width], dtype, device);
    (
        Tensor::<Autodiff<B>, 2>::from_inner(t)
            .reshape([width])
            .require_grad(),
        rounded,
    )
}

/// Fills and drops NaN buffers of the given element counts, in `dtype` and in f32 (the
/// kernels' f32 statistics and accumulators), so the next allocations of those sizes
/// reuse poisoned memory.
pub fn poison<B: Backend>(sizes: &[usize], dtype: DType, device: &B::Device) {
    for &n in sizes {
        let t = Tensor::<B, 1>::full([n], f32::NAN, device);
        let cast = (dtype != DType::F32).then(|| t.clone().cast(dtype));
        let _ = B::sync(device);
        drop((t, cast));
    }
}

/// The inputs of a norm or softmax case, as drawn (f32, before rounding to the dtype).
#[derive(Clone, Debug)]
pub struct RowInputs {
    /// `[rows, width]` input.
    pub x: Vec<f32>,
    /// `[rows, width]` upstream gradient of the output.
    pub g: Vec<f32>,
    /// `[width]` weight (norms).
    pub w: Vec<f32>,
    /// `[width]` bias (LayerNorm with bias).
    pub b: Vec<f32>,
    /// `[rows, width]` residual (add + RMSNorm).
    pub r: Vec<f32>,
    /// `[rows, width]` upstream gradient of the sum (add + RMSNorm).
    pub g2: Vec<f32>,
}

/// Draws the inputs of `op` at `[rows, width]` (norms and softmaxes).
///
/// Softmax rows get one logit `2 + ln(width)` above the bulk in `[-2, 2]`, as real
/// attention and logit rows are peaked: without it every probability of a wide row is
/// about `1/width`, below f16's smallest normal from width 10⁴ on, where a device may
/// flush them all and no check of the values could tell zeros from the right answer.
pub fn draw_row_inputs(op: Op, rows: usize, width: usize, rng: &mut Rng) -> RowInputs {
    let n = rows * width;
    let shift = if matches!(op, Op::LayerNorm | Op::LayerNormNoBias) {
        3.0
    } else {
        0.0
    };
    let mut x = rng.vec(n, -2.0, 2.0, shift);
    if op.is_softmax() {
        let peak = (2.0 + (width as f64).ln()) as f32;
        for i in 0..rows {
            x[i * width + rng.below(width)] = peak;
        }
    }
    let g = rng.vec(n, -1.5, 1.5, 0.0);
    let (w, b, r, g2) = match op {
        Op::RmsNorm | Op::RmsNormGemma => (rng.vec(width, -1.0, 1.0, 0.5), vec![], vec![], vec![]),
        Op::AddRmsNorm => {
            let r = rng.vec(n, -2.0, 2.0, 0.0);
            let g2 = rng.vec(n, -1.0, 1.0, 0.0);
            (rng.vec(width, -1.0, 1.0, 0.5), vec![], r, g2)
        }
        Op::LayerNorm => (
            rng.vec(width, -1.0, 1.0, 0.5),
            rng.vec(width, -1.0, 1.0, 0.0),
            vec![],
            vec![],
        ),
        Op::LayerNormNoBias => (rng.vec(width, -1.0, 1.0, 0.5), vec![], vec![], vec![]),
        _ => (vec![], vec![], vec![], vec![]),
    };
    RowInputs { x, g, w, b, r, g2 }
}

const NORM_EPS: f64 = 1e-6;
const LAYER_NORM_EPS: f64 = 1e-5;

/// The reference of a norm or softmax case from its rounded inputs (`x, g, w, b, r, g2`
/// as in [`RowInputs`]); the reductions over rows take the first `live` rows.
#[allow(clippy::too_many_arguments)]
fn row_expected(
    op: Op,
    dtype: DType,
    width: usize,
    [x, g, w, b, r, g2]: [&[f64]; 6],
    live: usize,
) -> Vec<Expected> {
    match op {
        Op::RmsNorm => reference::rms_norm(dtype, x, w, g, width, NORM_EPS, 0.0, true, live),
        Op::RmsNormGemma => reference::rms_norm(dtype, x, w, g, width, NORM_EPS, 1.0, false, live),
        Op::AddRmsNorm => reference::add_rms_norm(dtype, x, r, w, g, g2, width, NORM_EPS, live),
        Op::LayerNorm => {
            reference::layer_norm(dtype, x, w, Some(b), g, width, LAYER_NORM_EPS, live)
        }
        Op::LayerNormNoBias => {
            reference::layer_norm(dtype, x, w, None, g, width, LAYER_NORM_EPS, live)
        }
        Op::Softmax => reference::softmax(dtype, x, g, width),
        Op::LogSoftmax => reference::log_softmax(dtype, x, g, width),
        other => unreachable!("{other:?} is not a norm or softmax"),
    }
}

/// A case's reference built on the host alone: its inputs drawn as [`run_case`] draws
/// them and rounded to the dtype, the reference, and the reference of a result whose
/// reductions over rows miss the last tenth of the rows (what the wrong-output tests
/// feed the comparisons).
pub struct HostCase {
    /// The reference.
    pub expected: Vec<Expected>,
    /// The reductions over rows without the last `rows / 10` rows (other tensors as in
    /// `expected`).
    pub without_last_rows: Vec<Expected>,
}

/// See [`HostCase`].
pub fn host_case(op: Op, rows: usize, width: usize, dtype: DType, rng: &mut Rng) -> HostCase {
    let live = rows - (rows / 10).max(1).min(rows);
    if op.is_elementwise() {
        return glu::host_case(op, rows, width, dtype, rng, live);
    }
    if matches!(op, Op::RopeRotateHalf | Op::RopeInterleaved) {
        return rope::host_case(op, rows, width, dtype, rng, live);
    }
    if op.is_cross_entropy() {
        return cross_entropy::host_case(op, rows, width, dtype, rng, live);
    }
    if op.is_linear_cross_entropy() {
        return linear_cross_entropy::host_case(op, rows, width, dtype, rng, live);
    }
    if op.is_preference() {
        return fused_linear_preference::host_case(op, rows, width, dtype, rng);
    }
    if op.is_distill() {
        return fused_linear_distill::host_case(op, rows, width, dtype, rng);
    }
    if op.is_divergence() {
        return divergence::host_case(op, rows, width, dtype, rng);
    }
    if op.is_rl() {
        return fused_linear_rl::host_case(op, rows, width, dtype, rng);
    }
    if op.is_glu_linear() {
        return glu_linear::host_case(op, rows, width, dtype, rng, live);
    }
    if op.is_matmul_add() {
        return matmul_add::host_case(op, rows, width, dtype, rng);
    }
    if op.is_lora() {
        return lora_linear::host_case(op, rows, width, dtype, rng, live);
    }
    if op == Op::Embedding {
        return embedding::host_case(rows, width, dtype, rng);
    }
    if op == Op::Linear {
        return linear::host_case(rows, width, dtype, rng);
    }
    if op.is_attention() {
        return attention::host_case(op, rows, width, dtype, rng);
    }
    let inputs = draw_row_inputs(op, rows, width, rng);
    let r = |v: &Vec<f32>| host_input(v, dtype);
    let (x, g, w, b, res, g2) = (
        r(&inputs.x),
        r(&inputs.g),
        r(&inputs.w),
        r(&inputs.b),
        r(&inputs.r),
        r(&inputs.g2),
    );
    let all = [&x[..], &g, &w, &b, &res, &g2];
    HostCase {
        expected: row_expected(op, dtype, width, all, rows),
        without_last_rows: row_expected(op, dtype, width, all, live),
    }
}

/// Compares each actual tensor with the expected tensor of the same name.
fn compare_all(actual: Vec<(&'static str, Vec<f64>)>, expected: &[Expected]) -> Vec<Comparison> {
    expected
        .iter()
        .map(|e| {
            let a = actual
                .iter()
                .find(|(name, _)| *name == e.tensor)
                .unwrap_or_else(|| panic!("no device result for {}", e.tensor));
            e.check(&a.1)
        })
        .collect()
}

/// Runs `op` at `[rows, width]` in `dtype` on `device` (through `Autodiff<B>`).
pub fn run_case<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> CaseResult {
    let comparisons = match op {
        Op::SwiGlu | Op::GeGlu | Op::Gelu | Op::Sigmoid => {
            glu::run_case::<B>(op, rows, width, dtype, device, rng)
        }
        Op::RopeRotateHalf | Op::RopeInterleaved => {
            rope::run_case::<B>(op, rows, width, dtype, device, rng)
        }
        _ if op.is_cross_entropy() => cross_entropy::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_linear_cross_entropy() => {
            linear_cross_entropy::run::<B>(op, rows, width, dtype, device, rng)
        }
        _ if op.is_preference() => {
            fused_linear_preference::run::<B>(op, rows, width, dtype, device, rng)
        }
        _ if op.is_distill() => fused_linear_distill::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_divergence() => divergence::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_rl() => fused_linear_rl::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_glu_linear() => glu_linear::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_matmul_add() => matmul_add::run::<B>(op, rows, width, dtype, device, rng),
        _ if op.is_lora() => lora_linear::run::<B>(op, rows, width, dtype, device, rng),
        Op::Embedding => embedding::run::<B>(rows, width, dtype, device, rng),
        Op::Linear => linear::run::<B>(rows, width, dtype, device, rng),
        _ if op.is_attention() => attention::run::<B>(op, rows, width, dtype, device, rng),
        _ => run_row_case::<B>(op, rows, width, dtype, device, rng),
    };
    CaseResult {
        op,
        rows,
        width,
        dtype,
        comparisons,
    }
}

/// A norm or softmax case on the device.
fn run_row_case<B: FusedOps>(
    op: Op,
    rows: usize,
    width: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let n = rows * width;
    let inputs = draw_row_inputs(op, rows, width, rng);
    let shape = vec![rows, width];
    let (x, xr) = input::<B>(inputs.x, shape.clone(), dtype, device);
    let (g, gr) = input::<B>(inputs.g, shape.clone(), dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let g_ad = Tensor::<A<B>, 2>::from_inner(g);
    let mut actual = Vec::new();
    let mut expected_inputs = [xr, gr, vec![], vec![], vec![], vec![]];
    match op {
        Op::RmsNorm | Op::RmsNormGemma => {
            let (w, wr) = param::<B>(inputs.w, dtype, device);
            expected_inputs[2] = wr;
            let options = if op == Op::RmsNorm {
                RmsNormOptions::llama(NORM_EPS)
            } else {
                RmsNormOptions::gemma(NORM_EPS)
            };
            poison::<B>(&[n, n, width, rows], dtype, device);
            let y = functional::rms_norm(x.clone(), w.clone(), options);
            let grads = (y.clone() * g_ad).sum().backward();
            actual.push(("output", to_f64(y.inner())));
            actual.push(("grad_x", to_f64(x.grad(&grads).unwrap())));
            actual.push(("grad_weight", to_f64(w.grad(&grads).unwrap())));
        }
        Op::AddRmsNorm => {
            let (r, rr) = input::<B>(inputs.r, shape.clone(), dtype, device);
            let (g2, g2r) = input::<B>(inputs.g2, shape, dtype, device);
            let (w, wr) = param::<B>(inputs.w, dtype, device);
            expected_inputs[2] = wr;
            expected_inputs[4] = rr;
            expected_inputs[5] = g2r;
            let r = Tensor::<A<B>, 2>::from_inner(r).require_grad();
            poison::<B>(&[n, n, n, n, width, rows], dtype, device);
            let (y, s) = functional::fused_add_rms_norm(
                x.clone(),
                r.clone(),
                w.clone(),
                RmsNormOptions::llama(NORM_EPS),
            );
            let grads =
                ((y.clone() * g_ad).sum() + (s.clone() * Tensor::from_inner(g2)).sum()).backward();
            actual.push(("sum", to_f64(s.inner())));
            actual.push(("output", to_f64(y.inner())));
            actual.push(("grad_x", to_f64(x.grad(&grads).unwrap())));
            actual.push(("grad_residual", to_f64(r.grad(&grads).unwrap())));
            actual.push(("grad_weight", to_f64(w.grad(&grads).unwrap())));
        }
        Op::LayerNorm | Op::LayerNormNoBias => {
            let (w, wr) = param::<B>(inputs.w, dtype, device);
            expected_inputs[2] = wr;
            let bias = (op == Op::LayerNorm).then(|| param::<B>(inputs.b, dtype, device));
            if let Some((_, br)) = &bias {
                expected_inputs[3] = br.clone();
            }
            poison::<B>(&[n, n, width, width, rows], dtype, device);
            let y = functional::layer_norm(
                x.clone(),
                w.clone(),
                bias.as_ref().map(|b| b.0.clone()),
                LAYER_NORM_EPS,
            );
            let grads = (y.clone() * g_ad).sum().backward();
            actual.push(("output", to_f64(y.inner())));
            actual.push(("grad_x", to_f64(x.grad(&grads).unwrap())));
            actual.push(("grad_weight", to_f64(w.grad(&grads).unwrap())));
            if let Some((b, _)) = bias {
                actual.push(("grad_bias", to_f64(b.grad(&grads).unwrap())));
            }
        }
        Op::Softmax | Op::LogSoftmax => {
            poison::<B>(&[n, n], dtype, device);
            let y = if op == Op::LogSoftmax {
                functional::log_softmax(x.clone(), 1)
            } else {
                functional::softmax(x.clone(), 1)
            };
            let grads = (y.clone() * g_ad).sum().backward();
            actual.push(("output", to_f64(y.inner())));
            actual.push(("grad_x", to_f64(x.grad(&grads).unwrap())));
        }
        other => unreachable!("{other:?} is not a norm or softmax"),
    }
    let [x, g, w, b, r, g2] = &expected_inputs;
    let expected = row_expected(op, dtype, width, [x, g, w, b, r, g2], rows);
    compare_all(actual, &expected)
}

/// Whether `filter` selects the op named `name`: every op when `None`, the op named
/// `NAME` alone for `=NAME`, else the ops whose name contains it.
pub fn selects(filter: Option<&str>, name: &str) -> bool {
    filter.is_none_or(|f| match f.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.contains(f),
    })
}

/// Runs the whole sweep for the ops [`selects`] picks.
pub fn run_suite<B: FusedOps>(
    device: &B::Device,
    dtype: DType,
    quick: bool,
    filter: Option<&str>,
    rng: &mut Rng,
    mut on_case: impl FnMut(&CaseResult),
) -> Vec<CaseResult> {
    let mut results = Vec::new();
    for op in Op::ALL {
        if !selects(filter, op.name()) {
            continue;
        }
        for (rows, width) in shapes(op, quick) {
            let result = run_case::<B>(op, rows, width, dtype, device, rng);
            on_case(&result);
            results.push(result);
        }
    }
    results
}
