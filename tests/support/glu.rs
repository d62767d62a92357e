//! Shared checks of the elementwise ops (SwiGLU, GeGLU, GELU, sigmoid): forced launch
//! limits, bad input, partial gradient tracking, any rank.

use crate::errors::{assert_mentions, panic_message, quiet_panic};
use crate::{BackendVisitor, dtypes, for_each_backend, tensors};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::functional;
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::override_launch_config;
use liger_verify::conformance::{Expected, Op, Rng, bounds, run_case};

/// `op`'s conformance at a few shapes under two sets of elementwise launch limits, the
/// paths only large tensors take with the default limits:
/// - one cube (which then grid-strides over every block of a launch), launches split
///   every 4096 vectors over offset handles;
/// - three cubes a grid row, so a launch's blocks take a two-dimensional grid, some with
///   a spare cube.
///
/// The shapes have tails, several blocks per launch and a partial last launch. The limits
/// hold on this test's thread only.
pub fn check_op_with_elementwise_limits(op: Op) {
    struct Run(Op, Rng, Vec<String>);
    impl BackendVisitor for Run {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            for dtype in dtypes::<B>(device) {
                for (rows, width) in [(1, 7), (37, 100), (4, 4097), (300, 64)] {
                    let result = run_case::<B>(self.0, rows, width, dtype, device, &mut self.1);
                    for c in result.comparisons.iter().filter(|c| !c.passed) {
                        self.2.push(format!(
                            "{label} {dtype:?} [{rows}, {width}] {}: max abs {:.3e}",
                            c.tensor, c.max_abs
                        ));
                    }
                }
            }
        }
    }
    let mut strided = crate::current_geometry();
    strided.elementwise.max_cubes = Some(1);
    strided.elementwise.vectors_per_launch = Some(4096);
    let mut two_dimensional = crate::current_geometry();
    two_dimensional.elementwise.max_cubes = None;
    two_dimensional.elementwise.max_cubes_x = Some(3);
    let mut run = Run(op, crate::fresh_rng(), Vec::new());
    let seed = run.1.seed();
    for geometry in [strided, two_dimensional] {
        let _geometry = override_launch_config(geometry);
        for_each_backend(&mut run);
    }
    assert!(
        run.2.is_empty(),
        "{} under launch limits failed (seed {seed}):\n{}",
        op.name(),
        run.2.join("\n")
    );
}

fn filled<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(vec![0.5f32; n], shape), device)
}

fn glu_of<B: FusedOps, const D: usize>(
    op: Op,
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    match op {
        Op::SwiGlu => functional::swiglu(gate, up),
        Op::GeGlu => functional::geglu(gate, up),
        other => panic!("{other:?} is not a gated unit"),
    }
}

/// Bad input to `op` is a clear panic naming the op, the shapes and the dtypes, at the
/// functional entry, on every backend of the test device (the primitives, forward and
/// backward, assume valid input).
pub fn check_bad_inputs(op: Op) {
    struct Bad(Op);
    impl BackendVisitor for Bad {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let op = self.0;
            let name = op.name();
            let t = |shape: [usize; 2]| filled::<B, 2>(shape, device);
            match op {
                Op::SwiGlu | Op::GeGlu => {
                    let msg = panic_message(|| {
                        glu_of(op, t([4, 8]), t([4, 9]));
                    });
                    assert_mentions(label, &msg, &[name, "gate", "up", "[4, 8]", "[4, 9]"]);
                    let msg = panic_message(|| {
                        glu_of(op, t([0, 8]), t([0, 8]));
                    });
                    assert_mentions(label, &msg, &[name, "empty", "[0, 8]"]);
                    if B::supports_dtype(device, DType::F16) {
                        let msg = panic_message(|| {
                            glu_of(op, t([4, 8]), t([4, 8]).cast(DType::F16));
                        });
                        assert_mentions(label, &msg, &[name, "F32", "F16", "[4, 8]"]);
                    }
                    let msg = panic_message(|| {
                        glu_of(op, t([4, 8]), t([8, 4]));
                    });
                    assert_mentions(label, &msg, &[name, "[8, 4]", "[4, 8]"]);
                }
                Op::Gelu | Op::Sigmoid => {
                    let msg = panic_message(|| {
                        if op == Op::Gelu {
                            functional::gelu(t([0, 8]));
                        } else {
                            functional::sigmoid(t([0, 8]));
                        }
                    });
                    assert_mentions(label, &msg, &[name, "empty", "[0, 8]"]);
                }
                other => panic!("{other:?} is not an elementwise op"),
            }
            // f64: refused at the entry, by name, where the backend's fused primitives do not
            // take it (the kernels); the stock-op fallback computes it.
            if B::supports_dtype(device, DType::F64) {
                let x = || t([2, 3]).cast(DType::F64);
                let refused = quiet_panic(|| {
                    let _ = match op {
                        Op::SwiGlu | Op::GeGlu => glu_of(op, x(), x()).into_data(),
                        Op::Gelu => functional::gelu(x()).into_data(),
                        _ => functional::sigmoid(x()).into_data(),
                    };
                });
                assert_eq!(
                    refused.is_some(),
                    !B::fused_dtype_supported(DType::F64),
                    "{label}: f64 refused: {refused:?}"
                );
                if let Some(msg) = refused {
                    assert_mentions(label, &msg, &[name, "unsupported dtype F64", "[2, 3]"]);
                }
            }
            eprintln!("{label}: {name} bad inputs rejected");
        }
    }
    for_each_backend(&mut Bad(op));
}

