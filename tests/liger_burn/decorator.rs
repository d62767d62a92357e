//! `Liger<B>` reaches stock Burn code: an unmodified `burn::nn` model (LayerNorm, Linear,
//! softmax attention weights, CrossEntropyLoss) trained one step on
//! `Liger<Autodiff<…>>` launches the fused forward *and* backward kernels and gives the
//! same loss and gradients as the stock path. Also pins down what the other wrapping
//! order, `Autodiff<Liger<…>>`, does.

use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::RmsNormOptions;
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_verify::conformance::Rng;
use liger_verify::conformance::tracked::{self, Tracked};

/// A small model written only with stock Burn.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    norm: LayerNorm<B>,
    proj: Linear<B>,
}

const D: usize = 48;
const V: usize = 37;
const ROWS: usize = 10;

struct Inputs {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    weight: Vec<f32>,
    bias: Vec<f32>,
    targets: Vec<i64>,
}

impl Inputs {
    fn new(rng: &mut Rng) -> Self {
        Self {
            x: rng.vec(ROWS * D, -2.0, 2.0, 0.5),
            gamma: rng.vec(D, 0.5, 1.5, 0.0),
            beta: rng.vec(D, -0.5, 0.5, 0.0),
            weight: rng.vec(D * V, -0.3, 0.3, 0.0),
            bias: rng.vec(V, -0.1, 0.1, 0.0),
            targets: (0..ROWS).map(|_| rng.below(V) as i64).collect(),
        }
    }

    fn net<B: Backend>(&self, device: &B::Device) -> Net<B> {
        let mut norm = LayerNormConfig::new(D).init(device);
        norm.gamma = Param::from_tensor(Tensor::from_data(
            TensorData::new(self.gamma.clone(), [D]),
            device,
        ));
        norm.beta = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(self.beta.clone(), [D]),
            device,
        )));
        let mut proj = LinearConfig::new(D, V).init(device);
        proj.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(self.weight.clone(), [D, V]),
            device,
        ));
        proj.bias = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(self.bias.clone(), [V]),
            device,
        )));
        Net { norm, proj }
    }
}

/// One training step of the stock model: loss and the gradients of every parameter and of `x`.
fn step<B: AutodiffBackend>(inputs: &Inputs, device: &B::Device) -> (f32, Vec<Vec<f32>>) {
    let net = inputs.net::<B>(device);
    let x = Tensor::<B, 2>::from_data(TensorData::new(inputs.x.clone(), [ROWS, D]), device)
        .require_grad();
    let h = net.norm.forward(x.clone());
    let logits = net.proj.forward(h);
    // Attention-like use of softmax over the last dim, and CrossEntropyLoss (log_softmax inside).
    let attn = softmax(logits.clone(), 1);
    let targets =
        Tensor::<B, 1, Int>::from_data(TensorData::new(inputs.targets.clone(), [ROWS]), device);
    let ce = CrossEntropyLossConfig::new()
        .init(device)
        .forward(logits, targets);
    let loss = ce + (attn.clone() * attn).sum() * 0.5;
    let grads = loss.backward();
    let read = |t: Tensor<B::InnerBackend, 1>| t.into_data().to_vec::<f32>().unwrap();
    let all = vec![
        read(x.grad(&grads).unwrap().flatten(0, 1)),
        read(net.norm.gamma.grad(&grads).unwrap()),
        read(net.norm.beta.as_ref().unwrap().grad(&grads).unwrap()),
        read(net.proj.weight.grad(&grads).unwrap().flatten(0, 1)),
        read(net.proj.bias.as_ref().unwrap().grad(&grads).unwrap()),
    ];
    (loss.into_data().to_vec::<f32>().unwrap()[0], all)
}

/// `Σ a·b` over `(a, error of a, b, error of b)` terms as f32 computes it, with its error
/// bound: each product and the sum through [`Tracked`]'s running error analysis.
///
/// [`Tracked`]: liger_verify::conformance::tracked::Tracked
fn dot(terms: &mut dyn Iterator<Item = (f64, f64, f64, f64)>) -> (f64, f64) {
    let products: Vec<Tracked> = terms
        .map(|(a, ea, b, eb)| Tracked::new(a, ea).mul(Tracked::new(b, eb)))
        .collect();
    let sum = tracked::sum(&products);
    (sum.v, sum.e)
}

