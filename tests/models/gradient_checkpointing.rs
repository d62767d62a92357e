//! Gradient checkpointing (`CausalLm::with_gradient_checkpointing`, `liger train
//! --gradient-checkpointing`): every decoder layer is kept for its recomputation by the
//! forward and run again by `CausalLm::backward`, and the loss and every gradient are the
//! same bits as without it: Llama, Qwen2
//! (biased projections) and Llama with LoRA adapters on a frozen base (the layers' input
//! then needs no gradient, only their adapters do). With LoRA dropout it refuses to run.
//! On every model backend of the test device, through `Liger<Autodiff<B>>`.

use burn::backend::Autodiff;
use burn::module::Module;
use burn::tensor::ElementConversion;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_models::{LigerConfig, LoraConfig, LoraTarget, ModelConfig, ModelType};
use liger_tests::{BackendVisitor, for_each_model_backend};
use liger_train::trainer;
use liger_verify::conformance::Rng;

use crate::grads::{
    assert_differences_seen, deterministic_kernels, first_difference, named_grads, run_inputs,
};

type Train<B> = Liger<Autodiff<B>>;

#[test]
fn gradient_checkpointing_leaves_loss_and_gradients_unchanged() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            for (name, model_type, lora) in [
                ("llama", ModelType::Llama, false),
                ("qwen2", ModelType::Qwen2, false),
                ("llama + lora", ModelType::Llama, true),
            ] {
                let at = format!("{label} {name}");
                let config = ModelConfig::tiny(model_type);
                let (ids, [batch, seq], seed) = run_inputs(&mut self.0, &config);
                let liger = deterministic_kernels();
                // One model for both runs: the backends' generators are shared by the tests
                // running beside this one, so a second initialization could differ.
                let mut base =
                    trainer::random_model::<Train<B>>(&config, liger, DType::F32, device, seed);
                if lora {
                    let adapters = LoraConfig {
                        targets: LoraTarget::ALL.to_vec(),
                        ..LoraConfig::new(4, 8.0)
                    };
                    base = trainer::attach_lora(base, &adapters, seed, device).unwrap();
                    // PEFT starts `B` at zero, which would leave `A` without gradient.
                    base = base.map(&mut RandomLoraB(device.clone()));
                }
                let run = |checkpointing: bool| {
                    // With the release points `liger train` puts on each layer's input
                    // (`--memory-pool release`): a layer's gradient reaches the one before
                    // through them.
                    let model = base
                        .clone()
                        .with_memory_release_per_layer(true)
                        .with_gradient_checkpointing(checkpointing);
                    let tokens = || -> Tensor<Train<B>, 2, Int> {
                        Tensor::from_data(TensorData::new(ids.clone(), [batch, seq]), device)
                    };
                    let loss = model.loss(tokens(), tokens());
                    let value = loss.clone().inner().into_scalar().elem::<f32>();
                    let kept = model.checkpointed_layers();
                    let grads = model.backward(loss);
                    assert_eq!(
                        model.checkpointed_layers(),
                        0,
                        "layers left after the backward"
                    );
                    let grads = named_grads::<Train<B>, _>(&model, &grads);
                    (value, grads, kept)
                };
                let (loss_off, grads_off, recomputes_off) = run(false);
                let (loss_on, grads_on, recomputes_on) = run(true);
                assert_eq!(recomputes_off, 0, "{at}: layers kept without checkpointing");
                assert_eq!(
                    recomputes_on, config.num_hidden_layers,
                    "{at}: every decoder layer kept for its recomputation"
                );
                assert_eq!(
                    loss_on.to_bits(),
                    loss_off.to_bits(),
                    "{at}: loss {loss_on} with checkpointing, {loss_off} without"
                );
                let trained = grads_off.iter().filter(|(_, g)| g.is_some()).count();
                let expected = if lora {
                    "adapters only"
                } else {
                    "every parameter"
                };
                let all_trained = trained == grads_off.len();
                assert_eq!(
                    all_trained, !lora,
                    "{at}: {trained} gradients, expected {expected}"
                );
                assert_eq!(
                    first_difference(&grads_on, &grads_off),
                    None,
                    "{at}: a gradient changed with checkpointing"
                );
                assert_differences_seen(&grads_off);
            }
        }
    }
    for_each_model_backend(&mut T(liger_tests::fresh_rng()));
}

/// Gives every LoRA `B` random values (it starts at zero).
struct RandomLoraB<D>(D);

impl<B: FusedOps> burn::module::ModuleMapper<B> for RandomLoraB<B::Device> {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<B, D>>,
    ) -> burn::module::Param<Tensor<B, D>> {
        let (id, value, mapper) = param.consume();
        let zero = value.clone().abs().max().into_scalar().elem::<f32>() == 0.0;
        let value = if zero && value.is_require_grad() {
            Tensor::random(
                value.shape(),
                burn::tensor::Distribution::Normal(0.0, 0.5),
                &self.0,
            )
            .require_grad()
        } else {
            value
        };
        burn::module::Param::from_mapped_value(id, value, mapper)
    }
}

#[test]
fn gradient_checkpointing_refuses_lora_dropout() {
    struct T;
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let config = ModelConfig::tiny(ModelType::Llama);
            let adapters = LoraConfig {
                targets: vec![LoraTarget::Q],
                dropout: 0.1,
                ..LoraConfig::new(4, 8.0)
            };
            let model = trainer::random_model::<Train<B>>(
                &config,
                LigerConfig::all(),
                DType::F32,
                device,
                7,
            );
            let model = trainer::attach_lora(model, &adapters, 7, device)
                .unwrap()
                .with_gradient_checkpointing(true);
            let ids = Tensor::<Train<B>, 2, Int>::from_data(
                TensorData::new(vec![1i64, 2, 3, 4], [1, 4]),
                device,
            );
            let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                model.loss(ids.clone(), ids.clone())
            }))
            .expect_err("checkpointing with LoRA dropout ran");
            let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(
                message.contains("gradient checkpointing") && message.contains("dropout 0.1"),
                "{label}: {message}"
            );
        }
    }
    for_each_model_backend(&mut T);
}
