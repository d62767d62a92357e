//! RoPE: rotated q/k and both gradients against the f64 reference (both layouts, every
//! backend of the test device, every dtype it has, the shape table of
//! `conformance::rope`), against stock Burn (`burn::nn::RotaryEncoding` for the
//! interleaved layout, a stock-op `rotate_half` composition for the Hugging Face one),
//! one kernel launch per forward and per backward, one-sided gradients, the cos/sin
//! tables (Llama 3.1 scaling against an independent f64 implementation), and bad input.

use burn::backend::Autodiff;
use burn::nn::RotaryEncodingConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorData};
use liger_burn::functional::{rope, rope_tables};
use liger_burn::nn::RopeConfig;
use liger_burn::ops::validate::{self, RopeInputs};
use liger_burn::ops::{FusedOps, Llama3RopeScaling, RopeLayout};
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::BackendVisitor;
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::assert_rejects_wrong;
use liger_verify::conformance::bounds::{U32, ULP32, exp_error};
use liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE;
use liger_verify::conformance::{Expected, Op, Rng, compare_normwise};

#[test]
fn rope_rotate_half_matches_reference() {
    liger_tests::check_op(Op::RopeRotateHalf);
}

#[test]
fn rope_interleaved_matches_reference() {
    liger_tests::check_op(Op::RopeInterleaved);
}

/// The values of `t` as f64 (exact for every float dtype).
fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

fn random<B: Backend, const D: usize>(
    rng: &mut Rng,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(rng.vec(n, -2.0, 2.0, 0.0), shape), device)
}

/// How far two f32 evaluations of the rotation `y = v·cos ± v_pair·sin` (`|cos|, |sin| ≤ 1`,
/// the same f32 tables) may differ at each element of a `[..., d]` tensor whose rotated
/// inputs are `inputs` (same layout): each makes two products and a sum, within
/// `2u₃₂(1 + u₃₂)(|v| + |v_pair|)` of the exact rotation, so twice that apart.
fn rotation_bounds(inputs: &[f64], d: usize, layout: RopeLayout) -> Vec<f64> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let j = i % d;
            let pair = match layout {
                RopeLayout::Interleaved => j ^ 1,
                RopeLayout::RotateHalf => (j + d / 2) % d,
            };
            let m = v.abs() + inputs[i - j + pair].abs();
            2.0 * 2.0 * U32 * (1.0 + U32) * m
        })
        .collect()
}

/// The largest error of one entry (cos or sin of `pos·θ^(−2i/d)`) of a rotation table
/// Burn computes in f32 on a device (`RotaryEncoding`): the exponent `2i/d` (a division,
/// 2.5 ulp), times `ln θ` (rounded to f32, then a product), `exp` ([`exp_error`]), its
/// reciprocal (2.5 ulp) and the product with the position give the angle a relative
/// error; the angle's error passes to cos and sin whole (their slope is at most 1), and
/// the device's own sin/cos add Vulkan's required 2⁻¹¹ absolute (CUDA's and the host's
/// are within a few ulp, far inside it).
fn burn_table_error(pos: usize, i: usize, d: usize, theta: f64) -> f64 {
    let x = theta.ln() * (2 * i) as f64 / d as f64;
    let exponent = x * (2.5 * ULP32 + 2.0 * U32);
    let frequency = exponent + exp_error(x) + 2.5 * ULP32;
    let angle = pos as f64 * theta.powf(-((2 * i) as f64) / d as f64);
    angle * (frequency + U32) + 2f64.powi(-11)
}

/// `actual` against `expected`, two evaluations of the rotation of `inputs` (see
/// [`rotation_bounds`]). `stock_tf32`: the stock side went through a TF32 matmul (Burn's
/// `RotaryEncoding` rotates pairs with a matmul, TF32 on CUDA), so the comparison is
/// norm-wise within TF32's bound instead.
#[allow(clippy::too_many_arguments)]
fn assert_close(
    what: &str,
    label: &str,
    seed: u64,
    actual: &[f64],
    expected: &[f64],
    (inputs, d, layout): (&[f64], usize, RopeLayout),
    stock_tf32: bool,
) {
    let c = if stock_tf32 {
        compare_normwise("", actual, expected, TF32_NORMWISE)
    } else {
        let bounds = rotation_bounds(inputs, d, layout);
        let rotation = Expected::new("", expected.to_vec(), bounds, expected.len() / d);
        assert_rejects_wrong(&rotation, &format!("{label}: {what}"));
        rotation.check(actual)
    };
    assert!(
        c.passed,
        "{label}: {what} differs from stock Burn: max abs {:.3e}, {:.2} of its bound (seed {seed})",
        c.max_abs, c.max_used
    );
}

