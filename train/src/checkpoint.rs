//! Checkpoints: `<output>/checkpoint-<step>/` holds
//!
//! - `config.json` + `model.safetensors`: the model in Hugging Face layout
//!   ([`CausalLm::save`]), loadable by transformers and by `liger train --model`;
//! - `tokenizer.json`: the tokenizer the run used, unchanged;
//! - `optimizer.mpk`: the AdamW state (step counts and moments, and in a mixed-precision
//!   f16/bf16 run the f32 master weights, of which `model.safetensors` holds the rounded
//!   working copy), a Burn record (full precision). Burn keys it by
//!   parameter id, which is random per process; here it is keyed by the parameter's
//!   position in the module (visit order, fixed by the architecture) so it can be matched
//!   to a model loaded again;
//! - `trainer_state.json`: [`TrainerState`]: step, data cursor, seed, settings, history.
//!
//! A LoRA run's checkpoint holds the adapters instead of the model: PEFT's
//! `adapter_config.json` and `adapter_model.safetensors` (loadable by
//! `PeftModel.from_pretrained` and `liger merge`), with the optimizer state of the adapters
//! (the frozen base has none) and the same tokenizer and trainer state. The base is not
//! copied: a resume rebuilds it from [`TrainerState::base_model`] (or from the seed for a
//! random base) and attaches the adapters ([`load_lora`]).
//!
//! A checkpoint is written to `checkpoint-<step>.tmp` and renamed when complete, so a
//! directory named `checkpoint-<step>` is never half written.

use crate::batching::Cursor;
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::metrics::StepMetrics;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Record, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use hashbrown::HashMap;
use liger_burn::ops::FusedOps;
use liger_models::{CausalLm, LigerConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File of the optimizer state (the recorder adds `.mpk`).
pub const OPTIMIZER_FILE: &str = "optimizer";
/// File of the trainer state.
pub const STATE_FILE: &str = "trainer_state.json";
/// File of the tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Version of [`TrainerState`]'s layout.
pub const STATE_FORMAT: u32 = 1;

/// Which data a run trains on, to refuse resuming on other data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataInfo {
    /// File path, or `bundled dataset.jsonl`.
    pub source: String,
    /// Examples after the data policies.
    pub examples: usize,
    /// FNV-1a of the file's bytes.
    pub hash: u64,
}

/// `trainer_state.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// [`STATE_FORMAT`].
    pub format: u32,
    /// Optimizer steps done.
    pub step: usize,
    /// Where the next micro-batch comes from.
    pub cursor: Cursor,
    /// Settings of the run (seed, schedule, batch sizes, ...).
    pub config: TrainConfig,
    /// The data.
    pub data: DataInfo,
    /// Real tokens processed so far.
    pub tokens_seen: usize,
    /// Which fused kernels were on (informational: a resume may switch them).
    pub kernels: String,
    /// Model dtype (informational).
    pub dtype: String,
    /// The checkpoint the run started from (`--model`; `None`: a random model from the
    /// seed). A LoRA run's checkpoints need it to resume, as PEFT's
    /// `base_model_name_or_path` does.
    #[serde(default)]
    pub base_model: Option<String>,
    /// Metrics of every step done.
    pub history: Vec<StepMetrics>,
}

/// `<output>/checkpoint-<step>`.
pub fn checkpoint_dir(output: &Path, step: usize) -> PathBuf {
    output.join(format!("checkpoint-{step}"))
}

/// Ids of the float parameters of `module`, in visit order.
pub fn param_ids<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl<B: Backend> ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.id);
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}

/// Re-keys an optimizer record from parameter ids (`ids[i]`) to positions (`i`).
pub fn record_by_position<R>(
    mut record: HashMap<ParamId, R>,
    ids: &[ParamId],
) -> HashMap<ParamId, R> {
    ids.iter()
        .enumerate()
        .filter_map(|(i, id)| record.remove(id).map(|r| (ParamId::from(i as u64), r)))
        .collect()
}

/// Re-keys an optimizer record from positions back to the parameter ids `ids`. Errors
/// when a position is outside `ids` (a checkpoint of another architecture).
pub fn record_by_id<R>(
    record: HashMap<ParamId, R>,
    ids: &[ParamId],
    path: &Path,
) -> Result<HashMap<ParamId, R>, TrainError> {
    record
        .into_iter()
        .map(|(pos, r)| {
            let i = pos.val() as usize;
            ids.get(i).map(|id| (*id, r)).ok_or_else(|| {
                TrainError::checkpoint(
                    path,
                    format!(
                        "optimizer state for parameter #{i}, but the model has {} parameters",
                        ids.len()
                    ),
                )
            })
        })
        .collect()
}

