//! LoRA: the fused LoRA linear layer (`functional::lora_linear`) and the fused linear cross
//! entropy with an adapter on the LM head (`functional::fused_linear_cross_entropy_lora`),
//! on every backend of the test device and every dtype it has, at odd shapes.
//!
//! Each result — the fused op's and the unfused composition's under Burn's autodiff (the
//! adapter path built from casts and matmuls; for the loss, materialized logits and a
//! cross entropy: Burn's stock log-softmax composition, or liger-burn's cross entropy for
//! the options Burn's has not) — is compared with an f64 reference that carries the
//! rounding bound of its formula (`liger_tests::bounded`): the output or loss and every
//! gradient (`x`, the adapter's separate input, `A`, `B`, and the weight and bias when they
//! are trained). Wrong outputs (zeros, doubled, a dropped row, shifted rows, a transposed
//! buffer) must exceed the same bounds. The frozen weight gets no gradient, and bad input
//! (rank 0, mismatched adapter, a trainable base weight) is refused naming the op and the
//! shapes. The linear layer's reference is the conformance suite's
//! (`liger_verify::conformance::lora_linear`), whose sweep (`liger check --op lora`) runs
//! here too.

use burn::backend::Autodiff;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional::{self, LoraHeadAdapter};
use liger_burn::ops::compose::linear_cross_entropy::automatic_chunk_rows;
use liger_burn::ops::{AdapterPrecision, CrossEntropyOptions, FusedOps, LoraOptions, Reduction};
use liger_burn::test_hooks::override_chunk_rows;
use liger_tests::BackendVisitor;
use liger_tests::bounded::{Bounded, U32, check_with_rejection, round, rounded, tensor, unit};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::values as host;
use liger_verify::conformance::compare_normwise;
use liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE;
use liger_verify::conformance::lora_linear::{self, Inputs, LoraShape, SCALE, Variant};
use liger_verify::conformance::{Op, Rng};

type AD<B> = Autodiff<B>;

/// [`check_with_rejection`], or, for a stock composition with f32 products (f32 inputs, or
/// f32 adapter products) on a device whose f32 matmul runs on TF32 tensor cores (Burn's
/// CUDA matmul: inputs rounded to 10 mantissa bits), a norm-wise comparison within TF32's
/// bound plus the composition's roundings to the result's dtype (`unit` each, see
/// [`StockOnTf32`]): that path's rounding is not f32's, and it is the premise, not the op
/// under test.
fn check_path(
    failures: &mut Vec<String>,
    what: &str,
    reference: &Bounded,
    actual: &[f64],
    stock_on_tf32: Option<StockOnTf32>,
) {
    if let Some(StockOnTf32 { dtype, roundings }) = stock_on_tf32 {
        let bound = TF32_NORMWISE + roundings as f64 * unit(dtype);
        let c = compare_normwise("", actual, &reference.v, bound);
        if !c.passed {
            failures.push(format!(
                "{what}: norm-wise error {:.3} of TF32's bound plus {roundings} {dtype:?} rounding(s)",
                c.max_used
            ));
        }
    } else {
        check_with_rejection(failures, what, reference, actual);
    }
}

/// The failures that count: all of the fused op's; of the stock composition (the model's
/// premise, not the op under test) all but its rejections of deliberately wrong outputs.
fn keep_failures(failures: &mut Vec<String>, found: Vec<String>, fused: bool) {
    if fused {
        failures.extend(found);
    } else {
        failures.extend(found.into_iter().filter(|m| !m.contains("wrong output")));
    }
}

/// A stock composition with f32 products on TF32 tensor cores, compared norm-wise by
/// [`check_path`]: its result dtype and how many times a result is rounded to it on the way
/// (the linear layer: once, the product; the LM head's loss and gradients through
/// materialized logits: three, the logits, their gradient and the gradient's product).
#[derive(Clone, Copy, Debug)]
struct StockOnTf32 {
    dtype: DType,
    roundings: u32,
}

/// [`StockOnTf32`] when the stock composition runs f32 products (f32 inputs, or f32 adapter
/// products) on TF32 tensor cores.
fn stock_on_tf32(
    fused: bool,
    tf32: bool,
    dtype: DType,
    precision: AdapterPrecision,
    roundings: u32,
) -> Option<StockOnTf32> {
    (!fused && tf32 && (dtype == DType::F32 || precision == AdapterPrecision::F32))
        .then_some(StockOnTf32 { dtype, roundings })
}

// ---------------------------------------------------------------------------------------
// The LoRA linear layer.

const LEAD: [usize; 2] = [3, 5];
const ROWS: usize = 15;
const D_IN: usize = 45;
const D_OUT: usize = 37;
const RANK: usize = 6;

/// The layer's inputs (`x`, the separate input `xa`, `w` in Burn's layout `[d_in, d_out]`,
/// the bias, `A`, `B`, the upstream gradient), drawn at this module's shape.
fn linear_data(rng: &mut Rng) -> Inputs {
    Inputs {
        x: rng.vec(ROWS * D_IN, -1.0, 1.0, 0.0),
        xa: rng.vec(ROWS * D_IN, -1.0, 1.0, 0.0),
        w: rng.vec(D_IN * D_OUT, -0.3, 0.3, 0.0),
        b: rng.vec(D_OUT, -0.5, 0.5, 0.0),
        a: rng.vec(RANK * D_IN, -0.3, 0.3, 0.0),
        bb: rng.vec(D_OUT * RANK, -0.3, 0.3, 0.0),
        g: rng.vec(ROWS * D_OUT, -1.0, 1.0, 0.0),
    }
}

