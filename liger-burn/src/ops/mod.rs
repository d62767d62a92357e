//! The fused-op trait: one method per fused primitive, on Burn primitives.
//!
//! Every method has an exact default body composed of stock Burn ops (see
//! [`compose`]), so every backend implements the trait; CubeCL backends
//! override them with the fused kernels, `Fusion<B>` registers them as custom
//! operations in the fusion stream, and `Autodiff<B>` adds backward nodes that
//! call the fused backward primitives.
//!
//! Shapes: `x` is `[..., d]` of any rank; the fused dimension is always the last
//! one. Per-row statistics (`rstd`, `mean`) are f32 tensors of shape `[..., 1]`.

mod adamw;
pub mod compose;
mod distill_rows;
mod divergence;
mod fused_linear_distill;
mod fused_linear_preference;
mod fused_linear_rl;
mod lora;
mod options;
mod pending_read;
pub mod validate;

pub use adamw::*;
pub use distill_rows::*;
pub use divergence::*;
pub use fused_linear_distill::*;
pub use fused_linear_preference::*;
pub use fused_linear_rl::*;
pub use lora::*;
pub use options::*;
pub use pending_read::PendingRead;

use burn::tensor::{
    DType, Shape,
    backend::Backend,
    ops::{BoolTensor, Device, FloatTensor, IntTensor},
};

/// Output of the fused RMSNorm forward.
#[derive(Debug, Clone)]
pub struct RmsNormOutput<B: Backend> {
    /// Normalized and scaled output, `[..., d]`, dtype of `x`.
    pub output: FloatTensor<B>,
    /// Reciprocal root mean square per row, `[..., 1]`, f32.
    pub rstd: FloatTensor<B>,
}

/// Output of the fused residual-add + RMSNorm forward.
#[derive(Debug, Clone)]
pub struct AddRmsNormOutput<B: Backend> {
    /// `rms_norm(x + residual)`, `[..., d]`.
    pub output: FloatTensor<B>,
    /// `x + residual`, `[..., d]` (the next residual stream).
    pub sum: FloatTensor<B>,
    /// Reciprocal root mean square of `sum` per row, `[..., 1]`, f32.
    pub rstd: FloatTensor<B>,
}

/// Output of the fused LayerNorm forward.
#[derive(Debug, Clone)]
pub struct LayerNormOutput<B: Backend> {
    /// `(x - mean) * rstd * gamma + beta`, `[..., d]`.
    pub output: FloatTensor<B>,
    /// Row mean, `[..., 1]`, f32.
    pub mean: FloatTensor<B>,
    /// Reciprocal standard deviation per row, `[..., 1]`, f32.
    pub rstd: FloatTensor<B>,
}

/// Gradients of a normalization with a weight (and optional bias).
#[derive(Debug, Clone)]
pub struct NormGrads<B: Backend> {
    /// Gradient of the input, `[..., d]`, dtype of `x`.
    pub grad_input: FloatTensor<B>,
    /// Gradient of the weight, `[d]`, dtype of the weight (accumulated in f32).
    pub grad_weight: FloatTensor<B>,
    /// Gradient of the bias, `[d]`, when the norm has one.
    pub grad_bias: Option<FloatTensor<B>>,
}

/// Per-row output of the fused cross entropy (see [`CrossEntropyOptions`] for the math).
#[derive(Debug, Clone)]
pub struct CrossEntropyRows<B: Backend> {
    /// Per-row loss `loss_i = ce_i + zl_i`, `[N]`, f32 (0 on ignored rows).
    pub loss: FloatTensor<B>,
    /// Per-row z-loss `zl_i = λ lse_i²`, `[N]`, f32, when `return_z_loss`.
    pub z_loss: Option<FloatTensor<B>>,
    /// `∂(Σ_i s_i loss_i)/∂logits` for the given `grad_scale` `s` (`[1]` or `[N]`),
    /// `[N, V]`, dtype of the logits, when a `grad_scale` was given.
    pub grad_logits: Option<FloatTensor<B>>,
}

/// What a loss over integer targets needs of them before its rows run
/// ([`FusedOps::fused_target_stats`]); each `[1]`, f32. A row *counts* when its target is
/// in `[0, V)` and is not `ignore_index`.
#[derive(Debug, Clone)]
pub struct TargetStats<B: Backend> {
    /// `1 / Σ w[y_i]` over the counted rows (their number without class weights), 0 when
    /// none counts: a mean's scale.
    pub weight_scale: FloatTensor<B>,
    /// `1 / n` for the `n` counted rows, 0 when none counts: the z-loss mean's scale.
    pub row_scale: FloatTensor<B>,
    /// How many targets are neither `ignore_index` nor in `[0, V)` (exact below 2²⁴ rows).
    pub out_of_range: FloatTensor<B>,
}

impl<B: Backend> TargetStats<B> {
    /// The same statistics as another backend's tensors.
    pub(crate) fn map<C: Backend>(
        self,
        f: impl Fn(FloatTensor<B>) -> FloatTensor<C>,
    ) -> TargetStats<C> {
        TargetStats {
            weight_scale: f(self.weight_scale),
            row_scale: f(self.row_scale),
            out_of_range: f(self.out_of_range),
        }
    }
}

/// Output of [`FusedOps::fused_attention`].
#[derive(Debug, Clone)]
pub struct AttentionOutput<B: Backend> {
    /// `[batch, q_heads, seq, head_dim]`, q's dtype.
    pub output: FloatTensor<B>,
    /// `lse_i = log Σ_j exp(s_ij)` per query, `[batch, q_heads, seq]` f32, when the flash
    /// kernels ran: their backward needs it, with the output. `f32::MAX` for a query that
    /// sees no key. `None` from the blockwise path, whose backward recomputes everything.
    pub lse: Option<FloatTensor<B>>,
}

