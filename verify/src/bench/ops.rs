//! What is specific to each benchmarked op: its shape, its random inputs, the fused
//! (`liger_burn::functional`) and stock Burn forward, and the bytes it must move.
//!
//! Every op's forward returns its outputs flattened to 1-D (a free reshape), the first
//! the one the backward differentiates (`differentiated`); the rest are held like outputs.

use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Int, Tensor, activation};
use clap::ValueEnum;
use liger_burn::functional;
use liger_burn::ops::{
    CrossEntropyOptions, FusedOps, RmsNormOptions, RopeLayout, WeightGradAccumulation,
};
use std::str::FromStr;

/// RMSNorm epsilon (Llama's), both providers.
pub const RMS_EPS: f64 = 1e-6;
/// LayerNorm epsilon (Burn's default), both providers.
pub const LN_EPS: f64 = 1e-5;
/// Bytes of a per-row statistic (rstd, mean): always f32.
const STAT_BYTES: usize = 4;

/// An op to benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchOp {
    /// Every op below.
    #[value(name = "all")]
    All,
    /// RMSNorm (Llama casting, eps 1e-6) vs burn::nn::RmsNorm. Shape ROWSxWIDTH.
    #[value(name = "rms_norm")]
    RmsNorm,
    /// LayerNorm with bias (eps 1e-5) vs burn::nn::LayerNorm. Shape ROWSxWIDTH.
    #[value(name = "layer_norm")]
    LayerNorm,
    /// Softmax over the last dim vs burn::tensor::activation::softmax. Shape ROWSxWIDTH.
    #[value(name = "softmax")]
    Softmax,
    /// Log-softmax over the last dim vs burn::tensor::activation::log_softmax.
    #[value(name = "log_softmax")]
    LogSoftmax,
    /// Residual add + RMSNorm vs `x + residual` then burn::nn::RmsNorm.
    #[value(name = "fused_add_rms_norm")]
    FusedAddRmsNorm,
    /// RoPE (Hugging Face rotate_half layout) on q and k vs the stock-op composition
    /// `x*cos + rotate_half(x)*sin`. Shape BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM.
    #[value(name = "rope")]
    Rope,
    /// SwiGLU `silu(gate) * up` vs `activation::silu(gate) * up`. Shape ROWSxWIDTH.
    #[value(name = "swiglu")]
    SwiGlu,
    /// GeGLU `gelu_tanh(gate) * up` vs `activation::gelu_approximate(gate) * up`.
    #[value(name = "geglu")]
    GeGlu,
    /// Cross entropy (mean) vs burn::nn::loss::CrossEntropyLoss. Shape NxV.
    #[value(name = "cross_entropy")]
    CrossEntropy,
    /// Fused linear cross entropy (mean, no bias) vs `x.matmul(w^T)` then
    /// burn::nn::loss::CrossEntropyLoss. Shape NxHxV.
    #[value(name = "fused_linear_cross_entropy")]
    FusedLinearCrossEntropy,
    /// Fused linear DPO (sigmoid, β 0.1, a frozen reference head over the same hidden
    /// states) vs the same loss composed of stock ops under autodiff (the `[2B·T, V]` logits
    /// and their f32 log-softmax materialized). Shape PAIRSxSEQxHxV.
    #[value(name = "fused_linear_dpo")]
    FusedLinearDpo,
    /// Fused linear distillation (generalized JSD β 0.5, temperature 1, hard and soft
    /// weights 0.5; a frozen teacher head) vs the same loss composed of stock ops. Shape
    /// NxHxV.
    #[value(name = "fused_linear_jsd")]
    FusedLinearJsd,
    /// Matrix products `[m, k] · [k, n]` (Burn's matmul on `Liger<B>`: cuBLASLt on CUDA)
    /// vs Burn's matmul: the models' GEMMs by default. Shape MxKxN. Not in `all`; run on
    /// its own (see `bench::matmul`).
    #[value(name = "matmul")]
    Matmul,
}

impl BenchOp {
    /// Every op `all` expands to.
    pub const EACH: [BenchOp; 12] = [
        BenchOp::RmsNorm,
        BenchOp::LayerNorm,
        BenchOp::Softmax,
        BenchOp::LogSoftmax,
        BenchOp::FusedAddRmsNorm,
        BenchOp::Rope,
        BenchOp::SwiGlu,
        BenchOp::GeGlu,
        BenchOp::CrossEntropy,
        BenchOp::FusedLinearCrossEntropy,
        BenchOp::FusedLinearDpo,
        BenchOp::FusedLinearJsd,
    ];

