//! The GLU-linear op (`functional::swiglu_linear`, `geglu_linear`): the gated MLP's down
//! projection on its gated unit, whose backward recomputes the unit. On every backend of
//! the test device and every dtype it has, at odd shapes, with an upstream gradient that
//! is not 1 and every subset of tracked inputs.
//!
//! The output and every gradient (`gate`, `up`, `weight`) are compared with an f64
//! reference that carries the rounding bound of its formula (the conformance suite's, `liger_verify::conformance::glu_linear`): the
//! unit `act(gate)·up` within its activation's f32 bound and stored to the dtype, the
//! products accumulated in f32 and stored. Wrong outputs (zeros, doubled, a dropped row,
//! shifted rows, a transposed buffer) must exceed the same bounds. Untracked inputs get no
//! gradient, and bad input is refused naming the op, the shapes and the dtypes.

use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor};
use liger_burn::functional;
use liger_burn::ops::FusedOps;
use liger_tests::BackendVisitor;
use liger_tests::bounded::{check_with_rejection, rounded, tensor};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::values as host;
use liger_verify::conformance::glu_linear::{self, Reference};
use liger_verify::conformance::{Op, Rng};

type AD<B> = Autodiff<B>;

const D_FF: usize = 45;
const D_OUT: usize = 37;

struct Data {
    lead: [usize; 2],
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Burn's layout `[d_ff, d_out]`.
    w: Vec<f32>,
    g: Vec<f32>,
}

impl Data {
    fn new(lead: [usize; 2], rng: &mut Rng) -> Self {
        let rows = lead[0] * lead[1];
        Data {
            lead,
            gate: rng.vec(rows * D_FF, -6.0, 6.0, 0.0),
            up: rng.vec(rows * D_FF, -2.0, 2.0, 0.0),
            w: rng.vec(D_FF * D_OUT, -0.3, 0.3, 0.0),
            g: rng.vec(rows * D_OUT, -1.5, 1.5, 0.0),
        }
    }

    fn rows(&self) -> usize {
        self.lead[0] * self.lead[1]
    }
}

/// Output and gradients of `gate`, `up` and the weight, with their bounds: the conformance
/// suite's reference (`liger check --op swiglu_linear`).
fn reference(d: &Data, op: Op, dt: DType) -> Reference {
    let linear = match op {
        Op::SwiGlu => Op::SwiGluLinear,
        Op::GeGlu => Op::GeGluLinear,
        other => unreachable!("{other:?}"),
    };
    let (gate, up, w, g) = (
        rounded(&d.gate, dt),
        rounded(&d.up, dt),
        rounded(&d.w, dt),
        rounded(&d.g, dt),
    );
    glu_linear::reference(linear, dt, (d.rows(), D_FF, D_OUT), [&gate, &up, &w, &g])
}

/// Which inputs need a gradient.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    gate: bool,
    up: bool,
    weight: bool,
}

/// Output and the gradients of `gate`, `up`, weight (empty when untracked).
fn run<B: FusedOps>(d: &Data, op: Op, dt: DType, t: Tracked, device: &B::Device) -> [Vec<f64>; 4] {
    let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    let [l0, l1] = d.lead;
    let track = |x: Tensor<AD<B>, 3>, on: bool| if on { x.require_grad() } else { x };
    let gate = track(
        tensor::<AD<B>, 3>(&f(&d.gate), [l0, l1, D_FF], dt, device),
        t.gate,
    );
    let up = track(
        tensor::<AD<B>, 3>(&f(&d.up), [l0, l1, D_FF], dt, device),
        t.up,
    );
    let mut w = tensor::<AD<B>, 2>(&f(&d.w), [D_FF, D_OUT], dt, device);
    if t.weight {
        w = w.require_grad();
    }
    let y = match op {
        Op::SwiGlu => functional::swiglu_linear(gate.clone(), up.clone(), w.clone()),
        Op::GeGlu => functional::geglu_linear(gate.clone(), up.clone(), w.clone()),
        other => unreachable!("{other:?}"),
    };
    let g = tensor::<AD<B>, 3>(&f(&d.g), [l0, l1, D_OUT], dt, device);
    let grads = (y.clone() * g).sum().backward();
    let grad3 = |x: &Tensor<AD<B>, 3>| x.grad(&grads).map(host).unwrap_or_default();
    [
        host(y.inner()),
        grad3(&gate),
        grad3(&up),
        w.grad(&grads).map(host).unwrap_or_default(),
    ]
}

