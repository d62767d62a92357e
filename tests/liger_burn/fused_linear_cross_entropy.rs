//! fused_linear_cross_entropy: loss and the gradients of x, the weight and the bias
//! against the f64 reference on every backend of the test device (both reduction paths,
//! every dtype it has), with several chunk counts (a last partial chunk), every reduction,
//! ignore_index; against stock Burn (`linear` + `CrossEntropyLoss`); the all-ignored batch
//! and bad input.

use liger_verify::conformance::Op;

#[test]
fn fused_linear_cross_entropy_matches_reference() {
    liger_tests::check_op(Op::FusedLinearCrossEntropy);
}

#[test]
fn fused_linear_cross_entropy_none_matches_reference() {
    liger_tests::check_op(Op::FusedLinearCrossEntropyNone);
}

#[test]
fn fused_linear_cross_entropy_sum_matches_reference() {
    liger_tests::check_op(Op::FusedLinearCrossEntropySum);
}

use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Tensor, backend::Backend};
use liger_burn::functional;
use liger_burn::ops::compose::linear_cross_entropy::automatic_chunk_rows;
use liger_burn::ops::{CrossEntropyOptions, FusedOps, Reduction};
use liger_burn::test_hooks::{OverrideGuard, override_chunk_rows};
use liger_tests::BackendVisitor;
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::{assert_rejects_wrong, check, floats, ints, named, values};
use liger_verify::conformance::linear_cross_entropy::{LinearInputs, TF32_NORMWISE, expected};
use liger_verify::conformance::{Expected, Rng, compare_normwise};

const N: usize = 37;
const V: usize = 100;
const H: usize = 45;

