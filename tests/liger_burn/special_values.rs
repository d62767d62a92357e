//! NaN, +Inf and -Inf in an input row or a weight: every fused op, forward and gradients,
//! gives what PyTorch gives, on every backend of the test device (both reduction paths)
//! and the NdArray fallback. The expected values are PyTorch's, in f32, from
//! `tests/fixtures/special_values/generate.py` (which documents each reference): each
//! element must be NaN where PyTorch's is, the same infinity where PyTorch's is one, and
//! within the f32 conformance tolerance elsewhere.
//!
//! Attention runs the blockwise composition and the flash kernels (f32, and bf16/f16 on
//! tensor cores) against transformers' eager attention, with each special value where
//! every query that meets it sees it (see the generator). Its finite values are sums over
//! keys or queries that can cancel, so each element's bound comes from the f64
//! reference's magnitudes of the terms it sums ([`attention_bounds`]), as in the attention
//! suites, and not from the element's own size.
//!
//! One documented exception: a cross-entropy row whose target is `ignore_index` has loss
//! 0 and a zero gradient whatever its logits (`CrossEntropyOptions`); PyTorch gives such a
//! row a NaN gradient when it holds a NaN or +Inf (log-softmax's backward multiplies its
//! NaN probabilities by the zero upstream gradient), and the kernel never reads ignored
//! rows.

use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{
    AttentionKernel, AttentionOptions, CrossEntropyOptions, FusedOps, Reduction, RmsNormOptions,
    RopeLayout,
};
use liger_cubecl_kernels::attention::FlashVariant;
use liger_tests::BackendVisitor;
use liger_verify::conformance::Tolerance;
use liger_verify::conformance::attention::{self as attention_reference, Problem};
use liger_verify::conformance::bounded::wrong_outputs;
use serde::Deserialize;
use std::collections::BTreeMap;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/special_values/special_values.json"
);

/// A value of the fixture: a number, or "nan", "inf", "-inf".
#[derive(Deserialize, Clone, Copy, Debug)]
#[serde(untagged)]
enum Value {
    Number(f64),
    Special(Special),
}

#[derive(Deserialize, Clone, Copy, Debug)]
enum Special {
    #[serde(rename = "nan")]
    Nan,
    #[serde(rename = "inf")]
    Inf,
    #[serde(rename = "-inf")]
    NegInf,
}

impl Value {
    fn get(self) -> f64 {
        match self {
            Value::Number(v) => v,
            Value::Special(Special::Nan) => f64::NAN,
            Value::Special(Special::Inf) => f64::INFINITY,
            Value::Special(Special::NegInf) => f64::NEG_INFINITY,
        }
    }
}

#[derive(Deserialize, Clone, Debug)]
struct Floats {
    shape: Vec<usize>,
    data: Vec<Value>,
}

impl Floats {
    fn values(&self) -> Vec<f64> {
        self.data.iter().map(|v| v.get()).collect()
    }
}

#[derive(Deserialize, Clone, Debug)]
struct Ints {
    data: Vec<i64>,
}

#[derive(Deserialize, Clone, Debug)]
struct Case {
    op: String,
    case: String,
    options: serde_json::Value,
    inputs: BTreeMap<String, Floats>,
    int_inputs: BTreeMap<String, Ints>,
    grad_outputs: BTreeMap<String, Floats>,
    outputs: BTreeMap<String, Floats>,
    grads: BTreeMap<String, Floats>,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(FIXTURE).unwrap_or_else(|e| {
        panic!("{FIXTURE}: {e} (run tests/fixtures/special_values/generate.py)")
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{FIXTURE}: {e}"))
}

type A<B> = Autodiff<B>;

/// Runs one case on `Autodiff<B>`: `(name, values)` of every output and gradient the case
/// lists (outputs as `output`/`loss`/..., gradients as `grad_<input>`).
struct Runner<'a, B: FusedOps> {
    case: &'a Case,
    device: &'a B::Device,
    /// The implementation an `attention` case runs, and the dtype of its inputs.
    attention: AttentionKernel,
    dtype: DType,
}

impl<B: FusedOps> Runner<'_, B> {
    fn tensor<const D: usize>(&self, floats: &Floats) -> Tensor<A<B>, D> {
        assert_eq!(floats.shape.len(), D, "{}: rank", self.case.case);
        let shape: [usize; D] = floats.shape.clone().try_into().unwrap();
        let data: Vec<f32> = floats.data.iter().map(|v| v.get() as f32).collect();
        Tensor::from_data(TensorData::new(data, shape), (self.device, self.dtype))
    }

