//! Convergence of training with the fused kernels against the stock Burn computation,
//! like Liger-Kernel's `test/convergence` mini-model tests: the same mini model, from the
//! same initial parameters, trained on the same fixed token batches with AdamW, once with
//! every kernel on (`Liger<Autodiff<B>>`, [`LigerConfig::all`]) and once with every kernel
//! off (`Autodiff<B>`, [`LigerConfig::none`]); the per-step losses and the final
//! parameters must agree within explicit tolerances.
//!
//! Why a training run and not one gradient: the optimizer feeds every step's rounding
//! back into the parameters, so a kernel whose gradients are right "on average" but biased
//! (a wrong scale, a dropped ignore-index, a mis-reduced weight gradient) drifts step
//! after step and shows in the losses and parameters long before it would in one
//! elementwise comparison.
//!
//! The initial parameters do not come from the backend's random generator (whose stream
//! differs between backends and devices): [`SeededInit`] draws every tensor on the host
//! from a generator seeded by the run's seed and the parameter's name, so both runs start
//! from bit-identical values on any device, and each run records a fingerprint of the
//! parameters it actually started from, which [`compare`] checks.

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::params::{Init, ParamSource};
use liger_models::{CausalLm, IGNORE_INDEX, LigerConfig, ModelConfig, ModelError, ModelType};
pub use liger_train::rng::SplitMix64;
use std::time::Instant;

/// FNV-1a over bytes: names to seeds, parameters to fingerprints.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;

/// Initial parameters drawn on the host: each tensor from its own generator, seeded by
/// the run seed and the parameter's Hugging Face name, so the values depend neither on
/// the backend nor on the order the modules are built in. Same distributions as
/// `liger_models`' random initialization (normal with the model's std for weights,
/// zeros for biases, ones for norms).
#[derive(Clone, Debug)]
pub struct SeededInit<B: burn::tensor::backend::Backend> {
    /// Run seed.
    pub seed: u64,
    /// Device of the parameters.
    pub device: B::Device,
    /// Dtype of the parameters (drawn in f32, then cast).
    pub dtype: DType,
    /// Round the drawn values through this dtype first (an f32 run starting from exactly
    /// the parameters of a bf16 run).
    pub round_through: Option<DType>,
    /// Move every drawn value by one unit in the last place of `dtype`, up or down at
    /// random (seeded): a start that differs from the usual one by one rounding only.
    pub jitter: bool,
}

/// `v` moved by one unit in the last place of `dtype` (bf16, f16 or f32), `up` or down.
fn one_ulp(v: f32, dtype: DType, up: bool) -> f32 {
    use burn::tensor::{bf16, f16};
    let step = |bits: u32| -> u32 {
        // On the magnitude bits (the sign bit stays): `up` one step away from zero, else
        // one step towards it (zero itself goes to the smallest subnormal).
        if up {
            bits + 1
        } else {
            bits.saturating_sub(1).max(1)
        }
    };
    match dtype {
        DType::BF16 => {
            bf16::from_bits(step(u32::from(bf16::from_f32(v).to_bits())) as u16).to_f32()
        }
        DType::F16 => f16::from_bits(step(u32::from(f16::from_f32(v).to_bits())) as u16).to_f32(),
        _ => f32::from_bits(step(v.to_bits())),
    }
}

impl<B: burn::tensor::backend::Backend> ParamSource<B> for SeededInit<B> {
    fn tensor<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Result<Tensor<B, D>, ModelError> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = match init {
            Init::Normal(std) => {
                let mut rng = SplitMix64::new(fnv1a(self.seed ^ FNV_OFFSET, name.as_bytes()));
                (0..n).map(|_| (rng.normal() * std) as f32).collect()
            }
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
        };
        let mut t =
            Tensor::<B, D>::from_data(TensorData::new(values, shape), (&self.device, DType::F32));
        if let Some(dtype) = self.round_through {
            t = t.cast(dtype).cast(DType::F32);
        }
        if self.jitter {
            let mut rng = SplitMix64::new(fnv1a(self.seed ^ 0x0717_7E5D, name.as_bytes()));
            let values: Vec<f32> = t
                .into_data()
                .to_vec::<f32>()
                .expect("f32 parameters")
                .into_iter()
                .map(|v| one_ulp(v, self.dtype, rng.below(2) == 1))
                .collect();
            t = Tensor::<B, D>::from_data(
                TensorData::new(values, shape),
                (&self.device, DType::F32),
            );
        }
        Ok(t.cast(self.dtype))
    }
}

