//! LoRA fine-tuning of the causal LMs: which projections get an adapter ([`LoraTarget`],
//! [`LoraConfig`]), attaching adapters to a model with its base frozen, and PEFT's file
//! format (`adapter_config.json`, `adapter_model.safetensors`) for saving and loading them.
//!
//! # The base is frozen
//!
//! [`CausalLm::with_lora`] marks every base parameter `require_grad = false` (Burn's
//! `Module::no_grad`): autodiff tracks none of them, `loss.backward()` computes no
//! gradient for them, `GradientsParams::from_grads` finds none and an optimizer keeps no
//! state for them (AdamW's moments and f32 master weights exist for the adapters only).
//! The adapters (`A`, `B` of each targeted projection) are f32 parameters that require a
//! gradient, whatever the base dtype (PEFT's `autocast_adapter_dtype`).
//!
//! # PEFT's format
//!
//! `adapter_model.safetensors` holds `base_model.model.<module>.lora_A.weight` (`[r, in]`)
//! and `.lora_B.weight` (`[out, r]`) for every adapted module, e.g.
//! `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` and
//! `base_model.model.lm_head.lora_B.weight` (PEFT 0.21 for `LlamaForCausalLM`,
//! `Qwen2ForCausalLM`, ...: `PeftModelForCausalLM.base_model` is the `LoraModel`, whose
//! `model` is the transformers model; the adapter name `default` is dropped on save).
//! `adapter_config.json` carries `r`, `lora_alpha`, `lora_dropout`, `target_modules`,
//! `use_rslora`, `peft_type: "LORA"`, `task_type: "CAUSAL_LM"`. Configurations this crate
//! cannot reproduce (DoRA, per-module ranks or alphas, a subset of layers, biases in the
//! adapters, `modules_to_save`, `fan_in_fan_out`) are refused when loading, naming the field.

use crate::error::ModelError;
use crate::model::CausalLm;
use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor, TensorData};
use liger_burn::nn::{LoraAdapter, LoraAdapterConfig};
use liger_burn::ops::{AdapterPrecision, FusedOps, lora_scale};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::Path;

/// Name of PEFT's adapter configuration.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// Name of PEFT's adapter weights.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Prefix of every tensor name in PEFT's adapter file for a causal LM.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// A projection that LoRA can adapt, by its Hugging Face module name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    #[serde(rename = "q_proj")]
    Q,
    /// `self_attn.k_proj`.
    #[serde(rename = "k_proj")]
    K,
    /// `self_attn.v_proj`.
    #[serde(rename = "v_proj")]
    V,
    /// `self_attn.o_proj`.
    #[serde(rename = "o_proj")]
    O,
    /// `mlp.gate_proj`.
    #[serde(rename = "gate_proj")]
    Gate,
    /// `mlp.up_proj`.
    #[serde(rename = "up_proj")]
    Up,
    /// `mlp.down_proj`.
    #[serde(rename = "down_proj")]
    Down,
    /// `lm_head` (also when it is tied to the embedding: the adapter then adds to the
    /// logits, the embedding is untouched).
    #[serde(rename = "lm_head")]
    LmHead,
}

impl LoraTarget {
    /// Every target.
    pub const ALL: [LoraTarget; 8] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
        LoraTarget::LmHead,
    ];

    /// The decoder layers' linear layers: PEFT's `target_modules="all-linear"` for a causal
    /// LM (every linear layer but the output one).
    pub const ALL_LINEAR: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The Hugging Face module name (`q_proj`, ..., `lm_head`).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
            LoraTarget::LmHead => "lm_head",
        }
    }

    /// From a module name (`q_proj`) or its short form (`q`, `gate`, `lm_head`).
    pub fn from_name(name: &str) -> Option<Self> {
        let n = name.trim();
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.name() == n || t.name().strip_suffix("_proj") == Some(n))
    }

    /// Parses a comma list of targets (`q,k,v,o,gate,up,down,lm_head`, the `_proj` names,
    /// or `all-linear`), sorted and without repeats. Errors name the unknown entry and the
    /// known ones.
    pub fn parse_list(list: &str) -> Result<Vec<LoraTarget>, String> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "all-linear" {
                out.extend(LoraTarget::ALL_LINEAR);
                continue;
            }
            match LoraTarget::from_name(item) {
                Some(t) => out.push(t),
                None => {
                    return Err(format!(
                        "unknown LoRA target {item:?}: these models have q_proj, k_proj, \
                         v_proj, o_proj, gate_proj, up_proj, down_proj and lm_head (or the \
                         short names q, k, v, o, gate, up, down; or all-linear)"
                    ));
                }
            }
        }
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err("no LoRA target given".into());
        }
        Ok(out)
    }
}