    fn input<const D: usize>(&self, name: &str) -> Tensor<A<B>, D> {
        self.tensor(&self.case.inputs[name]).require_grad()
    }

    fn constant<const D: usize>(&self, name: &str) -> Tensor<A<B>, D> {
        self.tensor(&self.case.inputs[name])
    }

    fn grad_output<const D: usize>(&self, name: &str) -> Tensor<A<B>, D> {
        self.tensor(&self.case.grad_outputs[name])
    }

    fn targets(&self) -> Tensor<A<B>, 1, Int> {
        let t = &self.case.int_inputs["targets"].data;
        Tensor::from_data(TensorData::new(t.clone(), [t.len()]), self.device)
    }

    fn option(&self, key: &str) -> f64 {
        self.case.options[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: option {key}", self.case.case))
    }

    fn eps(&self) -> f64 {
        self.option("eps")
    }

    fn cross_entropy_options(&self) -> CrossEntropyOptions {
        let o = &self.case.options;
        let reduction = match o["reduction"].as_str().unwrap() {
            "mean" => Reduction::Mean,
            "sum" => Reduction::Sum,
            _ => Reduction::None,
        };
        let z = self.option("lse_square_scale");
        CrossEntropyOptions::default()
            .with_ignore_index(o["ignore_index"].as_i64().unwrap())
            .with_label_smoothing(self.option("label_smoothing"))
            .with_lse_square_scale(z)
            .with_return_z_loss(z != 0.0)
            .with_softcap(o["softcap"].as_f64())
            .with_reduction(reduction)
    }

    fn run(&self) -> Vec<(String, Vec<f64>)> {
        let mut out = Vec::new();
        let mut put = |name: &str, t: Vec<f64>| out.push((name.to_string(), t));
        match self.case.op.as_str() {
            op @ ("rms_norm" | "rms_norm_gemma") => {
                let (x, w) = (self.input::<2>("x"), self.input::<1>("weight"));
                let options = if op == "rms_norm" {
                    RmsNormOptions::llama(self.eps())
                } else {
                    RmsNormOptions::gemma(self.eps())
                };
                let y = functional::rms_norm(x.clone(), w.clone(), options);
                let grads = (y.clone() * self.grad_output::<2>("output"))
                    .sum()
                    .backward();
                put("output", values(y.inner()));
                put("grad_x", values(x.grad(&grads).unwrap()));
                put("grad_weight", values(w.grad(&grads).unwrap()));
            }
            "fused_add_rms_norm" => {
                let (x, r, w) = (
                    self.input::<2>("x"),
                    self.input::<2>("residual"),
                    self.input::<1>("weight"),
                );
                let options = RmsNormOptions::llama(self.eps());
                let (y, s) =
                    functional::fused_add_rms_norm(x.clone(), r.clone(), w.clone(), options);
                let grads = ((y.clone() * self.grad_output::<2>("output")).sum()
                    + (s.clone() * self.grad_output::<2>("sum")).sum())
                .backward();
                put("output", values(y.inner()));
                put("sum", values(s.inner()));
                put("grad_x", values(x.grad(&grads).unwrap()));
                put("grad_residual", values(r.grad(&grads).unwrap()));
                put("grad_weight", values(w.grad(&grads).unwrap()));
            }
            "layer_norm" => {
                let (x, w, b) = (
                    self.input::<2>("x"),
                    self.input::<1>("weight"),
                    self.input::<1>("bias"),
                );
                let y = functional::layer_norm(x.clone(), w.clone(), Some(b.clone()), self.eps());
                let grads = (y.clone() * self.grad_output::<2>("output"))
                    .sum()
                    .backward();
                put("output", values(y.inner()));
                put("grad_x", values(x.grad(&grads).unwrap()));
                put("grad_weight", values(w.grad(&grads).unwrap()));
                put("grad_bias", values(b.grad(&grads).unwrap()));
            }
            op @ ("softmax" | "log_softmax" | "gelu" | "sigmoid") => {
                let x = self.input::<2>("x");
                let y = match op {
                    "softmax" => functional::softmax(x.clone(), 1),
                    "log_softmax" => functional::log_softmax(x.clone(), 1),
                    "gelu" => functional::gelu(x.clone()),
                    _ => functional::sigmoid(x.clone()),
                };
                let grads = (y.clone() * self.grad_output::<2>("output"))
                    .sum()
                    .backward();
                put("output", values(y.inner()));
                put("grad_x", values(x.grad(&grads).unwrap()));
            }
            op @ ("swiglu" | "geglu") => {
                let (gate, up) = (self.input::<2>("gate"), self.input::<2>("up"));
                let y = if op == "swiglu" {
                    functional::swiglu(gate.clone(), up.clone())
                } else {
                    functional::geglu(gate.clone(), up.clone())
                };
                let grads = (y.clone() * self.grad_output::<2>("output"))
                    .sum()
                    .backward();
                put("output", values(y.inner()));
                put("grad_gate", values(gate.grad(&grads).unwrap()));
                put("grad_up", values(up.grad(&grads).unwrap()));
            }
            "rope" => {
                let layout = match self.case.options["layout"].as_str().unwrap() {
                    "rotate_half" => RopeLayout::RotateHalf,
                    _ => RopeLayout::Interleaved,
                };
                let (q, k) = (self.input::<4>("q"), self.input::<4>("k"));
                let (qo, ko) = functional::rope(
                    q.clone(),
                    k.clone(),
                    self.constant::<3>("cos"),
                    self.constant::<3>("sin"),
                    layout,
                );
                let grads = ((qo.clone() * self.grad_output::<4>("q")).sum()
                    + (ko.clone() * self.grad_output::<4>("k")).sum())
                .backward();
                put("q", values(qo.inner()));
                put("k", values(ko.inner()));
                put("grad_q", values(q.grad(&grads).unwrap()));
                put("grad_k", values(k.grad(&grads).unwrap()));
            }
            "cross_entropy" => {
                let logits = self.input::<2>("logits");
                let options = self.cross_entropy_options();
                let out = functional::cross_entropy(logits.clone(), self.targets(), None, options);
                let grads = self.loss_backward(out.loss.clone(), options);
                put("loss", values(out.loss.inner()));
                if let Some(z) = out.z_loss {
                    put("z_loss", values(z.inner()));
                }
                put("grad_logits", values(logits.grad(&grads).unwrap()));
            }
            "fused_linear_cross_entropy" => {
                let (x, w, b) = (
                    self.input::<2>("x"),
                    self.input::<2>("weight"),
                    self.input::<1>("bias"),
                );
                let options = self.cross_entropy_options();
                let out = functional::fused_linear_cross_entropy(
                    x.clone(),
                    w.clone(),
                    Some(b.clone()),
                    self.targets(),
                    None,
                    options,
                );
                let grads = self.loss_backward(out.loss.clone(), options);
                put("loss", values(out.loss.inner()));
                if let Some(z) = out.z_loss {
                    put("z_loss", values(z.inner()));
                }
                put("grad_x", values(x.grad(&grads).unwrap()));
                put("grad_weight", values(w.grad(&grads).unwrap()));
                put("grad_bias", values(b.grad(&grads).unwrap()));
            }
            "attention" => {
                let (q, k, v) = (
                    self.input::<4>("q"),
                    self.input::<4>("k"),
                    self.input::<4>("v"),
                );
                let options = AttentionOptions {
                    scale: self.option("scale"),
                    causal: self.case.options["causal"].as_bool().unwrap(),
                    window: None,
                    kernel: self.attention,
                    deterministic: false,
                };
                let y = functional::attention(q.clone(), k.clone(), v.clone(), None, options);
                let grads = (y.clone() * self.grad_output::<4>("output"))
                    .sum()
                    .backward();
                put("output", values(y.inner()));
                put("grad_q", values(q.grad(&grads).unwrap()));
                put("grad_k", values(k.grad(&grads).unwrap()));
                put("grad_v", values(v.grad(&grads).unwrap()));
            }
            other => panic!("{FIXTURE}: unknown op {other}"),
        }
        out
    }

    /// `loss.backward()` for a reduced loss, `(loss · g).sum().backward()` per row.
    fn loss_backward(
        &self,
        loss: Tensor<A<B>, 1>,
        options: CrossEntropyOptions,
    ) -> <A<B> as burn::tensor::backend::AutodiffBackend>::Gradients {
        match options.reduction {
            Reduction::None => (loss * self.grad_output::<1>("loss")).sum().backward(),
            _ => loss.backward(),
        }
    }
}

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(DType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// PyTorch's values of `name` (`grad_<input>` for gradients), with the documented
/// exception: ignored cross-entropy rows have a zero gradient (see the module docs).
fn expected(case: &Case, name: &str) -> Vec<f64> {
    let floats = match name.strip_prefix("grad_") {
        Some(input) => &case.grads[input],
        None => &case.outputs[name],
    };
    let mut v = floats.values();
    if case.op == "cross_entropy" && name == "grad_logits" {
        let ignore = case.options["ignore_index"].as_i64().unwrap();
        let width = floats.shape[1];
        for (row, &t) in case.int_inputs["targets"].data.iter().enumerate() {
            if t == ignore {
                v[row * width..(row + 1) * width].fill(0.0);
            }
        }
    }
    v
}

/// How far a finite result may be from PyTorch's.
enum Bounds {
    /// One tolerance for every element (ops whose results do not cancel).
    Fixed(Tolerance),
    /// A bound for each element ([`attention_bounds`]).
    PerElement(Vec<f64>),
}

impl Bounds {
    fn at(&self, i: usize, expected: f64) -> f64 {
        match self {
            Bounds::Fixed(tol) => tol.atol + tol.rtol * expected.abs(),
            Bounds::PerElement(b) => b[i],
        }
    }
}

/// Where `actual` differs from `expected`: NaN against NaN, the same infinity, finite
/// values within `bounds` (a bound that is not finite rejects the element).
fn mismatches(actual: &[f64], expected: &[f64], bounds: &Bounds) -> Vec<String> {
    if actual.len() != expected.len() {
        return vec![format!(
            "{} values, expected {}",
            actual.len(),
            expected.len()
        )];
    }
    actual
        .iter()
        .zip(expected)
        .enumerate()
        .filter_map(|(i, (&a, &e))| {
            let differs = if e.is_nan() || a.is_nan() {
                !(e.is_nan() && a.is_nan())
            } else if e.is_infinite() || a.is_infinite() {
                a != e
            } else {
                let bound = bounds.at(i, e);
                !bound.is_finite() || (a - e).abs() > bound
            };
            differs.then(|| format!("[{i}] {a} (PyTorch {e})"))
        })
        .collect()
}

/// The per-element bounds of attention result `name` (`output`, `grad_q`, `grad_k`,
/// `grad_v`) of an `attention` case run in `dtype`: the attention suites' bound of our
/// result in `dtype` (scores and sums in f32, probabilities and `dS` rounded to `dtype`
/// before their products; [`attention_reference::row_tolerance`]) plus the same bound in
/// f32 for PyTorch's eager result, each from the f64 reference's magnitudes of the terms
/// the element sums. An element whose sum meets a NaN or an infinity has no finite bound.
fn attention_bounds(case: &Case, name: &str, dtype: DType) -> Vec<f64> {
    let [q, k, v, g] = [
        &case.inputs["q"],
        &case.inputs["k"],
        &case.inputs["v"],
        &case.grad_outputs["output"],
    ]
    .map(Floats::values);
    let (shape_q, shape_k) = (&case.inputs["q"].shape, &case.inputs["k"].shape);
    let scale = case.options["scale"].as_f64().unwrap();
    assert_eq!(
        scale,
        (shape_q[3] as f64).powf(-0.5),
        "{}: the reference scales by head_dim^-0.5",
        case.case
    );
    let problem = Problem {
        batch: shape_q[0],
        q_heads: shape_q[1],
        kv_heads: shape_k[1],
        seq: shape_q[2],
        head_dim: shape_q[3],
        causal: case.options["causal"].as_bool().unwrap(),
        window: None,
        documents: None,
        mask: None,
    };
    let reference = attention_reference::reference(&problem, &q, &k, &v, &g);
    let which = match name {
        "output" => 0,
        "grad_q" => 1,
        "grad_k" => 2,
        "grad_v" => 3,
        other => panic!("attention has no result {other}"),
    };
    let bound = |dtype: DType| {
        let tol = attention_reference::row_tolerance(dtype, &problem);
        reference.element_bounds(which, tol, dtype, DType::F32)
    };
    bound(dtype)
        .iter()
        .zip(bound(DType::F32))
        .map(|(ours, torch)| ours + torch)
        .collect()
}

struct SpecialValues {
    fixture: Fixture,
    failures: Vec<String>,
    checked: usize,
}

impl BackendVisitor for SpecialValues {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        for case in &self.fixture.cases {
            // Attention runs the blockwise composition and, where they run, the flash kernels:
            // in f32, and in bf16 and f16 where they run on tensor cores (the fixture's inputs
            // are on a 1/64 grid, exact in both).
            let mut runs = vec![(AttentionKernel::Auto, DType::F32)];
            if case.op == "attention" {
                runs = vec![(AttentionKernel::Blockwise, DType::F32)];
                let head_dim = case.inputs["q"].shape[3];
                let flash = AttentionOptions::causal(head_dim).with_kernel(AttentionKernel::Flash);
                for dtype in [DType::F32, DType::BF16, DType::F16] {
                    let runs_here =
                        match B::flash_attention_variant(device, dtype, head_dim, &flash) {
                            Some(FlashVariant::Fma) => dtype == DType::F32,
                            Some(_) => true,
                            None => false,
                        };
                    if runs_here {
                        runs.push((AttentionKernel::Flash, dtype));
                    }
                }
            }
            for (attention, dtype) in runs {
                let results = Runner::<B> {
                    case,
                    device,
                    attention,
                    dtype,
                }
                .run();
                let listed = case.outputs.len() + case.grads.len();
                assert_eq!(
                    results.len(),
                    listed,
                    "{} {}: the runner returns {:?}, the fixture lists {listed} tensors",
                    case.op,
                    case.case,
                    results.iter().map(|r| &r.0).collect::<Vec<_>>()
                );
                let path = if case.op == "attention" {
                    format!(" ({attention:?}, {dtype:?})")
                } else {
                    String::new()
                };
                for (name, actual) in results {
                    let bounds = if case.op == "attention" {
                        Bounds::PerElement(attention_bounds(case, &name, dtype))
                    } else {
                        Bounds::Fixed(Tolerance::for_dtype(dtype))
                    };
                    let bad = mismatches(&actual, &expected(case, &name), &bounds);
                    if !bad.is_empty() {
                        self.failures.push(format!(
                            "{label} {} {}{path} {name}: {} of {} differ: {}",
                            case.op,
                            case.case,
                            bad.len(),
                            actual.len(),
                            bad.iter().take(6).cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                    self.checked += 1;
                }
            }
        }
    }
}

#[test]
fn nan_and_inf_propagate_as_in_pytorch() {
    let mut visitor = SpecialValues {
        fixture: fixture(),
        failures: Vec::new(),
        checked: 0,
    };
    liger_tests::for_each_backend(&mut visitor);
    assert!(visitor.checked > 0, "no case ran");
    assert!(
        visitor.failures.is_empty(),
        "{} of {} tensors differ from PyTorch:\n{}",
        visitor.failures.len(),
        visitor.checked,
        visitor.failures.join("\n")
    );
}

/// The project's wrong outputs ([`wrong_outputs`]: zeros, doubled, the last row dropped,
/// rows shifted, the buffer transposed) of PyTorch's attention result, rows of `head_dim`,
/// changed where it is finite only: built from its finite values (NaN and infinities as
/// 0), with its NaN and infinities put back. `(what, values)` for each that alters a
/// finite value.
fn wrong_attention_results(expected: &[f64], head_dim: usize) -> Vec<(&'static str, Vec<f64>)> {
    let finite: Vec<f64> = expected
        .iter()
        .map(|&e| if e.is_finite() { e } else { 0.0 })
        .collect();
    wrong_outputs(&finite, expected.len() / head_dim, head_dim)
        .into_iter()
        .map(|(what, mut wrong)| {
            for (w, &e) in wrong.iter_mut().zip(expected) {
                if !e.is_finite() {
                    *w = e;
                }
            }
            (what, wrong)
        })
        .filter(|(_, wrong)| {
            wrong
                .iter()
                .zip(expected)
                .any(|(w, e)| e.is_finite() && w != e)
        })
        .collect()
}

/// The attention comparison can fail: PyTorch's own results pass their bounds in the
/// loosest dtype (bf16), and every change of [`wrong_attention_results`] is rejected
/// there, for every attention case and result.
#[test]
fn the_attention_bounds_reject_wrong_results() {
    let fixture = fixture();
    let mut tried = 0;
    for case in fixture.cases.iter().filter(|c| c.op == "attention") {
        for name in ["output", "grad_q", "grad_k", "grad_v"] {
            let expected = expected(case, name);
            if !expected.iter().any(|e| e.is_finite()) {
                continue; // NaN throughout: nothing for a bound to judge.
            }
            let head_dim = case.inputs["q"].shape[3];
            let bounds = Bounds::PerElement(attention_bounds(case, name, DType::BF16));
            let right = mismatches(&expected, &expected, &bounds);
            assert!(
                right.is_empty(),
                "{} {name}: PyTorch's own values fail: {right:?}",
                case.case
            );
            let wrong = wrong_attention_results(&expected, head_dim);
            assert!(
                wrong.len() >= 4,
                "{} {name}: only {} changes apply",
                case.case,
                wrong.len()
            );
            for (what, wrong) in wrong {
                assert!(
                    !mismatches(&wrong, &expected, &bounds).is_empty(),
                    "{} {name}: {what} passes the bf16 bounds",
                    case.case
                );
            }
            tried += 1;
        }
    }
    // The fixture's attention cases have 8 results with finite values (the others are NaN
    // throughout).
    assert!(
        tried >= 8,
        "only {tried} attention results have finite values"
    );
}
