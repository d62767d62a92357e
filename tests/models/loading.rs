//! Loading and saving Hugging Face checkpoints with liger-models: errors that name the
//! missing file, the unknown `model_type` or rope type, the missing or wrong-shaped tensor;
//! save → load round trips (identical tensors and outputs, f32 and bf16); sharded
//! checkpoints (index.json); bf16 weights read exactly; config.json in the transformers 4.x
//! and 5.x layouts; random initialization; masked losses; a few AdamW steps.
//!
//! Backend-independent checks run on NdArray; the bf16 model runs on the test device's
//! fusion backend (where it has bf16) and NdArray.

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use liger_models::{
    CausalLm, Checkpoint, LigerConfig, ModelConfig, ModelError, ModelType, RopeScaling, evaluate,
};
use liger_tests::errors::assert_mentions;
use liger_tests::{BackendVisitor, for_each_model_backend};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

type Cpu = NdArray;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/fixtures")
}

const NAMES: [&str; 4] = ["llama", "qwen2", "qwen3", "mistral"];

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "liger-models-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A copy of fixture `name`.
    fn copy_of(name: &str) -> Self {
        let t = Self::new(name);
        for entry in std::fs::read_dir(fixtures().join(name)).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, t.0.join(p.file_name().unwrap())).unwrap();
        }
        t
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn edit_config(&self, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
        let path = self.0.join("config.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(v.as_object_mut().unwrap());
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_cpu(dir: &Path) -> Result<CausalLm<Cpu>, ModelError> {
    CausalLm::<Cpu>::load(dir, DType::F32, LigerConfig::none(), &Default::default())
}

fn load_err(dir: &Path) -> String {
    match load_cpu(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn ids<B: FusedOps>(rows: &[Vec<i64>], device: &B::Device) -> Tensor<B, 2, Int> {
    let seq = rows[0].len();
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), seq]), device)
}

fn sample_ids() -> Vec<Vec<i64>> {
    vec![
        vec![3, 17, 99, 5, 64, 127, 0, 42, 8],
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
    ]
}

fn logits_of<B: FusedOps>(model: &CausalLm<B>, device: &B::Device) -> Vec<f32> {
    model
        .forward(ids::<B>(&sample_ids(), device))
        .into_data()
        .convert::<f32>()
        .to_vec()
        .unwrap()
}

// ---- errors ----

#[test]
fn missing_files_are_named() {
    let nowhere = std::env::temp_dir().join("liger-models-no-such-dir");
    assert_mentions(
        "models_loading",
        &load_err(&nowhere),
        &["liger-models-no-such-dir", "not found"],
    );

    let t = TempDir::copy_of("llama");
    std::fs::remove_file(t.path().join("config.json")).unwrap();
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["config.json", "not found"],
    );

    let t = TempDir::copy_of("llama");
    std::fs::remove_file(t.path().join("model.safetensors")).unwrap();
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &[
            "model.safetensors",
            "model.safetensors.index.json",
            "not found",
        ],
    );

    // An index naming a shard that is not there.
    let t = TempDir::copy_of("qwen3");
    std::fs::remove_file(t.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["model-00002-of-00002.safetensors", "not found"],
    );

    // Not a safetensors file.
    let t = TempDir::copy_of("llama");
    std::fs::write(t.path().join("model.safetensors"), b"not a checkpoint").unwrap();
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn unknown_model_type_and_rope_type_are_refused() {
    let t = TempDir::copy_of("llama");
    t.edit_config(|c| {
        c.insert("model_type".into(), json!("gpt2"));
    });
    let err = load_cpu(t.path()).err().expect("gpt2 must be refused");
    assert!(
        matches!(err, ModelError::UnknownModelType { .. }),
        "{err:?}"
    );
    assert_mentions(
        "models_loading",
        &err.to_string(),
        &[
            "config.json",
            "unknown model_type \"gpt2\"",
            "llama",
            "qwen2",
            "qwen3",
            "mistral",
        ],
    );

    let t = TempDir::copy_of("llama");
    t.edit_config(|c| {
        c.remove("model_type");
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["config.json", "model_type"],
    );

    let t = TempDir::copy_of("llama");
    t.edit_config(|c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}),
        );
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["config.json", "\"yarn\"", "not supported", "llama3"],
    );

    let t = TempDir::copy_of("qwen2");
    t.edit_config(|c| {
        c.insert("use_sliding_window".into(), json!(true));
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["use_sliding_window"],
    );

    let t = TempDir::copy_of("llama");
    t.edit_config(|c| {
        c.insert("hidden_act".into(), json!("gelu"));
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["hidden_act", "gelu"],
    );
}

#[test]
fn wrong_shaped_tensor_is_named_with_both_shapes() {
    let t = TempDir::copy_of("llama");
    t.edit_config(|c| {
        c.insert("intermediate_size".into(), json!(80));
    });
    let err = load_cpu(t.path()).err().expect("shape mismatch");
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err:?}");
    assert_mentions(
        "models_loading",
        &err.to_string(),
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "model.safetensors",
            "[80, 64]",
            "[96, 64]",
        ],
    );

    // The sharded checkpoint names the shard holding the tensor.
    let t = TempDir::copy_of("qwen3");
    t.edit_config(|c| {
        c.insert("head_dim".into(), json!(16));
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["q_proj.weight", "model-0000", "[64, 64]", "[96, 64]"],
    );
}

