//! cross_entropy: loss, z-loss and the logits gradient against the f64 reference on every
//! backend of the test device (both reduction paths, every dtype it has), module parity
//! with `burn::nn::loss::CrossEntropyLoss`, the all-ignored batch and bad input.

use liger_verify::conformance::Op;

#[test]
fn cross_entropy_matches_reference() {
    liger_tests::check_op(Op::CrossEntropy);
}

#[test]
fn cross_entropy_smoothing_weights_matches_reference() {
    liger_tests::check_op(Op::CrossEntropySmoothWeighted);
}

#[test]
fn cross_entropy_z_loss_softcap_matches_reference() {
    liger_tests::check_op(Op::CrossEntropyZLossSoftcap);
}

#[test]
fn cross_entropy_reduction_none_matches_reference() {
    liger_tests::check_op(Op::CrossEntropyNone);
}

#[test]
fn cross_entropy_sum_ignore_index_matches_reference() {
    liger_tests::check_op(Op::CrossEntropySum);
}

/// One cube per multiprocessor walks the rows in turn (`cross_entropy_cubes_per_sm`): the
/// 300-row cases have more rows than cubes on every device.
#[test]
fn cross_entropy_with_rows_walked_by_fewer_cubes_matches_reference() {
    let mut geometry = liger_tests::current_geometry();
    geometry.cross_entropy_cubes_per_sm = Some(1);
    let _geometry = liger_burn::test_hooks::override_launch_config(geometry);
    liger_tests::check_op(Op::CrossEntropy);
    liger_tests::check_op(Op::CrossEntropyZLossSoftcap);
}

use burn::backend::Autodiff;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Shape, Tensor};
use liger_burn::functional;
use liger_burn::ops::validate;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction};
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::BackendVisitor;
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::{assert_rejects_wrong, check, floats, ints, named, values};
use liger_verify::conformance::bounds::{U32, ULP32, accumulation, flush, unit_roundoff};
use liger_verify::conformance::cross_entropy::expected_with_options;
use liger_verify::conformance::tracked::Tracked;
use liger_verify::conformance::{Expected, Rng};

const N: usize = 23;
const V: usize = 37;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// `liger_burn::nn::CrossEntropyLoss` gives the same loss and logits gradient as
/// `burn::nn::loss::CrossEntropyLoss` for every configuration Burn has: pad tokens (several),
/// weights, smoothing, their combinations and probability inputs.
struct ModuleParity {
    rng: Rng,
}