/// One convergence experiment: the model, the data and the optimizer.
#[derive(Clone, Debug)]
pub struct ConvergenceSetup {
    /// Short name in reports (`mini-llama`).
    pub name: String,
    /// The mini model.
    pub model: ModelConfig,
    /// Seed of the initial parameters and of the token batches.
    pub seed: u64,
    /// Optimizer steps (one batch each).
    pub steps: usize,
    /// Distinct batches, cycled over the steps (a few, so the loss falls by memorization
    /// within a few dozen steps and the test can see it fall).
    pub batches: usize,
    /// Sequences per batch.
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Share of labels set to -100 at random positions, besides each row's masked prompt.
    pub ignored_share: f64,
    /// Leading positions of each row whose labels are -100 (an SFT prompt).
    pub prompt_len: usize,
    /// AdamW learning rate (constant).
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// Parameter and activation dtype.
    pub dtype: DType,
    /// Feed each batch's sequences in reverse order. The loss (a mean over every
    /// labelled token) and its gradients are mathematically unchanged, but every sum over
    /// the batch (the loss, the weight gradients' products, the embedding gradient) runs
    /// in another order: a second stock run with this set measures the stock path's own
    /// rounding noise (`liger converge --control`).
    pub reverse_rows: bool,
    /// Round the initial parameters through this dtype (see [`SeededInit::round_through`]):
    /// an f32 reference run of a bf16 experiment starts from the bf16 run's parameters.
    pub init_rounding: Option<DType>,
    /// Start every parameter one unit in the last place (of `dtype`) away from the usual
    /// start, up or down at random (see [`SeededInit::jitter`]): a second stock run with
    /// this set measures how far rounding-sized differences alone carry two runs apart
    /// (`liger converge --control-jitter`).
    pub jitter_start: bool,
}

impl ConvergenceSetup {
    /// The mini model of `model_type` used by the tests and `liger converge`: hidden
    /// 64, 2 layers, 4 query heads over 2 key/value heads (GQA), MLP 96, a vocabulary of
    /// 1031 (prime: no power-of-two row width in the loss kernels), Qwen3's q/k norms and
    /// head_dim 24; 32 AdamW steps (Liger-Kernel's count) at lr 2e-3 over 4 batches of
    /// 2 × 48 tokens, with a 6-token masked prompt per row and 10% more labels at -100.
    pub fn mini(model_type: ModelType, dtype: DType) -> Self {
        let mut model = ModelConfig::tiny(model_type);
        model.vocab_size = 1031;
        ConvergenceSetup {
            name: format!("mini-{}", model_type.name()),
            model,
            seed: 42,
            steps: 32,
            batches: 4,
            batch_size: 2,
            seq_len: 48,
            ignored_share: 0.1,
            prompt_len: 6,
            lr: 2e-3,
            weight_decay: 0.01,
            dtype,
            reverse_rows: false,
            init_rounding: None,
            jitter_start: false,
        }
    }

    /// The batches of this setup: `(input_ids, labels)`, each `batch_size × seq_len`,
    /// row-major. Labels are the input ids (the model shifts them) with the prompt and
    /// the random share set to -100.
    pub fn token_batches(&self) -> Vec<(Vec<i64>, Vec<i64>)> {
        // Another stream than the parameters' (those are seeded by name).
        let mut rng = SplitMix64::new(self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xDA7A);
        let n = self.batch_size * self.seq_len;
        (0..self.batches)
            .map(|_| {
                let ids: Vec<i64> = (0..n)
                    .map(|_| rng.below(self.model.vocab_size as u64) as i64)
                    .collect();
                let labels: Vec<i64> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, &id)| {
                        let prompt = i % self.seq_len < self.prompt_len;
                        if prompt || rng.uniform() < self.ignored_share {
                            IGNORE_INDEX
                        } else {
                            id
                        }
                    })
                    .collect();
                if self.reverse_rows {
                    (
                        reversed_rows(&ids, self.seq_len),
                        reversed_rows(&labels, self.seq_len),
                    )
                } else {
                    (ids, labels)
                }
            })
            .collect()
    }
}

/// The rows of `values` (`[rows, seq_len]`, row-major) in reverse order.
fn reversed_rows(values: &[i64], seq_len: usize) -> Vec<i64> {
    values.rchunks(seq_len).flatten().copied().collect()
}

/// A parameter's final value, Hugging Face name and layout, read back as f32.
#[derive(Clone, Debug)]
pub struct NamedParam {
    /// Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Hugging Face shape.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub values: Vec<f32>,
}

/// What one training run produced.
#[derive(Clone, Debug)]
pub struct TrainRun {
    /// `liger on` / `liger off` and the backend.
    pub label: String,
    /// The loss of each step, before that step's update.
    pub losses: Vec<f64>,
    /// Fingerprint of the parameters the run started from (FNV-1a of the f32 bits of
    /// every parameter read back from the device, in name order).
    pub initial_fingerprint: u64,
    /// The parameters after the last step.
    pub params: Vec<NamedParam>,
    /// Wall time of the training loop, seconds.
    pub seconds: f64,
}

impl TrainRun {
    /// Mean loss of the first pass over the batches minus that of the last pass (positive
    /// when training lowered the loss on the same batches).
    pub fn loss_drop(&self, batches: usize) -> f64 {
        let k = batches.clamp(1, self.losses.len().max(1));
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
        mean(&self.losses[..k]) - mean(&self.losses[self.losses.len() - k..])
    }
}

