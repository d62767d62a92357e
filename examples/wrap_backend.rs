//! # Wrap a backend: a stock Burn program on `Liger<Autodiff<B>>`
//!
//! A small transformer classifier made only of `burn::nn` modules (`Embedding`,
//! `TransformerEncoder` with its `LayerNorm`s, the multi-head attention's softmax and the
//! GELU feed-forward, a sigmoid gate, `Linear`, `CrossEntropyLoss`) trains with
//! burn-train's `Learner` on a synthetic task: which of four marker tokens occurs most
//! often in a sequence of 16. The one liger-specific line is the backend type,
//! `Liger<Autodiff<B>>` ([`TrainBackend`]): `Liger` routes Burn's `layer_norm`, `softmax`,
//! `log_softmax`, `gelu` and `sigmoid` primitives, and so these modules, to liger-burn's
//! fused kernels, forward and backward.
//!
//! The loss and accuracy are logged per epoch (a plain log renderer: CI has no terminal
//! for burn-train's TUI). At the end the trained weights are loaded into the same model on
//! the stock `Autodiff<B>` and on `Liger<Autodiff<B>>`, and one training step is compared:
//! the backend names, the largest logit and loss differences (small but not zero: other
//! kernels, same math) and the time per step.
//!
//! ```sh
//! cargo run -p liger-examples --example wrap_backend
//! cargo run -p liger-examples --example wrap_backend --features cuda   # on an NVIDIA GPU
//! ```
//!
//! Device: the first that opens of CUDA (feature `cuda`), ROCm (`rocm`), wgpu's default
//! adapter (a GPU, else a CPU adapter such as Mesa's lavapipe) and NdArray. With no Vulkan
//! adapter (and no CUDA/ROCm) it falls back to NdArray, where `Liger` has no kernels to
//! call and runs liger-burn's exact composition of stock ops. Burn-train's files (metric
//! logs, `experiment.log`) go to a temporary directory, removed at the end.

// Shared with the other examples, each of which uses part of it.
#[allow(dead_code)]
mod devices;

use burn::backend::Autodiff;
use burn::config::Config;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::AdamWConfig;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn::train::metric::{
    AccuracyMetric, LossMetric, MetricAttributes, MetricDefinition, MetricId,
};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use devices::{Job, Target};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_train::rng::SplitMix64;
use std::collections::HashMap;
use std::time::Instant;

/// The training backend: the only line that differs from a stock Burn program, which would
/// use `Autodiff<B>`.
type TrainBackend<B> = Liger<Autodiff<B>>;

const SEQUENCE_LENGTH: usize = 16;
/// Tokens `0..CLASSES` are the markers; the others are noise.
const VOCAB: usize = 16;
const CLASSES: usize = 4;
const TRAIN_SEQUENCES: usize = 1024;
const VALID_SEQUENCES: usize = 256;
const BATCH_SIZE: usize = 64;
const EPOCHS: usize = 3;
const LEARNING_RATE: f64 = 3e-3;
/// Training iterations between two log lines.
const LOG_EVERY: usize = 8;

// ---------------------------------------------------------------------------------------
// Data: sequences whose label is the marker token that occurs most often.

#[derive(Clone, Debug)]
struct Sequence {
    tokens: Vec<i64>,
    label: i64,
}

/// `count` sequences: the label's marker 4 to 6 times, each other marker at most 3 times
/// (so strictly fewer), noise tokens elsewhere, in random order.
fn synthetic_sequences(count: usize, seed: u64) -> Vec<Sequence> {
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| {
            let label = rng.below(CLASSES as u64) as i64;
            let mut tokens = vec![label; 4 + rng.below(3) as usize];
            for other in (0..CLASSES as i64).filter(|&m| m != label) {
                tokens.extend(std::iter::repeat_n(other, rng.below(4) as usize));
            }
            while tokens.len() < SEQUENCE_LENGTH {
                tokens.push((CLASSES as u64 + rng.below((VOCAB - CLASSES) as u64)) as i64);
            }
            // Fisher–Yates: the markers anywhere in the sequence.
            for i in (1..tokens.len()).rev() {
                tokens.swap(i, rng.below(i as u64 + 1) as usize);
            }
            Sequence { tokens, label }
        })
        .collect()
}