/// Gradients of [`FusedOps::fused_attention`], shaped and typed like its inputs.
#[derive(Debug, Clone)]
pub struct AttentionGrads<B: Backend> {
    /// `[batch, q_heads, seq, head_dim]`.
    pub grad_q: FloatTensor<B>,
    /// `[batch, kv_heads, seq, head_dim]` (summed over the query heads sharing each).
    pub grad_k: FloatTensor<B>,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub grad_v: FloatTensor<B>,
}

/// Output of the fused linear cross entropy.
#[derive(Debug, Clone)]
pub struct LinearCrossEntropyOutput<B: Backend> {
    /// The reduced loss, `[1]` (mean, sum) or `[N]` (none), f32.
    pub loss: FloatTensor<B>,
    /// The z-loss part of `loss`, reduced the same way, when `return_z_loss`.
    pub z_loss: Option<FloatTensor<B>>,
    /// `∂loss/∂x`, `[N, H]`, dtype of `x` (for an upstream gradient of 1; per row factors
    /// of 1 under reduction none), when gradients were asked for.
    pub grad_x: Option<FloatTensor<B>>,
    /// `∂loss/∂weight`, `[V, H]`, dtype of the weight (accumulated in f32).
    pub grad_weight: Option<FloatTensor<B>>,
    /// `∂loss/∂bias`, `[V]`, dtype of the bias (accumulated in f32), when there is a bias.
    pub grad_bias: Option<FloatTensor<B>>,
    /// The gradients of the LM head's LoRA adapter, when it has one
    /// ([`FusedOps::fused_lora_linear_cross_entropy`]).
    pub adapter: Option<LoraHeadGrads<B>>,
}

/// The fused primitives. See the module docs for the shape conventions.
///
/// Validation runs once, at the API entry (the [functional API](crate::functional), the
/// [`nn`](crate::nn) modules, the [optimizers](crate::optim) and `Liger<B>`'s overrides);
/// the primitives assume validated input, as Burn's `FloatTensorOps` do, and neither the
/// default bodies nor the backends' implementations (CubeCL, `Fusion<B>`, `Autodiff<B>`,
/// `Liger<B>`) check it again. Bad input handed to a primitive directly is the caller's
/// error. The entry asks [`fused_dtype_supported`](FusedOps::fused_dtype_supported)
/// which dtypes the backend's primitives take.
pub trait FusedOps: Backend {
    /// Whether the fused primitives take float tensors of `dtype`. The default bodies
    /// compose stock Burn ops and take every float dtype; CubeCL backends (and `Fusion` of
    /// them) take the dtypes their kernels read ([`validate::kernel_dtype`]: f32, f16,
    /// bf16, flex32), which every backend takes. The API entry rejects any other dtype with
    /// an error naming the op, the dtype and the shape. The primitives that send dtypes
    /// their kernels do not read to a composition themselves (matrix products, attention,
    /// the AdamW step, divergences) take every float dtype whatever this says.
    fn fused_dtype_supported(dtype: DType) -> bool {
        dtype.is_float()
    }

    /// Submits the work queued for `device` so far (without waiting for the device to run
    /// it). CubeCL 0.10 hands a device's queued tasks (allocations, launches) to its device
    /// thread 32 at a time or at the next blocking call, and Burn's fusion stream queues
    /// operations the same way, so a lone fused kernel may wait for unrelated work or the
    /// next synchronization before it starts; a training step's stream of operations keeps
    /// those queues moving. Submitting is a blocking hand-off to those threads (not a wait
    /// for the device), so calling it after every op costs host time: the checked cross
    /// entropy calls it before the read it makes anyway, `liger bench
    /// --submit-each-iteration on` after each timed iteration. Default: nothing (the
    /// backend runs operations as they come).
    fn submit_queued(_device: &Self::Device) {}

    /// Hands the work queued for `device` so far to the device's threads without waiting
    /// for them: the non-blocking counterpart of [`FusedOps::submit_queued`], which the
    /// fusion stream's fused operations call as they are queued and run, so a fused kernel
    /// does not wait for 31 more tasks or a synchronization (see `submit_queued`). The
    /// host pays a few atomic writes; the next task queued may wait for the device thread
    /// to take the batch. Default: nothing.
    fn hand_off_queued(_device: &Self::Device) {}

    /// Starts reading `tensor` (any shape; meant for a few values, such as a count a
    /// check reads) back to the host: its copy is queued behind the work queued so far
    /// and ahead of anything queued later, and [`PendingRead::wait`] waits for that copy
    /// alone. A check that starts its read before queuing the work it guards, and waits
    /// after, lets the device run that work while the host waits. Default: the read is
    /// made here, in full (Burn's reads wait for everything queued).
    fn start_read(tensor: FloatTensor<Self>) -> PendingRead {
        let data = burn::tensor::Tensor::<Self, 1>::from_primitive(
            burn::tensor::TensorPrimitive::Float(tensor),
        )
        .into_data();
        PendingRead::ready(data)
    }

    /// RMSNorm over the last dimension: `x * rstd * (offset + weight)`.
    ///
    /// `x: [..., d]`, `weight: [d]`.
    fn fused_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> RmsNormOutput<Self> {
        compose::rms_norm::forward::<Self>(x, weight, options)
    }

    /// Backward of [`fused_rms_norm`](FusedOps::fused_rms_norm).
    ///
    /// `grad_output, x: [..., d]`, `weight: [d]`, `rstd: [..., 1]`.
    fn fused_rms_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> NormGrads<Self> {
        compose::rms_norm::backward::<Self>(grad_output, x, weight, rstd, options)
    }