/// Writes a checkpoint of `model`, the optimizer `record` (keyed by the model's parameter
/// ids), the tokenizer JSON and `state` to `<output>/checkpoint-<state.step>`, replacing
/// one of that name. Returns its path.
pub fn save<B: FusedOps, R: Record<B>>(
    output: &Path,
    model: &CausalLm<B>,
    record: HashMap<ParamId, R>,
    tokenizer_json: &str,
    state: &TrainerState,
) -> Result<PathBuf, TrainError> {
    let dir = checkpoint_dir(output, state.step);
    let tmp = output.join(format!("checkpoint-{}.tmp", state.step));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    if model.lora_config().is_some() {
        model.save_adapter(&tmp, state.base_model.as_deref())?;
    } else {
        model.save(&tmp)?;
    }
    let record = record_by_position(record, &param_ids::<B, _>(model));
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
        .record(record, tmp.join(OPTIMIZER_FILE))
        .map_err(|e| TrainError::checkpoint(&tmp, format!("writing the optimizer state: {e}")))?;
    let path = tmp.join(TOKENIZER_FILE);
    std::fs::write(&path, tokenizer_json).map_err(|e| TrainError::io(&path, e))?;
    let path = tmp.join(STATE_FILE);
    let text = serde_json::to_string_pretty(state).expect("the trainer state serializes");
    std::fs::write(&path, text + "\n").map_err(|e| TrainError::io(&path, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| TrainError::io(&dir, e))?;
    Ok(dir)
}

/// Reads `dir/trainer_state.json`.
pub fn read_state(dir: &Path) -> Result<TrainerState, TrainError> {
    let path = dir.join(STATE_FILE);
    if !path.is_file() {
        return Err(TrainError::checkpoint(
            &path,
            "not found: --resume needs a checkpoint-<step> directory written by `liger train`",
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    let state: TrainerState = serde_json::from_str(&text)
        .map_err(|e| TrainError::checkpoint(&path, format!("malformed: {e}")))?;
    if state.format != STATE_FORMAT {
        return Err(TrainError::checkpoint(
            &path,
            format!(
                "`format` is {}, this build reads {STATE_FORMAT}",
                state.format
            ),
        ));
    }
    Ok(state)
}

/// A checkpoint read back: the model (parameters in `dtype`), the optimizer record keyed
/// by the model's parameter ids, and the trainer state.
pub struct Loaded<B: FusedOps, R> {
    /// The model.
    pub model: CausalLm<B>,
    /// The optimizer state, ready for `Optimizer::load_record`.
    pub optimizer: HashMap<ParamId, R>,
    /// The trainer state.
    pub state: TrainerState,
}

/// Loads the checkpoint `dir` written by [`save`].
pub fn load<B: FusedOps, R: Record<B>>(
    dir: &Path,
    dtype: DType,
    liger: LigerConfig,
    device: &B::Device,
) -> Result<Loaded<B, R>, TrainError> {
    let state = read_state(dir)?;
    if state.config.lora.is_some() {
        return Err(TrainError::checkpoint(
            dir,
            "a LoRA checkpoint holds the adapters only: load its base model and attach them \
             (checkpoint::load_lora)",
        ));
    }
    let model = CausalLm::<B>::load(dir, dtype, liger, device)?;
    finish_load(dir, model, state, device)
}

/// Loads the LoRA checkpoint `dir` written by [`save`] onto `base` (the run's base model,
/// without adapters, in the run's dtype and kernel switches): its adapters attached (the
/// base frozen), their optimizer state, the trainer state. Errors when the checkpoint is
/// not a LoRA run's, or its adapters do not fit the base.
pub fn load_lora<B: FusedOps, R: Record<B>>(
    dir: &Path,
    base: CausalLm<B>,
    device: &B::Device,
) -> Result<Loaded<B, R>, TrainError> {
    let state = read_state(dir)?;
    let Some(lora) = &state.config.lora else {
        return Err(TrainError::checkpoint(
            dir,
            "not a LoRA checkpoint (it holds the whole model): resume it without LoRA",
        ));
    };
    let model = base.load_adapter(dir, lora.precision)?;
    if model.lora_config() != Some(lora) {
        return Err(TrainError::checkpoint(
            dir,
            format!(
                "adapter_config.json ({:?}) disagrees with trainer_state.json's LoRA settings \
                 ({lora:?})",
                model.lora_config()
            ),
        ));
    }
    finish_load(dir, model, state, device)
}

/// The optimizer record of the checkpoint `dir`, re-keyed to `model`'s parameter ids.
fn finish_load<B: FusedOps, R: Record<B>>(
    dir: &Path,
    model: CausalLm<B>,
    state: TrainerState,
    device: &B::Device,
) -> Result<Loaded<B, R>, TrainError> {
    let path = dir.join(OPTIMIZER_FILE);
    let record: HashMap<ParamId, R> = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
        .load(path.clone(), device)
        .map_err(|e| {
            TrainError::checkpoint(&path, format!("reading the optimizer state (.mpk): {e}"))
        })?;
    let optimizer = record_by_id(record, &param_ids::<B, _>(&model), &path)?;
    Ok(Loaded {
        model,
        optimizer,
        state,
    })
}