/// The step of [`step`] in f64 with the bound of an f32 evaluation of each result: the
/// loss, then the gradients of `x`, `gamma`, `beta`, `weight` and `bias` (the order of
/// [`step`]), each as `(values, bounds)`.
///
/// A first-order running error analysis. Each intermediate carries the bound of its
/// error: what its inputs' errors make of it, plus its own roundings.
/// - Sums use the conformance accumulation bound over their terms' magnitudes.
/// - Elementwise operations take one rounding each, `U32`.
/// - `exp`, `ln` and the reciprocal square root use Vulkan's precision (`exp_error`,
///   `ln_error`, 3 ulp).
///
/// The stock path and the fused one compute the same functions in different orders, so the
/// bound covers either:
/// - The variance is bounded both as two passes and as `E[x²] − μ²`, and the larger is
///   taken.
/// - The backward's elementwise compositions count up to four roundings of their
///   terms' magnitudes.
fn expected(inputs: &Inputs) -> (f64, f64, Vec<(Vec<f64>, Vec<f64>)>) {
    use liger_verify::conformance::bounds::{U32, ULP32, accumulation, exp_error, ln_error};
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let (x, gamma, beta, w, bias) = (
        f(&inputs.x),
        f(&inputs.gamma),
        f(&inputs.beta),
        f(&inputs.weight),
        f(&inputs.bias),
    );
    let (d, v, rows) = (D as f64, V, ROWS);
    let eps = 1e-5;
    // Forward, per row: LayerNorm's normalized values and output, the logits, the
    // probabilities, each with its bound.
    let (mut n, mut e_n, mut h, mut e_h) = (
        vec![0.0; rows * D],
        vec![0.0; rows * D],
        vec![0.0; rows * D],
        vec![0.0; rows * D],
    );
    let (mut r, mut e_r_rel) = (vec![0.0; rows], vec![0.0; rows]);
    let (mut p, mut e_p_rel) = (vec![0.0; rows * v], vec![0.0; rows]);
    let (mut loss, mut e_loss) = (0.0, 0.0);
    let (mut ce_terms, mut s_terms) = (0.0, 0.0);
    for i in 0..rows {
        let xi = &x[i * D..(i + 1) * D];
        let l1: f64 = xi.iter().map(|a| a.abs()).sum();
        let mu = xi.iter().sum::<f64>() / d;
        let e_mu = accumulation(D, l1) / d + 2.0 * U32 * mu.abs();
        let dev: Vec<f64> = xi.iter().map(|a| a - mu).collect();
        let e_dev: Vec<f64> = dev.iter().map(|a| e_mu + U32 * a.abs()).collect();
        let var = dev.iter().map(|a| a * a).sum::<f64>() / d;
        let two_pass = dev
            .iter()
            .zip(&e_dev)
            .map(|(a, e)| 2.0 * a.abs() * e)
            .sum::<f64>()
            / d
            + accumulation(D, var * d) / d
            + 3.0 * U32 * var;
        let sq = xi.iter().map(|a| a * a).sum::<f64>() / d;
        let one_pass = accumulation(D, sq * d) / d
            + 3.0 * U32 * sq
            + 2.0 * mu.abs() * e_mu
            + 2.0 * U32 * mu * mu;
        let e_var = two_pass.max(one_pass);
        let ri = 1.0 / (var + eps).sqrt();
        let er = 0.5 * (e_var + U32 * (var + eps)) / (var + eps) + 3.0 * ULP32;
        r[i] = ri;
        e_r_rel[i] = er;
        for j in 0..D {
            let at = i * D + j;
            n[at] = dev[j] * ri;
            e_n[at] = dev[j].abs() * ri * er + ri * e_dev[j] + U32 * n[at].abs();
            h[at] = gamma[j] * n[at] + beta[j];
            e_h[at] =
                gamma[j].abs() * e_n[at] + 2.0 * U32 * (gamma[j] * n[at]).abs() + U32 * h[at].abs();
        }
        let hi = &h[i * D..(i + 1) * D];
        let ehi = &e_h[i * D..(i + 1) * D];
        let mut z = vec![0.0; v];
        let mut e_z_max: f64 = 0.0;
        for k in 0..v {
            let zk = dot(&mut (0..D)
                .map(|j| (hi[j], ehi[j], w[j * v + k], 0.0))
                .chain([(bias[k], 0.0, 1.0, 0.0)]));
            z[k] = zk.0;
            e_z_max = e_z_max.max(zk.1);
        }
        let m = z.iter().cloned().fold(f64::MIN, f64::max);
        let exps: Vec<f64> = z.iter().map(|a| (a - m).exp()).collect();
        let sum: f64 = exps.iter().sum();
        let worst_exp = z
            .iter()
            .map(|a| exp_error(a - m) + U32 * (a - m).abs())
            .fold(0.0, f64::max);
        // δp/p = δz_k − Σ_j p_j δz_j (two logit errors), the exponential with its shifted
        // argument, the sum and the division; or, as `exp(log_softmax)` (the stock
        // backward), the logarithm of the sum and the outer exponential instead.
        let widest = z.iter().map(|a| (a - m).abs()).fold(0.0, f64::max) + sum.ln();
        let ep = 2.0 * e_z_max
            + worst_exp
            + (v as f64 - 1.0) * U32
            + 2.5 * ULP32
            + ln_error(sum)
            + exp_error(widest)
            + U32 * widest;
        e_p_rel[i] = ep;
        for k in 0..v {
            p[i * v + k] = exps[k] / sum;
        }
        let t = inputs.targets[i] as usize;
        let logp = z[t] - m - sum.ln();
        let e_logp = 2.0 * e_z_max
            + worst_exp
            + (v as f64 - 1.0) * U32
            + ln_error(sum)
            + U32 * ((z[t] - m).abs() + sum.ln().abs() + logp.abs());
        loss -= logp / rows as f64;
        e_loss += e_logp / rows as f64;
        ce_terms += logp.abs();
        for k in 0..v {
            let pk = p[i * v + k];
            loss += 0.5 * pk * pk;
            e_loss += pk * pk * ep + U32 * pk * pk;
            s_terms += 0.5 * pk * pk;
        }
    }
    e_loss += accumulation(rows, ce_terms) / rows as f64
        + 2.0 * U32 * ce_terms / rows as f64
        + accumulation(rows * v, s_terms)
        + 2.0 * U32 * loss.abs();
    // Backward: dL/dz = (p − onehot)/rows + p∘(p − Σp²).
    let (mut dz, mut e_dz) = (vec![0.0; rows * v], vec![0.0; rows * v]);
    for i in 0..rows {
        let pi = &p[i * v..(i + 1) * v];
        let q: f64 = pi.iter().map(|a| a * a).sum();
        let e_q = 2.0 * q * e_p_rel[i] + accumulation(v, q) + U32 * q;
        for k in 0..v {
            let pk = pi[k];
            let onehot = if k == inputs.targets[i] as usize {
                1.0
            } else {
                0.0
            };
            let at = i * v + k;
            dz[at] = (pk - onehot) / rows as f64 + pk * (pk - q);
            let e_pk = pk * e_p_rel[i];
            e_dz[at] = e_pk / rows as f64
                + (2.0 * pk + q) * e_pk
                + pk * e_q
                + 4.0 * U32 * ((pk + onehot) / rows as f64 + pk * (pk + q));
        }
    }
    let grad_bias: Vec<(f64, f64)> = (0..v)
        .map(|k| dot(&mut (0..rows).map(|i| (1.0, 0.0, dz[i * v + k], e_dz[i * v + k]))))
        .collect();
    let mut grad_weight = Vec::with_capacity(D * v);
    for j in 0..D {
        for k in 0..v {
            grad_weight.push(dot(&mut (0..rows)
                .map(|i| (h[i * D + j], e_h[i * D + j], dz[i * v + k], e_dz[i * v + k]))));
        }
    }
    let mut dh: Vec<(f64, f64)> = Vec::with_capacity(rows * D);
    for i in 0..rows {
        for j in 0..D {
            dh.push(dot(
                &mut (0..v).map(|k| (w[j * v + k], 0.0, dz[i * v + k], e_dz[i * v + k]))
            ));
        }
    }
    let grad_beta: Vec<(f64, f64)> = (0..D)
        .map(|j| dot(&mut (0..rows).map(|i| (1.0, 0.0, dh[i * D + j].0, dh[i * D + j].1))))
        .collect();
    let grad_gamma: Vec<(f64, f64)> = (0..D)
        .map(|j| {
            dot(&mut (0..rows).map(|i| {
                (
                    n[i * D + j],
                    e_n[i * D + j],
                    dh[i * D + j].0,
                    dh[i * D + j].1,
                )
            }))
        })
        .collect();
    // dx = r·(a − mean(a) − n·mean(a∘n)), a = dh∘γ.
    let mut grad_x = Vec::with_capacity(rows * D);
    for i in 0..rows {
        let a: Vec<(f64, f64)> = (0..D)
            .map(|j| {
                let (g, e) = dh[i * D + j];
                (
                    g * gamma[j],
                    gamma[j].abs() * e + U32 * (g * gamma[j]).abs(),
                )
            })
            .collect();
        let (sa, esa) = dot(&mut a.iter().map(|&(a, e)| (1.0, 0.0, a, e)));
        let (san, esan) = dot(&mut a
            .iter()
            .enumerate()
            .map(|(j, &(a, e))| (n[i * D + j], e_n[i * D + j], a, e)));
        let (ma, ema, man, eman) = (
            sa / d,
            esa / d + 2.0 * U32 * (sa / d).abs(),
            san / d,
            esan / d + 2.0 * U32 * (san / d).abs(),
        );
        for j in 0..D {
            let (aj, eaj) = a[j];
            let nj = n[i * D + j];
            let t = aj - ma - nj * man;
            let et = eaj
                + ema
                + nj.abs() * eman
                + man.abs() * e_n[i * D + j]
                + 4.0 * U32 * (aj.abs() + ma.abs() + (nj * man).abs());
            let gx = r[i] * t;
            grad_x.push((gx, t.abs() * r[i] * e_r_rel[i] + r[i] * et + U32 * gx.abs()));
        }
    }
    let split = |v: Vec<(f64, f64)>| v.into_iter().unzip::<f64, f64, Vec<f64>, Vec<f64>>();
    (
        loss,
        e_loss,
        vec![
            split(grad_x),
            split(grad_gamma),
            split(grad_beta),
            split(grad_weight),
            split(grad_bias),
        ],
    )
}