    /// Residual add then RMSNorm in one pass: `sum = x + residual`, `output = rms_norm(sum)`.
    ///
    /// `x, residual: [..., d]`, `weight: [d]`. The backward is
    /// [`fused_rms_norm_backward`](FusedOps::fused_rms_norm_backward) on `sum`.
    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: RmsNormOptions,
    ) -> AddRmsNormOutput<Self> {
        compose::rms_norm::add_forward::<Self>(x, residual, weight, options)
    }

    /// LayerNorm over the last dimension: `(x - mean) * rstd * gamma + beta`.
    ///
    /// `x: [..., d]`, `gamma: [d]`, `beta: [d]`.
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> LayerNormOutput<Self> {
        compose::layer_norm::forward::<Self>(x, gamma, beta, eps)
    }

    /// Backward of [`fused_layer_norm`](FusedOps::fused_layer_norm).
    ///
    /// `grad_output, x: [..., d]`, `gamma: [d]`, `mean, rstd: [..., 1]`.
    fn fused_layer_norm_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        has_bias: bool,
    ) -> NormGrads<Self> {
        compose::layer_norm::backward::<Self>(grad_output, x, gamma, mean, rstd, has_bias)
    }

    /// Softmax over the last dimension. `x: [..., d]`.
    fn fused_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        compose::softmax::softmax::<Self>(x)
    }

    /// Backward of [`fused_softmax`](FusedOps::fused_softmax) from its output:
    /// `y * (grad - sum(grad * y))`.
    fn fused_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::softmax::softmax_backward::<Self>(grad_output, output)
    }

    /// Log-softmax over the last dimension. `x: [..., d]`.
    fn fused_log_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        compose::softmax::log_softmax::<Self>(x)
    }

    /// Backward of [`fused_log_softmax`](FusedOps::fused_log_softmax) from its output:
    /// `grad - exp(y) * sum(grad)`.
    fn fused_log_softmax_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::softmax::log_softmax_backward::<Self>(grad_output, output)
    }

    /// Gated linear unit `act(gate) * up` (SwiGLU for [`GluActivation::Silu`], GeGLU for
    /// [`GluActivation::GeluTanh`]), computed in f32 and rounded once to the input dtype.
    ///
    /// `gate, up: [..., d_ff]` (any rank), same shape and dtype; returns `[..., d_ff]`.
    fn fused_glu(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> FloatTensor<Self> {
        compose::glu::forward::<Self>(gate, up, activation)
    }

    /// Backward of [`fused_glu`](FusedOps::fused_glu), recomputing the activation from
    /// `gate`: `grad_gate = grad * up * act'(gate)`, `grad_up = grad * act(gate)`.
    ///
    /// `grad_output, gate, up: [..., d_ff]`, same shape and dtype.
    fn fused_glu_backward(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> GluGrads<Self> {
        compose::glu::backward::<Self>(grad_output, gate, up, activation)
    }

    /// [`fused_glu_backward`](FusedOps::fused_glu_backward) and the unit
    /// `act(gate) · up` the forward computed, `(grads, unit)`: for the gated MLP's down
    /// projection, whose weight gradient reads the unit. The default runs the two ops;
    /// the CubeCL backends compute the unit in the backward's own pass over `gate` and
    /// `up` (the same values: the same f32 math, rounded once to the dtype).
    ///
    /// `grad_output, gate, up: [..., d_ff]`, same shape and dtype; the unit is too.
    fn fused_glu_backward_with_unit(
        grad_output: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        activation: GluActivation,
    ) -> (GluGrads<Self>, FloatTensor<Self>) {
        let unit = Self::fused_glu(gate.clone(), up.clone(), activation);
        (
            Self::fused_glu_backward(grad_output, gate, up, activation),
            unit,
        )
    }

    /// The gated MLP's down projection on its gated unit: `(act(gate) * up) · weight`, the
    /// gated unit as [`fused_glu`](FusedOps::fused_glu) computes it (rounded once to the
    /// input dtype), the product as [`fused_matmul`](FusedOps::fused_matmul).
    ///
    /// `gate, up: [..., d_ff]`, same shape and dtype; `weight: [d_ff, d_out]` (Burn's
    /// `Linear` layout, any strides) of that dtype; returns `[..., d_out]`. On
    /// `Autodiff<B>` the node keeps `gate`, `up` and `weight` and recomputes the gated unit
    /// in the backward for the weight's gradient, instead of keeping the `[..., d_ff]`
    /// product that a `Linear` after [`fused_glu`](FusedOps::fused_glu) keeps.
    fn fused_glu_linear(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        activation: GluActivation,
    ) -> FloatTensor<Self> {
        compose::glu::linear::<Self>(gate, up, weight, activation)
    }

    /// Exact GELU, `x * Φ(x) = 0.5 x (1 + erf(x / sqrt(2)))` (Burn's `gelu`). `x`: any shape.
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        compose::activation::gelu::<Self>(x)
    }

    /// Backward of [`fused_gelu`](FusedOps::fused_gelu) from its input, with the exact
    /// derivative: `grad * (Φ(x) + x φ(x))`. `grad_output, x`: same shape and dtype.
    fn fused_gelu_backward(
        grad_output: FloatTensor<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::activation::gelu_backward::<Self>(grad_output, x)
    }

    /// Sigmoid, `1 / (1 + exp(-x))`. `x`: any shape.
    fn fused_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
        compose::activation::sigmoid::<Self>(x)
    }

    /// Backward of [`fused_sigmoid`](FusedOps::fused_sigmoid) from its output `y`:
    /// `grad * y * (1 - y)`. `grad_output, output`: same shape and dtype.
    fn fused_sigmoid_backward(
        grad_output: FloatTensor<Self>,
        output: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::activation::sigmoid_backward::<Self>(grad_output, output)
    }

    /// Embedding lookup (`burn::nn::Embedding`): the rows of `weights` (`[num_embeddings,
    /// d]`) at `indices` (`[batch, seq]`), `[batch, seq, d]`. The default is Burn's own
    /// (`ModuleOps::embedding`); `Autodiff<_>` adds a node whose backward is
    /// [`fused_embedding_backward`](FusedOps::fused_embedding_backward).
    fn fused_embedding(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        <Self as burn::tensor::ops::ModuleOps<Self>>::embedding(weights, indices)
    }

    /// The embedding gradient: `grad_output` (`[batch, seq, d]`) and `indices` (`[batch,
    /// seq]`) → `[num_embeddings, d]`, row `v` the sum of the gradient rows of the positions
    /// holding index `v` (zero where none does), accumulated in f32 and rounded to
    /// `grad_output`'s dtype once. Indices outside `[0, num_embeddings)` contribute nothing
    /// on the fused kernel (Burn's own `select_add` may panic on them).
    fn fused_embedding_backward(
        grad_output: FloatTensor<Self>,
        indices: IntTensor<Self>,
        num_embeddings: usize,
    ) -> FloatTensor<Self> {
        compose::embedding::backward::<Self>(grad_output, indices, num_embeddings)
    }

    /// Rotary position embedding of q and k (one kernel launch for both):
    /// `out = x·cos + rot(x)·sin`, `rot` pairing elements as `layout` says.
    ///
    /// `q: [batch, q_heads, seq, head_dim]`, `k: [batch, kv_heads, seq, head_dim]` (any
    /// strides; grouped-query attention has `kv_heads != q_heads`), `cos, sin: [1 or batch,
    /// seq, head_dim]` of q's dtype, `head_dim` even. Outputs are contiguous, shaped like
    /// the inputs. The tables are constants: no gradient flows into them.
    fn fused_rope(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: RopeLayout,
    ) -> RopeOutput<Self> {
        compose::rope::forward::<Self>(q, k, cos, sin, layout)
    }

    /// Backward of [`fused_rope`](FusedOps::fused_rope), the exact transpose for any
    /// tables: `dx = g·cos - rot(g·sin)` (a rotation by `-θ` for cos/sin tables of angles).
    ///
    /// `grad_q`, `grad_k`: gradients of the rotated q and k, shaped like them; either may
    /// be absent (a one-sided backward rotates only the other, still in one launch). The
    /// returned gradient of q (k) is present exactly when `grad_q` (`grad_k`) is.
    fn fused_rope_backward(
        grad_q: Option<FloatTensor<Self>>,
        grad_k: Option<FloatTensor<Self>>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        layout: RopeLayout,
    ) -> RopeGrads<Self> {
        compose::rope::backward::<Self>(grad_q, grad_k, cos, sin, layout)
    }

    /// Cross entropy of `logits: [N, V]` (f32/f16/bf16) against integer
    /// `targets: [N]`, with optional `class_weight: [V]`; see [`CrossEntropyOptions`] for
    /// the math (`options.reduction` is not applied here: the loss is per row).
    ///
    /// With `grad_scale: Some(s)`, a `[1]` or per-row `[N]` f32 tensor, the gradient
    /// `∂(Σ_i s_i loss_i)/∂logits` is computed in the same pass (`s` lives on the device,
    /// e.g. `1/W` for a mean, so no host sync is needed); the fused kernels write it over
    /// the logits buffer when nothing else holds that buffer. On `Autodiff<B>` the
    /// returned `loss` is tracked: its backward scales that gradient by the incoming
    /// per-row gradient divided by `s` (a no-op, skipping the `[N, V]` pass, when the
    /// incoming gradient is exactly `s` on every row, as under a mean or sum followed by
    /// `backward()`). Class weights get no gradient.
    ///
    /// With `z_loss_scale: Some(s_z)` (a `[1]` f32 tensor, only with a `[1]` `grad_scale`),
    /// the z-loss part of every row's gradient is scaled by `s_z` instead of `s`: a mean
    /// divides the z-loss by the number of non-ignored rows and the rest by `Σ w[y]`
    /// (see [`CrossEntropyOptions`]). The per-row losses are never scaled.
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        grad_scale: Option<FloatTensor<Self>>,
        z_loss_scale: Option<FloatTensor<Self>>,
        options: CrossEntropyOptions,
    ) -> CrossEntropyRows<Self> {
        compose::cross_entropy::forward::<Self>(
            logits,
            targets,
            class_weight,
            grad_scale,
            z_loss_scale,
            options,
        )
    }

    /// Backward of [`fused_cross_entropy`](FusedOps::fused_cross_entropy)'s per-row loss
    /// from the gradient its forward stored: `grad: [N, V]` (computed with the scale
    /// `grad_scale: [1]` or `[N]` f32, `s`), `grad_rows: [N]` the incoming gradient `r` of
    /// each row's loss. Returns `grad_i · r_i / s_i` per row (`0` where `s_i = 0`, whose row
    /// is zero); a row with `r_i = s_i` is returned as it was.
    ///
    /// The default (any backend) reads one flag back to return `grad` untouched when
    /// every row is unchanged, and otherwise multiplies in f32. The fused kernel decides
    /// on the device, row by row, with no host read, and writes over `grad` when nothing
    /// else holds its buffer (then unchanged rows are not even read).
    fn fused_cross_entropy_backward(
        grad: FloatTensor<Self>,
        grad_rows: FloatTensor<Self>,
        grad_scale: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::cross_entropy::backward::<Self>(grad, grad_rows, grad_scale)
    }

    /// The statistics of integer `targets: [N]` a loss over `V` classes needs before its
    /// rows run (see [`TargetStats`]), with optional `class_weight: [V]` (no gradient; any
    /// float dtype): the mean's scales and the count of out-of-range targets, all on the
    /// device, so the caller reads back at most one number (the count, to reject bad
    /// targets). The default composes stock ops; the fused kernel is one launch.
    fn fused_target_stats(
        targets: IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        vocab: usize,
        ignore_index: i64,
    ) -> TargetStats<Self> {
        compose::cross_entropy::target_stats::<Self>(targets, class_weight, vocab, ignore_index)
    }

    /// Linear layer then cross entropy without the `[N, V]` logits: `x: [N, H]`,
    /// `weight: [V, H]` (PyTorch's layout), `bias: [V]`, integer `targets: [N]`,
    /// `class_weight: [V]`; see [`CrossEntropyOptions`] for the math, here applied to
    /// `logits = x weightᵀ + bias` and reduced by `options.reduction`.
    ///
    /// With `compute_grad`, the gradients of the reduced loss (for an upstream gradient
    /// of 1) are computed in the same chunked pass. The default body (every backend) chunks
    /// over rows with `matmul` and [`fused_cross_entropy`](FusedOps::fused_cross_entropy);
    /// see [`compose::linear_cross_entropy`] for the chunk size and the memory it costs
    /// (an f32 `[V, H]` weight-gradient accumulator). On `Autodiff<B>` the loss is tracked
    /// (parents `x`, `weight`, `bias`) and its backward only scales the stored gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        compute_grad: bool,
        options: CrossEntropyOptions,
    ) -> LinearCrossEntropyOutput<Self> {
        compose::linear_cross_entropy::forward::<Self>(
            x,
            weight,
            bias,
            targets,
            class_weight,
            compute_grad,
            options,
        )
    }

    /// Linear layer then a preference loss (DPO, ORPO, CPO, SimPO; see
    /// [`PreferenceOptions`]) without the `[2B·T, V]` logits: `x: [2B, T, H]` the last
    /// hidden states of `B` chosen then `B` rejected sequences, `weight: [V, H]`,
    /// `bias: [V]`, integer `targets: [2B, T]` (`ignore_index` outside the completions),
    /// the reference model's log-probabilities given or computed from its head
    /// ([`ReferenceInput`]).
    ///
    /// With `compute_grad`, the gradients of the loss (for an upstream gradient of 1) are
    /// computed in the same chunked pass. The default body chunks over pairs with
    /// [`fused_matmul`](FusedOps::fused_matmul) and
    /// [`fused_cross_entropy`](FusedOps::fused_cross_entropy) (see
    /// [`compose::fused_linear_preference`]). On `Autodiff<B>` the loss is tracked (parents
    /// `x`, `weight`, `bias`; the reference gets no gradient) and its backward only scales
    /// the stored gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_linear_preference(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: IntTensor<Self>,
        reference: ReferenceInput<Self>,
        compute_grad: bool,
        options: PreferenceOptions,
    ) -> PreferenceOutput<Self> {
        compose::fused_linear_preference::forward::<Self>(
            x,
            weight,
            bias,
            targets,
            reference,
            compute_grad,
            options,
        )
    }

    /// Linear layer then distillation from a frozen teacher (see [`DistillOptions`]) without
    /// the `[N, V]` logits of either head: the student's `x: [N, H]`, `weight: [V, H]`,
    /// `bias: [V]`, the teacher's head ([`TeacherHead`], vocabulary `V_t ≥ V`: a larger
    /// teacher vocabulary pads the student's logits with zeros, as Liger-Kernel), integer
    /// `targets: [N]`.
    ///
    /// With `compute_grad`, the gradients of the loss (upstream gradient 1) are computed
    /// chunk by chunk in the same pass (see [`compose::fused_linear_distill`]). On
    /// `Autodiff<B>` the loss is tracked (parents `x`, `weight`, `bias`; the teacher gets no
    /// gradient) and its backward only scales the stored gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_linear_distill(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        teacher: TeacherHead<Self>,
        targets: IntTensor<Self>,
        compute_grad: bool,
        options: DistillOptions,
    ) -> DistillOutput<Self> {
        compose::fused_linear_distill::forward::<Self>(
            x,
            weight,
            bias,
            teacher,
            targets,
            compute_grad,
            options,
        )
    }

    /// One chunk's rows of [`fused_linear_distill`](FusedOps::fused_linear_distill) from
    /// the two heads' logits: the student's `student: [m, V]` and the teacher's
    /// `teacher: [m, V_t]` (`V_t ≥ V`, same dtype; the student is padded with zero logits up
    /// to `V_t`), integer `targets: [m]`. Per row, the soft loss (`options.divergence`
    /// between `softmax(teacher/τ)` and `softmax(student/τ)`) and the hard loss (cross
    /// entropy of `student` against the target); rows whose target is `ignore_index` get
    /// zeros. The weights of `options` are not applied to the losses.
    ///
    /// With `grad_scale: Some(σ)` (`[1]` f32, on the device), the gradient
    /// `∂(σ Σ_i (w_soft soft_i + w_hard hard_i))/∂student` in the same pass. The default body
    /// composes the fused log-softmax and cross entropy with f32 stock ops (see
    /// [`compose::distill_rows`]); CubeCL backends run one kernel that never holds a
    /// `[m, V]` f32 temporary and writes the gradient over the student's logits when
    /// nothing else holds them.
    fn fused_distill_rows(
        student: FloatTensor<Self>,
        teacher: FloatTensor<Self>,
        targets: IntTensor<Self>,
        grad_scale: Option<FloatTensor<Self>>,
        options: DistillOptions,
    ) -> DistillRows<Self> {
        compose::distill_rows::forward::<Self>(student, teacher, targets, grad_scale, options)
    }

    /// A divergence between two `[N, V]` distributions, elementwise then reduced (see
    /// [`DivergenceOptions`]): `input` (the student, log-probabilities, or probabilities for
    /// the TVD), `target` of the same shape and dtype, optional integer `labels: [N]`
    /// (rows labelled `ignore_index` are skipped).
    ///
    /// With `compute_grad` the gradient of the input is computed in the same pass. On
    /// `Autodiff<B>` the loss is tracked (parent `input`; the target gets no gradient) and
    /// its backward scales the stored gradient by the upstream one (elementwise under no
    /// reduction).
    fn fused_divergence(
        input: FloatTensor<Self>,
        target: FloatTensor<Self>,
        labels: Option<IntTensor<Self>>,
        compute_grad: bool,
        options: DivergenceOptions,
    ) -> DivergenceOutput<Self> {
        compose::divergence::forward::<Self>(input, target, labels, compute_grad, options)
    }

    /// Linear layer then KTO (see [`KtoOptions`]) without the `[B·T, V]` logits:
    /// `x: [B, T, H]`, `weight: [V, H]`, `bias: [V]`, integer `targets: [B, T]`, integer
    /// `labels: [B]` (1 desirable, 0 undesirable: unpaired, in any order), the reference's
    /// log-probabilities ([`ReferenceInput`], `[B]` when given), `kl`: TRL's KL estimate,
    /// `[1]` f32 (0 when absent).
    ///
    /// Chunked over sequences as [`fused_linear_preference`](FusedOps::fused_linear_preference)
    /// (see [`compose::fused_linear_kto`]); on `Autodiff<B>` the loss is tracked (parents
    /// `x`, `weight`, `bias`) and its backward only scales the stored gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_linear_kto(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: IntTensor<Self>,
        labels: IntTensor<Self>,
        reference: ReferenceInput<Self>,
        kl: Option<FloatTensor<Self>>,
        compute_grad: bool,
        options: KtoOptions,
    ) -> KtoOutput<Self> {
        compose::fused_linear_kto::forward::<Self>(
            x,
            weight,
            bias,
            targets,
            labels,
            reference,
            kl,
            compute_grad,
            options,
        )
    }

    /// Linear layer then GRPO (see [`GrpoOptions`]) without the `[B·T, V]` logits:
    /// `x: [B, T, H]`, `weight: [V, H]`, `bias: [V]`, integer `completion_ids: [B, T]` (the
    /// sampled tokens), integer `completion_mask: [B, T]` (1 on completion tokens),
    /// `advantages: [B]` f32, the reference's per-token log-probabilities
    /// ([`ReferenceInput`], `[B, T]` when given), the old policy's `old_logps: [B, T]` f32.
    ///
    /// Chunked over sequences (see [`compose::fused_linear_grpo`]); on `Autodiff<B>` the
    /// loss is tracked (parents `x`, `weight`, `bias`) and its backward only scales the
    /// stored gradients.
    #[allow(clippy::too_many_arguments)]
    fn fused_linear_grpo(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        completion_ids: IntTensor<Self>,
        completion_mask: IntTensor<Self>,
        advantages: FloatTensor<Self>,
        reference: ReferenceInput<Self>,
        old_logps: Option<FloatTensor<Self>>,
        compute_grad: bool,
        options: GrpoOptions,
    ) -> GrpoOutput<Self> {
        compose::fused_linear_grpo::forward::<Self>(
            x,
            weight,
            bias,
            completion_ids,
            completion_mask,
            advantages,
            reference,
            old_logps,
            compute_grad,
            options,
        )
    }

    /// [`fused_linear_cross_entropy`](FusedOps::fused_linear_cross_entropy) with an
    /// optional LoRA adapter on the LM head, computing only the gradients in `wanted`:
    /// `logits = x·weightᵀ + bias + s·(x_a·Aᵀ)·Bᵀ` chunk by chunk (see
    /// [`compose::linear_cross_entropy`]), the adapter's gradients (`A: [r, H]`,
    /// `B: [V, r]`) accumulated in f32 over the chunks from each chunk's logits gradient.
    /// Without an adapter this is the fused linear cross entropy whose frozen weight
    /// (`wanted.weight` false) costs no `[V, H]` gradient.
    ///
    /// `x: [N, H]`, `weight: [V, H]`, `bias: [V]`, `targets: [N]`, `class_weight: [V]`;
    /// gradients for an upstream gradient of 1 (per-row factors of 1 under reduction
    /// none), in the dtypes of their inputs. On `Autodiff<B>` the loss is tracked (parents
    /// `x`, weight, bias, the adapter's input, `A`, `B`) and `wanted` follows which of them
    /// are tracked.
    #[allow(clippy::too_many_arguments)]
    fn fused_lora_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter: Option<LoraHead<Self>>,
        targets: IntTensor<Self>,
        class_weight: Option<FloatTensor<Self>>,
        wanted: LinearCrossEntropyGradsWanted,
        options: CrossEntropyOptions,
    ) -> LinearCrossEntropyOutput<Self> {
        compose::linear_cross_entropy::forward_lora::<Self>(
            x,
            weight,
            bias,
            adapter,
            targets,
            class_weight,
            wanted,
            options,
        )
    }

    /// A linear layer with a LoRA adapter, the base frozen:
    /// `x·weight + bias + s·(x_a·Aᵀ)·Bᵀ` without the merged weight (see
    /// [`lora`](crate::ops::LoraOptions) and [`compose::lora`] for the math and the
    /// precision).
    ///
    /// `x: [..., d_in]`, `weight: [d_in, d_out]` (Burn's `Linear` layout, any strides),
    /// `bias: [d_out]`, all in one float dtype; `adapter_x`: the adapter's input when it is
    /// not `x` (the dropout's output), shaped and typed like `x`; `a: [r, d_in]`,
    /// `b: [d_out, r]` (PEFT's layouts) of one float dtype. Returns the output
    /// `[..., d_out]` in `x`'s dtype and the scaled hidden `[rows, r]` the backward reads.
    /// On `Autodiff<B>` the node's parents are `x`, the adapter input, `A` and `B`; the
    /// weight and bias are constants.
    #[allow(clippy::too_many_arguments)]
    fn fused_lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter_x: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        options: LoraOptions,
    ) -> LoraLinearOutput<Self> {
        compose::lora::forward::<Self>(x, weight, bias, adapter_x, a, b, options)
    }

    /// The two paths of [`fused_lora_linear`](FusedOps::fused_lora_linear) before their
    /// sum, flattened to `[rows, d]`: what a backend that runs the products in one piece
    /// (cuBLASLt on CUDA) hands to the fusion stream, which fuses the sum's casts. Same
    /// inputs; the sum is [`compose::lora::add_adapter`].
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fused_lora_linear_parts(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        adapter_x: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        options: LoraOptions,
    ) -> LoraLinearParts<Self> {
        compose::lora::parts::<Self>(x, weight, bias, adapter_x, a, b, options)
    }

    /// Backward of [`fused_lora_linear`](FusedOps::fused_lora_linear) for the upstream
    /// gradient `grad_output: [..., d_out]`, from the adapter's input (`x` itself when
    /// `separate` is false, else the separate input; the base path's input gradient needs
    /// nothing of `x`), the weight, `A`, `B` and the forward's `hidden`: the gradients
    /// `wanted` asks for (`wanted.x`: through the weight, plus the adapter path when it
    /// reads `x`; `wanted.adapter_x`: the separate input's).
    #[allow(clippy::too_many_arguments)]
    fn fused_lora_linear_backward(
        grad_output: FloatTensor<Self>,
        adapter_input: FloatTensor<Self>,
        separate: bool,
        weight: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        hidden: FloatTensor<Self>,
        options: LoraOptions,
        wanted: LoraLinearGradsWanted,
    ) -> LoraLinearGrads<Self> {
        compose::lora::backward::<Self>(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        )
    }

    /// Matrix product with Burn's `matmul` semantics: `lhs: [..., m, k]` and
    /// `rhs: [..., k, n]` of one rank ≥ 2 and one float dtype, the batch dimensions equal
    /// or 1 (broadcast), any strides (transposed views included); returns
    /// `[...batch, m, n]` in that dtype, contiguous.
    ///
    /// The default is the backend's own `float_matmul`. `CubeBackend` runs cuBLASLt on CUDA
    /// and hipBLASLt on ROCm (f32 accumulation; true f32 for f32, no TF32) where
    /// [`fused_matmul_uses_vendor_library`](FusedOps::fused_matmul_uses_vendor_library)
    /// says so; `Liger<B>` routes Burn's `float_matmul` here, and `Autodiff<B>` records a
    /// backward node whose two products are `fused_matmul` of the inner backend.
    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// Both gradients of [`fused_matmul`](FusedOps::fused_matmul) for 2-D operands (a
    /// linear layer's folded rows): `lhs: [m, k]`, `rhs: [k, n]` and `grad: [m, n]` of one
    /// float dtype, any strides; returns `(grad · rhsᵀ, lhsᵀ · grad)`, `[m, k]` and
    /// `[k, n]` in that dtype, contiguous. The default is two `fused_matmul` calls;
    /// `CubeBackend` on CUDA runs both products as one chain on cuBLASLt, under one
    /// ordering against CubeCL's stream instead of one per product. `Autodiff<B>`'s matmul
    /// node calls it when both operands are 2-D and both need a gradient.
    fn fused_matmul_backward(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        compose::matmul_backward::<Self>(lhs, rhs, grad)
    }

    /// `acc + lhs · rhs`: `acc: [m, n]` f32 or of the inputs' dtype, `lhs: [m, k]` and
    /// `rhs: [k, n]` of one float dtype (any strides); returns `[m, n]` in `acc`'s dtype.
    /// For gradients summed over chunks (the chunked losses' weight gradients): the
    /// default rounds the product to the inputs' dtype, casts and adds; `CubeBackend` on
    /// CUDA and ROCm runs one cuBLASLt (hipBLASLt) call that adds the f32-accumulated product to `acc` in f32
    /// inside `acc`'s buffer (`beta = 1`, one rounding to `acc`'s dtype) when nothing else
    /// holds it, so no product-sized temporary exists.
    fn fused_matmul_add(
        acc: FloatTensor<Self>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::matmul_add::<Self>(acc, lhs, rhs)
    }

    /// A linear layer with a bias, `x · weight + bias`: `x: [rows, d_in]`,
    /// `weight: [d_in, d_out]`, `bias: [d_out]`, of one float dtype (any strides); returns
    /// `[rows, d_out]` in that dtype, contiguous. The default is
    /// [`fused_matmul`](FusedOps::fused_matmul) then the bias broadcast and added (the
    /// product rounded to the dtype before the add); `CubeBackend` on CUDA runs one
    /// cuBLASLt call whose epilogue adds the bias to the f32 accumulator (one rounding).
    /// `Autodiff<B>` records a node whose backward is `fused_matmul` for `x` and
    /// [`fused_linear_weight_backward`](FusedOps::fused_linear_weight_backward) for the
    /// weight and the bias.
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        compose::linear::forward::<Self>(x, weight, bias)
    }

    /// The weight's and the bias's gradients of [`fused_linear`](FusedOps::fused_linear)
    /// from `x: [rows, d_in]` and `grad: [rows, d_out]` (one float dtype, any strides):
    /// `(xᵀ · grad, Σ_rows grad)`, `[d_in, d_out]` and `[d_out]` in that dtype, each
    /// accumulated in f32 and rounded once. `CubeBackend` on CUDA runs one cuBLASLt call
    /// whose epilogue reduces `grad` while the product reads it.
    fn fused_linear_weight_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        compose::linear::weight_backward::<Self>(x, grad)
    }

    /// Whether [`fused_matmul`](FusedOps::fused_matmul) of `dtype` tensors on `device`
    /// runs a vendor BLAS library (cuBLASLt, hipBLASLt) instead of the backend's own matmul. The
    /// fusion backend asks, so that everywhere else it keeps Burn's own matmul operation,
    /// which its optimizer can fuse with neighbouring elementwise work.
    fn fused_matmul_uses_vendor_library(device: &Device<Self>, dtype: DType) -> bool {
        let _ = (device, dtype);
        false
    }

    /// Softmax attention without the `[batch, heads, seq, seq]` probabilities kept:
    /// `softmax(mask(q·kᵀ·scale))·v` with f32 softmax statistics.
    ///
    /// Two implementations, chosen by [`AttentionOptions::kernel`] and
    /// [`flash_attention_variant`](FusedOps::flash_attention_variant):
    /// - the flash kernels (CubeCL backends; `liger_cubecl_kernels::attention`): one pass
    ///   over the key blocks the mask leaves, probabilities never leave the chip, `lse`
    ///   returned for the backward;
    /// - the blockwise composition of stock ops (every backend, the default body):
    ///   transformers' eager attention (scores in the input dtype, the masked softmax in
    ///   f32, probabilities cast back before `·v`) in blocks of query rows so that no
    ///   block's scores exceed [`compose::attention::BLOCK_SCORE_ELEMENTS`]; the backward
    ///   recomputes each block's probabilities.
    ///
    /// On `Autodiff<B>` the node keeps q, k, v, the mask, the document ids and, after the
    /// flash kernels, the output and `lse`; never probabilities.
    ///
    /// `q: [batch, q_heads, seq, head_dim]`, `k, v: [batch, kv_heads, seq, head_dim]`
    /// (`q_heads` a multiple of `kv_heads`: grouped-query attention), one float dtype;
    /// `mask: [seq, seq]`, `true` where query `i` must not see key `j`, combined with the
    /// mask `options` describes (causal, sliding window); `document_ids: [batch, seq]` int,
    /// query `i` of a row seeing only keys with its id (packed sequences). A query that sees
    /// no key (possible only through a given mask) gets output 0 and no gradient. Returns
    /// `[batch, q_heads, seq, head_dim]` in q's dtype.
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        document_ids: Option<IntTensor<Self>>,
        options: AttentionOptions,
    ) -> AttentionOutput<Self> {
        if options.kernel == AttentionKernel::Flash {
            panic!(
                "attention: AttentionKernel::Flash asked for, but backend {} has no flash \
                 attention kernel (CubeCL backends have it)",
                core::any::type_name::<Self>()
            );
        }
        compose::attention::forward::<Self>(q, k, v, mask, document_ids, options)
    }

    /// Backward of [`fused_attention`](FusedOps::fused_attention) for the gradient of its
    /// output `grad_output: [batch, q_heads, seq, head_dim]`, from the same inputs and the
    /// forward's result: with its `lse`, the flash backward kernels; without, the blockwise
    /// recomputation (the gradients of k and v accumulated over the blocks in f32).
    #[allow(clippy::too_many_arguments)]
    fn fused_attention_backward(
        grad_output: FloatTensor<Self>,
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        document_ids: Option<IntTensor<Self>>,
        forward: Option<AttentionOutput<Self>>,
        options: AttentionOptions,
    ) -> AttentionGrads<Self> {
        let _ = forward;
        compose::attention::backward::<Self>(grad_output, q, k, v, mask, document_ids, options)
    }

    /// Which flash kernels [`fused_attention`](FusedOps::fused_attention) of inputs of
    /// `dtype` and `head_dim`, without a mask tensor, runs on `device` (they return
    /// `lse`), or `None` for the blockwise composition. The default bodies have none.
    fn flash_attention_variant(
        device: &Self::Device,
        dtype: burn::tensor::DType,
        head_dim: usize,
        options: &AttentionOptions,
    ) -> Option<liger_cubecl_kernels::attention::FlashVariant> {
        let _ = (device, dtype, head_dim, options);
        None
    }

    /// Identity on `x: [...]`. In a backward pass, once the gradient reaches `x` (every op
    /// that read `x` has run its backward, so the activations they kept are dropped), the
    /// device pool's free buffers go back to the device ([`Backend::memory_cleanup`])
    /// before the gradient flows on. A pool that reuses a buffer only for a request of the
    /// same size (CubeCL's persistent pool) would otherwise keep the freed activations
    /// while the weight gradients that follow, of other sizes, take new memory; given back,
    /// the device's allocator (CUDA's stream-ordered pool) serves them from it. Without
    /// autodiff it returns `x` and does nothing.
    fn memory_release_point(x: FloatTensor<Self>) -> FloatTensor<Self> {
        x
    }

    /// One AdamW step of one parameter: Burn 0.21's `AdamW` update (decoupled weight
    /// decay, bias-corrected moments, ε added to the root; see [`compose::adamw`]) in f32,
    /// every buffer read and written once. Not differentiable: call it on the inner
    /// backend's tensors, as optimizers do.
    ///
    /// `param`, `grad`: one shape, any float dtypes (a bf16 gradient may update an f32
    /// master copy). `moments`: shaped like `param`, one dtype; `None` on the first step
    /// (then they start at zero and are created in `options.state_dtype`). Returns the
    /// updated parameter and moments in their input dtypes, and the parameter rounded to
    /// `options.copy_dtype` when that is set. The fused kernel updates the parameter and
    /// the moments in place when nothing else holds their buffers.
    fn fused_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<AdamWMoments<Self>>,
        options: AdamWStepOptions,
    ) -> AdamWStepOutput<Self> {
        compose::adamw::step::<Self>(param, grad, moments, options)
    }
}