/// Gated units with only one of `gate`, `up` tracked by autodiff (the node's one-parent
/// paths), at rank 3, against the f64 reference.
pub fn check_partial_tracking(op: Op) {
    struct Partial(Op, Rng);
    impl BackendVisitor for Partial {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let op = self.0;
            let shape = [2, 5, 33];
            let n = 2 * 5 * 33;
            for dtype in dtypes::<B>(device) {
                let make = |rng: &mut Rng, lo, hi| {
                    Tensor::<B, 3>::from_data(
                        TensorData::new(rng.vec(n, lo, hi, 0.0), shape),
                        device,
                    )
                    .cast(dtype)
                };
                let (gate, up, grad) = (
                    make(&mut self.1, -8.0, 8.0),
                    make(&mut self.1, -2.0, 2.0),
                    make(&mut self.1, -1.5, 1.5),
                );
                let values = |t: &Tensor<B, 3>| tensors::values(t.clone());
                let (expected, _) = liger_verify::conformance::glu::expected_with_stock(
                    op,
                    dtype,
                    2 * 5,
                    &values(&gate),
                    &values(&up),
                    &values(&grad),
                );
                for track_gate in [true, false] {
                    let mut g = Tensor::<Autodiff<B>, 3>::from_inner(gate.clone());
                    let mut u = Tensor::<Autodiff<B>, 3>::from_inner(up.clone());
                    if track_gate {
                        g = g.require_grad();
                    } else {
                        u = u.require_grad();
                    }
                    let y = glu_of(op, g.clone(), u.clone());
                    let grads = (y.clone() * Tensor::from_inner(grad.clone()))
                        .sum()
                        .backward();
                    let check = |actual: Tensor<B, 3>, expected: &Expected| {
                        let c = expected.check(&values(&actual));
                        assert!(
                            c.passed,
                            "{label} {dtype:?} {op:?} (tracking {}): {} max abs {:.3e}, \
                             {:.2} of its bound",
                            if track_gate { "gate" } else { "up" },
                            c.tensor,
                            c.max_abs,
                            c.max_used
                        );
                    };
                    check(y.inner(), &expected[0]);
                    if track_gate {
                        check(g.grad(&grads).expect("gate grad"), &expected[1]);
                        assert!(u.grad(&grads).is_none());
                    } else {
                        check(u.grad(&grads).expect("up grad"), &expected[2]);
                        assert!(g.grad(&grads).is_none());
                    }
                }
            }
        }
    }
    let mut run = Partial(op, crate::fresh_rng());
    let seed = run.1.seed();
    eprintln!("seed {seed}");
    for_each_backend(&mut run);
}

/// The entry's validation, on dtypes no float tensor of the test backends has.
pub fn check_dtype_validation(op: Op) {
    use burn::tensor::Shape;
    use liger_burn::ops::validate;
    let name = op.name();
    let shape = Shape::new([2, 3]);
    let err = validate::elementwise(
        name,
        &[("gate", &shape, DType::I32), ("up", &shape, DType::I32)],
        false,
    )
    .unwrap_err();
    assert_mentions(name, &err.0, &[name, "float", "I32", "[2, 3]"]);
    let err = validate::elementwise(name, &[("x", &shape, DType::F64)], true).unwrap_err();
    assert_mentions(name, &err.0, &[name, "unsupported dtype F64", "[2, 3]"]);
    let err = validate::elementwise(
        name,
        &[("gate", &shape, DType::BF16), ("up", &shape, DType::F16)],
        true,
    )
    .unwrap_err();
    assert_mentions(name, &err.0, &[name, "gate", "up", "BF16", "F16"]);
    assert!(validate::elementwise(name, &[("x", &shape, DType::F64)], false).is_ok());
}

