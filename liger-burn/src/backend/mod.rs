//! [`Liger<B>`]: a backend decorator that routes Burn's own primitives to the fused kernels.
//!
//! `Liger<B>` is a Burn [`Backend`](burn::tensor::backend::Backend) whose primitives (device,
//! tensor types, element types) are exactly those of `B`, so a tensor of `Liger<B>` *is* a tensor
//! of `B` and wrapping costs nothing. Every backend method is forwarded to `B` (including the
//! ones with a default body, so `B`'s specialisations are kept), except:
//!
//! | Burn primitive                         | `Liger<B>` calls                                   |
//! |----------------------------------------|----------------------------------------------------|
//! | `ActivationOps::softmax(x, dim)`       | `B::fused_softmax(x)` if `dim` is the last one, else `B::softmax` |
//! | `ActivationOps::log_softmax(x, dim)`   | `B::fused_log_softmax(x)` if `dim` is the last one, else `B::log_softmax` |
//! | `ModuleOps::layer_norm(x, g, b, eps)`  | `B::fused_layer_norm(x, g, b, eps).output`          |
//! | `ModuleOps::attention(q, k, v, ..)`    | `B::fused_attention(..).output` without mask, bias or softcap (self-attention), else `B::attention` |
//! | `ActivationOps::gelu(x)`               | `B::fused_gelu(x)` (exact erf GELU)                 |
//! | `ActivationOps::gelu_backward(x, g)`   | `B::fused_gelu_backward(g, x)` (exact derivative)   |
//! | `ActivationOps::sigmoid(x)`            | `B::fused_sigmoid(x)`                               |
//! | `ActivationOps::sigmoid_backward(y, g)`| `B::fused_sigmoid_backward(g, y)`                   |
//! | `FloatTensorOps::float_matmul(a, b)`   | `B::fused_matmul(a, b)` (cuBLASLt on CUDA, hipBLASLt on ROCm) |
//! | `ModuleOps::linear(x, w, b)` (`nn::Linear`) | `B::fused_matmul` of `x` folded to `[rows, d_in]`, then `+ b` |
//! | `ModuleOps::linear_x_backward` / `linear_weight_backward` | `B::fused_matmul` over folded rows |
//!
//! (and `Backend::name`, which reports `liger<{B's name}>`). So unmodified user code —
//! `burn::tensor::activation::{softmax, log_softmax}`, `burn::nn::LayerNorm`, the attention
//! modules and `CrossEntropyLoss` that call them over the last dimension — runs the fused
//! kernels. `Liger<B>` also implements [`FusedOps`](crate::ops::FusedOps) (forwarded to `B`) and, when `B` is an
//! autodiff backend, `AutodiffBackend` (with `InnerBackend = Liger<B::InnerBackend>`).
//!
//! The four activation overrides send dtypes the kernels do not read (f64) to `B`'s own
//! primitive and return empty tensors as they are. Burn's default `gelu_backward` differentiates the tanh
//! approximation of GELU (up to about 9e-4 away from the derivative of the exact GELU its
//! `gelu` computes); `Liger<B>` returns the exact derivative `Φ(x) + x φ(x)`, as PyTorch does.
//!
//! # Wrapping order
//!
//! **`Liger<Autodiff<B>>` (recommended).** Burn's `softmax` / `log_softmax` / `layer_norm`
//! primitives reach `Liger` first and are sent to `FusedOps` for `Autodiff<B>`, which records
//! one backward node that calls the fused backward kernel
//! (`fused_softmax_backward`, `fused_log_softmax_backward`, `fused_layer_norm_backward`) of `B`.
//! Stock `burn::nn` modules and `burn::tensor::activation` functions thus get the fused forward
//! *and* the fused backward. Gradients are read as usual; `x.grad(&grads)` is a tensor of
//! `Liger<B>` (the `InnerBackend`), i.e. of `B`'s primitives.
//!
//! ```ignore
//! type Train = liger_burn::Liger<burn::backend::Autodiff<burn::backend::Wgpu>>;
//! ```
//!
//! **`Autodiff<Liger<B>>`: stock Burn modules are *not* fused.** In Burn 0.21,
//! `burn-autodiff` has no backward node for `softmax`, `log_softmax` or `layer_norm`: its
//! `ActivationOps` impl only overrides `gelu`, `relu`, `sigmoid` and `log_sigmoid`, its
//! `ModuleOps` impl has no `layer_norm`, and the names `softmax`/`layer_norm` appear nowhere
//! in `burn-autodiff-0.21.0/src`. `Autodiff` therefore runs the trait's default bodies, which
//! decompose the op into elementary ops (`float_max_dim`, `float_sub`, `float_exp`,
//! `float_sum_dim`, `float_div`, `float_mean_dim`, ...) that are each recorded by `Autodiff`
//! and then forwarded one by one to the inner `Liger<B>`, which just forwards them to `B`.
//! `Liger`'s overrides are never called in that order. `liger_burn`'s own functional API and
//! `nn` modules are still fused in that order, because they call `FusedOps` directly, and
//! `Autodiff<_>` implements `FusedOps` with the fused backward nodes.
//! `gelu` and `sigmoid` are the exception: `burn-autodiff`'s own nodes for them call the
//! inner backend's `gelu`/`gelu_backward` and `sigmoid`/`sigmoid_backward`, so in
//! `Autodiff<Liger<B>>` they run the fused forward and backward kernels too (its sigmoid
//! node recomputes the forward before the backward).
//! Matrix products take `fused_matmul` in both orders: in `Liger<Autodiff<B>>`,
//! `float_matmul` and `linear` reach `Autodiff`'s matmul node, whose two backward products
//! are `B::fused_matmul`; in `Autodiff<Liger<B>>`, Burn's own matmul and linear nodes call
//! the inner `Liger`'s `float_matmul`, `linear`, `linear_x_backward` and
//! `linear_weight_backward`, which are routed too.
//!
//! # Limits
//!
//! - `burn::tensor::module::attention` trains through `Liger<Autodiff<B>>`'s attention node
//!   (burn-autodiff 0.21 has none: its `attention` decomposes into elementary ops that keep
//!   the `[seq, seq]` probabilities). In `Autodiff<Liger<B>>` that decomposition runs first.
//! - Only the primitives above are routed. Ops whose default body composes them *inside*
//!   `B` (e.g. `softmin`, or `B`'s own `attention` fallback, which inlines its own softmax)
//!   still run `B`'s versions.
//! - The `AutodiffBackend` methods gated on burn-backend's `distributed` feature
//!   (`set_distributed_params`, `distributed_params`, `is_distributed`) are not forwarded: this
//!   crate cannot `cfg` on a feature of burn-backend. With that feature on, `Liger<Autodiff<B>>`
//!   uses their default bodies (no distributed gradient aggregation).
//!
//! # Layout
//!
//! - `delegate.rs` — **generated** by `python3 scripts/gen_delegation.py` from the burn-backend
//!   trait definitions: `BackendTypes`, `Backend`, all the `*Ops` traits and `AutodiffBackend`,
//!   one forwarding line per method. To upgrade Burn: bump `BURN_VERSION` in the script, rerun,
//!   review the diff.
//! - `overrides.rs` — the hand-written bodies of the routed methods (the list of routed names
//!   is at the top of the script).
//! - `convert.rs` — field moves for Burn structs generic over the backend
//!   (`TensorPrimitive<B>`, `MaxPool2dWithIndices<B>`, ...), which differ between `Liger<B>`
//!   and `B`.
//! - `fused.rs` — `FusedOps for Liger<B>`.

