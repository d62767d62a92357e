//! `fused_matmul` and the routes to it: Burn's `matmul` and `nn::Linear` on `Liger<_>`,
//! forward and both gradients, against an f64 reference computed here from the inputs as
//! stored (rounded to the dtype), on every backend of the test device and every dtype it
//! has, in both wrapping orders; every layout the models and the backward use (2-D,
//! batched rank 3 and 4, transposed views of either operand or both, heads-swapped
//! views, broadcast batches); a random upstream gradient; bad input; and proof that the
//! comparison rejects wrong results.
//!
//! Tolerance per element, for a product accumulated in f32 and rounded once to the dtype
//! (unit roundoff `u`, `2⁻²⁴` for f32, `2⁻¹¹` f16, `2⁻⁸` bf16):
//! `|out - ref| ≤ u·(|ref| + B·Σ_b |ref_b|) + (1 + u)·c·2⁻²⁴·√K·(|A||B|)`, where `K` is
//! the length of the reduction, `(|A||B|)` the same product of absolute values, and
//! `Σ_b |ref_b|` the per-batch partial results a gradient is summed from when its operand
//! was broadcast over `B` batches (each partial rounded to the dtype before the sum, as
//! Burn's matmul node does), plus one subnormal spacing of the dtype (results that
//! underflow round absolutely). `c = 8`. `nn::Linear`'s output adds one more rounding (the
//! product is rounded before the bias is added, except in cuBLASLt's epilogue), and its
//! bias gradient is a sum over rows accumulated in f32 in both wrapping orders.
//!
//! On CUDA (`LIGER_TEST_DEVICE=cuda`, `--features cuda`) the products run on cuBLASLt and
//! the launch counters prove it: every product of these tests is counted as a vendor
//! product, none as Burn's. Elsewhere they run on Burn's matmul; the plain `CubeBackend`
//! counts them as routed through `fused_matmul`.

use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use liger_burn::Liger;
use liger_burn::cube::matmul_counts;
use liger_burn::fusion::HandOff;
use liger_burn::ops::FusedOps;
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::BackendVisitor;
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::{floats, values};
use liger_verify::conformance::Rng;

/// Safety factor on the √K accumulation bound.
const C: f64 = 8.0;
const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// Unit roundoff of a dtype.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => U32,
    }
}

/// Spacing of the dtype's subnormals: the absolute rounding error of a result that
/// underflows is up to half of it.
fn subnormal_spacing(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        _ => 2f64.powi(-149),
    }
}

/// How an operand is stored and viewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// Contiguous, as shaped.
    Plain,
    /// Stored with its last two dims swapped, viewed through `swap_dims` (Burn's
    /// `transpose`).
    Transposed,
    /// Rank 4 stored as `[b, s, h, d]`, viewed as `[b, h, s, d]` through `swap_dims(1, 2)`
    /// (attention heads): batch strides that do not nest.
    HeadsSwapped,
}

impl View {
    /// The stored shape of a view of logical shape `shape`.
    fn stored(self, shape: &[usize]) -> Vec<usize> {
        let mut s = shape.to_vec();
        let r = s.len();
        match self {
            View::Plain => {}
            View::Transposed => s.swap(r - 2, r - 1),
            View::HeadsSwapped => s.swap(1, 2),
        }
        s
    }

    fn dims(self, rank: usize) -> Option<(usize, usize)> {
        match self {
            View::Plain => None,
            View::Transposed => Some((rank - 2, rank - 1)),
            View::HeadsSwapped => Some((1, 2)),
        }
    }
}

/// One product: logical shapes `lhs [..., m, k]`, `rhs [..., k, n]` and their views.
#[derive(Clone, Copy, Debug)]
struct Case<const D: usize> {
    name: &'static str,
    lhs: [usize; D],
    lhs_view: View,
    rhs: [usize; D],
    rhs_view: View,
}

const fn case<const D: usize>(
    name: &'static str,
    lhs: [usize; D],
    lhs_view: View,
    rhs: [usize; D],
    rhs_view: View,
) -> Case<D> {
    Case {
        name,
        lhs,
        lhs_view,
        rhs,
        rhs_view,
    }
}

use View::{HeadsSwapped, Plain, Transposed};

const CASES_2D: [Case<2>; 6] = [
    case("2d", [7, 33], Plain, [33, 5], Plain),
    case("2d row x column", [1, 127], Plain, [127, 1], Plain),
    case("2d k=1", [33, 1], Plain, [1, 7], Plain),
    case("2d lhs transposed", [7, 33], Transposed, [33, 5], Plain),
    case("2d rhs transposed", [7, 33], Plain, [33, 5], Transposed),
    case(
        "2d both transposed",
        [33, 127],
        Transposed,
        [127, 7],
        Transposed,
    ),
];

const CASES_3D: [Case<3>; 4] = [
    case("3d batched", [3, 7, 33], Plain, [3, 33, 5], Plain),
    case("3d lhs broadcast", [1, 7, 33], Plain, [3, 33, 5], Plain),
    case("3d rhs broadcast", [3, 7, 33], Plain, [1, 33, 5], Plain),
    case(
        "3d batched, both transposed",
        [2, 33, 7],
        Transposed,
        [2, 7, 5],
        Transposed,
    ),
];