impl BackendVisitor for ModuleParity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        type A<B> = Autodiff<B>;
        let rng = &mut self.rng;
        let x = rng.vec(N * V, -3.0, 3.0, 0.0);
        // Pad tokens 0 and 5 appear on purpose.
        let targets: Vec<i64> = (0..N)
            .map(|i| match i % 7 {
                0 => 0,
                3 => 5,
                _ => rng.below(V) as i64,
            })
            .collect();
        let weights = rng.vec(V, 0.5, 2.0, 0.0);
        let g = rng.vec(1, 0.5, 1.5, 0.0)[0];
        type Stock = burn::nn::loss::CrossEntropyLossConfig;
        type Fused = liger_burn::nn::CrossEntropyLossConfig;
        let pads = Some(vec![0usize, 5]);
        let cases: Vec<(&str, Stock, Fused)> = vec![
            ("default", Stock::new(), Fused::new()),
            (
                "pads",
                Stock::new().with_pad_tokens(pads.clone()),
                Fused::new().with_pad_tokens(pads.clone()),
            ),
            (
                "weights",
                Stock::new().with_weights(Some(weights.clone())),
                Fused::new().with_weights(Some(weights.clone())),
            ),
            (
                "smoothing",
                Stock::new().with_smoothing(Some(0.1)),
                Fused::new().with_smoothing(Some(0.1)),
            ),
            (
                "pads+weights",
                Stock::new()
                    .with_pad_tokens(pads.clone())
                    .with_weights(Some(weights.clone())),
                Fused::new()
                    .with_pad_tokens(pads.clone())
                    .with_weights(Some(weights.clone())),
            ),
            (
                "pads+smoothing",
                Stock::new()
                    .with_pad_tokens(pads.clone())
                    .with_smoothing(Some(0.2)),
                Fused::new()
                    .with_pad_tokens(pads.clone())
                    .with_smoothing(Some(0.2)),
            ),
            (
                "pads+weights+smoothing",
                Stock::new()
                    .with_pad_tokens(pads.clone())
                    .with_weights(Some(weights.clone()))
                    .with_smoothing(Some(0.1)),
                Fused::new()
                    .with_pad_tokens(pads.clone())
                    .with_weights(Some(weights.clone()))
                    .with_smoothing(Some(0.1)),
            ),
            (
                "probabilities",
                Stock::new()
                    .with_logits(false)
                    .with_pad_tokens(pads.clone()),
                Fused::new()
                    .with_logits(false)
                    .with_pad_tokens(pads.clone()),
            ),
        ];
        for (case, stock, fused) in cases {
            let probabilities = !stock.logits;
            let reference = (!probabilities).then(|| {
                burn_module_reference(
                    &f64s(&x),
                    &targets,
                    stock.pad_tokens.as_deref().unwrap_or(&[]),
                    stock.weights.as_deref().map(f64s).as_deref(),
                    stock.smoothing.map_or(0.0, f64::from),
                    f64::from(g),
                )
            });
            let run = |loss_fn: &dyn Fn(Tensor<A<B>, 2>) -> Tensor<A<B>, 1>| {
                let x = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
                let input = if probabilities {
                    softmax(x.clone(), 1)
                } else {
                    x.clone()
                };
                let loss = loss_fn(input);
                let grads = (loss.clone() * g).backward();
                (values(loss.inner()), values(x.grad(&grads).unwrap()))
            };
            let stock = stock.init::<A<B>>(device);
            let fused = fused.init::<A<B>>(device);
            let t = ints::<A<B>>(&targets, device);
            let (stock_loss, stock_grad) = run(&|x| stock.forward(x, t.clone()));
            let (fused_loss, fused_grad) = run(&|x| fused.forward(x, t.clone()));
            let Some(reference) = reference else {
                // Probability inputs go through Burn's own composition: the same numbers.
                assert_eq!(fused_loss, stock_loss, "{label} {case}: loss");
                assert_eq!(fused_grad, stock_grad, "{label} {case}: gradient");
                continue;
            };
            for (expected, fused, stock) in [
                (&reference[0], &fused_loss, &stock_loss),
                (&reference[1], &fused_grad, &stock_grad),
            ] {
                // The fused module within its bound of the f64 value; Burn's module, another
                // f32 evaluation of the same definition, within twice that of the fused one.
                check(label, case, expected.check(fused));
                let against_burn = expected.against(stock.clone(), &expected.bounds);
                check(
                    label,
                    &format!("{case} (against Burn)"),
                    against_burn.check(fused),
                );
                assert_rejects_wrong(expected, &format!("{label} {case}"));
            }
        }
    }
}

