//! The gradients of a half-precision convergence experiment's batches, fused and stock,
//! against an f32 run at exactly the same parameters: which of the two half-precision
//! paths computes the gradient more accurately, tensor by tensor.
//!
//! Why: after 32 AdamW steps a few parameter elements of the bf16 runs differ by more than
//! the tolerance (`liger converge`), and neither the stock path's own noise
//! (`--control`) nor the f32 trajectory (`--f32-reference`) decides whether that is
//! rounding noise amplified by AdamW (which turns any gradient, however tiny, into a step
//! of about `lr`) or a bias in a fused kernel. A bias would show here, before any
//! optimizer step: the fused path's gradient would be farther from the f32 gradient than
//! the stock path's. The output-projection rows of tokens that are neither a target nor
//! an input of the batch (their gradient is `Σ_t p_t,v h_t`, made only of near-zero
//! probabilities) are measured on their own, since those rows hold the outliers.

use crate::convergence::{ConvergenceSetup, NamedParam, Tolerances};
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::params::{Init, ParamSource};
use liger_models::{CausalLm, IGNORE_INDEX, LigerConfig, ModelError};
use std::collections::HashMap;

/// Parameters given by value (Hugging Face names and layout), cast to the model's dtype:
/// several models built from exactly the same values.
pub struct GivenParams<'a, B: burn::tensor::backend::Backend> {
    params: HashMap<&'a str, &'a NamedParam>,
    device: B::Device,
    dtype: DType,
}

impl<'a, B: burn::tensor::backend::Backend> GivenParams<'a, B> {
    /// A source of `params` on `device` in `dtype`.
    pub fn new(params: &'a [NamedParam], device: &B::Device, dtype: DType) -> Self {
        GivenParams {
            params: params.iter().map(|p| (p.name.as_str(), p)).collect(),
            device: device.clone(),
            dtype,
        }
    }
}

impl<B: burn::tensor::backend::Backend> ParamSource<B> for GivenParams<'_, B> {
    fn tensor<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        _init: Init,
    ) -> Result<Tensor<B, D>, ModelError> {
        let p = self
            .params
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                expected: shape.to_vec(),
                location: "the given parameters".to_string(),
            })?;
        if p.shape != shape {
            return Err(ModelError::Config {
                path: "the given parameters".to_string(),
                message: format!(
                    "parameter {name}: given shape {:?}, the model wants {shape:?}",
                    p.shape
                ),
            });
        }
        let data = TensorData::new(p.values.clone(), shape);
        Ok(Tensor::<B, D>::from_data(data, (&self.device, DType::F32)).cast(self.dtype))
    }
}

/// The gradient of the loss of `setup`'s batch `batch` at `params`, per parameter (Hugging
/// Face names and layout, as f32), on autodiff backend `B` with the kernel switches `liger`.
/// The model runs in `setup.dtype`; `params` are cast to it.
pub fn gradients<B>(
    setup: &ConvergenceSetup,
    liger: LigerConfig,
    params: &[NamedParam],
    batch: usize,
    device: &B::Device,
) -> Vec<NamedParam>
where
    B: AutodiffBackend + FusedOps,
    CausalLm<B>: AutodiffModule<B>,
{
    let mut src = GivenParams::<B>::new(params, device, setup.dtype);
    let model = CausalLm::<B>::build(setup.model.clone(), liger, &mut src)
        .unwrap_or_else(|e| panic!("{}: building the model: {e}", setup.name));
    let (ids, labels) = setup.token_batches().swap_remove(batch % setup.batches);
    let shape = [setup.batch_size, setup.seq_len];
    let loss = model.loss(
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids, shape), device),
        Tensor::<B, 2, Int>::from_data(TensorData::new(labels, shape), device),
    );
    let grads = loss.backward();
    model
        .hf_params()
        .into_iter()
        .map(|(name, p)| {
            let shape = p.hf_shape();
            let values = match p.hf_grad(&grads) {
                Some(g) => g
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .expect("gradient reads as f32"),
                // Not reached by the backward: a zero gradient.
                None => vec![0.0; shape.iter().product()],
            };
            NamedParam {
                name,
                shape,
                values,
            }
        })
        .collect()
}

/// The three gradients of one batch at `params`: stock in `setup.dtype`, fused in
/// `setup.dtype`, and stock in f32 (the precise one).
pub struct GradientTriple {
    /// `Autodiff<B>`, every switch off, `setup.dtype`.
    pub stock: Vec<NamedParam>,
    /// `Liger<Autodiff<B>>`, every switch on, `setup.dtype`.
    pub liger: Vec<NamedParam>,
    /// `Autodiff<B>`, every switch off, f32.
    pub precise: Vec<NamedParam>,
}

