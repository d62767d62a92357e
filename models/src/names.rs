//! The Hugging Face name of every parameter, in one place: saving writes these names, and
//! training code can use them (e.g. to exempt biases and norm weights from weight decay).
//! Loading asks for the same names when the modules are built ([`crate::params`]); the
//! save → load round-trip test keeps the two in step.

use crate::attention::Attention;
use crate::decoder_layer::DecoderLayer;
use crate::mlp::Mlp;
use crate::model::CausalLm;
use crate::projection::Projection;
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};
use liger_burn::nn::RmsNorm;
use liger_burn::ops::FusedOps;

/// A parameter and how its Hugging Face layout relates to Burn's.
#[derive(Clone, Copy, Debug)]
pub enum HfParam<'a, B: FusedOps> {
    /// A `Linear` weight: Burn stores `[in, out]`, Hugging Face `[out, in]` (transposed).
    LinearWeight(&'a Param<Tensor<B, 2>>),
    /// A matrix stored as in Hugging Face (the embedding, `[vocab, hidden]`).
    Matrix(&'a Param<Tensor<B, 2>>),
    /// A vector: a bias, or a norm weight (Burn's `gamma`).
    Vector(&'a Param<Tensor<B, 1>>),
}

impl<B: FusedOps> HfParam<'_, B> {
    /// The value in Hugging Face layout, on the host, in the parameter's dtype.
    pub fn hf_data(&self) -> TensorData {
        match self {
            HfParam::LinearWeight(p) => p.val().transpose().into_data(),
            HfParam::Matrix(p) => p.val().into_data(),
            HfParam::Vector(p) => p.val().into_data(),
        }
    }

    /// Shape in Hugging Face layout.
    pub fn hf_shape(&self) -> Vec<usize> {
        match self {
            HfParam::LinearWeight(p) => {
                let [i, o] = p.val().dims();
                vec![o, i]
            }
            HfParam::Matrix(p) => p.val().dims().to_vec(),
            HfParam::Vector(p) => p.val().dims().to_vec(),
        }
    }

    /// Its gradient in `grads`, in Hugging Face layout, on the host (`None` when the
    /// backward did not reach it).
    pub fn hf_grad(&self, grads: &B::Gradients) -> Option<TensorData>
    where
        B: burn::tensor::backend::AutodiffBackend,
    {
        match self {
            HfParam::LinearWeight(p) => p.val().grad(grads).map(|g| g.transpose().into_data()),
            HfParam::Matrix(p) => p.val().grad(grads).map(|g| g.into_data()),
            HfParam::Vector(p) => p.val().grad(grads).map(|g| g.into_data()),
        }
    }

    /// Whether it is a vector (bias or norm weight: the parameters AdamW recipes usually
    /// exempt from weight decay).
    pub fn is_vector(&self) -> bool {
        matches!(self, HfParam::Vector(_))
    }
}

struct Collect<'a, B: FusedOps> {
    out: Vec<(String, HfParam<'a, B>)>,
}

impl<'a, B: FusedOps> Collect<'a, B> {
    fn linear(&mut self, prefix: &str, l: &'a Linear<B>) {
        self.weights(prefix, &l.weight, l.bias.as_ref());
    }

    fn projection(&mut self, prefix: &str, p: &'a Projection<B>) {
        self.weights(prefix, &p.weight, p.bias.as_ref());
    }

    fn weights(
        &mut self,
        prefix: &str,
        weight: &'a Param<Tensor<B, 2>>,
        bias: Option<&'a Param<Tensor<B, 1>>>,
    ) {
        self.out
            .push((format!("{prefix}.weight"), HfParam::LinearWeight(weight)));
        if let Some(b) = bias {
            self.out
                .push((format!("{prefix}.bias"), HfParam::Vector(b)));
        }
    }

    fn norm(&mut self, prefix: &str, n: &'a RmsNorm<B>) {
        self.out
            .push((format!("{prefix}.weight"), HfParam::Vector(&n.gamma)));
    }

    fn attention(&mut self, prefix: &str, a: &'a Attention<B>) {
        self.projection(&format!("{prefix}.q_proj"), &a.q_proj);
        self.projection(&format!("{prefix}.k_proj"), &a.k_proj);
        self.projection(&format!("{prefix}.v_proj"), &a.v_proj);
        self.projection(&format!("{prefix}.o_proj"), &a.o_proj);
        if let Some(n) = &a.q_norm {
            self.norm(&format!("{prefix}.q_norm"), n);
        }
        if let Some(n) = &a.k_norm {
            self.norm(&format!("{prefix}.k_norm"), n);
        }
    }

    fn mlp(&mut self, prefix: &str, m: &'a Mlp<B>) {
        self.projection(&format!("{prefix}.gate_proj"), &m.gate_proj);
        self.projection(&format!("{prefix}.up_proj"), &m.up_proj);
        self.projection(&format!("{prefix}.down_proj"), &m.down_proj);
    }

    fn layer(&mut self, i: usize, l: &'a DecoderLayer<B>) {
        let p = format!("model.layers.{i}");
        self.attention(&format!("{p}.self_attn"), &l.self_attn);
        self.mlp(&format!("{p}.mlp"), &l.mlp);
        self.norm(&format!("{p}.input_layernorm"), &l.input_layernorm);
        self.norm(
            &format!("{p}.post_attention_layernorm"),
            &l.post_attention_layernorm,
        );
    }
}

impl<B: FusedOps> CausalLm<B> {
    /// Every parameter with its Hugging Face name (`model.embed_tokens.weight`,
    /// `model.layers.0.self_attn.q_proj.weight`, ..., `lm_head.weight` unless tied), in
    /// transformers' `state_dict` order.
    pub fn hf_params(&self) -> Vec<(String, HfParam<'_, B>)> {
        let mut c = Collect { out: Vec::new() };
        c.out.push((
            "model.embed_tokens.weight".into(),
            HfParam::Matrix(&self.model.embed_tokens.weight),
        ));
        for (i, layer) in self.model.layers.iter().enumerate() {
            c.layer(i, layer);
        }
        c.norm("model.norm", &self.model.norm);
        if let Some(head) = &self.lm_head {
            c.linear("lm_head", head);
        }
        c.out
    }
}
