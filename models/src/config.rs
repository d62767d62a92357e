//! The model configuration: Hugging Face `config.json` in, [`ModelConfig`] out (and back).
//!
//! Reads both the transformers 4.x layout (`rope_theta` and `rope_scaling` at the top
//! level, `torch_dtype`) and the 5.x layout (`rope_parameters` holding `rope_theta`,
//! `dtype`). Fields this crate does not interpret are kept in [`ModelConfig::extra`] and
//! written back by [`ModelConfig::to_hf_json`], so a saved checkpoint keeps its
//! tokenizer ids, generation settings and the like.

use crate::error::ModelError;
use liger_burn::ops::Llama3RopeScaling;
use serde_json::{Map, Value, json};
use std::path::Path;

/// The architectures this crate implements (`model_type` in `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelType {
    /// Llama 2, 3, 3.1, 3.2 (`LlamaForCausalLM`).
    Llama,
    /// Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): bias on the q/k/v projections.
    Qwen2,
    /// Qwen3 dense (`Qwen3ForCausalLM`): per-head RMSNorm of q and k before RoPE, and an
    /// explicit `head_dim`.
    Qwen3,
    /// Mistral (`MistralForCausalLM`): sliding-window attention.
    Mistral,
}

impl ModelType {
    /// Every supported type.
    pub const ALL: [ModelType; 4] = [
        ModelType::Llama,
        ModelType::Qwen2,
        ModelType::Qwen3,
        ModelType::Mistral,
    ];

    /// The `model_type` string of `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Llama => "llama",
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
            ModelType::Mistral => "mistral",
        }
    }

    /// The transformers class (`architectures` in `config.json`).
    pub fn architecture(self) -> &'static str {
        match self {
            ModelType::Llama => "LlamaForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
            ModelType::Qwen3 => "Qwen3ForCausalLM",
            ModelType::Mistral => "MistralForCausalLM",
        }
    }

    /// Parses a `model_type` string.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// `max_position_embeddings` of transformers' config class, used when the file omits it.
    fn default_max_positions(self) -> usize {
        match self {
            ModelType::Llama => 2048,
            ModelType::Qwen2 | ModelType::Qwen3 => 32768,
            ModelType::Mistral => 4096 * 32,
        }
    }
}

impl std::fmt::Display for ModelType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// RoPE frequency scaling (`rope_scaling` / `rope_parameters` of `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` "default", or no scaling entry).
    #[default]
    None,
    /// `rope_type` "linear": every inverse frequency divided by `factor`.
    Linear {
        /// Divisor of the inverse frequencies.
        factor: f64,
    },
    /// `rope_type` "llama3" (Llama 3.1 / 3.2): low frequencies divided by `factor`, high
    /// ones kept, a smooth interpolation between (transformers' `_compute_llama3_parameters`).
    Llama3 {
        /// Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length of pre-training (8192 for Llama 3).
        original_max_position_embeddings: usize,
    },
}

/// A decoder-only causal LM's configuration, resolved (no optional shape fields left).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub model_type: ModelType,
    /// Vocabulary size (rows of the embedding, columns of the logits).
    pub vocab_size: usize,
    /// Model width `d_model`.
    pub hidden_size: usize,
    /// Width of the MLP's gate/up projections.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (`hidden_size / num_attention_heads` unless `config.json` says
    /// otherwise, as Qwen3 does).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest sequence the model was configured for (informational; positions beyond it
    /// are computed the same way).
    pub max_position_embeddings: usize,
    /// The LM head reuses the embedding matrix (no `lm_head.weight` in the checkpoint).
    pub tie_word_embeddings: bool,
    /// `attention_bias` of Llama and Qwen3 (bias on q/k/v/o). Qwen2 always has q/k/v bias
    /// and Mistral none, whatever this says: see [`ModelConfig::qkv_bias`].
    pub attention_bias: bool,
    /// `mlp_bias` of Llama (bias on gate/up/down); other types have none.
    pub mlp_bias: bool,
    /// Mistral's sliding attention window: a token attends to the `sliding_window` most
    /// recent positions, itself included. `None`: full causal attention.
    pub sliding_window: Option<usize>,
    /// `torch_dtype` of the checkpoint (`float32`, `bfloat16`, `float16`), informational.
    pub torch_dtype: Option<String>,
    /// Every `config.json` field not listed above, written back unchanged on save.
    pub extra: Map<String, Value>,
}