/// Reads every parameter back in Hugging Face layout, as f32.
fn read_params<B: FusedOps>(model: &CausalLm<B>) -> Vec<NamedParam> {
    model
        .hf_params()
        .into_iter()
        .map(|(name, p)| NamedParam {
            name,
            shape: p.hf_shape(),
            values: p
                .hf_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("parameter data reads as f32"),
        })
        .collect()
}

fn fingerprint(params: &[NamedParam]) -> u64 {
    params.iter().fold(FNV_OFFSET, |h, p| {
        let h = fnv1a(h, p.name.as_bytes());
        p.values
            .iter()
            .fold(h, |h, v| fnv1a(h, &v.to_bits().to_le_bytes()))
    })
}

/// The parameters `setup`'s runs start from (Hugging Face names and layout, as f32: the
/// values of `setup.dtype`, exactly).
pub fn initial_params<B: FusedOps>(
    setup: &ConvergenceSetup,
    device: &B::Device,
) -> Vec<NamedParam> {
    read_params(&build_seeded::<B>(setup, LigerConfig::none(), device))
}

/// `setup`'s model with the kernel switches `liger`, from its seeded start.
fn build_seeded<B: FusedOps>(
    setup: &ConvergenceSetup,
    liger: LigerConfig,
    device: &B::Device,
) -> CausalLm<B> {
    let mut src = SeededInit::<B> {
        seed: setup.seed,
        device: device.clone(),
        dtype: setup.dtype,
        round_through: setup.init_rounding,
        jitter: setup.jitter_start,
    };
    CausalLm::<B>::build(setup.model.clone(), liger, &mut src)
        .unwrap_or_else(|e| panic!("{}: building the model: {e}", setup.name))
}

/// Trains `setup`'s model on autodiff backend `B` with the kernel switches `liger`.
pub fn train<B>(
    setup: &ConvergenceSetup,
    liger: LigerConfig,
    label: &str,
    device: &B::Device,
) -> TrainRun
where
    B: AutodiffBackend + FusedOps,
    B::InnerBackend: FusedOps,
    CausalLm<B>: AutodiffModule<B>,
{
    let mut model = build_seeded::<B>(setup, liger, device);
    let initial_fingerprint = fingerprint(&read_params(&model));
    let mut optim = AdamWConfig::new()
        .with_weight_decay(setup.weight_decay)
        .init::<B, CausalLm<B>>();
    let batches: Vec<(Tensor<B, 2, Int>, Tensor<B, 2, Int>)> = setup
        .token_batches()
        .into_iter()
        .map(|(ids, labels)| {
            let shape = [setup.batch_size, setup.seq_len];
            (
                Tensor::from_data(TensorData::new(ids, shape), device),
                Tensor::from_data(TensorData::new(labels, shape), device),
            )
        })
        .collect();
    let start = Instant::now();
    let mut losses = Vec::with_capacity(setup.steps);
    for step in 0..setup.steps {
        let (ids, labels) = batches[step % batches.len()].clone();
        let loss = model.loss(ids, labels);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(setup.lr, model, grads);
        // Read after the update is queued: one synchronization per step either way.
        let value = loss
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .expect("loss reads as f64")[0];
        losses.push(value);
    }
    let params = read_params(&model);
    TrainRun {
        label: label.to_string(),
        losses,
        initial_fingerprint,
        params,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The stock Burn run: `Autodiff<B>`, every kernel switch off.
pub fn train_liger_off<B: FusedOps>(setup: &ConvergenceSetup, device: &B::Device) -> TrainRun {
    train::<Autodiff<B>>(setup, LigerConfig::none(), "liger off", device)
}

/// The fused run: `Liger<Autodiff<B>>` (Burn's softmax/log-softmax primitives fused too),
/// every kernel switch on.
pub fn train_liger_on<B: FusedOps>(setup: &ConvergenceSetup, device: &B::Device) -> TrainRun {
    train::<Liger<Autodiff<B>>>(setup, LigerConfig::all(), "liger on", device)
}

/// How close two runs must be: `|candidate - reference| <= atol + rtol * |reference|`,
/// per step for the losses, per element for the final parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerances {
    /// Loss, absolute.
    pub loss_atol: f64,
    /// Loss, relative.
    pub loss_rtol: f64,
    /// Final parameters, absolute.
    pub param_atol: f64,
    /// Final parameters, relative.
    pub param_rtol: f64,
}

impl Tolerances {
    /// f32: Liger-Kernel's f32 mini-model tolerances (`test/convergence`, e.g.
    /// `mini_llama3`: loss atol 1e-8 rtol 2e-5, parameters atol 5e-3 rtol 1e-5). Our
    /// runs take a 20× larger learning rate than Liger's (2e-3 against 1e-4, so the loss
    /// visibly falls), which makes AdamW amplify rounding differences faster; on lavapipe
    /// the mini models still stay 50x (loss) and 800x (parameters) inside them (see
    /// `tests/convergence.rs`).
    pub fn f32() -> Self {
        Tolerances {
            loss_atol: 1e-8,
            loss_rtol: 2e-5,
            param_atol: 5e-3,
            param_rtol: 1e-5,
        }
    }

    /// bf16 (and f16): Liger-Kernel's bf16 mini-model tolerances (loss atol 1e-3 rtol
    /// 1e-2, parameters atol 1e-2 rtol 1e-2). With 8 mantissa bits every activation
    /// carries ~4e-3 relative rounding, and the fused and stock paths round at different
    /// points (the fused kernels keep f32 inside, the stock ops round every intermediate).
    pub fn half() -> Self {
        Tolerances {
            loss_atol: 1e-3,
            loss_rtol: 1e-2,
            param_atol: 1e-2,
            param_rtol: 1e-2,
        }
    }

    /// The defaults for `dtype`.
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F16 | DType::BF16 => Self::half(),
            _ => Self::f32(),
        }
    }

    fn loss_allowed(&self, reference: f64) -> f64 {
        self.loss_atol + self.loss_rtol * reference.abs()
    }

    pub(crate) fn param_allowed(&self, reference: f64) -> f64 {
        self.param_atol + self.param_rtol * reference.abs()
    }
}

