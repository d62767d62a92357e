//! The models' eager attention taken in groups of heads (so that no `[batch, heads, seq,
//! seq]` score tensor outgrows 32-bit indexing) against the attention over all heads at
//! once: logits and parameter gradients, with Liger on and off, on every model backend of
//! the test device; liger-burn's attention (switch on, one block and several) against the
//! same reference; and the group size and its error against independent arithmetic.

use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::OverrideGuard;
use liger_burn::test_hooks::override_attention_block;
use liger_models::eager_attention::{
    MAX_SCORE_ELEMENTS, heads_per_group, override_max_score_elements,
};
use liger_models::{CausalLm, LigerConfig, ModelConfig, ModelType};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::max_rel;
use liger_tests::{BackendVisitor, for_each_model_backend};
use liger_train::trainer;
use liger_verify::conformance::Rng;

/// The score limit on this thread while held (`None`: the default).
struct Limit(#[allow(dead_code)] Option<OverrideGuard<usize>>);

impl Limit {
    fn set(limit: Option<usize>) -> Self {
        Limit(limit.map(override_max_score_elements))
    }
}

/// Logits and every parameter gradient of `sum(logits · g)`, flattened, in a fixed order.
fn logits_and_grads<B: FusedOps>(
    model: &CausalLm<Autodiff<B>>,
    ids: &[i64],
    shape: [usize; 2],
    g: &[f32],
    device: &B::Device,
) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let ids =
        Tensor::<Autodiff<B>, 2, Int>::from_data(TensorData::new(ids.to_vec(), shape), device);
    let logits = model.forward(ids);
    let dims = logits.dims();
    let g = Tensor::<Autodiff<B>, 3>::from_data(TensorData::new(g.to_vec(), dims), device);
    let grads = (logits.clone() * g).sum().backward();
    let values = |t: Tensor<B, 2>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let mut out = Vec::new();
    for (i, layer) in model.model.layers.iter().enumerate() {
        let a = &layer.self_attn;
        for (name, p) in [
            ("q", &a.q_proj),
            ("k", &a.k_proj),
            ("v", &a.v_proj),
            ("o", &a.o_proj),
        ] {
            let grad = p
                .weight
                .grad(&grads)
                .expect("every projection gets a gradient");
            out.push((format!("layers.{i}.{name}_proj.weight"), values(grad)));
        }
    }
    let logits = logits
        .inner()
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap();
    (logits, out)
}

type LogitsAndGrads<'a> = (&'a [f32], &'a [(String, Vec<f32>)]);

/// Logits and every gradient within 1e-5 of the reference (relative to its largest value).
fn assert_same(
    ctx: &str,
    (logits, grads): LogitsAndGrads,
    (ref_logits, ref_grads): LogitsAndGrads,
) {
    let e = max_rel(logits, ref_logits);
    assert!(e <= 1e-5, "{ctx}: logits differ by {e:e} (relative to max)");
    for ((name, a), (_, b)) in grads.iter().zip(ref_grads) {
        let e = max_rel(a, b);
        assert!(e <= 1e-5, "{ctx}: {name} gradient differs by {e:e}");
    }
}

#[test]
fn attention_in_head_groups_matches_all_heads_at_once() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            // 5 query heads over 1 kv head: room for 2 heads gives groups 2, 2, 1; room
            // for 4 gives 3, 2 (a partial last group either way); room for 1, five groups.
            let mut config = ModelConfig::tiny(ModelType::Llama);
            config.num_attention_heads = 5;
            config.num_key_value_heads = 1;
            config.head_dim = 12;
            let (batch, seq) = (2, 9);
            let per_head = batch * seq * seq;
            let ids: Vec<i64> = (0..batch * seq)
                .map(|_| self.0.below(config.vocab_size) as i64)
                .collect();
            let g = self.0.vec(batch * seq * config.vocab_size, 0.5, 1.5, 0.0);
            let seed = self.0.next_u64() >> 1;
            let eager_kernels = LigerConfig {
                attention: false,
                ..LigerConfig::all()
            };
            for liger in [LigerConfig::none(), eager_kernels] {
                let model =
                    trainer::random_model::<Autodiff<B>>(&config, liger, DType::F32, device, seed);
                let (ref_logits, ref_grads) = {
                    let _l = Limit::set(None);
                    logits_and_grads::<B>(&model, &ids, [batch, seq], &g, device)
                };
                for (room, group) in [(1, 1), (2, 2), (4, 3)] {
                    let _l = Limit::set(Some(room * per_head));
                    assert_eq!(heads_per_group(batch, 5, seq), group);
                    let (logits, grads) =
                        logits_and_grads::<B>(&model, &ids, [batch, seq], &g, device);
                    let ctx = format!("{label} liger {liger:?}, groups of {group} heads");
                    assert_same(&ctx, (&logits, &grads), (&ref_logits, &ref_grads));
                }
                // The same model with liger-burn's attention (switch on), one block and
                // blocks of 2 query rows, against the eager reference.
                let recompute = LigerConfig {
                    attention: true,
                    ..liger
                };
                // The same weights: a second initialization could draw other values, the
                // backends' generators being shared by the tests running beside this one.
                let model = model.with_liger(recompute);
                for block in [None, Some(2 * batch * 5 * seq)] {
                    let _blocks = block.map(override_attention_block);
                    let (logits, grads) =
                        logits_and_grads::<B>(&model, &ids, [batch, seq], &g, device);
                    let ctx = format!("{label} liger {recompute:?}, blocks of {block:?} scores");
                    assert_same(&ctx, (&logits, &grads), (&ref_logits, &ref_grads));
                }
            }
        }
    }
    for_each_model_backend(&mut T(liger_tests::fresh_rng()));
}

#[test]
fn head_groups_stay_within_the_limit_and_name_the_shapes_when_one_head_cannot() {
    // Llama-3.2-1B at 8K tokens: 32 heads of 8192² scores = 2³¹ elements, one more than
    // the limit; 31 heads would fit, so two groups, balanced to 16.
    assert_eq!(MAX_SCORE_ELEMENTS, (1usize << 31) - 1);
    assert_eq!(heads_per_group(1, 32, 4096), 32);
    assert_eq!(heads_per_group(1, 32, 8192), 16);
    assert_eq!(heads_per_group(1, 12, 16384), 6);
    assert_eq!(heads_per_group(1, 32, 32768), 1);
    // Every group keeps batch · group · seq² within the limit, and the number of groups
    // is the fewest that can: ceil(heads / most heads that fit).
    for (b, h, s) in [
        (1, 32, 8192),
        (1, 12, 16384),
        (3, 28, 5000),
        (1, 7, 46340),
        (2, 14, 9000),
    ] {
        let g = heads_per_group(b, h, s);
        let fit = (MAX_SCORE_ELEMENTS / (b * s * s)).min(h);
        assert!(b * g * s * s <= MAX_SCORE_ELEMENTS, "{b} {h} {s}: {g}");
        assert_eq!(h.div_ceil(g), h.div_ceil(fit), "{b} {h} {s}: {g} of {fit}");
    }
    let msg = panic_message(|| {
        heads_per_group(1, 32, 65536);
    });
    assert_mentions(
        "one head too large",
        &msg,
        &["attention", "65536", "batch 1", "seq"],
    );
}