#[test]
fn missing_tensor_is_named() {
    // qwen2's checkpoint has tied embeddings: no lm_head.weight.
    let t = TempDir::copy_of("qwen2");
    t.edit_config(|c| {
        c.insert("tie_word_embeddings".into(), json!(false));
    });
    let err = load_cpu(t.path()).err().expect("missing lm_head");
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert_mentions(
        "models_loading",
        &err.to_string(),
        &["lm_head.weight", "[128, 64]", "model.safetensors"],
    );

    // Qwen3 without its q/k norms (a Qwen2 checkpoint relabelled).
    let t = TempDir::copy_of("qwen2");
    t.edit_config(|c| {
        c.insert("model_type".into(), json!("qwen3"));
    });
    assert_mentions(
        "models_loading",
        &load_err(t.path()),
        &["model.layers.0.self_attn.q_norm.weight", "[16]"],
    );
}

// ---- round trips ----

#[test]
fn save_then_load_gives_identical_tensors_and_outputs() {
    let device = Default::default();
    for name in NAMES {
        let model = load_cpu(&fixtures().join(name)).unwrap();
        let t = TempDir::new("save");
        model.save(t.path()).unwrap();
        let again = load_cpu(t.path()).unwrap();

        let (a, b) = (model.hf_tensors(), again.hf_tensors());
        assert_eq!(a.len(), b.len(), "{name}");
        for ((na, da), (nb, db)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            assert_eq!(da.shape, db.shape, "{name} {na}");
            assert_eq!(da.as_bytes(), db.as_bytes(), "{name} {na}");
        }
        assert_eq!(
            logits_of(&model, &device),
            logits_of(&again, &device),
            "{name}"
        );

        // The configuration survives (the dtype is now that of the saved model).
        let mut c0 = model.config.clone();
        c0.torch_dtype = Some("float32".into());
        assert_eq!(c0, again.config, "{name}");
        // Every tensor of the original checkpoint was written back, and nothing else.
        let original = Checkpoint::open(fixtures().join(name)).unwrap();
        let saved = Checkpoint::open(t.path()).unwrap();
        assert_eq!(original.names(), saved.names(), "{name}");
    }
}