/// One step of a comparison.
#[derive(Clone, Copy, Debug)]
pub struct StepDiff {
    /// Step index (0-based).
    pub step: usize,
    /// Loss of the reference run.
    pub reference: f64,
    /// Loss of the candidate run.
    pub candidate: f64,
    /// `|candidate - reference|`.
    pub diff: f64,
    /// What the tolerances allow at this step.
    pub allowed: f64,
}

/// The parameter element farthest outside (or closest to) its tolerance.
#[derive(Clone, Debug, Default)]
pub struct ParamDiff {
    /// Parameter name.
    pub name: String,
    /// Flat index of the element.
    pub index: usize,
    /// Reference value.
    pub reference: f64,
    /// Candidate value.
    pub candidate: f64,
    /// `|candidate - reference|`.
    pub diff: f64,
    /// What the tolerances allow for it.
    pub allowed: f64,
}

/// The largest absolute difference within one parameter tensor.
#[derive(Clone, Debug)]
pub struct TensorDiff {
    /// Parameter name.
    pub name: String,
    /// Largest `|candidate - reference|` over its elements.
    pub max_abs: f64,
    /// Elements outside the tolerance.
    pub outside: usize,
    /// Elements.
    pub len: usize,
}

/// The outcome of [`compare`].
#[derive(Clone, Debug)]
pub struct ConvergenceReport {
    /// The tolerances applied.
    pub tolerances: Tolerances,
    /// Every step's losses and difference.
    pub steps: Vec<StepDiff>,
    /// The step whose loss difference uses most of its tolerance.
    pub worst_step: Option<StepDiff>,
    /// The parameter element whose difference uses most of its tolerance.
    pub worst_param: Option<ParamDiff>,
    /// Per-tensor largest differences, in the models' parameter order.
    pub tensors: Vec<TensorDiff>,
    /// Both runs started from the same parameters (equal fingerprints).
    pub same_start: bool,
    /// What is out of tolerance (or does not match at all); empty when the runs agree.
    pub failures: Vec<String>,
    /// The failures that are not a parameter tensor's elements out of tolerance (loss
    /// steps, a different start, mismatched runs): never excused by a control run.
    pub general_failures: Vec<String>,
}

impl ConvergenceReport {
    /// Whether the runs agree within the tolerances.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// Largest loss difference over the steps.
    pub fn max_loss_diff(&self) -> f64 {
        self.steps.iter().map(|s| s.diff).fold(0.0, f64::max)
    }

    /// Largest parameter difference over every tensor.
    pub fn max_param_diff(&self) -> f64 {
        self.tensors.iter().map(|t| t.max_abs).fold(0.0, f64::max)
    }

    /// The tensor holding the largest parameter difference.
    pub fn max_param_tensor(&self) -> Option<&TensorDiff> {
        self.tensors
            .iter()
            .max_by(|a, b| a.max_abs.total_cmp(&b.max_abs))
    }

    /// What still fails once a higher-precision run decides the out-of-tolerance
    /// parameters: a tensor is excused when, over its elements outside tolerance, the
    /// candidate's largest distance to `precise` (the same training in f32 from the same
    /// start) is no larger than the reference's ([`ReferenceCheck`]): where the two
    /// low-precision runs disagree, the candidate is the closer one to the f32 result.
    /// Losses, the start and the run shapes are never excused.
    pub fn failures_beyond_reference(&self, checks: &[ReferenceCheck]) -> Vec<String> {
        self.failures_unless(|t| match checks.iter().find(|c| c.name == t.name) {
            Some(c) if c.candidate_error <= c.reference_error => None,
            c => Some(format!(
                "farther from the f32 run than the reference there ({})",
                c.map_or("no f32 run".to_string(), |c| format!(
                    "{:.3e} against {:.3e}",
                    c.candidate_error, c.reference_error
                ))
            )),
        })
    }

