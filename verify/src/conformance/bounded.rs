//! f64 references that carry, next to each value, the largest error an f32-accumulating
//! implementation of the same formula can make there: first-order rounding analysis
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.5), applied op by op.
//!
//! A [`Bounded`] matrix holds values `v` and absolute error bounds `e`. Each op propagates
//! the bounds of its inputs through the absolute values of the others and adds its own
//! rounding:
//! - a product `A·B` over `k` terms accumulated in f32, in any order, errs by at most
//!   `γ_k·|A|·|B|` with `γ_k = k·u₃₂` (the deterministic bound of recursive summation,
//!   first order); the inputs' errors add `|A|·e_B + e_A·|B|`;
//! - a store to a dtype rounds to nearest: `u_dtype·|v|` more, or the subnormal spacing
//!   below the dtype's smallest normal ([`Bounded::store`]);
//! - sums and scalings propagate linearly.
//!
//! The suites compare every device result with the reference under these bounds, and
//! check that wrong outputs (zeros, doubled, transposed, a dropped row) exceed them.

pub use super::bounds::U32;
use super::bounds::{flush, par_ranges, round_to, unit_roundoff};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};

/// Unit roundoff of `dtype` (the conformance suite's, [`super::bounds`]).
pub fn unit(dtype: DType) -> f64 {
    unit_roundoff(dtype)
}

/// `v` rounded to `dtype`, as the device stores it.
pub fn round(dtype: DType, v: f64) -> f64 {
    round_to(dtype, v)
}

/// A row-major `[rows, cols]` matrix of values with absolute error bounds.
#[derive(Clone, Debug)]
pub struct Bounded {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Values.
    pub v: Vec<f64>,
    /// Absolute error bounds.
    pub e: Vec<f64>,
}

impl Bounded {
    /// Exact values (inputs as the device holds them).
    pub fn exact(rows: usize, cols: usize, v: Vec<f64>) -> Self {
        assert_eq!(v.len(), rows * cols);
        Bounded {
            rows,
            cols,
            e: vec![0.0; v.len()],
            v,
        }
    }

    /// The transpose.
    pub fn t(&self) -> Self {
        let mut v = vec![0.0; self.v.len()];
        let mut e = vec![0.0; self.v.len()];
        for i in 0..self.rows {
            for j in 0..self.cols {
                v[j * self.rows + i] = self.v[i * self.cols + j];
                e[j * self.rows + i] = self.e[i * self.cols + j];
            }
        }
        Bounded {
            rows: self.cols,
            cols: self.rows,
            v,
            e,
        }
    }

    /// `self · other`, accumulated in f32 (rows computed in parallel).
    pub fn mm(&self, other: &Bounded) -> Self {
        assert_eq!(self.cols, other.rows, "inner dimensions");
        let (m, k, n) = (self.rows, self.cols, other.cols);
        let gamma = k as f64 * U32;
        let parts = par_ranges(m, |rows| {
            let mut v = vec![0.0; rows.len() * n];
            let mut e = vec![0.0; rows.len() * n];
            for (r, i) in rows.enumerate() {
                for l in 0..k {
                    let (a, ea) = (self.v[i * k + l], self.e[i * k + l]);
                    for j in 0..n {
                        let (b, eb) = (other.v[l * n + j], other.e[l * n + j]);
                        v[r * n + j] += a * b;
                        e[r * n + j] += a.abs() * eb + ea * b.abs() + gamma * (a * b).abs();
                    }
                }
            }
            (v, e)
        });
        let (v, e) = parts
            .into_iter()
            .fold((vec![], vec![]), |(mut v, mut e), p| {
                v.extend(p.0);
                e.extend(p.1);
                (v, e)
            });
        Bounded {
            rows: m,
            cols: n,
            v,
            e,
        }
    }

    /// `self · s` (one f32 rounding).
    pub fn scale(&self, s: f64) -> Self {
        Bounded {
            rows: self.rows,
            cols: self.cols,
            v: self.v.iter().map(|x| x * s).collect(),
            e: self
                .v
                .iter()
                .zip(&self.e)
                .map(|(x, e)| e * s.abs() + U32 * (x * s).abs())
                .collect(),
        }
    }