/// The chunk rows on this thread while held (`None`: the automatic size).
struct Chunk(#[allow(dead_code)] Option<OverrideGuard<usize>>);
impl Chunk {
    fn rows(rows: Option<usize>) -> Self {
        Chunk(rows.map(override_chunk_rows))
    }
}

struct Data {
    x: Vec<f32>,
    /// Burn's `Linear` layout, `[H, V]`.
    w: Vec<f32>,
    b: Vec<f32>,
    targets: Vec<i64>,
    class_weight: Vec<f32>,
    g: Vec<f32>,
}

impl Data {
    fn new(rng: &mut Rng) -> Self {
        Self {
            x: rng.vec(N * H, -1.0, 1.0, 0.0),
            w: rng.vec(H * V, -0.5, 0.5, 0.0),
            b: rng.vec(V, -0.5, 0.5, 0.0),
            targets: (0..N).map(|_| rng.below(V) as i64).collect(),
            class_weight: rng.vec(V, 0.5, 2.0, 0.0),
            g: rng.vec(N, 0.5, 1.5, 0.0),
        }
    }

    fn linear<B: Backend>(&self, device: &B::Device) -> Linear<B> {
        let mut linear = LinearConfig::new(H, V).init(device);
        linear.weight = Param::from_tensor(floats(&self.w, [H, V], device));
        linear.bias = Some(Param::from_tensor(floats(&self.b, [V], device)));
        linear
    }
}

/// Loss and gradients (x, weight `[H, V]`, bias) of a loss built on a `Linear`.
type Run = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn run<B: Backend>(
    data: &Data,
    device: &B::Device,
    loss: impl FnOnce(Tensor<Autodiff<B>, 2>, &Linear<Autodiff<B>>) -> Tensor<Autodiff<B>, 1>,
    upstream: Option<&[f32]>,
) -> Run {
    let x = floats::<Autodiff<B>, 2>(&data.x, [N, H], device).require_grad();
    let linear = data.linear::<Autodiff<B>>(device);
    let l = loss(x.clone(), &linear);
    let grads = match upstream {
        Some(g) => (l.clone() * floats::<Autodiff<B>, 1>(g, [g.len()], device))
            .sum()
            .backward(),
        None => l.clone().backward(),
    };
    let w = linear.weight.val();
    let b = linear.bias.as_ref().unwrap().val();
    (
        values(l.inner()),
        values(x.grad(&grads).unwrap()),
        values(w.grad(&grads).unwrap()),
        values(b.grad(&grads).unwrap()),
    )
}

/// The f64 reference of the data under `options` (class weights when `weighted`, the
/// bias when `bias`, the upstream gradient `g`), for an implementation taking `chunk` rows per product: `loss`
/// (and `z_loss`), `grad_x`, `grad_weight` (`[V, H]`), `grad_bias`, with their f32 bounds.
fn reference(
    data: &Data,
    options: &CrossEntropyOptions,
    (weighted, bias): (bool, bool),
    g: &[f32],
    chunk: usize,
) -> Vec<Expected> {
    let f = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (x, b, g, class_weight) = (f(&data.x), f(&data.b), f(g), f(&data.class_weight));
    // Burn's `Linear` holds `[H, V]`; the reference takes `[V, H]`.
    let w: Vec<f64> = (0..V * H)
        .map(|k| f64::from(data.w[(k % H) * V + k / H]))
        .collect();
    let inputs = LinearInputs {
        x: &x,
        w: &w,
        b: bias.then_some(&b[..]),
        targets: &data.targets,
        class_weight: weighted.then_some(&class_weight[..]),
        g: &g,
    };
    expected(options, DType::F32, (N, H, V), &inputs, chunk, &[N]).remove(0)
}

/// `[H, V]` (Burn's `Linear` weight layout) as `[V, H]`.
fn transposed(hv: &[f64]) -> Vec<f64> {
    (0..V * H).map(|k| hv[(k % H) * V + k / H]).collect()
}

/// The fused run and stock Burn's against the f64 reference: the fused result within its
/// bound (`fused_ref`, for its chunking), stock Burn's (one product: `stock_ref`) within
/// the sum of both bounds of the fused one (two f32 evaluations of one definition).
fn compare_runs(
    label: &str,
    case: &str,
    fused: &Run,
    stock: &Run,
    (fused_ref, stock_ref): (&[Expected], &[Expected]),
    tf32: bool,
) {
    if tf32 {
        // Stock Burn's products are TF32 here (the fused path's are true f32): every
        // result inherits their rounding, so norm-wise within TF32's bound.
        for (name, a, b) in [
            ("loss", &fused.0, &stock.0),
            ("grad_x", &fused.1, &stock.1),
            ("grad_weight", &fused.2, &stock.2),
            ("grad_bias", &fused.3, &stock.3),
        ] {
            check(label, case, compare_normwise(name, a, b, TF32_NORMWISE));
        }
        return;
    }
    for (name, f, st) in [
        ("loss", fused.0.clone(), stock.0.clone()),
        ("grad_x", fused.1.clone(), stock.1.clone()),
        ("grad_weight", transposed(&fused.2), transposed(&stock.2)),
        ("grad_bias", fused.3.clone(), stock.3.clone()),
    ] {
        let (ef, es) = (named(fused_ref, name), named(stock_ref, name));
        check(label, case, ef.check(&f));
        let against_stock = ef.against(st, &es.bounds);
        check(
            label,
            &format!("{case} (against Burn)"),
            against_stock.check(&f),
        );
        assert_rejects_wrong(ef, &format!("{label} {case}"));
    }
}

/// Against stock Burn (`Linear` + `CrossEntropyLoss`, or the log-softmax composition for
/// sum and none), at several chunk counts, through the functional API and the module.
struct StockParity {
    rng: Rng,
}

impl BackendVisitor for StockParity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let data = Data::new(&mut self.rng);
        let tf32 = liger_tests::stock_matmul_is_tf32::<B>((N, H, V), device, &mut self.rng);
        let t = ints::<Autodiff<B>>(&data.targets, device);
        let cw = floats::<Autodiff<B>, 1>(&data.class_weight, [V], device);
        let fused = |options: CrossEntropyOptions, weighted: bool| {
            let (t, cw) = (t.clone(), cw.clone());
            move |x: Tensor<Autodiff<B>, 2>, lin: &Linear<Autodiff<B>>| {
                functional::fused_linear_cross_entropy(
                    x,
                    lin.weight.val().transpose(),
                    lin.bias.as_ref().map(|b| b.val()),
                    t,
                    weighted.then_some(cw),
                    options,
                )
                .loss
            }
        };
        // Mean: Burn's CrossEntropyLoss (with weights and smoothing: same denominator
        // as PyTorch's when no row is padded). Chunks of 1, 4 (a last partial chunk), N
        // and the automatic size.
        let stock_mean = run::<B>(
            &data,
            device,
            |x, lin| {
                CrossEntropyLossConfig::new()
                    .init(device)
                    .forward(lin.forward(x), t.clone())
            },
            None,
        );
        let mean = CrossEntropyOptions::default();
        let stock_mean_ref = reference(&data, &mean, (false, true), &[1.0], N);
        for chunk in [Some(1), Some(4), Some(N), None] {
            let _chunk = Chunk::rows(chunk);
            let ours = run::<B>(&data, device, fused(mean, false), None);
            let rows = chunk.unwrap_or_else(|| automatic_chunk_rows(N, H, V));
            compare_runs(
                label,
                &format!("mean chunk {chunk:?}"),
                &ours,
                &stock_mean,
                (
                    &reference(&data, &mean, (false, true), &[1.0], rows),
                    &stock_mean_ref,
                ),
                tf32,
            );
        }
        let stock_ws = run::<B>(
            &data,
            device,
            |x, lin| {
                CrossEntropyLossConfig::new()
                    .with_weights(Some(data.class_weight.clone()))
                    .with_smoothing(Some(0.1))
                    .init(device)
                    .forward(lin.forward(x), t.clone())
            },
            Some(&data.g[..1]),
        );
        {
            let _chunk = Chunk::rows(Some(4));
            let smoothing = CrossEntropyOptions::default().with_label_smoothing(0.1);
            let ours = run::<B>(&data, device, fused(smoothing, true), Some(&data.g[..1]));
            let refs = |chunk| reference(&data, &smoothing, (true, true), &data.g[..1], chunk);
            compare_runs(
                label,
                "weights+smoothing",
                &ours,
                &stock_ws,
                (&refs(4), &refs(N)),
                tf32,
            );
        }
        // Sum and none against the log-softmax composition (none with per-row upstream
        // gradients: the backward's second chunked pass).
        let per_row = |x: Tensor<Autodiff<B>, 2>, lin: &Linear<Autodiff<B>>| {
            log_softmax(lin.forward(x), 1)
                .gather(1, t.clone().reshape([N, 1]))
                .reshape([N])
                .neg()
        };
        let stock_sum = run::<B>(
            &data,
            device,
            |x, lin| per_row(x, lin).sum(),
            Some(&data.g[..1]),
        );
        let stock_none = run::<B>(&data, device, per_row, Some(&data.g));
        let _chunk = Chunk::rows(Some(4));
        let sum = CrossEntropyOptions::default().with_reduction(Reduction::Sum);
        let ours = run::<B>(&data, device, fused(sum, false), Some(&data.g[..1]));
        let refs = |chunk| reference(&data, &sum, (false, true), &data.g[..1], chunk);
        compare_runs(label, "sum", &ours, &stock_sum, (&refs(4), &refs(N)), tf32);
        let none = CrossEntropyOptions::default().with_reduction(Reduction::None);
        let ours = run::<B>(&data, device, fused(none, false), Some(&data.g));
        let refs = |chunk| reference(&data, &none, (false, true), &data.g, chunk);
        compare_runs(
            label,
            "none",
            &ours,
            &stock_none,
            (&refs(4), &refs(N)),
            tf32,
        );
        // The module on a burn::nn::Linear.
        let module =
            liger_burn::nn::LinearCrossEntropyLossConfig::new().init::<Autodiff<B>>(device);
        let ours = run::<B>(
            &data,
            device,
            |x, lin| module.forward(x, lin, t.clone()),
            None,
        );
        let module_ref = reference(&data, &mean, (false, true), &[1.0], 4);
        compare_runs(
            label,
            "module",
            &ours,
            &stock_mean,
            (&module_ref, &stock_mean_ref),
            tf32,
        );
        eprintln!("{label}: matches stock Burn");
    }
}