fn launches() -> Vec<u64> {
    [
        Kernel::layer_norm_forward,
        Kernel::layer_norm_backward,
        Kernel::softmax_forward,
        Kernel::softmax_backward,
        Kernel::log_softmax_forward,
        Kernel::log_softmax_backward,
    ]
    .iter()
    .map(|k| counters::get(*k))
    .collect()
}

/// Rows of each gradient of [`step`] (`x`, `gamma`, `beta`, `weight`, `bias`), for the
/// wrong results that drop rows.
const GRAD_ROWS: [usize; 5] = [ROWS, 1, 1, D, 1];

/// `actual` against the f64 reference's `(values, bounds)` ([`expected`]), which must
/// also reject the wrong results. `tf32`: the stock products are TF32 here (Liger's go
/// to cuBLASLt, true f32), so `actual` is compared with `stock` norm-wise within TF32's
/// bound instead.
fn assert_close(
    name: &str,
    actual: &[f32],
    stock: &[f32],
    (reference, rows): (&(Vec<f64>, Vec<f64>), usize),
    tf32: bool,
) {
    let f64s = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    assert_eq!(actual.len(), stock.len(), "{name}: lengths differ");
    if tf32 {
        let c = liger_verify::conformance::compare_normwise(
            "",
            &f64s(actual),
            &f64s(stock),
            liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE,
        );
        assert!(c.passed, "{name}: liger vs stock (TF32): {c:?}");
        return;
    }
    let expected = liger_verify::conformance::Expected::new(
        "",
        reference.0.clone(),
        reference.1.clone(),
        rows,
    );
    liger_tests::tensors::assert_rejects_wrong(&expected, name);
    for (side, values) in [("liger", actual), ("stock", stock)] {
        let c = expected.check(&f64s(values));
        eprintln!("{name}: {side} {:.2} of its bound", c.max_used);
        assert!(
            c.passed,
            "{name}: {side} vs the f64 reference: max abs {:.3e}, {:.2} of its bound",
            c.max_abs, c.max_used
        );
    }
}