const CASES_4D: [Case<4>; 3] = [
    case("4d batched", [2, 3, 7, 9], Plain, [2, 3, 9, 5], Plain),
    case(
        "4d mixed broadcast",
        [1, 3, 7, 9],
        Plain,
        [2, 1, 9, 5],
        Plain,
    ),
    case(
        "4d heads swapped (q kᵀ)",
        [2, 3, 7, 9],
        HeadsSwapped,
        [2, 3, 9, 7],
        Transposed,
    ),
];

/// A logical row-major host tensor.
#[derive(Clone, Debug)]
struct Host {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

impl Host {
    fn at(&self, index: &[usize]) -> f64 {
        let s = strides(&self.shape);
        self.data[index.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// The tensor with dims `a` and `b` swapped (materialized).
    fn swapped(&self, a: usize, b: usize) -> Host {
        let mut shape = self.shape.clone();
        shape.swap(a, b);
        let s = strides(&shape);
        let mut data = vec![0.0; self.data.len()];
        for (flat, v) in data.iter_mut().enumerate() {
            let mut idx: Vec<usize> = (0..shape.len()).map(|d| flat / s[d] % shape[d]).collect();
            idx.swap(a, b);
            *v = self.at(&idx);
        }
        Host { shape, data }
    }
}

/// The reference of a product or a gradient: values and what bounds their error.
struct Expected {
    shape: Vec<usize>,
    value: Vec<f64>,
    /// `(|A||B|)` per element, summed like the value.
    abs: Vec<f64>,
    /// `B·Σ_b |ref_b|` over the partials of a broadcast sum (0 without one).
    partials: Vec<f64>,
    /// Reduction length.
    k: usize,
    /// Unit roundoff of the accumulation: f32's for products; the dtype's for the sums
    /// Burn's own ops do in it (the bias gradient).
    acc_unit: f64,
}

impl Expected {
    fn bound(&self, i: usize, dtype: DType) -> f64 {
        let u = unit_roundoff(dtype);
        let acc = C * self.acc_unit * (self.k as f64).sqrt() * self.abs[i];
        u * (self.value[i].abs() + self.partials[i]) + (1.0 + u) * acc + subnormal_spacing(dtype)
    }

    /// `Err` naming the worst element when any is out of bounds.
    fn check(&self, actual: &[f64], dtype: DType) -> Result<(), String> {
        if actual.len() != self.value.len() {
            return Err(format!(
                "{} elements, expected {} (shape {:?})",
                actual.len(),
                self.value.len(),
                self.shape
            ));
        }
        let mut worst: Option<(f64, usize)> = None;
        let mut failures = 0;
        for (i, a) in actual.iter().enumerate() {
            let ratio = (a - self.value[i]).abs() / self.bound(i, dtype);
            // A NaN (non-finite result) is the worst there is.
            let ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            if ratio > 1.0 {
                failures += 1;
            }
            if worst.is_none_or(|(r, _)| ratio > r) {
                worst = Some((ratio, i));
            }
        }
        match worst {
            Some((r, i)) if failures > 0 => Err(format!(
                "{failures} of {} elements out of bounds (shape {:?}); worst at {i}: got {}, expected {}, bound {:.3e} ({r:.1}x)",
                actual.len(),
                self.shape,
                actual[i],
                self.value[i],
                self.bound(i, dtype)
            )),
            _ => Ok(()),
        }
    }
}

/// Broadcast batch index of an operand with batch shape `shape` for output index `out`.
fn operand_batch(shape: &[usize], out: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .zip(out)
        .map(|(&s, &o)| if s == 1 { 0 } else { o })
        .collect()
}

/// `lhs [..., m, k] · rhs [..., k, n]` in f64 (batch dims broadcast).
fn reference_product(lhs: &Host, rhs: &Host) -> Expected {
    let r = lhs.shape.len();
    let (m, k, n) = (lhs.shape[r - 2], lhs.shape[r - 1], rhs.shape[r - 1]);
    let mut shape: Vec<usize> = (0..r - 2).map(|d| lhs.shape[d].max(rhs.shape[d])).collect();
    shape.extend([m, n]);
    let s = strides(&shape);
    let total: usize = shape.iter().product();
    let (mut value, mut abs) = (vec![0.0; total], vec![0.0; total]);
    for flat in 0..total {
        let idx: Vec<usize> = (0..r).map(|d| flat / s[d] % shape[d]).collect();
        let (i, j) = (idx[r - 2], idx[r - 1]);
        let lb = operand_batch(&lhs.shape[..r - 2], &idx[..r - 2]);
        let rb = operand_batch(&rhs.shape[..r - 2], &idx[..r - 2]);
        for p in 0..k {
            let a = lhs.at(&[lb.clone(), vec![i, p]].concat());
            let b = rhs.at(&[rb.clone(), vec![p, j]].concat());
            value[flat] += a * b;
            abs[flat] += (a * b).abs();
        }
    }
    Expected {
        shape,
        value: value.clone(),
        abs,
        partials: vec![0.0; total],
        k,
        acc_unit: U32,
    }
}

/// Sums `full` (output batch shape) over the batch dims where `target` is 1.
fn unbroadcast(full: Expected, target: &[usize]) -> Expected {
    if full.shape == target {
        return full;
    }
    let r = target.len();
    let ts = strides(target);
    let fs = strides(&full.shape);
    let total: usize = target.iter().product();
    let summands = full.value.len() / total;
    let mut out = Expected {
        shape: target.to_vec(),
        value: vec![0.0; total],
        abs: vec![0.0; total],
        partials: vec![0.0; total],
        k: full.k,
        acc_unit: full.acc_unit,
    };
    for flat in 0..full.value.len() {
        let idx: Vec<usize> = (0..r).map(|d| flat / fs[d] % full.shape[d]).collect();
        let t: usize = (0..r)
            .map(|d| if target[d] == 1 { 0 } else { idx[d] * ts[d] })
            .sum();
        out.value[t] += full.value[flat];
        out.abs[t] += full.abs[flat];
        out.partials[t] += summands as f64 * full.value[flat].abs();
    }
    out
}

/// Expected `(y, grad_lhs, grad_rhs)` for `y = lhs · rhs` and upstream gradient `g`,
/// the gradients in the operands' logical shapes.
fn reference(lhs: &Host, rhs: &Host, g: &Host) -> (Expected, Expected, Expected) {
    let r = lhs.shape.len();
    let y = reference_product(lhs, rhs);
    // grad_lhs = g · rhsᵀ, grad_rhs = lhsᵀ · g, in the output's batch shape, then summed.
    let rhs_t = rhs.swapped(r - 2, r - 1);
    let lhs_t = lhs.swapped(r - 2, r - 1);
    let grad_lhs = unbroadcast(reference_product(g, &rhs_t), &lhs.shape);
    let grad_rhs = unbroadcast(reference_product(&lhs_t, g), &rhs.shape);
    (y, grad_lhs, grad_rhs)
}

/// An expectation of the stored (leaf) tensor of a view.
fn stored(e: Expected, view: View) -> Expected {
    let Some((a, b)) = view.dims(e.shape.len()) else {
        return e;
    };
    let swap = |data: Vec<f64>| {
        Host {
            shape: e.shape.clone(),
            data,
        }
        .swapped(a, b)
        .data
    };
    let mut shape = e.shape.clone();
    shape.swap(a, b);
    Expected {
        value: swap(e.value.clone()),
        abs: swap(e.abs.clone()),
        partials: swap(e.partials.clone()),
        shape,
        k: e.k,
        acc_unit: e.acc_unit,
    }
}

/// Random inputs of one case, rounded to the dtype (the values the device stores).
struct Inputs {
    /// Stored data, as f32 exactly representable in the dtype.
    lhs: Vec<f32>,
    rhs: Vec<f32>,
    g: Vec<f32>,
    /// Logical host tensors.
    lhs_host: Host,
    rhs_host: Host,
    g_host: Host,
}

fn round_to(v: Vec<f32>, dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F16 => v
            .into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect(),
        DType::BF16 => v
            .into_iter()
            .map(|x| half::bf16::from_f32(x).to_f32())
            .collect(),
        _ => v,
    }
}

impl Inputs {
    fn new<const D: usize>(c: &Case<D>, dtype: DType, rng: &mut Rng) -> Self {
        let count = |s: &[usize]| s.iter().product::<usize>();
        let host = |data: &[f32], view: View, logical: &[usize]| {
            let stored = Host {
                shape: view.stored(logical),
                data: data.iter().map(|&v| v as f64).collect(),
            };
            match view.dims(logical.len()) {
                Some((a, b)) => stored.swapped(a, b),
                None => stored,
            }
        };
        let out = reference_product(
            &Host {
                shape: c.lhs.to_vec(),
                data: vec![0.0; count(&c.lhs)],
            },
            &Host {
                shape: c.rhs.to_vec(),
                data: vec![0.0; count(&c.rhs)],
            },
        )
        .shape;
        let lhs = round_to(rng.vec(count(&c.lhs), -1.0, 1.0, 0.0), dtype);
        let rhs = round_to(rng.vec(count(&c.rhs), -1.0, 1.0, 0.0), dtype);
        let g = round_to(rng.vec(count(&out), -1.0, 1.0, 0.0), dtype);
        Inputs {
            lhs_host: host(&lhs, c.lhs_view, &c.lhs),
            rhs_host: host(&rhs, c.rhs_view, &c.rhs),
            g_host: Host {
                shape: out,
                data: g.iter().map(|&v| v as f64).collect(),
            },
            lhs,
            rhs,
            g,
        }
    }
}

/// A tensor of `BB` holding `data` (stored shape of `view`), in `dtype`, viewed.
fn device_tensor<BB: Backend, const D: usize>(
    data: &[f32],
    logical: [usize; D],
    view: View,
    dtype: DType,
    device: &BB::Device,
) -> Tensor<BB, D> {
    let stored: [usize; D] = view.stored(&logical).try_into().unwrap();
    let t = floats::<BB, D>(data, stored, device).cast(dtype);
    match view.dims(D) {
        Some((a, b)) => t.swap_dims(a, b),
        None => t,
    }
}

/// Runs `y = lhs · rhs`, backward of `Σ y·g` on `AD`, and returns the values of `y` and
/// of the leaves' gradients (stored layouts).
fn run_autodiff<AD: AutodiffBackend, const D: usize>(
    c: &Case<D>,
    inputs: &Inputs,
    dtype: DType,
    device: &AD::Device,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let leaf = |data: &[f32], logical: [usize; D], view: View| {
        let stored: [usize; D] = view.stored(&logical).try_into().unwrap();
        floats::<AD, D>(data, stored, device)
            .cast(dtype)
            .detach()
            .require_grad()
    };
    let view = |t: Tensor<AD, D>, v: View| match v.dims(D) {
        Some((a, b)) => t.swap_dims(a, b),
        None => t,
    };
    let lhs = leaf(&inputs.lhs, c.lhs, c.lhs_view);
    let rhs = leaf(&inputs.rhs, c.rhs, c.rhs_view);
    let out_shape: [usize; D] = inputs.g_host.shape.clone().try_into().unwrap();
    let g = floats::<AD, D>(&inputs.g, out_shape, device).cast(dtype);
    let y = view(lhs.clone(), c.lhs_view).matmul(view(rhs.clone(), c.rhs_view));
    let grads = (y.clone() * g).sum().backward();
    let gl = lhs.grad(&grads).expect("lhs gradient");
    let gr = rhs.grad(&grads).expect("rhs gradient");
    (values(y.inner()), values(gl), values(gr))
}

/// Failures collected over the sweep.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    cases: usize,
}

impl Report {
    fn check(&mut self, what: String, e: &Expected, actual: &[f64], dtype: DType) {
        self.cases += 1;
        if let Err(msg) = e.check(actual, dtype) {
            self.failures.push(format!("{what}: {msg}"));
        }
    }
}

/// Which path a backend's products must take, from the launch counters.
fn expect_path(
    label: &str,
    before: liger_burn::cube::MatmulCounts,
    products: u64,
    report: &mut Report,
) {
    let after = matmul_counts();
    let (vendor, backend) = (after.vendor - before.vendor, after.backend - before.backend);
    let cuda = label.starts_with("cuda");
    let plain_cube = label.contains("/cube");
    let ok = if cuda {
        // Every product on cuBLASLt, none on Burn's matmul.
        vendor == products && backend == 0
    } else if plain_cube {
        // Routed through fused_matmul, which runs Burn's matmul here.
        vendor == 0 && backend == products
    } else {
        // The fusion backend keeps Burn's own matmul operation (not counted) off CUDA;
        // NdArray has no CubeCL.
        vendor == 0 && backend == 0
    };
    if !ok {
        report.failures.push(format!(
            "{label}: {products} products ran {vendor} on cuBLASLt and {backend} on Burn's matmul through fused_matmul"
        ));
    }
}

/// On CUDA, `epilogues` products since `before` ran a cuBLASLt epilogue (the bias added or
/// summed in the product); none elsewhere.
fn expect_epilogues(label: &str, before: u64, epilogues: u64, report: &mut Report) {
    let ran = counters::get(Kernel::matmul_vendor_epilogue) - before;
    let expected = if label.starts_with("cuda") {
        epilogues
    } else {
        0
    };
    if ran != expected {
        report.failures.push(format!(
            "{label}: {ran} products ran a cuBLASLt epilogue, expected {expected}"
        ));
    }
}

struct Sweep {
    rng: Rng,
    report: Report,
}

impl Sweep {
    /// A sweep on fresh random inputs, and the seed that reproduces them.
    fn fresh() -> (Self, u64) {
        let rng = liger_tests::fresh_rng();
        let seed = rng.seed();
        let report = Report::default();
        (Self { rng, report }, seed)
    }