/// The f64 value of Burn's `CrossEntropyLoss` on logits `x: [N, V]` (mean reduction, the
/// upstream gradient `g`) with its f32 bounds, `[loss, grad_logits]`. In the fused kernel's
/// terms a pad row is an ignored row that still counts in the mean's denominator
/// `D = Σ_i w[y_i]` over every row (`N` without weights), so the loss is `Σ_i loss_i / D`
/// and the gradient `(g/D)·∂loss_i/∂x`: the sum's bounds, plus `D`'s f32 accumulation, the
/// division and the product by `g`.
fn burn_module_reference(
    x: &[f64],
    targets: &[i64],
    pads: &[usize],
    weights: Option<&[f64]>,
    smoothing: f64,
    g: f64,
) -> [Expected; 2] {
    let options = CrossEntropyOptions::default()
        .with_reduction(Reduction::Sum)
        .with_label_smoothing(smoothing);
    let masked: Vec<i64> = targets
        .iter()
        .map(|&t| {
            if pads.contains(&(t as usize)) {
                options.ignore_index
            } else {
                t
            }
        })
        .collect();
    let denominator: f64 = targets
        .iter()
        .map(|&t| weights.map_or(1.0, |w| w[t as usize]))
        .sum();
    let denominator_error = if weights.is_some() {
        accumulation(targets.len(), denominator) / denominator
    } else {
        0.0
    };
    let factor_error = denominator_error + 2.5 * ULP32 + U32;
    let sum = expected_with_options(
        &options,
        DType::F32,
        V,
        x,
        &masked,
        weights,
        &[g / denominator],
        targets.len(),
    );
    let rescale = |e: &Expected, by: f64| {
        let values: Vec<f64> = e.values.iter().map(|v| v * by).collect();
        let bounds = e
            .bounds
            .iter()
            .zip(&values)
            .map(|(b, v)| b * by.abs() + factor_error * v.abs())
            .collect();
        Expected::new(e.tensor, values, bounds, e.rows)
    };
    // The sum's loss is `Σ loss_i`; its gradient already carries `g/D`.
    [
        rescale(named(&sum, "loss"), 1.0 / denominator),
        rescale(named(&sum, "grad_logits"), 1.0),
    ]
}

#[test]
fn module_matches_burn_cross_entropy_loss() {
    liger_tests::for_each_backend(&mut ModuleParity {
        rng: liger_tests::fresh_rng(),
    });
}

/// Special cases on every backend: an all-ignored batch, the free backward (upstream
/// gradient exactly 1), logits still held by the caller are not overwritten, the primitive
/// without autodiff, and out-of-range targets without the check.
struct SpecialCases {
    rng: Rng,
}

impl BackendVisitor for SpecialCases {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        type A<B> = Autodiff<B>;
        let rng = &mut self.rng;
        let x = rng.vec(N * V, -3.0, 3.0, 0.0);
        let xr = f64s(&x);
        let mut targets: Vec<i64> = (0..N).map(|_| rng.below(V) as i64).collect();
        targets[2] = -100;
        targets[7] = -100;