mod convert;
#[rustfmt::skip]
mod delegate;
mod fused;
pub(crate) mod overrides;

use core::fmt;
use core::marker::PhantomData;

/// Backend decorator: `B` with Burn's `softmax`, `log_softmax`, `layer_norm`, `attention`,
/// `gelu`, `sigmoid`, `float_matmul` and `linear` primitives routed to
/// [`FusedOps`](crate::ops::FusedOps). See the [module docs](self) for which wrapping order
/// to use.
///
/// Clone, Default and Debug are implemented without bounds on `B`.
pub struct Liger<B> {
    _b: PhantomData<B>,
}

impl<B> Clone for Liger<B> {
    fn clone(&self) -> Self {
        Self { _b: PhantomData }
    }
}

impl<B> Default for Liger<B> {
    fn default() -> Self {
        Self { _b: PhantomData }
    }
}

impl<B> fmt::Debug for Liger<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Liger<{}>", core::any::type_name::<B>())
    }
}

/// Compile-time check that both wrapping orders are backends on the real GPU stack
/// (`Wgpu` = `Fusion<CubeBackend<..>>` with Burn's `fusion` feature).
#[cfg(feature = "wgpu")]
#[allow(dead_code)]
const _: () = {
    use burn::backend::{Autodiff, Wgpu};
    use burn::tensor::backend::AutodiffBackend;

    fn autodiff_backend<B: AutodiffBackend + crate::ops::FusedOps>() {}
    fn both_orders() {
        autodiff_backend::<Liger<Autodiff<Wgpu>>>();
        autodiff_backend::<Autodiff<Liger<Wgpu>>>();
    }
};

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::Liger;
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::LayerNormConfig;
    use burn::tensor::activation::{log_softmax, softmax};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData, Tolerance};

    type Ref = NdArray;
    type L = Liger<NdArray>;
    type RefAd = Autodiff<NdArray>;
    type LAd = Liger<Autodiff<NdArray>>;

    fn data() -> TensorData {
        TensorData::from([[1.0f32, -2.0, 0.5, 3.0], [0.0, 0.25, -1.5, 2.0]])
    }

    fn weights() -> TensorData {
        TensorData::from([[0.3f32, -1.0, 2.0, 0.5], [1.5, 0.1, -0.7, 0.2]])
    }

    fn assert_close(a: TensorData, b: TensorData) {
        a.assert_approx_eq::<f32>(&b, Tolerance::rel_abs(1e-5, 1e-6));
    }

    #[test]
    fn add_is_forwarded() {
        let device = Default::default();
        let a = Tensor::<L, 2>::from_data(data(), &device);
        let b = Tensor::<L, 2>::from_data(weights(), &device);
        let expected = Tensor::<Ref, 2>::from_data(data(), &device)
            + Tensor::<Ref, 2>::from_data(weights(), &device);
        assert_close((a + b).into_data(), expected.into_data());
        assert!(
            L::name(&device).starts_with("liger<"),
            "{}",
            L::name(&device)
        );
    }

    /// Gradient of `sum(f(x) * w)` on the given backend.
    fn grad_of<B: burn::tensor::backend::AutodiffBackend>(
        f: fn(Tensor<B, 2>, usize) -> Tensor<B, 2>,
        dim: usize,
    ) -> (TensorData, TensorData) {
        let device = Default::default();
        let x = Tensor::<B, 2>::from_data(data(), &device).require_grad();
        let w = Tensor::<B, 2>::from_data(weights(), &device);
        let y = f(x.clone(), dim);
        let grads = (y.clone() * w).sum().backward();
        (y.into_data(), x.grad(&grads).unwrap().into_data())
    }

    #[test]
    fn softmax_grad_matches_autodiff() {
        for dim in [1, 0] {
            let (y, g) = grad_of::<LAd>(softmax, dim);
            let (y_ref, g_ref) = grad_of::<RefAd>(softmax, dim);
            assert_close(y, y_ref);
            assert_close(g, g_ref);
        }
    }

    #[test]
    fn log_softmax_grad_matches_autodiff() {
        for dim in [1, 0] {
            let (y, g) = grad_of::<LAd>(log_softmax, dim);
            let (y_ref, g_ref) = grad_of::<RefAd>(log_softmax, dim);
            assert_close(y, y_ref);
            assert_close(g, g_ref);
        }
    }

    #[test]
    fn nn_layer_norm_matches() {
        let device = Default::default();
        let ln = LayerNormConfig::new(4).init::<L>(&device);
        let ln_ref = LayerNormConfig::new(4).init::<Ref>(&device);
        let y = ln.forward(Tensor::<L, 2>::from_data(data(), &device));
        let y_ref = ln_ref.forward(Tensor::<Ref, 2>::from_data(data(), &device));
        assert_close(y.into_data(), y_ref.into_data());
    }
}