#[test]
fn sharded_checkpoint_matches_single_file() {
    use safetensors::{Dtype, tensor::TensorView};
    let device = Default::default();
    let model = load_cpu(&fixtures().join("llama")).unwrap();
    let t = TempDir::new("shard");
    std::fs::copy(
        fixtures().join("llama/config.json"),
        t.path().join("config.json"),
    )
    .unwrap();
    let tensors = model.hf_tensors();
    let mut weight_map = serde_json::Map::new();
    let half = tensors.len() / 2;
    for (i, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<(String, TensorView)> = part
            .iter()
            .map(|(n, d)| {
                weight_map.insert(n.clone(), json!(file));
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, d.shape.to_vec(), d.as_bytes()).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &t.path().join(&file)).unwrap();
    }
    std::fs::write(
        t.path().join("model.safetensors.index.json"),
        serde_json::to_string(&json!({"metadata": {}, "weight_map": weight_map})).unwrap(),
    )
    .unwrap();
    let sharded = load_cpu(t.path()).unwrap();
    assert_eq!(logits_of(&model, &device), logits_of(&sharded, &device));

    // An index that names a tensor its shard does not hold.
    let mut weight_map = weight_map.clone();
    weight_map.insert(
        "model.norm.weight".into(),
        json!("model-00001-of-00002.safetensors"),
    );
    if tensors[..half]
        .iter()
        .all(|(n, _)| n != "model.norm.weight")
    {
        std::fs::write(
            t.path().join("model.safetensors.index.json"),
            serde_json::to_string(&json!({"weight_map": weight_map})).unwrap(),
        )
        .unwrap();
        assert_mentions(
            "models_loading",
            &load_err(t.path()),
            &[
                "model.norm.weight",
                "missing",
                "model-00001-of-00002.safetensors",
            ],
        );
    }
}

/// The bf16 checkpoint's raw bytes, by tensor name, sorted.
fn bf16_file_tensors() -> Vec<(String, Vec<u8>)> {
    let path = fixtures().join("mistral/model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (n, t) in st.tensors() {
        assert_eq!(t.dtype(), safetensors::Dtype::BF16, "{n}");
    }
    file_tensors(&path)
}

#[test]
fn bf16_weights_widen_exactly_to_f32() {
    let file = bf16_file_tensors();
    let model = load_cpu(&fixtures().join("mistral")).unwrap();
    let mut ours = model.hf_tensors();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(file.len(), ours.len());
    for ((n, raw), (m, data)) in file.iter().zip(&ours) {
        assert_eq!(n, m);
        let widened: Vec<f32> = raw
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect();
        assert_eq!(data.to_vec::<f32>().unwrap(), widened, "{n}");
    }
}

/// The bf16 checkpoint loaded as an f16 and as a bf16 model, on every backend that has
/// the dtype (lavapipe has f16, not bf16; NdArray neither; CUDA both): parameters equal to
/// the file's values rounded to that dtype, a save writes that dtype and loads back
/// identically (bf16: the original file's bytes), and the token losses agree with
/// transformers run in the same dtype. Tolerance for the last: 10 units of roundoff of the
/// dtype, relative (f16 2⁻¹¹, bf16 2⁻⁸): both implementations round every activation to
/// that precision, in different places; their f32 runs agree to 1e-5 (models_hf_parity).
struct HalfPrecision {
    ran: Vec<String>,
    failures: Vec<String>,
}