        // All ignored: loss 0 and zero gradients for every reduction (PyTorch's mean is NaN).
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let xt = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
            let t = ints::<A<B>>(&[-100; N], device);
            let opts = CrossEntropyOptions::default()
                .with_reduction(reduction)
                .with_lse_square_scale(1e-2)
                .with_return_z_loss(true);
            let out = functional::cross_entropy(xt.clone(), t, None, opts);
            let loss = values(out.loss.clone().inner());
            assert!(
                loss.iter().all(|v| *v == 0.0),
                "{label} all-ignored {reduction:?}: loss {loss:?}"
            );
            let z = values(out.z_loss.unwrap().inner());
            assert!(z.iter().all(|v| *v == 0.0), "{label}: z-loss {z:?}");
            let grads = out.loss.sum().backward();
            let grad = values(xt.grad(&grads).unwrap());
            assert!(
                grad.iter().all(|v| *v == 0.0),
                "{label} all-ignored {reduction:?}: gradient not all zero"
            );
        }
        // The same through the module with only pad tokens (Burn's mean: 0 / N = 0).
        let module = liger_burn::nn::CrossEntropyLossConfig::new()
            .with_pad_tokens(Some(vec![4]))
            .init::<A<B>>(device);
        let xt = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
        let loss = module.forward(xt.clone(), ints::<A<B>>(&[4; N], device));
        assert_eq!(values(loss.clone().inner()), vec![0.0], "{label}: all pads");

        // Free backward: `loss.backward()` (mean) and `loss.sum().backward()` (none).
        for reduction in [Reduction::Mean, Reduction::None] {
            let opts = CrossEntropyOptions::default()
                .with_reduction(reduction)
                .with_label_smoothing(0.1);
            let g = match reduction {
                Reduction::None => vec![1.0; N],
                _ => vec![1.0],
            };
            let expected = expected_with_options(&opts, DType::F32, V, &xr, &targets, None, &g, N);
            let xt = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
            let out = functional::cross_entropy(xt.clone(), ints(&targets, device), None, opts);
            let grads = match reduction {
                Reduction::None => out.loss.sum().backward(),
                _ => out.loss.backward(),
            };
            let grad = values(xt.grad(&grads).unwrap());
            check(
                label,
                &format!("free backward {reduction:?}"),
                named(&expected, "grad_logits").check(&grad),
            );
        }

        // Logits the caller still holds are never overwritten by the in-place gradient.
        {
            let xt = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
            let kept = xt.clone();
            let out = functional::cross_entropy(
                xt.clone(),
                ints(&targets, device),
                None,
                Default::default(),
            );
            let _ = out.loss.backward();
            assert_eq!(
                values(kept.inner()),
                f64s(&x),
                "{label}: held logits were modified"
            );
            let plain = floats::<B, 2>(&x, [N, V], device);
            let kept = plain.clone();
            let _ =
                functional::cross_entropy(plain, ints(&targets, device), None, Default::default());
            assert_eq!(values(kept), f64s(&x), "{label}: held logits were modified");
        }

        // The primitive on the plain backend: loss rows and `grad_scale · ∂Σloss/∂x`, the
        // gradient possibly in place over the (unshared) logits.
        {
            const GRAD_SCALE: f32 = 0.25;
            let opts = CrossEntropyOptions::default()
                .with_lse_square_scale(1e-3)
                .with_softcap(Some(2.5))
                .with_return_z_loss(true);
            let weights = rng.vec(V, 0.5, 2.0, 0.0);
            // Rows as `Reduction::None` gives them, each row's gradient scaled.
            let expected = expected_with_options(
                &opts.with_reduction(Reduction::None),
                DType::F32,
                V,
                &xr,
                &targets,
                Some(&f64s(&weights)),
                &[f64::from(GRAD_SCALE); N],
                N,
            );
            let rows = B::fused_cross_entropy(
                floats::<B, 2>(&x, [N, V], device).into_primitive().tensor(),
                ints::<B>(&targets, device).into_primitive(),
                Some(
                    floats::<B, 1>(&weights, [V], device)
                        .into_primitive()
                        .tensor(),
                ),
                Some(
                    floats::<B, 1>(&[GRAD_SCALE], [1], device)
                        .into_primitive()
                        .tensor(),
                ),
                None,
                opts,
            );
            let wrap2 = |t| Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
            let wrap1 = |t| Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
            for (name, actual) in [
                ("loss", values(wrap1(rows.loss))),
                ("z_loss", values(wrap1(rows.z_loss.unwrap()))),
                ("grad_logits", values(wrap2(rows.grad_logits.unwrap()))),
            ] {
                let expected = named(&expected, name);
                check(label, "primitive", expected.check(&actual));
                assert_rejects_wrong(expected, &format!("{label} primitive"));
            }
        }

        // Without the target check, out-of-range targets behave like ignored rows.
        {
            let mut bad = targets.clone();
            bad[1] = V as i64 + 3;
            bad[4] = -7;
            let opts = CrossEntropyOptions::default().with_check_targets(false);
            let expected = expected_with_options(&opts, DType::F32, V, &xr, &bad, None, &[1.0], N);
            let xt = floats::<A<B>, 2>(&x, [N, V], device).require_grad();
            let out = functional::cross_entropy(xt.clone(), ints(&bad, device), None, opts);
            let grads = out.loss.clone().backward();
            check(
                label,
                "unchecked targets",
                named(&expected, "loss").check(&values(out.loss.inner())),
            );
            check(
                label,
                "unchecked targets",
                named(&expected, "grad_logits").check(&values(xt.grad(&grads).unwrap())),
            );
        }
        eprintln!("{label}: special cases ok");
    }
}

