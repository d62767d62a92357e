//! What is specific to each benchmarked op: its shape, its random inputs, the fused
//! (`liger_burn::functional`) and stock Burn forward, and the bytes it must move.
//!
//! Every op's forward returns its outputs flattened to 1-D (a free reshape), the first
//! being the root of the backward (`backward_root`); the rest are held like outputs.

use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Int, Tensor, activation};
use clap::ValueEnum;
use liger_burn::functional;
use liger_burn::ops::{FusedOps, RmsNormOptions};
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
}

impl BenchOp {
    /// Every op `all` expands to.
    pub const EACH: [BenchOp; 5] = [
        BenchOp::RmsNorm,
        BenchOp::LayerNorm,
        BenchOp::Softmax,
        BenchOp::LogSoftmax,
        BenchOp::FusedAddRmsNorm,
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
        }
    }

    /// The shape benchmarked when `--shape` is absent.
    pub fn default_shape(self) -> Shape {
        match self {
            BenchOp::Softmax | BenchOp::LogSoftmax => Shape(vec![8192, 32768]),
            _ => Shape(vec![8192, 4096]),
        }
    }

    /// What the dimensions of a `--shape` mean for this op.
    pub fn shape_form(self) -> &'static str {
        "ROWSxWIDTH (leading dims multiply into rows)"
    }

    /// Whether `shape` has the dimensions this op needs.
    pub fn accepts(self, shape: &Shape) -> bool {
        shape.0.len() >= 2
    }

    fn has_residual(self) -> bool {
        self == BenchOp::FusedAddRmsNorm
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
}

fn grad<BB: Backend, const D: usize>(t: &Option<Tensor<BB, D>>) -> Option<Tensor<Autodiff<BB>, D>> {
    t.clone().map(|t| Tensor::from_inner(t).require_grad())
}

impl<B: Backend> Inputs<B> {
    /// Fresh random inputs of `op` at `shape`.
    pub fn random(op: BenchOp, shape: &Shape, dtype: DType, device: &B::Device) -> Self {
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
            ints: None,
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
        }
    }
}

/// Elements of `op`'s float inputs and outputs at `shape` (sizes the input rotation and
/// how many iterations' outputs are held).
pub fn elements(op: BenchOp, shape: &Shape) -> (usize, usize) {
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
        (BenchOp::All, _) => unreachable!("`all` is expanded before running"),
    }
}

/// What `backward()` is called on: the first output (Burn seeds a non-scalar root with
/// ones of its shape).
pub fn backward_root<BB: Backend>(_op: BenchOp, outputs: &[Tensor<BB, 1>]) -> Tensor<BB, 1> {
    outputs[0].clone()
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
        BenchOp::All => return None,
    };
    Some(match mode {
        Mode::Forward => (fwd.0, fwd.1.to_string()),
        Mode::Backward => (bwd.0, bwd.1.to_string()),
        Mode::Full => (fwd.0 + bwd.0, format!("fwd({})+bwd({})", fwd.1, bwd.1)),
    })
}
