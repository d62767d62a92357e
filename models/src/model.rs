//! The causal LM: embedding, decoder layers, final norm, LM head (or the tied embedding),
//! the forward pass and the shifted next-token loss.

use crate::attention::AttentionInputs;
use crate::config::ModelConfig;
use crate::decoder_layer::DecoderLayer;
use crate::error::ModelError;
use crate::gradient_checkpointing::LayerTape;
use crate::kernels::{self, Reduction};
use crate::liger_config::LigerConfig;
use crate::lora::LoraConfig;
use crate::packing::Documents;
use crate::params::{self, ParamSource, RandomInit};
use crate::rope::RotaryEmbedding;
use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use liger_burn::nn::{LoraAdapter, RmsNorm};
use liger_burn::ops::FusedOps;

/// The decoder stack under the `model.` prefix of Hugging Face checkpoints
/// (transformers' `LlamaModel`).
#[derive(Module, Debug)]
pub struct DecoderModel<B: FusedOps> {
    /// Token embedding, `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm, `[hidden]`.
    pub norm: RmsNorm<B>,
}

/// A decoder-only causal language model (Llama, Qwen2, Qwen3, Mistral), generic over any
/// backend with liger-burn's fused ops (`Liger<…>`, CubeCL backends, NdArray; wrap in
/// `Autodiff` to train).
///
/// It is a Burn [`Module`]: `model.num_params()`, optimizers (`AdamW` over the whole
/// module), `Module::save_file`/`load_file` and `valid()`/`fork()` work as for any module.
/// Record names mirror the Hugging Face ones (`model.layers.0.self_attn.q_proj.weight`,
/// Burn's `gamma` for norm weights).
#[derive(Module, Debug)]
pub struct CausalLm<B: FusedOps> {
    /// Embedding, layers and final norm.
    pub model: DecoderModel<B>,
    /// `[hidden] → [vocab]`; `None` when the embedding is tied (`tie_word_embeddings`).
    pub lm_head: Option<Linear<B>>,
    /// The LM head's LoRA adapter (`A: [r, hidden]`, `B: [vocab, r]`), tied head or not.
    pub lm_head_lora: Option<LoraAdapter<B>>,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: ModelConfig,
    /// Which ops run the fused kernels.
    #[module(skip)]
    pub liger: LigerConfig,
    /// The LoRA adapters' configuration, when the model has them (see [`crate::lora`]).
    #[module(skip)]
    pub lora: Option<LoraConfig>,
    #[module(skip)]
    rope: RotaryEmbedding,
    /// Whether each decoder layer's input is a memory release point of the backward
    /// (`liger_burn::functional::memory_release_point`): see
    /// [`with_memory_release_per_layer`](Self::with_memory_release_per_layer).
    #[module(skip)]
    memory_release_per_layer: bool,
    /// Whether each decoder layer is recomputed in the backward instead of keeping its
    /// activations: see [`with_gradient_checkpointing`](Self::with_gradient_checkpointing).
    #[module(skip)]
    gradient_checkpointing: bool,
    /// The layers kept by the forwards since the last [`backward`](Self::backward) when
    /// checkpointing is on.
    #[module(skip)]
    tape: LayerTape,
}