    /// What still fails once the gradients themselves have been checked
    /// ([`crate::gradient_check`]). A kernel that computes a biased gradient shows in the
    /// gradient check; what it cannot see is two equally accurate runs whose rounding
    /// differs at every step and whose trajectories drift apart over the steps. How far
    /// that drift goes is measured, not assumed: `drift` compares the reference run with a
    /// second stock run started one rounding away (`liger converge --control-jitter`).
    ///
    /// - When the candidate's gradients were less accurate than the reference's against
    ///   f32 somewhere (`gradients_ok` false), every parameter tensor out of tolerance fails.
    /// - Otherwise, with a `drift` run, a tensor out of tolerance is excused only when its
    ///   largest difference is no larger than the drift run's on the same tensor.
    /// - Without one the parameters are not judged at all (this returns no parameter
    ///   failure): only the losses and the gradient check decide, and the caller must say
    ///   so. (A ceiling such as `2 · lr · steps`, how far AdamW's steps of about `lr` can
    ///   move an element, is no test: two runs never get that far apart.)
    ///
    /// Losses, the start and the run shapes are never excused.
    pub fn failures_beyond_gradients(
        &self,
        gradients_ok: bool,
        drift: Option<&ConvergenceReport>,
    ) -> Vec<String> {
        self.failures_unless(|t| {
            if !gradients_ok {
                return Some(
                    "and liger's gradients were less accurate than stock's somewhere".into(),
                );
            }
            let drift = drift?;
            match drift.tensors.iter().find(|c| c.name == t.name) {
                Some(c) if t.max_abs <= c.max_abs => None,
                c => Some(format!(
                    "beyond stock's own drift from a start one rounding away ({})",
                    c.map_or("no drift run".to_string(), |c| format!(
                        "max |diff| {:.3e}",
                        c.max_abs
                    ))
                )),
            }
        })
    }

    /// The general failures, plus every parameter tensor with elements outside tolerance
    /// that `unexcused` gives a reason for (`None`: excused).
    fn failures_unless(&self, unexcused: impl Fn(&TensorDiff) -> Option<String>) -> Vec<String> {
        let mut out = self.general_failures.clone();
        for t in self.tensors.iter().filter(|t| t.outside > 0) {
            if let Some(why) = unexcused(t) {
                out.push(format!(
                    "{}: {} of {} elements outside tolerance (max |diff| {:.3e}), {why}",
                    t.name, t.outside, t.len, t.max_abs
                ));
            }
        }
        out
    }

    /// What still fails once the stock path's own rounding noise is allowed for.
    /// `control` compares the same reference run with a second stock run that only sums
    /// in another order ([`ConvergenceSetup::reverse_rows`]). A parameter tensor with
    /// elements out of tolerance is excused when its largest difference is no larger
    /// than the control's on the same tensor (the stock path disagrees with itself by as
    /// much); losses, the start and the run shapes are never excused.
    pub fn failures_beyond_noise(&self, control: &ConvergenceReport) -> Vec<String> {
        self.failures_unless(
            |t| match control.tensors.iter().find(|c| c.name == t.name) {
                Some(c) if t.max_abs <= c.max_abs => None,
                c => Some(format!(
                    "more than the stock path's own noise there ({})",
                    c.map_or("no control".to_string(), |c| format!(
                        "max |diff| {:.3e}, {} outside",
                        c.max_abs, c.outside
                    ))
                )),
            },
        )
    }
}

/// How much of the allowance a difference uses (NaN counts as infinitely far).
fn usage(diff: f64, allowed: f64) -> f64 {
    if diff.is_nan() {
        f64::INFINITY
    } else {
        diff / allowed
    }
}

/// The elements of one parameter tensor outside tolerance between two low-precision
/// runs, set against a higher-precision run of the same training.
#[derive(Clone, Debug)]
pub struct ReferenceCheck {
    /// Parameter name.
    pub name: String,
    /// `(flat index, reference, candidate, precise)` of each element outside tolerance.
    pub elements: Vec<(usize, f64, f64, f64)>,
    /// Largest `|candidate - precise|` over those elements.
    pub candidate_error: f64,
    /// Largest `|reference - precise|` over those elements.
    pub reference_error: f64,
}

