//! The error bounds of the conformance suite, derived from the rounding of each dtype, and
//! the comparison of a device result against its reference under them.
//!
//! Every reference returns, next to each expected value `e`, the largest error `b` an
//! implementation of the op's definition can make at that element, and a result `a`
//! passes when it is finite and `|a − e| ≤ b`. The bounds come from this model of what the
//! devices do, never from what a kernel happens to achieve:
//!
//! - **A store to the dtype** rounds to nearest: relative error at most the unit roundoff
//!   `u` ([`unit_roundoff`]: 2⁻⁸ bf16, 2⁻¹¹ f16, 2⁻²⁴ f32). A value below the dtype's
//!   smallest normal ([`min_normal`]) may be flushed to zero (Vulkan flushes subnormals by
//!   default; lavapipe does for f16), so such a store may lose up to that absolute value.
//! - **An f32 operation** (`+ − ×`) has relative error at most [`U32`] = 2⁻²⁴; division
//!   within 2.5 ulp; `exp` within `3 + 2|x|` ulp ([`exp_error`], Vulkan's requirement, the
//!   loosest of the devices here; CUDA's `expf` is within 2); `ln` within 3 ulp or 2⁻²¹
//!   absolute on `[0.5, 2]` ([`ln_error`]). One ulp of a value is at most [`ULP32`] =
//!   2⁻²³ of it (the spacing at the bottom of its binade).
//! - **A sum of `n` terms accumulated in f32**, in any order (sequential, per-unit then
//!   tree, blocked): error at most `min((n − 1)·U32, λ·√n·U32) · Σ|tᵢ|`
//!   ([`Terms::accumulation`]): the deterministic bound of recursive summation, and Higham
//!   and Mary's probabilistic one (SIAM J. Sci. Comput. 41(5), 2019) for rounding errors
//!   that are independent and of mean zero.
//! - **Independent roundings of the terms of a sum** (each term `tᵢ` off by at most
//!   `aᵢ`, independently and with mean zero, as round-to-nearest of unrelated values is):
//!   the sum is off by at most `min(Σaᵢ, λ·‖a‖₂)` ([`Terms::independent`]). The second
//!   form is Hoeffding's inequality: exceeded with probability at most `2·e^(−λ²/2)`
//!   (4e-22 at λ = 10) per element. This is the √N·u bound of a reduction over N rows: the
//!   worst case `u·Σ|tᵢ|` grows like `N` while the sum of random-signed terms grows like
//!   `√N`, so past `N ≈ 1/u²` rows (65536 for bf16) the worst case exceeds the result
//!   itself and no wrong reduction could fail it.
//!
//! [`LAMBDA`] is the only constant chosen rather than derived: it sets the probability
//! above. Everything else follows from the dtype and the formula of each op (see each
//! reference for its own derivation).

use burn::tensor::{DType, bf16, f16};

/// f32's unit roundoff, 2⁻²⁴: the relative error of one f32 operation.
pub const U32: f64 = 1.0 / 16_777_216.0;

/// One f32 ulp relative to the value it is of, at most: 2⁻²³ (a value just above a power
/// of two). Functions specified to `k` ulp (`exp`, `ln`, division) are within `k·ULP32`.
pub const ULP32: f64 = 2.0 * U32;

/// The confidence multiplier of the probabilistic bounds: a sum of independent, zero-mean
/// errors bounded by `aᵢ` exceeds `LAMBDA · ‖a‖₂` with probability at most
/// `2·exp(−LAMBDA²/2)` ≈ 4e-22.
pub const LAMBDA: f64 = 10.0;

/// Unit roundoff `u` of `dtype`: the largest relative error of rounding to nearest.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F64 => 2f64.powi(-53),
        _ => U32,
    }
}

/// The smallest normal number of `dtype`: a store may flush anything smaller to zero.
pub fn min_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-14),
        DType::F64 => 2f64.powi(-1022),
        _ => 2f64.powi(-126),
    }
}

