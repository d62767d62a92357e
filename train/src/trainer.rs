//! The training loop: micro-batches → token-weighted loss → gradients accumulated over
//! `grad_accum` micro-batches → global-norm clipping → AdamW step at the scheduled
//! learning rate → metrics, checkpoints.
//!
//! Generic over [`TrainBackend`]: `Liger<Autodiff<X>>` trains with the fused kernels
//! (README, "Wrapping order"), `Autodiff<X>` with `LigerConfig::none()` with stock Burn
//! ops. The optimizer is liger-burn's AdamW either way (one fused kernel per parameter on
//! CubeCL devices, Burn's AdamW numbers); f16/bf16 runs train in mixed precision (f32
//! master weights and moments in its state, forward and backward in the low dtype) unless
//! [`TrainConfig::pure_low_precision`].
//!
//! Determinism: the data order is a function of the seed ([`crate::batching`]), the model
//! is initialized from it ([`random_model`]), and every parameter is made contiguous
//! before the first step and after each update ([`contiguous_params`]) so a model read
//! back from a checkpoint has the same memory layout, hence the same matmul summation
//! order, as the one that kept training. LoRA's dropout masks come from the backend's
//! generator, seeded before each step from the run's seed and the step
//! ([`TrainConfig::step_seed`]). A resumed run therefore repeats the
//! uninterrupted one: bit for bit on NdArray (losses, gradient norms, parameters), to 1e-6
//! relative on CubeCL backends, where a fused reduction may sum in another order in the
//! resumed process.

