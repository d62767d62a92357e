//! LoRA on the causal LMs: PEFT's adapter files (`tests/fixtures/peft/`, saved by
//! transformers + PEFT with `tests/fixtures/peft/generate.py`) loaded onto the base
//! checkpoints of `models/fixtures/` give PEFT's logits, loss and adapter gradients;
//! adapters save in PEFT's format and load back unchanged; merged checkpoints give the
//! adapted model's logits; `with_lora` freezes the base (no gradient, no optimizer state),
//! keeps the adapters f32 on a half-precision base and starts at the base model's outputs;
//! adapter configurations this crate cannot reproduce are refused naming the field.

use crate::hf_parity::{GRAD_TOL, TOL, normwise_error};
use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::{AdapterPrecision, FusedOps};
use liger_models::lora::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, PEFT_PREFIX};
use liger_models::{CausalLm, Checkpoint, LigerConfig, LoraConfig, LoraTarget, ModelConfig};
use liger_tests::errors::assert_mentions;
use liger_tests::{BackendVisitor, for_each_model_backend};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

type Cpu = NdArray;

const CASES: [&str; 2] = ["llama", "qwen2"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn adapter_dir(case: &str) -> PathBuf {
    root().join("tests/fixtures/peft").join(case)
}

#[derive(Deserialize)]
struct Expected {
    base: String,
    input_ids: Vec<Vec<i64>>,
    logits: Vec<f32>,
    logits_shape: Vec<usize>,
    loss: f64,
    /// Per adapter tensor, `‖g_f32 − g_f64‖ / ‖g_f64‖` of PEFT's own f32 gradient.
    grad_f32_error: HashMap<String, f64>,
}

fn expected(case: &str) -> Expected {
    let path = adapter_dir(case).join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("expected.json parses")
}

fn base_dir(e: &Expected) -> PathBuf {
    root().join("models/fixtures").join(&e.base)
}

/// Tensors of a safetensors file as f32 values, by name.
fn read_f32(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors parses");
    file.tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let v = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (t.shape().to_vec(), v))
        })
        .collect()
}

fn ids<B: Backend>(rows: &[Vec<i64>], device: &B::Device) -> Tensor<B, 2, Int> {
    let seq = rows[0].len();
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), seq]), device)
}

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().to_vec::<f32>().unwrap()
}

/// The first value outside `|ours − theirs| ≤ TOL·max(1, |theirs|)`, described.
fn first_mismatch(what: &str, ours: &[f32], theirs: &[f32]) -> Option<String> {
    if ours.len() != theirs.len() {
        return Some(format!(
            "{what}: {} values, expected {}",
            ours.len(),
            theirs.len()
        ));
    }
    ours.iter()
        .zip(theirs)
        .enumerate()
        .find_map(|(i, (&a, &b))| {
            let err = (a as f64 - b as f64).abs();
            (err.is_nan() || err > TOL * (b as f64).abs().max(1.0))
                .then(|| format!("{what}[{i}]: ours {a}, PEFT {b} (error {err:.3e})"))
        })
}

