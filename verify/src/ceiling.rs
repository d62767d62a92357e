//! The measured bandwidth ceilings: an elementwise `x + 1` over a large tensor, which
//! reads it once and writes it once, and `x + y`, which reads two and writes one (the
//! access pattern of the gated units' forward), timed like the ops in the same run.
//!
//! It runs on the device's backend *without* fusion (`CubeBackend<R, ..>` of the same
//! runtime and device; NdArray as is): one elementwise kernel per op. Through the fusion
//! backend consecutive `x + 1` on one input fuse into one kernel that reads `x` once
//! for several outputs, and dropped outputs are not written, so the bytes per
//! iteration would not be the bytes counted.

use crate::measure::{self, Samples, Timing};
use burn::tensor::{DType, Distribution, Tensor, backend::Backend};

/// What to copy.
#[derive(Clone, Copy, Debug)]
pub struct CopySpec {
    /// Element type.
    pub dtype: DType,
    /// Bytes per element of `dtype`.
    pub elem_size: usize,
    /// Requested tensor size in bytes (each input and the output).
    pub bytes: u64,
    /// Inputs read: 1 (`x + 1`) or 2 (`x + y`).
    pub inputs: usize,
    /// Largest single allocation of the device, when known.
    pub max_alloc: Option<u64>,
    /// Iteration counts.
    pub timing: Timing,
}

/// The copy's samples and what it moved.
#[derive(Clone, Debug)]
pub struct CopyResult {
    /// Seconds per iteration.
    pub samples: Samples,
    /// Elements of the tensor.
    pub elems: usize,
    /// Bytes moved per iteration (every input read once, the output written once).
    pub bytes_moved: u64,
}

/// Times `x + 1` (one input) or `x + y` (two) on backend `P`.
pub fn copy<P: Backend>(device: &P::Device, spec: &CopySpec) -> CopyResult {
    let mut bytes = spec.bytes;
    if let Some(max) = spec.max_alloc {
        bytes = bytes.min(max);
    }
    let elems = (bytes as usize / spec.elem_size).max(1);
    let x = Tensor::<P, 1>::random(
        [elems],
        Distribution::Uniform(-1.0, 1.0),
        (device, spec.dtype),
    );
    let y = (spec.inputs > 1).then(|| {
        Tensor::<P, 1>::random(
            [elems],
            Distribution::Uniform(-1.0, 1.0),
            (device, spec.dtype),
        )
    });
    let sync = || P::sync(device).expect("device synchronization failed");
    sync();
    // No fusion on `P`: each op is its own kernel and runs whether or not its output
    // is dropped, so outputs need not be held (and nothing forces a sync per iteration).
    let samples = measure::time(spec.timing, usize::MAX, &sync, &|| {}, |_| match &y {
        Some(y) => drop(x.clone() + y.clone()),
        None => drop(x.clone() + 1.0),
    })
    .wall;
    let inputs = if y.is_some() { 2 } else { 1 };
    CopyResult {
        samples,
        elems,
        bytes_moved: ((inputs + 1) * elems * spec.elem_size) as u64,
    }
}