/// `[..., m, k] · [..., k, n]` → `[...batch, m, n]`, each batch dimension broadcast (equal,
/// or 1 on one side), for inputs the entry validated ([`validate::matmul`]).
pub(crate) fn matmul_shape(lhs: &Shape, rhs: &Shape) -> Shape {
    let rank = lhs.num_dims();
    let mut out: Vec<usize> = (0..rank - 2)
        .map(|d| if lhs[d] == 1 { rhs[d] } else { lhs[d] })
        .collect();
    out.push(lhs[rank - 2]);
    out.push(rhs[rank - 1]);
    Shape::from(out)
}

/// `[..., d]` → `[..., 1]`: the shape of per-row statistics.
pub(crate) fn row_stat_shape(shape: &Shape) -> Shape {
    let mut dims = shape.to_vec();
    if let Some(last) = dims.last_mut() {
        *last = 1;
    }
    Shape::from(dims)
}

/// Gradients of a gated linear unit.
#[derive(Debug, Clone)]
pub struct GluGrads<B: Backend> {
    /// Gradient of `gate`, `[..., d_ff]`, dtype of `gate`.
    pub grad_gate: FloatTensor<B>,
    /// Gradient of `up`, `[..., d_ff]`, dtype of `up`.
    pub grad_up: FloatTensor<B>,
}

/// Output of the fused RoPE forward.
#[derive(Debug, Clone)]
pub struct RopeOutput<B: Backend> {
    /// Rotated q, `[batch, q_heads, seq, head_dim]`, contiguous.
    pub q: FloatTensor<B>,
    /// Rotated k, `[batch, kv_heads, seq, head_dim]`, contiguous.
    pub k: FloatTensor<B>,
}

/// Gradients of the fused RoPE (the tables get none).
#[derive(Debug, Clone)]
pub struct RopeGrads<B: Backend> {
    /// Gradient of q, present when the gradient of the rotated q was given.
    pub grad_q: Option<FloatTensor<B>>,
    /// Gradient of k, present when the gradient of the rotated k was given.
    pub grad_k: Option<FloatTensor<B>>,
}