/// The activation of a gated MLP as liger-burn's f32 composition computes it
/// (`ops::compose::glu`), for the MLP record tests' f64 reference ([`mlp_expected`]).
#[derive(Clone, Copy, Debug)]
pub enum MlpActivation {
    /// `g·σ(g)`, `σ = 1/(1 + exp(−g))`.
    Silu,
    /// `g·(1 + tanh(√(2/π)(g + 0.044715·g³)))/2`.
    GeluTanh,
}

impl MlpActivation {
    /// `act(g)` at an exact `g`, and the bound of the f32 composition's error there.
    /// SiLU: `exp` ([`bounds::exp_error`]), the sum, the reciprocal (2.5 ulp) and the
    /// product. tanh-GELU: the argument's five roundings (and the two constants') scaled by
    /// its terms' magnitude, passed through `tanh`'s slope `1 − t²` plus
    /// [`bounds::tanh_error`], times `|g|/2`, then two roundings of the value.
    pub fn value_and_error(self, g: f64) -> (f64, f64) {
        use bounds::{U32, ULP32, exp_error, tanh_error};
        match self {
            MlpActivation::Silu => {
                let value = g / (1.0 + (-g).exp());
                let error = value.abs() * (exp_error(g) + 2.0 * U32 + 2.5 * ULP32);
                (value, error)
            }
            MlpActivation::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let cubic = 0.044_715 * g * g * g;
                let arg = k * (g + cubic);
                let t = arg.tanh();
                let value = g * (1.0 + t) / 2.0;
                let arg_error = 7.0 * U32 * k * (g.abs() + cubic.abs());
                let t_error = (1.0 - t * t) * arg_error + tanh_error(arg);
                (value, g.abs() * t_error / 2.0 + 2.0 * U32 * value.abs())
            }
        }
    }

    /// The largest slope of the activation: SiLU's is 1.0998 (at g ≈ 2.40), tanh-GELU's
    /// 1.1289 (at g ≈ 1.50).
    pub fn max_slope(self) -> f64 {
        match self {
            MlpActivation::Silu => 1.1,
            MlpActivation::GeluTanh => 1.13,
        }
    }
}

/// The gated MLP `down(act(gate(x)) * up(x))` in f64 from f32 inputs and Burn `Linear`
/// weights (`[d_in, d_out]`, biases optional), with each output's bound for an f32
/// evaluation: the projections' products and sums
/// ([`tracked::sum`](liger_verify::conformance::tracked::sum)), the gate's error through
/// the activation's slope, the activation's own error, the product's rounding, then the
/// down projection of those errors plus its own products and sum. `x: [rows, d_model]`.
#[allow(clippy::too_many_arguments)]
pub fn mlp_expected(
    x: &[f64],
    (gate_w, gate_b): (&[f64], Option<&[f64]>),
    (up_w, up_b): (&[f64], Option<&[f64]>),
    (down_w, down_b): (&[f64], Option<&[f64]>),
    activation: MlpActivation,
    d_model: usize,
    d_ff: usize,
) -> Expected {
    use bounds::U32;
    use liger_verify::conformance::tracked::{self, Tracked};
    let rows = x.len() / d_model;
    // `x·W + b` and the bound of its f32 evaluation, for output `j` of a `[d_in, d_out]` layer.
    // The products (each one rounding) and their sum with the bias, through `Tracked`.
    let linear = |input: &[f64], w: &[f64], b: Option<&[f64]>, d_in: usize, d_out: usize| {
        (0..d_out)
            .map(|j| {
                let terms: Vec<Tracked> = (0..d_in)
                    .map(|k| Tracked::exact(input[k]).mul(Tracked::exact(w[k * d_out + j])))
                    .chain(b.map(|b| Tracked::exact(b[j])))
                    .collect();
                let sum = tracked::sum(&terms);
                (sum.v, sum.e)
            })
            .collect::<Vec<_>>()
    };
    let (mut values, mut bounds) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let xr = &x[r * d_model..(r + 1) * d_model];
        let gate = linear(xr, gate_w, gate_b, d_model, d_ff);
        let up = linear(xr, up_w, up_b, d_model, d_ff);
        let (h, h_error): (Vec<f64>, Vec<f64>) = gate
            .iter()
            .zip(&up)
            .map(|(&(g, g_err), &(u, u_err))| {
                let (a, a_err) = activation.value_and_error(g);
                let a_err = a_err + activation.max_slope() * g_err;
                let h = a * u;
                (
                    h,
                    a_err * (u.abs() + u_err) + a.abs() * u_err + U32 * h.abs(),
                )
            })
            .unzip();
        for (j, (y, y_err)) in linear(&h, down_w, down_b, d_ff, d_model)
            .into_iter()
            .enumerate()
        {
            let propagated: f64 = (0..d_ff)
                .map(|k| down_w[k * d_model + j].abs() * h_error[k])
                .sum();
            values.push(y);
            bounds.push(y_err + propagated);
        }
    }
    Expected::new("output", values, bounds, rows)
}

