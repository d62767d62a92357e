//! adamw_step: the fused AdamW step (`FusedOps::fused_adamw_step`) against an f64
//! reference of Burn's AdamW, step after step, on every backend of the test device and
//! every dtype it has (parameter, gradient, moments and the low-precision copy each in its
//! own), with weight decay off, decoupled and cautious, with and without AMSGrad, in place
//! and out of place, at the default geometry and at one that grid-strides and splits the
//! buffer into several launches. The bounds are derived from f32 rounding, per element,
//! and the comparison is shown to reject wrong updates (no bias correction, weight decay
//! folded into the gradient, zeros). Bad input panics naming the op, the shapes and dtypes.
//!
//! Random inputs are fresh each run (`LIGER_SEED` reruns one; failures name it).

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, ops::FloatTensor};
use liger_burn::ops::{AdamWMoments, AdamWStepOptions, FusedOps};
use liger_burn::test_hooks::override_launch_config;
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_cubecl_kernels::{ElementwiseConfig, LaunchConfig};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::values;
use liger_tests::{BackendVisitor, current_geometry, dtypes, for_each_backend};
use liger_verify::conformance::Rng;

/// Unit roundoff: half an ulp relative to the value.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

/// Smallest normal value: the most a device that flushes subnormals to zero moves one.
fn smallest_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-14),
        _ => 2f64.powi(-126),
    }
}

/// f32 unit roundoff, and the error allowed for one division or square root (Vulkan
/// allows 2.5 ulp for a division; CUDA's are correctly rounded).
const U: f64 = 1.0 / (1u64 << 24) as f64;
const U_DIV: f64 = 3.0 * U;

/// A deliberate error in the reference, to show the comparison rejects it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mutation {
    None,
    /// `m / √v` without `1 - βᵗ`.
    NoBiasCorrection,
    /// L2 regularization (Adam with `g + wd·p`) instead of decoupled decay.
    CoupledWeightDecay,
    /// Every output zero.
    Zeros,
}

/// One output of the reference: exact values and per-element bounds of the f32
/// computation's error (before the output's own rounding).
#[derive(Clone, Default)]
struct Expected {
    value: Vec<f64>,
    error: Vec<f64>,
}

impl Expected {
    fn push(&mut self, value: f64, error: f64) {
        self.value.push(value);
        self.error.push(error);
    }

    /// Worst `|actual - value| / bound` over the elements, the bound adding the rounding
    /// to `dtype`, and where it is.
    fn worst(&self, actual: &[f64], dtype: DType) -> (f64, usize) {
        assert_eq!(actual.len(), self.value.len());
        let u = unit_roundoff(dtype);
        let mut worst = (0.0, 0);
        for (i, (&a, (&v, &e))) in actual
            .iter()
            .zip(self.value.iter().zip(&self.error))
            .enumerate()
        {
            // Twice the first-order f32 bound (second-order terms, contracted multiply-adds),
            // then the output's rounding, and a flushed subnormal.
            let bound = 2.0 * e * (1.0 + u) + u * v.abs() + smallest_normal(dtype);
            let ratio = if a.is_finite() {
                (a - v).abs() / bound
            } else {
                f64::INFINITY
            };
            if ratio > worst.0 {
                worst = (ratio, i);
            }
        }
        worst
    }
}

/// The reference's outputs.
struct Reference {
    param: Expected,
    moment_1: Expected,
    moment_2: Expected,
    max_moment_2: Option<Expected>,
}