/// Hugging Face's `rotate_half`, written with stock tensor ops.
fn rotate_half<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let d = x.dims()[3];
    let x1 = x.clone().narrow(3, 0, d / 2);
    let x2 = x.narrow(3, d / 2, d / 2);
    Tensor::cat(vec![-x2, x1], 3)
}

/// Fused RoPE of q and k (GQA, q given as a transposed view) with a random upstream
/// gradient, against stock Burn: `RotaryEncoding` (interleaved) or the HF formula.
struct AgainstStock;

impl BackendVisitor for AgainstStock {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        type A<B> = Autodiff<B>;
        let mut rng = liger_tests::fresh_rng();
        let seed = rng.seed();
        let tf32 = liger_tests::stock_matmul_is_tf32::<B>((64, 2, 64), device, &mut rng);
        let (b, hq, hk, s, d) = (2, 4, 2, 11, 24);
        let max_seq = 40;
        let start = 7;
        let rotary = RotaryEncodingConfig::new(max_seq, d).init::<A<B>>(device);
        for layout in [RopeLayout::Interleaved, RopeLayout::RotateHalf] {
            let q_in = random::<B, 4>(&mut rng, [b, s, hq, d], device);
            let k_in = random::<B, 4>(&mut rng, [b, hk, s, d], device);
            let gq = random::<B, 4>(&mut rng, [b, hq, s, d], device);
            let gk = random::<B, 4>(&mut rng, [b, hk, s, d], device);
            // Tables for positions start..start + s: Burn's own for the interleaved layout.
            let (cos, sin) = match layout {
                RopeLayout::Interleaved => {
                    let freq = rotary
                        .freq_complex
                        .clone()
                        .inner()
                        .slice([start..start + s]);
                    (
                        freq.clone().narrow(2, 0, 1).reshape([1, s, d]),
                        freq.narrow(2, 1, 1).reshape([1, s, d]),
                    )
                }
                RopeLayout::RotateHalf => rope_tables::<B>(
                    10_000.0,
                    d,
                    start..start + s,
                    None,
                    layout,
                    DType::F32,
                    device,
                ),
            };
            let stock =
                |x: Tensor<A<B>, 4>, cos: &Tensor<A<B>, 3>, sin: &Tensor<A<B>, 3>| match layout {
                    RopeLayout::Interleaved => rotary.apply(x, start),
                    RopeLayout::RotateHalf => {
                        let c = cos.clone().unsqueeze_dim::<4>(1);
                        let sn = sin.clone().unsqueeze_dim::<4>(1);
                        x.clone() * c + rotate_half(x) * sn
                    }
                };
            let run = |fused: bool| {
                // q reaches the op as a transposed view of a `[b, s, hq, d]` leaf.
                let q_leaf = Tensor::<A<B>, 4>::from_inner(q_in.clone()).require_grad();
                let q = q_leaf.clone().swap_dims(1, 2);
                let k = Tensor::<A<B>, 4>::from_inner(k_in.clone()).require_grad();
                let (cos, sin) = (
                    Tensor::<A<B>, 3>::from_inner(cos.clone()),
                    Tensor::<A<B>, 3>::from_inner(sin.clone()),
                );
                let (qo, ko) = if fused {
                    rope(q.clone(), k.clone(), cos, sin, layout)
                } else {
                    (stock(q.clone(), &cos, &sin), stock(k.clone(), &cos, &sin))
                };
                let loss = (qo.clone() * Tensor::from_inner(gq.clone())).sum()
                    + (ko.clone() * Tensor::from_inner(gk.clone())).sum();
                let grads = loss.backward();
                [
                    values(qo.inner()),
                    values(ko.inner()),
                    values(q_leaf.grad(&grads).expect("grad of q")),
                    values(k.grad(&grads).expect("grad of k")),
                ]
            };
            let (fused, stock) = (run(true), run(false));
            // What each result rotates, in its layout: q's output is `[b, hq, s, d]`, its
            // leaf (and gradient) `[b, s, hq, d]`.
            let rotated = [
                values(q_in.clone().swap_dims(1, 2)),
                values(k_in.clone()),
                values(gq.clone().swap_dims(1, 2)),
                values(gk.clone()),
            ];
            for (name, ((f, s), inputs)) in ["q", "k", "grad_q", "grad_k"]
                .iter()
                .zip(fused.iter().zip(&stock).zip(&rotated))
            {
                let stock_tf32 = tf32 && layout == RopeLayout::Interleaved;
                assert_close(
                    &format!("{layout:?} {name}"),
                    label,
                    seed,
                    f,
                    s,
                    (inputs, d, layout),
                    stock_tf32,
                );
            }
        }
    }
}