    fn cases<B: FusedOps, const D: usize>(
        &mut self,
        label: &str,
        device: &B::Device,
        cases: &[Case<D>],
    ) {
        for dtype in liger_tests::dtypes::<B>(device) {
            for c in cases {
                let inputs = Inputs::new(c, dtype, &mut self.rng);
                let (y, gl, gr) = reference(&inputs.lhs_host, &inputs.rhs_host, &inputs.g_host);
                let (gl, gr) = (stored(gl, c.lhs_view), stored(gr, c.rhs_view));
                let what =
                    |order: &str, t: &str| format!("{label} {order} {dtype:?} {}: {t}", c.name);

                // Forward through Burn's matmul on Liger<B>.
                let before = matmul_counts();
                let lhs =
                    device_tensor::<Liger<B>, D>(&inputs.lhs, c.lhs, c.lhs_view, dtype, device);
                let rhs =
                    device_tensor::<Liger<B>, D>(&inputs.rhs, c.rhs, c.rhs_view, dtype, device);
                let out = values(lhs.matmul(rhs));
                self.report.check(what("Liger<B>", "y"), &y, &out, dtype);
                expect_path(&what("Liger<B>", "path"), before, 1, &mut self.report);

                // Both wrapping orders: the forward and both gradients.
                let before = matmul_counts();
                let (yv, glv, grv) =
                    run_autodiff::<Liger<Autodiff<B>>, D>(c, &inputs, dtype, device);
                self.report
                    .check(what("Liger<Autodiff<B>>", "y"), &y, &yv, dtype);
                self.report
                    .check(what("Liger<Autodiff<B>>", "grad lhs"), &gl, &glv, dtype);
                self.report
                    .check(what("Liger<Autodiff<B>>", "grad rhs"), &gr, &grv, dtype);
                expect_path(
                    &what("Liger<Autodiff<B>>", "path"),
                    before,
                    3,
                    &mut self.report,
                );
                // Autodiff's node takes both gradients of a 2-D product in one
                // `fused_matmul_backward`: on CUDA one chain of two products.
                let pairs = matmul_counts().backward_pairs - before.backward_pairs;
                let expected = u64::from(D == 2 && label.starts_with("cuda"));
                if pairs != expected {
                    self.report.failures.push(format!(
                        "{}: {pairs} gradient pairs ran as one chain, expected {expected}",
                        what("Liger<Autodiff<B>>", "path")
                    ));
                }

                let before = matmul_counts();
                let (yv, glv, grv) =
                    run_autodiff::<Autodiff<Liger<B>>, D>(c, &inputs, dtype, device);
                self.report
                    .check(what("Autodiff<Liger<B>>", "y"), &y, &yv, dtype);
                self.report
                    .check(what("Autodiff<Liger<B>>", "grad lhs"), &gl, &glv, dtype);
                self.report
                    .check(what("Autodiff<Liger<B>>", "grad rhs"), &gr, &grv, dtype);
                expect_path(
                    &what("Autodiff<Liger<B>>", "path"),
                    before,
                    3,
                    &mut self.report,
                );
            }
        }
    }
}

/// The plain `CubeBackend` labels contain `/cube`; the fusion ones `/fusion`.
fn for_each_backend(v: &mut impl BackendVisitor) {
    let name = liger_tests::device_name();
    match name.as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" | "vulkan" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice, WgpuRuntime};
            type Plain = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;
            let device = if name == "wgpu-cpu" {
                WgpuDevice::Cpu
            } else {
                WgpuDevice::DefaultDevice
            };
            v.visit::<Wgpu>(&format!("{name}/fusion"), &device);
            v.visit::<Plain>(&format!("{name}/cube"), &device);
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            use burn::backend::cuda::{Cuda, CudaDevice};
            use cubecl::cuda::CudaRuntime;
            type Plain = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;
            let device = CudaDevice::default();
            v.visit::<Cuda>("cuda/fusion", &device);
            v.visit::<Plain>("cuda/cube", &device);
        }
        "ndarray" => {}
        other => panic!("LIGER_TEST_DEVICE={other} is not available in this build"),
    }
    #[cfg(feature = "ndarray")]
    v.visit::<burn::backend::NdArray>("ndarray/fallback", &Default::default());
}