#[derive(Clone, Debug)]
struct SequenceBatch<B: Backend> {
    tokens: Tensor<B, 2, Int>,
    labels: Tensor<B, 1, Int>,
}

#[derive(Clone, Default)]
struct SequenceBatcher;

impl<B: Backend> Batcher<B, Sequence, SequenceBatch<B>> for SequenceBatcher {
    fn batch(&self, items: Vec<Sequence>, device: &B::Device) -> SequenceBatch<B> {
        let n = items.len();
        let tokens: Vec<i64> = items.iter().flat_map(|s| s.tokens.clone()).collect();
        let labels: Vec<i64> = items.iter().map(|s| s.label).collect();
        SequenceBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [n, SEQUENCE_LENGTH]), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The model: stock burn::nn modules only.

#[derive(Config, Debug)]
struct ClassifierConfig {
    #[config(default = 32)]
    d_model: usize,
    #[config(default = 64)]
    d_ff: usize,
    #[config(default = 4)]
    heads: usize,
    #[config(default = 1)]
    layers: usize,
}

#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    token_embedding: Embedding<B>,
    position_embedding: Embedding<B>,
    encoder: TransformerEncoder<B>,
    /// `sigmoid(gate(pooled))` scales the pooled features.
    gate: Linear<B>,
    output: Linear<B>,
}

impl ClassifierConfig {
    fn init<B: Backend>(&self, device: &B::Device) -> Classifier<B> {
        Classifier {
            token_embedding: EmbeddingConfig::new(VOCAB, self.d_model).init(device),
            position_embedding: EmbeddingConfig::new(SEQUENCE_LENGTH, self.d_model).init(device),
            encoder: TransformerEncoderConfig::new(
                self.d_model,
                self.d_ff,
                self.heads,
                self.layers,
            )
            .with_dropout(0.0)
            .init(device),
            gate: LinearConfig::new(self.d_model, self.d_model).init(device),
            output: LinearConfig::new(self.d_model, CLASSES).init(device),
        }
    }
}