#[test]
fn rope_matches_stock_burn() {
    liger_tests::for_each_backend(&mut AgainstStock);
}

/// `nn::Rope` (interleaved, its own f64 tables, a KV-cache offset) against
/// `burn::nn::RotaryEncoding::apply` with the same offset.
struct ModuleAgainstBurn;

impl BackendVisitor for ModuleAgainstBurn {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let mut rng = liger_tests::fresh_rng();
        let seed = rng.seed();
        let tf32 = liger_tests::stock_matmul_is_tf32::<B>((64, 2, 64), device, &mut rng);
        let (b, hq, hk, s, d, max_seq, start) = (2, 3, 1, 9, 20, 48, 30);
        let module = RopeConfig::new(d, max_seq)
            .with_layout(RopeLayout::Interleaved)
            .init::<B>(DType::F32, device);
        let rotary = RotaryEncodingConfig::new(max_seq, d).init::<B>(device);
        let q = random::<B, 4>(&mut rng, [b, hq, s, d], device);
        let k = random::<B, 4>(&mut rng, [b, hk, s, d], device);
        let (qo, ko) = module.forward(q.clone(), k.clone(), start);
        for (name, x, ours, theirs) in [
            ("q", q.clone(), qo, rotary.apply(q, start)),
            ("k", k.clone(), ko, rotary.apply(k, start)),
        ] {
            let (x, ours, theirs) = (values(x), values(ours), values(theirs));
            if tf32 {
                // Burn's pairs are rotated by a TF32 matmul here.
                let c = compare_normwise("", &ours, &theirs, TF32_NORMWISE);
                assert!(
                    c.passed,
                    "{label}: nn::Rope {name} vs RotaryEncoding (TF32): {c:?} (seed {seed})"
                );
                continue;
            }
            // Two f32 rotations, the module's table the f64 one rounded once and Burn's
            // built in f32 on the device (`burn_table_error`).
            let mut bounds = rotation_bounds(&x, d, RopeLayout::Interleaved);
            for (at, bound) in bounds.iter_mut().enumerate() {
                let (pos, j) = (start + (at / d) % s, at % d);
                let pair = x[at].abs() + x[at - j + (j ^ 1)].abs();
                *bound += pair * (burn_table_error(pos, j / 2, d, 10_000.0) + U32);
            }
            let rotation = Expected::new("", ours, bounds, x.len() / d);
            assert_rejects_wrong(&rotation, &format!("{label}: nn::Rope {name}"));
            let c = rotation.check(&theirs);
            assert!(
                c.passed,
                "{label}: nn::Rope {name} vs RotaryEncoding: max abs {:.3e}, {:.2} of its bound (seed {seed})",
                c.max_abs, c.max_used
            );
        }
    }
}

#[test]
fn rope_module_matches_burn_rotary_encoding() {
    liger_tests::for_each_backend(&mut ModuleAgainstBurn);
}

/// One forward and one backward launch per training step; one-sided gradients.
struct Launches;