fn finish(what: &str, seed: u64, report: Report) {
    assert!(report.cases > 0, "no case ran");
    assert!(
        report.failures.is_empty(),
        "{what} failed (seed {seed}, rerun with LIGER_SEED={seed}); {} of {} checks:\n{}",
        report.failures.len(),
        report.cases,
        report.failures.join("\n")
    );
    eprintln!("{what}: {} checks passed (seed {seed})", report.cases);
}

macro_rules! sweep_test {
    ($name:ident, $cases:expr) => {
        #[test]
        fn $name() {
            struct V(Sweep);
            impl BackendVisitor for V {
                fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                    self.0.cases::<B, _>(label, device, &$cases);
                }
            }
            let (sweep, seed) = Sweep::fresh();
            let mut v = V(sweep);
            for_each_backend(&mut v);
            finish(stringify!($name), seed, v.0.report);
        }
    };
}

sweep_test!(matmul_2d_matches_reference, CASES_2D);
sweep_test!(matmul_3d_matches_reference, CASES_3D);
sweep_test!(matmul_4d_matches_reference, CASES_4D);

/// A product of a layout cuBLASLt has planned is queued on CubeCL's device thread without
/// the caller waiting (the first of a layout waits, to fall back if cuBLASLt declines
/// it): on CUDA, of two products of one layout at least the second is queued; both match
/// the reference, as do an operation of the backend's own that reads the queued product
/// right after it and a product whose lhs is that queued output; with the product handed
/// on at once and with it left in the runtime's batch.
#[test]
fn queued_products_match_reference() {
    struct V(Sweep);
    impl BackendVisitor for V {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            // A layout no other test uses, so its first product here is the first.
            let c = case("queued", [41, 67], Plain, [67, 23], Transposed);
            let next = case("queued, chained", [41, 23], Plain, [23, 19], Plain);
            // Each hand-off: a product handed on at once, or left in the runtime's batch
            // until the next read.
            let hand_offs = [HandOff::Kernels, HandOff::Runtime];
            for (dtype, hand_off) in liger_tests::dtypes::<B>(device)
                .into_iter()
                .flat_map(|d| hand_offs.map(|h| (d, h)))
            {
                let _hand_off = liger_burn::test_hooks::override_hand_off(hand_off);
                let before = matmul_counts();
                let tensors = |i: &Inputs, c: &Case<2>| {
                    (
                        device_tensor::<Liger<B>, 2>(&i.lhs, c.lhs, c.lhs_view, dtype, device),
                        device_tensor::<Liger<B>, 2>(&i.rhs, c.rhs, c.rhs_view, dtype, device),
                    )
                };
                let first = Inputs::new(&c, dtype, &mut self.0.rng);
                let second = Inputs::new(&c, dtype, &mut self.0.rng);
                let (l1, r1) = tensors(&first, &c);
                let (l2, r2) = tensors(&second, &c);
                let y1 = l1.matmul(r1);
                let y2 = l2.matmul(r2);
                // Read right after the product: a negation is exact.
                let negated = y2.clone().neg();
                // The chained product's lhs is y2 as stored (rounded to the dtype).
                let w = Inputs::new(&next, dtype, &mut self.0.rng);
                let w_tensor =
                    device_tensor::<Liger<B>, 2>(&w.rhs, next.rhs, next.rhs_view, dtype, device);
                let chained = y2.clone().matmul(w_tensor);
                let y2_values = values(y2);
                let what =
                    |t: &str| format!("{label} {dtype:?} queued, hand-off {hand_off:?}: {t}");
                let (e1, _, _) = reference(&first.lhs_host, &first.rhs_host, &first.g_host);
                let (e2, _, _) = reference(&second.lhs_host, &second.rhs_host, &second.g_host);
                self.0.report.check(what("first"), &e1, &values(y1), dtype);
                self.0.report.check(what("second"), &e2, &y2_values, dtype);
                let minus: Vec<f64> = values(negated).iter().map(|v| -v).collect();
                self.0.report.check(what("read after"), &e2, &minus, dtype);
                let stored_y2 = Host {
                    shape: vec![41, 23],
                    data: y2_values,
                };
                let (e3, _, _) = reference(&stored_y2, &w.rhs_host, &w.g_host);
                self.0
                    .report
                    .check(what("chained"), &e3, &values(chained), dtype);
                let queued = matmul_counts().queued - before.queued;
                if label.starts_with("cuda") && queued < 1 {
                    self.0.report.failures.push(format!(
                        "{}: none of three products was queued",
                        what("path")
                    ));
                }
                if !label.starts_with("cuda") && queued != 0 {
                    self.0.report.failures.push(format!(
                        "{}: {queued} products queued off CUDA",
                        what("path")
                    ));
                }
            }
        }
    }
    let (sweep, seed) = Sweep::fresh();
    let mut v = V(sweep);
    for_each_backend(&mut v);
    finish("queued_products_match_reference", seed, v.0.report);
}