/// The kernel switches the fixtures run under: stock Burn (the adapters through the stock
/// composition), everything fused with the stock LoRA composition, everything fused.
fn switch_sets() -> [(&'static str, LigerConfig); 3] {
    let all_stock_lora = LigerConfig {
        lora: false,
        ..LigerConfig::all()
    };
    [
        ("none", LigerConfig::none()),
        ("all,lora=stock", all_stock_lora),
        ("all", LigerConfig::all()),
    ]
}

/// Logits and loss of PEFT's adapters against PEFT's, every switch set; and the adapter
/// gradients of the loss against PEFT's f64 ones (norm-wise within [`GRAD_TOL`]) through
/// `Autodiff<B>` and `Liger<Autodiff<B>>`, the frozen base getting none.
struct PeftParity {
    failures: Vec<String>,
    compared: usize,
}

impl PeftParity {
    fn gradients<B: AutodiffBackend + FusedOps>(
        &mut self,
        at: &str,
        case: &str,
        liger: LigerConfig,
        device: &B::Device,
    ) {
        let e = expected(case);
        let reference = read_f32(&adapter_dir(case).join("grads.safetensors"));
        let model = CausalLm::<B>::load(base_dir(&e), DType::F32, liger, device)
            .unwrap()
            .load_adapter(adapter_dir(case), AdapterPrecision::F32)
            .unwrap_or_else(|err| panic!("{at}: load_adapter: {err}"))
            // PEFT's gradients are of its evaluation mode: no dropout.
            .with_lora_dropout(0.0);
        let input = ids::<B>(&e.input_ids, device);
        let loss = model.loss(input.clone(), input);
        let grads = loss.backward();
        let adapters = model.adapters();
        assert_eq!(2 * adapters.len(), reference.len(), "{at}: adapter tensors");
        for m in adapters {
            for (which, p) in [("lora_A", &m.adapter.lora_a), ("lora_B", &m.adapter.lora_b)] {
                let name = format!("{PEFT_PREFIX}{}.{which}.weight", m.module);
                let (shape, theirs) = &reference[&name];
                assert_eq!(&p.dims().to_vec(), shape, "{at}: {name}");
                let g = p
                    .val()
                    .grad(&grads)
                    .unwrap_or_else(|| panic!("{at}: no gradient for {name}"));
                let err = normwise_error(&values(g), theirs);
                self.compared += 1;
                if err.is_nan() || err > GRAD_TOL {
                    self.failures.push(format!(
                        "{at}: grad {name}: ‖ours − PEFT‖/‖PEFT‖ = {err:.3e} > {GRAD_TOL:.3e}"
                    ));
                }
            }
        }
        // The frozen base: no parameter outside the adapters has a gradient.
        for (name, p) in model.hf_params() {
            let has = match p {
                liger_models::HfParam::LinearWeight(w) | liger_models::HfParam::Matrix(w) => {
                    w.val().grad(&grads).is_some()
                }
                liger_models::HfParam::Vector(w) => w.val().grad(&grads).is_some(),
            };
            assert!(
                !has,
                "{at}: the frozen base parameter {name} got a gradient"
            );
        }
    }
}

impl BackendVisitor for PeftParity {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        for case in CASES {
            let e = expected(case);
            for (premise, err) in &e.grad_f32_error {
                assert!(
                    *err <= GRAD_TOL,
                    "{case}: PEFT's own f32 gradient of {premise} is {err:.3e} from its f64 one"
                );
            }
            for (switches, liger) in switch_sets() {
                let at = format!("{case} {label} liger={switches}");
                let model = CausalLm::<B>::load(base_dir(&e), DType::F32, liger, device)
                    .unwrap()
                    .load_adapter(adapter_dir(case), AdapterPrecision::F32)
                    .unwrap_or_else(|err| panic!("{at}: load_adapter: {err}"));
                let input = ids::<B>(&e.input_ids, device);
                let logits = model.forward(input.clone());
                assert_eq!(logits.dims().to_vec(), e.logits_shape, "{at}");
                self.compared += 1;
                self.failures.extend(first_mismatch(
                    &format!("{at} logits"),
                    &values(logits),
                    &e.logits,
                ));
                let loss = values(model.loss(input.clone(), input))[0];
                self.compared += 1;
                self.failures.extend(first_mismatch(
                    &format!("{at} loss"),
                    &[loss],
                    &[e.loss as f32],
                ));
            }
            let [none, stock_lora, all] = switch_sets();
            self.gradients::<Autodiff<B>>(
                &format!("{case} {label} liger=none"),
                case,
                none.1,
                device,
            );
            self.gradients::<Liger<Autodiff<B>>>(
                &format!("{case} liger<{label}> liger={}", stock_lora.0),
                case,
                stock_lora.1,
                device,
            );
            self.gradients::<Liger<Autodiff<B>>>(
                &format!("{case} liger<{label}> liger=all"),
                case,
                all.1,
                device,
            );
        }
    }
}