#[test]
fn matches_stock_burn_at_every_chunk_count() {
    liger_tests::for_each_backend(&mut StockParity {
        rng: liger_tests::fresh_rng(),
    });
}

/// An all-ignored batch (loss 0, zero gradients), and the primitive without autodiff:
/// gradients only when asked for.
struct SpecialCases {
    rng: Rng,
}

impl BackendVisitor for SpecialCases {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let data = Data::new(&mut self.rng);
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let options = CrossEntropyOptions::default()
                .with_reduction(reduction)
                .with_return_z_loss(true)
                .with_lse_square_scale(1e-2);
            let (loss, gx, gw, gb) = run::<B>(
                &data,
                device,
                |x, lin| {
                    let out = functional::fused_linear_cross_entropy(
                        x,
                        lin.weight.val().transpose(),
                        lin.bias.as_ref().map(|b| b.val()),
                        ints(&[-100; N], device),
                        None,
                        options,
                    );
                    let z = values(out.z_loss.unwrap().inner());
                    assert!(z.iter().all(|v| *v == 0.0), "{label}: z-loss {z:?}");
                    out.loss
                },
                Some(&data.g[..if reduction == Reduction::None { N } else { 1 }]),
            );
            for (name, v) in [
                ("loss", loss),
                ("grad_x", gx),
                ("grad_w", gw),
                ("grad_b", gb),
            ] {
                assert!(
                    v.iter().all(|v| *v == 0.0),
                    "{label} all-ignored {reduction:?}: {name} not all zero"
                );
            }
        }
        // The primitive on the plain backend.
        let call = |compute_grad| {
            B::fused_linear_cross_entropy(
                floats::<B, 2>(&data.x, [N, H], device)
                    .into_primitive()
                    .tensor(),
                floats::<B, 2>(&data.w, [H, V], device)
                    .transpose()
                    .into_primitive()
                    .tensor(),
                None,
                ints::<B>(&data.targets, device).into_primitive(),
                None,
                compute_grad,
                CrossEntropyOptions::default(),
            )
        };
        let without = call(false);
        assert!(without.grad_x.is_none() && without.grad_weight.is_none());
        let with = call(true);
        assert!(with.grad_x.is_some() && with.grad_weight.is_some() && with.grad_bias.is_none());
        let loss = |t| {
            values(Tensor::<B, 1>::from_primitive(
                burn::tensor::TensorPrimitive::Float(t),
            ))
        };
        // Both losses within their bound of the f64 value.
        let expected = reference(
            &data,
            &CrossEntropyOptions::default(),
            (false, false),
            &[1.0],
            automatic_chunk_rows(N, H, V),
        );
        let expected = named(&expected, "loss");
        for (what, out) in [("with gradients", with.loss), ("without", without.loss)] {
            check(
                label,
                &format!("primitive {what}"),
                expected.check(&loss(out)),
            );
        }
        eprintln!("{label}: special cases ok");
    }
}