/// On CUDA, each ordering of cuBLASLt's work against CubeCL's stream that the device runs,
/// asked for explicitly (every other test runs the device's default): a product, a
/// product reading it at once, and a CubeCL kernel reading the first, against the
/// reference. The device's default must be one it runs; the orderings it lacks are named.
#[cfg(feature = "cuda")]
#[test]
fn every_cuda_ordering_matches_reference() {
    use burn::tensor::TensorPrimitive;
    use liger_burn::cube::cublaslt::{MatmulOrdering, device_support};
    use liger_burn::cube::cublaslt_matmul;
    type Plain = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    if liger_tests::device_name() != "cuda" {
        eprintln!("every_cuda_ordering_matches_reference: CUDA only (LIGER_TEST_DEVICE=cuda)");
        return;
    }
    let device = burn::backend::cuda::CudaDevice::default();
    let support = device_support(&device).expect("cuBLASLt on the CUDA test device");
    let (mut sweep, seed) = Sweep::fresh();
    let c = case("ordering", [67, 45], View::Plain, [45, 38], View::Plain);
    let next = case(
        "ordering, chained",
        [67, 38],
        View::Plain,
        [38, 29],
        View::Plain,
    );
    let mut ran = Vec::new();
    for ordering in MatmulOrdering::ALL {
        if let Some(why) = support.lacks(ordering) {
            eprintln!("{}: not on this device ({why})", ordering.name());
            continue;
        }
        ran.push(ordering);
        let product = |lhs: Tensor<Plain, 2>, rhs: Tensor<Plain, 2>| {
            let out = cublaslt_matmul(
                lhs.into_primitive().tensor(),
                rhs.into_primitive().tensor(),
                Some(ordering),
            )
            .unwrap_or_else(|why| panic!("cuBLASLt with {}: {why}", ordering.name()));
            Tensor::<Plain, 2>::from_primitive(TensorPrimitive::Float(out))
        };
        for dtype in liger_tests::dtypes::<Plain>(&device) {
            let what = |t: &str| format!("cuda/cube {dtype:?} {}: {t}", ordering.name());
            let first = Inputs::new(&c, dtype, &mut sweep.rng);
            let lhs = device_tensor::<Plain, 2>(&first.lhs, c.lhs, c.lhs_view, dtype, &device);
            let rhs = device_tensor::<Plain, 2>(&first.rhs, c.rhs, c.rhs_view, dtype, &device);
            let y = product(lhs, rhs);
            let negated = y.clone().neg();
            let w = Inputs::new(&next, dtype, &mut sweep.rng);
            let w_tensor =
                device_tensor::<Plain, 2>(&w.rhs, next.rhs, next.rhs_view, dtype, &device);
            let chained = product(y.clone(), w_tensor);
            let y_values = values(y);
            let (expected, _, _) = reference(&first.lhs_host, &first.rhs_host, &first.g_host);
            sweep
                .report
                .check(what("product"), &expected, &y_values, dtype);
            let minus: Vec<f64> = values(negated).iter().map(|v| -v).collect();
            sweep
                .report
                .check(what("read by CubeCL"), &expected, &minus, dtype);
            let stored_y = Host {
                shape: vec![67, 38],
                data: y_values,
            };
            let (expected, _, _) = reference(&stored_y, &w.rhs_host, &w.g_host);
            sweep
                .report
                .check(what("chained"), &expected, &values(chained), dtype);
        }
    }
    assert!(
        ran.contains(&support.default_ordering),
        "the default ordering {} is not one the device runs ({:?})",
        support.default_ordering.name(),
        ran.iter().map(|o| o.name()).collect::<Vec<_>>()
    );
    eprintln!(
        "orderings run: {:?}",
        ran.iter().map(|o| o.name()).collect::<Vec<_>>()
    );
    finish("every_cuda_ordering_matches_reference", seed, sweep.report);
}