use crate::batching::{Batch, BatchStream, Cursor, epoch_batches, epoch_pair_batches};
use crate::checkpoint::{self, DataInfo, STATE_FORMAT, TrainerState};
use crate::clipping::clip_global_norm;
pub use crate::config::TrainConfig;
use crate::data::Dataset;
use crate::error::TrainError;
use crate::method::{MethodConfig, micro_batch_loss};
use crate::metrics::{CsvLog, StepMetrics, TrainSummary};
use crate::tokenizer::TextTokenizer;
use burn::module::{AutodiffModule, Module, ModuleMapper, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
use hashbrown::HashMap;
use liger_burn::ops::FusedOps;
use liger_burn::optim::AdamW;
use liger_models::{CausalLm, Documents, LigerConfig, ModelConfig};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Optimizer steps of `epochs` passes over `dataset` (at least 1): the micro-batches of
/// each epoch (packing makes their number depend on the epoch's order) divided by
/// `grad_accum`, rounded up (the last step may take micro-batches of the next epoch).
pub fn steps_for_epochs(
    dataset: &Dataset,
    config: &TrainConfig,
    pad_id: u32,
    epochs: usize,
) -> usize {
    let micro: usize = (0..epochs)
        .map(|e| {
            if dataset.paired {
                return epoch_pair_batches(
                    &dataset.examples,
                    config.seed,
                    e,
                    config.batch_size,
                    config.max_length,
                    pad_id,
                )
                .len();
            }
            epoch_batches(
                &dataset.examples,
                config.seed,
                e,
                config.layout,
                config.batch_size,
                config.max_length,
                pad_id,
            )
            .len()
        })
        .sum();
    micro.div_ceil(config.grad_accum).max(1)
}

/// A backend the trainer runs on: an autodiff backend with the fused ops, whose inner
/// backend (where the optimizer steps) has them too.
pub trait TrainBackend: AutodiffBackend<InnerBackend: FusedOps> + FusedOps {}

impl<B: AutodiffBackend<InnerBackend: FusedOps> + FusedOps> TrainBackend for B {}

/// The optimizer.
pub type Optim<B> = OptimizerAdaptor<AdamW, CausalLm<B>, B>;
/// The optimizer state of one parameter (moments, and the f32 master weights of an
/// f16/bf16 run in mixed precision).
pub type ParamRecord<B> = AdaptorRecord<AdamW, B>;
/// The optimizer state, by parameter id.
pub type OptimRecord<B> = HashMap<ParamId, ParamRecord<B>>;

/// A randomly initialized model, deterministic in `seed` (the backend's generator is
/// seeded first).
pub fn random_model<B: FusedOps>(
    config: &ModelConfig,
    liger: LigerConfig,
    dtype: DType,
    device: &B::Device,
    seed: u64,
) -> CausalLm<B> {
    B::seed(device, seed);
    CausalLm::init(config, liger, dtype, device)
}

/// `model` with LoRA adapters (`lora`) and its base frozen ([`CausalLm::with_lora`]),
/// their `A` drawn from the backend's generator seeded from `seed`, so a run's adapters
/// start the same every time.
pub fn attach_lora<B: FusedOps>(
    model: CausalLm<B>,
    lora: &liger_models::LoraConfig,
    seed: u64,
    device: &B::Device,
) -> Result<CausalLm<B>, TrainError> {
    B::seed(
        device,
        crate::rng::SplitMix64::new(seed ^ 0x4C6F_5241).next_u64(),
    );
    Ok(model.with_lora(lora)?)
}

/// Every float parameter copied on the device into a fresh contiguous buffer (same id,
/// values, dtype). Parameters built as transposed views (linear weights keep Hugging
/// Face's `[out, in]` storage) and parameters written in place by a fused optimizer update
/// (which takes the layout of the buffer it reuses) have other strides than a parameter
/// read back from a checkpoint, and matmuls sum in a layout-dependent order. Applied
/// before the first step and after every update, so a resumed run computes exactly as the
/// uninterrupted one (an extra copy of the parameters per step).
pub fn contiguous_params<B: AutodiffBackend, M: Module<B>>(module: M) -> M {
    module.map(&mut Contiguous { frozen_too: true })
}

/// [`contiguous_params`] for the parameters that train only: what an optimizer step
/// rewrote. Frozen parameters (a LoRA run's base) keep the buffers
/// [`contiguous_params`] gave them before the first step.
pub fn contiguous_trainable_params<B: AutodiffBackend, M: Module<B>>(module: M) -> M {
    module.map(&mut Contiguous { frozen_too: false })
}

struct Contiguous {
    frozen_too: bool,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Contiguous {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !self.frozen_too && !param.val().is_require_grad() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let grad = tensor.is_require_grad();
        let inner = tensor.inner();
        let dims = inner.dims();
        let ranges: [std::ops::Range<usize>; D] = std::array::from_fn(|i| 0..dims[i]);
        // `slice_assign` writes into the new zero buffer: its layout, the values copied.
        let copy = inner.zeros_like().slice_assign(ranges, inner);
        let mut t = Tensor::from_inner(copy);
        if grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Callbacks of a run (progress display). Every method has an empty default.
pub trait TrainObserver {
    /// Before the first step: the step the run starts after, and the last step.
    fn on_start(&mut self, _done: usize, _total: usize) {}
    /// After each optimizer step.
    fn on_step(&mut self, _metrics: &StepMetrics, _total: usize) {}
    /// After a checkpoint was written.
    fn on_checkpoint(&mut self, _step: usize, _dir: &Path) {}
}

impl TrainObserver for () {}

/// A checkpoint to continue from: optimizer state (keyed by the model's ids) and trainer state.
pub struct Resume<B: TrainBackend> {
    /// The AdamW state (moments; f32 master weights in mixed precision).
    pub optimizer: OptimRecord<B>,
    /// Step, cursor, settings, history.
    pub state: TrainerState,
}

/// Everything a run needs.
pub struct Run<'a, B: TrainBackend> {
    /// The model to train (random or loaded; the checkpoint's when resuming).
    pub model: CausalLm<B>,
    /// Tokenized examples.
    pub dataset: &'a Dataset,
    /// The tokenizer (its JSON goes into checkpoints, its pad id into batches).
    pub tokenizer: &'a TextTokenizer,
    /// Settings.
    pub config: TrainConfig,
    /// Output directory (checkpoints, `train_log.csv`).
    pub output: PathBuf,
    /// Continue a checkpoint.
    pub resume: Option<Resume<B>>,
    /// Device pool bytes reserved (CubeCL devices), read after a device sync.
    pub memory: Option<Box<dyn Fn() -> u64 + 'a>>,
    /// Which kernels are on, in words (stored in the trainer state).
    pub kernels: String,
    /// The frozen model the method compares to: DPO's and KTO's reference (the policy
    /// before its first step), distillation's teacher; on the inner backend (no graph).
    pub frozen: Option<CausalLm<B::InnerBackend>>,
    /// The checkpoint the run started from (`None`: a random model); stored in the trainer
    /// state, and in a LoRA checkpoint's `adapter_config.json`.
    pub base_model: Option<String>,
}

/// Loss and gradients of one optimizer step, or why there are none.
struct StepGrads<B: AutodiffBackend> {
    grads: GradientsParams,
    /// Mean loss over the step's trained tokens (SFT) or sequences, `[1]`.
    loss: Option<Tensor<B::InnerBackend, 1>>,
    /// The method's metrics, weighted over the micro-batches as the loss.
    extra: Vec<f64>,
}

/// What a micro-batch weighs in its step's loss: its share of the step's trained tokens
/// (SFT, distillation: means over tokens), of its pairs (preference losses) or sequences
/// (KTO: means over sequences).
fn batch_weight(method: &MethodConfig, b: &Batch) -> usize {
    match method {
        MethodConfig::Sft | MethodConfig::Distill(_) => b.trained,
        MethodConfig::Preference(_) => b.batch / 2,
        MethodConfig::Kto(_) => b.batch,
    }
}

/// Forward and backward of `batches`; each micro-batch's mean loss is weighted by its
/// share of the step ([`batch_weight`]), so the accumulated gradient is that of the mean
/// loss over all of them (not the mean of per-micro-batch means).
fn step_grads<B: TrainBackend>(
    model: &CausalLm<B>,
    frozen: Option<&CausalLm<B::InnerBackend>>,
    dataset: &Dataset,
    method: &MethodConfig,
    batches: &[Batch],
    device: &B::Device,
) -> StepGrads<B>
where
    CausalLm<B>: AutodiffModule<B>,
{
    let total: usize = batches.iter().map(|b| batch_weight(method, b)).sum();
    let mut acc = GradientsAccumulator::<CausalLm<B>>::new();
    let mut loss: Option<Tensor<B::InnerBackend, 1>> = None;
    let mut extra = vec![0.0; method.metric_names().len()];
    for b in batches.iter().filter(|b| b.trained > 0) {
        let share = batch_weight(method, b) as f64 / total as f64;
        let ids =
            Tensor::<B, 2, Int>::from_data(TensorData::new(b.input_ids.clone(), b.shape()), device);
        let labels =
            Tensor::<B, 2, Int>::from_data(TensorData::new(b.labels.clone(), b.shape()), device);
        let raw = match method {
            MethodConfig::Sft => match &b.documents {
                Some(docs) => {
                    model.loss_packed(ids, labels, &Documents::new(docs.clone(), b.shape()))
                }
                None => model.loss(ids, labels),
            },
            _ => {
                let desirable = (!dataset.desirable.is_empty()).then(|| {
                    let d: Vec<i64> = b
                        .rows
                        .iter()
                        .map(|r| i64::from(dataset.desirable[r[0]]))
                        .collect();
                    Tensor::<B, 1, Int>::from_data(TensorData::new(d, [b.batch]), device)
                });
                let (l, metrics) = micro_batch_loss(method, model, frozen, ids, labels, desirable);
                for (e, m) in extra.iter_mut().zip(metrics) {
                    *e += m * share;
                }
                l
            }
        };
        let weighted = raw.mul_scalar(share);
        acc.accumulate(model, model.backward(weighted.clone()));
        let value = weighted.inner();
        loss = Some(match loss {
            None => value,
            Some(l) => l + value,
        });
    }
    StepGrads {
        grads: acc.grads(),
        loss,
        extra,
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Refuses a dataset with a label (other than -100) outside `[0, vocab)`, naming the data
/// line: the tokenizer and the model's `vocab_size` disagree. This is the check the losses
/// otherwise make on the device at every step (`LigerConfig::check_targets`); the input
/// ids go to the embedding lookup unchecked, as Burn's `Embedding` takes them.
fn check_labels(dataset: &Dataset, vocab: usize) -> Result<(), TrainError> {
    for ex in &dataset.examples {
        let bad = ex
            .labels
            .iter()
            .find(|&&l| l != liger_models::IGNORE_INDEX && (l < 0 || l as usize >= vocab));
        if let Some(bad) = bad {
            return Err(TrainError::Config(format!(
                "{} line {}: label {bad} is outside the model's vocabulary [0, {vocab}): the \
                 tokenizer does not belong to this model (or the model's vocab_size is too small)",
                dataset.source_name, ex.line
            )));
        }
    }
    Ok(())
}

/// Trains `run.config.schedule.total_steps` steps (continuing `run.resume`), writing
/// `train_log.csv` and checkpoints to `run.output`.
///
/// Stops with [`TrainError::NonFinite`] when a step's loss or gradient norm is NaN/inf and
/// with [`TrainError::Panicked`] when a step panics, after saving the last good state
/// (the previous step's) as a checkpoint.
pub fn train<B: TrainBackend>(
    run: Run<'_, B>,
    observer: &mut dyn TrainObserver,
) -> Result<TrainSummary, TrainError>
where
    CausalLm<B>: AutodiffModule<B>,
{
    let Run {
        model,
        dataset,
        tokenizer,
        config,
        output,
        resume,
        memory,
        kernels,
        frozen,
        base_model,
    } = run;
    config.validate()?;
    let method = config.method;
    if method.needs_frozen() && frozen.is_none() {
        return Err(TrainError::Config(format!(
            "--method {} needs a frozen {} model",
            method.name(),
            if matches!(method, MethodConfig::Distill(_)) {
                "teacher (--teacher DIR)"
            } else {
                "reference"
            }
        )));
    }
    if method.paired() != dataset.paired
        || matches!(method, MethodConfig::Kto(_)) == dataset.desirable.is_empty()
    {
        return Err(TrainError::Config(format!(
            "--method {} reads {} rows, but {} holds other rows",
            method.name(),
            match method {
                MethodConfig::Preference(_) => "{\"prompt\", \"chosen\", \"rejected\"}",
                MethodConfig::Kto(_) => "{\"prompt\", \"completion\", \"label\"}",
                _ => "instruction or text",
            },
            dataset.source_name
        )));
    }
    if model.lora_config() != config.lora.as_ref() {
        return Err(TrainError::Config(format!(
            "the model's LoRA adapters ({:?}) are not the run's settings ({:?}): attach them \
             with CausalLm::with_lora (or load_adapter) before training",
            model.lora_config(),
            config.lora
        )));
    }
    let lora_dropout = config.lora.as_ref().is_some_and(|l| l.dropout > 0.0);
    let device = model.device();
    let data = DataInfo {
        source: dataset.source_name.clone(),
        examples: dataset.examples.len(),
        hash: dataset.hash,
    };
    // Every label against the vocabulary, once, on the host: the loss then need not read
    // the targets back from the device at every step (a wait that leaves the GPU idle
    // while the backward is queued).
    check_labels(dataset, model.config.vocab_size)?;
    let checked = LigerConfig {
        check_targets: false,
        ..model.liger
    };
    let mut model = contiguous_params(model.with_liger(checked));
    let mut optim: Optim<B> = config.adamw().init::<B, CausalLm<B>>();
    let (mut step, cursor, mut tokens_seen, mut history) = match resume {
        None => (0, Cursor::default(), 0, Vec::new()),
        Some(Resume { optimizer, state }) => {
            if state.data.hash != data.hash || state.data.examples != data.examples {
                return Err(TrainError::Config(format!(
                    "the checkpoint was trained on {} ({} examples, hash {:016x}); this run's data \
                     is {} ({} examples, hash {:016x}): resume with the same data and policies",
                    state.data.source,
                    state.data.examples,
                    state.data.hash,
                    data.source,
                    data.examples,
                    data.hash
                )));
            }
            if state.config != config {
                return Err(TrainError::Config(format!(
                    "the checkpoint's settings differ from this run's:\n  checkpoint: {:?}\n  \
                     this run:   {:?}",
                    state.config, config
                )));
            }
            optim = optim.load_record(optimizer);
            (state.step, state.cursor, state.tokens_seen, state.history)
        }
    };
    std::fs::create_dir_all(&output).map_err(|e| TrainError::io(&output, e))?;
    let mut csv = CsvLog::create_with(&output, &history, &method.metric_names())?;
    let pad = tokenizer.specials.pad;
    let mut stream = BatchStream::new(
        &dataset.examples,
        config.seed,
        config.layout,
        config.batch_size,
        config.max_length,
        pad,
        cursor,
    );
    if dataset.paired {
        stream = stream.paired();
    }
    let total = config.schedule.total_steps;
    let dtype_name = format!("{:?}", model.dtype()).to_lowercase();
    let state_at =
        |step: usize, cursor: Cursor, tokens_seen: usize, history: &[StepMetrics]| TrainerState {
            format: STATE_FORMAT,
            step,
            cursor,
            config: config.clone(),
            data: data.clone(),
            tokens_seen,
            kernels: kernels.clone(),
            dtype: dtype_name.clone(),
            base_model: base_model.clone(),
            history: history.to_vec(),
        };
    // Saves the state of a failed step's predecessor; never panics.
    let save_last_good = |model: &CausalLm<B>,
                          record: OptimRecord<B>,
                          state: TrainerState,
                          saved: &Option<(usize, PathBuf)>|
     -> String {
        if state.step == 0 {
            return "; no step had finished, nothing saved".into();
        }
        if let Some((s, dir)) = saved
            && *s == state.step
        {
            return format!("; the last good state is {}", dir.display());
        }
        let r = catch_unwind(AssertUnwindSafe(|| {
            checkpoint::save(&output, model, record, &tokenizer.json, &state)
        }));
        match r {
            Ok(Ok(dir)) => format!(
                "; the last good state (step {}) was saved to {}",
                state.step,
                dir.display()
            ),
            Ok(Err(e)) => format!("; saving the last good state failed too: {e}"),
            Err(p) => format!(
                "; saving the last good state panicked too: {}",
                panic_text(p.as_ref())
            ),
        }
    };

    observer.on_start(step, total);
    let started = Instant::now();
    let first_step = step;
    let mut peak_memory: Option<u64> = None;
    let mut saved: Option<(usize, PathBuf)> = None;
    while step < total {
        let next = step + 1;
        let lr = config.schedule.lr(next);
        let t = Instant::now();
        let cursor_before = stream.cursor();
        let batches: Vec<Batch> = (0..config.grad_accum)
            .map(|_| stream.next_batch())
            .collect();
        let trained: usize = batches.iter().map(|b| b.trained).sum();
        let tokens: usize = batches.iter().map(|b| b.tokens).sum();
        let good = |history: &[StepMetrics]| state_at(step, cursor_before, tokens_seen, history);

        // Forward + backward (+ clipping), panics caught: the model and the optimizer are
        // untouched until `optim.step`.
        if lora_dropout {
            B::seed(&device, config.step_seed(next));
        }
        let grads = catch_unwind(AssertUnwindSafe(|| {
            let StepGrads {
                mut grads,
                loss,
                extra,
            } = step_grads(&model, frozen.as_ref(), dataset, &method, &batches, &device);
            let loss: f64 = match loss {
                Some(l) => l.into_scalar().elem(),
                None => 0.0,
            };
            let clip = clip_global_norm::<B, _>(&model, &mut grads, config.max_grad_norm);
            (grads, loss, clip, extra)
        }));
        let (grads, loss, clip, extra) = match grads {
            Ok(g) => g,
            Err(p) => {
                let message = panic_text(p.as_ref());
                let saved = save_last_good(&model, optim.to_record(), good(&history), &saved);
                return Err(TrainError::Panicked {
                    step: next,
                    message,
                    saved,
                });
            }
        };
        for (what, value) in [("loss", loss), ("gradient norm", clip.norm)] {
            if !value.is_finite() {
                let saved = save_last_good(&model, optim.to_record(), good(&history), &saved);
                return Err(TrainError::NonFinite {
                    step: next,
                    what,
                    value,
                    saved,
                });
            }
        }
        // Handles on the pre-step state (no copy) so a panicking update can still save it
        // (the fused step then writes fresh buffers instead of updating in place).
        let (backup_model, backup_optim) = (model.clone(), optim.to_record());
        // Contiguous parameters, materialized by the sync, are what a resumed run starts
        // from: the next step then computes (and fuses) the same operations in both.
        match catch_unwind(AssertUnwindSafe(|| {
            let model = contiguous_trainable_params(optim.step(lr, model, grads));
            B::sync(&device).expect("device synchronization after the optimizer step");
            model
        })) {
            Ok(m) => model = m,
            Err(p) => {
                let message = panic_text(p.as_ref());
                let saved = save_last_good(&backup_model, backup_optim, good(&history), &saved);
                return Err(TrainError::Panicked {
                    step: next,
                    message,
                    saved,
                });
            }
        }
        drop((backup_model, backup_optim));
        let memory_bytes = memory.as_ref().map(|f| f());
        if let Some(m) = memory_bytes {
            peak_memory = Some(peak_memory.map_or(m, |p| p.max(m)));
        }
        let seconds = t.elapsed().as_secs_f64();
        step = next;
        tokens_seen += tokens;
        let metrics = StepMetrics {
            step,
            epoch: stream.cursor().epoch,
            loss,
            lr,
            grad_norm: clip.norm,
            clipped: clip.scale < 1.0,
            tokens,
            trained_tokens: trained,
            seconds,
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
            memory_bytes,
            extra: method.metric_names().into_iter().zip(extra).collect(),
        };
        csv.append(&metrics)?;
        history.push(metrics);
        observer.on_step(history.last().expect("just pushed"), total);
        if step == total || (config.save_every > 0 && step % config.save_every == 0) {
            let state = state_at(step, stream.cursor(), tokens_seen, &history);
            let dir =
                checkpoint::save(&output, &model, optim.to_record(), &tokenizer.json, &state)?;
            observer.on_checkpoint(step, &dir);
            saved = Some((step, dir));
        }
    }
    let ran = &history[first_step.min(history.len())..];
    let checkpoint = match saved {
        Some((_, dir)) => dir,
        // Resumed at the last step already: nothing ran, the checkpoint is the input's.
        None => checkpoint::checkpoint_dir(&output, step),
    };
    Ok(TrainSummary {
        steps: ran.len(),
        last_step: step,
        tokens: ran.iter().map(|m| m.tokens).sum(),
        seconds: started.elapsed().as_secs_f64(),
        first_loss: ran.first().map_or(f64::NAN, |m| m.loss),
        last_loss: ran.last().map_or(f64::NAN, |m| m.loss),
        peak_memory_bytes: peak_memory,
        checkpoint,
        log: csv.path().to_path_buf(),
        history: ran.to_vec(),
    })
}