#[test]
fn peft_adapters_give_peft_logits_loss_and_gradients() {
    let mut run = PeftParity {
        failures: Vec::new(),
        compared: 0,
    };
    for_each_model_backend(&mut run);
    eprintln!("{} comparisons with PEFT", run.compared);
    assert!(
        run.failures.is_empty(),
        "differs from PEFT:\n{}",
        run.failures.join("\n")
    );
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "liger-lora-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A copy of PEFT's adapter directory `case`.
    fn copy_of(case: &str) -> Self {
        let t = Self::new(case);
        for f in [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE] {
            std::fs::copy(adapter_dir(case).join(f), t.0.join(f)).unwrap();
        }
        t
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn edit_config(&self, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
        let path = self.0.join(ADAPTER_CONFIG_FILE);
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

fn adapted_cpu(case: &str) -> CausalLm<Cpu> {
    let e = expected(case);
    CausalLm::<Cpu>::load(
        base_dir(&e),
        DType::F32,
        LigerConfig::none(),
        &Default::default(),
    )
    .unwrap()
    .load_adapter(adapter_dir(case), AdapterPrecision::F32)
    .unwrap()
}

/// Saved adapters are PEFT's: the same configuration fields, the same tensor names and
/// bytes (PEFT's copy of the LM head's base weight aside, which liger-burn does not write:
/// the base checkpoint has it), and they load back to the same outputs.
#[test]
fn saved_adapters_are_peft_files_and_load_back() {
    let device = Default::default();
    for case in CASES {
        let e = expected(case);
        let model = adapted_cpu(case);
        let t = TempDir::new("save");
        // A Hugging Face checkpoint cannot hold the adapters: refused, not silently dropped.
        let err = model.save(t.path()).unwrap_err().to_string();
        assert_mentions(
            "lora",
            &err,
            &["LoRA adapters", "save_adapter", "merge_lora"],
        );
        model
            .save_adapter(t.path(), Some(&format!("models/fixtures/{}", e.base)))
            .unwrap();

        let read_json = |dir: &Path| -> Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(ADAPTER_CONFIG_FILE)).unwrap())
                .unwrap()
        };
        let (ours, peft) = (read_json(t.path()), read_json(&adapter_dir(case)));
        for key in [
            "peft_type",
            "task_type",
            "r",
            "lora_alpha",
            "lora_dropout",
            "use_rslora",
            "use_dora",
            "bias",
            "base_model_name_or_path",
            "fan_in_fan_out",
        ] {
            assert_eq!(ours[key], peft[key], "{case}: {key}");
        }
        let targets = |v: &Value| {
            let mut t: Vec<String> = v["target_modules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            t.sort();
            t
        };
        assert_eq!(targets(&ours), targets(&peft), "{case}: target_modules");

        let saved = read_f32(&t.path().join(ADAPTER_WEIGHTS_FILE));
        let mut original = read_f32(&adapter_dir(case).join(ADAPTER_WEIGHTS_FILE));
        original.remove(&format!("{PEFT_PREFIX}lm_head.base_layer.weight"));
        let mut names: Vec<&String> = saved.keys().collect();
        names.sort();
        let mut expected_names: Vec<&String> = original.keys().collect();
        expected_names.sort();
        assert_eq!(names, expected_names, "{case}: tensor names");
        for (name, (shape, v)) in &original {
            assert_eq!(&saved[name].0, shape, "{case}: {name}");
            assert_eq!(&saved[name].1, v, "{case}: {name} changed");
        }

        let again = CausalLm::<Cpu>::load(base_dir(&e), DType::F32, LigerConfig::none(), &device)
            .unwrap()
            .load_adapter(t.path(), AdapterPrecision::F32)
            .unwrap();
        let input = ids::<Cpu>(&e.input_ids, &device);
        assert_eq!(
            values(model.forward(input.clone())),
            values(again.forward(input)),
            "{case}"
        );
    }
}

/// `merge_lora` then `save` writes a plain Hugging Face checkpoint whose logits are the
/// adapted model's (to rounding: `W + s·B·A` in f32 is one more rounding per weight), for
/// an untied LM head with an adapter (Llama), a tied embedding left tied (Qwen2, no head
/// adapter) and a tied embedding whose head has an adapter (untied by the merge).
#[test]
fn merged_checkpoints_give_the_adapted_logits() {
    let device = Default::default();
    let check = |what: &str, adapted: CausalLm<Cpu>, input: &[Vec<i64>]| {
        let want = values(adapted.forward(ids::<Cpu>(input, &device)));
        let tied = adapted.config.tie_word_embeddings;
        let head_adapter = adapted.lm_head_lora.is_some();
        let merged = adapted.merge_lora();
        assert!(merged.lora_config().is_none() && merged.adapters().is_empty());
        let t = TempDir::new("merged");
        merged.save(t.path()).unwrap();
        let names = Checkpoint::open(t.path()).unwrap();
        assert!(
            !names.names().iter().any(|n| n.contains("lora")),
            "{what}: adapter tensors in the merged checkpoint"
        );
        let reloaded =
            CausalLm::<Cpu>::load(t.path(), DType::F32, LigerConfig::none(), &device).unwrap();
        assert_eq!(
            reloaded.config.tie_word_embeddings,
            tied && !head_adapter,
            "{what}: tie_word_embeddings"
        );
        let got = values(reloaded.forward(ids::<Cpu>(input, &device)));
        if let Some(m) = first_mismatch(&format!("{what} merged logits"), &got, &want) {
            panic!("{m}");
        }
    };
    for case in CASES {
        let e = expected(case);
        check(case, adapted_cpu(case), &e.input_ids);
    }
    // A tied head with an adapter (B made random: PEFT's init would merge nothing).
    let e = expected("qwen2");
    let mut model = CausalLm::<Cpu>::load(base_dir(&e), DType::F32, LigerConfig::none(), &device)
        .unwrap()
        .with_lora(&LoraConfig {
            targets: vec![LoraTarget::V, LoraTarget::LmHead],
            ..LoraConfig::new(4, 8.0)
        })
        .unwrap();
    let head = model.lm_head_lora.as_mut().unwrap();
    let shape = head.lora_b.dims();
    head.lora_b = Param::from_tensor(Tensor::random(
        shape,
        Distribution::Normal(0.0, 0.5),
        &device,
    ));
    check("qwen2 + lm_head adapter", model, &e.input_ids);
}

/// Counts the elements of parameters that do (`.0`) and do not (`.1`) require a gradient.
struct Trainable(usize, usize);

impl<B: Backend> ModuleVisitor<B> for Trainable {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let n = param.val().shape().num_elements();
        if param.val().is_require_grad() {
            self.0 += n;
        } else {
            self.1 += n;
        }
    }
}