/// What LoRA adapts and how (PEFT's `LoraConfig` for the fields these models use).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Rank `r` of every adapter (at least 1).
    pub rank: usize,
    /// `lora_alpha`: the scale is `alpha / r` (`alpha / √r` with rsLoRA).
    pub alpha: f64,
    /// Dropout of the adapters' input while training, in `[0, 1)`.
    pub dropout: f64,
    /// The adapted projections, sorted, without repeats.
    pub targets: Vec<LoraTarget>,
    /// rsLoRA scaling.
    pub use_rslora: bool,
    /// Where the adapter path computes (not part of PEFT's file: a setting of the run).
    #[serde(default)]
    pub precision: AdapterPrecision,
}

impl LoraConfig {
    /// Rank `rank`, alpha `alpha`, on every linear layer of the decoder (PEFT's
    /// `all-linear`), no dropout, no rsLoRA, PEFT's f32 adapter path.
    pub fn new(rank: usize, alpha: f64) -> Self {
        LoraConfig {
            rank,
            alpha,
            dropout: 0.0,
            targets: LoraTarget::ALL_LINEAR.to_vec(),
            use_rslora: false,
            precision: AdapterPrecision::F32,
        }
    }

    /// The adapters' scale `s`.
    pub fn scale(&self) -> f64 {
        lora_scale(self.alpha, self.rank, self.use_rslora)
    }

    /// Whether `target` is adapted.
    pub fn targets(&self, target: LoraTarget) -> bool {
        self.targets.contains(&target)
    }

    /// Checks the values; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.rank == 0 {
            return Err("LoRA rank 0: the rank must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!(
                "LoRA alpha must be positive and finite, got {}",
                self.alpha
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "LoRA dropout must be in [0, 1), got {}",
                self.dropout
            ));
        }
        if self.targets.is_empty() {
            return Err("LoRA needs at least one target module".into());
        }
        Ok(())
    }

    /// The adapter configuration of one projection `d_in → d_out`.
    pub fn adapter(&self, d_in: usize, d_out: usize) -> LoraAdapterConfig {
        LoraAdapterConfig::new(d_in, d_out, self.rank, self.alpha)
            .with_dropout(self.dropout)
            .with_use_rslora(self.use_rslora)
            .with_precision(self.precision)
    }

    /// `adapter_config.json` as PEFT 0.21 writes it for these settings.
    pub fn to_peft_json(&self, base_model_name_or_path: Option<&str>) -> Value {
        let targets: Vec<&str> = self.targets.iter().map(|t| t.name()).collect();
        // PEFT's `lora_alpha` is an integer unless set otherwise.
        let alpha = if self.alpha.fract() == 0.0 && self.alpha.abs() < 1e15 {
            json!(self.alpha as i64)
        } else {
            json!(self.alpha)
        };
        json!({
            "alpha_pattern": {},
            "base_model_name_or_path": base_model_name_or_path,
            "bias": "none",
            "exclude_modules": null,
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "layer_replication": null,
            "layers_pattern": null,
            "layers_to_transform": null,
            "lora_alpha": alpha,
            "lora_bias": false,
            "lora_dropout": self.dropout,
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": self.rank,
            "rank_pattern": {},
            "revision": null,
            "target_modules": targets,
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": self.use_rslora,
        })
    }

    /// Reads PEFT's `adapter_config.json` (`path` for messages). Refuses what these models
    /// cannot reproduce, naming the field.
    pub fn from_peft_json(value: &Value, path: &str) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Config {
            path: path.to_string(),
            message,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        match get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => {
                return Err(bad(format!(
                    "`peft_type` is {other:?}: only LoRA adapters (\"LORA\") are supported"
                )));
            }
        }
        let rank = get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("`r` (the rank) is missing or not an integer".into()))?
            as usize;
        let alpha = get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("`lora_alpha` is missing or not a number".into()))?;
        let dropout = get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
        let use_rslora = get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
        let refuse_true = |k: &str| -> Result<(), ModelError> {
            if get(k).and_then(Value::as_bool) == Some(true) {
                return Err(bad(format!(
                    "`{k}: true` is not supported (plain LoRA adapters only)"
                )));
            }
            Ok(())
        };
        for k in [
            "use_dora",
            "fan_in_fan_out",
            "lora_bias",
            "use_qalora",
            "use_bdlora",
        ] {
            refuse_true(k)?;
        }
        if let Some(b) = get("bias").and_then(Value::as_str)
            && b != "none"
        {
            return Err(bad(format!(
                "`bias: {b:?}` is not supported (the base biases stay frozen: \"none\")"
            )));
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if get(k)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(bad(format!(
                    "`{k}` (per-module ranks or alphas) is not supported: one rank and alpha \
                     for every adapter"
                )));
            }
        }
        for k in [
            "layers_to_transform",
            "layers_pattern",
            "layer_replication",
            "exclude_modules",
            "target_parameters",
            "trainable_token_indices",
            "alora_invocation_tokens",
        ] {
            let empty = |v: &Value| {
                v.as_array().is_some_and(|a| a.is_empty())
                    || v.as_object().is_some_and(|o| o.is_empty())
            };
            if let Some(v) = get(k)
                && !empty(v)
            {
                return Err(bad(format!(
                    "`{k}` ({v}) is not supported: plain LoRA adapters on the listed modules \
                     of every decoder layer only"
                )));
            }
        }
        if get("modules_to_save")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(bad(
                "`modules_to_save` (fully trained copies of modules) is not supported".into(),
            ));
        }
        let targets = match get("target_modules") {
            Some(Value::String(s)) if s == "all-linear" => LoraTarget::ALL_LINEAR.to_vec(),
            Some(Value::String(s)) => {
                return Err(bad(format!(
                    "`target_modules` {s:?}: a regular expression is not supported; give a \
                     list of module names (q_proj, ..., lm_head) or \"all-linear\""
                )));
            }
            Some(Value::Array(items)) => {
                let names: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
                if names.len() != items.len() {
                    return Err(bad("`target_modules` must be a list of strings".into()));
                }
                LoraTarget::parse_list(&names.join(",")).map_err(bad)?
            }
            _ => return Err(bad("`target_modules` is missing".into())),
        };
        let config = LoraConfig {
            rank,
            alpha,
            dropout,
            targets,
            use_rslora,
            precision: AdapterPrecision::F32,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }
}