/// The tests of a gated MLP module (`SwiGluMlp`, `GeGluMlp`): its record loads into and from
/// the same MLP written with burn `Linear`s (Hugging Face field names), the weights arrive
/// unchanged, and the forward is `down(act(gate(x)) * up(x))` with those weights
/// (`$activation`, an [`MlpActivation`]) within the bound of its f32 evaluation
/// ([`mlp_expected`]); and its config defaults and any-rank forward. One definition for
/// both modules, expanded per test file.
#[macro_export]
macro_rules! glu_mlp_tests {
    ($mlp:ident, $config:ident, $activation:expr, $record_test:ident, $defaults_test:ident) => {
        use burn::module::Module as _;
        /// The same MLP written with burn `Linear`s only (the Hugging Face field names).
        #[derive(burn::module::Module, Debug)]
        struct StockMlp<B: burn::tensor::backend::Backend> {
            gate_proj: burn::nn::Linear<B>,
            up_proj: burn::nn::Linear<B>,
            down_proj: burn::nn::Linear<B>,
        }

        #[test]
        fn $record_test() {
            type B = burn::backend::NdArray;
            let device = Default::default();
            let mut rng = $crate::fresh_rng();
            let seed = rng.seed();
            for bias in [false, true] {
                let (d_model, d_ff) = (12, 40);
                let stock_mlp = || StockMlp::<B> {
                    gate_proj: burn::nn::LinearConfig::new(d_model, d_ff)
                        .with_bias(bias)
                        .init(&device),
                    up_proj: burn::nn::LinearConfig::new(d_model, d_ff)
                        .with_bias(bias)
                        .init(&device),
                    down_proj: burn::nn::LinearConfig::new(d_ff, d_model)
                        .with_bias(bias)
                        .init(&device),
                };
                let recorder = burn::record::NamedMpkBytesRecorder::<
                    burn::record::FullPrecisionSettings,
                >::default();
                let bytes =
                    burn::record::Recorder::<B>::record(&recorder, stock_mlp().into_record(), ())
                        .unwrap();
                // Both modules from the saved bytes (parameters are initialized lazily, so a
                // clone of a fresh module would draw its own values).
                let stock = stock_mlp().load_record(
                    burn::record::Recorder::<B>::load(&recorder, bytes.clone(), &device).unwrap(),
                );
                let record = burn::record::Recorder::<B>::load(&recorder, bytes, &device)
                    .expect("the liger MLP loads the stock record");
                let ours: $mlp<B> = $config::new(d_model, d_ff)
                    .with_bias(bias)
                    .init::<B>(&device)
                    .load_record(record);
                assert_eq!(ours.gate_proj.bias.is_some(), bias);

                let x = burn::tensor::Tensor::<B, 3>::from_data(
                    burn::tensor::TensorData::new(
                        rng.vec(2 * 3 * d_model, -2.0, 2.0, 0.0),
                        [2, 3, d_model],
                    ),
                    &device,
                );
                let f64s = |t: burn::tensor::Tensor<B, 1>| {
                    t.into_data().iter::<f64>().collect::<Vec<f64>>()
                };
                let param = |l: &burn::nn::Linear<B>| {
                    (
                        f64s(l.weight.val().flatten(0, 1)),
                        l.bias.as_ref().map(|b| f64s(b.val())),
                    )
                };
                let layers = [
                    (param(&ours.gate_proj), param(&stock.gate_proj)),
                    (param(&ours.up_proj), param(&stock.up_proj)),
                    (param(&ours.down_proj), param(&stock.down_proj)),
                ];
                for (i, (a, b)) in layers.iter().enumerate() {
                    assert_eq!(
                        a, b,
                        "bias {bias}: projection {i} differs from the record's"
                    );
                }
                let layer = |i: usize| (&layers[i].0.0[..], layers[i].0.1.as_deref());
                // Ours against the f64 MLP of the record's weights, within the bound of an
                // f32 evaluation (`mlp_expected`).
                let expected = $crate::glu::mlp_expected(
                    &f64s(x.clone().flatten(0, 2)),
                    layer(0),
                    layer(1),
                    layer(2),
                    $activation,
                    d_model,
                    d_ff,
                );
                $crate::tensors::assert_rejects_wrong(&expected, &format!("bias {bias}"));
                let c = expected.check(&f64s(ours.forward(x.clone()).flatten(0, 2)));
                eprintln!("bias {bias}: largest error {:.2} of its bound", c.max_used);
                assert!(
                    c.passed,
                    "bias {bias}: liger MLP vs its f64 reference: {c:?} (seed {seed})"
                );

                // And back: the stock struct loads the liger module's record.
                let bytes =
                    burn::record::Recorder::<B>::record(&recorder, ours.into_record(), ()).unwrap();
                let record = burn::record::Recorder::<B>::load(&recorder, bytes, &device)
                    .expect("the stock MLP loads the liger record");
                let back = stock_mlp().load_record(record);
                assert_eq!(
                    back.down_proj.weight.val().into_data(),
                    stock.down_proj.weight.val().into_data()
                );
            }
        }

        #[test]
        fn $defaults_test() {
            type B = burn::backend::NdArray;
            let device = Default::default();
            let config = $config::new(8, 24);
            assert!(!config.bias, "no bias by default (Llama/Gemma MLPs)");
            let mlp = config.init::<B>(&device);
            assert!(mlp.gate_proj.bias.is_none() && mlp.down_proj.bias.is_none());
            assert_eq!(mlp.gate_proj.weight.dims(), [8, 24]);
            assert_eq!(mlp.down_proj.weight.dims(), [24, 8]);
            let y4 = mlp.forward(burn::tensor::Tensor::<B, 4>::ones([2, 2, 3, 8], &device));
            assert_eq!(y4.dims(), [2, 2, 3, 8]);
            let y2 = mlp.forward(burn::tensor::Tensor::<B, 2>::ones([3, 8], &device));
            let y4 = y4.into_data().to_vec::<f32>().unwrap();
            let y2 = y2.into_data().to_vec::<f32>().unwrap();
            assert_eq!(&y4[..24], &y2[..], "rows are independent of the rank");
        }
    };
}