impl BackendVisitor for Launches {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        type A<B> = Autodiff<B>;
        let fused = !label.starts_with("ndarray");
        let mut rng = liger_tests::fresh_rng();
        let seed = rng.seed();
        let (b, hq, hk, s, d) = (2, 6, 2, 5, 16);
        let layout = RopeLayout::RotateHalf;
        let (cos, sin) = rope_tables::<B>(500_000.0, d, 0..s, None, layout, DType::F32, device);
        let q_in = random::<B, 4>(&mut rng, [b, hq, s, d], device);
        let k_in = random::<B, 4>(&mut rng, [b, hk, s, d], device);
        let gq = random::<B, 4>(&mut rng, [b, hq, s, d], device);
        let gk = random::<B, 4>(&mut rng, [b, hk, s, d], device);
        let (gq_values, gk_values) = (values(gq.clone()), values(gk.clone()));
        // The reference gradients: both tracked, both in the loss.
        let (rq, rk) = (
            values(B::fused_rope_backward_ref(&gq, &cos, &sin, layout)),
            values(B::fused_rope_backward_ref(&gk, &cos, &sin, layout)),
        );
        let counts = || {
            (
                counters::get(Kernel::rope_forward),
                counters::get(Kernel::rope_backward),
            )
        };
        // (track q, track k, q in loss, k in loss)
        for (tq, tk, use_q, use_k) in [
            (true, true, true, true),
            (true, true, true, false),
            (true, true, false, true),
            (true, false, true, true),
            (false, true, true, true),
        ] {
            let q = Tensor::<A<B>, 4>::from_inner(q_in.clone());
            let k = Tensor::<A<B>, 4>::from_inner(k_in.clone());
            let q = if tq { q.require_grad() } else { q };
            let k = if tk { k.require_grad() } else { k };
            let before = counts();
            let (qo, ko) = rope(
                q.clone(),
                k.clone(),
                Tensor::from_inner(cos.clone()),
                Tensor::from_inner(sin.clone()),
                layout,
            );
            let mut loss = Tensor::<A<B>, 1>::zeros([1], device);
            if use_q {
                loss = loss + (qo * Tensor::from_inner(gq.clone())).sum();
            }
            if use_k {
                loss = loss + (ko * Tensor::from_inner(gk.clone())).sum();
            }
            let grads = loss.backward();
            let grad_q = q.grad(&grads).map(values);
            let grad_k = k.grad(&grads).map(values);
            let case = format!("{label}: track ({tq}, {tk}), in loss ({use_q}, {use_k})");
            assert_eq!(grad_q.is_some(), tq && use_q, "{case}: grad of q present");
            assert_eq!(grad_k.is_some(), tk && use_k, "{case}: grad of k present");
            if let Some(g) = grad_q {
                let inputs = (&gq_values[..], d, layout);
                assert_close("grad_q", &case, seed, &g, &rq, inputs, false);
            }
            if let Some(g) = grad_k {
                let inputs = (&gk_values[..], d, layout);
                assert_close("grad_k", &case, seed, &g, &rk, inputs, false);
            }
            if fused {
                let after = counts();
                assert_eq!(after.0 - before.0, 1, "{case}: forward launches");
                assert_eq!(after.1 - before.1, 1, "{case}: backward launches");
            }
        }
    }
}

/// The gradient of one rotated tensor, through the stock-op composition.
trait BackwardRef: Backend {
    fn fused_rope_backward_ref(
        g: &Tensor<Self, 4>,
        cos: &Tensor<Self, 3>,
        sin: &Tensor<Self, 3>,
        layout: RopeLayout,
    ) -> Tensor<Self, 4>;
}

impl<B: Backend> BackwardRef for B {
    fn fused_rope_backward_ref(
        g: &Tensor<B, 4>,
        cos: &Tensor<B, 3>,
        sin: &Tensor<B, 3>,
        layout: RopeLayout,
    ) -> Tensor<B, 4> {
        let grads = liger_burn::ops::compose::rope::backward::<B>(
            Some(g.clone().into_primitive().tensor()),
            None,
            cos.clone().into_primitive().tensor(),
            sin.clone().into_primitive().tensor(),
            layout,
        );
        Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(
            grads.grad_q.expect("grad given"),
        ))
    }
}

#[test]
fn rope_one_launch_each_way_and_one_sided_gradients() {
    liger_tests::for_each_backend(&mut Launches);
}

/// Independent f64 Llama 3.1 scaling, written from the formula in `transformers`.
fn llama3_inv_freq(theta: f64, d: usize, s: &Llama3RopeScaling) -> Vec<f64> {
    let pi = std::f64::consts::PI;
    (0..d / 2)
        .map(|i| {
            let f = theta.powf(-(2.0 * i as f64) / d as f64);
            let wavelen = 2.0 * pi / f;
            let old = s.original_max_position_embeddings as f64;
            let (lo, hi) = (old / s.low_freq_factor, old / s.high_freq_factor);
            if wavelen < hi {
                f
            } else if wavelen > lo {
                f / s.factor
            } else {
                let t =
                    (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - t) * f / s.factor + t * f
            }
        })
        .collect()
}