impl BackendVisitor for HalfPrecision {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let dir = fixtures().join("mistral");
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let input: Vec<Vec<u32>> = serde_json::from_value(expected["input_ids"].clone()).unwrap();
        let file = bf16_file_tensors();
        for (dtype, key) in [
            (DType::F16, "f16_token_loss"),
            (DType::BF16, "bf16_token_loss"),
        ] {
            if !B::supports_dtype(device, dtype) {
                eprintln!("note: {label} has no {dtype:?}; the {dtype:?} model is not run there");
                continue;
            }
            self.ran.push(format!("{label} {dtype:?}"));
            for (switches, liger) in [("none", LigerConfig::none()), ("all", LigerConfig::all())] {
                let at = format!("{label} {dtype:?} liger={switches}");
                let model = CausalLm::<B>::load(&dir, dtype, liger, device).unwrap();
                assert_eq!(model.dtype(), dtype, "{at}");
                let mut ours = model.hf_tensors();
                ours.sort_by(|a, b| a.0.cmp(&b.0));
                for ((n, raw), (m, data)) in file.iter().zip(&ours) {
                    assert_eq!(n, m);
                    assert_eq!(data.dtype, dtype, "{at} {n}");
                    let want: Vec<u8> = raw
                        .chunks_exact(2)
                        .flat_map(|b| {
                            let v = half::bf16::from_le_bytes([b[0], b[1]]);
                            match dtype {
                                DType::F16 => half::f16::from_f32(v.to_f32()).to_le_bytes(),
                                _ => v.to_le_bytes(),
                            }
                        })
                        .collect();
                    assert_eq!(data.as_bytes(), &want[..], "{at} {n}");
                }

                let t = TempDir::new("half");
                model.save(t.path()).unwrap();
                let config: Value = serde_json::from_str(
                    &std::fs::read_to_string(t.path().join("config.json")).unwrap(),
                )
                .unwrap();
                let name = if dtype == DType::F16 {
                    "float16"
                } else {
                    "bfloat16"
                };
                assert_eq!(config["torch_dtype"], name, "{at}");
                let mut saved = file_tensors(&t.path().join("model.safetensors"));
                saved.sort();
                if dtype == DType::BF16 {
                    assert_eq!(saved, file, "{at}: saved bytes");
                }
                let again = CausalLm::<B>::load(t.path(), dtype, liger, device).unwrap();
                assert_eq!(
                    logits_of(&model, device),
                    logits_of(&again, device),
                    "{at}: reloaded"
                );

                let theirs: Vec<Vec<f32>> = serde_json::from_value(expected[key].clone()).unwrap();
                let report = evaluate(&model, input.clone()).unwrap();
                let mut worst = 0.0f32;
                for (a, b) in report
                    .token_loss
                    .iter()
                    .flatten()
                    .zip(theirs.iter().flatten())
                {
                    worst = worst.max((a - b).abs() / b.abs().max(1.0));
                }
                eprintln!(
                    "{at}: token losses vs transformers in {dtype:?}: max rel error {worst:.3e}"
                );
                let unit_roundoff = if dtype == DType::F16 {
                    2f32.powi(-11)
                } else {
                    2f32.powi(-8)
                };
                if !(worst <= 10.0 * unit_roundoff) {
                    self.failures
                        .push(format!("{at}: token losses off by {worst:.3e} (relative)"));
                }
            }
        }
    }
}

/// Raw bytes of every tensor of a safetensors file, by name, sorted.
fn file_tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.data().to_vec()))
        .collect();
    v.sort();
    v
}

#[test]
fn half_precision_models_load_exactly_save_back_and_match_transformers() {
    let mut run = HalfPrecision {
        ran: Vec::new(),
        failures: Vec::new(),
    };
    for_each_model_backend(&mut run);
    eprintln!("half-precision models ran on: {:?}", run.ran);
    assert!(
        !run.ran.is_empty(),
        "no backend of the test device has f16 or bf16; nothing checked"
    );
    assert!(run.failures.is_empty(), "{}", run.failures.join("\n"));
}

// ---- configuration ----

#[test]
fn transformers_4_and_5_config_layouts_agree() {
    let v5 = ModelConfig::from_file(fixtures().join("llama/config.json")).unwrap();
    let mut legacy: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("llama/config.json")).unwrap(),
    )
    .unwrap();
    let params = legacy.remove("rope_parameters").unwrap();
    let mut scaling = params.as_object().unwrap().clone();
    legacy.insert("rope_theta".into(), scaling.remove("rope_theta").unwrap());
    // 4.x also wrote `type` instead of `rope_type`.
    let kind = scaling.remove("rope_type").unwrap();
    scaling.insert("type".into(), kind);
    legacy.insert("rope_scaling".into(), Value::Object(scaling));
    let dtype = legacy.remove("dtype").unwrap();
    legacy.insert("torch_dtype".into(), dtype);
    let v4 = ModelConfig::from_hf_map(legacy, "legacy").unwrap();
    assert_eq!(v4, v5);
    assert_eq!(
        v5.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64
        }
    );
    assert_eq!(v5.rope_theta, 10000.0);
    assert!(v5.qkv_bias() && v5.o_bias() && v5.mlp_has_bias());

    let q2 = ModelConfig::from_file(fixtures().join("qwen2/config.json")).unwrap();
    assert!(q2.qkv_bias() && !q2.o_bias() && q2.tie_word_embeddings);
    let q3 = ModelConfig::from_file(fixtures().join("qwen3/config.json")).unwrap();
    assert_eq!(q3.head_dim, 24);
    assert!(q3.qk_norm());
    let m = ModelConfig::from_file(fixtures().join("mistral/config.json")).unwrap();
    assert_eq!(m.sliding_window, Some(4));
    assert_eq!(m.torch_dtype.as_deref(), Some("bfloat16"));

    // What we write back parses to the same configuration.
    for c in [v5, q2, q3, m] {
        let Value::Object(map) = c.to_hf_json(None) else {
            unreachable!()
        };
        assert_eq!(ModelConfig::from_hf_map(map, "written").unwrap(), c);
    }
}