#[test]
fn all_ignored_free_backward_in_place_and_unchecked_targets() {
    liger_tests::for_each_backend(&mut SpecialCases {
        rng: liger_tests::fresh_rng(),
    });
}

struct BadInputs;

impl BackendVisitor for BadInputs {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let logits = || floats::<B, 2>(&[0.5; 40], [4, 10], device);
        let ce = |logits, targets: &[i64], weight: Option<Tensor<B, 1>>, opts| {
            let t = ints::<B>(targets, device);
            let _ = functional::cross_entropy(logits, t, weight, opts);
        };
        let opts = CrossEntropyOptions::default();
        let msg = panic_message(|| ce(logits(), &[0, 3, 12, 1], None, opts));
        assert_mentions(label, &msg, &["cross_entropy", "target 12", "[0, 10)"]);
        let msg = panic_message(|| ce(logits(), &[0, -5, 2, 1], None, opts));
        assert_mentions(label, &msg, &["cross_entropy", "target -5", "[0, 10)"]);
        // A custom ignore_index: -100 is then out of range.
        let msg = panic_message(|| ce(logits(), &[0, -100, 2, 1], None, opts.with_ignore_index(3)));
        assert_mentions(label, &msg, &["cross_entropy", "-100", "ignore_index 3"]);
        let msg = panic_message(|| ce(logits(), &[0, 1, 2], None, opts));
        assert_mentions(label, &msg, &["cross_entropy", "targets", "[3]", "[4, 10]"]);
        let w = floats::<B, 1>(&[1.0; 9], [9], device);
        let msg = panic_message(|| ce(logits(), &[0, 1, 2, 3], Some(w), opts));
        assert_mentions(
            label,
            &msg,
            &["cross_entropy", "class_weight", "[9]", "[4, 10]"],
        );
        let empty = Tensor::<B, 2>::empty([0, 10], device);
        let msg = panic_message(|| ce(empty, &[], None, opts));
        assert_mentions(label, &msg, &["cross_entropy", "empty", "[0, 10]"]);
        let msg = panic_message(|| {
            ce(
                logits(),
                &[0, 1, 2, 3],
                None,
                opts.with_label_smoothing(1.5),
            )
        });
        assert_mentions(label, &msg, &["cross_entropy", "label_smoothing", "1.5"]);
        let msg = panic_message(|| ce(logits(), &[0, 1, 2, 3], None, opts.with_softcap(Some(0.0))));
        assert_mentions(label, &msg, &["cross_entropy", "softcap"]);
        eprintln!("{label}: bad inputs rejected");
    }
}

/// `FusedOps::fused_target_stats` against f64 sums over the targets: the mean's `1 / Σ w[y]`
/// and `1 / n` and the count of out-of-range targets, with and without class weights, a
/// custom `ignore_index`, an all-ignored batch, and more targets than a cube has units.
struct TargetStatsCases {
    rng: Rng,
}

/// `[weight_scale, row_scale, out_of_range]` over `targets`, in f64, with their f32 bounds:
/// `Σ w` summed in f32 in any order, then one division (2 ulp).
fn target_stats_reference(
    targets: &[i64],
    weights: Option<&[f32]>,
    vocab: usize,
    ignore_index: i64,
) -> [Expected; 3] {
    let counted: Vec<usize> = targets
        .iter()
        .filter(|&&t| t != ignore_index && (0..vocab as i64).contains(&t))
        .map(|&t| t as usize)
        .collect();
    let out_of_range = targets
        .iter()
        .filter(|&&t| t != ignore_index && !(0..vocab as i64).contains(&t))
        .count() as f64;
    let w: f64 = counted
        .iter()
        .map(|&t| weights.map_or(1.0, |w| f64::from(w[t])))
        .sum();
    let n = counted.len() as f64;
    let reciprocal = |d: f64, sum_error: f64| {
        if d == 0.0 {
            (0.0, 0.0)
        } else {
            (1.0 / d, (sum_error / d + 2.0 * ULP32) / d)
        }
    };
    let (ws, ws_bound) = reciprocal(w, accumulation(counted.len(), w.abs()));
    let (rs, rs_bound) = reciprocal(n, 0.0);
    [
        Expected::new("weight_scale", vec![ws], vec![ws_bound], 1),
        Expected::new("row_scale", vec![rs], vec![rs_bound], 1),
        Expected::new("out_of_range", vec![out_of_range], vec![0.0], 1),
    ]
}