/// Burn's AdamW in f64 from the stored inputs (`state`: `m`, `v`, `v̂max`), with Burn's f32
/// scalars, and first-order bounds of an f32 evaluation's error.
fn reference(
    p: &[f64],
    g: &[f64],
    state: Option<(&[f64], &[f64], Option<&[f64]>)>,
    o: &AdamWStepOptions,
    mutation: Mutation,
) -> Reference {
    let b1 = o.beta_1 as f64;
    let b2 = o.beta_2 as f64;
    let f1 = (1.0f32 - o.beta_1) as f64;
    let f2 = (1.0f32 - o.beta_2) as f64;
    let t = o.time as i32;
    let (bc1, bc2) = match mutation {
        Mutation::NoBiasCorrection => (1.0, 1.0),
        _ => (
            (1.0f32 - o.beta_1.powi(t)) as f64,
            (1.0f32 - o.beta_2.powi(t)) as f64,
        ),
    };
    let eps = o.epsilon as f64;
    let lr = o.lr as f32 as f64;
    let wd = o.weight_decay as f64;
    let rate = (o.lr * wd) as f32 as f64;
    let factor = (1.0 - o.lr * wd) as f32 as f64;
    let mut out = Reference {
        param: Expected::default(),
        moment_1: Expected::default(),
        moment_2: Expected::default(),
        max_moment_2: o.amsgrad.then(Expected::default),
    };
    for i in 0..p.len() {
        let (p0, mut gi) = (p[i], g[i]);
        if mutation == Mutation::CoupledWeightDecay {
            gi += wd * p0;
        }
        let (m0, v0) = state.map_or((0.0, 0.0), |(m, v, _)| (m[i], v[i]));
        let m = b1 * m0 + f1 * gi;
        let v = b2 * v0 + f2 * gi * gi;
        let em = 3.0 * U * ((b1 * m0).abs() + (f1 * gi).abs());
        let ev = 4.0 * U * ((b2 * v0).abs() + f2 * gi * gi);
        let (v_used, ev_used) = match (o.amsgrad, state.and_then(|s| s.2)) {
            (true, Some(x)) if x[i] > v => (x[i], 0.0),
            _ => (v, ev),
        };
        let m_hat = m / bc1;
        let v_hat = v_used / bc2;
        let e_m_hat = em / bc1 + U_DIV * m_hat.abs();
        let e_v_hat = ev_used / bc2 + U_DIV * v_hat;
        let s = v_hat.sqrt();
        let e_s = if s > 0.0 {
            (e_v_hat / (2.0 * s)).min(e_v_hat.sqrt())
        } else {
            e_v_hat.sqrt()
        } + U_DIV * s;
        let den = s + eps;
        let e_den = e_s + U * den;
        let delta = m_hat / den;
        let e_delta = e_m_hat / den + m_hat.abs() * e_den / (den * den) + U_DIV * delta.abs();
        let (decayed, e_decay) = if o.cautious_weight_decay && wd != 0.0 {
            let differ = (p0 >= 0.0) != (m >= 0.0);
            let decayed = if differ { p0 } else { p0 - p0 * rate };
            // A moment within its error of zero may take either sign.
            let flip = if m.abs() <= em {
                (p0 * rate).abs()
            } else {
                0.0
            };
            (decayed, 2.0 * U * p0.abs() + flip)
        } else if mutation == Mutation::CoupledWeightDecay {
            (p0, 0.0)
        } else {
            (p0 * factor, U * (p0 * factor).abs())
        };
        let updated = decayed - lr * delta;
        let e_p = e_decay + lr * e_delta + U * lr * delta.abs() + U * updated.abs();
        let zero = mutation == Mutation::Zeros;
        let pick = |x: f64| if zero { 0.0 } else { x };
        out.param.push(pick(updated), e_p);
        out.moment_1.push(pick(m), em);
        out.moment_2.push(pick(v), ev);
        if let Some(x) = &mut out.max_moment_2 {
            x.push(pick(v_used), ev_used);
        }
    }
    out
}

type Prim<B> = FloatTensor<B>;

fn upload<B: FusedOps>(v: &[f32], shape: [usize; 2], dtype: DType, device: &B::Device) -> Prim<B> {
    Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), shape), device)
        .cast(dtype)
        .into_primitive()
        .tensor()
}

fn read<B: FusedOps>(t: Prim<B>) -> Vec<f64> {
    values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)))
}

/// What one case varies.
#[derive(Clone, Copy, Debug)]
struct Flags {
    weight_decay: f32,
    cautious: bool,
    amsgrad: bool,
    /// Moments in the parameter's dtype instead of f32.
    pure: bool,
    /// The gradient in another dtype than the parameter, and a copy of the update.
    mixed: bool,
}

/// The cases every backend and dtype runs: each flag on at least once.
const CASES: [Flags; 6] = [
    Flags {
        weight_decay: 0.0,
        cautious: false,
        amsgrad: false,
        pure: false,
        mixed: false,
    },
    Flags {
        weight_decay: 0.05,
        cautious: false,
        amsgrad: false,
        pure: false,
        mixed: false,
    },
    Flags {
        weight_decay: 0.05,
        cautious: true,
        amsgrad: false,
        pure: false,
        mixed: false,
    },
    Flags {
        weight_decay: 0.05,
        cautious: false,
        amsgrad: true,
        pure: false,
        mixed: true,
    },
    Flags {
        weight_decay: 0.0,
        cautious: false,
        amsgrad: false,
        pure: true,
        mixed: false,
    },
    Flags {
        weight_decay: 0.05,
        cautious: true,
        amsgrad: true,
        pure: true,
        mixed: true,
    },
];

