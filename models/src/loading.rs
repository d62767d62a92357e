//! Loading Hugging Face checkpoints: `config.json` plus `model.safetensors`, or shards
//! listed by `model.safetensors.index.json`.
//!
//! Tensors are read with the `safetensors` crate from memory-mapped files and converted on
//! the host to the requested dtype (f32, f16 and bf16 files are read, whatever the model
//! dtype). Linear weights keep their Hugging Face `[out, in]` storage and become Burn's
//! `[in, out]` `Linear` weight as a transposed view. burn-store's adapters are not used:
//! the modules ask for each tensor by name and shape (see [`crate::params`]), which gives
//! the sharded index, per-tensor dtype conversion, tied embeddings and errors that name
//! the file and the tensor without a random initialization first.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::liger_config::LigerConfig;
use crate::model::CausalLm;
use crate::params::{Init, ParamSource};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use liger_burn::ops::FusedOps;
use safetensors::{Dtype, SafeTensors, tensor::Metadata};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Name of the single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Name of the sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of the configuration.
pub const CONFIG_FILE: &str = "config.json";

/// One safetensors file, mapped.
struct Shard {
    path: PathBuf,
    map: memmap2::Mmap,
    header_len: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: PathBuf) -> Result<Self, ModelError> {
        let file = std::fs::File::open(&path).map_err(|e| ModelError::io(&path, e))?;
        // SAFETY: the mapping is read-only and lives only while the checkpoint is loaded
        // (tensors are copied out); the file must not be truncated meanwhile, as for any
        // memory-mapped safetensors reader (transformers does the same).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                message: e.to_string(),
            })?;
        Ok(Shard {
            path,
            map,
            header_len,
            metadata,
        })
    }
}

/// The tensors of a checkpoint directory (one file or shards), by name.
pub struct Checkpoint {
    shards: Vec<Shard>,
    /// Tensor name → shard index.
    names: HashMap<String, usize>,
    /// Where tensors are looked up, for error messages.
    location: String,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, else the shards of `dir/model.safetensors.index.json`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let single = dir.join(WEIGHTS_FILE);
        let index = dir.join(INDEX_FILE);
        if single.is_file() {
            let shard = Shard::open(single.clone())?;
            let names = shard
                .metadata
                .tensors()
                .into_keys()
                .map(|n| (n, 0))
                .collect();
            return Ok(Checkpoint {
                shards: vec![shard],
                names,
                location: single.display().to_string(),
            });
        }
        if !index.is_file() {
            return Err(ModelError::MissingFile {
                path: single,
                what: format!(
                    "model weights: neither {WEIGHTS_FILE} nor {INDEX_FILE} is in {}",
                    dir.display()
                ),
            });
        }
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let bad = |message: String| ModelError::Config {
            path: index.display().to_string(),
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map = value
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("missing the `weight_map` object".into()))?;
        let mut shards = Vec::new();
        let mut file_index: HashMap<String, usize> = HashMap::new();
        let mut names = HashMap::new();
        // Sorted so shards open in a stable order.
        let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        for (name, file) in entries {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("`weight_map[{name:?}]` must be a file name")))?;
            let i = match file_index.get(file) {
                Some(&i) => i,
                None => {
                    shards.push(Shard::open(dir.join(file))?);
                    file_index.insert(file.to_string(), shards.len() - 1);
                    shards.len() - 1
                }
            };
            names.insert(name.clone(), i);
        }
        Ok(Checkpoint {
            shards,
            names,
            location: index.display().to_string(),
        })
    }

    /// Opens one safetensors file (e.g. PEFT's `adapter_model.safetensors`).
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref().to_path_buf();
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                what: "safetensors weights".into(),
            });
        }
        let shard = Shard::open(path.clone())?;
        let names = shard
            .metadata
            .tensors()
            .into_keys()
            .map(|n| (n, 0))
            .collect();
        Ok(Checkpoint {
            shards: vec![shard],
            names,
            location: path.display().to_string(),
        })
    }

    /// Names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.names.keys().map(String::as_str).collect();
        v.sort();
        v
    }

    /// The tensor `name` as host data in its file dtype, checked to have `expected` shape.
    pub fn read(&self, name: &str, expected: &[usize]) -> Result<TensorData, ModelError> {
        let missing = |location: String| ModelError::MissingTensor {
            name: name.to_string(),
            expected: expected.to_vec(),
            location,
        };
        let &i = self
            .names
            .get(name)
            .ok_or_else(|| missing(self.location.clone()))?;
        let shard = &self.shards[i];
        // An index may name a tensor its shard does not hold.
        let info = shard
            .metadata
            .info(name)
            .ok_or_else(|| missing(shard.path.display().to_string()))?;
        if info.shape != expected {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                file: shard.path.clone(),
                expected: expected.to_vec(),
                actual: info.shape.clone(),
            });
        }
        let dtype = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::F64 => DType::F64,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.to_string(),
                    file: shard.path.clone(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        let start = 8 + shard.header_len;
        let (a, b) = info.data_offsets;
        // safetensors stores little-endian data, TensorData native-endian: the same on
        // every platform Burn's GPU backends run on.
        let bytes = shard.map[start + a..start + b].to_vec();
        Ok(TensorData::from_bytes_vec(bytes, expected.to_vec(), dtype))
    }
}