/// The tests of an exact activation that `Liger<B>` overrides as a Burn primitive (GELU,
/// sigmoid): conformance, forced launch limits, bad input, dtype validation, and stock
/// Burn's `$stock` primitive on `Liger<_>` with input the kernels do not take (an empty
/// tensor is its own result, f64 where the device has it goes to `B`'s own primitive).
/// One definition for both activations, expanded per test file.
#[macro_export]
macro_rules! activation_tests {
    ($op:expr, $stock:path, $conformance:ident, $limits:ident, $bad:ident, $dtypes:ident, $fallback:ident) => {
        #[test]
        fn $conformance() {
            $crate::check_op($op);
        }

        #[test]
        fn $limits() {
            $crate::glu::check_op_with_elementwise_limits($op);
        }

        #[test]
        fn $bad() {
            $crate::glu::check_bad_inputs($op);
        }

        #[test]
        fn $dtypes() {
            $crate::glu::check_dtype_validation($op);
        }

        #[test]
        fn $fallback() {
            use burn::backend::Autodiff;
            use burn::tensor::{DType, Tensor};
            use liger_burn::Liger;
            use liger_burn::ops::FusedOps;
            struct Fallback;
            impl $crate::BackendVisitor for Fallback {
                fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                    let empty = Tensor::<Liger<B>, 2>::zeros([0, 8], device);
                    let y = $stock(empty);
                    assert_eq!((y.dims(), y.dtype()), ([0, 8], DType::F32), "{label}");
                    let x = Tensor::<Liger<Autodiff<B>>, 2>::zeros([0, 8], device).require_grad();
                    assert_eq!($stock(x).dims(), [0, 8], "{label}");
                    if B::supports_dtype(device, DType::F64) {
                        let values = [-1.0, 0.0, 2.5];
                        let x = Tensor::<Liger<B>, 1>::from_floats(values, device).cast(DType::F64);
                        let y = $stock(x)
                            .cast(DType::F32)
                            .into_data()
                            .to_vec::<f32>()
                            .unwrap();
                        let stock = Tensor::<B, 1>::from_floats(values, device).cast(DType::F64);
                        let s = $stock(stock)
                            .cast(DType::F32)
                            .into_data()
                            .to_vec::<f32>()
                            .unwrap();
                        eprintln!("{label}: f64 checked");
                        for (a, b) in y.iter().zip(&s) {
                            assert!(
                                (a - b).abs() <= 1e-6,
                                "{label}: f64 goes to B's {}: {y:?} vs {s:?}",
                                stringify!($stock)
                            );
                        }
                    }
                }
            }
            $crate::for_each_backend(&mut Fallback);
        }
    };
}