    /// Name in tables and the CSV `kernel` column.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::All => "all",
            BenchOp::RmsNorm => "rms_norm",
            BenchOp::LayerNorm => "layer_norm",
            BenchOp::Softmax => "softmax",
            BenchOp::LogSoftmax => "log_softmax",
            BenchOp::FusedAddRmsNorm => "fused_add_rms_norm",
            BenchOp::Rope => "rope",
            BenchOp::SwiGlu => "swiglu",
            BenchOp::GeGlu => "geglu",
            BenchOp::CrossEntropy => "cross_entropy",
            BenchOp::FusedLinearCrossEntropy => "fused_linear_cross_entropy",
            BenchOp::FusedLinearDpo => "fused_linear_dpo",
            BenchOp::FusedLinearJsd => "fused_linear_jsd",
            BenchOp::Matmul => "matmul",
        }
    }

    /// The shape benchmarked when `--shape` is absent.
    pub fn default_shape(self) -> Shape {
        match self {
            BenchOp::Softmax | BenchOp::LogSoftmax => Shape(vec![8192, 32768]),
            BenchOp::Rope => Shape(vec![4, 2048, 32, 8, 128]),
            BenchOp::SwiGlu | BenchOp::GeGlu => Shape(vec![8192, 14336]),
            BenchOp::CrossEntropy => Shape(vec![8192, 128256]),
            BenchOp::FusedLinearCrossEntropy => Shape(vec![8192, 4096, 128256]),
            // 8 pairs of 1024 tokens: the shape, Liger-Kernel's benchmark's.
            BenchOp::FusedLinearDpo => Shape(vec![8, 1024, 4096, 128256]),
            BenchOp::FusedLinearJsd => Shape(vec![8192, 4096, 128256]),
            _ => Shape(vec![8192, 4096]),
        }
    }

    /// What the dimensions of a `--shape` mean for this op.
    pub fn shape_form(self) -> &'static str {
        match self {
            BenchOp::Rope => "BATCHxSEQxQ_HEADSxKV_HEADSxHEAD_DIM",
            BenchOp::CrossEntropy => "NxV (rows x vocabulary)",
            BenchOp::FusedLinearCrossEntropy | BenchOp::FusedLinearJsd => {
                "NxHxV (rows x hidden x vocabulary)"
            }
            BenchOp::FusedLinearDpo => "PAIRSxSEQxHxV (pairs x tokens x hidden x vocabulary)",
            _ => "ROWSxWIDTH (leading dims multiply into rows)",
        }
    }

    /// Whether `shape` has the dimensions this op needs.
    pub fn accepts(self, shape: &Shape) -> bool {
        let d = &shape.0;
        match self {
            BenchOp::Rope => d.len() == 5 && d[4].is_multiple_of(2),
            BenchOp::CrossEntropy => d.len() == 2,
            BenchOp::FusedLinearCrossEntropy | BenchOp::FusedLinearJsd => d.len() == 3,
            BenchOp::FusedLinearDpo => d.len() == 4,
            _ => d.len() >= 2,
        }
    }

    /// A second `[rows, width]` stream: the residual, or GLU's `up`.
    fn has_residual(self) -> bool {
        matches!(
            self,
            BenchOp::FusedAddRmsNorm | BenchOp::SwiGlu | BenchOp::GeGlu
        )
    }

    fn has_weight(self) -> bool {
        matches!(
            self,
            BenchOp::RmsNorm | BenchOp::LayerNorm | BenchOp::FusedAddRmsNorm
        )
    }
}

/// A `--shape`: sizes joined by `x`, read per op (see [`BenchOp::shape_form`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape(pub Vec<usize>);

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let dims: Result<Vec<usize>, _> = s.trim().split(['x', 'X']).map(str::parse).collect();
        match dims {
            Ok(d) if d.len() >= 2 && d.iter().all(|&v| v > 0) => Ok(Shape(d)),
            _ => Err(format!(
                "`{s}`: expected sizes joined by x, at least two, e.g. 8192x4096"
            )),
        }
    }
}

impl Shape {
    /// Product of all but the last dim.
    pub fn rows(&self) -> usize {
        self.0[..self.0.len() - 1].iter().product()
    }
    /// The last dim.
    pub fn width(&self) -> usize {
        *self.0.last().unwrap()
    }
    /// `8192x4096`.
    pub fn label(&self) -> String {
        self.0
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x")
    }
}

