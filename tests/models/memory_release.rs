//! Memory release points (`CausalLm::with_memory_release_per_layer`, used by
//! `--memory-pool release`): the backward makes one release per decoder layer and one
//! after the loss's backward, and the loss and every gradient are the same bits as without
//! them (the point is an identity).
//! On every model backend of the test device.

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::memory_releases;
use liger_models::{CausalLm, LigerConfig, ModelConfig, ModelType};
use liger_tests::{BackendVisitor, for_each_model_backend};
use liger_train::trainer;
use liger_verify::conformance::Rng;

type Ad<B> = Autodiff<B>;

fn f32s<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Every parameter's gradient, named, in a fixed order.
fn all_grads<B: FusedOps>(
    model: &CausalLm<Ad<B>>,
    grads: &<Ad<B> as AutodiffBackend>::Gradients,
) -> Vec<(String, Vec<f32>)> {
    let grad = |name: String, p: &burn::module::Param<Tensor<Ad<B>, 2>>| {
        let g = p
            .grad(grads)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        (name, f32s(g))
    };
    let grad1 = |name: String, p: &burn::module::Param<Tensor<Ad<B>, 1>>| {
        let g = p
            .grad(grads)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        (name, f32s(g))
    };
    let mut out = vec![grad(
        "embed_tokens".into(),
        &model.model.embed_tokens.weight,
    )];
    for (i, layer) in model.model.layers.iter().enumerate() {
        let a = &layer.self_attn;
        let m = &layer.mlp;
        for (n, p) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
            ("gate_proj", &m.gate_proj),
            ("up_proj", &m.up_proj),
            ("down_proj", &m.down_proj),
        ] {
            out.push(grad(format!("layers.{i}.{n}"), &p.weight));
        }
        out.push(grad1(
            format!("layers.{i}.input_layernorm"),
            &layer.input_layernorm.gamma,
        ));
        out.push(grad1(
            format!("layers.{i}.post_attention_layernorm"),
            &layer.post_attention_layernorm.gamma,
        ));
    }
    out.push(grad1("norm".into(), &model.model.norm.gamma));
    out
}

/// The first gradient whose bits differ between `a` and `b`, by name.
fn first_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> Option<String> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).find_map(|((name, x), (_, y))| {
        let same = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        (!same).then(|| name.clone())
    })
}

#[test]
fn memory_release_points_leave_loss_and_gradients_unchanged() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let config = ModelConfig::tiny(ModelType::Llama);
            let (batch, seq) = (2, 11);
            let ids: Vec<i64> = (0..batch * seq)
                .map(|_| self.0.below(config.vocab_size) as i64)
                .collect();
            let seed = self.0.next_u64() >> 1;
            // Deterministic gradients: the flash backward's atomic dQ sums may otherwise
            // differ in their last bits from run to run on CUDA.
            let liger = LigerConfig {
                deterministic: true,
                ..LigerConfig::all()
            };
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
                let grads = loss.backward();
                let releases = memory_releases() - before;
                (value, all_grads::<B>(&model, &grads), releases)
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
            // The comparison sees a changed gradient: one element of the last one doubled.
            let mut wrong = grads_on.clone();
            let last = wrong.last_mut().unwrap();
            last.1[0] = 2.0 * last.1[0] + 1.0;
            let name = last.0.clone();
            assert_eq!(first_difference(&wrong, &grads_off), Some(name));
        }
    }
    for_each_model_backend(&mut T(liger_tests::fresh_rng()));
}