/// One adapted projection: its PEFT module path (without the `base_model.model.` prefix)
/// and its adapter.
pub struct AdaptedModule<'a, B: FusedOps> {
    /// e.g. `model.layers.0.self_attn.q_proj`, `lm_head`.
    pub module: String,
    /// The adapter.
    pub adapter: &'a LoraAdapter<B>,
}

/// Every decoder projection slot by target: `(target, layer index, module path)`.
fn projection_path(layer: usize, target: LoraTarget) -> String {
    match target {
        LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => {
            format!("model.layers.{layer}.self_attn.{}", target.name())
        }
        LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => {
            format!("model.layers.{layer}.mlp.{}", target.name())
        }
        LoraTarget::LmHead => "lm_head".into(),
    }
}

impl<B: FusedOps> CausalLm<B> {
    /// The model with LoRA adapters on `config.targets` (PEFT's initialization: `A`
    /// Kaiming-uniform, `B` zeros, so the outputs are unchanged) and every base parameter
    /// frozen (see the module docs). The adapters are f32; the base keeps its dtype.
    /// Errors name a bad setting; a model that already has adapters is refused.
    pub fn with_lora(self, config: &LoraConfig) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Config {
            path: "LoRA configuration".into(),
            message,
        };
        config.validate().map_err(bad)?;
        if self.lora.is_some() {
            return Err(bad("the model already has LoRA adapters".into()));
        }
        let device = self.device();
        let c = self.config.clone();
        let (h, inter, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (q, kv) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let mut model = self.no_grad();
        let init = |d_in: usize, d_out: usize| config.adapter(d_in, d_out).init::<B>(&device);
        for layer in &mut model.model.layers {
            let a = &mut layer.self_attn;
            for (t, p, d_in, d_out) in [
                (LoraTarget::Q, &mut a.q_proj, h, q),
                (LoraTarget::K, &mut a.k_proj, h, kv),
                (LoraTarget::V, &mut a.v_proj, h, kv),
                (LoraTarget::O, &mut a.o_proj, q, h),
            ] {
                if config.targets(t) {
                    p.lora = Some(init(d_in, d_out));
                }
            }
            let m = &mut layer.mlp;
            for (t, p, d_in, d_out) in [
                (LoraTarget::Gate, &mut m.gate_proj, h, inter),
                (LoraTarget::Up, &mut m.up_proj, h, inter),
                (LoraTarget::Down, &mut m.down_proj, inter, h),
            ] {
                if config.targets(t) {
                    p.lora = Some(init(d_in, d_out));
                }
            }
        }
        if config.targets(LoraTarget::LmHead) {
            model.lm_head_lora = Some(init(h, vocab));
        }
        model.lora = Some(config.clone());
        Ok(model)
    }