/// The absolute error a store of `value` to `dtype` may make besides its relative
/// rounding: below the smallest normal `m`, a device may flush the value to zero (an
/// error of `|value|` itself) or keep it as a subnormal, whose spacing `2u·m` is coarser
/// than `u|value|` (half of it, `u·m`). The threshold is `2m` because the device's value
/// sits within its own error of the reference's.
pub fn flush(dtype: DType, value: f64) -> f64 {
    let m = min_normal(dtype);
    if value.abs() < 2.0 * m {
        value.abs() + unit_roundoff(dtype) * m
    } else {
        0.0
    }
}

/// `v` rounded to `dtype` to nearest, ties to even, as the device stores it.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => nearest(v, f16::from_f64(v).to_bits(), |b| {
            f16::from_bits(b).to_f64()
        }),
        DType::BF16 => nearest(v, bf16::from_f64(v).to_bits(), |b| {
            bf16::from_bits(b).to_f64()
        }),
        DType::F64 => v,
        _ => v as f32 as f64,
    }
}

/// The 16-bit value nearest to `v` (ties to the even bit pattern) among `guess` and its two
/// neighbours. `half`'s f64 conversions are not correctly rounded: bf16's (and f16's
/// without the F16C instructions) drops the low 32 bits of `v` before rounding, so a
/// value just above a tie rounds down (one f32 in about 9,400 for bf16), and f16's F16C
/// path rounds twice (through f32). One unit either way covers both.
fn nearest(v: f64, guess: u16, value: impl Fn(u16) -> f64) -> f64 {
    let g = value(guess);
    if !g.is_finite() || !v.is_finite() {
        return g;
    }
    let mut best = (guess, (g - v).abs());
    for bits in [guess.wrapping_sub(1), guess.wrapping_add(1)] {
        let c = value(bits);
        // Stepping the bit pattern across zero or out of the finite range is no neighbour.
        if !c.is_finite() || (c != 0.0 && g != 0.0 && c.signum() != g.signum()) {
            continue;
        }
        let d = (c - v).abs();
        if d < best.1 || (d == best.1 && bits & 1 == 0) {
            best = (bits, d);
        }
    }
    value(best.0)
}

/// Relative error of f32 `exp(x)`: `3 + 2|x|` ulp (Vulkan's precision requirement).
pub fn exp_error(x: f64) -> f64 {
    (3.0 + 2.0 * x.abs()) * ULP32
}

/// Absolute error of f32 `ln(y)` for `y > 0`: 3 ulp of the result, and 2⁻²¹ absolute on
/// `[0.5, 2]` (Vulkan's requirement).
pub fn ln_error(y: f64) -> f64 {
    3.0 * ULP32 * y.ln().abs() + 2f64.powi(-21)
}

/// Absolute error of f32 `tanh(x)`: Vulkan inherits it from `(eˣ − e⁻ˣ)/(eˣ + e⁻ˣ)`,
/// whose numerator and denominator each carry the `exp` errors (a relative error of
/// about twice `exp`'s on a ratio of magnitude at most 1) plus the division.
pub fn tanh_error(x: f64) -> f64 {
    2.0 * exp_error(x) + 4.0 * U32
}

/// The magnitudes of the terms of one sum, from which its rounding bounds follow.
#[derive(Clone, Copy, Debug, Default)]
pub struct Terms {
    /// `Σ|tᵢ|`.
    pub l1: f64,
    /// `Σtᵢ²`.
    pub l2_squared: f64,
    /// Terms counted.
    pub n: usize,
}

impl Terms {
    /// Adds a term's magnitude.
    pub fn push(&mut self, t: f64) {
        self.l1 += t.abs();
        self.l2_squared += t * t;
        self.n += 1;
    }

    /// Adds another sum's terms.
    pub fn merge(&mut self, other: &Terms) {
        self.l1 += other.l1;
        self.l2_squared += other.l2_squared;
        self.n += other.n;
    }

    /// The error of the sum when each term is off by at most its own magnitude (these
    /// terms being the error bounds `aᵢ`), independently and with mean zero:
    /// `min(Σaᵢ, λ‖a‖₂)` (see the module docs).
    pub fn independent(&self) -> f64 {
        self.l1.min(LAMBDA * self.l2_squared.sqrt())
    }

