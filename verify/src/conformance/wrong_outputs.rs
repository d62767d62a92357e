//! Every comparison of the suite can fail: for every op, every dtype and the widest and
//! the tallest shapes of the full sweep, results built from the f64 reference with a
//! typical bug are rejected, tensor by tensor, and the reference rounded to the dtype (a
//! correct result) is accepted.
//!
//! The wrong results are [`WRONG_RESULTS`] ([`Expected::wrong_result`]). A mutation that is
//! not defined for a tensor (permuting a scalar) or that leaves its values exactly as they
//! are (dropping rows whose targets are all ignored) is not a wrong result and is skipped.
//!
//! One kind of tensor cannot be checked at all, and is counted apart: one whose every
//! value is below the smallest normal of its dtype (f16's mean cross-entropy gradient over
//! 70000 rows, about `p/70000`). A device may flush such values to zero, so zeros (or any
//! value as small) are a correct result there. Only f16 has such tensors.

use super::bounds::{Expected, WRONG_RESULTS, min_normal, round_to};
use super::{HostCase, Op, Rng, host_case, shapes};
use burn::tensor::DType;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The widest and the tallest shape of `op`'s full sweep.
fn extreme_shapes(op: Op) -> Vec<(usize, usize)> {
    let all = shapes(op, false);
    let widest = *all.iter().max_by_key(|s| (s.1, s.0)).expect("shapes");
    let tallest = *all.iter().max_by_key(|s| (s.0, s.1)).expect("shapes");
    let mut out = vec![widest];
    if tallest != widest {
        out.push(tallest);
    }
    out
}

/// The dtype a tensor is stored in: the losses, the f32 accumulator's sum and the f32
/// adapters' gradients are f32 whatever the inputs' dtype.
fn stored_dtype(op: Op, e: &Expected, dtype: DType) -> DType {
    if op == Op::MatmulAdd
        || (op == Op::LoraLinear && matches!(e.tensor, "grad_A" | "grad_B"))
        || matches!(e.tensor, "loss" | "z_loss" | "soft_loss" | "hard_loss")
        || super::fused_linear_preference::METRICS.contains(&e.tensor)
        || super::fused_linear_rl::METRICS.contains(&e.tensor)
    {
        DType::F32
    } else {
        dtype
    }
}

/// What one host case showed.
#[derive(Default)]
struct Outcome {
    problems: Vec<String>,
    rejected: usize,
    /// Tensors entirely below their dtype's normal range.
    below_normal: Vec<String>,
}

/// Checks one host case; returns what went wrong and how many rejections it saw.
fn check_case(op: Op, (rows, width): (usize, usize), dtype: DType, seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let HostCase {
        expected,
        without_last_rows,
    } = host_case(op, rows, width, dtype, &mut rng);
    let at = format!("{} {dtype:?} [{rows}, {width}] (seed {seed})", op.name());
    let mut out = Outcome::default();
    for (e, w) in expected.iter().zip(&without_last_rows) {
        assert_eq!(e.tensor, w.tensor);
        let stored_in = stored_dtype(op, e, dtype);
        let stored: Vec<f64> = e.values.iter().map(|&v| round_to(stored_in, v)).collect();
        let c = e.check(&stored);
        if !c.passed {
            out.problems.push(format!(
                "{at} {}: the reference rounded to the dtype is rejected (used {:.2})",
                e.tensor, c.max_used
            ));
        }
        // A fraction of clipped tokens that is exactly 0 (no token clipped) is compared for
        // equality: there is no wrong value to build from it, and nothing to flush.
        if e.tensor == "clip_ratio" && e.values.iter().all(|v| *v == 0.0) {
            continue;
        }
        let m = min_normal(stored_in);
        // A tensor of exact zeros is checkable: `wrong_result` gives ones for it, which
        // fail any bound below 1 (a metric that is off has bound 0; attention's gradients
        // of q and k over one key are zeros that a kernel computes up to rounding).
        let exact_zero = e.values.iter().all(|v| *v == 0.0);
        if !exact_zero && e.values.iter().all(|v| v.abs() < 2.0 * m) {
            out.below_normal.push(format!("{at} {}", e.tensor));
            continue;
        }
        for kind in WRONG_RESULTS {
            let Some(wrong) = e.wrong_result(kind, Some(w)) else {
                continue;
            };
            let c = e.check(&wrong);
            if c.passed {
                out.problems.push(format!(
                    "{at} {}: {kind} passes (max error {:.3e}, {:.2} of its bound)",
                    e.tensor, c.max_abs, c.max_used
                ));
            } else {
                out.rejected += 1;
            }
        }
    }
    out
}