/// Shapes: odd lengths (scalar loads), multiples of 4 (vector loads), one element.
const SHAPES: [[usize; 2]; 6] = [[1, 1], [1, 7], [3, 35], [4, 1025], [1, 4099], [33, 65]];

/// A geometry that grid-strides (two cubes, in a two-dimensional grid of one cube a
/// row), walks three vectors per unit and covers the buffer in several launches.
fn stress_geometry() -> LaunchConfig {
    LaunchConfig {
        optimizer: ElementwiseConfig {
            units: 32,
            vectors_per_unit: 3,
            max_cubes: Some(2),
            vectors_per_launch: Some(8),
            max_cubes_x: Some(1),
            ..LaunchConfig::default().optimizer
        },
        ..current_geometry()
    }
}

/// Random gradients: magnitudes in [1/4, 2] (moments stay normal numbers even in f16),
/// random signs.
fn gradient(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let magnitude = 0.25 + 1.75 * rng.uniform();
            if rng.below(2) == 0 {
                magnitude as f32
            } else {
                -magnitude as f32
            }
        })
        .collect()
}

/// The outputs of a run of steps, and what the reference made of them.
struct CaseReport {
    /// Worst ratio to the bound, and which tensor and step.
    worst: (f64, String),
    /// Whether every mutated reference was rejected at every step.
    mutations_rejected: bool,
}