    /// The error of accumulating these terms in f32, in any order:
    /// `min((n − 1)·U32, λ·√n·U32) · Σ|tᵢ|` (see the module docs).
    pub fn accumulation(&self) -> f64 {
        let n = self.n.max(1) as f64;
        ((n - 1.0) * U32).min(LAMBDA * n.sqrt() * U32) * self.l1
    }
}

/// f32 accumulation error of a sum of `n` terms whose absolute values sum to `l1`.
pub fn accumulation(n: usize, l1: f64) -> f64 {
    Terms {
        l1,
        l2_squared: 0.0,
        n,
    }
    .accumulation()
}

/// A reference tensor: expected values, the error allowed at each, and its layout.
#[derive(Clone, Debug)]
pub struct Expected {
    /// Which tensor (`output`, `grad_x`, ...).
    pub tensor: &'static str,
    /// The reference values.
    pub values: Vec<f64>,
    /// The largest error an implementation may make at each element.
    pub bounds: Vec<f64>,
    /// Rows of the tensor viewed as `[rows, len / rows]` (1 for a vector reduced over
    /// the rows of the input): what the wrong-output tests shift and drop.
    pub rows: usize,
}

impl Expected {
    /// A tensor with its bounds.
    pub fn new(tensor: &'static str, values: Vec<f64>, bounds: Vec<f64>, rows: usize) -> Self {
        assert_eq!(values.len(), bounds.len(), "{tensor}: one bound per value");
        Expected {
            tensor,
            values,
            bounds,
            rows,
        }
    }

    /// Compares `actual` against these values and bounds.
    pub fn check(&self, actual: &[f64]) -> super::Comparison {
        check(self.tensor, actual, &self.values, &self.bounds)
    }

    /// For comparing one evaluation with another's result `other`, each within its own
    /// bound of these values (`other_bounds` the other's): the other's values, with the
    /// sum of both bounds.
    pub fn against(&self, other: Vec<f64>, other_bounds: &[f64]) -> Expected {
        let bounds = self.bounds.iter().zip(other_bounds).map(|(a, b)| a + b);
        Expected::new(self.tensor, other, bounds.collect(), self.rows)
    }

    /// The wrong result `kind` (one of [`WRONG_RESULTS`]) built from these values, or `None`
    /// where it is not defined for this tensor (permuting a scalar) or leaves its values as
    /// they are. `without_last_rows`: the reference computed without the input's last
    /// rows, where the caller has it (else those rows' values are zeroed, where any of them
    /// is farther from 0 than its bound).
    pub fn wrong_result(
        &self,
        kind: &str,
        without_last_rows: Option<&Expected>,
    ) -> Option<Vec<f64>> {
        let len = self.values.len();
        let rows = self.rows.max(1);
        let cols = len / rows;
        let wrong = match kind {
            "zeros" => Some(vec![0.0; len]),
            "doubled" => Some(self.values.iter().map(|v| 2.0 * v).collect()),
            "last rows dropped" => match without_last_rows {
                Some(w) if w.values != self.values => Some(w.values.clone()),
                _ if rows > 1 => {
                    // Rows whose every value is within its bound of 0 (a masked token's
                    // gradient) hold nothing to drop, like rows whose targets are ignored.
                    let keep = rows - (rows / 10).max(1);
                    let dropped = keep * cols..len;
                    let held = self.values[dropped.clone()]
                        .iter()
                        .zip(&self.bounds[dropped.clone()])
                        .any(|(v, b)| v.abs() > *b);
                    held.then(|| {
                        let mut v = self.values.clone();
                        v[dropped].iter_mut().for_each(|x| *x = 0.0);
                        v
                    })
                }
                _ => None,
            },
            "transposed" => {
                if len < 2 {
                    None
                } else if rows > 1 && cols > 1 {
                    Some(
                        (0..len)
                            .map(|k| self.values[(k % rows) * cols + k / rows])
                            .collect(),
                    )
                } else {
                    Some(self.values.iter().rev().copied().collect())
                }
            }
            "shifted" => {
                if len < 2 {
                    None
                } else {
                    let step = if rows > 1 { cols } else { 1 };
                    Some(
                        (0..len)
                            .map(|k| self.values[(k + len - step) % len])
                            .collect(),
                    )
                }
            }
            "ones for zeros" => self
                .values
                .iter()
                .all(|v| *v == 0.0)
                .then(|| vec![1.0; len]),
            other => unreachable!("{other} is not a wrong result"),
        };
        wrong.filter(|w| *w != self.values)
    }