/// For every parameter tensor where `candidate` and `reference` disagree beyond `tol`,
/// how far each is from `precise` at those elements.
pub fn check_against_precise(
    reference: &TrainRun,
    candidate: &TrainRun,
    precise: &TrainRun,
    tol: &Tolerances,
) -> Vec<ReferenceCheck> {
    let mut checks = Vec::new();
    for ((r, c), p) in reference
        .params
        .iter()
        .zip(&candidate.params)
        .zip(&precise.params)
    {
        if r.name != c.name || r.name != p.name || r.values.len() != p.values.len() {
            continue;
        }
        let elements: Vec<(usize, f64, f64, f64)> = r
            .values
            .iter()
            .zip(&c.values)
            .zip(&p.values)
            .enumerate()
            .filter_map(|(i, ((&rv, &cv), &pv))| {
                let (rv, cv, pv) = (rv as f64, cv as f64, pv as f64);
                (!((cv - rv).abs() <= tol.param_allowed(rv))).then_some((i, rv, cv, pv))
            })
            .collect();
        if elements.is_empty() {
            continue;
        }
        let max_err = |f: &dyn Fn(&(usize, f64, f64, f64)) -> f64| {
            elements.iter().map(f).fold(
                0.0,
                |m: f64, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
            )
        };
        checks.push(ReferenceCheck {
            name: r.name.clone(),
            candidate_error: max_err(&|e| (e.2 - e.3).abs()),
            reference_error: max_err(&|e| (e.1 - e.3).abs()),
            elements,
        });
    }
    checks
}

/// Compares `candidate` (usually liger on) against `reference` (liger off).
pub fn compare(reference: &TrainRun, candidate: &TrainRun, tol: &Tolerances) -> ConvergenceReport {
    let mut failures = Vec::new();
    let same_start = reference.initial_fingerprint == candidate.initial_fingerprint;
    if !same_start {
        failures.push(format!(
            "the runs did not start from the same parameters (fingerprints {:016x} and {:016x})",
            reference.initial_fingerprint, candidate.initial_fingerprint
        ));
    }
    if reference.losses.len() != candidate.losses.len() {
        failures.push(format!(
            "different step counts: {} and {}",
            reference.losses.len(),
            candidate.losses.len()
        ));
    }

    let steps: Vec<StepDiff> = reference
        .losses
        .iter()
        .zip(&candidate.losses)
        .enumerate()
        .map(|(step, (&r, &c))| StepDiff {
            step,
            reference: r,
            candidate: c,
            diff: (c - r).abs(),
            allowed: tol.loss_allowed(r),
        })
        .collect();
    let worst_step = steps
        .iter()
        .copied()
        .max_by(|a, b| usage(a.diff, a.allowed).total_cmp(&usage(b.diff, b.allowed)));
    let outside: Vec<&StepDiff> = steps.iter().filter(|s| !(s.diff <= s.allowed)).collect();
    if let Some(first) = outside.first() {
        failures.push(format!(
            "loss differs at {} of {} steps, first at step {}: {} vs {} (|diff| {:.3e} > {:.3e})",
            outside.len(),
            steps.len(),
            first.step,
            first.candidate,
            first.reference,
            first.diff,
            first.allowed
        ));
    }

    let general_failures_before_params = failures.len();
    let mut worst_param: Option<ParamDiff> = None;
    let mut tensors = Vec::new();
    let mut mismatched = Vec::new();
    if reference.params.len() != candidate.params.len() {
        mismatched.push(format!(
            "different parameter counts: {} and {}",
            reference.params.len(),
            candidate.params.len()
        ));
    }
    for (r, c) in reference.params.iter().zip(&candidate.params) {
        if r.name != c.name || r.shape != c.shape {
            mismatched.push(format!(
                "parameter {} {:?} against {} {:?}",
                r.name, r.shape, c.name, c.shape
            ));
            continue;
        }
        let mut t = TensorDiff {
            name: r.name.clone(),
            max_abs: 0.0,
            outside: 0,
            len: r.values.len(),
        };
        for (index, (&rv, &cv)) in r.values.iter().zip(&c.values).enumerate() {
            let (rv, cv) = (rv as f64, cv as f64);
            let diff = (cv - rv).abs();
            let allowed = tol.param_allowed(rv);
            if !(diff <= allowed) {
                t.outside += 1;
            }
            if diff > t.max_abs || diff.is_nan() {
                t.max_abs = diff;
            }
            let worse = worst_param
                .as_ref()
                .is_none_or(|w| usage(diff, allowed) > usage(w.diff, w.allowed));
            if worse {
                worst_param = Some(ParamDiff {
                    name: r.name.clone(),
                    index,
                    reference: rv,
                    candidate: cv,
                    diff,
                    allowed,
                });
            }
        }
        if t.outside > 0 {
            failures.push(format!(
                "{}: {} of {} elements outside tolerance (max |diff| {:.3e})",
                t.name, t.outside, t.len, t.max_abs
            ));
        }
        tensors.push(t);
    }

    let mut general_failures = failures[..general_failures_before_params].to_vec();
    general_failures.extend(mismatched.iter().cloned());
    failures.extend(mismatched);
    ConvergenceReport {
        tolerances: *tol,
        steps,
        worst_step,
        worst_param,
        tensors,
        same_start,
        failures,
        general_failures,
    }
}

