//! Rotary position embedding module: holds the cos/sin tables, applies the fused RoPE.

use crate::functional;
use crate::ops::{FusedOps, Llama3RopeScaling, RopeLayout};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::{DType, Tensor};

/// Configuration of [`Rope`].
#[derive(Config, Debug)]
pub struct RopeConfig {
    /// Head dimension (even).
    pub head_dim: usize,
    /// Positions the tables cover (`0..max_seq_len`).
    pub max_seq_len: usize,
    /// Frequency base (`rope_theta`: 10000 for Llama 2, 500000 for Llama 3, 1000000 for
    /// Qwen 2).
    #[config(default = 10000.0)]
    pub theta: f64,
    /// Llama 3.1 frequency scaling.
    #[config(default = "None")]
    pub scaling: Option<Llama3RopeScaling>,
    /// Which elements pair up.
    #[config(default = "RopeLayout::RotateHalf")]
    pub layout: RopeLayout,
}

impl RopeConfig {
    /// Builds the tables in `dtype` (use the dtype of the q and k the module will rotate;
    /// other dtypes are converted on every call).
    pub fn init<B: FusedOps>(&self, dtype: DType, device: &B::Device) -> Rope<B> {
        assert!(
            self.max_seq_len > 0,
            "rope: max_seq_len must be positive, got {}",
            self.max_seq_len
        );
        let (cos, sin) = functional::rope_tables::<B>(
            self.theta,
            self.head_dim,
            0..self.max_seq_len,
            self.scaling,
            self.layout,
            dtype,
            device,
        );
        Rope {
            cos,
            sin,
            layout: self.layout,
        }
    }
}

/// Rotary position embedding of q and k with the fused kernel (forward and backward).
#[derive(Module, Debug)]
pub struct Rope<B: FusedOps> {
    /// `[1, max_seq_len, head_dim]` cosines (constants, no gradient).
    pub cos: Tensor<B, 3>,
    /// `[1, max_seq_len, head_dim]` sines (constants, no gradient).
    pub sin: Tensor<B, 3>,
    /// Which elements pair up.
    #[module(skip)]
    pub layout: RopeLayout,
}

impl<B: FusedOps> Rope<B> {
    /// Rotates `q: [batch, q_heads, seq, head_dim]` and `k: [batch, kv_heads, seq,
    /// head_dim]` at positions `start..start + seq` (`start` > 0 for a KV cache).
    pub fn forward(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        start: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [_, max_seq_len, head_dim] = self.cos.dims();
        let seq = q.dims()[2];
        assert!(
            start + seq <= max_seq_len,
            "rope: positions {start}..{} exceed the tables' {max_seq_len} positions (q {:?})",
            start + seq,
            q.dims()
        );
        let table = |t: &Tensor<B, 3>| {
            let t = t.clone().narrow(1, start, seq);
            if t.dtype() == q.dtype() {
                t
            } else {
                t.cast(q.dtype())
            }
        };
        let (cos, sin) = (table(&self.cos), table(&self.sin));
        debug_assert_eq!(cos.dims()[2], head_dim);
        functional::rope(q, k, cos, sin, self.layout)
    }
}
