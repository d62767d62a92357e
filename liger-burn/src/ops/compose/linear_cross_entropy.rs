//! Fused linear cross entropy, chunked over rows so the `[N, V]` logits never exist: the
//! default body of [`FusedOps::fused_linear_cross_entropy`](crate::ops::FusedOps::fused_linear_cross_entropy),
//! built from [`FusedOps::fused_matmul`], slicing and [`FusedOps::fused_cross_entropy`]
//! only, so every backend runs it (with its own matmul and fused cross-entropy kernel
//! where it has them: cuBLASLt on CUDA).
//!
//! Per chunk of rows `c`: `logits_c = x_c Wᵀ (+ b)`, the fused cross entropy writes the
//! loss rows and the logits gradient `g_c` (over `logits_c` itself on the CubeCL
//! backends), then `grad_x_c = g_c W`, `grad_W += g_cᵀ x_c` (in f32), `grad_b += Σ_rows f32(g_c)`.
//! Only the gradients asked for are computed: a frozen LM head
//! ([`LinearCrossEntropyGradsWanted::weight`] false) costs no weight gradient at all.
//!
//! # With a LoRA adapter on the LM head
//!
//! `logits = x Wᵀ + b + s·(x_a Aᵀ) Bᵀ` (see [`crate::ops::lora`]), still chunk by chunk:
//! with `c()` the adapter's compute dtype, `h_c = s·c(x_a,c) c(A)ᵀ` (`[m, r]`) and the
//! chunk's logits `x_c Wᵀ (+ b) + h_c c(B)ᵀ` (added in f32 and rounded once for
//! [`AdapterPrecision::F32`], PEFT's sum); after the cross entropy,
//! `grad_B += f32(c(g_c)ᵀ h_c)`, `u_c = s·c(g_c) c(B)` (`[m, r]`),
//! `grad_A += f32(u_cᵀ c(x_a,c))`, and the adapter path's input gradient `u_c c(A)`, added
//! to `g_c W` (in f32 for an f32 adapter) when the adapter reads `x` itself. Both adapter
//! gradients are f32 accumulators of `[V, r]` and `[r, H]`: `H/r` and `V/r` times smaller
//! than the weight's, and no `[N, V]` tensor exists at any point.
//!
//! # Chunk size and memory
//!
//! Each chunk's weight-gradient product `g_cᵀ x_c` is added to an f32 `[V, H]`
//! accumulator (`V·H·4` bytes for the whole call) by
//! [`FusedOps::fused_matmul_add`]: on CUDA one cuBLASLt call that adds the product,
//! accumulated in f32, inside the accumulator's buffer (no product-sized temporary;
//! reading and writing the accumulator is `8·V·H` bytes a chunk); elsewhere the product
//! in the input dtype, cast and added (one `[V, H]` temporary, `10·V·H` bytes for bf16).
//! That traffic outweighs the chunk's three matmuls (`6·m·V·H` FLOPs) when a chunk has
//! fewer than a few thousand rows `m` on current GPUs, so chunks are not made smaller
//! than `min(H, N)` rows: their logits (`m·V` elements) then take about as much memory as
//! half the accumulator. Above that, chunks follow Liger-Kernel's rule (`≈ N·H/V` rows: a
//! chunk's logits about the size of `x`). The rows are split into equal chunks.

use super::chunked_linear::{LinearGrads, float, logits as chunk_logits, matmul, prim};
use super::lora::{add_adapter, cast};
use super::{to_dtype, to_f32};
use crate::ops::{
    AdapterPrecision, CrossEntropyOptions, FusedOps, LinearCrossEntropyGradsWanted,
    LinearCrossEntropyOutput, LoraHead, LoraHeadGrads, Reduction,
};
use burn::tensor::{
    DType, Int, Tensor, TensorMetadata,
    ops::{FloatTensor, IntTensor},
};
/// Rows per chunk for `x: [n, h]` against `V = v` classes (see the module docs).
pub fn chunk_rows(n: usize, h: usize, v: usize) -> usize {
    #[cfg(feature = "test-hooks")]
    if let Some(forced) = crate::test_hooks::chunk_rows_override() {
        return forced.min(n).max(1);
    }
    automatic_chunk_rows(n, h, v)
}

