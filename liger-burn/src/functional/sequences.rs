//! The target checks shared by the sequence losses (preference, KTO, GRPO): queued next to
//! the loss, read back once it is queued (the device computes while the host waits).

use crate::ops::FusedOps;
use burn::tensor::{Int, Tensor};

/// `[min target, max target, fewest non-ignored positions, the sequence with them]` of
/// `targets: [S, T]` (targets equal to `ignore_index` left out of the min and max, 0 when
/// every position is ignored), on the device.
pub(crate) fn sequence_stats<B: FusedOps>(
    targets: &Tensor<B, 2, Int>,
    ignore_index: i64,
) -> Tensor<B, 1, Int> {
    let [s, _] = targets.dims();
    let ignored = targets.clone().equal_elem(ignore_index);
    let kept = targets.clone().mask_fill(ignored.clone(), 0);
    let counts = ignored.bool_not().int().sum_dim(1).reshape([s]);
    Tensor::cat(
        vec![
            kept.clone().min().reshape([1]),
            kept.max().reshape([1]),
            counts.clone().min().reshape([1]),
            counts.argmin(0).reshape([1]),
        ],
        0,
    )
}

/// Panics naming `op` when a target lies outside `[0, V)` without being `ignore_index`, or
/// when a sequence has no position left to score (an empty completion: its mean
/// log-probability would be 0/0 and its sum a constant 0), from [`sequence_stats`]. One
/// read of four integers.
pub(crate) fn check_sequences<B: FusedOps>(
    op: &str,
    name: &str,
    stats: Tensor<B, 1, Int>,
    vocab: usize,
    ignore_index: i64,
    shape: [usize; 2],
) {
    let v: Vec<i64> = stats.into_data().iter::<i64>().collect();
    let (min, max, fewest, which) = (v[0], v[1], v[2], v[3]);
    if fewest == 0 {
        panic!(
            "{op}: sequence {which} of {name} {shape:?} has no position whose target is not ignore_index {ignore_index}: an empty completion (every completion needs at least one scored token)"
        );
    }
    if min < 0 || max >= vocab as i64 {
        let bad = if min < 0 { min } else { max };
        panic!(
            "{op}: target {bad} in {name} {shape:?} is out of range [0, {vocab}) (and is not ignore_index {ignore_index})"
        );
    }
}