    /// The LoRA configuration, when the model has adapters.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// Every adapter with its PEFT module path, in the order of the model's parameters.
    pub fn adapters(&self) -> Vec<AdaptedModule<'_, B>> {
        let mut out = Vec::new();
        for (i, layer) in self.model.layers.iter().enumerate() {
            let a = &layer.self_attn;
            let m = &layer.mlp;
            for (t, p) in [
                (LoraTarget::Q, &a.q_proj),
                (LoraTarget::K, &a.k_proj),
                (LoraTarget::V, &a.v_proj),
                (LoraTarget::O, &a.o_proj),
                (LoraTarget::Gate, &m.gate_proj),
                (LoraTarget::Up, &m.up_proj),
                (LoraTarget::Down, &m.down_proj),
            ] {
                if let Some(adapter) = &p.lora {
                    out.push(AdaptedModule {
                        module: projection_path(i, t),
                        adapter,
                    });
                }
            }
        }
        if let Some(adapter) = &self.lm_head_lora {
            out.push(AdaptedModule {
                module: projection_path(0, LoraTarget::LmHead),
                adapter,
            });
        }
        out
    }

    /// The adapters' tensors with PEFT's names (`base_model.model.<module>.lora_A.weight`,
    /// `.lora_B.weight`), f32, PEFT's layouts (`[r, in]`, `[out, r]`).
    pub fn adapter_tensors(&self) -> Vec<(String, TensorData)> {
        let mut out = Vec::new();
        for m in self.adapters() {
            for (which, p) in [("lora_A", &m.adapter.lora_a), ("lora_B", &m.adapter.lora_b)] {
                out.push((
                    format!("{PEFT_PREFIX}{}.{which}.weight", m.module),
                    p.val().cast(DType::F32).into_data(),
                ));
            }
        }
        out
    }

    /// Parameters that require a gradient (the adapters after [`with_lora`](Self::with_lora);
    /// every parameter of a plain model).
    pub fn num_trainable_params(&self) -> usize {
        struct Count(usize);
        impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Count {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if param.val().is_require_grad() {
                    self.0 += param.val().shape().num_elements();
                }
            }
        }
        let mut c = Count(0);
        self.visit(&mut c);
        c.0
    }

    /// Writes PEFT's `adapter_config.json` and `adapter_model.safetensors` to `dir`
    /// (created), loadable by `PeftModel.from_pretrained(base, dir)` and by
    /// [`load_adapter`](Self::load_adapter). `base_model` goes into the config's
    /// `base_model_name_or_path`. Errors when the model has no adapters.
    pub fn save_adapter(
        &self,
        dir: impl AsRef<Path>,
        base_model: Option<&str>,
    ) -> Result<(), ModelError> {
        let dir = dir.as_ref();
        let config = self.lora.as_ref().ok_or_else(|| {
            ModelError::Input("save_adapter: the model has no LoRA adapters".into())
        })?;
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let tensors = self.adapter_tensors();
        crate::saving::write_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors)?;
        let text = serde_json::to_string_pretty(&config.to_peft_json(base_model))
            .expect("a JSON value serializes");
        let path = dir.join(ADAPTER_CONFIG_FILE);
        std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))
    }

    /// Attaches the PEFT adapter of `dir` (`adapter_config.json`,
    /// `adapter_model.safetensors`) to this base model, freezing the base (as
    /// [`with_lora`](Self::with_lora)); the adapter path computes with `precision`.
    /// Every tensor the configuration implies must be in the file with its shape, and the
    /// file must hold no other (errors name the tensor, the expected and found shapes).
    pub fn load_adapter(
        self,
        dir: impl AsRef<Path>,
        precision: AdapterPrecision,
    ) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let config = read_adapter_config(dir)?;
        let config = LoraConfig {
            precision,
            ..config
        };
        let checkpoint = crate::loading::Checkpoint::open_file(dir.join(ADAPTER_WEIGHTS_FILE))?;
        let device = self.device();
        let mut model = self.with_lora(&config)?;
        let mut expected = Vec::new();
        let mut read = |name: String, p: &mut Param<Tensor<B, 2>>| -> Result<(), ModelError> {
            let shape = p.val().dims();
            let data = checkpoint.read(&name, &shape)?;
            *p = Param::from_tensor(Tensor::from_data(data, (&device, DType::F32)));
            expected.push(name);
            Ok(())
        };
        let paths: Vec<String> = model.adapters().iter().map(|m| m.module.clone()).collect();
        let mut slots = model.adapters_mut();
        for (module, adapter) in paths.iter().zip(slots.iter_mut()) {
            read(
                format!("{PEFT_PREFIX}{module}.lora_A.weight"),
                &mut adapter.lora_a,
            )?;
            read(
                format!("{PEFT_PREFIX}{module}.lora_B.weight"),
                &mut adapter.lora_b,
            )?;
        }
        drop(slots);
        // With `lm_head` among the targets PEFT also saves the head's base weight
        // (`save_embedding_layers`), and `PeftModel.from_pretrained` loads it over the
        // base model's: so does this (over the embedding when the head is tied to it, as
        // PyTorch's shared tensor would be).
        let head_base = format!("{PEFT_PREFIX}lm_head.base_layer.weight");
        if model.lm_head_lora.is_some() && checkpoint.names().contains(&head_base.as_str()) {
            let (v, h) = (model.config.vocab_size, model.config.hidden_size);
            let dtype = model.dtype();
            let data = checkpoint.read(&head_base, &[v, h])?;
            let w = Tensor::<B, 2>::from_data(data, (&device, dtype));
            match &mut model.lm_head {
                Some(l) => l.weight = Param::from_tensor(w.transpose()).set_require_grad(false),
                None => {
                    model.model.embed_tokens.weight = Param::from_tensor(w).set_require_grad(false)
                }
            }
            expected.push(head_base);
        }
        let extra: Vec<&str> = checkpoint
            .names()
            .into_iter()
            .filter(|n| !expected.iter().any(|e| e == n))
            .collect();
        if let Some(first) = extra.first() {
            return Err(ModelError::Config {
                path: dir.join(ADAPTER_WEIGHTS_FILE).display().to_string(),
                message: format!(
                    "{} tensor(s) that adapter_config.json's targets ({}) do not explain, e.g. \
                     `{first}`",
                    extra.len(),
                    config
                        .targets
                        .iter()
                        .map(|t| t.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        Ok(model)
    }

    /// The model with every adapter's dropout set to `p` (in `[0, 1)`): e.g. 0 to take
    /// gradients as PyTorch does in evaluation mode (Burn applies dropout whenever the
    /// backend tracks gradients). Panics naming the value when it is out of range.
    pub fn with_lora_dropout(mut self, p: f64) -> Self {
        assert!(
            (0.0..1.0).contains(&p),
            "with_lora_dropout: the dropout must be in [0, 1), got {p}"
        );
        for adapter in self.adapters_mut() {
            adapter.dropout = p;
        }
        if let Some(config) = &mut self.lora {
            config.dropout = p;
        }
        self
    }

    /// Every adapter, mutably, in [`adapters`](Self::adapters)' order.
    fn adapters_mut(&mut self) -> Vec<&mut LoraAdapter<B>> {
        let mut out = Vec::new();
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            for p in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj] {
                if let Some(ad) = &mut p.lora {
                    out.push(ad);
                }
            }
            let m = &mut layer.mlp;
            for p in [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj] {
                if let Some(ad) = &mut p.lora {
                    out.push(ad);
                }
            }
        }
        if let Some(ad) = &mut self.lm_head_lora {
            out.push(ad);
        }
        out
    }

    /// The adapters merged into the base weights: `W + s·B·A` computed in f32 and stored in
    /// the base dtype, the adapters removed and the parameters trainable again (a plain
    /// model, as [`load`](Self::load) gives). An LM-head adapter on a tied embedding
    /// unties it (the merged head is no longer the embedding; `tie_word_embeddings`
    /// becomes false and `lm_head.weight` is saved). A model without adapters is returned
    /// as is.
    pub fn merge_lora(mut self) -> Self {
        if self.lora.is_none() {
            return self;
        }
        fn merged<B: FusedOps>(weight: Tensor<B, 2>, adapter: &LoraAdapter<B>) -> Tensor<B, 2> {
            let dtype = weight.dtype();
            (weight.cast(DType::F32) + adapter.delta_weight()).cast(dtype)
        }
        for layer in &mut self.model.layers {
            let a = &mut layer.self_attn;
            let m = &mut layer.mlp;
            for p in [
                &mut a.q_proj,
                &mut a.k_proj,
                &mut a.v_proj,
                &mut a.o_proj,
                &mut m.gate_proj,
                &mut m.up_proj,
                &mut m.down_proj,
            ] {
                if let Some(ad) = p.lora.take() {
                    p.weight = Param::from_tensor(merged(p.weight.val(), &ad));
                }
            }
        }
        if let Some(ad) = self.lm_head_lora.take() {
            // Burn's `[hidden, vocab]` layout; the tied head is the embedding transposed.
            let base = match &self.lm_head {
                Some(l) => l.weight.val(),
                None => self.model.embed_tokens.weight.val().transpose(),
            };
            self.lm_head = Some(burn::nn::Linear {
                weight: Param::from_tensor(merged(base, &ad)),
                bias: None,
            });
            self.config.tie_word_embeddings = false;
        }
        self.lora = None;
        // Trainable again: every parameter requires a gradient, as in a loaded model.
        struct Train;
        impl<B: burn::tensor::backend::Backend> burn::module::ModuleMapper<B> for Train {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                param.map(|t| t.set_require_grad(true))
            }
        }
        self.map(&mut Train)
    }
}