impl std::fmt::Display for ConvergenceReport {
    /// A short summary: verdict, worst step, worst parameter, failures.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tolerances;
        writeln!(
            f,
            "{} ({} steps; loss atol {:.0e} rtol {:.0e}, params atol {:.0e} rtol {:.0e}; same start: {})",
            if self.passed() { "AGREE" } else { "DIFFER" },
            self.steps.len(),
            t.loss_atol,
            t.loss_rtol,
            t.param_atol,
            t.param_rtol,
            if self.same_start { "yes" } else { "NO" }
        )?;
        if let Some(s) = self.worst_step {
            writeln!(
                f,
                "  worst loss step {}: {:.7} vs {:.7}, |diff| {:.3e} (allowed {:.3e}); max over steps {:.3e}",
                s.step,
                s.candidate,
                s.reference,
                s.diff,
                s.allowed,
                self.max_loss_diff()
            )?;
        }
        if let Some(p) = &self.worst_param {
            writeln!(
                f,
                "  worst parameter {}[{}]: {:.6e} vs {:.6e}, |diff| {:.3e} (allowed {:.3e}); max over tensors {:.3e}{}",
                p.name,
                p.index,
                p.candidate,
                p.reference,
                p.diff,
                p.allowed,
                self.max_param_diff(),
                self.max_param_tensor()
                    .map(|t| format!(" in {}", t.name))
                    .unwrap_or_default()
            )?;
        }
        for failure in &self.failures {
            writeln!(f, "  FAIL {failure}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(losses: &[f64], values: &[f32], fp: u64) -> TrainRun {
        TrainRun {
            label: "t".into(),
            losses: losses.to_vec(),
            initial_fingerprint: fp,
            params: vec![NamedParam {
                name: "w".into(),
                shape: vec![values.len()],
                values: values.to_vec(),
            }],
            seconds: 0.0,
        }
    }

    #[test]
    fn generator_is_deterministic_and_normal() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let xs: Vec<f64> = (0..20_000).map(|_| a.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }

    #[test]
    fn batches_mask_prompt_and_stay_in_vocab() {
        let setup = ConvergenceSetup::mini(ModelType::Llama, DType::F32);
        let batches = setup.token_batches();
        assert_eq!(batches.len(), setup.batches);
        let (ids, labels) = &batches[0];
        assert!(ids.iter().all(|&t| (0..1031).contains(&t)));
        assert!(
            labels[..setup.prompt_len]
                .iter()
                .all(|&l| l == IGNORE_INDEX)
        );
        let ignored = labels.iter().filter(|&&l| l == IGNORE_INDEX).count();
        assert!(ignored > 2 * setup.prompt_len && ignored < labels.len() / 2);
        assert_eq!(batches, setup.token_batches());
    }

    #[test]
    fn compare_passes_within_and_fails_outside() {
        let tol = Tolerances::f32();
        let a = run(&[7.0, 6.0], &[0.1, -0.2], 1);
        let b = run(&[7.0 + 1e-4, 6.0], &[0.1 + 1e-3, -0.2], 1);
        let ok = compare(&a, &b, &tol);
        assert!(ok.passed(), "{ok}");
        let c = run(&[7.0, 6.01], &[0.1, -0.2], 1);
        let bad = compare(&a, &c, &tol);
        assert!(!bad.passed());
        assert_eq!(bad.worst_step.unwrap().step, 1);
        let d = run(&[7.0, 6.0], &[0.1, -0.21], 1);
        let bad = compare(&a, &d, &tol);
        assert_eq!(bad.worst_param.as_ref().unwrap().index, 1);
        assert!(!bad.passed());
        assert!(!compare(&a, &run(&[7.0, 6.0], &[0.1, -0.2], 2), &tol).passed());
        assert!(!compare(&a, &run(&[7.0, f64::NAN], &[0.1, -0.2], 1), &tol).passed());
    }

    #[test]
    fn one_ulp_moves_by_exactly_one_step_of_the_dtype() {
        use burn::tensor::bf16;
        for v in [0.0123f32, -0.5, 1.0, -3.75e-3] {
            let b = bf16::from_f32(v).to_f32();
            for up in [true, false] {
                let w = one_ulp(b, DType::BF16, up);
                assert_ne!(w, b);
                let bits = |x: f32| i32::from(bf16::from_f32(x).to_bits());
                assert_eq!((bits(w) - bits(b)).abs(), 1, "{v} {up}");
            }
        }
        assert_eq!(
            one_ulp(1.0, DType::F32, true),
            f32::from_bits(1.0f32.to_bits() + 1)
        );
    }

    #[test]
    fn reversed_rows_hold_the_same_sequences_in_reverse_order() {
        let mut setup = ConvergenceSetup::mini(ModelType::Qwen3, DType::F32);
        setup.batch_size = 3;
        let plain = setup.token_batches();
        setup.reverse_rows = true;
        let reversed = setup.token_batches();
        let t = setup.seq_len;
        for ((ids, labels), (rids, rlabels)) in plain.iter().zip(&reversed) {
            assert_ne!(ids, rids);
            for row in 0..3 {
                let back = 2 - row;
                assert_eq!(ids[row * t..][..t], rids[back * t..][..t]);
                assert_eq!(labels[row * t..][..t], rlabels[back * t..][..t]);
            }
        }
    }

    #[test]
    fn f32_run_excuses_only_parameters_where_the_candidate_is_closer() {
        let tol = Tolerances::half();
        let off = run(&[7.0, 6.0], &[0.1, -0.2, 0.3], 1);
        // Liger on: the first element 3e-2 away (outside 1e-2 + 1e-3).
        let on = run(&[7.0, 6.0], &[0.13, -0.2, 0.3], 1);
        let report = compare(&off, &on, &tol);
        assert!(!report.passed());
        // The f32 run at 0.125: liger is the closer one (5e-3 against 2.5e-2).
        let closer =
            check_against_precise(&off, &on, &run(&[7.0, 6.0], &[0.125, -0.2, 0.3], 1), &tol);
        assert_eq!(closer.len(), 1);
        assert_eq!(closer[0].elements.len(), 1);
        assert!(report.failures_beyond_reference(&closer).is_empty());
        // The f32 run at 0.1: stock is right, liger is not excused.
        let farther =
            check_against_precise(&off, &on, &run(&[7.0, 6.0], &[0.1, -0.2, 0.3], 1), &tol);
        assert_eq!(report.failures_beyond_reference(&farther).len(), 1);
        // Losses are never excused.
        let loss_off = compare(&off, &run(&[7.0, 6.2], &[0.1, -0.2, 0.3], 1), &tol);
        assert_eq!(loss_off.failures_beyond_reference(&closer).len(), 1);
    }

    #[test]
    fn gradient_check_excuses_parameters_only_within_the_measured_drift() {
        let tol = Tolerances::half();
        let a = run(&[2.0, 1.0], &[0.5, 0.5], 1);
        let b = run(&[2.0, 1.0], &[0.5, 0.53], 1);
        let report = compare(&a, &b, &tol);
        assert!(!report.passed());
        // Stock against stock one rounding apart drifted 4e-2 on that tensor: excused.
        let wide = compare(&a, &run(&[2.0, 1.0], &[0.54, 0.5], 1), &tol);
        assert!(
            report
                .failures_beyond_gradients(true, Some(&wide))
                .is_empty()
        );
        // It drifted only 1e-2: liger's 3e-2 fails, gradients as accurate or not.
        let narrow = compare(&a, &run(&[2.0, 1.0], &[0.51, 0.5], 1), &tol);
        let left = report.failures_beyond_gradients(true, Some(&narrow));
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].contains("beyond stock's own drift"), "{left:?}");
        // Less accurate gradients: nothing is excused, drift or not.
        assert_eq!(
            report.failures_beyond_gradients(false, Some(&wide)).len(),
            1
        );
        assert_eq!(report.failures_beyond_gradients(false, None).len(), 1);
        // Without a drift run the parameters are not judged: only the losses decide here.
        assert!(report.failures_beyond_gradients(true, None).is_empty());
        // A loss difference is never excused.
        let c = run(&[2.0, 1.5], &[0.5, 0.5], 1);
        assert!(
            !compare(&a, &c, &tol)
                .failures_beyond_gradients(true, Some(&wide))
                .is_empty()
        );
        assert!(
            !compare(&a, &c, &tol)
                .failures_beyond_gradients(true, None)
                .is_empty()
        );
    }

    #[test]
    fn control_excuses_only_parameters_within_the_stock_noise() {
        let tol = Tolerances::f32();
        let off = run(&[7.0, 6.0], &[0.1, -0.2], 1);
        // Liger on: one element 2e-2 away (outside 5e-3).
        let on = run(&[7.0, 6.0], &[0.1, -0.22], 1);
        let report = compare(&off, &on, &tol);
        assert!(!report.passed());
        // The stock path against itself: 3e-2 on the same tensor excuses it, 1e-2 does not.
        let noisy = compare(&off, &run(&[7.0, 6.0], &[0.13, -0.2], 1), &tol);
        assert!(report.failures_beyond_noise(&noisy).is_empty());
        let quiet = compare(&off, &run(&[7.0, 6.0], &[0.11, -0.2], 1), &tol);
        let left = report.failures_beyond_noise(&quiet);
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].contains("w: 1 of 2"), "{left:?}");
        // A loss outside tolerance is never excused, however noisy the control.
        let loss_off = compare(&off, &run(&[7.0, 6.01], &[0.1, -0.2], 1), &tol);
        assert_eq!(loss_off.failures_beyond_noise(&noisy).len(), 1);
        assert!(
            compare(&off, &off, &tol)
                .failures_beyond_noise(&quiet)
                .is_empty()
        );
    }
}
