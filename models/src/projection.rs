//! The linear projections of the decoder layers (`q_proj`, ..., `down_proj`): a frozen or
//! trainable weight and bias, and an optional LoRA adapter.

use crate::kernels;
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use liger_burn::nn::LoraAdapter;
use liger_burn::ops::FusedOps;

/// A linear projection with an optional LoRA adapter. The record names are `burn::nn::Linear`'s
/// (`weight` in Burn's `[d_in, d_out]` layout, `bias`) plus `lora.lora_a` / `lora.lora_b`.
#[derive(Module, Debug)]
pub struct Projection<B: FusedOps> {
    /// `[d_in, d_out]` (a transposed view of Hugging Face's `[out, in]` storage when loaded).
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The LoRA adapter (the weight and bias are then frozen).
    pub lora: Option<LoraAdapter<B>>,
}

impl<B: FusedOps> Projection<B> {
    /// `x: [..., d_in]` → `[..., d_out]`: `linear(x)`, plus the adapter's update when there
    /// is one (through liger-burn's LoRA op when `fused_lora`, else the stock composition).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, fused_lora: bool) -> Tensor<B, D> {
        let bias = self.bias.as_ref().map(|b| b.val());
        match &self.lora {
            Some(adapter) => kernels::lora_linear(x, self.weight.val(), bias, adapter, fused_lora),
            None => burn::tensor::module::linear(x, self.weight.val(), bias),
        }
    }
}