/// `with_lora` on every target of a random model in each dtype of the device: outputs
/// unchanged at PEFT's init (`B = 0`), adapters f32 whatever the base dtype, the trainable
/// parameters exactly the adapters' `r·(d_in + d_out)` each, no gradient and no AdamW state
/// for the base, and a few steps that change only the adapters.
struct Frozen;

impl BackendVisitor for Frozen {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        for dtype in liger_tests::dtypes::<B>(device) {
            type T<B> = Liger<Autodiff<B>>;
            let at = format!("{label} {dtype:?}");
            let mut config = ModelConfig::tiny(liger_models::ModelType::Llama);
            config.tie_word_embeddings = false;
            let base = CausalLm::<T<B>>::init(&config, LigerConfig::all(), dtype, device);
            let input: Vec<Vec<i64>> = vec![(0..9).map(|i| (i * 7 + 3) % 64).collect(); 2];
            let before = values(base.valid().forward(ids::<Liger<B>>(&input, device)));
            let lora = LoraConfig {
                targets: LoraTarget::ALL.to_vec(),
                dropout: 0.1,
                ..LoraConfig::new(4, 8.0)
            };
            let mut model = base.with_lora(&lora).unwrap();
            // Outputs at init: exactly the base model's (evaluation: no dropout).
            let after = values(model.valid().forward(ids::<Liger<B>>(&input, device)));
            assert_eq!(before, after, "{at}: LoRA at init changed the outputs");

