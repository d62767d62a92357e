//! The conformance suite behind `liger check` and the parity tests: every fused op,
//! forward and every gradient, against the naive f64 [`reference`], over a sweep of
//! odd shapes, on any backend and dtype.
//!
//! Inputs are fresh random values each run (seeded from the clock unless `LIGER_SEED`
//! is set; the seed is reported), rounded to the tested dtype before the reference sees
//! them, so only the op's own error is measured. The upstream gradient is random too
//! (never all ones). Output buffers of the same sizes are filled with NaN and released
//! right before each op, so a kernel that leaves an element unwritten reads back NaN
//! from the reused pool memory instead of a plausible stale value.

pub mod cross_entropy;
pub mod glu;
pub mod linear_cross_entropy;
pub mod reference;
mod rng;
pub mod rope;

pub use rng::Rng;

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
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 21] = [
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
        }
    }

    fn is_softmax(self) -> bool {
        matches!(self, Op::Softmax | Op::LogSoftmax)
    }

    fn is_elementwise(self) -> bool {
        matches!(self, Op::SwiGlu | Op::GeGlu | Op::Gelu | Op::Sigmoid)
    }
}

/// Allowed error: `|actual - expected| <= atol + rtol * |expected|` elementwise, plus
/// `sum_rtol * Σ|terms|` for values reduced over rows (weight/bias gradients), whose
/// rounding error scales with the magnitude of the summed terms, not of the (possibly
/// cancelling) result.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
    /// Part relative to the sum of the absolute terms of a row reduction.
    pub sum_rtol: f64,
}

impl Tolerance {
    /// Tolerance for results stored in `dtype` (accumulation is always f32). The half
    /// precision ones are the rounding of the stored result (2⁻⁸ for bf16, 2⁻¹¹ for
    /// f16) with headroom for the rounded intermediates the casting conventions define.
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            // Terms of a reduction may each carry one rounding of a half-precision
            // intermediate (Llama casting rounds x̂): 2⁻⁸ for bf16, 2⁻¹¹ for f16.
            DType::BF16 => Tolerance {
                atol: 5e-2,
                rtol: 2e-2,
                sum_rtol: 1.0 / 256.0,
            },
            DType::F16 => Tolerance {
                atol: 5e-3,
                rtol: 5e-3,
                sum_rtol: 1.0 / 2048.0,
            },
            // f32 accumulation: 16 ulps of the absolute sum.
            _ => Tolerance {
                atol: 1e-5,
                rtol: 1e-4,
                sum_rtol: 1e-6,
            },
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
    /// Largest error relative to `|expected|` (over elements with `|expected| > 1e-3`).
    pub max_rel: f64,
    /// Elements checked.
    pub len: usize,
    /// Whether every element is within tolerance and finite where expected is.
    pub passed: bool,
}

/// Compares `actual` with `expected` under `tol`.
pub fn compare(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    tol: Tolerance,
) -> Comparison {
    compare_impl(tensor, actual, expected, None, tol)
}

/// Compares a row-reduced tensor, `scale[i]` being the sum of the absolute terms of `expected[i]`.
pub fn compare_sum(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    scale: &[f64],
    tol: Tolerance,
) -> Comparison {
    compare_impl(tensor, actual, expected, Some(scale), tol)
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
    let mut c = compare_impl(
        tensor,
        actual,
        expected,
        None,
        Tolerance {
            atol: f64::INFINITY,
            rtol: 0.0,
            sum_rtol: 0.0,
        },
    );
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
    c.passed = c.passed && rel <= bound;
    c
}

fn compare_impl(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    scale: Option<&[f64]>,
    tol: Tolerance,
) -> Comparison {
    let mut max_abs: f64 = 0.0;
    let mut max_rel: f64 = 0.0;
    let mut passed = actual.len() == expected.len();
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let err = (a - e).abs();
        let allowed = tol.atol + tol.rtol * e.abs() + scale.map_or(0.0, |s| tol.sum_rtol * s[i]);
        if !a.is_finite() || !(err <= allowed) {
            passed = false;
        }
        let err = if a.is_finite() { err } else { f64::INFINITY };
        max_abs = max_abs.max(err);
        if e.abs() > 1e-3 {
            max_rel = max_rel.max(err / e.abs());
        }
    }
    Comparison {
        tensor,
        max_abs,
        max_rel,
        len: expected.len(),
        passed,
    }
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
    let t = Tensor::<B, 2>::from_data(TensorData::new(values, shape2), device).cast(dtype);
    let rounded = to_f64(t.clone());
    (t, rounded)
}