#[test]
fn liger_config_switches() {
    assert_eq!(LigerConfig::default(), LigerConfig::all());
    assert!(LigerConfig::all().validate().is_ok());
    assert!(LigerConfig::none().validate().is_ok() && !LigerConfig::none().any());
    let both = LigerConfig {
        cross_entropy: true,
        ..LigerConfig::all()
    };
    let err = both.validate().unwrap_err();
    assert_mentions(
        "models_loading",
        &err,
        &["cross_entropy", "fused_linear_cross_entropy", "exclusive"],
    );
    let r = std::panic::catch_unwind(|| {
        CausalLm::<Cpu>::init(
            &ModelConfig::tiny(ModelType::Llama),
            both,
            DType::F32,
            &Default::default(),
        )
    });
    assert!(r.is_err());
}

// ---- random models, losses, training ----

#[test]
fn random_models_of_every_type_run_save_and_load() {
    let device = Default::default();
    for ty in ModelType::ALL {
        let config = ModelConfig::tiny(ty);
        let model = CausalLm::<Cpu>::init(&config, LigerConfig::none(), DType::F32, &device);
        let n: usize = model.num_params();
        assert_eq!(n, config.num_params(), "{ty}");
        let logits = model.forward(ids::<Cpu>(&sample_ids(), &device));
        assert_eq!(logits.dims(), [2, 9, 128]);
        let t = TempDir::new("random");
        model.save(t.path()).unwrap();
        let again = load_cpu(t.path()).unwrap();
        assert_eq!(
            logits_of(&model, &device),
            logits_of(&again, &device),
            "{ty}"
        );
    }
    // Preset shapes are consistent (not instantiated: too large for a test).
    assert_eq!(ModelConfig::llama3_2_1b().num_params(), 1_235_814_400);
    assert_eq!(ModelConfig::qwen2_5_1_5b().num_params(), 1_543_714_304);
    assert_eq!(ModelConfig::llama3_1_8b().num_params(), 8_030_261_248);
    assert_eq!(ModelConfig::qwen3_0_6b().num_params(), 596_049_920);
    assert_eq!(ModelConfig::mistral_7b().num_params(), 7_241_732_096);
}

#[test]
fn loss_ignores_masked_labels() {
    let device = Default::default();
    let model = load_cpu(&fixtures().join("llama")).unwrap();
    let input = sample_ids();
    let per_token: Vec<f32> = model
        .token_losses(ids::<Cpu>(&input, &device), ids::<Cpu>(&input, &device))
        .into_data()
        .to_vec()
        .unwrap();
    // Mask the first 4 labels of row 0 and the last 2 of row 1.
    let mut labels = input.clone();
    labels[0][..4].fill(-100);
    labels[1][7..].fill(-100);
    let mut kept = Vec::new();
    for b in 0..2 {
        for t in 0..8 {
            if labels[b][t + 1] != -100 {
                kept.push(per_token[b * 8 + t] as f64);
            }
        }
    }
    let want = kept.iter().sum::<f64>() / kept.len() as f64;
    for liger in [LigerConfig::none(), LigerConfig::all()] {
        let model = load_cpu(&fixtures().join("llama"))
            .unwrap()
            .with_liger(liger);
        let loss: f32 = model
            .loss(ids::<Cpu>(&input, &device), ids::<Cpu>(&labels, &device))
            .into_data()
            .to_vec::<f32>()
            .unwrap()[0];
        assert!(
            (loss as f64 - want).abs() < 1e-5,
            "{liger:?}: {loss} vs {want}"
        );
        let none = vec![vec![-100i64; 9]; 2];
        let zero: f32 = model
            .loss(ids::<Cpu>(&input, &device), ids::<Cpu>(&none, &device))
            .into_data()
            .to_vec::<f32>()
            .unwrap()[0];
        assert_eq!(zero, 0.0, "every label ignored");
    }
    // Evaluation refuses ids outside the vocabulary, naming them.
    let err = evaluate(&model, vec![vec![1, 500, 2]])
        .unwrap_err()
        .to_string();
    assert_mentions(
        "models_loading",
        &err,
        &["500", "position 1", "sequence 0", "vocab_size 128"],
    );
}