#[cfg(feature = "ndarray")]
#[test]
fn rope_tables_match_llama3_formula_and_burn() {
    use burn::backend::NdArray;
    type B = NdArray;
    let device = Default::default();
    let scaling = Llama3RopeScaling::llama3_1();
    let (theta, d) = (500_000.0, 128);
    let positions = [0usize, 1, 2, 17, 1000, 4095, 8191, 9000, 65_000, 131_071];
    let inv = llama3_inv_freq(theta, d, &scaling);
    // All three bands (kept, interpolated, divided) occur at this theta and head_dim.
    let old = scaling.original_max_position_embeddings as f64;
    let wavelens: Vec<f64> = (0..d / 2)
        .map(|i| 2.0 * std::f64::consts::PI * theta.powf(2.0 * i as f64 / d as f64))
        .collect();
    assert!(wavelens.iter().any(|w| *w < old / 4.0));
    assert!(wavelens.iter().any(|w| (old / 4.0..=old).contains(w)));
    assert!(wavelens.iter().any(|w| *w > old));
    for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
        for dtype in [DType::F32, DType::F64] {
            let (cos, sin) = rope_tables::<B>(
                theta,
                d,
                positions.iter().copied(),
                Some(scaling),
                layout,
                dtype,
                &device,
            );
            assert_eq!(cos.dims(), [1, positions.len(), d]);
            assert_eq!(cos.dtype(), dtype);
            let (cos, sin) = (values(cos), values(sin));
            for (p, pos) in positions.iter().enumerate() {
                for j in 0..d {
                    let i = match layout {
                        RopeLayout::RotateHalf => j % (d / 2),
                        RopeLayout::Interleaved => j / 2,
                    };
                    let angle = *pos as f64 * inv[i];
                    // Each formula's f64 inverse frequency is within 16 roundings (the
                    // power's exponent carries one, amplified by ln θ ≈ 13, and the
                    // interpolation band cancels about 4), so they are 32 apart, scaled by
                    // the angle, plus one rounding of cos and sin; f32 adds one rounding
                    // of a value in [-1, 1].
                    let f64_formulas = 32.0 * f64::EPSILON * (1.0 + angle);
                    let tol = if dtype == DType::F32 {
                        U32 + f64_formulas
                    } else {
                        f64_formulas
                    };
                    let at = p * d + j;
                    assert!(
                        (cos[at] - angle.cos()).abs() <= tol
                            && (sin[at] - angle.sin()).abs() <= tol,
                        "{layout:?} {dtype:?} position {pos} j {j}: ({}, {}) vs ({}, {})",
                        cos[at],
                        sin[at],
                        angle.cos(),
                        angle.sin()
                    );
                }
            }
        }
    }
    // Without scaling, the interleaved tables are Burn's RotaryEncoding tables (which it
    // computes in f32: its angles carry f32 rounding, hence the tolerance).
    let (s, d) = (64, 32);
    let rotary = RotaryEncodingConfig::new(s, d).init::<B>(&device);
    let (cos, sin) = rope_tables::<B>(
        10_000.0,
        d,
        0..s,
        None,
        RopeLayout::Interleaved,
        DType::F32,
        &device,
    );
    let freq = rotary.freq_complex.clone();
    let burn_cos = values(freq.clone().narrow(2, 0, 1).reshape([1, s, d]));
    let burn_sin = values(freq.narrow(2, 1, 1).reshape([1, s, d]));
    // Ours is the f64 table rounded once to f32 (checked above); Burn's within
    // `burn_table_error` of exact.
    let bounds: Vec<f64> = (0..2 * s * d)
        .map(|at| {
            let (pos, j) = ((at / d) % s, at % d);
            burn_table_error(pos, j / 2, d, 10_000.0) + U32
        })
        .collect();
    let ours: Vec<f64> = values(cos).into_iter().chain(values(sin)).collect();
    let burn: Vec<f64> = burn_cos.into_iter().chain(burn_sin).collect();
    let tables = Expected::new("", ours, bounds, 2 * s);
    assert_rejects_wrong(&tables, "rope_tables vs RotaryEncoding");
    let c = tables.check(&burn);
    assert!(
        c.passed,
        "rope_tables vs RotaryEncoding: max abs {:.3e}, {:.2} of its bound",
        c.max_abs, c.max_used
    );
}

fn t<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(vec![0.5f32; n], shape), device)
}

struct BadInputs;