impl BackendVisitor for TargetStatsCases {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let rng = &mut self.rng;
        for (rows, ignore_index, weighted, all_ignored) in [
            (23, -100, false, false),
            (23, -100, true, false),
            (3001, 3, true, false),
            (3001, -100, false, false),
            (17, -100, true, true),
        ] {
            let case = format!("{rows} rows, ignore_index {ignore_index}, weighted {weighted}");
            let targets: Vec<i64> = (0..rows)
                .map(|_| match rng.below(10) {
                    _ if all_ignored => ignore_index,
                    0 => ignore_index,
                    1 => -100,
                    2 => V as i64 + rng.below(5) as i64,
                    3 => -1 - rng.below(5) as i64,
                    _ => rng.below(V) as i64,
                })
                .collect();
            let weights = rng.vec(V, 0.5, 2.0, 0.0);
            let weights = weighted.then_some(weights.as_slice());
            let expected = target_stats_reference(&targets, weights, V, ignore_index);
            liger_verify::conformance::poison::<B>(&[1], DType::F32, device);
            let stats = B::fused_target_stats(
                ints::<B>(&targets, device).into_primitive(),
                weights.map(|w| floats::<B, 1>(w, [V], device).into_primitive().tensor()),
                V,
                ignore_index,
            );
            let wrap = |t| Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
            // The checks read the count through `start_read`, queued before later work
            // (here: a sum that reuses nothing of it) and waited for after it.
            let started = B::start_read(stats.out_of_range.clone());
            let later = wrap(stats.out_of_range.clone()).add_scalar(1.0);
            let read: Vec<f64> = started.wait().iter::<f32>().map(f64::from).collect();
            check(
                label,
                &format!("{case} (started read)"),
                expected[2].check(&read),
            );
            drop(later);
            // The reference without the last tenth of the targets: what a kernel that
            // skipped rows would give.
            let kept = rows - (rows / 10).max(1);
            let dropped = target_stats_reference(&targets[..kept], weights, V, ignore_index);
            for ((expected, actual), dropped) in expected
                .iter()
                .zip([stats.weight_scale, stats.row_scale, stats.out_of_range])
                .zip(&dropped)
            {
                check(label, &case, expected.check(&values(wrap(actual))));
                if expected.values[0] != 0.0 {
                    assert_rejects_wrong(expected, &format!("{label} {case}"));
                }
                if dropped.values != expected.values {
                    assert!(
                        !expected.check(&dropped.values).passed,
                        "{label} {case} {}: the bounds accept the targets' last rows dropped",
                        expected.tensor
                    );
                }
            }
        }
        eprintln!("{label}: target statistics ok");
    }
}

#[test]
fn target_stats_match_reference() {
    liger_tests::for_each_backend(&mut TargetStatsCases {
        rng: liger_tests::fresh_rng(),
    });
}

#[test]
fn bad_inputs_are_rejected_with_clear_errors() {
    liger_tests::for_each_backend(&mut BadInputs);
}