/// `burn::nn::Linear` on `[2, 7, 33]` input with a bias, both wrapping orders: output
/// and the gradients of x, the weight and the bias; on CUDA, a layer run again on the same
/// layouts has all three products queued, the bias epilogues included.
#[test]
fn nn_linear_matches_reference() {
    struct V(Sweep);
    impl BackendVisitor for V {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            for dtype in liger_tests::dtypes::<B>(device) {
                let before = matmul_counts();
                let epilogues = counters::get(Kernel::matmul_vendor_epilogue);
                linear_case::<Liger<Autodiff<B>>>(
                    &mut self.0,
                    &format!("{label} Liger<Autodiff<B>> {dtype:?}"),
                    dtype,
                    device,
                );
                // The product with its bias, the gradient of x, and the weight's gradient
                // with the bias's (`fused_linear_weight_backward`); on CUDA the first and
                // the last add and sum the bias in cuBLASLt's epilogue.
                let label_ad = format!("{label} Liger<Autodiff<B>> {dtype:?} linear path");
                expect_path(&label_ad, before, 3, &mut self.0.report);
                expect_epilogues(&label_ad, epilogues, 2, &mut self.0.report);
                let before = matmul_counts();
                let epilogues = counters::get(Kernel::matmul_vendor_epilogue);
                linear_case::<Autodiff<Liger<B>>>(
                    &mut self.0,
                    &format!("{label} Autodiff<Liger<B>> {dtype:?}"),
                    dtype,
                    device,
                );
                // Burn's own linear node: its forward is ours, its backward sums the
                // bias's gradient itself.
                let label_la = format!("{label} Autodiff<Liger<B>> {dtype:?} linear path");
                expect_path(&label_la, before, 3, &mut self.0.report);
                expect_epilogues(&label_la, epilogues, 1, &mut self.0.report);
                // The same layouts again: on CUDA all three products are now queued, the
                // two bias products because their operands' alignments, predicted from
                // the handles, match the plans the first run made.
                let before = matmul_counts();
                let epilogues = counters::get(Kernel::matmul_vendor_epilogue);
                let label_q = format!("{label} Liger<Autodiff<B>> {dtype:?} again");
                liger_burn::test_hooks::take_epilogue_not_queued();
                linear_case::<Liger<Autodiff<B>>>(&mut self.0, &label_q, dtype, device);
                // Why any was waited for (another test's products may be among them).
                let waited = liger_burn::test_hooks::take_epilogue_not_queued();
                expect_path(&label_q, before, 3, &mut self.0.report);
                expect_epilogues(&label_q, epilogues, 2, &mut self.0.report);
                let queued = matmul_counts().queued - before.queued;
                let expected = if label.starts_with("cuda") { 3 } else { 0 };
                if queued != expected {
                    self.0.report.failures.push(format!(
                        "{label_q}: {queued} of 3 products queued, expected {expected}; epilogue products waited for: {waited:?}"
                    ));
                }
            }
        }
    }
    let (sweep, seed) = Sweep::fresh();
    let mut v = V(sweep);
    for_each_backend(&mut v);
    finish("nn_linear_matches_reference", seed, v.0.report);
}

