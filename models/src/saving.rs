//! Saving in the Hugging Face layout: `config.json` and one `model.safetensors` with
//! transformers' tensor names and `[out, in]` linear weights, so the directory loads again
//! with [`CausalLm::load`] and with transformers' `AutoModelForCausalLM.from_pretrained`.

use crate::error::ModelError;
use crate::loading::{CONFIG_FILE, WEIGHTS_FILE};
use crate::model::CausalLm;
use burn::tensor::{DType, TensorData};
use liger_burn::ops::FusedOps;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// One tensor's bytes for the safetensors writer.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// transformers' name of a dtype (`torch_dtype` in `config.json`).
pub fn torch_dtype_name(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("float32"),
        DType::F16 => Some("float16"),
        DType::BF16 => Some("bfloat16"),
        DType::F64 => Some("float64"),
        _ => None,
    }
}

/// Writes `tensors` (name, host data in f32, f16, bf16 or f64) to the safetensors file
/// `path`, with the `format: pt` metadata transformers requires.
pub fn write_safetensors(path: &Path, tensors: &[(String, TensorData)]) -> Result<(), ModelError> {
    let mut host = Vec::new();
    for (name, data) in tensors {
        let dtype = match data.dtype {
            DType::F32 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            DType::F64 => Dtype::F64,
            other => {
                return Err(ModelError::Input(format!(
                    "save: tensor `{name}` has dtype {other:?}, which safetensors checkpoints \
                     of these models do not use (f32, f16, bf16)"
                )));
            }
        };
        host.push((
            name.as_str(),
            HostTensor {
                dtype,
                shape: data.shape.to_vec(),
                bytes: data.as_bytes().to_vec(),
            },
        ));
    }
    // transformers refuses safetensors files without a `format` entry.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(host.iter().map(|(n, t)| (*n, t)), Some(metadata), path).map_err(
        |e| ModelError::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
    )
}

impl<B: FusedOps> CausalLm<B> {
    /// Every parameter as `(Hugging Face name, data)`, in Hugging Face layout (`[out, in]`
    /// linear weights; no `lm_head.weight` when the embedding is tied), in the model dtype.
    pub fn hf_tensors(&self) -> Vec<(String, TensorData)> {
        self.hf_params()
            .into_iter()
            .map(|(name, p)| (name, p.hf_data()))
            .collect()
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` (creating `dir`, overwriting
    /// those two files), in the model's dtype. A model with LoRA adapters is refused: the
    /// file would hold its base without them (save them with
    /// [`save_adapter`](Self::save_adapter), or [`merge_lora`](Self::merge_lora) first).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), ModelError> {
        let dir = dir.as_ref();
        if self.lora_config().is_some() {
            return Err(ModelError::Input(format!(
                "save {}: the model has LoRA adapters, which a Hugging Face checkpoint cannot \
                 hold; save them with save_adapter (PEFT's files), or merge_lora first",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        write_safetensors(&dir.join(WEIGHTS_FILE), &self.hf_tensors())?;
        let config = self.config.to_hf_json(torch_dtype_name(self.dtype()));
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes");
        let path = dir.join(CONFIG_FILE);
        std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))
    }
}