/// The loss against the f64 reference's `(value, bound)`, or (`tf32`) against the stock
/// loss within TF32's norm-wise bound.
fn assert_loss(name: &str, loss: f32, stock: f32, (value, bound): (f64, f64), tf32: bool) {
    let (loss, stock) = (loss as f64, stock as f64);
    if tf32 {
        let tol = liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE;
        assert!(
            (loss - stock).abs() <= tol * (1.0 + stock.abs()),
            "{name}: loss {loss} vs stock {stock} (TF32)"
        );
        return;
    }
    for (side, l) in [("liger", loss), ("stock", stock)] {
        eprintln!(
            "{name}: {side} loss {:.2} of its bound",
            (l - value).abs() / bound
        );
        assert!(
            (l - value).abs() <= bound,
            "{name}: {side} loss {l} vs the f64 reference {value} (bound {bound:.3e})"
        );
    }
    // 0 and twice the loss are both |value| away.
    assert!(
        value.abs() > bound,
        "{name}: the loss's bound {bound:.3e} cannot tell {value} from 0 or 2x"
    );
}

fn check_wrapping<B: liger_burn::ops::FusedOps>(device: &B::Device)
where
    Autodiff<B>: AutodiffBackend<Device = B::Device>,
    Liger<Autodiff<B>>: AutodiffBackend<Device = B::Device>,
    Autodiff<Liger<B>>: AutodiffBackend<Device = B::Device>,
{
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let tf32 = liger_tests::stock_matmul_is_tf32::<B>((ROWS, D, V), device, &mut rng);
    let inputs = Inputs::new(&mut rng);

    // Stock path: no fused kernel runs.
    let before = launches();
    let (stock_loss, stock_grads) = step::<Autodiff<B>>(&inputs, device);
    assert_eq!(
        launches(),
        before,
        "the stock path must not launch fused kernels"
    );

    // Liger<Autodiff<B>>: the same unmodified model, fused forward and backward.
    let before = launches();
    let (loss, grads) = step::<Liger<Autodiff<B>>>(&inputs, device);
    let after = launches();
    let names = [
        "layer_norm fwd",
        "layer_norm bwd",
        "softmax fwd",
        "softmax bwd",
        "log_softmax fwd",
        "log_softmax bwd",
    ];
    for ((name, b), a) in names.iter().zip(&before).zip(&after) {
        assert!(
            a > b,
            "Liger<Autodiff<_>> did not launch the fused {name} kernel (seed {seed})"
        );
    }
    let (ref_loss, ref_bound, reference) = expected(&inputs);
    let compare = |order: &str, loss: f32, grads: &[Vec<f32>]| {
        let what = format!("{order} (seed {seed})");
        assert_loss(&what, loss, stock_loss, (ref_loss, ref_bound), tf32);
        for (i, (g, s)) in grads.iter().zip(&stock_grads).enumerate() {
            let at = (&reference[i], GRAD_ROWS[i]);
            assert_close(&format!("{what} grad #{i}"), g, s, at, tf32);
        }
    };
    compare("Liger<Autodiff<_>>", loss, &grads);

    // Autodiff<Liger<B>>: Burn's autodiff decomposes softmax/layer_norm before Liger sees
    // them (documented in liger_burn::backend), so the stock model is not fused...
    let before = launches();
    let (loss, grads) = step::<Autodiff<Liger<B>>>(&inputs, device);
    assert_eq!(
        launches(),
        before,
        "Autodiff<Liger<_>> unexpectedly fused stock ops; update the docs"
    );
    compare("Autodiff<Liger<_>>", loss, &grads);
    // ...while liger_burn's own API is, forward and backward.
    let (fwd, bwd) = (
        counters::get(Kernel::rms_norm_forward),
        counters::get(Kernel::rms_norm_backward),
    );
    let x = Tensor::<Autodiff<Liger<B>>, 2>::from_data(
        TensorData::new(inputs.x.clone(), [ROWS, D]),
        device,
    )
    .require_grad();
    let w = Tensor::<Autodiff<Liger<B>>, 1>::from_data(
        TensorData::new(inputs.gamma.clone(), [D]),
        device,
    )
    .require_grad();
    let y = liger_burn::functional::rms_norm(x.clone(), w.clone(), RmsNormOptions::llama(1e-6));
    let grads = (y * 1.5).sum().backward();
    // Reading the gradients flushes the (lazy, under fusion) stream.
    let gx = x.grad(&grads).expect("grad of x").into_data();
    let gw = w.grad(&grads).expect("grad of w").into_data();
    assert_eq!((gx.num_elements(), gw.num_elements()), (ROWS * D, D));
    assert!(
        counters::get(Kernel::rms_norm_forward) > fwd
            && counters::get(Kernel::rms_norm_backward) > bwd
    );
}