fn linear_case<AD: AutodiffBackend>(s: &mut Sweep, label: &str, dtype: DType, device: &AD::Device) {
    let (b, rows, d_in, d_out) = (2, 7, 33, 5);
    let x = round_to(s.rng.vec(b * rows * d_in, -1.0, 1.0, 0.0), dtype);
    let w = round_to(s.rng.vec(d_in * d_out, -1.0, 1.0, 0.0), dtype);
    let bias = round_to(s.rng.vec(d_out, -1.0, 1.0, 0.0), dtype);
    let g = round_to(s.rng.vec(b * rows * d_out, -1.0, 1.0, 0.0), dtype);

    let leaf = |data: &[f32], shape: [usize; 3]| {
        floats::<AD, 3>(data, shape, device)
            .cast(dtype)
            .detach()
            .require_grad()
    };
    let xt = leaf(&x, [b, rows, d_in]);
    let mut linear: Linear<AD> = LinearConfig::new(d_in, d_out).init(device);
    linear.weight = Param::from_tensor(
        floats::<AD, 2>(&w, [d_in, d_out], device)
            .cast(dtype)
            .detach()
            .require_grad(),
    );
    linear.bias = Some(Param::from_tensor(
        floats::<AD, 1>(&bias, [d_out], device)
            .cast(dtype)
            .detach()
            .require_grad(),
    ));
    let y = linear.forward(xt.clone());
    let gt = floats::<AD, 3>(&g, [b, rows, d_out], device).cast(dtype);
    let grads = (y.clone() * gt).sum().backward();

    let host = |data: &[f32], shape: Vec<usize>| Host {
        shape,
        data: data.iter().map(|&v| v as f64).collect(),
    };
    // The reference folds the batch into rows, as Linear is a per-row map.
    let x2 = host(&x, vec![b * rows, d_in]);
    let w2 = host(&w, vec![d_in, d_out]);
    let g2 = host(&g, vec![b * rows, d_out]);
    let (mut ey, egx, egw) = reference(&x2, &w2, &g2);
    // `fl(fl(x·W) + b)`: the product is rounded to the dtype before the bias is added.
    for (i, v) in ey.value.iter_mut().enumerate() {
        let bias_v = bias[i % d_out] as f64;
        ey.partials[i] = v.abs();
        *v += bias_v;
        ey.abs[i] += bias_v.abs();
    }
    // The bias gradient: Σ_rows g, summed in f32 (cuBLASLt's epilogue, or the
    // composition's f32 sum).
    let egb = Expected {
        shape: vec![d_out],
        value: (0..d_out)
            .map(|j| (0..b * rows).map(|r| g[r * d_out + j] as f64).sum())
            .collect(),
        abs: (0..d_out)
            .map(|j| (0..b * rows).map(|r| (g[r * d_out + j] as f64).abs()).sum())
            .collect(),
        partials: vec![0.0; d_out],
        k: b * rows,
        acc_unit: U32,
    };
    s.report
        .check(format!("{label} linear y"), &ey, &values(y.inner()), dtype);
    s.report.check(
        format!("{label} linear grad x"),
        &egx,
        &values(xt.grad(&grads).unwrap()),
        dtype,
    );
    s.report.check(
        format!("{label} linear grad weight"),
        &egw,
        &values(linear.weight.val().grad(&grads).unwrap()),
        dtype,
    );
    s.report.check(
        format!("{label} linear grad bias"),
        &egb,
        &values(linear.bias.as_ref().unwrap().val().grad(&grads).unwrap()),
        dtype,
    );
}

