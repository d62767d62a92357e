//! Timing with device synchronization, and percentiles over samples.
//!
//! One sample: synchronize the device, start the clock, run `iters` iterations,
//! synchronize, stop: the sample is the elapsed time over `iters`. Warm-up iterations
//! run first (JIT compilation and autotune stay out of the numbers). Beside it, the host's
//! time inside the iterations (queueing work, without the synchronizations): when it
//! comes near the sample, the host, not the device, sets the pace.
//!
//! Outputs are *held* until their work has been handed to the device: Burn's fusion
//! backend does not write a fused output that is dropped before its kernel runs, so
//! dropping each iteration's outputs at once would time kernels that skip their writes.
//! Holding costs memory, so at most `hold` iterations' outputs are held; when that many
//! are pending the loop submits the queued work (`FusedOps::submit_queued`: the fusion
//! stream runs what it holds and the device thread launches it, without waiting for the
//! device) and releases them, and the device reuses their memory in stream order. The
//! device is never synchronized inside a sample, as the PyTorch anchors time
//! (`scripts/device/anchor_kernels.py` releases its held outputs the same way,
//! `sdpa_anchor.py` holds none): a synchronization would leave the device idle while the
//! host queues the next iterations, a cost per synchronization that neither pays.

use std::time::Instant;

/// Iteration counts of a measurement.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Untimed iterations first.
    pub warmup: usize,
    /// Iterations per sample.
    pub iters: usize,
    /// Samples.
    pub repeats: usize,
}

/// Seconds per iteration, one value per sample.
#[derive(Clone, Debug, Default)]
pub struct Samples(pub Vec<f64>);

/// Per-iteration times of a measurement: wall-clock, and the host's share.
#[derive(Clone, Debug, Default)]
pub struct Timed {
    /// Wall-clock seconds per iteration, one value per sample.
    pub wall: Samples,
    /// Seconds per iteration the host spent inside the iterations (not waiting in a
    /// synchronization), one value per sample.
    pub host: Samples,
}

impl Samples {
    /// The `q`-quantile (0..=1), linearly interpolated between order statistics.
    pub fn quantile(&self, q: f64) -> f64 {
        quantile(&self.0, q)
    }

    /// Median, 20th and 80th percentile, in seconds.
    pub fn p50_20_80(&self) -> [f64; 3] {
        [self.quantile(0.5), self.quantile(0.2), self.quantile(0.8)]
    }
}

/// The `q`-quantile of `values` (NaN when empty).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Times `step` (called with a running iteration index, so inputs can rotate).
///
/// `hold`: how many iterations' outputs may be pending before `submit` (which hands the
/// queued work to the device without waiting for it) and their release. `sync` waits for
/// the device, around each sample.
pub fn time<H>(
    timing: Timing,
    hold: usize,
    sync: &dyn Fn(),
    submit: &dyn Fn(),
    mut step: impl FnMut(usize) -> H,
) -> Timed {
    let hold = hold.max(1);
    let mut held: Vec<H> = Vec::with_capacity(hold.min(timing.iters.max(timing.warmup)));
    let mut index = 0usize;
    // Returns the seconds spent inside `step`.
    let mut run = |n: usize, held: &mut Vec<H>| {
        let mut host = 0.0;
        for _ in 0..n {
            let start = Instant::now();
            held.push(step(index));
            host += start.elapsed().as_secs_f64();
            index += 1;
            if held.len() >= hold {
                submit();
                held.clear();
            }
        }
        host
    };
    run(timing.warmup, &mut held);
    sync();
    held.clear();
    let iters = timing.iters.max(1);
    let mut timed = Timed::default();
    for _ in 0..timing.repeats.max(1) {
        sync();
        let start = Instant::now();
        let host = run(iters, &mut held);
        sync();
        let elapsed = start.elapsed().as_secs_f64();
        held.clear();
        timed.wall.0.push(elapsed / iters as f64);
        timed.host.0.push(host / iters as f64);
    }
    timed
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_interpolate() {
        let v = [4.0, 1.0, 3.0, 2.0, 5.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert!((quantile(&v, 0.2) - 1.8).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