            let (h, i, v) = (
                config.hidden_size,
                config.intermediate_size,
                config.vocab_size,
            );
            let (q, kv) = (
                config.num_attention_heads * config.head_dim,
                config.num_key_value_heads * config.head_dim,
            );
            let per_layer = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
                .iter()
                .map(|(a, b)| 4 * (a + b))
                .sum::<usize>();
            let adapters = config.num_hidden_layers * per_layer + 4 * (h + v);
            let mut count = Trainable(0, 0);
            model.visit(&mut count);
            assert_eq!(count.0, adapters, "{at}: trainable parameters");
            assert_eq!(model.num_trainable_params(), adapters, "{at}");
            assert_eq!(count.1, config.num_params(), "{at}: frozen parameters");
            for m in model.adapters() {
                assert_eq!(
                    m.adapter.lora_a.val().dtype(),
                    DType::F32,
                    "{at}: {}",
                    m.module
                );
                assert_eq!(
                    m.adapter.lora_b.val().dtype(),
                    DType::F32,
                    "{at}: {}",
                    m.module
                );
            }

            let frozen = model.valid().hf_tensors();
            let mut optim = liger_burn::optim::AdamWConfig::new()
                .with_weight_decay(0.01)
                .init::<T<B>, CausalLm<T<B>>>();
            for step in 0..3 {
                let input = ids::<T<B>>(&input, device);
                let loss = model.loss(input.clone(), input);
                let grads = loss.backward();
                for (name, p) in model.hf_params() {
                    let has = match p {
                        liger_models::HfParam::LinearWeight(w)
                        | liger_models::HfParam::Matrix(w) => w.val().grad(&grads).is_some(),
                        liger_models::HfParam::Vector(w) => w.val().grad(&grads).is_some(),
                    };
                    assert!(!has, "{at} step {step}: the frozen {name} got a gradient");
                }
                let grads = GradientsParams::from_grads(grads, &model);
                assert_eq!(grads.len(), 2 * model.adapters().len(), "{at}: gradients");
                model = optim.step(1e-2, model, grads);
            }
            // AdamW state for the adapters only.
            assert_eq!(
                optim.to_record().len(),
                2 * model.adapters().len(),
                "{at}: optimizer state"
            );
            // The base is bit for bit unchanged; the adapters moved the outputs.
            let trained = model.valid();
            for ((name, a), (_, b)) in frozen.iter().zip(trained.hf_tensors().iter()) {
                assert_eq!(a.as_bytes(), b.as_bytes(), "{at}: {name} changed");
            }
            let moved = values(trained.forward(ids::<Liger<B>>(&input, device)));
            assert_ne!(moved, before, "{at}: training the adapters changed nothing");
        }
    }
}

#[test]
fn with_lora_freezes_the_base_and_trains_only_f32_adapters() {
    for_each_model_backend(&mut Frozen);
}