#[test]
fn all_ignored_and_primitive_without_autodiff() {
    liger_tests::for_each_backend(&mut SpecialCases {
        rng: liger_tests::fresh_rng(),
    });
}

struct BadInputs;

impl BackendVisitor for BadInputs {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let x = || floats::<B, 2>(&[0.5; 4 * 6], [4, 6], device);
        let w = |v: usize, h: usize| floats::<B, 2>(&vec![0.1; v * h], [v, h], device);
        let flce = |x, w, b: Option<Tensor<B, 1>>, t: &[i64]| {
            let _ = functional::fused_linear_cross_entropy(
                x,
                w,
                b,
                ints::<B>(t, device),
                None,
                CrossEntropyOptions::default(),
            );
        };
        let msg = panic_message(|| flce(x(), w(10, 5), None, &[0, 1, 2, 3]));
        assert_mentions(
            label,
            &msg,
            &["fused_linear_cross_entropy", "weight", "[10, 5]", "[4, 6]"],
        );
        let b = floats::<B, 1>(&[0.0; 9], [9], device);
        let msg = panic_message(|| flce(x(), w(10, 6), Some(b), &[0, 1, 2, 3]));
        assert_mentions(
            label,
            &msg,
            &["fused_linear_cross_entropy", "bias", "[9]", "[10]"],
        );
        let msg = panic_message(|| flce(x(), w(10, 6), None, &[0, 1, 10, 3]));
        assert_mentions(
            label,
            &msg,
            &["fused_linear_cross_entropy", "target 10", "[0, 10)"],
        );
        let msg = panic_message(|| flce(x(), w(10, 6), None, &[0, 1, 2]));
        assert_mentions(
            label,
            &msg,
            &["fused_linear_cross_entropy", "targets", "[3]"],
        );
        if B::supports_dtype(device, DType::F16) {
            let msg = panic_message(|| flce(x(), w(10, 6).cast(DType::F16), None, &[0, 1, 2, 3]));
            assert_mentions(label, &msg, &["fused_linear_cross_entropy", "F16", "F32"]);
        }
        eprintln!("{label}: bad inputs rejected");
    }
}

#[test]
fn bad_inputs_are_rejected_with_clear_errors() {
    liger_tests::for_each_backend(&mut BadInputs);
}

/// The full (non-quick) sweep of every fused linear cross-entropy variant (V up to
/// 128,256, 4096 rows). Too slow for CI on a software rasterizer; run it on a real device
/// with `cargo test --release -p liger-tests --test fused_linear_cross_entropy -- --ignored`.
#[test]
#[ignore = "full sweep (V up to 128,256, 4096 rows): too slow on a software rasterizer; run on a GPU with --ignored"]
fn fused_linear_cross_entropy_full_sweep() {
    liger_tests::check_ops_full(Op::is_linear_cross_entropy);
}
