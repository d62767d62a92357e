//! Shared checks of the elementwise ops (SwiGLU, GeGLU, GELU, sigmoid): forced launch
//! limits, bad input, partial gradient tracking, any rank.

use crate::{BackendVisitor, check_op, dtypes, for_each_backend, lock};
use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::conformance::glu::reference;
use liger_burn::conformance::{Op, Rng, Tolerance, compare};
use liger_burn::functional;
use liger_burn::ops::{FusedOps, GluActivation};
use liger_cubecl_kernels::set_elementwise_limits;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// [`check_op`] with the elementwise launches limited to `max_cubes` cubes (so every
/// cube grid-strides over several blocks) and split every `vectors_per_launch` vectors
/// into launches over offset handles: the paths only multi-gigabyte tensors take with the
/// default limits. Other tests of the same binary may run under the limits meanwhile,
/// which changes nothing but their speed.
pub fn check_op_with_elementwise_limits(op: Op, max_cubes: usize, vectors_per_launch: usize) {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            set_elementwise_limits(None, None);
        }
    }
    set_elementwise_limits(Some(max_cubes), Some(vectors_per_launch));
    let _restore = Restore;
    check_op(op);
}

/// Runs `f`, expecting a panic; returns its message.
pub fn panic_message(f: impl FnOnce()) -> String {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    match result {
        Ok(()) => panic!("expected a panic, the call succeeded"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    }
}

/// Asserts that `msg` contains every one of `parts`.
pub fn assert_mentions(label: &str, msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(
            msg.contains(p),
            "{label}: error message {msg:?} should mention {p:?}"
        );
    }
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

fn activation_of(op: Op) -> GluActivation {
    match op {
        Op::SwiGlu => GluActivation::Silu,
        Op::GeGlu => GluActivation::GeluTanh,
        other => panic!("{other:?} is not a gated unit"),
    }
}

/// Bad input to `op` is a clear panic naming the op, the shapes and the dtypes, on every
/// backend of the test device, forward and backward primitive.
pub fn check_bad_inputs(op: Op) {
    struct Bad(Op);
    impl BackendVisitor for Bad {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let op = self.0;
            let name = op.name();
            let backward = format!("{name}_backward");
            let t = |shape: [usize; 2]| filled::<B, 2>(shape, device);
            let p = |shape: [usize; 2]| t(shape).into_primitive().tensor();
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
                    // The backward primitive checks its inputs too.
                    let act = activation_of(op);
                    let msg = panic_message(|| {
                        let _ = B::fused_glu_backward(p([4, 6]), p([4, 8]), p([4, 8]), act);
                    });
                    assert_mentions(label, &msg, &[&backward, "grad_output", "[4, 6]", "[4, 8]"]);
                    let msg = panic_message(|| {
                        let _ = B::fused_glu_backward(p([4, 8]), p([4, 8]), p([3, 8]), act);
                    });
                    assert_mentions(label, &msg, &[&backward, "up", "[3, 8]", "[4, 8]"]);
                    let msg = panic_message(|| {
                        let _ = B::fused_glu(p([4, 8]), p([8, 4]), act);
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
                    let msg = panic_message(|| {
                        let _ = if op == Op::Gelu {
                            B::fused_gelu_backward(p([4, 6]), p([4, 8]))
                        } else {
                            B::fused_sigmoid_backward(p([4, 6]), p([4, 8]))
                        };
                    });
                    assert_mentions(label, &msg, &[&backward, "grad_output", "[4, 6]", "[4, 8]"]);
                    if B::supports_dtype(device, DType::F16) {
                        let msg = panic_message(|| {
                            let g = t([4, 8]).cast(DType::F16).into_primitive().tensor();
                            let _ = if op == Op::Gelu {
                                B::fused_gelu_backward(g, p([4, 8]))
                            } else {
                                B::fused_sigmoid_backward(g, p([4, 8]))
                            };
                        });
                        assert_mentions(label, &msg, &[&backward, "F16", "F32"]);
                    }
                }
                other => panic!("{other:?} is not an elementwise op"),
            }
            eprintln!("{label}: {name} bad inputs rejected");
        }
    }
    let _guard = lock();
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
                let tol = Tolerance::for_dtype(dtype);
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
                let values = |t: &Tensor<B, 3>| -> Vec<f64> {
                    t.clone()
                        .cast(DType::F32)
                        .into_data()
                        .to_vec::<f32>()
                        .unwrap()
                        .into_iter()
                        .map(f64::from)
                        .collect()
                };
                let act = if op == Op::SwiGlu {
                    reference::silu
                } else {
                    reference::gelu_tanh
                };
                let (yr, dgr, dur) =
                    reference::glu(act, &values(&grad), &values(&gate), &values(&up));
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
                    let check = |what: &'static str, actual: Tensor<B, 3>, expected: &[f64]| {
                        let c = compare(what, &values(&actual), expected, tol);
                        assert!(
                            c.passed,
                            "{label} {dtype:?} {op:?} (tracking {}): {what} max abs {:.3e}",
                            if track_gate { "gate" } else { "up" },
                            c.max_abs
                        );
                    };
                    check("output", y.inner(), &yr);
                    if track_gate {
                        check("grad_gate", g.grad(&grads).expect("gate grad"), &dgr);
                        assert!(u.grad(&grads).is_none());
                    } else {
                        check("grad_up", u.grad(&grads).expect("up grad"), &dur);
                        assert!(g.grad(&grads).is_none());
                    }
                }
            }
        }
    }
    let _guard = lock();
    let mut run = Partial(op, Rng::from_env());
    let seed = run.1.seed();
    eprintln!("seed {seed}");
    for_each_backend(&mut run);
}