/// Reads typed fields out of a `config.json` object, naming the file and the field in errors.
struct Fields<'a> {
    map: Map<String, Value>,
    path: &'a str,
}

impl Fields<'_> {
    fn err(&self, message: String) -> ModelError {
        ModelError::Config {
            path: self.path.to_string(),
            message,
        }
    }

    /// Removes `key`; `None` when absent or null.
    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn usize_opt(&mut self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.err(format!("`{key}` must be a non-negative integer, got {v}"))
            }),
        }
    }

    fn usize(&mut self, key: &str) -> Result<usize, ModelError> {
        self.usize_opt(key)?
            .ok_or_else(|| self.err(format!("missing required field `{key}`")))
    }

    fn f64_opt(&mut self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be a number, got {v}"))),
        }
    }

    fn bool_opt(&mut self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be true or false, got {v}"))),
        }
    }

    fn string_opt(&mut self, key: &str) -> Result<Option<String>, ModelError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("`{key}` must be a string, got {v}"))),
        }
    }
}

impl ModelConfig {
    /// Reads `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses the text of a `config.json`; `origin` names it in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ModelError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ModelError::Config {
            path: origin.to_string(),
            message: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = value else {
            return Err(ModelError::Config {
                path: origin.to_string(),
                message: "expected a JSON object".into(),
            });
        };
        Self::from_hf_map(map, origin)
    }

    /// Builds the configuration from a parsed `config.json` object.
    pub fn from_hf_map(map: Map<String, Value>, origin: &str) -> Result<Self, ModelError> {
        let mut f = Fields { map, path: origin };
        let model_type = match f.string_opt("model_type")? {
            None => return Err(f.err("missing required field `model_type`".into())),
            Some(name) => {
                ModelType::from_name(&name).ok_or_else(|| ModelError::UnknownModelType {
                    path: origin.to_string(),
                    found: name,
                })?
            }
        };
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let num_key_value_heads = f
            .usize_opt("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || num_key_value_heads == 0 {
            return Err(
                f.err("`num_attention_heads` and `num_key_value_heads` must be positive".into())
            );
        }
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(f.err(format!(
                "`num_attention_heads` ({num_attention_heads}) must be a multiple of `num_key_value_heads` ({num_key_value_heads})"
            )));
        }
        let head_dim = match f.usize_opt("head_dim")? {
            Some(d) => d,
            None => hidden_size / num_attention_heads,
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(f.err(format!(
                "`head_dim` must be even and positive (RoPE rotates pairs), got {head_dim}"
            )));
        }
        let max_position_embeddings = f
            .usize_opt("max_position_embeddings")?
            .unwrap_or(model_type.default_max_positions());
        if let Some(act) = f.string_opt("hidden_act")?
            && act != "silu"
        {
            return Err(f.err(format!(
                "`hidden_act` {act:?} is not supported (these models use \"silu\")"
            )));
        }

        // RoPE: transformers 5 nests `rope_theta` in `rope_parameters`; 4.x has it at the
        // top level beside `rope_scaling`.
        let top_theta = f.f64_opt("rope_theta")?;
        let scaling_v4 = f.take("rope_scaling");
        let params_v5 = f.take("rope_parameters");
        // Our own saved configs carry both; the 5.x entry is complete (it holds the theta).
        let rope_obj = match params_v5.or(scaling_v4) {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(other) => {
                return Err(f.err(format!("rope parameters must be an object, got {other}")));
            }
        };
        let (rope_theta, rope_scaling) =
            parse_rope(rope_obj, top_theta, max_position_embeddings).map_err(|m| f.err(m))?;

        let sliding_window = {
            let window = f.usize_opt("sliding_window")?;
            match model_type {
                ModelType::Mistral => window,
                ModelType::Qwen2 | ModelType::Qwen3 => {
                    // Qwen keeps `sliding_window` in every config but only uses it with
                    // `use_sliding_window: true`, which no released checkpoint sets.
                    let used = f.bool_opt("use_sliding_window")?.unwrap_or(false);
                    if used {
                        return Err(f.err(
                            "`use_sliding_window: true` is not supported for Qwen models (per-layer \
                             sliding windows); released Qwen2/2.5/3 checkpoints set it to false"
                                .into(),
                        ));
                    }
                    // Keep the value to write it back unchanged.
                    if let Some(w) = window {
                        f.map.insert("sliding_window".into(), json!(w));
                    }
                    f.map.insert("use_sliding_window".into(), json!(false));
                    None
                }
                ModelType::Llama => {
                    if let Some(w) = window {
                        f.map.insert("sliding_window".into(), json!(w));
                    }
                    None
                }
            }
        };
        if let Some(partial) = f.f64_opt("partial_rotary_factor")?
            && partial != 1.0
        {
            return Err(f.err(format!(
                "`partial_rotary_factor` {partial} is not supported (only 1.0)"
            )));
        }
        let torch_dtype = match (f.string_opt("torch_dtype")?, f.string_opt("dtype")?) {
            (Some(a), _) => Some(a),
            (None, b) => b,
        };
        let config = ModelConfig {
            model_type,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: f.bool_opt("attention_bias")?.unwrap_or(false),
            mlp_bias: f.bool_opt("mlp_bias")?.unwrap_or(false),
            sliding_window,
            torch_dtype,
            extra: f.map,
        };
        config.validate().map_err(|m| ModelError::Config {
            path: origin.to_string(),
            message: m,
        })?;
        Ok(config)
    }

    /// Checks the sizes are usable; returns what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("`{name}` must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "`num_attention_heads` ({}) must be a multiple of `num_key_value_heads` ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("`head_dim` must be even, got {}", self.head_dim));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "`rms_norm_eps` must be positive and finite, got {} (the checkpoint's model \
                 card has it; Llama 3 uses 1e-5, Qwen2 1e-6)",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!(
                "`rope_theta` must be positive and finite, got {}",
                self.rope_theta
            ));
        }
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(format!(
                        "rope scaling (\"linear\") `factor` must be positive and finite, got {factor}"
                    ));
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => Llama3RopeScaling {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }
            .check()
            .map_err(|e| format!("{e} (rope type \"llama3\")"))?,
        }
        if self.sliding_window == Some(0) {
            return Err("`sliding_window` must be positive".into());
        }
        Ok(())
    }

    /// Bias on the q/k/v projections: always for Qwen2, never for Mistral,
    /// `attention_bias` for Llama and Qwen3 (as transformers builds them).
    pub fn qkv_bias(&self) -> bool {
        match self.model_type {
            ModelType::Qwen2 => true,
            ModelType::Mistral => false,
            ModelType::Llama | ModelType::Qwen3 => self.attention_bias,
        }
    }

    /// Bias on the output projection: `attention_bias` for Llama and Qwen3, never otherwise.
    pub fn o_bias(&self) -> bool {
        match self.model_type {
            ModelType::Qwen2 | ModelType::Mistral => false,
            ModelType::Llama | ModelType::Qwen3 => self.attention_bias,
        }
    }

    /// Bias on gate/up/down: `mlp_bias` for Llama, never otherwise.
    pub fn mlp_has_bias(&self) -> bool {
        self.model_type == ModelType::Llama && self.mlp_bias
    }

    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.model_type == ModelType::Qwen3
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let bias = |b: bool, n: usize| if b { n } else { 0 };
        let attn = h * q
            + 2 * h * kv
            + q * h
            + bias(self.qkv_bias(), q + 2 * kv)
            + bias(self.o_bias(), h)
            + if self.qk_norm() { 2 * d } else { 0 };
        let mlp = 3 * h * i + bias(self.mlp_has_bias(), 2 * i + h);
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab_size * h;
        embed
            + self.num_hidden_layers * layer
            + h
            + if self.tie_word_embeddings { 0 } else { embed }
    }

    /// The `config.json` object of this configuration (transformers reads it, 4.x and 5.x:
    /// RoPE is written in both layouts). `torch_dtype` is set from `dtype` when given.
    pub fn to_hf_json(&self, dtype: Option<&str>) -> Value {
        let mut map = self.extra.clone();
        let mut set = |k: &str, v: Value| {
            map.insert(k.to_string(), v);
        };
        set("model_type", json!(self.model_type.name()));
        set("vocab_size", json!(self.vocab_size));
        set("hidden_size", json!(self.hidden_size));
        set("intermediate_size", json!(self.intermediate_size));
        set("num_hidden_layers", json!(self.num_hidden_layers));
        set("num_attention_heads", json!(self.num_attention_heads));
        set("num_key_value_heads", json!(self.num_key_value_heads));
        set("head_dim", json!(self.head_dim));
        set("hidden_act", json!("silu"));
        set("rms_norm_eps", json!(self.rms_norm_eps));
        set(
            "max_position_embeddings",
            json!(self.max_position_embeddings),
        );
        set("tie_word_embeddings", json!(self.tie_word_embeddings));
        match self.model_type {
            ModelType::Llama => {
                set("attention_bias", json!(self.attention_bias));
                set("mlp_bias", json!(self.mlp_bias));
            }
            ModelType::Qwen3 => set("attention_bias", json!(self.attention_bias)),
            ModelType::Mistral => set("sliding_window", json!(self.sliding_window)),
            ModelType::Qwen2 => {}
        }
        let mut params = Map::new();
        params.insert("rope_theta".into(), json!(self.rope_theta));
        let scaling = match self.rope_scaling {
            RopeScaling::None => {
                params.insert("rope_type".into(), json!("default"));
                Value::Null
            }
            RopeScaling::Linear { factor } => {
                params.insert("rope_type".into(), json!("linear"));
                params.insert("factor".into(), json!(factor));
                json!({"rope_type": "linear", "factor": factor})
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let s = json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings,
                });
                for (k, v) in s.as_object().expect("object") {
                    params.insert(k.clone(), v.clone());
                }
                s
            }
        };
        set("rope_theta", json!(self.rope_theta));
        set("rope_scaling", scaling);
        set("rope_parameters", Value::Object(params));
        if !map.contains_key("architectures") {
            map.insert(
                "architectures".into(),
                json!([self.model_type.architecture()]),
            );
        }
        map.remove("dtype");
        if let Some(d) = dtype
            .map(str::to_string)
            .or_else(|| self.torch_dtype.clone())
        {
            map.insert("torch_dtype".into(), json!(d));
        }
        Value::Object(map)
    }

    // ---- configurations built in code (tests, benches) ----

    fn base(model_type: ModelType) -> Self {
        ModelConfig {
            model_type,
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_hidden_layers: 0,
            num_attention_heads: 0,
            num_key_value_heads: 0,
            head_dim: 0,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: model_type.default_max_positions(),
            tie_word_embeddings: false,
            attention_bias: false,
            mlp_bias: false,
            sliding_window: None,
            torch_dtype: None,
            extra: Map::new(),
        }
    }

    /// A tiny model of `model_type` for tests: hidden 64, 2 layers, 4 query heads of 16,
    /// 2 key/value heads, MLP 96, vocabulary 128 (Qwen3: head_dim 24; Llama: llama3 RoPE
    /// scaling; Mistral: sliding window 4).
    pub fn tiny(model_type: ModelType) -> Self {
        let mut c = Self::base(model_type);
        c.vocab_size = 128;
        c.hidden_size = 64;
        c.intermediate_size = 96;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.num_key_value_heads = 2;
        c.head_dim = 16;
        c.rms_norm_eps = 1e-5;
        match model_type {
            ModelType::Llama => {
                c.rope_scaling = RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 64,
                }
            }
            ModelType::Qwen2 => c.tie_word_embeddings = true,
            ModelType::Qwen3 => c.head_dim = 24,
            ModelType::Mistral => c.sliding_window = Some(4),
        }
        c
    }

    /// Llama 3.2 1B's shapes (16 layers, hidden 2048, 32/8 heads of 64, vocabulary 128256,
    /// llama3 RoPE scaling with factor 32, tied embeddings).
    pub fn llama3_2_1b() -> Self {
        let mut c = Self::base(ModelType::Llama);
        c.vocab_size = 128256;
        c.hidden_size = 2048;
        c.intermediate_size = 8192;
        c.num_hidden_layers = 16;
        c.num_attention_heads = 32;
        c.num_key_value_heads = 8;
        c.head_dim = 64;
        c.rms_norm_eps = 1e-5;
        c.rope_theta = 500000.0;
        c.rope_scaling = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        c.max_position_embeddings = 131072;
        c.tie_word_embeddings = true;
        c
    }

    /// Llama 3.1 8B's shapes (32 layers, hidden 4096, 32/8 heads of 128, MLP 14336,
    /// vocabulary 128256, llama3 RoPE scaling with factor 8).
    pub fn llama3_1_8b() -> Self {
        let mut c = Self::llama3_2_1b();
        c.hidden_size = 4096;
        c.intermediate_size = 14336;
        c.num_hidden_layers = 32;
        c.head_dim = 128;
        c.rope_scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        c.tie_word_embeddings = false;
        c
    }

    /// Qwen2.5 1.5B's shapes (28 layers, hidden 1536, 12/2 heads of 128, MLP 8960,
    /// vocabulary 151936, tied embeddings).
    pub fn qwen2_5_1_5b() -> Self {
        let mut c = Self::base(ModelType::Qwen2);
        c.vocab_size = 151936;
        c.hidden_size = 1536;
        c.intermediate_size = 8960;
        c.num_hidden_layers = 28;
        c.num_attention_heads = 12;
        c.num_key_value_heads = 2;
        c.head_dim = 128;
        c.rope_theta = 1_000_000.0;
        c.max_position_embeddings = 32768;
        c.tie_word_embeddings = true;
        c
    }

    /// Qwen3 0.6B's shapes (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072,
    /// vocabulary 151936, tied embeddings).
    pub fn qwen3_0_6b() -> Self {
        let mut c = Self::base(ModelType::Qwen3);
        c.vocab_size = 151936;
        c.hidden_size = 1024;
        c.intermediate_size = 3072;
        c.num_hidden_layers = 28;
        c.num_attention_heads = 16;
        c.num_key_value_heads = 8;
        c.head_dim = 128;
        c.rope_theta = 1_000_000.0;
        c.max_position_embeddings = 40960;
        c.tie_word_embeddings = true;
        c
    }

    /// Mistral 7B v0.1's shapes (32 layers, hidden 4096, 32/8 heads of 128, MLP 14336,
    /// vocabulary 32000, sliding window 4096).
    pub fn mistral_7b() -> Self {
        let mut c = Self::base(ModelType::Mistral);
        c.vocab_size = 32000;
        c.hidden_size = 4096;
        c.intermediate_size = 14336;
        c.num_hidden_layers = 32;
        c.num_attention_heads = 32;
        c.num_key_value_heads = 8;
        c.head_dim = 128;
        c.rms_norm_eps = 1e-5;
        c.sliding_window = Some(4096);
        c.max_position_embeddings = 32768;
        c
    }

    /// The same configuration with `n` decoder layers (smaller models for benches).
    pub fn with_layers(mut self, n: usize) -> Self {
        self.num_hidden_layers = n;
        self
    }
}

