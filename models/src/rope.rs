//! Rotary position embedding tables: inverse frequencies (with Llama 3 scaling) and the
//! cos/sin tables in Hugging Face's layout, `[seq, head_dim]` with the half-width
//! frequencies repeated (`cat(freqs, freqs)`), as `rotate_half` expects.
//!
//! Computed on the host in f32 with the same operations, in the same order, as
//! transformers (which computes them in f32 with autocast off), then cast to the
//! activation dtype like `LlamaRotaryEmbedding.forward`. The device tables of the last
//! length, dtype and device are kept and reused: at 16K positions the host tables take
//! about 10 ms to compute, time the GPU would otherwise wait at the start of every forward.

use crate::config::{ModelConfig, RopeScaling};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use std::any::Any;
use std::sync::{Arc, Mutex};

/// Inverse frequencies of one head, `[head_dim / 2]`, and the device tables last made
/// from them.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    /// The last [`Self::cos_sin`] result, shared by clones (see the module docs).
    last_tables: Arc<Mutex<Option<DeviceTables>>>,
}

impl PartialEq for RotaryEmbedding {
    fn eq(&self, other: &Self) -> bool {
        self.inv_freq == other.inv_freq
    }
}

/// One [`RotaryEmbedding::cos_sin`] result: its length and dtype, and `(device, cos,
/// sin)` of its backend, type-erased.
struct DeviceTables {
    seq_len: usize,
    dtype: DType,
    tables: Box<dyn Any + Send>,
}

impl std::fmt::Debug for DeviceTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTables {{ seq_len: {}, dtype: {:?} }}",
            self.seq_len, self.dtype
        )
    }
}

impl RotaryEmbedding {
    /// The frequencies of `config` (its `head_dim`, `rope_theta` and `rope_scaling`).
    pub fn new(config: &ModelConfig) -> Self {
        Self::from_parts(config.head_dim, config.rope_theta, config.rope_scaling)
    }

    /// The frequencies for a head width, base and scaling.
    pub fn from_parts(head_dim: usize, theta: f64, scaling: RopeScaling) -> Self {
        // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), in f32.
        let base = theta as f32;
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1.0 / base.powf(i as f32 / head_dim as f32))
            .collect();
        let inv_freq = match scaling {
            RopeScaling::None => inv_freq,
            RopeScaling::Linear { factor } => {
                inv_freq.into_iter().map(|f| f / factor as f32).collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3(
                &inv_freq,
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            ),
        };
        RotaryEmbedding {
            inv_freq,
            last_tables: Arc::default(),
        }
    }

    /// The inverse frequencies, `[head_dim / 2]`.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Width of the head these tables rotate.
    pub fn head_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// Host tables for positions `0..seq_len`: `(cos, sin)`, each `[seq_len, head_dim]`
    /// row-major, f32.
    pub fn tables(&self, seq_len: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.head_dim();
        let half = self.inv_freq.len();
        let mut cos = vec![0.0f32; seq_len * d];
        let mut sin = vec![0.0f32; seq_len * d];
        for pos in 0..seq_len {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                // position_ids.float() * inv_freq, in f32.
                let angle = pos as f32 * f;
                let (s, c) = angle.sin_cos();
                for j in [i, i + half] {
                    cos[pos * d + j] = c;
                    sin[pos * d + j] = s;
                }
            }
        }
        (cos, sin)
    }

    /// Device tables for positions `0..seq_len`: `(cos, sin)`, each `[1, seq_len, head_dim]`
    /// in `dtype`. The same length, dtype and device as the last call reuse its tables.
    pub fn cos_sin<B: Backend>(
        &self,
        seq_len: usize,
        dtype: DType,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let mut last = self.last_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = last
            .as_ref()
            .filter(|t| t.seq_len == seq_len && t.dtype == dtype)
            && let Some((on, cos, sin)) = t
                .tables
                .downcast_ref::<(B::Device, Tensor<B, 3>, Tensor<B, 3>)>()
            && on == device
        {
            return (cos.clone(), sin.clone());
        }
        let d = self.head_dim();
        let (cos, sin) = self.tables(seq_len);
        let make = |v: Vec<f32>| {
            Tensor::<B, 3>::from_data(TensorData::new(v, [1, seq_len, d]), (device, DType::F32))
                .cast(dtype)
        };
        let (cos, sin) = (make(cos), make(sin));
        *last = Some(DeviceTables {
            seq_len,
            dtype,
            tables: Box::new((device.clone(), cos.clone(), sin.clone())),
        });
        (cos, sin)
    }
}