#[test]
fn dtype_checks_name_op_shape_and_dtype() {
    let opts = CrossEntropyOptions::default();
    let inputs = |logits: DType, targets: DType, kernel| validate::CrossEntropyInputs {
        op: "cross_entropy",
        logits: (Shape::new([4, 10]), logits),
        targets: (Shape::new([4]), targets),
        class_weight: None,
        grad_scale: None,
        z_loss_scale: None,
        kernel_dtypes: kernel,
    };
    // Non-integer targets.
    let err = validate::cross_entropy(&inputs(DType::F32, DType::F32, true), &opts).unwrap_err();
    assert_mentions(
        "validate",
        &err.0,
        &["cross_entropy", "integer", "F32", "[4]"],
    );
    // Logits the kernels do not read (the fallback composes stock ops: f64 is fine there).
    let err = validate::cross_entropy(&inputs(DType::F64, DType::I32, true), &opts).unwrap_err();
    assert_mentions(
        "validate",
        &err.0,
        &["cross_entropy", "unsupported dtype F64", "[4, 10]"],
    );
    assert!(validate::cross_entropy(&inputs(DType::F64, DType::I64, false), &opts).is_ok());
    // Integer logits.
    let err = validate::cross_entropy(&inputs(DType::I32, DType::I32, false), &opts).unwrap_err();
    assert_mentions("validate", &err.0, &["cross_entropy", "float", "I32"]);
    // The kernel reads i32/i64 targets only (the CubeCL layer widens others to i32).
    use burn_cubecl::cubecl::ir::{ElemType, IntKind, StorageType};
    let i16 = StorageType::Scalar(ElemType::Int(IntKind::I16));
    let err =
        liger_cubecl_kernels::cross_entropy::check_target_dtype("cross_entropy", i16).unwrap_err();
    assert!(err.to_string().contains("cross_entropy"), "{err}");
}

/// `fused_cross_entropy_backward` on its own, against `G · r / s` in f64: a random stored
/// gradient (never zero), incoming per-row gradients of which every third equals the scale
/// (those rows must come back bit for bit) and the others do not, a zero scale on one row,
/// and a scalar scale. A gradient the caller still holds must stay as it was in the
/// caller's copy (the kernel writes in place only over a buffer nobody else holds); on
/// CubeCL backends the unshared one goes through the kernel.
struct BackwardRescale {
    rng: Rng,
}

impl BackendVisitor for BackwardRescale {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let fused = !label.starts_with("ndarray");
        let prim2 = |t: Tensor<B, 2>| t.into_primitive().tensor();
        let prim1 = |t: Tensor<B, 1>| t.into_primitive().tensor();
        let wrap = |t| Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
        for dtype in liger_tests::dtypes::<B>(device) {
            for (per_row, held) in [(true, false), (false, false), (true, true)] {
                let rng = &mut self.rng;
                // Uploaded flat and reshaped (a 2-D upload may get padded rows on CUDA, and
                // a strided gradient rightly takes the composition) and read from a twin
                // built the same way (a read of `stored` itself may leave the runtime
                // holding its buffer).
                let raw: Vec<f32> = rng.vec(N * V, 0.1, 1.0, 0.0).iter().map(|x| -x).collect();
                let build = || {
                    floats::<B, 1>(&raw, [N * V], device)
                        .reshape([N, V])
                        .cast(dtype)
                };
                let stored = build();
                let stored_values = values(build());
                let s: Vec<f32> = if per_row {
                    (0..N)
                        .map(|i| {
                            if i == 4 {
                                0.0
                            } else {
                                0.25 + rng.uniform() as f32
                            }
                        })
                        .collect()
                } else {
                    vec![0.37]
                };
                let s_of = |i: usize| s[if per_row { i } else { 0 }];
                let r: Vec<f32> = (0..N)
                    .map(|i| {
                        if i % 3 == 0 {
                            s_of(i)
                        } else {
                            0.5 + rng.uniform() as f32
                        }
                    })
                    .collect();
                // Each element `x·(r/s)`: an f32 division and product, then the store.
                let u = unit_roundoff(dtype);
                let (expected, bounds): (Vec<f64>, Vec<f64>) = (0..N * V)
                    .map(|k| {
                        let (i, c) = (k / V, k % V);
                        let x = stored_values[i * V + c];
                        if r[i] == s_of(i) {
                            return (x, 0.0);
                        }
                        if s_of(i) == 0.0 {
                            return (0.0, 0.0);
                        }
                        let t = Tracked::exact(f64::from(r[i]))
                            .div(Tracked::exact(f64::from(s_of(i))))
                            .mul(Tracked::exact(x));
                        (t.v, (1.0 + u) * t.e + u * t.v.abs() + flush(dtype, t.v))
                    })
                    .unzip();
                let expected = Expected::new("grad_logits", expected, bounds, N);
                let before = counters::get(Kernel::cross_entropy_backward);
                let keep = held.then(|| stored.clone());
                let out = values(wrap(B::fused_cross_entropy_backward(
                    prim2(stored),
                    prim1(floats::<B, 1>(&r, [N], device)),
                    prim1(floats::<B, 1>(&s, [s.len()], device)),
                )));
                let case = format!("{dtype:?} per_row {per_row} held {held}");
                check(label, &case, expected.check(&out));
                assert_rejects_wrong(&expected, &format!("{label} {case}"));
                for i in (0..N).step_by(3) {
                    assert_eq!(
                        out[i * V..(i + 1) * V],
                        stored_values[i * V..(i + 1) * V],
                        "{label} {case}: row {i} (incoming gradient = scale) changed"
                    );
                }
                if let Some(keep) = keep {
                    assert_eq!(
                        values(keep),
                        stored_values,
                        "{label} {case}: the caller's copy of the gradient changed"
                    );
                }
                let ran = counters::get(Kernel::cross_entropy_backward) > before;
                assert_eq!(
                    ran,
                    fused && !held,
                    "{label} {case}: the backward kernel ran: {ran}"
                );
            }
        }
        eprintln!("{label}: backward rescale ok");
    }
}

