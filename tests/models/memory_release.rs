//! Memory release points (`CausalLm::with_memory_release_per_layer`, used by
//! `--memory-pool release`): the backward makes one release per decoder layer and one
//! after the loss's backward, and the loss and every gradient are the same bits as without
//! them (the point is an identity).
//! On every model backend of the test device.

use burn::backend::Autodiff;
use burn::optim::GradientsParams;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::memory_releases;
use liger_models::{ModelConfig, ModelType};
use liger_tests::{BackendVisitor, for_each_model_backend};
use liger_train::trainer;
use liger_verify::conformance::Rng;

use crate::grads::{
    assert_differences_seen, deterministic_kernels, first_difference, named_grads, run_inputs,
};

type Ad<B> = Autodiff<B>;

fn f32s<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

#[test]
fn memory_release_points_leave_loss_and_gradients_unchanged() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let config = ModelConfig::tiny(ModelType::Llama);
            let (ids, [batch, seq], seed) = run_inputs(&mut self.0, &config);
            let liger = deterministic_kernels();
            // One model for both runs: the backends' generators are shared by the tests
            // running beside this one, so a second initialization could differ.
            let base = trainer::random_model::<Ad<B>>(&config, liger, DType::F32, device, seed);
            let run = |release: bool| {
                let model = base.clone().with_memory_release_per_layer(release);
                let tokens = || -> Tensor<Ad<B>, 2, Int> {
                    Tensor::from_data(TensorData::new(ids.clone(), [batch, seq]), device)
                };
                let loss = model.loss(tokens(), tokens());
                let value = f32s(loss.clone().inner())[0];
                let before = memory_releases();
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                let releases = memory_releases() - before;
                (value, named_grads::<Ad<B>, _>(&model, &grads), releases)
            };
            let (loss_off, grads_off, releases_off) = run(false);
            let (loss_on, grads_on, releases_on) = run(true);
            assert_eq!(releases_off, 0, "{label}: releases without release points");
            assert_eq!(
                releases_on,
                config.num_hidden_layers as u64 + 1,
                "{label}: one release per decoder layer, and one after the loss's backward"
            );
            assert_eq!(
                loss_on.to_bits(),
                loss_off.to_bits(),
                "{label}: loss {loss_on} with release points, {loss_off} without"
            );
            assert_eq!(
                first_difference(&grads_on, &grads_off),
                None,
                "{label}: a gradient changed with release points"
            );
            assert_differences_seen(&grads_off);
        }
    }
    for_each_model_backend(&mut T(liger_tests::fresh_rng()));
}