impl RotaryEmbedding {
    /// Device tables for per-token positions (packed rows, where each document's positions
    /// restart at 0): `(cos, sin)`, each `[batch, seq, head_dim]` in `dtype`; row `t` holds
    /// the angles of `positions[t]`, the same values [`Self::tables`] gives that position.
    ///
    /// - `positions`: `[batch, seq]` row-major
    ///
    /// # Panics
    /// When `positions` does not hold `batch · seq` values.
    pub fn cos_sin_at<B: Backend>(
        &self,
        positions: &[usize],
        [batch, seq]: [usize; 2],
        dtype: DType,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        assert_eq!(
            positions.len(),
            batch * seq,
            "RoPE tables: {} positions for a [batch {batch}, seq {seq}] batch",
            positions.len()
        );
        let d = self.head_dim();
        let longest = positions.iter().max().map_or(0, |p| p + 1);
        let (cos, sin) = self.tables(longest);
        let gather = |table: &[f32]| {
            let mut out = Vec::with_capacity(positions.len() * d);
            for &p in positions {
                out.extend_from_slice(&table[p * d..(p + 1) * d]);
            }
            Tensor::<B, 3>::from_data(TensorData::new(out, [batch, seq, d]), (device, DType::F32))
                .cast(dtype)
        };
        (gather(&cos), gather(&sin))
    }
}

/// transformers' `_compute_llama3_parameters`, in f32.
fn llama3(
    inv_freq: &[f32],
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    old_context_len: f32,
) -> Vec<f32> {
    let low_freq_wavelen = old_context_len / low_freq_factor;
    let high_freq_wavelen = old_context_len / high_freq_factor;
    let two_pi = 2.0 * std::f32::consts::PI;
    inv_freq
        .iter()
        .map(|&f| {
            let wavelen = two_pi / f;
            // Long wavelengths (low frequencies) are divided by the factor.
            let scaled = if wavelen > low_freq_wavelen {
                f / factor
            } else {
                f
            };
            // Between the two thresholds: interpolate smoothly.
            let medium = (high_freq_wavelen..=low_freq_wavelen).contains(&wavelen);
            if medium {
                let smooth = (old_context_len / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * scaled / factor + smooth * scaled
            } else {
                scaled
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies() {
        let r = RotaryEmbedding::from_parts(8, 10000.0, RopeScaling::None);
        let expect = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in r.inv_freq().iter().zip(expect) {
            assert!((a - b).abs() <= 1e-6 * b.max(1e-3), "{a} vs {b}");
        }
    }

    #[test]
    fn llama3_keeps_high_scales_low_and_smooths_between() {
        // Llama 3.1's parameters at head_dim 128, theta 500000.
        let plain = RotaryEmbedding::from_parts(128, 500000.0, RopeScaling::None);
        let scaled = RotaryEmbedding::from_parts(
            128,
            500000.0,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
        );
        let (p, s) = (plain.inv_freq(), scaled.inv_freq());
        let two_pi = 2.0 * std::f32::consts::PI;
        let mut kinds = [0; 3];
        for (&a, &b) in p.iter().zip(s) {
            let wavelen = two_pi / a;
            if wavelen < 2048.0 {
                assert_eq!(a, b);
                kinds[0] += 1;
            } else if wavelen > 8192.0 {
                assert_eq!(b, a / 8.0);
                kinds[1] += 1;
            } else {
                assert!(b < a && b > a / 8.0);
                kinds[2] += 1;
            }
        }
        assert!(kinds.iter().all(|&k| k > 0), "{kinds:?}");
    }

    #[test]
    fn tables_repeat_the_half() {
        let r = RotaryEmbedding::from_parts(4, 10000.0, RopeScaling::None);
        let (cos, sin) = r.tables(3);
        assert_eq!(cos.len(), 12);
        for pos in 0..3 {
            assert_eq!(cos[pos * 4], cos[pos * 4 + 2]);
            assert_eq!(sin[pos * 4 + 1], sin[pos * 4 + 3]);
            assert_eq!(cos[pos * 4], (pos as f32).cos());
        }
    }

    /// The kept device tables are the ones a fresh computation gives, and a new length or
    /// dtype replaces them (a clone shares them).
    #[cfg(feature = "ndarray")]
    #[test]
    fn device_tables_are_reused_only_for_the_same_length_and_dtype() {
        use burn::backend::NdArray;
        type B = NdArray;
        let device = Default::default();
        let r = RotaryEmbedding::from_parts(8, 10000.0, RopeScaling::None);
        let values = |t: Tensor<B, 3>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
        let (host_cos, host_sin) = r.tables(5);
        let (cos, sin) = r.cos_sin::<B>(5, DType::F32, &device);
        assert_eq!((values(cos), values(sin)), (host_cos.clone(), host_sin));
        let (again, _) = r.clone().cos_sin::<B>(5, DType::F32, &device);
        assert_eq!(values(again), host_cos);
        let (longer, _) = r.cos_sin::<B>(7, DType::F32, &device);
        assert_eq!(values(longer), r.tables(7).0);
        let (double, _) = r.cos_sin::<B>(7, DType::F64, &device);
        assert_eq!(double.dtype(), DType::F64);
        let (back, _) = r.cos_sin::<B>(5, DType::F32, &device);
        assert_eq!(values(back), host_cos);
    }
}