/// Runs `steps` fused steps of one case, comparing every step with the reference (fed
/// the stored state of the step before). `check_mutations`: also compare with each
/// mutated reference and record whether all were rejected.
#[allow(clippy::too_many_arguments)]
fn run_case<B: FusedOps>(
    label: &str,
    device: &B::Device,
    rng: &mut Rng,
    shape: [usize; 2],
    dtype: DType,
    grad_dtype: DType,
    flags: Flags,
    lr: f64,
    steps: usize,
    check_mutations: bool,
) -> CaseReport {
    let n = shape[0] * shape[1];
    let fused = !label.starts_with("ndarray");
    let state_dtype = if flags.pure { dtype } else { DType::F32 };
    let copy_dtype = flags.mixed.then_some(grad_dtype);
    let mut param = upload::<B>(&rng.vec(n, -1.0, 1.0, 0.0), shape, dtype, device);
    let mut moments: Option<AdamWMoments<B>> = None;
    let mut worst = (0.0f64, String::new());
    let mut mutations_rejected = true;
    for time in 1..=steps {
        let grad = upload::<B>(&gradient(rng, n), shape, grad_dtype, device);
        let options = AdamWStepOptions {
            lr,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: flags.weight_decay,
            cautious_weight_decay: flags.cautious,
            amsgrad: flags.amsgrad,
            time,
            state_dtype,
            copy_dtype,
        };
        // The stored inputs, read through clones dropped before the step (so the step may
        // update in place).
        let p0 = read::<B>(param.clone());
        let g0 = read::<B>(grad.clone());
        let state0 = moments.as_ref().map(|m| {
            (
                read::<B>(m.moment_1.clone()),
                read::<B>(m.moment_2.clone()),
                m.max_moment_2.clone().map(read::<B>),
            )
        });
        // Every other step a caller keeps handles on the parameter and the moments: the
        // step must then write fresh buffers and leave those untouched.
        let held = (time % 2 == 0).then(|| (param.clone(), moments.clone()));
        let launches = [
            counters::get(Kernel::adamw_step),
            counters::get(Kernel::adamw_step_in_place),
        ];
        let out = B::fused_adamw_step(param, grad, moments, options);
        let step = format!("{label} {dtype:?} grad {grad_dtype:?} {shape:?} {flags:?} step {time}");
        let actual_param = read::<B>(out.param.clone());
        let actual_m = read::<B>(out.moments.moment_1.clone());
        let actual_v = read::<B>(out.moments.moment_2.clone());
        let actual_x = out.moments.max_moment_2.clone().map(read::<B>);
        if fused {
            // One launch: in place unless the caller held the buffers.
            let in_place = u64::from(held.is_none());
            assert_eq!(
                [
                    counters::get(Kernel::adamw_step),
                    counters::get(Kernel::adamw_step_in_place),
                ],
                [launches[0] + 1 - in_place, launches[1] + in_place],
                "{step}: [out-of-place, in-place] launches"
            );
        }
        if let Some((held_param, held_moments)) = held {
            assert_eq!(
                read::<B>(held_param),
                p0,
                "{step}: a held parameter changed"
            );
            if let (Some(m), Some((m0, v0, _))) = (held_moments, &state0) {
                assert_eq!(&read::<B>(m.moment_1), m0, "{step}: a held moment changed");
                assert_eq!(&read::<B>(m.moment_2), v0, "{step}: a held moment changed");
            }
        }
        let state_ref = state0
            .as_ref()
            .map(|(m, v, x)| (m.as_slice(), v.as_slice(), x.as_deref()));
        let expected = reference(&p0, &g0, state_ref, &options, Mutation::None);
        let mut outputs = vec![
            ("param", &expected.param, &actual_param, dtype),
            ("moment_1", &expected.moment_1, &actual_m, state_dtype),
            ("moment_2", &expected.moment_2, &actual_v, state_dtype),
        ];
        if let (Some(e), Some(a)) = (&expected.max_moment_2, &actual_x) {
            outputs.push(("max_moment_2", e, a, state_dtype));
        }
        assert_eq!(actual_x.is_some(), flags.amsgrad, "{step}: max_moment_2");
        for (name, e, a, out_dtype) in &outputs {
            let (ratio, i) = e.worst(a, *out_dtype);
            assert!(
                ratio <= 1.0,
                "{step}: {name}[{i}] = {} but the reference is {} ± {:.3e} (f32 error bound; \
                 {ratio:.2}x the bound)",
                a[i],
                e.value[i],
                e.error[i]
            );
            if ratio > worst.0 {
                worst = (ratio, format!("{name} ({step})"));
            }
        }
        // The copy is the update rounded once to its dtype: exactly the f32 parameter
        // rounded, or within its own rounding of the reference.
        match (copy_dtype, out.param_copy) {
            (Some(copy_dtype), Some(copy)) => {
                let copy = read::<B>(copy);
                if dtype == DType::F32 {
                    let rounded =
                        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out.param.clone()))
                            .cast(copy_dtype);
                    assert_eq!(
                        copy,
                        values(rounded),
                        "{step}: the copy is not the parameter rounded to {copy_dtype:?}"
                    );
                }
                let (ratio, i) = expected.param.worst(&copy, copy_dtype);
                assert!(
                    ratio <= 1.0,
                    "{step}: copy[{i}] = {} but the reference is {} ({ratio:.2}x the bound)",
                    copy[i],
                    expected.param.value[i]
                );
            }
            (None, None) => {}
            (want, got) => panic!("{step}: copy asked {want:?}, returned {}", got.is_some()),
        }
        if check_mutations {
            for mutation in [
                Mutation::NoBiasCorrection,
                Mutation::CoupledWeightDecay,
                Mutation::Zeros,
            ] {
                let wrong = reference(&p0, &g0, state_ref, &options, mutation);
                let (ratio, _) = wrong.param.worst(&actual_param, dtype);
                if ratio <= 1.0 {
                    eprintln!("{step}: the comparison accepted {mutation:?}");
                    mutations_rejected = false;
                }
            }
        }
        param = out.param;
        moments = Some(out.moments);
    }
    CaseReport {
        worst,
        mutations_rejected,
    }
}

struct AgainstReference {
    rng: Rng,
    cases: usize,
}

impl BackendVisitor for AgainstReference {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let device_dtypes = dtypes::<B>(device);
        let mut worst = (0.0f64, String::new());
        for (geometry, config) in [
            ("default geometry", current_geometry()),
            ("stress geometry", stress_geometry()),
        ] {
            let _geometry = override_launch_config(config);
            for &dtype in &device_dtypes {
                for (k, flags) in CASES.iter().enumerate() {
                    let shape = SHAPES[(k + self.rng.below(SHAPES.len())) % SHAPES.len()];
                    // Mixed: a gradient (and copy) of another dtype than the parameter, an f32
                    // master with a low-precision gradient where the device has one.
                    let grad_dtype = if flags.mixed {
                        let others: Vec<DType> = device_dtypes
                            .iter()
                            .copied()
                            .filter(|d| *d != dtype)
                            .collect();
                        others
                            .get(self.rng.below(others.len().max(1)))
                            .copied()
                            .unwrap_or(dtype)
                    } else {
                        dtype
                    };
                    let report = run_case::<B>(
                        &format!("{label} {geometry}"),
                        device,
                        &mut self.rng,
                        shape,
                        dtype,
                        grad_dtype,
                        *flags,
                        1e-2,
                        3,
                        false,
                    );
                    self.cases += 1;
                    if report.worst.0 > worst.0 {
                        worst = report.worst;
                    }
                }
            }
        }
        eprintln!(
            "{label}: worst error {:.3} of the bound, {}",
            worst.0, worst.1
        );
    }
}