/// Who computes the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `liger_burn::functional`: the fused kernels.
    Liger,
    /// Stock Burn modules and ops.
    Burn,
}

impl Provider {
    /// `liger` or `burn`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Liger => "liger",
            Provider::Burn => "burn",
        }
    }
}

/// Forward, backward (derived) or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Inner backend, no autodiff.
    Forward,
    /// `full - forward`.
    Backward,
    /// Forward + backward on `Autodiff<B>`.
    Full,
}

impl Mode {
    /// `forward`, `backward`, `full`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Forward => "forward",
            Mode::Backward => "backward",
            Mode::Full => "full",
        }
    }
}

/// One input set of an op on backend `BB`; the fields an op does not use are `None`.
pub struct Inputs<BB: Backend> {
    /// Row ops: `x [rows, width]`.
    pub x: Option<Tensor<BB, 2>>,
    /// fused_add_rms_norm: the residual, like `x`.
    pub residual: Option<Tensor<BB, 2>>,
    /// Norm weight `[width]`.
    pub weight: Option<Tensor<BB, 1>>,
    /// LayerNorm bias `[width]`.
    pub bias: Option<Tensor<BB, 1>>,
    /// Integer inputs that never take a gradient (targets).
    pub ints: Option<Tensor<BB, 1, Int>>,
    /// RoPE: q `[batch, q_heads, seq, head_dim]` and k `[batch, kv_heads, seq, head_dim]`.
    pub qk: Option<(Tensor<BB, 4>, Tensor<BB, 4>)>,
    /// RoPE: cos and sin `[1, seq, head_dim]` (no gradient).
    pub tables: Option<(Tensor<BB, 3>, Tensor<BB, 3>)>,
    /// The frozen head of DPO's reference or the distillation's teacher: its `x [rows, H]`
    /// and weight `[V, H]` (no gradient).
    pub frozen: Option<(Tensor<BB, 2>, Tensor<BB, 2>)>,
    /// DPO: the sequences (chosen then rejected) the rows of `x` flatten.
    pub sequences: usize,
}

fn grad<BB: Backend, const D: usize>(t: &Option<Tensor<BB, D>>) -> Option<Tensor<Autodiff<BB>, D>> {
    t.clone().map(|t| Tensor::from_inner(t).require_grad())
}

impl<B: Backend> Inputs<B> {
    /// Fresh random inputs of `op` at `shape`.
    pub fn random(op: BenchOp, shape: &Shape, dtype: DType, device: &B::Device) -> Self {
        let d = &shape.0;
        let uniform = |lo, hi| Distribution::Uniform(lo, hi);
        let opts = (device, dtype);
        let none = Inputs {
            x: None,
            residual: None,
            weight: None,
            bias: None,
            ints: None,
            qk: None,
            tables: None,
            frozen: None,
            sequences: 0,
        };
        match op {
            BenchOp::FusedLinearDpo | BenchOp::FusedLinearJsd => {
                // Rows x hidden x vocabulary, scaled as the linear cross entropy's.
                let (n, h, v) = match op {
                    BenchOp::FusedLinearDpo => (2 * d[0] * d[1], d[2], d[3]),
                    _ => (d[0], d[1], d[2]),
                };
                let scale = 1.0 / (h as f64).sqrt();
                let w = || Tensor::<B, 2>::random([v, h], uniform(-2.0 * scale, 2.0 * scale), opts);
                let x = Tensor::<B, 2>::random([n, h], uniform(-1.0, 1.0), opts);
                let frozen_x = match op {
                    BenchOp::FusedLinearDpo => x.clone(),
                    _ => Tensor::random([n, h], uniform(-1.0, 1.0), opts),
                };
                let targets =
                    Tensor::<B, 1, Int>::random([n], Distribution::Uniform(0.0, v as f64), device)
                        .clamp(0, v as i64 - 1);
                return Inputs {
                    x: Some(x),
                    residual: Some(w()),
                    ints: Some(targets),
                    frozen: Some((frozen_x, w())),
                    sequences: if op == BenchOp::FusedLinearDpo {
                        2 * d[0]
                    } else {
                        0
                    },
                    ..none
                };
            }
            BenchOp::Rope => {
                let (b, s, hq, hk, hd) = (d[0], d[1], d[2], d[3], d[4]);
                return Inputs {
                    qk: Some((
                        Tensor::random([b, hq, s, hd], uniform(-2.0, 2.0), opts),
                        Tensor::random([b, hk, s, hd], uniform(-2.0, 2.0), opts),
                    )),
                    tables: Some((
                        Tensor::random([1, s, hd], uniform(-1.0, 1.0), opts),
                        Tensor::random([1, s, hd], uniform(-1.0, 1.0), opts),
                    )),
                    ..none
                };
            }
            BenchOp::CrossEntropy | BenchOp::FusedLinearCrossEntropy => {
                let (n, v) = (d[0], *d.last().unwrap());
                let targets =
                    Tensor::<B, 1, Int>::random([n], Distribution::Uniform(0.0, v as f64), device)
                        .clamp(0, v as i64 - 1);
                return if op == BenchOp::CrossEntropy {
                    Inputs {
                        x: Some(Tensor::random([n, v], uniform(-4.0, 4.0), opts)),
                        ints: Some(targets),
                        ..none
                    }
                } else {
                    // Scaled like a trained model's: logits of order 1.
                    let h = d[1];
                    let scale = 1.0 / (h as f64).sqrt();
                    Inputs {
                        x: Some(Tensor::random([n, h], uniform(-1.0, 1.0), opts)),
                        residual: Some(Tensor::random(
                            [v, h],
                            uniform(-2.0 * scale, 2.0 * scale),
                            opts,
                        )),
                        ints: Some(targets),
                        ..none
                    }
                };
            }
            _ => {}
        }
        let (rows, width) = (shape.rows(), shape.width());
        let mat = |lo, hi| {
            Tensor::<B, 2>::random(
                [rows, width],
                Distribution::Uniform(lo, hi),
                (device, dtype),
            )
        };
        let vec = |lo, hi| {
            Tensor::<B, 1>::random([width], Distribution::Uniform(lo, hi), (device, dtype))
        };
        Inputs {
            x: Some(mat(-2.0, 2.0)),
            residual: op.has_residual().then(|| mat(-2.0, 2.0)),
            weight: op.has_weight().then(|| vec(-0.5, 1.5)),
            bias: (op == BenchOp::LayerNorm).then(|| vec(-1.0, 1.0)),
            ..none
        }
    }