#[test]
fn stock_burn_model_reaches_fused_kernels_and_matches_stock() {
    match liger_tests::device_name().as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice, WgpuRuntime};
            check_wrapping::<Wgpu>(&WgpuDevice::Cpu);
            check_wrapping::<burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>>(
                &WgpuDevice::Cpu,
            );
        }
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "vulkan" => check_wrapping::<burn::backend::wgpu::Wgpu>(&Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => check_wrapping::<burn::backend::Cuda>(&Default::default()),
        other => panic!("no CubeCL device for LIGER_TEST_DEVICE={other} in this build"),
    }
}

/// On a backend without CubeCL the same wrapping gives the same numbers through the
/// stock-op fallback.
#[cfg(feature = "ndarray")]
#[test]
fn liger_over_ndarray_matches_stock() {
    use burn::backend::NdArray;
    let mut rng = liger_tests::fresh_rng();
    let inputs = Inputs::new(&mut rng);
    let device = Default::default();
    let (stock_loss, stock_grads) = step::<Autodiff<NdArray>>(&inputs, &device);
    let (loss, grads) = step::<Liger<Autodiff<NdArray>>>(&inputs, &device);
    let seed = rng.seed();
    let (ref_loss, ref_bound, reference) = expected(&inputs);
    assert_loss(
        &format!("seed {seed}"),
        loss,
        stock_loss,
        (ref_loss, ref_bound),
        false,
    );
    for (i, (g, s)) in grads.iter().zip(&stock_grads).enumerate() {
        let at = (&reference[i], GRAD_ROWS[i]);
        assert_close(&format!("grad #{i} (seed {seed})"), g, s, at, false);
    }
}