    /// `self + other` (one rounding to `dtype`).
    pub fn add(&self, other: &Bounded, dtype: DType) -> Self {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols));
        let v: Vec<f64> = self.v.iter().zip(&other.v).map(|(a, b)| a + b).collect();
        let e = self
            .e
            .iter()
            .zip(&other.e)
            .zip(&v)
            .map(|((a, b), s)| a + b + unit(dtype) * s.abs())
            .collect();
        Bounded {
            rows: self.rows,
            cols: self.cols,
            v,
            e,
        }
    }

    /// `self + row` broadcast over the rows (one rounding to `dtype`).
    pub fn add_row(&self, row: &[f64], dtype: DType) -> Self {
        let r = Bounded::exact(
            self.rows,
            self.cols,
            (0..self.rows).flat_map(|_| row.iter().copied()).collect(),
        );
        self.add(&r, dtype)
    }

    /// Stored to `dtype`: one more rounding, and below the dtype's smallest normal the
    /// subnormal spacing or a flush to zero (`conformance::bounds::flush`); nothing for f32
    /// results of f32 ops, whose rounding the op already counted.
    pub fn store(&self, dtype: DType) -> Self {
        if matches!(dtype, DType::F32 | DType::F64) {
            return self.clone();
        }
        Bounded {
            rows: self.rows,
            cols: self.cols,
            v: self.v.clone(),
            e: self
                .e
                .iter()
                .zip(&self.v)
                .map(|(e, v)| e + unit(dtype) * v.abs() + flush(dtype, *v))
                .collect(),
        }
    }

    /// The conformance suite's form of this reference: tensor `tensor`, viewed as `[rows,
    /// cols]`.
    pub fn expected(&self, tensor: &'static str) -> super::Expected {
        super::Expected::new(tensor, self.v.clone(), self.e.clone(), self.rows)
    }

    /// Rows `r0..r1`.
    pub fn rows_range(&self, r0: usize, r1: usize) -> Self {
        Bounded {
            rows: r1 - r0,
            cols: self.cols,
            v: self.v[r0 * self.cols..r1 * self.cols].to_vec(),
            e: self.e[r0 * self.cols..r1 * self.cols].to_vec(),
        }
    }

    /// Checks `actual` against the values within the bounds (scaled by `slack`: 1 for a
    /// result of the modelled computation). Returns the worst `|a − v| / e` and a failure
    /// message naming `what` when an element is outside.
    pub fn check(&self, what: &str, actual: &[f64], slack: f64) -> Result<f64, String> {
        if actual.len() != self.v.len() {
            return Err(format!(
                "{what}: {} values, expected {}",
                actual.len(),
                self.v.len()
            ));
        }
        let mut worst: f64 = 0.0;
        let mut first = None;
        for (i, ((a, v), e)) in actual.iter().zip(&self.v).zip(&self.e).enumerate() {
            let err = if a.is_finite() {
                (a - v).abs()
            } else {
                f64::INFINITY
            };
            let allowed = slack * e;
            let used = if err == 0.0 { 0.0 } else { err / allowed };
            worst = worst.max(used);
            if (err.is_nan() || err > allowed) && first.is_none() {
                first = Some(format!(
                    "{what}[{i}] = {a}, reference {v}, error {err:.3e} > bound {allowed:.3e}"
                ));
            }
        }
        match first {
            Some(m) => Err(m),
            None => Ok(worst),
        }
    }
}

/// Wrong versions of a `[rows, cols]` result that a check must reject: all zeros, doubled,
/// the last row zeroed (a dropped row or chunk), rows shifted by one, and (square or not)
/// the transposed buffer read with the same shape.
pub fn wrong_outputs(v: &[f64], rows: usize, cols: usize) -> Vec<(&'static str, Vec<f64>)> {
    let mut out = vec![
        ("zeros", vec![0.0; v.len()]),
        ("doubled", v.iter().map(|x| 2.0 * x).collect()),
    ];
    if rows > 1 {
        let mut dropped = v.to_vec();
        for x in &mut dropped[(rows - 1) * cols..] {
            *x = 0.0;
        }
        out.push(("last row dropped", dropped));
        let mut shifted = v.to_vec();
        shifted.rotate_right(cols);
        out.push(("rows shifted", shifted));
    }
    if rows > 1 && cols > 1 {
        let mut t = vec![0.0; v.len()];
        for i in 0..rows {
            for j in 0..cols {
                t[j * rows + i] = v[i * cols + j];
            }
        }
        out.push(("transposed buffer", t));
    }
    out
}

/// Checks `actual` against `reference` within its bounds, then that every wrong version of
/// it ([`wrong_outputs`]) that the bounds can tell apart is refused, and that there is at
/// least one; failures are appended to `failures`, naming `what`.
pub fn check_with_rejection(
    failures: &mut Vec<String>,
    what: &str,
    reference: &Bounded,
    actual: &[f64],
) {
    if let Err(e) = reference.check(what, actual, 1.0) {
        failures.push(e);
        return;
    }
    let mut tested = 0;
    for (how, wrong) in wrong_outputs(actual, reference.rows, reference.cols) {
        // A wrong version that changes only elements the bounds cannot tell from zero
        // (e.g. the last row of a one-row product whose factor is tiny, or a row zero
        // anyway) is not a wrong output for these bounds.
        let distinguishable = wrong
            .iter()
            .zip(actual)
            .zip(reference.v.iter().zip(&reference.e))
            .any(|((w, a), (v, e))| w != a && v.abs() > 2.0 * e);
        if !distinguishable {
            continue;
        }
        tested += 1;
        if reference.check(what, &wrong, 1.0).is_ok() {
            failures.push(format!("{what}: the wrong output `{how}` passes the bound"));
        }
    }
    // Every element within its bound of zero: the comparison could not fail, so the case
    // proves nothing.
    if tested == 0 {
        failures.push(format!(
            "{what}: no wrong output differs from the result beyond the bounds (a reference \
             indistinguishable from zero)"
        ));
    }
}

/// A tensor of `shape` from f64 values, stored in `dtype`.
pub fn tensor<B: Backend, const D: usize>(
    v: &[f64],
    shape: [usize; D],
    dtype: DType,
    device: &B::Device,
) -> Tensor<B, D> {
    let f: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    Tensor::<B, D>::from_data(TensorData::new(f, shape), (device, dtype))
}

/// `v` as the device holds it in `dtype`, as f64.
pub fn rounded(v: &[f32], dtype: DType) -> Vec<f64> {
    v.iter().map(|x| round(dtype, *x as f64)).collect()
}