#[test]
fn adamw_step_matches_the_f64_reference() {
    let mut v = AgainstReference {
        rng: liger_tests::fresh_rng(),
        cases: 0,
    };
    let seed = v.rng.seed();
    eprintln!("seed {seed} (rerun with LIGER_SEED={seed})");
    for_each_backend(&mut v);
    assert!(v.cases > 0);
}

/// The bounds are tight enough to see a wrong update: references without bias correction,
/// with the weight decay folded into the gradient, or all zeros are each rejected on f32.
#[test]
fn the_comparison_rejects_wrong_updates() {
    struct Rejects {
        rng: Rng,
    }
    impl BackendVisitor for Rejects {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let flags = Flags {
                weight_decay: 0.1,
                ..CASES[0]
            };
            let report = run_case::<B>(
                label,
                device,
                &mut self.rng,
                [5, 41],
                DType::F32,
                DType::F32,
                flags,
                1e-2,
                3,
                true,
            );
            assert!(
                report.mutations_rejected,
                "{label} (seed {}): a wrong reference passed the comparison",
                self.rng.seed()
            );
        }
    }
    for_each_backend(&mut Rejects {
        rng: liger_tests::fresh_rng(),
    });
}

/// Bad input is refused where it enters, the optimizer's step (`fused_adamw_step` itself
/// assumes valid input): a gradient or a stored moment of another shape. The states the
/// optimizer never builds (AMSGrad without the running maximum, step 0) are refused by the
/// same check, shown on shapes and dtypes.
#[test]
fn adamw_step_rejects_bad_input() {
    struct Bad;
    impl BackendVisitor for Bad {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            use burn::optim::{AdaptiveMomentumState, SimpleOptimizer};
            use liger_burn::optim::{AdamWConfig, AdamWState};
            let t = |shape: [usize; 2]| {
                Tensor::<B, 2>::from_data(
                    TensorData::new(vec![0.5f32; shape[0] * shape[1]], shape),
                    device,
                )
            };
            let optim = AdamWConfig::new().build();
            let msg = panic_message(|| {
                optim.step(1e-3, t([3, 4]), t([4, 3]), None);
            });
            assert_mentions(label, &msg, &["adamw_step", "grad", "[4, 3]", "[3, 4]"]);
            let state = AdamWState {
                momentum: AdaptiveMomentumState {
                    time: 1,
                    moment_1: t([3, 4]),
                    moment_2: t([3, 5]),
                    max_moment_2: None,
                },
                master: None,
            };
            let msg = panic_message(|| {
                optim.step(1e-3, t([3, 4]), t([3, 4]), Some(state));
            });
            assert_mentions(label, &msg, &["adamw_step", "moment_2", "[3, 5]"]);
        }
    }
    for_each_backend(&mut Bad);
    use burn::tensor::Shape;
    use liger_burn::ops::validate::{AdamWInputs, adamw_step};
    let meta = || (Shape::new([3, 4]), DType::F32);
    let options = AdamWStepOptions::new(1e-3, 2);
    let amsgrad = AdamWStepOptions {
        amsgrad: true,
        ..options
    };
    let err = adamw_step(&AdamWInputs {
        param: meta(),
        grad: meta(),
        moments: Some([Some(meta()), Some(meta()), None]),
        options: &amsgrad,
        kernel_dtypes: false,
    })
    .unwrap_err();
    assert_mentions(
        "amsgrad",
        &err.0,
        &["adamw_step", "max_moment_2", "AMSGrad"],
    );
    let first = AdamWStepOptions { time: 0, ..options };
    let err = adamw_step(&AdamWInputs {
        param: meta(),
        grad: meta(),
        moments: None,
        options: &first,
        kernel_dtypes: false,
    })
    .unwrap_err();
    assert_mentions("time", &err.0, &["adamw_step", "time", "from 1"]);
}
