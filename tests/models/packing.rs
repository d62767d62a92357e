//! Packed rows (transformers' padding-free packing): each document of a row attends only
//! to itself and its positions restart at 0, so its hidden states, losses and gradients
//! are those of the document run alone. Checked with liger-burn's attention (document ids)
//! and eager attention (a `[batch, seq, seq]` mask), with and without a sliding window, on
//! every model backend of the test device.

use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use liger_models::{CausalLm, Documents, IGNORE_INDEX, LigerConfig, ModelConfig, ModelType};
use liger_tests::tensors::max_rel;
use liger_tests::{BackendVisitor, for_each_model_backend};
use liger_train::trainer;
use liger_verify::conformance::Rng;

type Ad<B> = Autodiff<B>;

fn ints<B: FusedOps>(v: &[i64], shape: [usize; 2], device: &B::Device) -> Tensor<Ad<B>, 2, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), device)
}

fn f32s<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// The q and o projections' weight gradients, the ones every attention path feeds.
fn projection_grads<B: FusedOps>(
    model: &CausalLm<Ad<B>>,
    grads: &<Ad<B> as burn::tensor::backend::AutodiffBackend>::Gradients,
) -> Vec<f32> {
    let mut out = Vec::new();
    for layer in &model.model.layers {
        for p in [&layer.self_attn.q_proj, &layer.self_attn.o_proj] {
            out.extend(f32s(p.weight.grad(grads).expect("a projection gradient")));
        }
    }
    out
}

#[test]
fn documents_restart_positions_at_each_boundary() {
    let docs = Documents::new(vec![0, 0, 0, 1, 1, 2, 7, 7, 7, 7, 7, 7], [2, 6]);
    assert_eq!(docs.positions(), [0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5]);
    assert!(docs.masked(0, 3, 2, None), "another document");
    assert!(!docs.masked(0, 4, 3, None));
    assert!(docs.masked(0, 3, 4, None), "a later key");
    assert!(docs.masked(1, 5, 1, Some(4)), "outside the window");
    assert!(!docs.masked(1, 5, 2, Some(4)));
}

#[test]
fn packed_documents_compute_what_each_document_computes_alone() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            // Row 0: documents of 5 and 6 tokens, then 2 padding tokens (their own
            // document); row 1: 4, 4 and 5 tokens.
            let lengths: [&[usize]; 2] = [&[5, 6, 2], &[4, 4, 5]];
            let (batch, seq) = (2, 13);
            for (model_type, window) in [(ModelType::Llama, None), (ModelType::Mistral, Some(3))] {
                let mut config = ModelConfig::tiny(model_type);
                config.sliding_window = window;
                let ids: Vec<i64> = (0..batch * seq)
                    .map(|_| self.0.below(config.vocab_size) as i64)
                    .collect();
                let mut doc_ids = Vec::new();
                let mut labels = ids.clone();
                for (b, row) in lengths.iter().enumerate() {
                    let mut t = b * seq;
                    for (d, &len) in row.iter().enumerate() {
                        labels[t] = IGNORE_INDEX;
                        doc_ids.extend(std::iter::repeat_n(d as i32, len));
                        t += len;
                    }
                }
                // The padding is never trained.
                labels[11] = IGNORE_INDEX;
                labels[12] = IGNORE_INDEX;
                let trained = labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
                let documents = Documents::new(doc_ids, [batch, seq]);
                let seed = self.0.next_u64() >> 1;
                for attention in [true, false] {
                    let liger = LigerConfig {
                        attention,
                        ..LigerConfig::all()
                    };
                    let ctx = format!(
                        "{label} {model_type:?} window {window:?} liger attention {attention}"
                    );
                    let model =
                        trainer::random_model::<Ad<B>>(&config, liger, DType::F32, device, seed);
                    let hidden = f32s(
                        model
                            .hidden_states_packed(ints::<B>(&ids, [batch, seq], device), &documents)
                            .inner(),
                    );
                    let loss = model.loss_packed(
                        ints::<B>(&ids, [batch, seq], device),
                        ints::<B>(&labels, [batch, seq], device),
                        &documents,
                    );
                    let packed_loss = f32s(loss.clone().inner())[0];
                    let packed_grads = projection_grads::<B>(&model, &loss.backward());

                    // Each document alone (padding excluded), its summed token losses over
                    // the packed batch's trained count: the same mean loss, term by term.
                    let h = config.hidden_size;
                    let mut alone_loss = 0.0f64;
                    let mut alone_total: Option<Tensor<Ad<B>, 1>> = None;
                    for (b, row) in lengths.iter().enumerate() {
                        let mut t = b * seq;
                        for (d, &len) in row.iter().enumerate() {
                            let padding = b == 0 && d == 2;
                            if !padding {
                                let span = t..t + len;
                                let alone = f32s(
                                    model
                                        .hidden_states(ints::<B>(
                                            &ids[span.clone()],
                                            [1, len],
                                            device,
                                        ))
                                        .inner(),
                                );
                                let e = max_rel(&alone, &hidden[t * h..(t + len) * h]);
                                assert!(
                                    e <= 1e-5,
                                    "{ctx}: row {b} document {d} hidden states differ by {e:e}"
                                );
                                let sum = model
                                    .token_losses(
                                        ints::<B>(&ids[span.clone()], [1, len], device),
                                        ints::<B>(&labels[span], [1, len], device),
                                    )
                                    .sum();
                                alone_loss += f32s(sum.clone().inner())[0] as f64;
                                alone_total = Some(match alone_total {
                                    None => sum,
                                    Some(acc) => acc + sum,
                                });
                            }
                            t += len;
                        }
                    }
                    let alone_loss = alone_loss / trained as f64;
                    assert!(
                        (packed_loss as f64 - alone_loss).abs() <= 1e-5 * alone_loss.abs(),
                        "{ctx}: packed loss {packed_loss} vs documents alone {alone_loss}"
                    );
                    let alone_grads = projection_grads::<B>(
                        &model,
                        &alone_total.unwrap().div_scalar(trained as f64).backward(),
                    );
                    let e = max_rel(&packed_grads, &alone_grads);
                    assert!(e <= 1e-5, "{ctx}: projection gradients differ by {e:e}");
                    // A document that saw its neighbour would differ far beyond that: the
                    // same rows without document ids (causal only) must not match.
                    let unpacked = f32s(
                        model
                            .hidden_states(ints::<B>(&ids, [batch, seq], device))
                            .inner(),
                    );
                    let e = max_rel(&unpacked[5 * h..11 * h], &hidden[5 * h..11 * h]);
                    assert!(
                        e > 1e-3,
                        "{ctx}: the second document ignores its boundary ({e:e})"
                    );
                    eprintln!("{ctx}: packed loss {packed_loss}, documents alone {alone_loss}");
                }
            }
        }
    }
    for_each_model_backend(&mut T(liger_tests::fresh_rng()));
}
