//! fused_distill_rows (one chunk's rows of the fused linear distillation): the CubeCL
//! kernel and the composed default, each against the f64 reference with its error bounds
//! (`liger_verify::conformance::fused_linear_distill::rows_expected`), for every
//! divergence, temperatures, a teacher vocabulary padded larger, ignored rows, a scale
//! `σ ≠ 1`, vector widths 1 and 4, the gradient written in place and into a new buffer;
//! the same bounds reject wrong outputs. The fused linear distillation's conformance sweep
//! (`fused_linear_distill.rs`) checks the kernel again through the op's chunks.

use burn::tensor::{Int, Tensor, TensorPrimitive};
use liger_burn::ops::compose;
use liger_burn::ops::{DistillOptions, DistillRows, Divergence, FusedOps};
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::BackendVisitor;
use liger_tests::tensors::{assert_rejects_wrong, floats, ints, values};
use liger_verify::conformance::fused_linear_distill::rows_expected;
use liger_verify::conformance::{Comparison, Expected, Rng, poison};

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

fn read<B: FusedOps>(rows: DistillRows<B>) -> Rows {
    let f1 = |t| values(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)));
    let grad = rows.grad_logits.expect("a gradient was asked for");
    Rows {
        soft: f1(rows.soft_loss),
        hard: f1(rows.hard_loss),
        grad: values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(grad))),
    }
}

/// `actual` against the reference's `[soft_loss, hard_loss, grad_logits]`.
fn comparisons(actual: &Rows, expected: &[Expected]) -> Vec<Comparison> {
    [&actual.soft, &actual.hard, &actual.grad]
        .into_iter()
        .zip(expected)
        .map(|(a, e)| e.check(a))
        .collect()
}

struct KernelAndComposition {
    rng: Rng,
}

impl BackendVisitor for KernelAndComposition {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let rng = &mut self.rng;
        let seed = rng.seed();
        for dtype in liger_tests::dtypes::<B>(device) {
            for (k, case) in cases().into_iter().enumerate() {
                let (v, vt) = (case.vocab, case.vocab + case.teacher_extra);
                let student = floats::<B, 2>(&rng.vec(ROWS * v, -4.0, 4.0, 0.0), [ROWS, v], device)
                    .cast(dtype);
                let teacher =
                    floats::<B, 2>(&rng.vec(ROWS * vt, -4.0, 4.0, 0.0), [ROWS, vt], device)
                        .cast(dtype);
                let mut target_ids: Vec<i64> =
                    (0..ROWS).map(|i| ((i * 7 + k) % v) as i64).collect();
                target_ids[2] = case.options.ignore_index;
                target_ids[ROWS - 1] = case.options.ignore_index;
                let targets = ints::<B>(&target_ids, device);
                let student_values = values(student.clone());
                let expected = rows_expected(
                    &case.options,
                    dtype,
                    (ROWS, v, vt),
                    &student_values,
                    &values(teacher.clone()),
                    &target_ids,
                    SCALE,
                );
                let scale = || {
                    floats::<B, 1>(&[SCALE], [1], device)
                        .into_primitive()
                        .tensor()
                };
                let prim = |t: &Tensor<B, 2>| t.clone().into_primitive().tensor();
                let int = |t: &Tensor<B, 1, Int>| t.clone().into_primitive();
                let what = |implementation: &str| {
                    format!(
                        "{label} {implementation} {dtype:?} {:?} τ {} V {v} V_t {vt} \
                         (seed {seed}, rerun with LIGER_SEED={seed})",
                        case.options.divergence, case.options.temperature
                    )
                };
                let check = |actual: &Rows, what: &str| {
                    for c in comparisons(actual, &expected) {
                        assert!(
                            c.passed,
                            "{what} {}: max abs {:.3e}, {:.2} of its bound",
                            c.tensor, c.max_abs, c.max_used
                        );
                    }
                };
                // The same bounds reject wrong outputs.
                for e in &expected {
                    assert_rejects_wrong(e, &what("reference"));
                }
                poison::<B>(&[ROWS, ROWS * v], dtype, device);
                let composed = read(compose::distill_rows::forward::<B>(
                    prim(&student),
                    prim(&teacher),
                    int(&targets),
                    Some(scale()),
                    case.options,
                ));
                check(&composed, &what("composition"));
                // Held (the caller keeps the logits: a new buffer), then moved (in place).
                for held in [true, false] {
                    let input = if held {
                        prim(&student)
                    } else {
                        prim(&student.clone().add_scalar(0.0))
                    };
                    poison::<B>(&[ROWS, ROWS * v], dtype, device);
                    let before = counters::get(Kernel::distill_rows);
                    let actual = read(B::fused_distill_rows(
                        input,
                        prim(&teacher),
                        int(&targets),
                        Some(scale()),
                        case.options,
                    ));
                    let ran = counters::get(Kernel::distill_rows) > before;
                    let what = what(&format!("kernel held {held}"));
                    if !ran {
                        assert!(
                            label.starts_with("ndarray"),
                            "{what}: the distill_rows kernel did not run"
                        );
                        continue;
                    }
                    check(&actual, &what);
                    if held {
                        assert_eq!(
                            values(student.clone()),
                            student_values,
                            "{what}: the held student logits changed"
                        );
                    }
                }
            }
        }
        eprintln!("{label}: distill_rows kernel and composition match the f64 reference");
    }
}

#[test]
fn kernel_and_composition_match_the_reference() {
    liger_tests::for_each_backend(&mut KernelAndComposition {
        rng: liger_tests::fresh_rng(),
    });
}
