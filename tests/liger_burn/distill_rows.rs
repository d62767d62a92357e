//! fused_distill_rows (one chunk's rows of the fused linear distillation): the CubeCL
//! kernel against the composed default on the same backend and inputs, for every
//! divergence, temperatures, a teacher vocabulary padded larger, ignored rows, a scale
//! `σ ≠ 1`, vector widths 1 and 4, the gradient written in place and into a new buffer;
//! the comparison rejects wrong outputs. Against f64 the kernel is checked through
//! `fused_linear_distill`'s conformance sweep (`fused_linear_distill.rs`), whose chunks
//! run it.

use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
use liger_burn::ops::compose;
use liger_burn::ops::{DistillOptions, DistillRows, Divergence, FusedOps};
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::BackendVisitor;
use liger_tests::tensors::{floats, ints, scaled, values};
use liger_verify::conformance::{Comparison, Rng, Tolerance, compare, poison};

const ROWS: usize = 13;
const SCALE: f32 = 1.7;

struct Case {
    vocab: usize,
    teacher_extra: usize,
    options: DistillOptions,
}

fn cases() -> Vec<Case> {
    let base = DistillOptions::default();
    let mut cases = Vec::new();
    for divergence in [
        Divergence::Jsd { beta: 0.3 },
        Divergence::ForwardKl,
        Divergence::ReverseKl,
        Divergence::Tvd,
    ] {
        for (vocab, teacher_extra, temperature) in [(37, 0, 1.0), (37, 4, 0.7), (64, 0, 2.0)] {
            cases.push(Case {
                vocab,
                teacher_extra,
                options: base
                    .with_divergence(divergence)
                    .with_temperature(temperature)
                    .with_weights(0.4, 0.6),
            });
        }
    }
    cases
}

/// The three outputs of one call as f64: soft losses, hard losses, gradient.
struct Rows {
    soft: Vec<f64>,
    hard: Vec<f64>,
    grad: Vec<f64>,
}

fn read<B: FusedOps>(rows: DistillRows<B>, vocab: usize) -> Rows {
    let f1 = |t| values(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)));
    let grad = rows.grad_logits.expect("a gradient was asked for");
    // Gradients are of order 1/V: compared at order 1.
    let grad = scaled(
        &values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(grad))),
        vocab as f64,
    );
    Rows {
        soft: f1(rows.soft_loss),
        hard: f1(rows.hard_loss),
        grad,
    }
}

fn comparisons(actual: &Rows, expected: &Rows, dtype: DType) -> Vec<Comparison> {
    let tol = Tolerance::for_dtype(dtype);
    vec![
        compare("soft_loss", &actual.soft, &expected.soft, tol),
        compare("hard_loss", &actual.hard, &expected.hard, tol),
        compare("grad_logits", &actual.grad, &expected.grad, tol),
    ]
}

struct KernelAgainstComposition {
    rng: Rng,
}