    /// The same buffers as leaves of `Autodiff<B>`: floats require grad, ints do not.
    pub fn autodiff(&self) -> Inputs<Autodiff<B>> {
        Inputs {
            x: grad(&self.x),
            residual: grad(&self.residual),
            weight: grad(&self.weight),
            bias: grad(&self.bias),
            ints: self.ints.clone().map(Tensor::from_inner),
            qk: self.qk.clone().map(|(q, k)| {
                (
                    Tensor::from_inner(q).require_grad(),
                    Tensor::from_inner(k).require_grad(),
                )
            }),
            tables: self
                .tables
                .clone()
                .map(|(c, s)| (Tensor::from_inner(c), Tensor::from_inner(s))),
            frozen: self
                .frozen
                .clone()
                .map(|(x, w)| (Tensor::from_inner(x), Tensor::from_inner(w))),
            sequences: self.sequences,
        }
    }
}

/// Elements of `op`'s float inputs and outputs at `shape` (sizes the input rotation and
/// how many iterations' outputs are held).
pub fn elements(op: BenchOp, shape: &Shape) -> (usize, usize) {
    let d = &shape.0;
    match op {
        BenchOp::Rope => {
            let qk = d[0] * (d[2] + d[3]) * d[1] * d[4];
            return (qk + 2 * d[1] * d[4], qk);
        }
        BenchOp::SwiGlu | BenchOp::GeGlu => {
            let n = shape.rows() * shape.width();
            return (2 * n, n);
        }
        BenchOp::CrossEntropy => return (d[0] * d[1], d[0] * d[1]),
        BenchOp::FusedLinearCrossEntropy => {
            let xw = (d[0] + d[2]) * d[1];
            return (xw, xw);
        }
        BenchOp::FusedLinearDpo => {
            let xw = (2 * d[0] * d[1] + 2 * d[3]) * d[2];
            return (xw, xw);
        }
        BenchOp::FusedLinearJsd => {
            let xw = 2 * (d[0] + d[2]) * d[1];
            return (xw, xw);
        }
        _ => {}
    }
    let n = shape.rows() * shape.width();
    let streams = 1 + op.has_residual() as usize;
    (n * streams, n * streams)
}

/// The stock Burn modules over an input set's weights.
pub struct Stock<BB: Backend> {
    rms: Option<RmsNorm<BB>>,
    ln: Option<LayerNorm<BB>>,
}

