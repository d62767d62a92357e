//! LoRA fine-tuning with liger-train: a run whose base is frozen and whose adapters (every
//! projection and the LM head, dropout on) train; its checkpoints hold only PEFT's adapter
//! files and the adapters' optimizer state; a run resumed from one repeats the
//! uninterrupted run (the same dropout masks, the same adapters, the base untouched).

use crate::training::{TempDir, dataset, model_config, on_model_backends, run, train_config};
use burn::tensor::DType;
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::lora::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
use liger_models::{LigerConfig, LoraConfig, LoraTarget};
use liger_train::checkpoint;
use liger_train::trainer::{self, Resume};
use liger_train::{TrainError, bundled};
use liger_verify::conformance::Rng;
use std::path::Path;

type Rec<B> = trainer::ParamRecord<B>;

/// Every tensor of a checkpoint's adapter_model.safetensors, as f32 bits, by name.
fn adapter_tensors(dir: &Path) -> Vec<(String, Vec<u32>)> {
    let bytes = std::fs::read(dir.join(ADAPTER_WEIGHTS_FILE)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<u32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let v = view
                .data()
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn max_diff(a: &[(String, Vec<u32>)], b: &[(String, Vec<u32>)]) -> f64 {
    assert_eq!(
        a.iter().map(|t| &t.0).collect::<Vec<_>>(),
        b.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            x.1.iter()
                .zip(&y.1)
                .map(|(p, q)| (f32::from_bits(*p) as f64 - f32::from_bits(*q) as f64).abs())
        })
        .fold(0.0, f64::max)
}

#[test]
fn lora_run_checkpoints_adapters_only_and_resumes_exactly() {
    struct T;
    impl crate::training::Case for T {
        fn run<X: FusedOps>(&mut self, label: &str, device: &X::Device, rng: &mut Rng) {
            type B<X> = Liger<burn::backend::Autodiff<X>>;
            let seed = rng.next_u64() >> 1;
            let tok = bundled::tokenizer();
            let data = dataset(&tok, 60, 64);
            let mut config = train_config(seed, 6, 3);
            config.grad_accum = 1 + rng.below(2);
            let lora = LoraConfig {
                targets: LoraTarget::ALL.to_vec(),
                dropout: 0.1,
                use_rslora: rng.below(2) == 0,
                ..LoraConfig::new(4, 8.0)
            };
            config.lora = Some(lora.clone());
            let ctx = format!("{label}: {config:?}");
            let base = || {
                trainer::random_model::<B<X>>(
                    &model_config(),
                    LigerConfig::all(),
                    DType::F32,
                    device,
                    seed,
                )
            };
            let frozen = base().hf_tensors();
            // A model without the run's adapters is refused.
            let (a, b) = (TempDir::new("lora-full"), TempDir::new("lora-resumed"));
            match run(base(), &data, &tok, config.clone(), &a.0, None) {
                Err(TrainError::Config(m)) => assert!(m.contains("LoRA"), "{ctx}: {m}"),
                other => panic!("{ctx}: a model without adapters trained: {:?}", other.err()),
            }

            let model = trainer::attach_lora(base(), &lora, seed, device).unwrap();
            let adapters = model.adapters().len();
            assert_eq!(adapters, 2 * 7 + 1, "{ctx}");
            let full = run(model, &data, &tok, config.clone(), &a.0, None).expect(&ctx);
            assert_eq!(full.steps, 6, "{ctx}");

            // The checkpoint: PEFT's adapter files, optimizer state, tokenizer and trainer
            // state; no model weights.
            let at3 = checkpoint::checkpoint_dir(&a.0, 3);
            for f in [
                ADAPTER_CONFIG_FILE,
                ADAPTER_WEIGHTS_FILE,
                "optimizer.mpk",
                "tokenizer.json",
                "trainer_state.json",
            ] {
                assert!(at3.join(f).is_file(), "{ctx}: {f} missing");
            }
            assert!(
                !at3.join("model.safetensors").exists(),
                "{ctx}: base weights saved"
            );
            assert_eq!(adapter_tensors(&at3).len(), 2 * adapters, "{ctx}");

            // Resumed from step 3 onto a freshly built base.
            let loaded =
                checkpoint::load_lora::<B<X>, Rec<B<X>>>(&at3, base(), device).expect(&ctx);
            assert_eq!(loaded.state.step, 3, "{ctx}");
            assert_eq!(
                loaded.optimizer.len(),
                2 * adapters,
                "{ctx}: optimizer state of the adapters only"
            );
            let err =
                checkpoint::load::<B<X>, Rec<B<X>>>(&at3, DType::F32, LigerConfig::all(), device)
                    .err()
                    .expect("a LoRA checkpoint is not a whole model");
            assert!(err.to_string().contains("adapters only"), "{ctx}: {err}");
            let resume = Resume {
                optimizer: loaded.optimizer,
                state: loaded.state,
            };
            let rest = run(loaded.model, &data, &tok, config, &b.0, Some(resume)).expect(&ctx);
            assert_eq!((rest.steps, rest.last_step), (3, 6), "{ctx}");
            let mut worst = 0.0f64;
            let mut bit_equal = true;
            for (m, r) in full.history[3..].iter().zip(&rest.history) {
                assert_eq!((m.step, m.tokens, m.lr), (r.step, r.tokens, r.lr), "{ctx}");
                worst = worst.max((m.loss - r.loss).abs());
                bit_equal &= m.loss.to_bits() == r.loss.to_bits();
            }
            let final_a = adapter_tensors(&checkpoint::checkpoint_dir(&a.0, 6));
            let final_b = adapter_tensors(&checkpoint::checkpoint_dir(&b.0, 6));
            let params = max_diff(&final_a, &final_b);
            eprintln!(
                "{label}: LoRA resume: losses max diff {worst:e} (bit-equal {bit_equal}), \
                 adapters max diff {params:e}"
            );
            // As the full fine-tuning resume test: bit for bit on NdArray, 1e-6 on CubeCL
            // backends (autotuned reductions may sum in another order in another process).
            let exact = label.starts_with("ndarray");
            let scale = full.history[3..]
                .iter()
                .map(|m| m.loss.abs())
                .fold(1.0, f64::max);
            let (loss_tol, param_tol) = if exact {
                (0.0, 0.0)
            } else {
                (1e-6 * scale, 1e-6)
            };
            assert!(
                worst <= loss_tol
                    && params <= param_tol
                    && (!exact || (bit_equal && final_a == final_b)),
                "{ctx}: losses differ by {worst:e}, adapters by {params:e}\n  uninterrupted {:?}\n  \
                 resumed       {:?}",
                full.history[3..].iter().map(|m| m.loss).collect::<Vec<_>>(),
                rest.history.iter().map(|m| m.loss).collect::<Vec<_>>()
            );
            // The adapters trained; the base stayed as it was.
            let trained = checkpoint::load_lora::<B<X>, Rec<B<X>>>(
                &checkpoint::checkpoint_dir(&b.0, 6),
                base(),
                device,
            )
            .unwrap()
            .model;
            assert_ne!(
                adapter_tensors(&at3),
                final_b,
                "{ctx}: the adapters did not change"
            );
            for ((n, x), (_, y)) in frozen.iter().zip(trained.hf_tensors().iter()) {
                assert_eq!(x.as_bytes(), y.as_bytes(), "{ctx}: base tensor {n} changed");
            }
        }
    }
    on_model_backends(T);
}