#[test]
fn adamw_steps_reduce_the_loss() {
    type Train = Autodiff<Cpu>;
    let device = Default::default();
    let mut model = CausalLm::<Train>::load(
        fixtures().join("qwen2"),
        DType::F32,
        LigerConfig::all(),
        &device,
    )
    .unwrap();
    let input = sample_ids();
    let mut labels = input.clone();
    labels[0][..3].fill(-100);
    let mut optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<Train, CausalLm<Train>>();
    let mut losses = Vec::new();
    for _ in 0..5 {
        let loss = model.loss(
            ids::<Train>(&input, &device),
            ids::<Train>(&labels, &device),
        );
        losses.push(loss.clone().into_data().to_vec::<f32>().unwrap()[0]);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    assert!(
        losses[4] < losses[0] - 0.1,
        "loss did not go down: {losses:?}"
    );
    // The trained model, back on the inner backend, saves and loads.
    let inner = model.valid();
    let t = TempDir::new("trained");
    inner.save(t.path()).unwrap();
    let again = load_cpu(t.path()).unwrap();
    // The round trip keeps every weight bit for bit.
    let (saved, loaded) = (inner.hf_tensors(), again.hf_tensors());
    assert_eq!(saved.len(), loaded.len());
    for ((name, a), (name_b, b)) in saved.iter().zip(&loaded) {
        assert_eq!(name, name_b);
        assert_eq!(
            a.as_bytes(),
            b.as_bytes(),
            "{name} changed in the round trip"
        );
    }
    // Logits agree to rounding only: trained weights updated from the fused linear cross
    // entropy's gradients can be strided views, and NdArray's matmul sums a strided
    // operand in another order than the contiguous one loaded from disk.
    let (a, b) = (logits_of(&inner, &device), logits_of(&again, &device));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
    }
}

// ---- bad values and unused tensors ----

/// `config.json` edits that must be refused, each with what the message must name.
#[test]
fn invalid_rope_scaling_and_eps_are_refused_naming_the_value() {
    let llama3 = |edit: Value| {
        let mut scaling = json!({
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        });
        for (k, v) in edit.as_object().unwrap() {
            scaling[k] = v.clone();
        }
        scaling
    };
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "rope_scaling",
            llama3(json!({"factor": 0.0})),
            vec!["`factor`", "positive and finite", "got 0", "llama3"],
        ),
        (
            "rope_scaling",
            llama3(json!({"factor": -8.0})),
            vec!["`factor`", "got -8"],
        ),
        (
            "rope_scaling",
            llama3(json!({"low_freq_factor": 0.0})),
            vec!["`low_freq_factor`", "positive", "got 0"],
        ),
        (
            "rope_scaling",
            llama3(json!({"high_freq_factor": 1.0})),
            vec![
                "`high_freq_factor`",
                "greater than `low_freq_factor` (1)",
                "got 1",
            ],
        ),
        (
            "rope_scaling",
            llama3(json!({"high_freq_factor": 0.5})),
            vec!["`high_freq_factor`", "got 0.5"],
        ),
        (
            "rope_scaling",
            llama3(json!({"original_max_position_embeddings": 0})),
            vec![
                "`original_max_position_embeddings`",
                "positive integer",
                "got 0",
            ],
        ),
        (
            "rope_scaling",
            llama3(json!({"original_max_position_embeddings": 2.5})),
            vec!["`original_max_position_embeddings`", "got 2.5"],
        ),
        (
            "rope_scaling",
            llama3(json!({"original_max_position_embeddings": -64})),
            vec!["`original_max_position_embeddings`", "got -64"],
        ),
        (
            "rope_scaling",
            json!({"rope_type": "linear", "factor": 0.0}),
            vec!["linear", "`factor`", "positive and finite", "got 0"],
        ),
        (
            "rms_norm_eps",
            json!(0.0),
            vec!["`rms_norm_eps`", "positive and finite", "got 0"],
        ),
        (
            "rms_norm_eps",
            json!(-1e-6),
            vec!["`rms_norm_eps`", "got -0.000001"],
        ),
    ];
    for (key, value, parts) in cases {
        let t = TempDir::copy_of("llama");
        t.edit_config(|c| {
            c.remove("rope_parameters");
            c.insert(key.into(), value.clone());
        });
        let msg = load_err(t.path());
        assert_mentions(
            &format!("{key} = {value}"),
            &msg,
            &[&["config.json"][..], &parts[..]].concat(),
        );
    }
    // A configuration built in code is checked when the model is built.
    let mut config = ModelConfig::tiny(ModelType::Llama);
    config.rope_scaling = RopeScaling::Llama3 {
        factor: f64::NAN,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    let mut src = liger_models::params::RandomInit::<Cpu> {
        device: Default::default(),
        dtype: DType::F32,
    };
    let err = CausalLm::<Cpu>::build(config, LigerConfig::none(), &mut src)
        .err()
        .expect("a NaN factor must be refused");
    assert_mentions(
        "tiny llama3 NaN factor",
        &err.to_string(),
        &["`factor`", "NaN"],
    );
}