/// Computes the [`GradientTriple`] at `params` (values the half-precision models hold
/// exactly, e.g. read back from one of them) for every batch of `setup`: each parameter's
/// values are the batches' gradients one after the other, so the errors pool all batches
/// (one batch alone gives noisy error norms for small tensors such as biases).
pub fn gradient_triple<B: FusedOps>(
    setup: &ConvergenceSetup,
    params: &[NamedParam],
    device: &B::Device,
) -> GradientTriple {
    let mut precise_setup = setup.clone();
    precise_setup.dtype = DType::F32;
    GradientTriple {
        stock: over_batches(setup, |b| {
            gradients::<Autodiff<B>>(setup, LigerConfig::none(), params, b, device)
        }),
        liger: liger_gradients::<B>(setup, LigerConfig::all(), params, device),
        precise: over_batches(setup, |b| {
            gradients::<Autodiff<B>>(&precise_setup, LigerConfig::none(), params, b, device)
        }),
    }
}

/// `one(b)` for every batch `b` of `setup`, each parameter's values concatenated in
/// batch order (the shape stays one batch's).
fn over_batches(
    setup: &ConvergenceSetup,
    mut one: impl FnMut(usize) -> Vec<NamedParam>,
) -> Vec<NamedParam> {
    let mut all = one(0);
    for b in 1..setup.batches {
        for (acc, g) in all.iter_mut().zip(one(b)) {
            acc.values.extend(g.values);
        }
    }
    all
}

/// The fused run's gradients over every batch (as [`gradient_triple`]) with the kernel
/// switches `switches` (`Liger<Autodiff<B>>`, so Burn's softmax, log-softmax, GELU and
/// sigmoid primitives are fused whatever the switches): one kernel's gradients can be set
/// against the stock and f32 ones of a [`GradientTriple`].
pub fn liger_gradients<B: FusedOps>(
    setup: &ConvergenceSetup,
    switches: LigerConfig,
    params: &[NamedParam],
    device: &B::Device,
) -> Vec<NamedParam> {
    over_batches(setup, |b| {
        gradients::<Liger<Autodiff<B>>>(setup, switches, params, b, device)
    })
}

/// One switch at a time, for [`liger_gradients`]: the decorator alone (every switch off),
/// then each kernel switch alone. Names and configurations.
pub fn single_switches() -> Vec<(&'static str, LigerConfig)> {
    let only = |set: fn(&mut LigerConfig)| {
        let mut c = LigerConfig::none();
        set(&mut c);
        c
    };
    vec![
        ("decorator only", LigerConfig::none()),
        ("rope", only(|c| c.rope = true)),
        ("rms_norm", only(|c| c.rms_norm = true)),
        ("swiglu", only(|c| c.swiglu = true)),
        ("cross_entropy", only(|c| c.cross_entropy = true)),
        (
            "fused_linear_cross_entropy",
            only(|c| c.fused_linear_cross_entropy = true),
        ),
        ("attention", only(|c| c.attention = true)),
    ]
}

/// Vocabulary rows whose token no batch of `setup` shows, neither as a target (a label
/// that is not -100, after the one-position shift) nor as an input: their
/// output-projection gradient is made only of the softmax's small probabilities.
pub fn unseen_tokens(setup: &ConvergenceSetup) -> Vec<usize> {
    let mut seen = vec![false; setup.model.vocab_size];
    for (ids, labels) in setup.token_batches() {
        for (i, &l) in labels.iter().enumerate() {
            if i % setup.seq_len != 0 && l != IGNORE_INDEX {
                seen[l as usize] = true;
            }
        }
        for &t in &ids {
            seen[t as usize] = true;
        }
    }
    (0..seen.len()).filter(|&v| !seen[v]).collect()
}

/// Normwise relative error `‖g - r‖₂ / ‖r‖₂` over the elements `select` keeps (`NaN`
/// when the reference is zero there).
fn relative_error(g: &[f32], r: &[f32], select: impl Fn(usize) -> bool) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&a, &b)) in g.iter().zip(r).enumerate() {
        if select(i) {
            let (a, b) = (f64::from(a), f64::from(b));
            num += (a - b) * (a - b);
            den += b * b;
        }
    }
    (num / den).sqrt()
}

/// One tensor's (or row subset's) gradient errors against the f32 gradient.
#[derive(Clone, Debug)]
pub struct GradientError {
    /// Parameter name (with ` [unseen rows]` for the output-projection subset).
    pub name: String,
    /// `‖g_f32‖₂` over the measured elements.
    pub norm: f64,
    /// Normwise relative error of the stock half-precision gradient.
    pub stock: f64,
    /// Normwise relative error of the fused half-precision gradient.
    pub liger: f64,
    /// What the fused error may be: `max(1.5 · stock, 2u)` (see [`GradientCheck`]).
    pub allowed: f64,
}

