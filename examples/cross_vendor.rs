//! # One fused op, every backend of this build
//!
//! Runs the same two fused ops, forward and backward, on every backend compiled in
//! (CUDA, ROCm, wgpu on its default adapter, wgpu on the CPU adapter, i.e. Mesa's
//! lavapipe, and NdArray) and compares them:
//!
//! - RMSNorm (`liger_burn::functional::rms_norm`, Llama casting) of `x: [512, 1024]`, then
//!   `sum(y · g)` for a fixed upstream gradient `g`: outputs `y`, `dx`, `dw`;
//! - cross entropy (`liger_burn::functional::cross_entropy`, mean over the rows that are not
//!   `ignore_index`) of `logits: [256, 8192]`, every 7th target ignored: outputs the loss
//!   and `dlogits`.
//!
//! The inputs are the same f32 numbers everywhere. Each backend's outputs are compared,
//! as the largest absolute difference, with an f64 reference (the textbook formulas in
//! stock Burn ops on NdArray, every tensor f64, autodiff for the gradients; no liger-burn
//! code) and with each other. Each op is timed, forward + backward until the device is
//! idle: `first` includes compiling the kernels, `steady` is the median of the next five
//! runs. A backend whose device does not open here is skipped with the reason; the others
//! still run. The `ndarray` row is liger-burn's fallback (its exact composition of stock
//! ops, in f32), the others are the CubeCL kernels.
//!
//! ```sh
//! cargo run -p liger-examples --example cross_vendor
//! cargo run -p liger-examples --example cross_vendor --features cuda   # + CUDA
//! cargo run -p liger-examples --example cross_vendor --features rocm   # + ROCm
//! ```
//!
//! (`--release` makes the host side faster; the kernels are the same.) On a machine
//! without a GPU, `wgpu` (the default adapter) is lavapipe too, so its rows repeat
//! `wgpu-cpu`'s.

// Shared with the other examples, each of which uses part of it.
#[allow(dead_code)]
mod devices;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use devices::{Job, Target};
use liger_burn::functional::{cross_entropy, rms_norm};
use liger_burn::ops::{CrossEntropyOptions, FusedOps, RmsNormOptions};
use liger_train::rng::SplitMix64;
use std::time::Instant;

const NORM_ROWS: usize = 512;
const HIDDEN: usize = 1024;
const RMS_EPS: f64 = 1e-6;
const CE_ROWS: usize = 256;
const VOCAB: usize = 8192;
/// Every this many rows, the target is `ignore_index`.
const IGNORED_EVERY: usize = 7;
/// Timed runs after the first one (which compiles the kernels).
const STEADY_RUNS: usize = 5;
/// The names of the compared outputs, in [`Measured::outputs`] order.
const OUTPUT_NAMES: [&str; 5] = ["rms y", "rms dx", "rms dw", "ce loss", "ce dlogits"];

/// The inputs every backend gets (f32 values; the reference reads them as f64).
struct Inputs {
    x: Vec<f32>,
    weight: Vec<f32>,
    grad_y: Vec<f32>,
    logits: Vec<f32>,
    targets: Vec<i64>,
}

impl Inputs {
    fn new(seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut normal = |n: usize, scale: f64, shift: f64| -> Vec<f32> {
            (0..n)
                .map(|_| (shift + scale * rng.normal()) as f32)
                .collect()
        };
        let x = normal(NORM_ROWS * HIDDEN, 1.0, 0.0);
        let weight = normal(HIDDEN, 0.1, 1.0);
        let grad_y = normal(NORM_ROWS * HIDDEN, 1.0, 0.0);
        let logits = normal(CE_ROWS * VOCAB, 2.0, 0.0);
        let targets = (0..CE_ROWS)
            .map(|row| {
                if row % IGNORED_EVERY == 0 {
                    CrossEntropyOptions::default().ignore_index
                } else {
                    rng.below(VOCAB as u64) as i64
                }
            })
            .collect();
        Inputs {
            x,
            weight,
            grad_y,
            logits,
            targets,
        }
    }
}

/// Wall time of an op, forward and backward, until the device is idle.
#[derive(Clone, Copy)]
struct Timing {
    first_ms: f64,
    steady_ms: f64,
}

/// One backend's results.
struct Measured {
    /// Burn's name of the backend.
    backend: String,
    rms_norm: Timing,
    cross_entropy: Timing,
    /// The outputs, as f64, in [`OUTPUT_NAMES`] order.
    outputs: Vec<Vec<f64>>,
}

