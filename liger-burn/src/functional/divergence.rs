//! [`divergence`] and its Liger-Kernel-named forms [`kl_div`], [`jsd`], [`tvd`]: divergences
//! between two `[N, V]` distributions.

use super::{prim, wrap};
use crate::ops::{Divergence, DivergenceOptions, DivergenceReduction, FusedOps, validate};
use burn::tensor::{Int, Tensor};

/// A divergence between two `[N, V]` distributions (see
/// [`DivergenceOptions`](crate::ops::DivergenceOptions) for each formula), reduced:
///
/// - `input`: `[N, V]`, the student (log-probabilities; probabilities for the TVD); the
///   gradient reaches it, computed in the forward pass
/// - `target`: `[N, V]`, the teacher, same dtype; no gradient
/// - `labels`: `[N]`, optional; rows labelled `options.ignore_index` are skipped (and left
///   out of the mean's row count)
/// - returns `[1]`, or `[N, V]` under [`DivergenceReduction::None`], f32
pub fn divergence<B: FusedOps>(
    input: Tensor<B, 2>,
    target: Tensor<B, 2>,
    labels: Option<Tensor<B, 1, Int>>,
    options: DivergenceOptions,
) -> Tensor<B, 1> {
    validate::check(validate::divergence(
        "divergence",
        &(input.shape(), input.dtype()),
        &(target.shape(), target.dtype()),
        labels.as_ref().map(|l| (l.shape(), l.dtype())).as_ref(),
        &options,
    ));
    let [n, v] = input.dims();
    let compute_grad = input.is_require_grad();
    let out = B::fused_divergence(
        prim(input),
        prim(target.detach()),
        labels.map(|l| l.into_primitive()),
        compute_grad,
        options,
    );
    match options.reduction {
        DivergenceReduction::None => wrap::<B, 2>(out.loss).reshape([n * v]),
        _ => wrap(out.loss),
    }
}

/// PyTorch's `F.kl_div(input, target, reduction, log_target)` (Liger-Kernel's
/// `LigerKLDIVLoss`): `input` log-probabilities `[N, V]`, `target` probabilities (or
/// log-probabilities with `log_target`). Under [`DivergenceReduction::None`] the result is
/// the `[N·V]` elementwise values.
pub fn kl_div<B: FusedOps>(
    input: Tensor<B, 2>,
    target: Tensor<B, 2>,
    reduction: DivergenceReduction,
    log_target: bool,
) -> Tensor<B, 1> {
    let options = DivergenceOptions::new(Divergence::ForwardKl)
        .with_reduction(reduction)
        .with_log_target(log_target);
    divergence(input, target, None, options)
}

/// Liger-Kernel's `LigerJSD`: the generalized JSD of log-probabilities `input` (student)
/// and `target` (teacher), `[N, V]`, summed and divided by the rows whose label is not
/// `ignore_index` (all rows without labels), `[1]`.
pub fn jsd<B: FusedOps>(
    input: Tensor<B, 2>,
    target: Tensor<B, 2>,
    labels: Option<Tensor<B, 1, Int>>,
    beta: f64,
    ignore_index: i64,
) -> Tensor<B, 1> {
    let options = DivergenceOptions::new(Divergence::Jsd { beta }).with_ignore_index(ignore_index);
    divergence(input, target, labels, options)
}

/// Liger-Kernel's `LigerTVDLoss`: `½ Σ |p − q|` of probabilities `p` (the input) and `q`,
/// `[N, V]`, reduced (`[N·V]` under [`DivergenceReduction::None`]).
pub fn tvd<B: FusedOps>(
    p: Tensor<B, 2>,
    q: Tensor<B, 2>,
    labels: Option<Tensor<B, 1, Int>>,
    reduction: DivergenceReduction,
    ignore_index: i64,
) -> Tensor<B, 1> {
    let options = DivergenceOptions::new(Divergence::Tvd)
        .with_reduction(reduction)
        .with_ignore_index(ignore_index);
    divergence(p, q, labels, options)
}
