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

/// `tf32`: stock Burn's products are TF32 here (Liger's go to cuBLASLt, true f32), so
/// norm-wise within TF32's bound; else elementwise.
fn assert_close(name: &str, a: &[f32], b: &[f32], tf32: bool) {
    assert_eq!(a.len(), b.len(), "{name}: lengths differ");
    if tf32 {
        let f64s = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
        let c = liger_verify::conformance::compare_normwise(
            "",
            &f64s(a),
            &f64s(b),
            liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE,
        );
        assert!(c.passed, "{name}: liger vs stock (TF32): {c:?}");
        return;
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
            "{name}[{i}]: liger {x} vs stock {y}"
        );
    }
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
    let loss_tol = if tf32 {
        liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE
    } else {
        1e-5
    };
    assert!(
        (loss - stock_loss).abs() as f64 <= loss_tol * (1.0 + stock_loss.abs() as f64),
        "loss {loss} vs stock {stock_loss} (seed {seed})"
    );
    for (i, (g, s)) in grads.iter().zip(&stock_grads).enumerate() {
        assert_close(&format!("grad #{i} (seed {seed})"), g, s, tf32);
    }

    // Autodiff<Liger<B>>: Burn's autodiff decomposes softmax/layer_norm before Liger sees
    // them (documented in liger_burn::backend), so the stock model is not fused...
    let before = launches();
    let (loss, grads) = step::<Autodiff<Liger<B>>>(&inputs, device);
    assert_eq!(
        launches(),
        before,
        "Autodiff<Liger<_>> unexpectedly fused stock ops; update the docs"
    );
    assert!(
        (loss - stock_loss).abs() as f64 <= loss_tol * (1.0 + stock_loss.abs() as f64),
        "Autodiff<Liger<_>> loss {loss} vs stock {stock_loss} (seed {seed})"
    );
    for (i, (g, s)) in grads.iter().zip(&stock_grads).enumerate() {
        assert_close(&format!("grad #{i}"), g, s, tf32);
    }
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
    assert!((loss - stock_loss).abs() <= 1e-5 + 1e-5 * stock_loss.abs());
    for (i, (g, s)) in grads.iter().zip(&stock_grads).enumerate() {
        assert_close(&format!("grad #{i}"), g, s, false);
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
        assert_close(&format!("{order} y (seed {seed})"), &y, &y_stock, false);
        assert_close(&format!("{order} grad (seed {seed})"), &g, &g_exact, false);
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
    let (y_stock, _) = activations_step::<Autodiff<NdArray>>(&x, &w1, &w2, false, &device);
    let (_, g_exact) = activations_step::<Autodiff<NdArray>>(&x, &w1, &w2, true, &device);
    for (y, g) in [
        activations_step::<Liger<Autodiff<NdArray>>>(&x, &w1, &w2, false, &device),
        activations_step::<Autodiff<Liger<NdArray>>>(&x, &w1, &w2, false, &device),
    ] {
        assert_close("y", &y, &y_stock, false);
        assert_close("grad", &g, &g_exact, false);
    }
}