/// Runs `step` once (compiling its kernels) and [`STEADY_RUNS`] more times, each until the
/// device is idle. The outputs are kept until the sync: a lazy (fusion) backend would
/// otherwise skip work whose results are dropped. Returns the timing and the last outputs.
fn timed<B: Backend, T>(device: &B::Device, mut step: impl FnMut() -> T) -> (Timing, T) {
    let mut run = || {
        let start = Instant::now();
        let out = step();
        B::sync(device).expect("the device finishes its work");
        (start.elapsed().as_secs_f64() * 1e3, out)
    };
    let (first_ms, _) = run();
    let mut steady = Vec::with_capacity(STEADY_RUNS);
    let mut last = None;
    for _ in 0..STEADY_RUNS {
        let (ms, out) = run();
        steady.push(ms);
        last = Some(out);
    }
    steady.sort_by(f64::total_cmp);
    let timing = Timing {
        first_ms,
        steady_ms: steady[STEADY_RUNS / 2],
    };
    (timing, last.expect("STEADY_RUNS > 0"))
}

fn to_f64<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

/// `values` as a tensor of `dtype` on `device`.
fn float_tensor<B: Backend, const D: usize>(
    values: &[f32],
    shape: [usize; D],
    device: &B::Device,
    dtype: DType,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values.to_vec(), shape), (device, dtype))
}

/// Both ops on backend `B` (autodiff on top), in f32.
fn measure<B: FusedOps>(inputs: &Inputs, device: &B::Device) -> Measured {
    type A<B> = Autodiff<B>;
    let dtype = DType::F32;
    let x = float_tensor::<A<B>, 2>(&inputs.x, [NORM_ROWS, HIDDEN], device, dtype).require_grad();
    let weight = float_tensor::<A<B>, 1>(&inputs.weight, [HIDDEN], device, dtype).require_grad();
    let grad_y = float_tensor::<A<B>, 2>(&inputs.grad_y, [NORM_ROWS, HIDDEN], device, dtype);
    let (rms_timing, (y, dx, dw)) = timed::<B, _>(device, || {
        let y = rms_norm(x.clone(), weight.clone(), RmsNormOptions::llama(RMS_EPS));
        let grads = (y.clone() * grad_y.clone()).sum().backward();
        (
            y.inner(),
            x.grad(&grads).expect("x has a gradient"),
            weight.grad(&grads).expect("the weight has a gradient"),
        )
    });

    let logits =
        float_tensor::<A<B>, 2>(&inputs.logits, [CE_ROWS, VOCAB], device, dtype).require_grad();
    let targets = Tensor::<A<B>, 1, Int>::from_data(
        TensorData::new(inputs.targets.clone(), [CE_ROWS]),
        device,
    );
    let (ce_timing, (loss, dlogits)) = timed::<B, _>(device, || {
        let out = cross_entropy(
            logits.clone(),
            targets.clone(),
            None,
            CrossEntropyOptions::default(),
        );
        let grads = out.loss.clone().backward();
        (
            out.loss.inner(),
            logits.grad(&grads).expect("the logits have a gradient"),
        )
    });

    Measured {
        backend: B::name(device),
        rms_norm: rms_timing,
        cross_entropy: ce_timing,
        outputs: vec![
            to_f64(y),
            to_f64(dx),
            to_f64(dw),
            to_f64(loss),
            to_f64(dlogits),
        ],
    }
}

/// The outputs in f64 from stock Burn ops (autodiff on NdArray, every tensor f64): the
/// textbook formulas, no liger-burn code, so the kernels and liger-burn's own composition
/// are both checked against it.
///
/// (NdArray rather than `NdArray<f64>`: Burn 0.21 keeps one default float dtype per device,
/// shared by `NdArray<f32>` and `NdArray<f64>`, so the f64 tensors are asked for by dtype.)
#[cfg(feature = "ndarray")]
fn reference_f64(inputs: &Inputs) -> Vec<Vec<f64>> {
    use burn::tensor::activation::log_softmax;
    type R = Autodiff<burn::backend::NdArray>;
    let device = Default::default();
    let f64_tensor = |values: &[f32], shape: [usize; 2]| {
        float_tensor::<R, 2>(values, shape, &device, DType::F64)
    };

    // y = x / sqrt(mean(x²) + eps) · w
    let x = f64_tensor(&inputs.x, [NORM_ROWS, HIDDEN]).require_grad();
    let weight = f64_tensor(&inputs.weight, [1, HIDDEN]).require_grad();
    let mean_square = x.clone().powi_scalar(2).mean_dim(1);
    let y = x.clone() / (mean_square + RMS_EPS).sqrt() * weight.clone();
    let grads = (y.clone() * f64_tensor(&inputs.grad_y, [NORM_ROWS, HIDDEN]))
        .sum()
        .backward();
    let dx = x.grad(&grads).expect("x has a gradient");
    let dw = weight.grad(&grads).expect("the weight has a gradient");

    // loss = mean over kept rows of -log_softmax(logits)[target]
    let ignore_index = CrossEntropyOptions::default().ignore_index;
    let kept: Vec<f32> = inputs
        .targets
        .iter()
        .map(|&t| (t != ignore_index) as u8 as f32)
        .collect();
    let kept_rows = kept.iter().sum::<f32>() as f64;
    let safe_targets: Vec<i64> = inputs.targets.iter().map(|&t| t.max(0)).collect();
    let logits = f64_tensor(&inputs.logits, [CE_ROWS, VOCAB]).require_grad();
    let picked = log_softmax(logits.clone(), 1).gather(
        1,
        Tensor::<R, 2, Int>::from_data(TensorData::new(safe_targets, [CE_ROWS, 1]), &device),
    );
    let loss = -(picked * f64_tensor(&kept, [CE_ROWS, 1])).sum() / kept_rows;
    let grads = loss.backward();
    let dlogits = logits.grad(&grads).expect("the logits have a gradient");

    vec![
        to_f64(y.inner()),
        to_f64(dx),
        to_f64(dw),
        to_f64(loss.inner()),
        to_f64(dlogits),
    ]
}