    /// The wrong results ([`WRONG_RESULTS`]) these bounds accept: empty when the
    /// comparison rejects every one.
    pub fn accepted_wrong_results(&self) -> Vec<&'static str> {
        WRONG_RESULTS
            .into_iter()
            .filter(|kind| {
                self.wrong_result(kind, None)
                    .is_some_and(|wrong| self.check(&wrong).passed)
            })
            .collect()
    }
}

/// The tensor `name` among a reference's outputs.
pub fn named<'a>(expected: &'a [Expected], name: &str) -> &'a Expected {
    expected
        .iter()
        .find(|e| e.tensor == name)
        .unwrap_or_else(|| panic!("the reference has no {name}"))
}

/// The typical bugs a comparison must reject: all zeros; twice the values; the last tenth
/// of the input's rows missing (zero rows of a per-row tensor, reductions over rows
/// without them); the tensor transposed (its `[rows, cols]` buffer read as
/// `[cols, rows]`; a vector reversed); shifted by one row (one element for a vector);
/// ones where every value is 0 (nothing else differs from an all-zero tensor).
pub const WRONG_RESULTS: [&str; 6] = [
    "zeros",
    "doubled",
    "last rows dropped",
    "transposed",
    "shifted",
    "ones for zeros",
];

/// Compares `actual` with `expected` elementwise: passes when the lengths match and every
/// element is finite and within its bound.
pub fn check(
    tensor: &'static str,
    actual: &[f64],
    expected: &[f64],
    bounds: &[f64],
) -> super::Comparison {
    let mut max_abs: f64 = 0.0;
    let mut max_rel: f64 = 0.0;
    let mut max_used: f64 = 0.0;
    let mut passed = actual.len() == expected.len();
    for ((a, e), b) in actual.iter().zip(expected).zip(bounds) {
        let err = if a.is_finite() {
            (a - e).abs()
        } else {
            f64::INFINITY
        };
        if !(err <= *b) {
            passed = false;
        }
        max_abs = max_abs.max(err);
        if e.abs() > 0.0 {
            max_rel = max_rel.max(err / e.abs());
        }
        let used = if err == 0.0 { 0.0 } else { err / b };
        max_used = max_used.max(used);
    }
    super::Comparison {
        tensor,
        max_abs,
        max_rel,
        max_used,
        len: expected.len(),
        passed,
    }
}

/// Runs `f` over `0..n` split into one contiguous range per available core, in parallel,
/// and returns the parts in order (the f64 references are row-parallel: each row's
/// values depend on that row only).
pub fn par_ranges<T: Send>(n: usize, f: impl Fn(std::ops::Range<usize>) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1)
        .min(n.max(1));
    if threads <= 1 {
        return vec![f(0..n)];
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let range = (t * per).min(n)..((t + 1) * per).min(n);
                let f = &f;
                s.spawn(move || f(range))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reference thread"))
            .collect()
    })
}

/// Fills `out` (`rows` rows of `width`) in parallel, each row by `f(row, &mut out_row)`.
pub fn par_rows<T: Send>(out: &mut [T], width: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if width == 0 {
        return;
    }
    let rows = out.len() / width;
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1)
        .min(rows.max(1));
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (block, chunk) in out.chunks_mut(per * width).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (k, row) in chunk.chunks_mut(width).enumerate() {
                    f(block * per + k, row);
                }
            });
        }
    });
}