/// Reads and checks `dir/adapter_config.json`.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig, ModelError> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    if !path.is_file() {
        return Err(ModelError::MissingFile {
            path,
            what: "PEFT adapter configuration".into(),
        });
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.display().to_string(),
        message: format!("not valid JSON: {e}"),
    })?;
    LoraConfig::from_peft_json(&value, &path.display().to_string())
}

/// Files of a Hugging Face model directory besides the weights and `config.json` that a
/// merged checkpoint keeps from its base (tokenizer and generation settings).
pub const CARRIED_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// What [`merge_checkpoint`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct MergeReport {
    /// The adapter's configuration.
    pub lora: LoraConfig,
    /// Adapters merged.
    pub adapters: usize,
    /// Dtype of the written weights.
    pub dtype: DType,
    /// Files copied from the base ([`CARRIED_FILES`] that it has).
    pub copied: Vec<String>,
}

/// The dtype a checkpoint's `config.json` declares (`torch_dtype` / `dtype`), f32 when it
/// declares none or one these models do not load.
pub fn declared_dtype(config: &crate::config::ModelConfig) -> DType {
    match config.torch_dtype.as_deref() {
        Some("bfloat16") => DType::BF16,
        Some("float16") => DType::F16,
        _ => DType::F32,
    }
}