/// Parses the RoPE entry: `(rope_theta, scaling)`. Unknown types are refused by name.
fn parse_rope(
    obj: Option<Map<String, Value>>,
    top_theta: Option<f64>,
    max_positions: usize,
) -> Result<(f64, RopeScaling), String> {
    let Some(obj) = obj else {
        return Ok((top_theta.unwrap_or(10000.0), RopeScaling::None));
    };
    let num = |key: &str| -> Result<Option<f64>, String> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| format!("rope parameter `{key}` must be a number, got {v}")),
        }
    };
    let theta = num("rope_theta")?.or(top_theta).unwrap_or(10000.0);
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if let Some(p) = num("partial_rotary_factor")?
        && p != 1.0
    {
        return Err(format!(
            "rope parameter `partial_rotary_factor` {p} is not supported (only 1.0)"
        ));
    }
    let need = |key: &str| -> Result<f64, String> {
        num(key)?.ok_or_else(|| format!("rope type {kind:?} needs `{key}`"))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: match num("original_max_position_embeddings")? {
                None => max_positions,
                Some(v) if v.fract() == 0.0 && v >= 1.0 && v <= usize::MAX as f64 => v as usize,
                Some(v) => {
                    return Err(format!(
                        "rope parameter `original_max_position_embeddings` must be a positive \
                         integer, got {v} (Llama 3 uses 8192)"
                    ));
                }
            },
        },
        other => {
            return Err(format!(
                "rope type {other:?} is not supported (supported: \"default\", \"linear\", \"llama3\")"
            ));
        }
    };
    Ok((theta, scaling))
}