fn load_err(dir: &Path) -> String {
    let e = expected("llama");
    let base = CausalLm::<Cpu>::load(
        base_dir(&e),
        DType::F32,
        LigerConfig::none(),
        &Default::default(),
    )
    .unwrap();
    match base.load_adapter(dir, AdapterPrecision::F32) {
        Ok(_) => panic!("loading the adapter of {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Adapter configurations and files this crate cannot reproduce are refused, naming the
/// field or the tensor.
#[test]
fn unsupported_adapters_are_refused_naming_the_field() {
    type Edit = fn(&mut serde_json::Map<String, Value>);
    let cases: [(Edit, &[&str]); 7] = [
        (
            |c| {
                c.insert("use_dora".into(), true.into());
            },
            &["use_dora"],
        ),
        (
            |c| {
                c.insert("rank_pattern".into(), serde_json::json!({"q_proj": 8}));
            },
            &["rank_pattern"],
        ),
        (
            |c| {
                c.insert("target_modules".into(), ".*proj".into());
            },
            &["target_modules", ".*proj"],
        ),
        (
            |c| {
                c.insert(
                    "target_modules".into(),
                    serde_json::json!(["q_proj", "qkv_proj"]),
                );
            },
            &["qkv_proj"],
        ),
        (
            |c| {
                c.insert("layers_to_transform".into(), serde_json::json!([0]));
            },
            &["layers_to_transform"],
        ),
        (
            |c| {
                c.insert("peft_type".into(), "IA3".into());
            },
            &["peft_type", "IA3"],
        ),
        // A rank that does not match the file: the tensor and both shapes are named.
        (
            |c| {
                c.insert("r".into(), 5.into());
            },
            &["lora_A.weight", "[5, 64]", "[4, 64]"],
        ),
    ];
    for (edit, parts) in cases {
        let t = TempDir::copy_of("llama");
        t.edit_config(edit);
        assert_mentions("lora", &load_err(t.path()), parts);
    }
    // A target the file has no tensors for.
    let t = TempDir::copy_of("qwen2");
    let e = expected("llama");
    let base = CausalLm::<Cpu>::load(
        base_dir(&e),
        DType::F32,
        LigerConfig::none(),
        &Default::default(),
    )
    .unwrap();
    t.edit_config(|c| {
        c.insert(
            "target_modules".into(),
            serde_json::json!(["q_proj", "k_proj"]),
        );
        c.insert("r".into(), 8.into());
    });
    let err = base
        .load_adapter(t.path(), AdapterPrecision::F32)
        .unwrap_err()
        .to_string();
    assert_mentions("lora", &err, &["k_proj.lora_A.weight"]);
    // Missing files are named.
    let t = TempDir::new("empty");
    assert_mentions("lora", &load_err(t.path()), &[ADAPTER_CONFIG_FILE]);
}

/// `liger merge`'s work (`merge_checkpoint`): PEFT's adapter merged into the base and
/// written as a plain checkpoint gives PEFT's logits of the adapted model, keeps the
/// base's tokenizer, and refuses to write over its inputs.
#[test]
fn merge_checkpoint_writes_a_plain_checkpoint_with_peft_logits() {
    let device = Default::default();
    for case in CASES {
        let e = expected(case);
        // The base with a tokenizer beside it (the fixtures have none).
        let base = TempDir::new("base");
        for entry in std::fs::read_dir(base_dir(&e)).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, base.path().join(p.file_name().unwrap())).unwrap();
        }
        std::fs::write(base.path().join("tokenizer.json"), "{\"tokenizer\": 1}").unwrap();
        let out = TempDir::new("merge-out");
        let report = liger_models::lora::merge_checkpoint::<Cpu>(
            base.path(),
            &adapter_dir(case),
            out.path(),
            None,
            &device,
        )
        .unwrap();
        assert_eq!(report.dtype, DType::F32, "{case}");
        assert_eq!(report.copied, vec!["tokenizer.json".to_string()], "{case}");
        assert_eq!(
            std::fs::read(out.path().join("tokenizer.json")).unwrap(),
            b"{\"tokenizer\": 1}",
            "{case}"
        );
        let merged =
            CausalLm::<Cpu>::load(out.path(), DType::F32, LigerConfig::none(), &device).unwrap();
        let logits = values(merged.forward(ids::<Cpu>(&e.input_ids, &device)));
        if let Some(m) = first_mismatch(&format!("{case} merged logits"), &logits, &e.logits) {
            panic!("{m}");
        }
        let err = liger_models::lora::merge_checkpoint::<Cpu>(
            base.path(),
            &adapter_dir(case),
            base.path(),
            None,
            &device,
        )
        .unwrap_err()
        .to_string();
        assert_mentions("merge", &err, &["output directory", "base or the adapter"]);
    }
}