/// A trainable `[width]` parameter of `dtype` (autodiff leaf) and its rounded values.
fn param<B: Backend>(
    rng: &mut Rng,
    width: usize,
    (lo, hi, shift): (f64, f64, f64),
    dtype: DType,
    device: &B::Device,
) -> (Tensor<Autodiff<B>, 1>, Vec<f64>) {
    let (t, rounded) = input::<B>(rng.vec(width, lo, hi, shift), vec![width], dtype, device);
    (
        Tensor::<Autodiff<B>, 2>::from_inner(t)
            .reshape([width])
            .require_grad(),
        rounded,
    )
}

/// Fills and drops NaN buffers of the given element counts, so the next allocations
/// of those sizes reuse poisoned memory.
fn poison<B: Backend>(sizes: &[usize], dtype: DType, device: &B::Device) {
    for &n in sizes {
        let t = Tensor::<B, 1>::full([n], f32::NAN, device).cast(dtype);
        let _ = B::sync(device);
        drop(t);
    }
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
    type A<B> = Autodiff<B>;
    let tol = Tolerance::for_dtype(dtype);
    let n = rows * width;
    let shift = if matches!(op, Op::LayerNorm | Op::LayerNormNoBias) {
        3.0
    } else {
        0.0
    };
    let (x, xr) = input::<B>(
        rng.vec(n, -2.0, 2.0, shift),
        vec![rows, width],
        dtype,
        device,
    );
    let (g, gr) = input::<B>(rng.vec(n, -1.5, 1.5, 0.0), vec![rows, width], dtype, device);
    let x = Tensor::<A<B>, 2>::from_inner(x).require_grad();
    let g_ad = Tensor::<A<B>, 2>::from_inner(g.clone());
    let mut comparisons = Vec::new();
    let eps = 1e-6;
    poison::<B>(&[n, n, width, rows], dtype, device);
    match op {
        Op::RmsNorm | Op::RmsNormGemma => {
            let (w, wr) = param::<B>(rng, width, (-1.0, 1.0, 0.5), dtype, device);
            let options = if op == Op::RmsNorm {
                RmsNormOptions::llama(eps)
            } else {
                RmsNormOptions::gemma(eps)
            };
            let y = functional::rms_norm(x.clone(), w.clone(), options);
            let grads = (y.clone() * g_ad).sum().backward();
            let (yr, _) = reference::rms_norm(&xr, &wr, width, eps, options.offset);
            let (dxr, dwr, dws) =
                reference::rms_norm_backward(&gr, &xr, &wr, width, eps, options.offset);
            comparisons.push(compare("output", &to_f64(y.inner()), &yr, tol));
            comparisons.push(compare(
                "grad_x",
                &to_f64(x.grad(&grads).unwrap()),
                &dxr,
                tol,
            ));
            comparisons.push(compare_sum(
                "grad_weight",
                &to_f64(w.grad(&grads).unwrap()),
                &dwr,
                &dws,
                tol,
            ));
        }
        Op::AddRmsNorm => {
            let (r, rr) = input::<B>(rng.vec(n, -2.0, 2.0, 0.0), vec![rows, width], dtype, device);
            let (g2, g2r) =
                input::<B>(rng.vec(n, -1.0, 1.0, 0.0), vec![rows, width], dtype, device);
            let (w, wr) = param::<B>(rng, width, (-1.0, 1.0, 0.5), dtype, device);
            let r = Tensor::<A<B>, 2>::from_inner(r).require_grad();
            let (y, s) = functional::fused_add_rms_norm(
                x.clone(),
                r.clone(),
                w.clone(),
                RmsNormOptions::llama(eps),
            );
            let grads =
                ((y.clone() * g_ad).sum() + (s.clone() * Tensor::from_inner(g2)).sum()).backward();
            // The sum is stored in the input dtype: round it like the device did.
            let sr = to_f64(s.clone().inner());
            let sr_exact: Vec<f64> = xr.iter().zip(&rr).map(|(a, b)| a + b).collect();
            let (yr, _) = reference::rms_norm(&sr, &wr, width, eps, 0.0);
            let (mut dsr, dwr, dws) = reference::rms_norm_backward(&gr, &sr, &wr, width, eps, 0.0);
            dsr.iter_mut().zip(&g2r).for_each(|(a, b)| *a += b);
            comparisons.push(compare("sum", &sr, &sr_exact, tol));
            comparisons.push(compare("output", &to_f64(y.inner()), &yr, tol));
            comparisons.push(compare(
                "grad_x",
                &to_f64(x.grad(&grads).unwrap()),
                &dsr,
                tol,
            ));
            comparisons.push(compare(
                "grad_residual",
                &to_f64(r.grad(&grads).unwrap()),
                &dsr,
                tol,
            ));
            comparisons.push(compare_sum(
                "grad_weight",
                &to_f64(w.grad(&grads).unwrap()),
                &dwr,
                &dws,
                tol,
            ));
        }
        Op::LayerNorm | Op::LayerNormNoBias => {
            let (w, wr) = param::<B>(rng, width, (-1.0, 1.0, 0.5), dtype, device);
            let bias = (op == Op::LayerNorm)
                .then(|| param::<B>(rng, width, (-1.0, 1.0, 0.0), dtype, device));
            let y = functional::layer_norm(
                x.clone(),
                w.clone(),
                bias.as_ref().map(|b| b.0.clone()),
                1e-5,
            );
            let grads = (y.clone() * g_ad).sum().backward();
            let yr =
                reference::layer_norm(&xr, &wr, bias.as_ref().map(|b| b.1.as_slice()), width, 1e-5);
            let r = reference::layer_norm_backward(&gr, &xr, &wr, width, 1e-5);
            comparisons.push(compare("output", &to_f64(y.inner()), &yr, tol));
            comparisons.push(compare(
                "grad_x",
                &to_f64(x.grad(&grads).unwrap()),
                &r.dx,
                tol,
            ));
            comparisons.push(compare_sum(
                "grad_weight",
                &to_f64(w.grad(&grads).unwrap()),
                &r.dgamma,
                &r.dgamma_scale,
                tol,
            ));
            if let Some((b, _)) = bias {
                comparisons.push(compare_sum(
                    "grad_bias",
                    &to_f64(b.grad(&grads).unwrap()),
                    &r.dbeta,
                    &r.dbeta_scale,
                    tol,
                ));
            }
        }
        Op::Softmax | Op::LogSoftmax => {
            let log = op == Op::LogSoftmax;
            let y = if log {
                functional::log_softmax(x.clone(), 1)
            } else {
                functional::softmax(x.clone(), 1)
            };
            let grads = (y.clone() * g_ad).sum().backward();
            let (yr, dxr) = if log {
                (
                    reference::log_softmax(&xr, width),
                    reference::log_softmax_backward(&gr, &xr, width),
                )
            } else {
                (
                    reference::softmax(&xr, width),
                    reference::softmax_backward(&gr, &xr, width),
                )
            };
            comparisons.push(compare("output", &to_f64(y.inner()), &yr, tol));
            comparisons.push(compare(
                "grad_x",
                &to_f64(x.grad(&grads).unwrap()),
                &dxr,
                tol,
            ));
        }
        Op::SwiGlu | Op::GeGlu | Op::Gelu | Op::Sigmoid => {
            comparisons = glu::run_case::<B>(op, rows, width, dtype, device, rng);
        }

        Op::RopeRotateHalf | Op::RopeInterleaved => {
            let layout = if op == Op::RopeInterleaved {
                liger_burn::ops::RopeLayout::Interleaved
            } else {
                liger_burn::ops::RopeLayout::RotateHalf
            };
            comparisons.extend(rope::run_case::<B>(layout, rows, width, dtype, device, rng));
        }

        Op::CrossEntropy
        | Op::CrossEntropySmoothWeighted
        | Op::CrossEntropyZLossSoftcap
        | Op::CrossEntropyNone
        | Op::CrossEntropySum => {
            comparisons.extend(cross_entropy::run::<B>(op, rows, width, dtype, device, rng));
        }
        Op::FusedLinearCrossEntropy
        | Op::FusedLinearCrossEntropyNone
        | Op::FusedLinearCrossEntropySum => {
            comparisons.extend(linear_cross_entropy::run::<B>(
                op, rows, width, dtype, device, rng,
            ));
        }
    }
    CaseResult {
        op,
        rows,
        width,
        dtype,
        comparisons,
    }
}

/// Runs the whole sweep for the ops whose name contains `filter` (all when `None`).
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
        if filter.is_some_and(|f| !op.name().contains(f)) {
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