/// `liger merge`: loads the base checkpoint `base` (in `dtype`, by default the dtype its
/// `config.json` declares), attaches the PEFT adapter of `adapter`
/// ([`CausalLm::load_adapter`]), merges it ([`CausalLm::merge_lora`]: `W + s·B·A` in f32,
/// stored in the base dtype) and writes a plain Hugging Face checkpoint to `out`
/// (created), with the base's tokenizer and generation files ([`CARRIED_FILES`]).
/// Errors name the file or tensor at fault; `out` may not be `base` or `adapter`.
pub fn merge_checkpoint<B: FusedOps>(
    base: &Path,
    adapter: &Path,
    out: &Path,
    dtype: Option<DType>,
    device: &B::Device,
) -> Result<MergeReport, ModelError> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(out, base) || same(out, adapter) {
        return Err(ModelError::Input(format!(
            "merge: the output directory {} is the base or the adapter directory; write the \
             merged checkpoint elsewhere",
            out.display()
        )));
    }
    let config = crate::config::ModelConfig::from_file(base.join("config.json"))?;
    let dtype = dtype.unwrap_or_else(|| declared_dtype(&config));
    let model = CausalLm::<B>::load(base, dtype, crate::LigerConfig::none(), device)?
        .load_adapter(adapter, AdapterPrecision::F32)?;
    let lora = model.lora_config().cloned().expect("an adapter was loaded");
    let adapters = model.adapters().len();
    let merged = model.merge_lora();
    merged.save(out)?;
    let mut copied = Vec::new();
    for name in CARRIED_FILES {
        let from = base.join(name);
        if from.is_file() {
            let to = out.join(name);
            std::fs::copy(&from, &to).map_err(|e| ModelError::io(&to, e))?;
            copied.push(name.to_string());
        }
    }
    Ok(MergeReport {
        lora,
        adapters,
        dtype,
        copied,
    })
}