/// `y = gelu(x) * w1 + sigmoid(x) * w2` with stock Burn's activations (or, with
/// `erf_gelu`, GELU written as its erf formula, whose autodiff is exact); returns `y` and
/// the gradient of `sum(y)` with respect to `x`.
fn activations_step<A: AutodiffBackend>(
    x: &[f32],
    w1: &[f32],
    w2: &[f32],
    erf_gelu: bool,
    device: &A::Device,
) -> (Vec<f32>, Vec<f32>) {
    let t = |v: &[f32]| Tensor::<A, 2>::from_data(TensorData::new(v.to_vec(), [ROWS, D]), device);
    let x_ad = t(x).require_grad();
    let gelu = if erf_gelu {
        let erf = (x_ad.clone() * core::f64::consts::FRAC_1_SQRT_2).erf();
        x_ad.clone() * (erf + 1.0) * 0.5
    } else {
        burn::tensor::activation::gelu(x_ad.clone())
    };
    let y = gelu * t(w1) + burn::tensor::activation::sigmoid(x_ad.clone()) * t(w2);
    let grads = y.clone().sum().backward();
    let grad = x_ad
        .grad(&grads)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    (y.into_data().to_vec::<f32>().unwrap(), grad)
}

/// The f64 reference of [`activations_step`]'s `y` and gradient, each `(values, bounds)`
/// for an f32 evaluation, from the conformance bounds of GELU and sigmoid
/// ([`glu::activation`]): each activation's error times its weight, plus the two products
/// and the sum. `stock`: the bounds of stock Burn's compositions (its `erf`, and its
/// sigmoid backward from the stored f32 output) in place of the fused kernels'.
///
/// [`glu::activation`]: liger_verify::conformance::glu::activation
fn activations_expected(
    x: &[f32],
    w1: &[f32],
    w2: &[f32],
    stock: bool,
) -> [(Vec<f64>, Vec<f64>); 2] {
    use liger_verify::conformance::Op;
    use liger_verify::conformance::bounds::U32;
    use liger_verify::conformance::glu::activation;
    let (mut y, mut grad) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for ((&x, &w1), &w2) in x.iter().zip(w1).zip(w2) {
        let (x, w1, w2) = (x as f64, w1 as f64, w2 as f64);
        let (g, s) = (activation(Op::Gelu, x), activation(Op::Sigmoid, x));
        let extra = |e: f64, stock_e: f64| if stock { e + stock_e } else { e };
        // Burn's sigmoid backward reads its stored f32 output: `σ(1 − σ)` from `σ` rounded
        // is off by `|1 − 2σ|·u·σ` more.
        let s_stored = (1.0 - 2.0 * s.value).abs() * U32 * s.value;
        let terms = (g.value * w1).abs() + (s.value * w2).abs();
        y.0.push(g.value * w1 + s.value * w2);
        y.1.push(
            w1.abs() * extra(g.value_error, g.stock_value_error)
                + w2.abs() * s.value_error
                + 2.0 * U32 * terms,
        );
        let dterms = (g.derivative * w1).abs() + (s.derivative * w2).abs();
        grad.0.push(g.derivative * w1 + s.derivative * w2);
        grad.1.push(
            w1.abs() * extra(g.derivative_error, g.stock_derivative_error)
                + w2.abs() * (s.derivative_error + s_stored)
                + 2.0 * U32 * dterms,
        );
    }
    [y, grad]
}