impl<BB: Backend> Stock<BB> {
    /// The modules `op`'s stock path uses, sharing `inputs`' weights.
    pub fn new(op: BenchOp, inputs: &Inputs<BB>, shape: &Shape, device: &BB::Device) -> Self {
        let weight = || Param::from_tensor(inputs.weight.clone().expect("weight"));
        Stock {
            rms: matches!(op, BenchOp::RmsNorm | BenchOp::FusedAddRmsNorm).then(|| RmsNorm {
                gamma: weight(),
                epsilon: RMS_EPS,
            }),
            ln: (op == BenchOp::LayerNorm).then(|| {
                let mut ln = LayerNormConfig::new(shape.width())
                    .with_epsilon(LN_EPS)
                    .init::<BB>(device);
                ln.gamma = weight();
                ln.beta = Some(Param::from_tensor(inputs.bias.clone().expect("bias")));
                ln
            }),
        }
    }
}

fn flat<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> Tensor<BB, 1> {
    let n = t.shape().num_elements();
    t.reshape([n])
}

/// `--check-targets`: whether liger's cross-entropy ops validate the targets first.
static CHECK_TARGETS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets what `--check-targets` asked for (read by [`apply`]).
pub fn set_check_targets(on: bool) {
    CHECK_TARGETS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether liger's cross-entropy ops validate the targets (`--check-targets`).
pub fn check_targets() -> bool {
    CHECK_TARGETS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--head-grad`: whether liger's fused linear cross entropy sums its weight gradient in
/// the weight's dtype (else in f32, the library's default).
static HEAD_GRAD_IN_WEIGHT_DTYPE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Sets what `--head-grad` asked for (read by [`apply`]).
pub fn set_head_grad(accumulation: WeightGradAccumulation) {
    HEAD_GRAD_IN_WEIGHT_DTYPE.store(
        accumulation == WeightGradAccumulation::WeightDtype,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The weight-gradient accumulation of liger's fused linear cross entropy (`--head-grad`).
pub fn head_grad() -> WeightGradAccumulation {
    if HEAD_GRAD_IN_WEIGHT_DTYPE.load(std::sync::atomic::Ordering::Relaxed) {
        WeightGradAccumulation::WeightDtype
    } else {
        WeightGradAccumulation::F32
    }
}

/// `--backward-units-per-sm`, when given (0: not given).
static BACKWARD_UNITS_PER_SM: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Records what `--backward-units-per-sm` asked for (for the CSV's config column).
pub fn set_backward_units_per_sm(units: Option<usize>) {
    BACKWARD_UNITS_PER_SM.store(units.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

/// `--backward-units-per-sm`, when given.
pub fn backward_units_per_sm() -> Option<usize> {
    match BACKWARD_UNITS_PER_SM.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        units => Some(units),
    }
}

/// `--cross-entropy-cubes-per-sm`, when given (0: not given).
static CROSS_ENTROPY_CUBES_PER_SM: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Records what `--cross-entropy-cubes-per-sm` asked for (for the CSV's config column).
pub fn set_cross_entropy_cubes_per_sm(cubes: Option<usize>) {
    CROSS_ENTROPY_CUBES_PER_SM.store(cubes.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

/// `--cross-entropy-cubes-per-sm`, when given.
pub fn cross_entropy_cubes_per_sm() -> Option<usize> {
    match CROSS_ENTROPY_CUBES_PER_SM.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        cubes => Some(cubes),
    }
}

/// `--elementwise-geometry`, when given.
static ELEMENTWISE_GEOMETRY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Records what `--elementwise-geometry` asked for (for the CSV's config column).
pub fn set_elementwise_geometry(geometry: Option<String>) {
    *ELEMENTWISE_GEOMETRY
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = geometry;
}

/// `--elementwise-geometry`, when given.
pub fn elementwise_geometry() -> Option<String> {
    ELEMENTWISE_GEOMETRY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The cross-entropy options the benchmark runs liger with.
fn ce_options() -> CrossEntropyOptions {
    CrossEntropyOptions::default().with_check_targets(check_targets())
}

/// One forward of `op` by `provider`: its outputs, flattened, the backward root first.
pub fn apply<BB: FusedOps>(
    op: BenchOp,
    provider: Provider,
    inp: &Inputs<BB>,
    stock: &Stock<BB>,
) -> Vec<Tensor<BB, 1>> {
    let x = || inp.x.clone().expect("x");
    let w = || inp.weight.clone().expect("weight");
    let one = |t: Tensor<BB, 2>| vec![flat(t)];
    match (op, provider) {
        (BenchOp::RmsNorm, Provider::Liger) => one(functional::rms_norm(
            x(),
            w(),
            RmsNormOptions::llama(RMS_EPS),
        )),
        (BenchOp::RmsNorm, Provider::Burn) => one(stock.rms.as_ref().unwrap().forward(x())),
        (BenchOp::FusedAddRmsNorm, Provider::Liger) => {
            let (y, sum) = functional::fused_add_rms_norm(
                x(),
                inp.residual.clone().unwrap(),
                w(),
                RmsNormOptions::llama(RMS_EPS),
            );
            vec![flat(y), flat(sum)]
        }
        (BenchOp::FusedAddRmsNorm, Provider::Burn) => {
            let sum = x() + inp.residual.clone().unwrap();
            vec![
                flat(stock.rms.as_ref().unwrap().forward(sum.clone())),
                flat(sum),
            ]
        }
        (BenchOp::LayerNorm, Provider::Liger) => {
            one(functional::layer_norm(x(), w(), inp.bias.clone(), LN_EPS))
        }
        (BenchOp::LayerNorm, Provider::Burn) => one(stock.ln.as_ref().unwrap().forward(x())),
        (BenchOp::Softmax, Provider::Liger) => one(functional::softmax(x(), 1)),
        (BenchOp::Softmax, Provider::Burn) => one(activation::softmax(x(), 1)),
        (BenchOp::LogSoftmax, Provider::Liger) => one(functional::log_softmax(x(), 1)),
        (BenchOp::LogSoftmax, Provider::Burn) => one(activation::log_softmax(x(), 1)),
        (BenchOp::Rope, provider) => {
            let (q, k) = inp.qk.clone().expect("q, k");
            let (cos, sin) = inp.tables.clone().expect("cos, sin");
            let (q, k) = match provider {
                Provider::Liger => functional::rope(q, k, cos, sin, RopeLayout::RotateHalf),
                Provider::Burn => {
                    let (cos, sin) = (cos.unsqueeze_dim::<4>(1), sin.unsqueeze_dim::<4>(1));
                    let rotate =
                        |x: Tensor<BB, 4>| x.clone() * cos.clone() + rotate_half(x) * sin.clone();
                    (rotate(q), rotate(k))
                }
            };
            vec![flat(q), flat(k)]
        }
        (BenchOp::SwiGlu, Provider::Liger) => {
            one(functional::swiglu(x(), inp.residual.clone().unwrap()))
        }
        (BenchOp::SwiGlu, Provider::Burn) => {
            one(activation::silu(x()) * inp.residual.clone().unwrap())
        }
        (BenchOp::GeGlu, Provider::Liger) => {
            one(functional::geglu(x(), inp.residual.clone().unwrap()))
        }
        (BenchOp::GeGlu, Provider::Burn) => {
            one(activation::gelu_approximate(x()) * inp.residual.clone().unwrap())
        }
        (BenchOp::CrossEntropy, Provider::Liger) => {
            vec![functional::cross_entropy(x(), inp.ints.clone().unwrap(), None, ce_options()).loss]
        }
        (BenchOp::CrossEntropy, Provider::Burn) => vec![
            CrossEntropyLossConfig::new()
                .init(&x().device())
                .forward(x(), inp.ints.clone().unwrap()),
        ],
        (BenchOp::FusedLinearCrossEntropy, Provider::Liger) => vec![
            functional::fused_linear_cross_entropy(
                x(),
                inp.residual.clone().unwrap(),
                None,
                inp.ints.clone().unwrap(),
                None,
                ce_options().with_weight_grad_accumulation(head_grad()),
            )
            .loss,
        ],
        (BenchOp::FusedLinearCrossEntropy, Provider::Burn) => {
            let logits = x().matmul(inp.residual.clone().unwrap().transpose());
            vec![
                CrossEntropyLossConfig::new()
                    .init(&logits.device())
                    .forward(logits, inp.ints.clone().unwrap()),
            ]
        }
        (BenchOp::FusedLinearDpo | BenchOp::FusedLinearJsd, provider) => {
            vec![post_training(op, provider, inp)]
        }
        (BenchOp::All, _) => unreachable!("`all` is expanded before running"),
        (BenchOp::Matmul, _) => unreachable!("matmul runs in bench::matmul"),
    }
}

/// `log softmax(x·wᵀ)[y]` per row, `[n]` f32: the stock composition (the `[n, V]` logits
/// and their f32 log-softmax materialized).
fn stock_token_logps<BB: FusedOps>(
    x: Tensor<BB, 2>,
    w: Tensor<BB, 2>,
    y: Tensor<BB, 1, Int>,
) -> Tensor<BB, 1> {
    let n = x.dims()[0];
    let logp = activation::log_softmax(x.matmul(w.transpose()).cast(DType::F32), 1);
    logp.gather(1, y.reshape([n, 1])).reshape([n])
}

/// DPO (sigmoid, β 0.1, summed log-probabilities, the reference head over the same x) and
/// distillation (Liger-Kernel's `LigerFusedLinearJSDLoss` defaults): the fused ops, or the
/// same losses composed of stock ops with the frozen head detached.
fn post_training<BB: FusedOps>(op: BenchOp, provider: Provider, inp: &Inputs<BB>) -> Tensor<BB, 1> {
    use liger_burn::ops::{DistillOptions, PreferenceOptions};
    let x = inp.x.clone().expect("x");
    let w = inp.residual.clone().expect("weight");
    let y = inp.ints.clone().expect("targets");
    let (fx, fw) = inp.frozen.clone().expect("frozen head");
    let [n, h] = x.dims();
    if op == BenchOp::FusedLinearDpo {
        // The rows are the 2B sequences of T tokens, flattened.
        let pairs = inp.sequences / 2;
        let t = n / inp.sequences;
        return match provider {
            Provider::Liger => {
                functional::fused_linear_preference(
                    x.reshape([2 * pairs, t, h]),
                    w,
                    None,
                    y.reshape([2 * pairs, t]),
                    functional::Reference::Model {
                        x: fx.detach().reshape([2 * pairs, t, h]),
                        weight: fw.detach(),
                        bias: None,
                    },
                    PreferenceOptions::dpo(),
                )
                .loss
            }
            Provider::Burn => {
                let seq =
                    |l: Tensor<BB, 1>| l.reshape([2 * pairs, t]).sum_dim(1).reshape([2 * pairs]);
                let policy = seq(stock_token_logps(x, w, y.clone()));
                let reference = seq(stock_token_logps(fx.detach(), fw.detach(), y)).detach();
                let ratio = policy - reference;
                let d = (ratio.clone().slice(0..pairs) - ratio.slice(pairs..2 * pairs)) * 0.1;
                activation::log_sigmoid(d).mean().neg()
            }
        };
    }
    let options = DistillOptions::default();
    match provider {
        Provider::Liger => {
            functional::fused_linear_distill(x, w, None, fx.detach(), fw.detach(), None, y, options)
                .loss
        }
        Provider::Burn => {
            let ls = activation::log_softmax(x.matmul(w.transpose()).cast(DType::F32), 1);
            let lt = activation::log_softmax(
                fx.detach().matmul(fw.detach().transpose()).cast(DType::F32),
                1,
            )
            .detach();
            let hard = ls.clone().gather(1, y.reshape([n, 1])).mean().neg();
            let beta = 0.5f64;
            let (a, b) = (lt.clone() + beta.ln(), ls.clone() + (1.0 - beta).ln());
            let m = a.clone().max_pair(b.clone());
            let log_m = m.clone() + ((a - m.clone()).exp() + (b - m).exp()).log();
            let soft = (lt.clone().exp() * (lt - log_m.clone()) * beta
                + ls.clone().exp() * (ls - log_m) * (1.0 - beta))
                .sum_dim(1)
                .reshape([n])
                .mean();
            hard * 0.5 + soft * 0.5
        }
    }
}

/// Hugging Face's `rotate_half`: `[-x2, x1]` over the halves of the last dim.
fn rotate_half<BB: Backend>(x: Tensor<BB, 4>) -> Tensor<BB, 4> {
    let half = x.dims()[3] / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(vec![x2.neg(), x1], 3)
}

/// The outputs the timed backward differentiates: the first; for RoPE, both (q and k).
/// The rest are held like outputs. Each gets a given gradient ([`super::upstream`]).
pub fn differentiated<BB: Backend>(op: BenchOp, outputs: &[Tensor<BB, 1>]) -> &[Tensor<BB, 1>] {
    if op == BenchOp::Rope {
        &outputs[..2]
    } else {
        &outputs[..1]
    }
}

/// Floating-point operations of the compute-bound ops (the matrix products), for a
/// TFLOP/s figure: fused linear cross entropy's forward alone is the logits product
/// `2NHV`; with gradients the two more products for x and w make it `6NHV`.
pub fn flops(op: BenchOp, mode: Mode, shape: &Shape) -> Option<f64> {
    let nhv = shape.0.iter().map(|&d| d as f64).product::<f64>();
    // DPO's rows are 2·pairs·tokens; it and the distillation run two heads forward.
    let (nhv, heads) = match op {
        BenchOp::FusedLinearCrossEntropy => (nhv, 1.0),
        BenchOp::FusedLinearDpo => (2.0 * nhv, 2.0),
        BenchOp::FusedLinearJsd => (nhv, 2.0),
        _ => return None,
    };
    Some(match mode {
        Mode::Forward => 2.0 * nhv * heads,
        Mode::Backward => return None,
        Mode::Full => 2.0 * nhv * heads + 4.0 * nhv,
    })
}

/// The fewest bytes an op must move through device memory, and the formula in words;
/// `None` for ops that are not memory-bound.
///
/// With `n = rows·width` elements of `e` bytes, weights of `width` elements of `e`
/// bytes and f32 per-row statistics (`s = 4` bytes per row):
/// - rms_norm: forward reads x, w and writes y, rstd: `2ne + we + rows·s`; backward
///   reads dy, x, w, rstd and writes dx, dw: `3ne + 2we + rows·s`.
/// - fused_add_rms_norm: forward also reads the residual and writes the sum:
///   `4ne + we + rows·s`; backward as rms_norm on the sum.
/// - layer_norm (with bias): forward reads x, w, b and writes y, mean, rstd:
///   `2ne + 2we + 2rows·s`; backward reads dy, x, w, mean, rstd and writes dx, dw, db:
///   `3ne + 3we + 2rows·s`.
/// - softmax, log_softmax: forward reads x and writes y: `2ne`; backward reads dy, y
///   and writes dx: `3ne`.
///
/// `full` is forward + backward.
pub fn bytes(op: BenchOp, mode: Mode, shape: &Shape, e: usize) -> Option<(usize, String)> {
    let (rows, width) = (shape.rows(), shape.width());
    let n = rows * width;
    let s = rows * STAT_BYTES;
    let w = width * e;
    let (fwd, bwd) = match op {
        BenchOp::RmsNorm => (
            (2 * n * e + w + s, "x+w+y+rstd"),
            (3 * n * e + 2 * w + s, "dy+x+w+rstd+dx+dw"),
        ),
        BenchOp::FusedAddRmsNorm => (
            (4 * n * e + w + s, "x+res+w+y+sum+rstd"),
            (3 * n * e + 2 * w + s, "dy+sum+w+rstd+dx+dw"),
        ),
        BenchOp::LayerNorm => (
            (2 * n * e + 2 * w + 2 * s, "x+w+b+y+mean+rstd"),
            (3 * n * e + 3 * w + 2 * s, "dy+x+w+mean+rstd+dx+dw+db"),
        ),
        BenchOp::Softmax | BenchOp::LogSoftmax => ((2 * n * e, "x+y"), (3 * n * e, "dy+y+dx")),
        BenchOp::SwiGlu | BenchOp::GeGlu => (
            (3 * n * e, "gate+up+y"),
            (5 * n * e, "dy+gate+up+dgate+dup"),
        ),
        BenchOp::Rope => {
            let d = &shape.0;
            let qk = d[0] * (d[2] + d[3]) * d[1] * d[4] * e;
            let tables = 2 * d[1] * d[4] * e;
            (
                (2 * qk + tables, "q+k+cos+sin+q'+k'"),
                (2 * qk + tables, "dq'+dk'+cos+sin+dq+dk"),
            )
        }
        // The fused forward also writes the logits gradient; the backward is free when
        // grad_output is 1, so only `forward` and `full` have a byte count.
        BenchOp::CrossEntropy => {
            return match mode {
                Mode::Forward => Some((n * e + rows * 4, "logits+targets".into())),
                Mode::Full => Some((
                    2 * n * e + rows * 4,
                    "logits+targets+dlogits (gradient written by the forward)".into(),
                )),
                Mode::Backward => None,
            };
        }
        BenchOp::FusedLinearCrossEntropy
        | BenchOp::FusedLinearDpo
        | BenchOp::FusedLinearJsd
        | BenchOp::All
        | BenchOp::Matmul => return None,
    };
    Some(match mode {
        Mode::Forward => (fwd.0, fwd.1.to_string()),
        Mode::Backward => (bwd.0, bwd.1.to_string()),
        Mode::Full => (fwd.0 + bwd.0, format!("fwd({})+bwd({})", fwd.1, bwd.1)),
    })
}