struct MeasureF32<'a> {
    inputs: &'a Inputs,
}

impl Job for MeasureF32<'_> {
    type Output = Measured;

    fn run<B: FusedOps>(&mut self, target: Target, device: B::Device) -> Measured {
        println!("running:  {} ...", target.name());
        measure::<B>(self.inputs, &device)
    }
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared outputs have the same size");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn main() {
    println!(
        "rms_norm: x [{NORM_ROWS}, {HIDDEN}] f32, forward + backward (y, dx, dw)\n\
         cross_entropy: logits [{CE_ROWS}, {VOCAB}] f32, every {IGNORED_EVERY}th target \
         ignored, mean, forward + backward (loss, dlogits)\n"
    );
    let inputs = Inputs::new(2024);

    #[cfg(feature = "ndarray")]
    let reference = Some(reference_f64(&inputs));
    #[cfg(not(feature = "ndarray"))]
    let reference: Option<Vec<Vec<f64>>> = {
        println!("no f64 reference: build with the `ndarray` feature");
        None
    };

    let mut job = MeasureF32 { inputs: &inputs };
    let mut rows: Vec<(String, Measured)> = Vec::new();
    for target in Target::compiled() {
        match devices::run_on(target, &mut job) {
            Ok(measured) => rows.push((target.name().to_string(), measured)),
            Err(why) => println!("skipped:  {why}"),
        }
    }
    println!();
    if rows.is_empty() {
        println!("no backend of this build opened here");
        std::process::exit(1);
    }

    println!(
        "time per call, forward + backward (first: with kernel compilation; steady: median of {STEADY_RUNS})"
    );
    println!(
        "{:<12} {:<36} {:>14} {:>14} {:>14} {:>14}",
        "backend", "Burn backend", "rms first ms", "rms steady ms", "ce first ms", "ce steady ms"
    );
    for (name, m) in &rows {
        println!(
            "{:<12} {:<36} {:>14.2} {:>14.2} {:>14.2} {:>14.2}",
            name,
            m.backend,
            m.rms_norm.first_ms,
            m.rms_norm.steady_ms,
            m.cross_entropy.first_ms,
            m.cross_entropy.steady_ms
        );
    }

    if let Some(reference) = &reference {
        println!("\nmax |difference| from the f64 reference");
        print!("{:<12}", "backend");
        for name in OUTPUT_NAMES {
            print!(" {name:>11}");
        }
        println!();
        for (name, m) in &rows {
            print!("{name:<12}");
            for (ours, exact) in m.outputs.iter().zip(reference) {
                print!(" {:>11.2e}", max_abs_diff(ours, exact));
            }
            println!();
        }
        // The scale of each output, to read the differences against.
        print!("{:<12}", "(max |ref|)");
        for exact in reference {
            print!(
                " {:>11.2e}",
                exact.iter().fold(0.0f64, |m, v| m.max(v.abs()))
            );
        }
        println!();
    }

    println!("\nmax |difference| between backends (largest over the five outputs)");
    print!("{:<12}", "");
    for (name, _) in &rows {
        print!(" {name:>11}");
    }
    println!();
    for (name_a, a) in &rows {
        print!("{name_a:<12}");
        for (_, b) in &rows {
            let diff = a
                .outputs
                .iter()
                .zip(&b.outputs)
                .map(|(x, y)| max_abs_diff(x, y))
                .fold(0.0, f64::max);
            print!(" {diff:>11.2e}");
        }
        println!();
    }
}