/// Writes `dir/model.safetensors` holding `tensors` (f32).
fn write_f32_safetensors(dir: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

#[test]
fn unused_checkpoint_tensors_are_reported() {
    let device = Default::default();
    // The fixtures hold exactly what the models use.
    for name in NAMES {
        let (_, report) = CausalLm::<Cpu>::load_with_report(
            fixtures().join(name),
            DType::F32,
            LigerConfig::none(),
            &device,
        )
        .unwrap();
        assert_eq!(report.unused, Vec::<String>::new(), "{name}");
        assert_eq!(report.warning(), None, "{name}");
    }

    // The llama fixture plus two tensors no Llama layer has.
    let t = TempDir::copy_of("llama");
    let bytes = std::fs::read(t.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32, "{n}");
            (n, v.shape().to_vec(), v.data().to_vec())
        })
        .collect();
    let extra = [
        "model.layers.0.self_attn.rotary_emb.inv_freq",
        "value_head.weight",
    ];
    for name in extra {
        tensors.push((name.to_string(), vec![4], vec![0u8; 16]));
    }
    write_f32_safetensors(t.path(), &tensors);
    let (model, report) =
        CausalLm::<Cpu>::load_with_report(t.path(), DType::F32, LigerConfig::none(), &device)
            .unwrap();
    assert_eq!(report.unused, extra, "sorted, every unused tensor");
    let warning = report.warning().expect("a warning");
    assert_mentions(
        "unused tensors",
        &warning,
        &[
            "warning",
            "2 tensor(s)",
            "model.safetensors",
            "not used",
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "value_head.weight",
            "config.json",
        ],
    );
    // The model is the fixture's all the same.
    let reference = load_cpu(&fixtures().join("llama")).unwrap();
    assert_eq!(logits_of(&model, &device), logits_of(&reference, &device));

    // A config.json that describes fewer layers than the checkpoint has: the last
    // layer's tensors are unused, named in the warning.
    let t = TempDir::copy_of("llama");
    let mut layers = 0;
    t.edit_config(|c| {
        layers = c["num_hidden_layers"].as_u64().unwrap();
        c.insert("num_hidden_layers".into(), json!(1));
    });
    let (_, report) =
        CausalLm::<Cpu>::load_with_report(t.path(), DType::F32, LigerConfig::none(), &device)
            .unwrap();
    assert!(layers > 1, "the fixture has {layers} layers");
    assert!(
        !report.unused.is_empty()
            && report
                .unused
                .iter()
                .all(|n| n.starts_with("model.layers.") && !n.starts_with("model.layers.0.")),
        "{:?}",
        report.unused
    );
    let warning = report.warning().unwrap();
    assert_mentions("fewer layers", &warning, &["model.layers.1."]);
}