/// `y` and `grad` within [`activations_expected`]'s bounds, which reject the wrong results.
fn assert_activations(expected: &[(Vec<f64>, Vec<f64>); 2], y: &[f32], grad: &[f32], what: &str) {
    for ((name, reference), actual) in ["y", "grad"].iter().zip(expected).zip([y, grad]) {
        let e = liger_verify::conformance::Expected::new(
            "",
            reference.0.clone(),
            reference.1.clone(),
            ROWS,
        );
        liger_tests::tensors::assert_rejects_wrong(&e, &format!("{what} {name}"));
        let c = e.check(&actual.iter().map(|&v| v as f64).collect::<Vec<_>>());
        eprintln!("{what} {name}: {:.2} of its bound", c.max_used);
        assert!(
            c.passed,
            "{what} {name} vs the f64 reference: max abs {:.3e}, {:.2} of its bound",
            c.max_abs, c.max_used
        );
    }
}

/// Stock Burn's `y` and the autodiff gradient of its erf formula, within stock's bounds.
fn assert_activations_stock(
    expected: &[(Vec<f64>, Vec<f64>); 2],
    y: &[f32],
    grad: &[f32],
    seed: u64,
) {
    assert_activations(expected, y, grad, &format!("stock Burn (seed {seed})"));
}

fn activation_launches() -> [u64; 4] {
    [
        Kernel::gelu_forward,
        Kernel::gelu_backward,
        Kernel::sigmoid_forward,
        Kernel::sigmoid_backward,
    ]
    .map(counters::get)
}