/// The layer's variant: dtype, adapter precision, bias, separate adapter input.
type LinearCase = Variant;

/// The reference of the conformance suite's `lora_linear` op at this module's shape.
fn linear_reference(d: &Inputs, c: LinearCase) -> lora_linear::Reference {
    let shape = LoraShape {
        rows: ROWS,
        d_in: D_IN,
        d_out: D_OUT,
        rank: RANK,
    };
    lora_linear::reference_from(c, shape, d, rounded)
}

/// Output and gradients of the fused op (`fused`) or of the stock composition.
fn linear_run<B: FusedOps>(
    d: &Inputs,
    c: LinearCase,
    fused: bool,
    device: &B::Device,
) -> [Vec<f64>; 5] {
    let dt = c.dtype;
    let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    let [l0, l1] = LEAD;
    let x = tensor::<AD<B>, 3>(&f(&d.x), [l0, l1, D_IN], dt, device).require_grad();
    let xa = tensor::<AD<B>, 3>(&f(&d.xa), [l0, l1, D_IN], dt, device).require_grad();
    let w = tensor::<AD<B>, 2>(&f(&d.w), [D_IN, D_OUT], dt, device);
    let b = tensor::<AD<B>, 1>(&f(&d.b), [D_OUT], dt, device);
    let a = tensor::<AD<B>, 2>(&f(&d.a), [RANK, D_IN], DType::F32, device).require_grad();
    let bb = tensor::<AD<B>, 2>(&f(&d.bb), [D_OUT, RANK], DType::F32, device).require_grad();
    let options = LoraOptions::new(SCALE).with_precision(c.precision);
    let bias = c.bias.then(|| b.clone());
    let adapter_x = c.separate.then(|| xa.clone());
    let y = if fused {
        functional::lora_linear(
            x.clone(),
            w.clone(),
            bias,
            adapter_x,
            a.clone(),
            bb.clone(),
            options,
        )
    } else {
        // PEFT's `base(x) + lora_B(lora_A(x_a)) * s`, the scale on the rank-r side as the
        // fused op does, in stock Burn ops.
        let cd = c.precision.compute_dtype(dt);
        let x2 = x.clone().reshape([ROWS, D_IN]);
        let xa2 = adapter_x.unwrap_or(x.clone()).reshape([ROWS, D_IN]);
        let base = burn::tensor::module::linear(x2, w.clone(), bias);
        let h = xa2
            .cast(cd)
            .matmul(a.clone().cast(cd).transpose())
            .mul_scalar(SCALE);
        let ya = h.matmul(bb.clone().cast(cd).transpose());
        let y = if cd == DType::F32 && dt != DType::F32 {
            (base.cast(DType::F32) + ya).cast(dt)
        } else {
            base + ya
        };
        y.reshape([l0, l1, D_OUT])
    };
    let g = tensor::<AD<B>, 3>(&f(&d.g), [l0, l1, D_OUT], dt, device);
    let grads = (y.clone() * g).sum().backward();
    let grad = |t: &Tensor<AD<B>, 3>| t.grad(&grads).map(host).unwrap_or_default();
    let grad2 = |t: &Tensor<AD<B>, 2>| t.grad(&grads).map(host).unwrap_or_default();
    assert!(w.grad(&grads).is_none(), "the frozen weight got a gradient");
    [
        host(y.inner()),
        grad(&x),
        if c.separate { grad(&xa) } else { Vec::new() },
        grad2(&a),
        grad2(&bb),
    ]
}

struct LinearParity {
    rng: Rng,
    cases: usize,
}

impl BackendVisitor for LinearParity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let data = linear_data(&mut self.rng);
        let tf32 =
            liger_tests::stock_matmul_is_tf32::<B>((ROWS, D_IN, D_OUT), device, &mut self.rng);
        let mut failures = Vec::new();
        for dtype in liger_tests::dtypes::<B>(device) {
            for precision in [AdapterPrecision::F32, AdapterPrecision::Activation] {
                for (bias, separate) in [(true, false), (false, true), (true, true)] {
                    let c = LinearCase {
                        dtype,
                        precision,
                        bias,
                        separate,
                    };
                    let r = linear_reference(&data, c);
                    for fused in [true, false] {
                        let [y, gx, gxa, ga, gb] = linear_run::<B>(&data, c, fused, device);
                        let name = |t: &str| {
                            format!(
                                "{label} {c:?} {} {t}",
                                if fused { "fused" } else { "stock" }
                            )
                        };
                        let mut f = Vec::new();
                        let relaxed = stock_on_tf32(fused, tf32, dtype, precision, 1);
                        check_path(&mut f, &name("output"), &r.y, &y, relaxed);
                        let gx_ref = if fused { &r.gx } else { &r.gx_stock };
                        check_path(&mut f, &name("grad_x"), gx_ref, &gx, relaxed);
                        if separate {
                            check_path(&mut f, &name("grad_adapter_x"), &r.gxa, &gxa, relaxed);
                        }
                        check_path(&mut f, &name("grad_A"), &r.ga, &ga, relaxed);
                        check_path(&mut f, &name("grad_B"), &r.gb, &gb, relaxed);
                        keep_failures(&mut failures, f, fused);
                        self.cases += 1;
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "LIGER_SEED={} reproduces these:\n{}",
            self.rng.seed(),
            failures.join("\n")
        );
        eprintln!("{label}: lora_linear within its rounding bounds");
    }
}

#[test]
fn lora_linear_matches_reference_and_stock_composition() {
    let mut v = LinearParity {
        rng: liger_tests::fresh_rng(),
        cases: 0,
    };
    liger_tests::for_each_backend(&mut v);
    assert!(v.cases > 0);
}

/// The conformance suite's quick sweep of both variants (`liger check --op lora_linear
/// --quick`): f32 adapters with a bias, and the activations' dtype with a separate input.
#[test]
fn lora_linear_conformance() {
    liger_tests::check_op(Op::LoraLinear);
    liger_tests::check_op(Op::LoraLinearDropout);
}

/// The full sweep (the models' projections at rank 64): too large for a software
/// rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn lora_linear_conformance_full() {
    liger_tests::check_ops_full(Op::is_lora);
}