fn check_ops(ops: &[Op], shapes_of: impl Fn(Op) -> Vec<(usize, usize)>) {
    let mut problems = Vec::new();
    let mut rejected = 0;
    for &op in ops {
        for (k, shape) in shapes_of(op).into_iter().enumerate() {
            for (d, dtype) in DTYPES.into_iter().enumerate() {
                let out = check_case(op, shape, dtype, 1000 + 10 * k as u64 + d as u64);
                problems.extend(out.problems);
                rejected += out.rejected;
                for t in out.below_normal {
                    eprintln!("below the normal range of its dtype, not checkable: {t}");
                    if dtype != DType::F16 {
                        problems.push(format!("{t}: below the normal range of {dtype:?}"));
                    }
                }
            }
        }
    }
    eprintln!("{rejected} wrong results rejected");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn norms_reject_wrong_outputs() {
    check_ops(
        &[
            Op::RmsNorm,
            Op::RmsNormGemma,
            Op::AddRmsNorm,
            Op::LayerNorm,
            Op::LayerNormNoBias,
        ],
        extreme_shapes,
    );
}

#[test]
fn softmaxes_reject_wrong_outputs() {
    check_ops(&[Op::Softmax, Op::LogSoftmax], extreme_shapes);
}

#[test]
fn elementwise_ops_reject_wrong_outputs() {
    check_ops(
        &[Op::SwiGlu, Op::GeGlu, Op::Gelu, Op::Sigmoid],
        extreme_shapes,
    );
}

#[test]
fn rope_rejects_wrong_outputs() {
    check_ops(&[Op::RopeRotateHalf, Op::RopeInterleaved], extreme_shapes);
}

#[test]
fn cross_entropy_rejects_wrong_outputs() {
    check_ops(
        &[
            Op::CrossEntropy,
            Op::CrossEntropySmoothWeighted,
            Op::CrossEntropyZLossSoftcap,
            Op::CrossEntropyNone,
            Op::CrossEntropySum,
        ],
        extreme_shapes,
    );
}

const LINEAR: [Op; 3] = [
    Op::FusedLinearCrossEntropy,
    Op::FusedLinearCrossEntropyNone,
    Op::FusedLinearCrossEntropySum,
];

/// The fused linear cross entropy at the quick sweep's shapes (every chunking variant).
#[test]
fn fused_linear_cross_entropy_rejects_wrong_outputs_quick_shapes() {
    check_ops(&LINEAR, |op| shapes(op, true));
}

/// The fused linear cross entropy at the full sweep's widest (256 × 128256) and tallest
/// (4096 × 4096) shapes: its f64 reference takes about 4·N·V·H multiply-adds per dtype
/// (a minute of a debug build's time per case on two cores), so this runs on request:
/// `cargo test -p liger-burn --lib --release -- --ignored wrong_outputs`.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn fused_linear_cross_entropy_rejects_wrong_outputs_full_shapes() {
    check_ops(&LINEAR, extreme_shapes);
}

const PREFERENCE: [Op; 5] = [
    Op::FusedLinearDpo,
    Op::FusedLinearDpoLossTypes,
    Op::FusedLinearOrpo,
    Op::FusedLinearCpo,
    Op::FusedLinearSimpo,
];

/// The fused linear preference losses at the quick sweep's shapes.
#[test]
fn fused_linear_preference_rejects_wrong_outputs_quick_shapes() {
    check_ops(&PREFERENCE, |op| shapes(op, true));
}

/// The fused linear preference losses at the full sweep's widest shape (16 pairs at
/// V = 128256): minutes in a debug build, as the linear cross entropy's.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn fused_linear_preference_rejects_wrong_outputs_full_shapes() {
    check_ops(&PREFERENCE, extreme_shapes);
}

const DISTILL: [Op; 4] = [
    Op::FusedLinearJsd,
    Op::FusedLinearForwardKl,
    Op::FusedLinearReverseKl,
    Op::FusedLinearTvd,
];