/// Stock `burn::tensor::activation::{gelu, sigmoid}` reach the fused kernels, forward and
/// backward, in both wrapping orders (burn-autodiff's own gelu/sigmoid nodes call the
/// inner `Liger<B>`'s `gelu_backward`/`sigmoid_backward`), with stock Burn's values. The
/// GELU gradient is the exact derivative, i.e. the autodiff of the erf formula, not stock
/// `gelu_backward`'s derivative of the tanh approximation (which it differs from by < 1e-3).
fn check_activations<B: liger_burn::ops::FusedOps>(device: &B::Device)
where
    Autodiff<B>: AutodiffBackend<Device = B::Device>,
    Liger<Autodiff<B>>: AutodiffBackend<Device = B::Device>,
    Autodiff<Liger<B>>: AutodiffBackend<Device = B::Device>,
{
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let x = rng.vec(ROWS * D, -6.0, 6.0, 0.0);
    let w1 = rng.vec(ROWS * D, -1.0, 1.0, 0.0);
    let w2 = rng.vec(ROWS * D, -1.0, 1.0, 0.0);

    let before = activation_launches();
    let (y_stock, g_stock_tanh) = activations_step::<Autodiff<B>>(&x, &w1, &w2, false, device);
    let (_, g_exact) = activations_step::<Autodiff<B>>(&x, &w1, &w2, true, device);
    let ours = activations_expected(&x, &w1, &w2, false);
    assert_activations_stock(
        &activations_expected(&x, &w1, &w2, true),
        &y_stock,
        &g_exact,
        seed,
    );
    assert_eq!(
        activation_launches(),
        before,
        "the stock path must not launch fused kernels"
    );

    let check = |order: &str, (y, g): (Vec<f32>, Vec<f32>), before: [u64; 4]| {
        let after = activation_launches();
        let names = ["gelu fwd", "gelu bwd", "sigmoid fwd", "sigmoid bwd"];
        for ((name, b), a) in names.iter().zip(before).zip(after) {
            assert!(
                a > b,
                "{order} did not launch the fused {name} kernel (seed {seed})"
            );
        }
        assert_activations(&ours, &y, &g, &format!("{order} (seed {seed})"));
        let off_tanh = g
            .iter()
            .zip(&g_stock_tanh)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            off_tanh < 1e-3,
            "{order}: {off_tanh} from stock gelu_backward (seed {seed})"
        );
    };
    let before = activation_launches();
    check(
        "Liger<Autodiff<_>>",
        activations_step::<Liger<Autodiff<B>>>(&x, &w1, &w2, false, device),
        before,
    );
    let before = activation_launches();
    check(
        "Autodiff<Liger<_>>",
        activations_step::<Autodiff<Liger<B>>>(&x, &w1, &w2, false, device),
        before,
    );
}

#[test]
fn stock_gelu_and_sigmoid_reach_fused_kernels_and_match_stock() {
    match liger_tests::device_name().as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice, WgpuRuntime};
            check_activations::<Wgpu>(&WgpuDevice::Cpu);
            check_activations::<burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>>(
                &WgpuDevice::Cpu,
            );
        }
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "vulkan" => check_activations::<burn::backend::wgpu::Wgpu>(&Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => check_activations::<burn::backend::Cuda>(&Default::default()),
        other => panic!("no CubeCL device for LIGER_TEST_DEVICE={other} in this build"),
    }
}

/// The same through the NdArray fallback: stock values, exact GELU gradient.
#[cfg(feature = "ndarray")]
#[test]
fn liger_activations_over_ndarray_match_stock() {
    use burn::backend::NdArray;
    let device = Default::default();
    let mut rng = liger_tests::fresh_rng();
    let x = rng.vec(ROWS * D, -6.0, 6.0, 0.0);
    let w1 = rng.vec(ROWS * D, -1.0, 1.0, 0.0);
    let w2 = rng.vec(ROWS * D, -1.0, 1.0, 0.0);
    let seed = rng.seed();
    let (y_stock, _) = activations_step::<Autodiff<NdArray>>(&x, &w1, &w2, false, &device);
    let (_, g_exact) = activations_step::<Autodiff<NdArray>>(&x, &w1, &w2, true, &device);
    let stock = activations_expected(&x, &w1, &w2, true);
    assert_activations_stock(&stock, &y_stock, &g_exact, seed);
    // The fallback composes stock Burn's ops: stock's bounds.
    for (order, (y, g)) in [
        (
            "Liger<Autodiff<NdArray>>",
            activations_step::<Liger<Autodiff<NdArray>>>(&x, &w1, &w2, false, &device),
        ),
        (
            "Autodiff<Liger<NdArray>>",
            activations_step::<Autodiff<Liger<NdArray>>>(&x, &w1, &w2, false, &device),
        ),
    ] {
        assert_activations(&stock, &y, &g, &format!("{order} (seed {seed})"));
    }
}