/// Bad input is a panic naming the op, the shapes and the dtypes, at the entry that reaches
/// `fused_matmul`: `Liger<B>`'s `float_matmul`, which Burn's `Tensor::matmul` calls having
/// checked the inner dimensions only (`fused_matmul` itself assumes valid input). The
/// override is called directly for what Burn's check or its types stop first (inner
/// dimensions, ranks), through `Tensor::matmul` for the rest.
#[test]
fn bad_inputs_are_rejected() {
    struct V;
    impl BackendVisitor for V {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            use burn::tensor::ops::FloatTensorOps;
            let prim = |t: Tensor<Liger<B>, 2>| t.into_primitive().tensor();
            let a = || floats::<Liger<B>, 2>(&[0.0; 12], [3, 4], device);
            let b = || floats::<Liger<B>, 2>(&[0.0; 10], [5, 2], device);
            let msg = panic_message(|| {
                Liger::<B>::float_matmul(prim(a()), prim(b()));
            });
            assert_mentions(label, &msg, &["matmul", "[3, 4]", "[5, 2]", "F32", "inner"]);
            if B::supports_dtype(device, DType::BF16) {
                let c = floats::<Liger<B>, 2>(&[0.0; 8], [4, 2], device).cast(DType::BF16);
                let msg = panic_message(|| {
                    a().matmul(c);
                });
                assert_mentions(
                    label,
                    &msg,
                    &["matmul", "[3, 4]", "[4, 2]", "F32", "BF16", "dtype"],
                );
            }
            let r3 = floats::<Liger<B>, 3>(&[0.0; 8], [1, 4, 2], device)
                .into_primitive()
                .tensor();
            let msg = panic_message(|| {
                Liger::<B>::float_matmul(prim(a()), r3);
            });
            assert_mentions(label, &msg, &["matmul", "[3, 4]", "[1, 4, 2]", "rank"]);
            let x = floats::<Liger<B>, 3>(&[0.0; 24], [2, 3, 4], device);
            let y = floats::<Liger<B>, 3>(&[0.0; 24], [3, 4, 2], device);
            let msg = panic_message(|| {
                x.matmul(y);
            });
            assert_mentions(label, &msg, &["matmul", "[2, 3, 4]", "[3, 4, 2]", "batch"]);
            // Both gradients of a 2-D product: grad must be [m, n].
            let g = || floats::<Liger<B>, 2>(&[0.0; 6], [3, 2], device);
            let w = || floats::<Liger<B>, 2>(&[0.0; 12], [4, 3], device);
            let msg = panic_message(|| {
                Liger::<B>::fused_matmul_backward(prim(a()), prim(w()), prim(g()));
            });
            assert_mentions(
                label,
                &msg,
                &["matmul_backward", "[3, 4]", "[4, 3]", "[3, 2]", "F32"],
            );
        }
    }
    for_each_backend(&mut V);
}

/// The comparison rejects wrong results: zeros, twice the product, a dropped last row
/// (left at zero), and a transposed gradient.
#[test]
fn comparison_rejects_wrong_results() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let c = case("square", [2, 9, 9], Plain, [2, 9, 7], Plain);
        let inputs = Inputs::new(&c, dtype, &mut rng);
        let (y, gl, _) = reference(&inputs.lhs_host, &inputs.rhs_host, &inputs.g_host);
        let rounded = |e: &Expected| round_to(e.value.iter().map(|&v| v as f32).collect(), dtype);
        let as_f64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
        // The correctly rounded results pass.
        y.check(&as_f64(rounded(&y)), dtype)
            .unwrap_or_else(|e| panic!("seed {seed} {dtype:?}: a correct y was rejected: {e}"));
        gl.check(&as_f64(rounded(&gl)), dtype).unwrap_or_else(|e| {
            panic!("seed {seed} {dtype:?}: a correct gradient was rejected: {e}")
        });

        let n = y.shape[2];
        let zeros = vec![0.0; y.value.len()];
        let doubled: Vec<f64> = y.value.iter().map(|v| 2.0 * v).collect();
        let mut dropped_row = as_f64(rounded(&y));
        let last_row = dropped_row.len() / 2 - n..dropped_row.len() / 2; // last row of batch 0
        dropped_row[last_row].fill(0.0);
        let transposed = Host {
            shape: gl.shape.clone(),
            data: as_f64(rounded(&gl)),
        }
        .swapped(1, 2)
        .data;
        for (what, e, wrong) in [
            ("zeros", &y, zeros),
            ("2x", &y, doubled),
            ("dropped last row", &y, dropped_row),
            ("transposed gradient", &gl, transposed),
        ] {
            assert!(
                e.check(&wrong, dtype).is_err(),
                "seed {seed} {dtype:?}: the comparison accepted {what}"
            );
        }
    }
}