impl GradientError {
    /// Whether the fused gradient is within what is allowed (NaN fails).
    pub fn passed(&self) -> bool {
        self.liger <= self.allowed
    }
}

/// The errors of every parameter's gradient, plus the unseen output-projection rows.
///
/// The rule, fixed before the first measurement: the fused gradient passes when its
/// normwise error is at most 1.5 times the stock one's, or at most `2u` (`u` the unit
/// roundoff of `dtype`, 2⁻⁸ for bf16: one rounding of each operand is that much), since
/// two paths rounding at different points cannot be ranked below that.
#[derive(Clone, Debug)]
pub struct GradientCheck {
    /// One entry per parameter, then the unseen rows of the output projection.
    pub errors: Vec<GradientError>,
}

impl GradientCheck {
    /// Compares `triple` (all in the same parameter order); `unseen` are the vocabulary
    /// rows measured apart on the output projection (`lm_head.weight`, or the tied
    /// `model.embed_tokens.weight`).
    pub fn new(triple: &GradientTriple, unseen: &[usize], dtype: DType) -> Self {
        let u = match dtype {
            DType::BF16 => 2f64.powi(-8),
            DType::F16 => 2f64.powi(-11),
            _ => 2f64.powi(-24),
        };
        let entry =
            |name: String, s: &[f32], l: &[f32], p: &[f32], select: &dyn Fn(usize) -> bool| {
                let stock = relative_error(s, p, select);
                GradientError {
                    name,
                    norm: p
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| select(*i))
                        .map(|(_, &v)| f64::from(v) * f64::from(v))
                        .sum::<f64>()
                        .sqrt(),
                    stock,
                    liger: relative_error(l, p, select),
                    allowed: (1.5 * stock).max(2.0 * u),
                }
            };
        let mut errors = Vec::new();
        for ((s, l), p) in triple.stock.iter().zip(&triple.liger).zip(&triple.precise) {
            assert!(
                s.name == l.name && s.name == p.name,
                "gradients in different orders"
            );
            errors.push(entry(
                s.name.clone(),
                &s.values,
                &l.values,
                &p.values,
                &|_| true,
            ));
        }
        let head = ["lm_head.weight", "model.embed_tokens.weight"]
            .iter()
            .find_map(|n| triple.precise.iter().position(|p| p.name == *n));
        if let Some(k) = head {
            let width = triple.precise[k].shape[1];
            // One batch's elements; the values hold every batch's in turn.
            let len = triple.precise[k].shape.iter().product::<usize>();
            let mut rows = vec![false; triple.precise[k].shape[0]];
            unseen.iter().for_each(|&v| rows[v] = true);
            errors.push(entry(
                format!("{} [{} unseen rows]", triple.precise[k].name, unseen.len()),
                &triple.stock[k].values,
                &triple.liger[k].values,
                &triple.precise[k].values,
                &|i| rows[(i % len) / width],
            ));
        }
        GradientCheck { errors }
    }

    /// Entries where the fused gradient is less accurate than allowed.
    pub fn failures(&self) -> Vec<&GradientError> {
        self.errors.iter().filter(|e| !e.passed()).collect()
    }
}

/// A parameter element where two runs ended out of tolerance, with its gradient at the
/// point of a [`GradientTriple`] (summed over the batches: one pass's gradient).
#[derive(Clone, Debug)]
pub struct OutlierGradient {
    /// Parameter name and flat index (Hugging Face layout).
    pub name: String,
    /// Flat index in the parameter.
    pub index: usize,
    /// `|candidate - reference|` of the final parameters.
    pub param_diff: f64,
    /// The f32 gradient there.
    pub precise: f64,
    /// Root mean square of the tensor's f32 gradient (the scale `precise` compares to).
    pub tensor_rms: f64,
    /// `|stock - f32|` there.
    pub stock_error: f64,
    /// `|liger - f32|` there.
    pub liger_error: f64,
}