impl BackendVisitor for BadInputs {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let l = RopeLayout::RotateHalf;
        let call = |q: [usize; 4], k: [usize; 4], c: [usize; 3], s: [usize; 3]| {
            panic_message(|| {
                rope(
                    t::<B, 4>(q, device),
                    t::<B, 4>(k, device),
                    t::<B, 3>(c, device),
                    t::<B, 3>(s, device),
                    l,
                );
            })
        };
        let cases: &[([usize; 4], [usize; 4], [usize; 3], [usize; 3], &[&str])] = &[
            // Odd head_dim.
            (
                [2, 4, 3, 5],
                [2, 2, 3, 5],
                [1, 3, 5],
                [1, 3, 5],
                &["rope", "head_dim must be even", "5", "[2, 4, 3, 5]"],
            ),
            // Batch, seq, head_dim mismatches between q and k.
            (
                [2, 4, 3, 8],
                [3, 2, 3, 8],
                [1, 3, 8],
                [1, 3, 8],
                &["rope", "[2, 4, 3, 8]", "[3, 2, 3, 8]", "batch"],
            ),
            (
                [2, 4, 3, 8],
                [2, 2, 4, 8],
                [1, 3, 8],
                [1, 3, 8],
                &["rope", "[2, 2, 4, 8]", "seq"],
            ),
            (
                [2, 4, 3, 8],
                [2, 2, 3, 6],
                [1, 3, 8],
                [1, 3, 8],
                &["rope", "[2, 2, 3, 6]", "head_dim"],
            ),
            // Tables of the wrong shape: batch neither 1 nor q's, wrong seq, wrong width,
            // cos and sin differing.
            (
                [2, 4, 3, 8],
                [2, 2, 3, 8],
                [3, 3, 8],
                [3, 3, 8],
                &["rope", "cos", "[1 or 2, 3, 8]", "[3, 3, 8]"],
            ),
            (
                [2, 4, 3, 8],
                [2, 2, 3, 8],
                [1, 3, 8],
                [1, 4, 8],
                &["rope", "sin", "[1, 4, 8]"],
            ),
            (
                [2, 4, 3, 8],
                [2, 2, 3, 8],
                [1, 3, 4],
                [1, 3, 4],
                &["rope", "cos", "[1, 3, 4]"],
            ),
            (
                [2, 4, 3, 8],
                [2, 2, 3, 8],
                [1, 3, 8],
                [2, 3, 8],
                &["rope", "cos", "sin", "[1, 3, 8]", "[2, 3, 8]"],
            ),
            // Empty.
            (
                [2, 4, 0, 8],
                [2, 2, 0, 8],
                [1, 0, 8],
                [1, 0, 8],
                &["rope", "empty", "[2, 4, 0, 8]"],
            ),
        ];
        for (q, k, c, s, parts) in cases {
            let msg = call(*q, *k, *c, *s);
            assert_mentions(label, &msg, parts);
        }
        if B::supports_dtype(device, DType::F16) {
            // Table dtype differs from q's.
            let msg = panic_message(|| {
                rope(
                    t::<B, 4>([1, 2, 3, 8], device),
                    t::<B, 4>([1, 1, 3, 8], device),
                    t::<B, 3>([1, 3, 8], device).cast(DType::F16),
                    t::<B, 3>([1, 3, 8], device),
                    l,
                );
            });
            assert_mentions(label, &msg, &["rope", "cos", "F16", "F32"]);
            // q and k dtypes differ.
            let msg = panic_message(|| {
                rope(
                    t::<B, 4>([1, 2, 3, 8], device),
                    t::<B, 4>([1, 1, 3, 8], device).cast(DType::F16),
                    t::<B, 3>([1, 3, 8], device),
                    t::<B, 3>([1, 3, 8], device),
                    l,
                );
            });
            assert_mentions(label, &msg, &["rope", "q", "k", "F16", "F32"]);
        }
    }
}

#[test]
fn rope_bad_inputs_are_rejected_with_clear_errors() {
    liger_tests::for_each_backend(&mut BadInputs);
}

#[test]
fn rope_dtype_checks_name_op_shape_and_dtype() {
    let inputs = |dtype: DType, kernel_dtypes: bool| RopeInputs {
        op: "rope",
        rotated: [
            Some(("q", Shape::new([1, 2, 3, 4]), dtype)),
            Some(("k", Shape::new([1, 1, 3, 4]), dtype)),
        ],
        cos: (Shape::new([1, 3, 4]), dtype),
        sin: (Shape::new([1, 3, 4]), dtype),
        kernel_dtypes,
    };
    let err = validate::rope(&inputs(DType::I32, false)).unwrap_err();
    assert_mentions(
        "validate",
        &err.0,
        &["rope", "float", "I32", "[1, 2, 3, 4]"],
    );
    let err = validate::rope(&inputs(DType::F64, true)).unwrap_err();
    assert_mentions(
        "validate",
        &err.0,
        &["rope", "unsupported dtype F64", "[1, 2, 3, 4]"],
    );
    // The stock-op fallback takes f64.
    assert!(validate::rope(&inputs(DType::F64, false)).is_ok());
}