/// [`ParamSource`] reading a [`Checkpoint`], converting to the model dtype on the host.
pub struct CheckpointSource<'a, B: Backend> {
    /// The checkpoint.
    pub checkpoint: &'a Checkpoint,
    /// Device of the parameters.
    pub device: B::Device,
    /// Dtype of the parameters.
    pub dtype: DType,
    /// Names of the tensors read so far.
    pub read: HashSet<String>,
}

impl<'a, B: Backend> CheckpointSource<'a, B> {
    /// A source that has read nothing yet.
    pub fn new(checkpoint: &'a Checkpoint, device: B::Device, dtype: DType) -> Self {
        Self {
            checkpoint,
            device,
            dtype,
            read: HashSet::new(),
        }
    }

    /// The checkpoint's tensors not read so far, sorted.
    pub fn unread(&self) -> Vec<String> {
        self.checkpoint
            .names()
            .into_iter()
            .filter(|n| !self.read.contains(*n))
            .map(str::to_string)
            .collect()
    }
}

impl<B: Backend> ParamSource<B> for CheckpointSource<'_, B> {
    fn tensor<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        _init: Init,
    ) -> Result<Tensor<B, D>, ModelError> {
        let data = self.checkpoint.read(name, &shape)?;
        self.read.insert(name.to_string());
        Ok(Tensor::from_data(data, (&self.device, self.dtype)))
    }
}

/// What loading a checkpoint did not take from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Where the tensors were read (`model.safetensors` or the shards' index).
    pub location: String,
    /// Tensors of the checkpoint the model has no parameter for, sorted by name: their
    /// values are not in the loaded model.
    pub unused: Vec<String>,
}

/// How many unused tensor names the warning lists before summing up the rest.
const LISTED_UNUSED: usize = 20;

impl LoadReport {
    /// The warning for the unused tensors, as transformers gives one ("Some weights of the
    /// model checkpoint were not used"), or `None` when every tensor was used.
    pub fn warning(&self) -> Option<String> {
        if self.unused.is_empty() {
            return None;
        }
        let mut names = self.unused[..self.unused.len().min(LISTED_UNUSED)].join(", ");
        if self.unused.len() > LISTED_UNUSED {
            names += &format!(" and {} more", self.unused.len() - LISTED_UNUSED);
        }
        Some(format!(
            "warning: {} tensor(s) of {} are not used by the model and were not loaded: {names}. \
             Expected for tensors a model recomputes (`rotary_emb.inv_freq`) or ties \
             (`lm_head.weight` with `tie_word_embeddings`); otherwise check that config.json \
             describes this checkpoint (`model_type`, `num_hidden_layers`, biases, \
             `tie_word_embeddings`).",
            self.unused.len(),
            self.location
        ))
    }
}

impl<B: FusedOps> CausalLm<B> {
    /// Loads a Hugging Face checkpoint directory (`config.json` and `model.safetensors`,
    /// or the shards of `model.safetensors.index.json`), parameters converted to `dtype`
    /// (f32, f16 or bf16), on `device`.
    ///
    /// Errors name the missing file, the unknown `model_type`, or the missing or
    /// wrong-shaped tensor (expected vs found shape). Tensors of the checkpoint the model
    /// does not use (e.g. old checkpoints' `rotary_emb.inv_freq`, or the layers of a
    /// checkpoint whose config.json says fewer) are listed in a warning on stderr
    /// ([`LoadReport::warning`]); [`CausalLm::load_with_report`] returns them instead.
    pub fn load(
        dir: impl AsRef<Path>,
        dtype: DType,
        liger: LigerConfig,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let (model, report) = Self::load_with_report(dir, dtype, liger, device)?;
        if let Some(warning) = report.warning() {
            eprintln!("{warning}");
        }
        Ok(model)
    }

    /// [`CausalLm::load`], returning what the model did not take from the checkpoint
    /// instead of printing it.
    pub fn load_with_report(
        dir: impl AsRef<Path>,
        dtype: DType,
        liger: LigerConfig,
        device: &B::Device,
    ) -> Result<(Self, LoadReport), ModelError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(ModelError::MissingFile {
                path: dir.to_path_buf(),
                what: "model directory".into(),
            });
        }
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(ModelError::Input(format!(
                "CausalLm::load: dtype {dtype:?} is not supported (f32, f16, bf16)"
            )));
        }
        let config = ModelConfig::from_file(dir.join(CONFIG_FILE))?;
        let checkpoint = Checkpoint::open(dir)?;
        let mut src = CheckpointSource::<B>::new(&checkpoint, device.clone(), dtype);
        let model = Self::build(config, liger, &mut src)?;
        let report = LoadReport {
            location: checkpoint.location.clone(),
            unused: src.unread(),
        };
        Ok((model, report))
    }
}