impl BackendVisitor for KernelAgainstComposition {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let rng = &mut self.rng;
        for dtype in liger_tests::dtypes::<B>(device) {
            for (k, case) in cases().into_iter().enumerate() {
                let (v, vt) = (case.vocab, case.vocab + case.teacher_extra);
                let student = floats::<B, 2>(&rng.vec(ROWS * v, -4.0, 4.0, 0.0), [ROWS, v], device)
                    .cast(dtype);
                let teacher =
                    floats::<B, 2>(&rng.vec(ROWS * vt, -4.0, 4.0, 0.0), [ROWS, vt], device)
                        .cast(dtype);
                let mut targets: Vec<i64> = (0..ROWS).map(|i| ((i * 7 + k) % v) as i64).collect();
                targets[2] = case.options.ignore_index;
                targets[ROWS - 1] = case.options.ignore_index;
                let targets = ints::<B>(&targets, device);
                let scale = || {
                    floats::<B, 1>(&[SCALE], [1], device)
                        .into_primitive()
                        .tensor()
                };
                let prim = |t: &Tensor<B, 2>| t.clone().into_primitive().tensor();
                let int = |t: &Tensor<B, 1, Int>| t.clone().into_primitive();
                let expected = read(
                    compose::distill_rows::forward::<B>(
                        prim(&student),
                        prim(&teacher),
                        int(&targets),
                        Some(scale()),
                        case.options,
                    ),
                    v,
                );
                let student_values = values(student.clone());
                // Held (the caller keeps the logits: a new buffer), then moved (in place).
                for held in [true, false] {
                    let input = if held {
                        prim(&student)
                    } else {
                        prim(&student.clone().add_scalar(0.0))
                    };
                    poison::<B>(&[ROWS, ROWS * v], dtype, device);
                    let before = counters::get(Kernel::distill_rows);
                    let actual = read(
                        B::fused_distill_rows(
                            input,
                            prim(&teacher),
                            int(&targets),
                            Some(scale()),
                            case.options,
                        ),
                        v,
                    );
                    let ran = counters::get(Kernel::distill_rows) > before;
                    let what = format!(
                        "{label} {dtype:?} {:?} τ {} V {v} V_t {vt} held {held}",
                        case.options.divergence, case.options.temperature
                    );
                    if !ran {
                        assert!(
                            label.starts_with("ndarray"),
                            "{what}: the distill_rows kernel did not run"
                        );
                        continue;
                    }
                    for c in comparisons(&actual, &expected, dtype) {
                        assert!(
                            c.passed,
                            "{what} {}: max abs {:.3e}, max rel {:.3e}",
                            c.tensor, c.max_abs, c.max_rel
                        );
                    }
                    if held {
                        assert_eq!(
                            values(student.clone()),
                            student_values,
                            "{what}: the held student logits changed"
                        );
                    }
                    // The same comparison rejects wrong outputs.
                    rejects_wrong_outputs(&actual, dtype, v, &what);
                }
            }
        }
        eprintln!("{label}: distill_rows kernel matches the composition");
    }
}

/// Zeros, doubled values, a dropped row and a transposed gradient fail the comparison.
fn rejects_wrong_outputs(good: &Rows, dtype: DType, vocab: usize, what: &str) {
    let doubled = |v: &[f64]| v.iter().map(|x| 2.0 * x).collect::<Vec<_>>();
    let zeros = |v: &[f64]| vec![0.0; v.len()];
    let dropped_row = |v: &[f64], width: usize| {
        let mut out = v.to_vec();
        out[width..2 * width].iter_mut().for_each(|x| *x = 0.0);
        out
    };
    let transposed = |v: &[f64]| {
        let mut out = vec![0.0; v.len()];
        for i in 0..ROWS {
            for c in 0..vocab {
                let flat = i * vocab + c;
                out[(flat % ROWS) * vocab + flat / ROWS] = v[flat];
            }
        }
        out
    };
    let wrongs: Vec<(&str, Rows)> = vec![
        (
            "soft doubled",
            Rows {
                soft: doubled(&good.soft),
                hard: good.hard.clone(),
                grad: good.grad.clone(),
            },
        ),
        (
            "hard zeros",
            Rows {
                soft: good.soft.clone(),
                hard: zeros(&good.hard),
                grad: good.grad.clone(),
            },
        ),
        (
            "grad doubled",
            Rows {
                soft: good.soft.clone(),
                hard: good.hard.clone(),
                grad: doubled(&good.grad),
            },
        ),
        (
            "grad row dropped",
            Rows {
                soft: good.soft.clone(),
                hard: good.hard.clone(),
                grad: dropped_row(&good.grad, vocab),
            },
        ),
        (
            "grad transposed",
            Rows {
                soft: good.soft.clone(),
                hard: good.hard.clone(),
                grad: transposed(&good.grad),
            },
        ),
    ];
    for (name, wrong) in wrongs {
        assert!(
            comparisons(&wrong, good, dtype).iter().any(|c| !c.passed),
            "{what}: the comparison accepted a wrong output ({name})"
        );
    }
}

#[test]
fn kernel_matches_the_composition() {
    liger_tests::for_each_backend(&mut KernelAgainstComposition {
        rng: Rng::from_env(),
    });
}