impl<B: Backend> Classifier<B> {
    /// `tokens: [batch, seq]` → logits `[batch, classes]`.
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &tokens.device())
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.token_embedding.forward(tokens) + self.position_embedding.forward(positions);
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        let d_model = x.dims()[2];
        let pooled = x.mean_dim(1).reshape([batch, d_model]);
        let gated = pooled.clone() * sigmoid(self.gate.forward(pooled));
        self.output.forward(gated)
    }

    fn classify(&self, batch: SequenceBatch<B>) -> ClassificationOutput<B> {
        let logits = self.forward(batch.tokens);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

impl<B: AutodiffBackend> TrainStep for Classifier<B> {
    type Input = SequenceBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Classifier<B> {
    type Input = SequenceBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: SequenceBatch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

// ---------------------------------------------------------------------------------------
// A plain log renderer: burn-train's TUI needs a terminal, and its non-TUI fallback
// prints every item's progress without the metrics.

/// Prints the mean of each metric every [`LOG_EVERY`] training iterations and once per
/// validation epoch.
#[derive(Default)]
struct LogRenderer {
    /// Name and unit of each registered metric.
    metrics: HashMap<MetricId, (String, String)>,
    /// Values of each metric since the last line, in the order they arrive.
    train: Window,
    valid: Window,
}

/// `(name, unit, sum, count)` per metric.
#[derive(Default)]
struct Window(Vec<(String, String, f64, usize)>);

impl Window {
    fn add(&mut self, (name, unit): &(String, String), value: f64) {
        match self.0.iter_mut().find(|(n, ..)| n == name) {
            Some((_, _, sum, count)) => {
                *sum += value;
                *count += 1;
            }
            None => self.0.push((name.clone(), unit.clone(), value, 1)),
        }
    }

    /// The means as `name value, ...`; empties the window.
    fn drain(&mut self) -> String {
        let text: Vec<String> = self
            .0
            .drain(..)
            .map(|(name, unit, sum, count)| {
                let mean = sum / count as f64;
                match unit.as_str() {
                    "%" => format!("{} {mean:.1}%", name.to_lowercase()),
                    _ => format!("{} {mean:.4}{unit}", name.to_lowercase()),
                }
            })
            .collect();
        text.join(", ")
    }
}

impl LogRenderer {
    fn record(&mut self, train: bool, state: MetricState) {
        if let MetricState::Numeric(entry, value) = state
            && let Some(metric) = self.metrics.get(&entry.metric_id)
        {
            let window = if train {
                &mut self.train
            } else {
                &mut self.valid
            };
            window.add(metric, value.current());
        }
    }
}

impl MetricsRendererTraining for LogRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.record(true, state);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.record(false, state);
    }

    fn render_train(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        let iteration = item.iteration.unwrap_or(0);
        let epoch_done = item
            .progress
            .as_ref()
            .is_some_and(|p| p.items_processed >= p.items_total);
        if iteration.is_multiple_of(LOG_EVERY) || epoch_done {
            println!(
                "epoch {}/{} iteration {:>3} train: {}",
                item.global_progress.items_processed,
                item.global_progress.items_total,
                iteration,
                self.train.drain()
            );
        }
    }

    fn render_valid(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        if item
            .progress
            .as_ref()
            .is_some_and(|p| p.items_processed >= p.items_total)
        {
            println!(
                "epoch {}/{}           valid: {}",
                item.global_progress.items_processed,
                item.global_progress.items_total,
                self.valid.drain()
            );
        }
    }
}

impl MetricsRendererEvaluation for LogRenderer {
    fn update_test(&mut self, _: EvaluationName, _: MetricState) {}
    fn render_test(&mut self, _: EvaluationProgress, _: Vec<ProgressType>) {}
}

impl MetricsRenderer for LogRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        let unit = match definition.attributes {
            MetricAttributes::Numeric(numeric) => numeric.unit.unwrap_or_default(),
            _ => String::new(),
        };
        self.metrics
            .insert(definition.metric_id, (definition.name, unit));
    }
}

// ---------------------------------------------------------------------------------------
// Training, then the fused and the stock backend side by side.

struct TrainClassifier {
    artifacts: std::path::PathBuf,
}

impl Job for TrainClassifier {
    type Output = ();

    fn run<B: FusedOps>(&mut self, target: Target, device: B::Device) {
        println!(
            "device:  {} ({})",
            target.name(),
            TrainBackend::<B>::name(&device)
        );
        let config = ClassifierConfig::new();
        let train_loader = DataLoaderBuilder::new(SequenceBatcher)
            .batch_size(BATCH_SIZE)
            .shuffle(7)
            .set_device(device.clone())
            .build(InMemDataset::new(synthetic_sequences(TRAIN_SEQUENCES, 1)));
        let valid_loader = DataLoaderBuilder::new(SequenceBatcher)
            .batch_size(BATCH_SIZE)
            .set_device(device.clone())
            .build(InMemDataset::new(synthetic_sequences(VALID_SEQUENCES, 2)));

        TrainBackend::<B>::seed(&device, 42);
        let model = config.init::<TrainBackend<B>>(&device);
        let learner = Learner::new(model, AdamWConfig::new().init(), LEARNING_RATE);
        let started = Instant::now();
        let result = SupervisedTraining::new(&self.artifacts, train_loader, valid_loader)
            .metrics((LossMetric::new(), AccuracyMetric::new()))
            .num_epochs(EPOCHS)
            .renderer(LogRenderer::default())
            .launch(learner);
        println!(
            "trained: {EPOCHS} epochs of {} steps in {:.1} s",
            TRAIN_SEQUENCES.div_ceil(BATCH_SIZE),
            started.elapsed().as_secs_f64()
        );

        // The trained weights on both backends (a record is backend-independent data).
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = recorder
            .record(result.model.into_record(), ())
            .expect("the record serializes");
        let fused = config
            .init::<TrainBackend<B>>(&device)
            .load_record(recorder.load(bytes.clone(), &device).expect("record loads"));
        let stock = config
            .init::<Autodiff<B>>(&device)
            .load_record(recorder.load(bytes, &device).expect("record loads"));
        compare(fused, stock, &device, target);
    }
}