struct Parity {
    rng: Rng,
    cases: usize,
}

impl BackendVisitor for Parity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let mut failures = Vec::new();
        for lead in [[3, 5], [1, 1], [2, 33]] {
            let data = Data::new(lead, &mut self.rng);
            for dtype in liger_tests::dtypes::<B>(device) {
                for op in [Op::SwiGlu, Op::GeGlu] {
                    let r = reference(&data, op, dtype);
                    for (gate, up, weight) in [
                        (true, true, true),
                        (false, false, true),
                        (true, true, false),
                        (false, true, false),
                        (true, false, true),
                    ] {
                        let t = Tracked { gate, up, weight };
                        let [y, gg, gu, gw] = run::<B>(&data, op, dtype, t, device);
                        let name =
                            |what: &str| format!("{label} {op:?} {dtype:?} {lead:?} {t:?} {what}");
                        check_with_rejection(&mut failures, &name("output"), &r.y, &y);
                        for (on, what, reference, actual) in [
                            (gate, "grad_gate", &r.g_gate, &gg),
                            (up, "grad_up", &r.g_up, &gu),
                            (weight, "grad_weight", &r.g_w, &gw),
                        ] {
                            if on {
                                check_with_rejection(&mut failures, &name(what), reference, actual);
                            } else if !actual.is_empty() {
                                failures.push(format!(
                                    "{}: an untracked input got a gradient",
                                    name(what)
                                ));
                            }
                        }
                        self.cases += 1;
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        eprintln!("{label}: swiglu_linear and geglu_linear within their rounding bounds");
    }
}

#[test]
fn glu_linear_matches_reference() {
    let mut v = Parity {
        rng: liger_tests::fresh_rng(),
        cases: 0,
    };
    liger_tests::for_each_backend(&mut v);
    assert!(v.cases > 0, "no backend ran");
}

#[test]
fn glu_linear_bad_inputs_are_rejected() {
    struct Bad;
    impl BackendVisitor for Bad {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let t = |shape: [usize; 3], dtype: DType| Tensor::<B, 3>::zeros(shape, (device, dtype));
            let w = |shape: [usize; 2], dtype: DType| Tensor::<B, 2>::zeros(shape, (device, dtype));
            let f = DType::F32;
            for (case, gate, up, weight, needles) in [
                (
                    "weight rows",
                    t([1, 3, 8], f),
                    t([1, 3, 8], f),
                    w([7, 4], f),
                    &["swiglu_linear", "[7, 4]", "[1, 3, 8]"][..],
                ),
                (
                    "up shape",
                    t([1, 3, 8], f),
                    t([1, 3, 9], f),
                    w([8, 4], f),
                    &["swiglu_linear", "[1, 3, 9]"][..],
                ),
                (
                    "empty output",
                    t([1, 3, 8], f),
                    t([1, 3, 8], f),
                    w([8, 0], f),
                    &["swiglu_linear", "[8, 0]"][..],
                ),
            ] {
                let msg = panic_message(|| {
                    let _ = functional::swiglu_linear(gate, up, weight);
                });
                assert_mentions(&format!("{label} {case}"), &msg, needles);
            }
            if B::supports_dtype(device, DType::F16) {
                let msg = panic_message(|| {
                    let _ = functional::swiglu_linear(
                        t([2, 2, 8], f),
                        t([2, 2, 8], f),
                        w([8, 4], DType::F16),
                    );
                });
                assert_mentions(label, &msg, &["swiglu_linear", "F16", "F32"]);
            }
        }
    }
    liger_tests::for_each_backend(&mut Bad);
}

/// The conformance suite's quick sweep (`liger check --op swiglu_linear --quick`).
#[test]
fn swiglu_linear_conformance() {
    liger_tests::check_op(Op::SwiGluLinear);
}

/// The same for GeGLU.
#[test]
fn geglu_linear_conformance() {
    liger_tests::check_op(Op::GeGluLinear);
}

/// The full sweep (Llama's and Qwen's `d_ff`): too large for a software rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn glu_linear_conformance_full() {
    liger_tests::check_ops_full(Op::is_glu_linear);
}