// ---------------------------------------------------------------------------------------
// Fused linear cross entropy with a LoRA head.

const N: usize = 37;
const H: usize = 45;
const V: usize = 53;
const R: usize = 6;

struct HeadData {
    x: Vec<f32>,
    xa: Vec<f32>,
    /// PyTorch's layout `[V, H]`.
    w: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    bb: Vec<f32>,
    targets: Vec<i64>,
    class_weight: Vec<f32>,
    /// Upstream gradient: one value (mean, sum) or one per row (none).
    g: Vec<f32>,
}

impl HeadData {
    fn new(rng: &mut Rng) -> Self {
        let mut targets: Vec<i64> = (0..N).map(|_| rng.below(V) as i64).collect();
        // Some ignored rows, never the last (the dropped-row check needs a live last row).
        for i in [2, 11, 20] {
            targets[i] = -100;
        }
        HeadData {
            x: rng.vec(N * H, -1.0, 1.0, 0.0),
            xa: rng.vec(N * H, -1.0, 1.0, 0.0),
            w: rng.vec(V * H, -0.4, 0.4, 0.0),
            b: rng.vec(V, -0.5, 0.5, 0.0),
            a: rng.vec(R * H, -0.4, 0.4, 0.0),
            bb: rng.vec(V * R, -0.4, 0.4, 0.0),
            targets,
            class_weight: rng.vec(V, 0.5, 2.0, 0.0),
            g: rng.vec(N, 0.5, 1.5, 0.0),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct HeadCase {
    dtype: DType,
    precision: AdapterPrecision,
    options: CrossEntropyOptions,
    weights: bool,
    bias: bool,
    separate: bool,
    /// The LM head weight (and bias) trained too.
    train_head: bool,
    /// Upstream gradient other than 1 (the stored gradients scaled, or under none the
    /// backward's second chunked pass).
    upstream: bool,
}

struct HeadRef {
    loss: Bounded,
    gx: Bounded,
    gxa: Bounded,
    ga: Bounded,
    gb: Bounded,
    gw: Bounded,
    gbias: Bounded,
}

/// The cross entropy of bounded logits `z` (`[N, V]`): the loss (`[1]` or `[N]`) and the
/// logits gradient for the upstream factors, with their bounds (see the module docs).
fn cross_entropy_reference(
    z: &Bounded,
    d: &HeadData,
    c: &HeadCase,
    upstream: &[f64],
) -> (Bounded, Bounded) {
    let o = &c.options;
    let (n, v) = (z.rows, z.cols);
    let w = |k: usize| {
        if c.weights {
            round(DType::F32, d.class_weight[k] as f64)
        } else {
            1.0
        }
    };
    let live: Vec<bool> = d.targets.iter().map(|&t| t != o.ignore_index).collect();
    let total_w: f64 = (0..n)
        .filter(|&i| live[i])
        .map(|i| w(d.targets[i] as usize))
        .sum();
    let count = live.iter().filter(|l| **l).count() as f64;
    let eps = o.label_smoothing;
    let lambda = o.lse_square_scale;
    let sum_w: f64 = (0..v).map(w).sum();
    let (mut loss_v, mut loss_e) = (vec![0.0; n], vec![0.0; n]);
    let (mut g_v, mut g_e) = (vec![0.0; n * v], vec![0.0; n * v]);
    for i in 0..n {
        if !live[i] {
            continue;
        }
        let y = d.targets[i] as usize;
        let row = &z.v[i * v..(i + 1) * v];
        let dz = z.e[i * v..(i + 1) * v]
            .iter()
            .fold(0.0f64, |m, e| m.max(*e));
        let capped: Vec<f64> = row
            .iter()
            .map(|x| o.softcap.map_or(*x, |cap| cap * (x / cap).tanh()))
            .collect();
        let m = capped.iter().fold(f64::MIN, |a, b| a.max(*b));
        let lse = m + capped.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        // The device's lse and probabilities: the logits' error, and the f32 evaluation
        // of exp, the sum over V and log.
        let lse_err = dz + (v as f64 + 8.0) * U32 * (lse.abs() + 1.0);
        let ce = (1.0 - eps) * w(y) * (lse - capped[y])
            + eps / v as f64 * (0..v).map(|k| w(k) * (lse - capped[k])).sum::<f64>();
        let zl = lambda * lse * lse;
        // Mean: the cross entropy over the weights, the z-loss over the rows.
        let (f_ce, f_z) = match o.reduction {
            Reduction::Mean => (upstream[0] / total_w, upstream[0] / count),
            Reduction::Sum => (upstream[0], upstream[0]),
            Reduction::None => (upstream[i], upstream[i]),
        };
        let (l_ce, l_z) = if o.reduction == Reduction::None {
            (1.0, 1.0)
        } else {
            (f_ce / upstream[0], f_z / upstream[0])
        };
        loss_v[i] = ce * l_ce + zl * l_z;
        let ce_err = ((1.0 - eps) * w(y) + eps / v as f64 * sum_w) * (lse_err + dz)
            + (v as f64 + 4.0) * U32 * ce.abs();
        let zl_err = 2.0 * lambda * lse.abs() * lse_err + 4.0 * U32 * zl;
        loss_e[i] = ce_err * l_ce + zl_err * l_z;
        for k in 0..v {
            let p = (capped[k] - lse).exp();
            let p_err = p * (2.0 * dz + (v as f64 + 2.0 * (capped[k] - lse).abs() + 8.0) * U32);
            let onehot = if k == y { 1.0 } else { 0.0 };
            let d_ce = (1.0 - eps) * w(y) * (p - onehot) + eps / v as f64 * (sum_w * p - w(k));
            let d_z = 2.0 * lambda * lse * p;
            let d_ce_err =
                ((1.0 - eps) * w(y) + eps / v as f64 * sum_w) * p_err + 4.0 * U32 * d_ce.abs();
            let d_z_err = 2.0 * lambda * (lse.abs() * p_err + p * lse_err);
            let (cap_d, cap_err) = match o.softcap {
                Some(cap) => {
                    let t = (row[k] / cap).tanh();
                    (1.0 - t * t, 2.0 * dz / cap + 4.0 * U32)
                }
                None => (1.0, 0.0),
            };
            let gv = (d_ce * f_ce + d_z * f_z) * cap_d;
            g_v[i * v + k] = gv;
            // Plus the scale's multiply and the store of the gradient to the logits dtype.
            g_e[i * v + k] = (d_ce_err * f_ce.abs() + d_z_err * f_z.abs()) * cap_d
                + (d_ce * f_ce + d_z * f_z).abs() * cap_err
                + (unit(c.dtype) + 4.0 * U32) * gv.abs();
        }
    }
    let loss = match o.reduction {
        Reduction::None => Bounded {
            rows: n,
            cols: 1,
            v: loss_v,
            e: loss_e,
        },
        _ => {
            let s: f64 = loss_v.iter().sum();
            let l1: f64 = loss_v.iter().map(|x| x.abs()).sum();
            // The weights' sum in the mean's denominator, the sum over rows, the scale.
            let e = loss_e.iter().sum::<f64>() + (2.0 * n as f64 + 4.0) * U32 * l1;
            Bounded {
                rows: 1,
                cols: 1,
                v: vec![s],
                e: vec![e],
            }
        }
    };
    let g = Bounded {
        rows: n,
        cols: v,
        v: g_v,
        e: g_e,
    };
    (loss, g)
}

/// Which computation a [`head_reference`] bounds.
#[derive(Clone, Copy, Debug)]
enum HeadPath {
    /// The fused loss with chunks of this many rows: each chunk's `[V, H]`, `[V, r]` and
    /// `[r, H]` gradient product stored in its dtype before the f32 accumulation, and
    /// under mean or sum an upstream gradient other than 1 applied to the stored
    /// gradients afterwards (one more rounding of each, in its dtype).
    Fused { chunk: usize },
    /// The unfused composition: materialized logits, whose cross entropy stores its
    /// logits gradient and, for an upstream gradient other than 1, scales it (one more
    /// rounding in the logits dtype); autodiff then rounds the adapter path's input
    /// gradient to the activation dtype before adding it to the base path's.
    Unfused,
}

/// `aᵀ·b` (`a: [N, p]`, `b: [N, q]`) over chunks of `chunk` rows: each chunk's product
/// stored in `dtype`, the products added in f32.
fn chunked_t_mm(a: &Bounded, b: &Bounded, chunk: usize, dtype: DType) -> Bounded {
    let mut acc: Option<Bounded> = None;
    let mut r0 = 0;
    while r0 < a.rows {
        let r1 = (r0 + chunk).min(a.rows);
        let part = a
            .rows_range(r0, r1)
            .t()
            .mm(&b.rows_range(r0, r1))
            .store(dtype);
        acc = Some(match acc {
            Some(acc) => acc.add(&part, DType::F32),
            None => part,
        });
        r0 = r1;
    }
    acc.expect("at least one row")
}

/// A stored gradient multiplied by the upstream gradient (in f32) and stored again in
/// `dtype`.
fn rescaled(b: &Bounded, dtype: DType) -> Bounded {
    b.scale(1.0).store(dtype)
}

fn head_reference(d: &HeadData, c: &HeadCase, scale: f64, path: HeadPath) -> HeadRef {
    let dt = c.dtype;
    let cd = c.precision.compute_dtype(dt);
    let x = Bounded::exact(N, H, rounded(&d.x, dt));
    let xa = if c.separate {
        Bounded::exact(N, H, rounded(&d.xa, dt))
    } else {
        x.clone()
    };
    let w = Bounded::exact(V, H, rounded(&d.w, dt));
    let a = Bounded::exact(R, H, rounded(&d.a, cd));
    let b = Bounded::exact(V, R, rounded(&d.bb, cd));
    let mut logits = x.mm(&w.t()).store(dt);
    if c.bias {
        logits = logits.add_row(&rounded(&d.b, dt), dt);
    }
    let h = xa.mm(&a.t()).store(cd).scale(scale).store(cd);
    logits = logits.add(&h.mm(&b.t()).store(cd), dt);
    let upstream: Vec<f64> = match (c.options.reduction, c.upstream) {
        (Reduction::None, true) => d.g.iter().map(|x| *x as f64).collect(),
        (Reduction::None, false) => vec![1.0; N],
        (_, true) => vec![d.g[0] as f64],
        (_, false) => vec![1.0],
    };
    let (loss, g) = cross_entropy_reference(&logits, d, c, &upstream);
    let g = match path {
        HeadPath::Unfused if c.upstream => rescaled(&g, dt),
        _ => g,
    };
    let u = g.mm(&b).store(cd).scale(scale).store(cd);
    let adapter = u.mm(&a).store(cd);
    let base_x = g.mm(&w).store(dt);
    let ones = Bounded::exact(N, 1, vec![1.0; N]);
    let gbias = chunked_t_mm(&ones, &g, N, DType::F32).store(dt);
    match path {
        HeadPath::Fused { chunk } => {
            let (gx, gxa) = if c.separate {
                (base_x, adapter.store(dt))
            } else {
                (base_x.add(&adapter, dt), adapter)
            };
            let gb = chunked_t_mm(&g, &h, chunk, cd);
            let ga = chunked_t_mm(&u, &xa, chunk, cd);
            let gw = chunked_t_mm(&g, &x, chunk, dt).store(dt);
            let mut r = HeadRef {
                loss,
                gx,
                gxa,
                ga,
                gb,
                gw,
                gbias,
            };
            if c.upstream && c.options.reduction != Reduction::None {
                r.gx = rescaled(&r.gx, dt);
                r.gxa = rescaled(&r.gxa, dt);
                r.gw = rescaled(&r.gw, dt);
                r.gbias = rescaled(&r.gbias, dt);
                r.ga = rescaled(&r.ga, DType::F32);
                r.gb = rescaled(&r.gb, DType::F32);
            }
            r
        }
        HeadPath::Unfused => {
            let (gx, gxa) = if c.separate {
                (base_x, adapter.store(dt))
            } else {
                (base_x.add(&adapter.store(dt), dt), adapter)
            };
            HeadRef {
                loss,
                gx,
                gxa,
                ga: u.t().mm(&xa).store(cd),
                gb: g.t().mm(&h).store(cd),
                gw: g.t().mm(&x).store(dt),
                gbias,
            }
        }
    }
}

/// Loss and gradients (x, adapter input, A, B, weight `[V, H]`, bias) of the fused op
/// (`fused`) or of the unfused composition.
fn head_run<B: FusedOps>(
    d: &HeadData,
    c: &HeadCase,
    scale: f64,
    fused: bool,
    device: &B::Device,
) -> [Vec<f64>; 7] {
    let dt = c.dtype;
    let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    let x = tensor::<AD<B>, 2>(&f(&d.x), [N, H], dt, device).require_grad();
    let xa = tensor::<AD<B>, 2>(&f(&d.xa), [N, H], dt, device).require_grad();
    let mut w = tensor::<AD<B>, 2>(&f(&d.w), [V, H], dt, device);
    let mut bias = tensor::<AD<B>, 1>(&f(&d.b), [V], dt, device);
    if c.train_head {
        w = w.require_grad();
        bias = bias.require_grad();
    }
    let a = tensor::<AD<B>, 2>(&f(&d.a), [R, H], DType::F32, device).require_grad();
    let bb = tensor::<AD<B>, 2>(&f(&d.bb), [V, R], DType::F32, device).require_grad();
    let targets =
        Tensor::<AD<B>, 1, Int>::from_data(TensorData::new(d.targets.clone(), [N]), device);
    let cw = c
        .weights
        .then(|| tensor::<AD<B>, 1>(&f(&d.class_weight), [V], DType::F32, device));
    let options = LoraOptions::new(scale).with_precision(c.precision);
    let adapter_x = c.separate.then(|| xa.clone());
    let b_opt = c.bias.then(|| bias.clone());
    let loss = if fused {
        functional::fused_linear_cross_entropy_lora(
            x.clone(),
            w.clone(),
            b_opt,
            Some(LoraHeadAdapter {
                x: adapter_x,
                a: a.clone(),
                b: bb.clone(),
                options,
            }),
            targets.clone(),
            cw,
            c.options,
        )
        .loss
    } else {
        let cd = c.precision.compute_dtype(dt);
        let mut logits = x.clone().matmul(w.clone().transpose());
        if let Some(b) = b_opt {
            logits = logits + b.reshape([1, V]);
        }
        let xa2 = adapter_x.unwrap_or(x.clone());
        let hidden = xa2
            .cast(cd)
            .matmul(a.clone().cast(cd).transpose())
            .mul_scalar(scale);
        let delta = hidden.matmul(bb.clone().cast(cd).transpose());
        logits = if cd == DType::F32 && dt != DType::F32 {
            (logits.cast(DType::F32) + delta).cast(dt)
        } else {
            logits + delta
        };
        let plain = c.options == CrossEntropyOptions::default() && cw.is_none();
        if plain {
            // Burn's stock composition: log-softmax in f32, the targets' entries, the mean
            // over the rows that are not ignored.
            let ignored = targets.clone().equal_elem(-100);
            let safe = targets.clone().mask_fill(ignored.clone(), 0);
            let picked: Tensor<AD<B>, 1> = log_softmax(logits.cast(DType::F32), 1)
                .gather(1, safe.reshape([N, 1]))
                .reshape([N]);
            let count = ignored.clone().bool_not().int().sum().float();
            picked.neg().mask_fill(ignored, 0.0).sum() / count
        } else {
            functional::cross_entropy(logits, targets.clone(), cw, c.options).loss
        }
    };
    let grads = match (c.options.reduction, c.upstream) {
        (_, false) => loss.clone().backward(),
        (Reduction::None, true) => {
            let g = tensor::<AD<B>, 1>(&f(&d.g), [N], DType::F32, device);
            (loss.clone() * g).sum().backward()
        }
        (_, true) => loss.clone().mul_scalar(d.g[0] as f64).backward(),
    };
    let g2 = |t: &Tensor<AD<B>, 2>| t.grad(&grads).map(host).unwrap_or_default();
    if !c.train_head {
        assert!(
            w.grad(&grads).is_none(),
            "the frozen LM head got a gradient"
        );
    }
    [
        host(loss.inner()),
        g2(&x),
        if c.separate { g2(&xa) } else { Vec::new() },
        g2(&a),
        g2(&bb),
        if c.train_head { g2(&w) } else { Vec::new() },
        if c.train_head && c.bias {
            bias.grad(&grads).map(host).unwrap_or_default()
        } else {
            Vec::new()
        },
    ]
}

/// The cases: every reduction, smoothing with class weights, z-loss with softcap, bias or
/// not, the adapter on `x` or on a separate input, the head frozen or trained, upstream
/// gradients of 1 or not; with chunk sizes giving one chunk, a last partial chunk and
/// single rows.
fn head_cases(dtype: DType, precision: AdapterPrecision) -> Vec<(HeadCase, Option<usize>)> {
    let base = HeadCase {
        dtype,
        precision,
        options: CrossEntropyOptions::default(),
        weights: false,
        bias: true,
        separate: false,
        train_head: false,
        upstream: false,
    };
    vec![
        (base, None),
        (base, Some(8)),
        (base, Some(1)),
        (
            HeadCase {
                options: CrossEntropyOptions::default().with_label_smoothing(0.1),
                weights: true,
                separate: true,
                train_head: true,
                upstream: true,
                ..base
            },
            Some(8),
        ),
        (
            HeadCase {
                options: CrossEntropyOptions::default()
                    .with_reduction(Reduction::Sum)
                    .with_lse_square_scale(1e-3)
                    .with_softcap(Some(5.0)),
                bias: false,
                upstream: true,
                ..base
            },
            Some(5),
        ),
        (
            HeadCase {
                options: CrossEntropyOptions::default().with_reduction(Reduction::None),
                separate: true,
                upstream: true,
                ..base
            },
            Some(8),
        ),
    ]
}

struct HeadParity {
    rng: Rng,
    cases: usize,
}

impl BackendVisitor for HeadParity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let data = HeadData::new(&mut self.rng);
        let tf32 = liger_tests::stock_matmul_is_tf32::<B>((N, H, V), device, &mut self.rng);
        let mut failures = Vec::new();
        for dtype in liger_tests::dtypes::<B>(device) {
            for precision in [AdapterPrecision::F32, AdapterPrecision::Activation] {
                if dtype == DType::F32 && precision == AdapterPrecision::Activation {
                    continue; // the same computation in f32
                }
                for (c, chunk) in head_cases(dtype, precision) {
                    for fused in [true, false] {
                        // A draw whose every failure is a gradient the bounds cannot tell
                        // from zero proves nothing either way: the case is drawn again.
                        for draw in 0..HEAD_DRAWS {
                            let fresh;
                            let d = if draw == 0 {
                                &data
                            } else {
                                fresh = HeadData::new(&mut self.rng);
                                &fresh
                            };
                            let f = self.head_case::<B>(d, c, chunk, fused, tf32, label, device);
                            let vacuous =
                                !f.is_empty() && f.iter().all(|m| m.contains(INDISTINGUISHABLE));
                            if vacuous && draw + 1 < HEAD_DRAWS {
                                continue;
                            }
                            keep_failures(&mut failures, f, fused);
                            self.cases += 1;
                            break;
                        }
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "LIGER_SEED={} reproduces these:\n{}",
            self.rng.seed(),
            failures.join("\n")
        );
        eprintln!("{label}: fused linear cross entropy with a LoRA head within its bounds");
    }
}

/// Draws of a head case at most (see `HeadParity::visit`).
const HEAD_DRAWS: usize = 4;

/// What `check_with_rejection` reports for a result the bounds cannot tell from zero.
const INDISTINGUISHABLE: &str = "indistinguishable from zero";

impl HeadParity {
    /// One case's failures: the loss and every gradient of the fused op (`fused`) or of the
    /// unfused composition, against the reference of `d`.
    #[allow(clippy::too_many_arguments)]
    fn head_case<B: FusedOps>(
        &mut self,
        d: &HeadData,
        c: HeadCase,
        chunk: Option<usize>,
        fused: bool,
        tf32: bool,
        label: &str,
        device: &B::Device,
    ) -> Vec<String> {
        let scale = 16.0 / (R as f64).sqrt(); // rsLoRA's alpha / sqrt(r)
        let path = if fused {
            HeadPath::Fused {
                chunk: chunk.unwrap_or_else(|| automatic_chunk_rows(N, H, V)),
            }
        } else {
            HeadPath::Unfused
        };
        let r = head_reference(d, &c, scale, path);
        let _chunk = chunk.filter(|_| fused).map(override_chunk_rows);
        let out = head_run::<B>(d, &c, scale, fused, device);
        let who = if fused { "fused" } else { "unfused" };
        let name = |t: &str| format!("{label} {c:?} chunk {chunk:?} {who} {t}");
        let mut f = Vec::new();
        let relaxed = stock_on_tf32(fused, tf32, c.dtype, c.precision, 3);
        let loss_ref = &r.loss;
        if relaxed.is_some() {
            check_path(&mut f, &name("loss"), loss_ref, &out[0], relaxed);
        } else if let Err(e) = loss_ref.check(&name("loss"), &out[0], 1.0) {
            f.push(e);
        }
        check_path(&mut f, &name("grad_x"), &r.gx, &out[1], relaxed);
        if c.separate {
            check_path(&mut f, &name("grad_adapter_x"), &r.gxa, &out[2], relaxed);
        }
        check_path(&mut f, &name("grad_A"), &r.ga, &out[3], relaxed);
        check_path(&mut f, &name("grad_B"), &r.gb, &out[4], relaxed);
        if c.train_head {
            check_path(&mut f, &name("grad_weight"), &r.gw, &out[5], relaxed);
            if c.bias {
                check_path(&mut f, &name("grad_bias"), &r.gbias, &out[6], relaxed);
            }
        }
        f
    }
}

#[test]
fn lora_head_cross_entropy_matches_reference_and_unfused() {
    let mut v = HeadParity {
        rng: liger_tests::fresh_rng(),
        cases: 0,
    };
    liger_tests::for_each_backend(&mut v);
    assert!(v.cases > 0);
}

/// Without an adapter and with the LM head frozen, the fused linear cross entropy computes
/// no weight gradient (the primitive, outside autodiff, returns none when not asked).
struct FrozenHead;

impl BackendVisitor for FrozenHead {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let mut rng = Rng::new(5);
        let d = HeadData::new(&mut rng);
        let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
        let prim2 = |v: &[f32], s: [usize; 2]| {
            tensor::<B, 2>(&f(v), s, DType::F32, device)
                .into_primitive()
                .tensor()
        };
        let wanted = liger_burn::ops::LinearCrossEntropyGradsWanted {
            x: true,
            ..Default::default()
        };
        let out = B::fused_lora_linear_cross_entropy(
            prim2(&d.x, [N, H]),
            prim2(&d.w, [V, H]),
            None,
            None,
            Tensor::<B, 1, Int>::from_data(TensorData::new(d.targets.clone(), [N]), device)
                .into_primitive(),
            None,
            wanted,
            CrossEntropyOptions::default(),
        );
        assert!(
            out.grad_x.is_some() && out.grad_weight.is_none() && out.adapter.is_none(),
            "{label}: only grad_x was asked for"
        );
        // Through autodiff: a frozen head's loss backpropagates into x only.
        let x = tensor::<AD<B>, 2>(&f(&d.x), [N, H], DType::F32, device).require_grad();
        let w = tensor::<AD<B>, 2>(&f(&d.w), [V, H], DType::F32, device);
        let t = Tensor::<AD<B>, 1, Int>::from_data(TensorData::new(d.targets.clone(), [N]), device);
        let loss = functional::fused_linear_cross_entropy(
            x.clone(),
            w.clone(),
            None,
            t,
            None,
            CrossEntropyOptions::default(),
        )
        .loss;
        let grads = loss.backward();
        assert!(
            x.grad(&grads).is_some() && w.grad(&grads).is_none(),
            "{label}"
        );
    }
}

#[test]
fn frozen_head_gets_no_weight_gradient() {
    liger_tests::for_each_backend(&mut FrozenHead);
}

struct BadInputs;

impl BackendVisitor for BadInputs {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let t = |s: [usize; 2]| Tensor::<B, 2>::ones(s, device);
        let lin = |x: Tensor<B, 2>, w: Tensor<B, 2>, a: Tensor<B, 2>, b: Tensor<B, 2>| {
            let _ = functional::lora_linear(x, w, None, None, a, b, LoraOptions::new(2.0));
        };
        let msg = panic_message(|| lin(t([4, 8]), t([8, 5]), t([0, 8]), t([5, 0])));
        assert_mentions(label, &msg, &["lora_linear", "rank 0"]);
        let msg = panic_message(|| lin(t([4, 8]), t([8, 5]), t([3, 7]), t([5, 3])));
        assert_mentions(label, &msg, &["lora_linear", "[3, 7]", "d_in 8"]);
        let msg = panic_message(|| lin(t([4, 8]), t([8, 5]), t([3, 8]), t([6, 3])));
        assert_mentions(label, &msg, &["lora_linear", "[6, 3]", "d_out 5"]);
        // A trainable base weight is refused: LoRA computes no gradient for it.
        let ad = |s: [usize; 2]| Tensor::<AD<B>, 2>::ones(s, device);
        let msg = panic_message(|| {
            let _ = functional::lora_linear(
                ad([4, 8]),
                ad([8, 5]).require_grad(),
                None,
                None,
                ad([3, 8]),
                ad([5, 3]),
                LoraOptions::new(2.0),
            );
        });
        assert_mentions(
            label,
            &msg,
            &["lora_linear", "requires a gradient", "frozen"],
        );
        // The LM-head adapter must match the head's vocabulary.
        let msg = panic_message(|| {
            let _ = functional::fused_linear_cross_entropy_lora(
                t([4, 8]),
                t([10, 8]),
                None,
                Some(LoraHeadAdapter {
                    x: None,
                    a: t([3, 8]),
                    b: t([9, 3]),
                    options: LoraOptions::new(2.0),
                }),
                Tensor::<B, 1, Int>::zeros([4], device),
                None,
                CrossEntropyOptions::default(),
            );
        });
        assert_mentions(
            label,
            &msg,
            &["fused_linear_cross_entropy_lora", "[9, 3]", "d_out 10"],
        );
    }
}

#[test]
fn bad_inputs_are_refused_naming_shapes() {
    liger_tests::for_each_backend(&mut BadInputs);
}

/// `nn::LoraAdapter`: PEFT's initialization (`A` Kaiming-uniform with `a = √5`, i.e.
/// uniform in `±1/√d_in`; `B` zeros; both f32 whatever the base dtype), the scale (`α/r`,
/// `α/√r` with rsLoRA), the forward through `functional::lora_linear`, and a dropout that
/// acts on the adapter's input only while gradients are tracked.
struct AdapterModule;

impl BackendVisitor for AdapterModule {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        use burn::module::{AutodiffModule, Param};
        use liger_burn::nn::LoraAdapterConfig;
        let (d_in, d_out, r) = (45, 37, 6);
        let config = LoraAdapterConfig::new(d_in, d_out, r, 12.0);
        let adapter = config.init::<B>(device);
        assert_eq!(adapter.scale, 2.0, "{label}");
        let rs = config.clone().with_use_rslora(true).init::<B>(device);
        assert_eq!(rs.scale, 12.0 / (r as f64).sqrt(), "{label}");
        assert_eq!(adapter.lora_a.val().dtype(), DType::F32, "{label}");
        assert_eq!(adapter.lora_b.val().dtype(), DType::F32, "{label}");
        assert_eq!(adapter.lora_a.dims(), [r, d_in], "{label}");
        assert_eq!(adapter.lora_b.dims(), [d_out, r], "{label}");
        let a = host(adapter.lora_a.val());
        let bound = 1.0 / (d_in as f64).sqrt();
        assert!(
            a.iter().all(|v| v.abs() <= bound),
            "{label}: A outside ±1/√d_in"
        );
        // Uniform on ±bound: mean |a| is bound/2 (270 draws: within ±0.15·bound at > 5σ).
        let mean_abs = a.iter().map(|v| v.abs()).sum::<f64>() / a.len() as f64;
        assert!(
            (mean_abs / bound - 0.5).abs() < 0.15,
            "{label}: A is not uniform in ±1/√d_in (mean |a| = {mean_abs}, bound {bound})"
        );
        assert!(
            host(adapter.lora_b.val()).iter().all(|v| *v == 0.0),
            "{label}: B ≠ 0"
        );

        let mut rng = Rng::new(11);
        let d = linear_data(&mut rng);
        let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
        for dtype in liger_tests::dtypes::<B>(device) {
            let at = format!("{label} {dtype:?}");
            // A trained-looking adapter (B ≠ 0) with dropout 0.5.
            let mut m = config.clone().with_dropout(0.5).init::<AD<B>>(device);
            m.lora_b = Param::from_tensor(tensor::<AD<B>, 2>(
                &f(&d.bb),
                [d_out, r],
                DType::F32,
                device,
            ));
            let x = tensor::<AD<B>, 2>(&f(&d.x[..ROWS * d_in]), [ROWS, d_in], dtype, device);
            let w = tensor::<AD<B>, 2>(&f(&d.w[..d_in * d_out]), [d_in, d_out], dtype, device);
            let no_dropout = host(functional::lora_linear(
                x.clone().inner(),
                w.clone().inner(),
                None,
                None,
                m.lora_a.val().inner(),
                m.lora_b.val().inner(),
                m.options(),
            ));
            // Without gradient tracking (the inner backend's module): no dropout.
            let eval = host(
                m.valid()
                    .forward(x.clone().inner(), w.clone().inner(), None),
            );
            assert_eq!(eval, no_dropout, "{at}: dropout applied in evaluation");
            // Tracked: the adapter reads dropout(x), the base path x itself.
            let train = m.forward(x.clone(), w.clone(), None);
            let y = host(train.clone().inner());
            assert_ne!(y, no_dropout, "{at}: no dropout while training");
            assert!(y.iter().all(|v| v.is_finite()), "{at}");
            let grads = train.sum().backward();
            assert!(m.lora_a.val().grad(&grads).is_some(), "{at}: no grad for A");
            assert!(m.lora_b.val().grad(&grads).is_some(), "{at}: no grad for B");
        }
    }
}

#[test]
fn lora_adapter_module_initializes_as_peft_and_drops_out_only_while_training() {
    liger_tests::for_each_backend(&mut AdapterModule);
}