#[test]
fn backward_rescales_rows_on_the_device() {
    liger_tests::for_each_backend(&mut BackwardRescale {
        rng: liger_tests::fresh_rng(),
    });
}

/// Non-integer targets reaching the entry on the plain CubeCL backend of the test device's
/// runtime, whose int and float tensors share a type (so nothing but the entry's check
/// stops them; the primitive assumes valid input).
#[test]
fn cube_entry_rejects_float_targets() {
    fn on<R: burn_cubecl::CubeRuntime>(device: &R::Device) {
        type Plain<R> = burn_cubecl::CubeBackend<R, f32, i32, u32>;
        let msg = panic_message(|| {
            let logits = floats::<Plain<R>, 2>(&[0.5; 40], [4, 10], device);
            let targets = floats::<Plain<R>, 1>(&[1.0; 4], [4], device);
            let targets = Tensor::<Plain<R>, 1, burn::tensor::Int>::from_primitive(
                targets.into_primitive().tensor(),
            );
            let _ =
                functional::cross_entropy(logits, targets, None, CrossEntropyOptions::default());
        });
        assert_mentions("cube", &msg, &["cross_entropy", "integer", "F32", "[4]"]);
    }
    match liger_tests::device_name().as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" => on::<burn::backend::wgpu::WgpuRuntime>(&burn::backend::wgpu::WgpuDevice::Cpu),
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "vulkan" => on::<burn::backend::wgpu::WgpuRuntime>(&Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => on::<cubecl::cuda::CudaRuntime>(&Default::default()),
        _ => {}
    }
}

/// The full (non-quick) sweep of every cross-entropy variant: vocabularies up to 262,144
/// and 65,536 rows. Too slow for CI on a software rasterizer; run it on a real device with
/// `cargo test -p liger-tests --test cross_entropy -- --ignored`.
#[test]
#[ignore = "full sweep (vocabularies up to 262,144): too slow on a software rasterizer; run on a GPU with --ignored"]
fn cross_entropy_full_sweep() {
    liger_tests::check_ops_full(Op::is_cross_entropy);
}