/// [`chunk_rows`] without the override: the size the module docs describe.
pub fn automatic_chunk_rows(n: usize, h: usize, v: usize) -> usize {
    let liger = (n * h).div_ceil(v.max(1));
    let wanted = liger.max(h).clamp(1, n.max(1));
    // Equal chunks: the same number of chunks, spread evenly.
    n.div_ceil(n.div_ceil(wanted)).max(1)
}

/// What the chunk loop computes for the gradients.
pub(crate) enum Gradients<B: FusedOps> {
    /// None (forward only).
    Skip,
    /// The gradients of the reduced loss (upstream gradient 1).
    Reduced,
    /// The gradients of `Σ_i r_i loss_i` for per-row factors `r: [N]` (reduction none
    /// with an arbitrary upstream gradient).
    RowFactors(FloatTensor<B>),
}

/// See [`FusedOps::fused_linear_cross_entropy`](crate::ops::FusedOps::fused_linear_cross_entropy).
pub fn forward<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    compute_grad: bool,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<B> {
    let (grads, wanted) = if compute_grad {
        (Gradients::Reduced, LinearCrossEntropyGradsWanted::all())
    } else {
        (Gradients::Skip, LinearCrossEntropyGradsWanted::none())
    };
    chunked::<B>(
        x,
        weight,
        bias,
        None,
        targets,
        class_weight,
        grads,
        wanted,
        options,
    )
}

/// See [`FusedOps::fused_lora_linear_cross_entropy`](crate::ops::FusedOps::fused_lora_linear_cross_entropy).
#[allow(clippy::too_many_arguments)]
pub fn forward_lora<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter: Option<LoraHead<B>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    wanted: LinearCrossEntropyGradsWanted,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<B> {
    let grads = if wanted.any() {
        Gradients::Reduced
    } else {
        Gradients::Skip
    };
    chunked::<B>(
        x,
        weight,
        bias,
        adapter,
        targets,
        class_weight,
        grads,
        wanted,
        options,
    )
}

/// Sums `part` into an f32 accumulator.
fn accumulate<B: FusedOps>(acc: &mut Option<Tensor<B, 2>>, part: Tensor<B, 2>) {
    let part = float::<B, 2>(to_f32::<B>(prim(part)));
    *acc = Some(match acc.take() {
        Some(a) => a + part,
        None => part,
    });
}