/// Every element where `candidate`'s and `reference`'s final parameters differ beyond
/// `tol` (at most `limit`), with the gradients of `triple` there: when the f32 gradient of
/// such an element is no larger than the half-precision gradients' errors, rounding
/// decides the sign of its AdamW steps.
pub fn outlier_gradients(
    reference: &[NamedParam],
    candidate: &[NamedParam],
    tol: &Tolerances,
    triple: &GradientTriple,
    limit: usize,
) -> Vec<OutlierGradient> {
    let mut out = Vec::new();
    for (r, c) in reference.iter().zip(candidate) {
        let Some(k) = triple.precise.iter().position(|p| p.name == r.name) else {
            continue;
        };
        let len = r.values.len();
        // One pass's gradient: the batches' gradients summed, per element.
        let summed = |g: &NamedParam| -> Vec<f64> {
            let mut acc = vec![0.0f64; len];
            for (i, &v) in g.values.iter().enumerate() {
                acc[i % len] += f64::from(v);
            }
            acc
        };
        let (precise, stock, liger) = (
            summed(&triple.precise[k]),
            summed(&triple.stock[k]),
            summed(&triple.liger[k]),
        );
        let rms = (precise.iter().map(|g| g * g).sum::<f64>() / len as f64).sqrt();
        for (i, (&rv, &cv)) in r.values.iter().zip(&c.values).enumerate() {
            let (rv, cv) = (f64::from(rv), f64::from(cv));
            if (cv - rv).abs() <= tol.param_allowed(rv) || out.len() >= limit {
                continue;
            }
            out.push(OutlierGradient {
                name: r.name.clone(),
                index: i,
                param_diff: (cv - rv).abs(),
                precise: precise[i],
                tensor_rms: rms,
                stock_error: (stock[i] - precise[i]).abs(),
                liger_error: (liger[i] - precise[i]).abs(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, shape: Vec<usize>, values: Vec<f32>) -> NamedParam {
        NamedParam {
            name: name.into(),
            shape,
            values,
        }
    }

    #[test]
    fn fused_gradient_passes_only_within_the_rule() {
        let precise = vec![param(
            "lm_head.weight",
            vec![2, 2],
            vec![1.0, -1.0, 0.5, 0.25],
        )];
        let stock = vec![param(
            "lm_head.weight",
            vec![2, 2],
            vec![1.01, -1.0, 0.5, 0.25],
        )];
        // Twice the stock error on the seen row: fails; the unseen row (1) is exact.
        let worse = vec![param(
            "lm_head.weight",
            vec![2, 2],
            vec![1.02, -1.0, 0.5, 0.25],
        )];
        let triple = GradientTriple {
            stock: stock.clone(),
            liger: worse,
            precise: precise.clone(),
        };
        let check = GradientCheck::new(&triple, &[1], DType::BF16);
        assert_eq!(check.errors.len(), 2);
        assert!(!check.errors[0].passed(), "{:?}", check.errors[0]);
        assert!(check.errors[1].passed(), "{:?}", check.errors[1]);
        assert!((check.errors[0].stock - 0.01 / 2.3125f64.sqrt()).abs() < 1e-6);
        // Within 1.5x of stock: passes.
        let close = vec![param(
            "lm_head.weight",
            vec![2, 2],
            vec![1.012, -1.0, 0.5, 0.25],
        )];
        let triple = GradientTriple {
            stock,
            liger: close,
            precise,
        };
        assert!(
            GradientCheck::new(&triple, &[1], DType::BF16)
                .failures()
                .is_empty()
        );
    }

    #[test]
    fn outliers_are_the_elements_out_of_tolerance_with_their_summed_gradients() {
        let reference = vec![param("w", vec![3], vec![0.0, 1.0, 2.0])];
        let candidate = vec![param("w", vec![3], vec![0.0, 1.5, 2.001])];
        // Two batches' gradients, one after the other.
        let triple = GradientTriple {
            stock: vec![param("w", vec![3], vec![1.0, 0.01, 1.0, 1.0, 0.02, 1.0])],
            liger: vec![param("w", vec![3], vec![1.0, -0.01, 1.0, 1.0, 0.0, 1.0])],
            precise: vec![param("w", vec![3], vec![1.0, 0.0, 1.0, 1.0, 0.005, 1.0])],
        };
        let out = outlier_gradients(&reference, &candidate, &Tolerances::half(), &triple, 8);
        assert_eq!(out.len(), 1);
        let o = &out[0];
        assert_eq!((o.name.as_str(), o.index), ("w", 1));
        assert!((o.param_diff - 0.5).abs() < 1e-6);
        assert!((o.precise - 0.005).abs() < 1e-6);
        assert!((o.stock_error - 0.025).abs() < 1e-6);
        assert!((o.liger_error - 0.015).abs() < 1e-6);
    }

    #[test]
    fn unseen_tokens_exclude_inputs_and_shifted_targets() {
        let setup = ConvergenceSetup::mini(liger_models::ModelType::Llama, DType::F32);
        let unseen = unseen_tokens(&setup);
        for ((ids, labels), v) in setup
            .token_batches()
            .iter()
            .flat_map(|b| unseen.iter().map(move |v| (b, v)))
        {
            assert!(!ids.contains(&(*v as i64)));
            assert!(
                labels
                    .iter()
                    .enumerate()
                    .all(|(i, &l)| i % setup.seq_len == 0 || l != *v as i64)
            );
        }
        assert!(!unseen.is_empty() && unseen.len() < setup.model.vocab_size);
    }
}