impl<B: FusedOps> CausalLm<B> {
    /// A randomly initialized model (transformers' initialization: weights normal with
    /// std 0.02, biases 0, norms 1), parameters in `dtype`, on `device`.
    ///
    /// Panics with the reason if `config` or `liger` is invalid.
    pub fn init(
        config: &ModelConfig,
        liger: LigerConfig,
        dtype: DType,
        device: &B::Device,
    ) -> Self {
        let mut src = RandomInit::<B> {
            device: device.clone(),
            dtype,
        };
        Self::build(config.clone(), liger, &mut src).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Builds the model taking every parameter from `src` (random init or a checkpoint).
    pub fn build<S: ParamSource<B>>(
        config: ModelConfig,
        liger: LigerConfig,
        src: &mut S,
    ) -> Result<Self, ModelError> {
        let invalid = |message: String| ModelError::Config {
            path: "model configuration".into(),
            message,
        };
        config.validate().map_err(invalid)?;
        liger.validate().map_err(invalid)?;
        let (h, v) = (config.hidden_size, config.vocab_size);
        let embed_tokens = params::embedding(src, "model.embed_tokens", v, h)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::build(&config, liger, i, src))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = params::rms_norm(src, "model.norm", h, config.rms_norm_eps)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(params::linear(src, "lm_head", h, v, false)?)
        };
        Ok(CausalLm {
            model: DecoderModel {
                embed_tokens,
                layers,
                norm,
            },
            lm_head,
            lm_head_lora: None,
            rope: RotaryEmbedding::new(&config),
            config,
            liger,
            lora: None,
            memory_release_per_layer: false,
            gradient_checkpointing: false,
            tape: LayerTape::default(),
        })
    }

    /// The same model with (or without) a memory release point on each decoder layer's
    /// input and on the last one's output: in the backward, once a layer's gradients (or
    /// the loss's) are done, the device pool's free
    /// buffers go back to the device, so what the layer kept serves the next layer's
    /// gradients whatever their sizes. For a pool that reuses buffers by size only
    /// (`--memory-pool release`); the losses and gradients are unchanged. Off by default.
    pub fn with_memory_release_per_layer(mut self, on: bool) -> Self {
        self.memory_release_per_layer = on;
        self
    }

    /// The same model with (or without) gradient checkpointing, as transformers'
    /// `gradient_checkpointing_enable()`: a decoder layer keeps only its input for the
    /// backward, which runs the layer's forward again before its own backward (see
    /// [`crate::gradient_checkpointing`]). The activations of one layer at a time are alive
    /// in the backward instead of every layer's, for one more forward of each; the losses
    /// and gradients are unchanged. Take the gradients with [`backward`](Self::backward)
    /// (`loss.backward()` alone stops at the last layer). Off by default; no effect
    /// without autodiff.
    ///
    /// LoRA adapters with dropout cannot be checkpointed (the recomputed forward would
    /// draw other masks): the forward panics, saying so, when both are set.
    pub fn with_gradient_checkpointing(mut self, on: bool) -> Self {
        self.gradient_checkpointing = on;
        self
    }

    /// The same model with other kernel switches, set in every layer. Panics if `liger`
    /// is invalid (cross entropy and fused linear cross entropy both on).
    pub fn with_liger(mut self, liger: LigerConfig) -> Self {
        liger.validate().unwrap_or_else(|e| panic!("{e}"));
        self.liger = liger;
        for layer in &mut self.model.layers {
            layer.kernels = liger;
            layer.self_attn.kernels = liger;
            layer.mlp.kernels = liger;
        }
        self
    }

    /// Dtype of the parameters (and of the activations).
    pub fn dtype(&self) -> DType {
        self.model.embed_tokens.weight.val().dtype()
    }

    /// Device of the parameters.
    pub fn device(&self) -> B::Device {
        self.model.embed_tokens.weight.val().device()
    }

    /// RoPE frequencies of the model.
    pub fn rotary_embedding(&self) -> &RotaryEmbedding {
        &self.rope
    }

    /// The LM head weight in Hugging Face layout, `[vocab, hidden]` (the embedding matrix
    /// when tied).
    pub fn lm_head_weight(&self) -> Tensor<B, 2> {
        match &self.lm_head {
            // Burn's `[hidden, vocab]`; the transpose is a view.
            Some(linear) => linear.weight.val().transpose(),
            None => self.model.embed_tokens.weight.val(),
        }
    }

    /// Final hidden states (after the last norm).
    ///
    /// - `input_ids`: `[batch, seq]`, token ids in `0..vocab`
    /// - returns `[batch, seq, hidden]`
    pub fn hidden_states(&self, input_ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.hidden(input_ids, None)
    }

    /// Final hidden states of packed rows: each document's positions restart at 0 and its
    /// tokens attend only to its own earlier tokens, so every document's states are those
    /// it would have alone (transformers' padding-free packing).
    ///
    /// - `input_ids`: `[batch, seq]`; `documents`: the same shape
    /// - returns `[batch, seq, hidden]`
    ///
    /// # Panics
    /// When the shapes differ, naming them.
    pub fn hidden_states_packed(
        &self,
        input_ids: Tensor<B, 2, Int>,
        documents: &Documents,
    ) -> Tensor<B, 3> {
        self.hidden(input_ids, Some(documents))
    }

    fn hidden(&self, input_ids: Tensor<B, 2, Int>, documents: Option<&Documents>) -> Tensor<B, 3> {
        let [batch, seq] = input_ids.dims();
        assert!(
            batch > 0 && seq > 0,
            "CausalLm: input_ids must be a non-empty [batch, seq] tensor, got {:?}",
            input_ids.dims()
        );
        if let Some(d) = documents {
            assert_eq!(
                d.shape(),
                [batch, seq],
                "CausalLm: documents {:?} and input_ids {:?} must have one shape",
                d.shape(),
                [batch, seq]
            );
        }
        let device = input_ids.device();
        let mut x = self.model.embed_tokens.forward(input_ids);
        if x.dtype() != DType::F32 {
            // Workaround: burn-cubecl-fusion 0.21 panics (codegen/ir.rs:500, `resolve_arg`
            // out of bounds) when a fused reduction reads the embedding's reshaped `select`
            // output through an f16/bf16 → f32 cast, i.e. the stock RMSNorm right after
            // the embedding. One elementwise op in between avoids that fusion; it costs a
            // pass over [batch, seq, hidden] and changes no value.
            x = x.add_scalar(0.0);
        }
        let window = self.config.sliding_window;
        let inputs = match documents {
            None => {
                let (cos, sin) = self.rope.cos_sin::<B>(seq, x.dtype(), &device);
                AttentionInputs {
                    cos,
                    sin,
                    // Only eager attention reads a whole `[seq, seq]` mask.
                    mask: (!self.liger.attention)
                        .then(|| causal_mask::<B>(seq, window, &device).unsqueeze()),
                    document_ids: None,
                    window,
                }
            }
            Some(d) => {
                let (cos, sin) =
                    self.rope
                        .cos_sin_at::<B>(&d.positions(), [batch, seq], x.dtype(), &device);
                let ids =
                    || Tensor::from_data(TensorData::new(d.ids().to_vec(), [batch, seq]), &device);
                AttentionInputs {
                    cos,
                    sin,
                    mask: (!self.liger.attention).then(|| packed_mask::<B>(d, window, &device)),
                    document_ids: self.liger.attention.then(ids),
                    window,
                }
            }
        };
        if self.gradient_checkpointing
            && let Some(dropout) = self.lora.as_ref().map(|l| l.dropout).filter(|&p| p > 0.0)
        {
            panic!(
                "CausalLm: gradient checkpointing runs each layer's forward again in the \
                 backward, which would draw other LoRA dropout masks (dropout {dropout}); set \
                 the adapters' dropout to 0 (`with_lora_dropout(0.0)`) or turn checkpointing off"
            );
        }
        // Whether `x` needs a gradient (a layer input that is not a leaf does not say so);
        // only checkpointing asks.
        let mut tracked = self.gradient_checkpointing
            && crate::gradient_checkpointing::trains(&self.model.embed_tokens);
        for layer in &self.model.layers {
            if self.memory_release_per_layer {
                x = liger_burn::functional::memory_release_point(x);
            }
            x = if self.gradient_checkpointing {
                let (y, y_tracked) = self.tape.forward(layer, x, tracked, &inputs);
                tracked = y_tracked;
                y
            } else {
                layer.forward(x, &inputs)
            };
        }
        if self.memory_release_per_layer {
            // Also on the last layer's output: in the backward the loss's and the final
            // norm's buffers (the LM head's chunks, kept free since the forward) go back
            // before the last layer's gradients are allocated.
            x = liger_burn::functional::memory_release_point(x);
        }
        let norm = &self.model.norm;
        kernels::rms_norm(x, norm.gamma.val(), norm.epsilon, self.liger.rms_norm)
    }

    /// LM head on hidden states: `[..., hidden]` → `[..., vocab]` logits (with the LM
    /// head's LoRA update when it has an adapter).
    pub fn logits<const D: usize>(&self, hidden: Tensor<B, D>) -> Tensor<B, D> {
        let (weight, bias) = match &self.lm_head {
            Some(linear) => (linear.weight.val(), linear.bias.as_ref().map(|b| b.val())),
            None => (self.model.embed_tokens.weight.val().transpose(), None),
        };
        match &self.lm_head_lora {
            Some(adapter) => kernels::lora_linear(hidden, weight, bias, adapter, self.liger.lora),
            None => burn::tensor::module::linear(hidden, weight, bias),
        }
    }

    /// Logits of every position.
    ///
    /// - `input_ids`: `[batch, seq]`
    /// - returns `[batch, seq, vocab]`, in the model's dtype
    pub fn forward(&self, input_ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.logits(self.hidden_states(input_ids))
    }

    /// Mean next-token cross entropy (transformers' `ForCausalLMLoss`): position `t`'s
    /// logits are scored against `labels[:, t + 1]`; labels equal to `-100`
    /// ([`kernels::IGNORE_INDEX`]) are excluded from the mean (0 when every label is).
    /// With fused linear cross entropy on, the logits are never materialized.
    ///
    /// - `input_ids`, `labels`: `[batch, seq]` with `seq ≥ 2`; labels are usually the
    ///   input ids with prompt and padding positions set to `-100`. Pad on the right: the
    ///   attention is causal, so right padding never changes the other positions.
    /// - returns `[1]`, f32
    pub fn loss(&self, input_ids: Tensor<B, 2, Int>, labels: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        self.shifted_loss(input_ids, labels, None, Reduction::Mean)
    }

    /// [`Self::loss`] over packed rows (see [`Self::hidden_states_packed`]). Label the
    /// first token of each document `-100`: nothing before it in its document predicts it.
    ///
    /// - `input_ids`, `labels`, `documents`: `[batch, seq]` with `seq ≥ 2`
    /// - returns `[1]`, f32
    pub fn loss_packed(
        &self,
        input_ids: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
        documents: &Documents,
    ) -> Tensor<B, 1> {
        self.shifted_loss(input_ids, labels, Some(documents), Reduction::Mean)
    }

    /// Per-token next-token losses: `[batch, seq - 1]` where `[b, t]` is the loss of
    /// `labels[b, t + 1]` given tokens `..= t` (0 where that label is `-100`), f32.
    pub fn token_losses(
        &self,
        input_ids: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
    ) -> Tensor<B, 2> {
        let [batch, seq] = input_ids.dims();
        self.shifted_loss(input_ids, labels, None, Reduction::None)
            .reshape([batch, seq - 1])
    }

    /// [`Self::token_losses`] over packed rows (see [`Self::hidden_states_packed`]).
    pub fn token_losses_packed(
        &self,
        input_ids: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
        documents: &Documents,
    ) -> Tensor<B, 2> {
        let [batch, seq] = input_ids.dims();
        self.shifted_loss(input_ids, labels, Some(documents), Reduction::None)
            .reshape([batch, seq - 1])
    }

    fn shifted_loss(
        &self,
        input_ids: Tensor<B, 2, Int>,
        labels: Tensor<B, 2, Int>,
        documents: Option<&Documents>,
        reduction: Reduction,
    ) -> Tensor<B, 1> {
        let [batch, seq] = input_ids.dims();
        assert!(
            labels.dims() == input_ids.dims() && seq >= 2,
            "CausalLm loss: input_ids and labels must both be [batch, seq] with seq >= 2, got \
             input_ids {:?} and labels {:?}",
            input_ids.dims(),
            labels.dims()
        );
        let hidden = self.hidden(input_ids, documents);
        let h = hidden.dims()[2];
        let n = batch * (seq - 1);
        // The last position predicts nothing; the first label is never predicted.
        let hidden = hidden.narrow(1, 0, seq - 1).reshape([n, h]);
        let targets = labels.narrow(1, 1, seq - 1).reshape([n]);
        if self.liger.fused_linear_cross_entropy {
            kernels::fused_linear_cross_entropy(
                hidden,
                self.lm_head_weight(),
                self.lm_head_lora.as_ref(),
                targets,
                reduction,
                true,
                self.liger.lora,
                self.liger.head_grad_accumulation,
                self.liger.check_targets,
            )
        } else {
            kernels::cross_entropy(
                self.logits(hidden),
                targets,
                reduction,
                self.liger.cross_entropy,
                self.liger.check_targets,
            )
        }
    }
}