/// The chunk loop (see the module docs): the gradients of `wanted` (of the inputs that
/// exist) when `grads` is not [`Gradients::Skip`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunked<B: FusedOps>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    adapter: Option<LoraHead<B>>,
    targets: IntTensor<B>,
    class_weight: Option<FloatTensor<B>>,
    grads: Gradients<B>,
    wanted: LinearCrossEntropyGradsWanted,
    options: CrossEntropyOptions,
) -> LinearCrossEntropyOutput<B> {
    let [n, h] = [x.shape()[0], x.shape()[1]];
    let v = weight.shape()[0];
    let x_dtype = x.dtype();
    let w_dtype = weight.dtype();
    let b_dtype = bias.as_ref().map(|b| b.dtype());
    let x: Tensor<B, 2> = float(x);
    let weight: Tensor<B, 2> = float(weight);
    let bias: Option<Tensor<B, 2>> = bias.map(|b| float::<B, 1>(b).reshape([1, v]));
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let class_weight: Option<Tensor<B, 1>> = class_weight.map(float);
    let device = x.device();

    // The gradient scale of every chunk: 1/W (W over all rows) for a mean, else 1.
    let stats = (options.reduction == Reduction::Mean).then(|| {
        B::fused_target_stats(
            targets.clone().into_primitive(),
            class_weight.clone().map(|w| w.into_primitive().tensor()),
            v,
            options.ignore_index,
        )
    });
    let scale: Tensor<B, 1> = match &stats {
        Some(stats) => float(stats.weight_scale.clone()),
        None => Tensor::<B, 1>::ones([1], &device).cast(DType::F32),
    };
    // A mean divides the z-loss by the non-ignored rows, the rest by their weights.
    let z_scale: Option<Tensor<B, 1>> = stats
        .filter(|_| options.lse_square_scale != 0.0 && class_weight.is_some())
        .map(|stats| float(stats.row_scale));
    let kernel_options = options.with_return_z_loss(options.return_z_loss || z_scale.is_some());
    let (with_grad, row_factors) = match grads {
        Gradients::Skip => (false, None),
        Gradients::Reduced => (true, None),
        Gradients::RowFactors(r) => (true, Some(float::<B, 1>(r).cast(DType::F32))),
    };
    let with_grad = with_grad && wanted.any();
    // The adapter: its input (rows sliced per chunk), A and B in the compute dtype.
    struct Adapter<B: FusedOps> {
        x: Option<Tensor<B, 2>>,
        a: Tensor<B, 2>,
        b: Tensor<B, 2>,
        a_dtype: DType,
        scale: f64,
        precision: AdapterPrecision,
        compute: DType,
    }
    let adapter = adapter.map(|ad| {
        let compute = ad.options.precision.compute_dtype(x_dtype);
        let a_dtype = ad.a.dtype();
        Adapter {
            x: ad.x.map(float::<B, 2>),
            a: cast::<B>(float(ad.a), compute),
            b: cast::<B>(float(ad.b), compute),
            a_dtype,
            scale: ad.options.scale,
            precision: ad.options.precision,
            compute,
        }
    });
    let separate = adapter.as_ref().is_some_and(|a| a.x.is_some());
    let want_x = with_grad && wanted.x;
    let want_w = with_grad && wanted.weight;
    let want_b = with_grad && wanted.bias && bias.is_some();
    let want_la = with_grad && wanted.a && adapter.is_some();
    let want_lb = with_grad && wanted.b && adapter.is_some();
    let want_xa = with_grad && wanted.adapter_x && separate;
    // Whether the adapter path's input gradient is needed (into x or into x_a).
    let adapter_input = adapter.is_some() && (want_xa || want_x && !separate);
    let weight_t = weight.clone().transpose(); // [H, V], a view
    let chunk = chunk_rows(n, h, v);
    let mut losses = Vec::new();
    let mut z_losses = Vec::new();
    let mut grad_x = Vec::new();
    let mut grad_xa = Vec::new();
    let mut grads = LinearGrads::<B>::wanted(want_w, want_b)
        .with_accumulation(options.weight_grad_accumulation);
    let mut grad_la: Option<Tensor<B, 2>> = None;
    let mut grad_lb: Option<Tensor<B, 2>> = None;
    let mut r0 = 0;
    while r0 < n {
        let r1 = (r0 + chunk).min(n);
        let x_c = x.clone().slice(r0..r1);
        let mut logits = chunk_logits::<B>(x_c.clone(), &weight_t, bias.as_ref());
        // The adapter's chunk input and scaled hidden `h_c = s·x_a,c·Aᵀ`, `[m, r]`.
        let lora = adapter.as_ref().map(|ad| {
            let xa_c = match &ad.x {
                Some(t) => cast::<B>(t.clone().slice(r0..r1), ad.compute),
                None => cast::<B>(x_c.clone(), ad.compute),
            };
            let hidden = matmul::<B>(xa_c.clone(), ad.a.clone().transpose()).mul_scalar(ad.scale);
            (xa_c, hidden)
        });
        if let (Some(ad), Some((_, hidden))) = (&adapter, &lora) {
            let delta = matmul::<B>(hidden.clone(), ad.b.clone().transpose());
            logits = add_adapter::<B>(logits, delta, x_dtype, ad.precision);
        }
        // Per-row factors go into the kernel's per-row gradient scale: one rounding.
        let (chunk_scale, chunk_z_scale) = match &row_factors {
            Some(r) => (r.clone().slice(r0..r1), None),
            None => (scale.clone(), z_scale.clone()),
        };
        let rows = B::fused_cross_entropy(
            prim(logits),
            targets.clone().slice(r0..r1).into_primitive(),
            class_weight.clone().map(prim),
            with_grad.then(|| prim(chunk_scale)),
            chunk_z_scale.filter(|_| with_grad).map(prim),
            kernel_options,
        );
        losses.push(float::<B, 1>(rows.loss));
        z_losses.extend(rows.z_loss.map(float::<B, 1>));
        if let Some(g) = rows.grad_logits {
            let g: Tensor<B, 2> = float(g);
            let mut adapter_grad_input = None;
            if let (Some(ad), Some((xa_c, hidden))) = (&adapter, lora) {
                let g_c = cast::<B>(g.clone(), ad.compute);
                if want_lb {
                    accumulate(&mut grad_lb, matmul::<B>(g_c.clone().transpose(), hidden));
                }
                if want_la || adapter_input {
                    let u = matmul::<B>(g_c, ad.b.clone()).mul_scalar(ad.scale);
                    if want_la {
                        accumulate(&mut grad_la, matmul::<B>(u.clone().transpose(), xa_c));
                    }
                    if adapter_input {
                        adapter_grad_input = Some(matmul::<B>(u, ad.a.clone()));
                    }
                }
            }
            if want_x {
                let base = matmul::<B>(g.clone(), weight.clone());
                // The adapter path's input gradient joins x's only when it reads x.
                let joined = if separate {
                    None
                } else {
                    adapter_grad_input.take()
                };
                grad_x.push(match (&adapter, joined) {
                    (Some(ad), Some(extra)) => add_adapter::<B>(base, extra, x_dtype, ad.precision),
                    _ => base,
                });
            }
            if let Some(extra) = adapter_grad_input {
                grad_xa.push(cast::<B>(extra, x_dtype));
            }
            // The weight's and bias's f32 accumulators (only those wanted).
            grads.accumulate(g, x_c);
        }
        r0 = r1;
    }

    let reduce = |parts: Vec<Tensor<B, 1>>, s: &Tensor<B, 1>| -> Tensor<B, 1> {
        let rows = Tensor::cat(parts, 0);
        match options.reduction {
            Reduction::Mean => rows.sum() * s.clone(),
            Reduction::Sum => rows.sum(),
            Reduction::None => rows,
        }
    };
    let mut loss = reduce(losses, &scale);
    let z_loss_scale = z_scale.clone().unwrap_or_else(|| scale.clone());
    if let Some(s_z) = &z_scale {
        // The rows' losses hold the z-loss at the scale `s`: move it to `s_z`.
        let z_total = Tensor::cat(z_losses.clone(), 0).sum();
        loss = loss + z_total * (s_z.clone() - scale.clone());
    }
    let z_loss = options
        .return_z_loss
        .then(|| reduce(z_losses, &z_loss_scale));
    let adapter_grads = adapter.map(|ad| LoraHeadGrads {
        grad_x: want_xa.then(|| prim(Tensor::cat(grad_xa, 0))),
        grad_a: grad_la.map(|g| to_dtype::<B>(prim(g), ad.a_dtype)),
        grad_b: grad_lb.map(|g| to_dtype::<B>(prim(g), ad.a_dtype)),
    });
    let (grad_weight, grad_bias) = grads.finish(w_dtype, b_dtype.unwrap_or(w_dtype));
    LinearCrossEntropyOutput {
        loss: prim(loss),
        z_loss: z_loss.map(prim),
        grad_x: want_x.then(|| prim(Tensor::cat(grad_x, 0))),
        grad_weight,
        grad_bias,
        adapter: adapter_grads,
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn chunks_are_even_and_not_smaller_than_h() {
        // The benchmark shape: two chunks of 4096 rows.
        assert_eq!(chunk_rows(8192, 4096, 128_256), 4096);
        // Liger's rule dominates when N·H/V > H (V < N): 5243 rows → 2 chunks of 4096.
        assert_eq!(chunk_rows(8192, 64, 100), 4096);
        // Small problems: one chunk.
        assert_eq!(chunk_rows(37, 72, 1000), 37);
        assert_eq!(chunk_rows(1, 1, 1), 1);
        // Equal chunks: 10_000 rows at ≥ 4096 per chunk → 3 chunks of 3334.
        assert_eq!(chunk_rows(10_000, 4096, 128_256), 3334);
    }
}