/// The fused linear distillation at the quick sweep's shapes.
#[test]
fn fused_linear_distill_rejects_wrong_outputs_quick_shapes() {
    check_ops(&DISTILL, |op| shapes(op, true));
}

/// The fused linear distillation at the full sweep's widest and tallest shapes: minutes
/// in a debug build.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn fused_linear_distill_rejects_wrong_outputs_full_shapes() {
    check_ops(&DISTILL, extreme_shapes);
}

/// The divergences at the widest and tallest shapes of the full sweep.
#[test]
fn divergences_reject_wrong_outputs() {
    check_ops(
        &[Op::KlDiv, Op::KlDivNone, Op::Jsd, Op::Tvd],
        extreme_shapes,
    );
}

const RL: [Op; 5] = [
    Op::FusedLinearKto,
    Op::FusedLinearKtoAvg,
    Op::FusedLinearGrpo,
    Op::FusedLinearDapo,
    Op::FusedLinearDrGrpo,
];

/// Fused linear KTO and GRPO at the quick sweep's shapes.
#[test]
fn fused_linear_kto_and_grpo_reject_wrong_outputs_quick_shapes() {
    check_ops(&RL, |op| shapes(op, true));
}

/// Fused linear KTO and GRPO at the full sweep's widest shape: minutes in a debug build.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn fused_linear_kto_and_grpo_reject_wrong_outputs_full_shapes() {
    check_ops(&RL, extreme_shapes);
}

const GLU_LINEAR_AND_MATMUL_ADD: [Op; 4] = [
    Op::SwiGluLinear,
    Op::GeGluLinear,
    Op::MatmulAdd,
    Op::MatmulAddInDtype,
];

/// The GLU-linear ops and the matmul-add at the quick sweep's shapes.
#[test]
fn glu_linear_and_matmul_add_reject_wrong_outputs_quick_shapes() {
    check_ops(&GLU_LINEAR_AND_MATMUL_ADD, |op| shapes(op, true));
}

/// The GLU-linear ops and the matmul-add at the full sweep's widest and tallest shapes:
/// minutes in a debug build.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn glu_linear_and_matmul_add_reject_wrong_outputs_full_shapes() {
    check_ops(&GLU_LINEAR_AND_MATMUL_ADD, extreme_shapes);
}

const LORA: [Op; 2] = [Op::LoraLinear, Op::LoraLinearDropout];

/// The LoRA linear layer at the quick sweep's shapes.
#[test]
fn lora_linear_rejects_wrong_outputs_quick_shapes() {
    check_ops(&LORA, |op| shapes(op, true));
}

/// The LoRA linear layer at the full sweep's widest and tallest shapes (Llama-3-8B's down
/// projection and Llama-3.2-1B's k/v at 4K tokens): minutes in a debug build.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn lora_linear_rejects_wrong_outputs_full_shapes() {
    check_ops(&LORA, extreme_shapes);
}

/// The embedding lookup and its gradient at the quick sweep's shapes.
#[test]
fn embedding_rejects_wrong_outputs_quick_shapes() {
    check_ops(&[Op::Embedding], |op| shapes(op, true));
}

/// The embedding at the full sweep's widest and tallest shapes.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn embedding_rejects_wrong_outputs_full_shapes() {
    check_ops(&[Op::Embedding], extreme_shapes);
}

/// The linear layer with a bias at the quick sweep's shapes.
#[test]
fn linear_rejects_wrong_outputs_quick_shapes() {
    check_ops(&[Op::Linear], |op| shapes(op, true));
}

/// The linear layer at the full sweep's widest and tallest shapes.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn linear_rejects_wrong_outputs_full_shapes() {
    check_ops(&[Op::Linear], extreme_shapes);
}

const ATTENTION: [Op; 4] = [
    Op::Attention,
    Op::AttentionWindow,
    Op::AttentionDocuments,
    Op::AttentionBidirectional,
];

/// Attention under each mask kind at the quick sweep's shapes.
#[test]
fn attention_rejects_wrong_outputs_quick_shapes() {
    check_ops(&ATTENTION, |op| shapes(op, true));
}

/// Attention at the full sweep's widest and tallest shapes (1031 and 520 positions):
/// minutes in a debug build.
#[test]
#[ignore = "minutes in a debug build: run with --release -- --ignored"]
fn attention_rejects_wrong_outputs_full_shapes() {
    check_ops(&ATTENTION, extreme_shapes);
}
