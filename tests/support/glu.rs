//! Shared checks of the elementwise ops (SwiGLU, GeGLU, GELU, sigmoid): forced launch
//! limits, bad input, partial gradient tracking, any rank.

use crate::errors::{assert_mentions, panic_message, quiet_panic};
use crate::{BackendVisitor, dtypes, for_each_backend, tensors};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::functional;
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::override_launch_config;
use liger_verify::conformance::{Expected, Op, Rng, run_case};

/// `op`'s conformance at a few shapes with the elementwise launches limited to one cube
/// (which then grid-strides over every block of a launch) and split every 4096 vectors
/// into launches over offset handles: the paths only multi-gigabyte tensors take with the
/// default limits. The shapes have tails, several blocks per launch and a partial last
/// launch. The limits hold on this test's thread only.
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
    let mut geometry = crate::current_geometry();
    geometry.elementwise.max_cubes = Some(1);
    geometry.elementwise.vectors_per_launch = Some(4096);
    let _geometry = override_launch_config(geometry);
    let mut run = Run(op, crate::fresh_rng(), Vec::new());
    let seed = run.1.seed();
    for_each_backend(&mut run);
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

/// The tests of a gated MLP module (`SwiGluMlp`, `GeGluMlp`): its record loads into and from
/// the same MLP written with burn `Linear`s (Hugging Face field names) with the same
/// forward (`down(act(gate(x)) * up(x))` with the stock activation `$act`), and its config
/// defaults and any-rank forward. One definition for both modules, expanded per test file.
#[macro_export]
macro_rules! glu_mlp_tests {
    ($mlp:ident, $config:ident, $act:path, $record_test:ident, $defaults_test:ident) => {
        use burn::module::Module as _;
        /// The same MLP written with burn `Linear`s only (the Hugging Face field names).
        #[derive(burn::module::Module, Debug)]
        struct StockMlp<B: burn::tensor::backend::Backend> {
            gate_proj: burn::nn::Linear<B>,
            up_proj: burn::nn::Linear<B>,
            down_proj: burn::nn::Linear<B>,
        }

        impl<B: burn::tensor::backend::Backend> StockMlp<B> {
            fn forward(&self, x: burn::tensor::Tensor<B, 3>) -> burn::tensor::Tensor<B, 3> {
                let gate = self.gate_proj.forward(x.clone());
                let up = self.up_proj.forward(x);
                self.down_proj.forward($act(gate) * up)
            }
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
                assert_eq!(
                    ours.gate_proj.weight.val().into_data(),
                    stock.gate_proj.weight.val().into_data()
                );
                let a = ours.forward(x.clone()).into_data().to_vec::<f32>().unwrap();
                let b = stock.forward(x).into_data().to_vec::<f32>().unwrap();
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
                        "bias {bias} [{i}]: liger {x} vs stock {y} (seed {seed})"
                    );
                }

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