/// Forward + backward of one validation batch on both backends: outputs and time.
fn compare<B: FusedOps>(
    fused: Classifier<TrainBackend<B>>,
    stock: Classifier<Autodiff<B>>,
    device: &B::Device,
    target: Target,
) {
    const STEPS: usize = 3;
    let sequences = synthetic_sequences(BATCH_SIZE, 3);
    let batch_fused: SequenceBatch<TrainBackend<B>> =
        SequenceBatcher.batch(sequences.clone(), device);
    let batch_stock: SequenceBatch<Autodiff<B>> = SequenceBatcher.batch(sequences, device);

    /// Mean seconds of [`STEPS`] forwards + backwards after a warm-up one, and its outputs.
    fn step_time<A: AutodiffBackend>(
        model: &Classifier<A>,
        batch: &SequenceBatch<A>,
        device: &A::Device,
    ) -> (f64, Vec<f32>, f32) {
        let run = || {
            let out = model.classify(batch.clone());
            let grads = out.loss.backward();
            A::sync(device).expect("the device finishes its work");
            (out, grads)
        };
        let (out, _) = run();
        let start = Instant::now();
        for _ in 0..STEPS {
            run();
        }
        let seconds = start.elapsed().as_secs_f64() / STEPS as f64;
        let logits = out.output.into_data().to_vec::<f32>().expect("f32 logits");
        (seconds, logits, out.loss.into_scalar().elem())
    }

    let (fused_s, fused_logits, fused_loss) = step_time(&fused, &batch_fused, device);
    let (stock_s, stock_logits, stock_loss) = step_time(&stock, &batch_stock, device);
    let max_logit_diff = fused_logits
        .iter()
        .zip(&stock_logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("\nthe trained model, one forward + backward of {BATCH_SIZE} sequences:");
    println!(
        "  liger  {:<44} loss {fused_loss:.6}  {:>7.2} ms/step",
        TrainBackend::<B>::name(device),
        fused_s * 1e3
    );
    println!(
        "  stock  {:<44} loss {stock_loss:.6}  {:>7.2} ms/step",
        Autodiff::<B>::name(device),
        stock_s * 1e3
    );
    println!(
        "  max |logit difference| {max_logit_diff:.2e}, |loss difference| {:.2e}",
        (fused_loss - stock_loss).abs()
    );
    if target == Target::NdArray {
        println!("  (NdArray has no CubeCL kernels: Liger ran liger-burn's stock-op composition)");
    } else {
        println!(
            "  (Liger ran the fused layer_norm, softmax, log_softmax, gelu and sigmoid kernels; \
             the stock backend Burn's own ops)"
        );
    }
}

fn main() {
    let artifacts = std::env::temp_dir().join(format!("liger-wrap-backend-{}", std::process::id()));
    // Fastest first; `Target::WgpuCpu` is left out: the default adapter already falls back
    // to the CPU adapter when there is no GPU.
    let order: Vec<Target> = Target::compiled()
        .into_iter()
        .filter(|&t| t != Target::WgpuCpu)
        .collect();
    let mut job = TrainClassifier {
        artifacts: artifacts.clone(),
    };
    let ran = devices::run_on_first(&order, &mut job);
    let _ = std::fs::remove_dir_all(&artifacts);
    if ran.is_none() {
        eprintln!("no device of this build opened here");
        std::process::exit(1);
    }
}