/// `[seq, seq]`, `true` where query `i` may not attend key `j`: `j > i` (causal), or
/// `i - j >= window` (transformers' sliding-window overlay, `kv_idx > q_idx - window`).
pub fn causal_mask<B: FusedOps>(
    seq: usize,
    sliding_window: Option<usize>,
    device: &B::Device,
) -> Tensor<B, 2, Bool> {
    let mut masked = Vec::with_capacity(seq * seq);
    for i in 0..seq {
        for j in 0..seq {
            let outside = sliding_window.is_some_and(|w| i >= j + w);
            masked.push(j > i || outside);
        }
    }
    Tensor::from_data(TensorData::new(masked, [seq, seq]), device)
}

/// `[batch, seq, seq]`, `true` where query `i` of row `b` may not attend key `j`: a later
/// key, a key outside `sliding_window`, or another document of the packed row.
pub fn packed_mask<B: FusedOps>(
    documents: &Documents,
    sliding_window: Option<usize>,
    device: &B::Device,
) -> Tensor<B, 3, Bool> {
    let [batch, seq] = documents.shape();
    let mut masked = Vec::with_capacity(batch * seq * seq);
    for b in 0..batch {
        for i in 0..seq {
            for j in 0..seq {
                masked.push(documents.masked(b, i, j, sliding_window));
            }
        }
    }
    Tensor::from_data(TensorData::new(masked, [batch, seq, seq]), device)
}

impl<B: burn::tensor::backend::AutodiffBackend + FusedOps> CausalLm<B>
where
    CausalLm<B>: burn::module::AutodiffModule<B>,
    DecoderLayer<B>: burn::module::AutodiffModule<B>,
{
    /// The gradients of every parameter from `loss` (a scalar computed by this model's
    /// forwards since the last call): `GradientsParams::from_grads(loss.backward(), self)`,
    /// and with [gradient checkpointing](Self::with_gradient_checkpointing) the kept layers
    /// run again and are backpropagated one at a time.
    ///
    /// - `loss`: `[1]`
    pub fn backward(&self, loss: Tensor<B, 1>) -> burn::optim::GradientsParams {
        self.tape.backward(loss, self)
    }

    /// How many checkpointed layers wait for [`backward`](Self::backward).
    pub fn checkpointed_layers(&self) -> usize {
        self.tape.len()
    }
}
