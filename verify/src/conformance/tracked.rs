//! Values with a running error bound, for the scalar formulas of the post-training
//! losses (pair losses, their derivatives, per-token policy terms): each [`Tracked`] is an
//! f64 value and the largest absolute error an f32 evaluation of the same formula on a
//! device may have there, from the errors of its inputs (first order) and the model of
//! [`super::bounds`] for each f32 operation: `+ − ×` within `U32` relative, division 2.5 ulp,
//! `exp` [`exp_error`], `ln` [`ln_error`].
//!
//! The propagation is first order: an input's error `δ` moves a result by `|f'|·δ`. The
//! inputs' errors here are f32-sized (the sequence log-probabilities carry the rounding of
//! the sums that made them), small against the scale on which these formulas curve, so
//! the second-order remainder is below the bounds' own slack; the one formula that is not
//! smooth (a hinge's step) is handled by [`Tracked::step_below`].

use super::bounds::{U32, ULP32, exp_error, ln_error};

/// A value and its absolute error bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tracked {
    /// The exact value (f64).
    pub v: f64,
    /// The largest error of the device's value.
    pub e: f64,
}

// Methods rather than operator overloads: each call reads as the f32 operation the device
// performs, in its order, which is what the bounds follow.
#[allow(clippy::should_implement_trait)]
impl Tracked {
    /// A value known with error `e`.
    pub fn new(v: f64, e: f64) -> Self {
        Tracked { v, e }
    }

    /// An exact value (a count, a constant stored exactly).
    pub fn exact(v: f64) -> Self {
        Tracked { v, e: 0.0 }
    }

    /// A constant the device holds in f32 (`β`, `ε`, ...): one rounding.
    pub fn constant(v: f64) -> Self {
        Tracked {
            v,
            e: U32 * v.abs(),
        }
    }

    /// `self + o`.
    pub fn add(self, o: Tracked) -> Tracked {
        let v = self.v + o.v;
        Tracked::new(v, self.e + o.e + U32 * v.abs())
    }

    /// `self − o`.
    pub fn sub(self, o: Tracked) -> Tracked {
        self.add(o.neg())
    }

    /// `−self` (exact).
    pub fn neg(self) -> Tracked {
        Tracked::new(-self.v, self.e)
    }

    /// `self · o`.
    pub fn mul(self, o: Tracked) -> Tracked {
        let v = self.v * o.v;
        Tracked::new(
            v,
            self.v.abs() * o.e + o.v.abs() * self.e + self.e * o.e + U32 * v.abs(),
        )
    }

    /// `self · c` for an f64 constant (rounded to f32 on the device).
    pub fn scale(self, c: f64) -> Tracked {
        self.mul(Tracked::constant(c))
    }

    /// `self + c` for an f64 constant.
    pub fn shift(self, c: f64) -> Tracked {
        self.add(Tracked::constant(c))
    }

    /// `self / o` (`o` away from 0 by more than its error).
    pub fn div(self, o: Tracked) -> Tracked {
        let v = self.v / o.v;
        let denominator = (o.v.abs() - o.e).max(f64::MIN_POSITIVE);
        Tracked::new(
            v,
            (self.e + v.abs() * o.e) / denominator + 2.5 * ULP32 * v.abs(),
        )
    }

    /// `eˣ`.
    pub fn exp(self) -> Tracked {
        let v = self.v.exp();
        Tracked::new(
            v,
            v * (self.e * (1.0 + self.e) + exp_error(self.v)) + U32 * v,
        )
    }

    /// `ln x` (`x` above its error).
    pub fn ln(self) -> Tracked {
        let v = self.v.ln();
        Tracked::new(
            v,
            self.e / (self.v - self.e).max(f64::MIN_POSITIVE) + ln_error(self.v),
        )
    }

    /// `|self|`.
    pub fn abs(self) -> Tracked {
        Tracked::new(self.v.abs(), self.e)
    }

    /// `max(self, o)`.
    pub fn max(self, o: Tracked) -> Tracked {
        if self.v >= o.v {
            Tracked::new(self.v, self.e.max(o.e))
        } else {
            Tracked::new(o.v, self.e.max(o.e))
        }
    }

    /// `ln(eᵃ + eᵇ)` as the device computes it: `m + ln(e^(a−m) + e^(b−m))`, `m` the max.
    pub fn log_add_exp(self, o: Tracked) -> Tracked {
        let m = self.max(o);
        m.add(self.sub(m).exp().add(o.sub(m).exp()).ln())
    }

    /// The same value without its error (a term whose error another evaluation counts).
    pub fn exact_part(self) -> Tracked {
        Tracked::exact(self.v)
    }

    /// `ln(1 + x)` as `ln` of the rounded `1 + x` (`x > −1`).
    pub fn ln_1p(self) -> Tracked {
        let y = 1.0 + self.v;
        let v = y.ln();
        let dy = self.e + U32 * y.abs();
        Tracked::new(v, dy / (y - dy).max(f64::MIN_POSITIVE) + ln_error(y))
    }

    /// The sigmoid, as Burn composes it (`exp(−ln(1 + e⁻ˣ))`) or as a kernel computes
    /// `1/(1 + e⁻ˣ)`: its slope on the input's error, and on the value two `exp`, a `ln`
    /// (absolute, hence relative on the final `exp`) and five operations.
    pub fn sigmoid(self) -> Tracked {
        let s = sigmoid(self.v);
        let slope = s * sigmoid(-self.v);
        let inner = 1.0 + (-self.v).exp();
        Tracked::new(
            s,
            slope * self.e + s * (2.0 * exp_error(self.v.abs()) + ln_error(inner) + 5.0 * U32),
        )
    }

    /// `log σ(x) = −(max(−x, 0) + ln(e^(−max) + e^(−x−max)))`: its slope `σ(−x)` on the
    /// input's error, two `exp`, a `ln` of a value in `[1, 2]` and three operations.
    pub fn log_sigmoid(self) -> Tracked {
        let x = self.v;
        let v = log_sigmoid(x);
        let m = (-x).max(0.0);
        let sum = (-m).exp() + (-x - m).exp();
        Tracked::new(
            v,
            sigmoid(-x) * self.e + 2.0 * exp_error(x.abs()) + ln_error(sum) + 4.0 * U32 * (m + 1.0),
        )
    }

    /// `max(self, 0)`.
    pub fn relu(self) -> Tracked {
        Tracked::new(self.v.max(0.0), self.e)
    }

    /// `1` where `self < t`, else `0`, as the device may decide it: where `|self − t|` is
    /// within the error either may come out, an error of 1.
    pub fn step_below(self, t: f64) -> Tracked {
        let v = if self.v < t { 1.0 } else { 0.0 };
        let e = if (self.v - t).abs() <= self.e {
            1.0
        } else {
            0.0
        };
        Tracked::new(v, e)
    }

    /// `self²`.
    pub fn square(self) -> Tracked {
        self.mul(self)
    }
}

/// `1/(1 + e⁻ˣ)` without overflow.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `log σ(x)` without overflow.
pub fn log_sigmoid(x: f64) -> f64 {
    -((-x).max(0.0) + ((-(-x).max(0.0)).exp() + (-x - (-x).max(0.0)).exp()).ln())
}

/// A sum of tracked terms accumulated in f32: the terms' errors independent across terms
/// ([`super::bounds::Terms::independent`]) and the accumulation.
pub fn sum(terms: &[Tracked]) -> Tracked {
    let mut values = super::bounds::Terms::default();
    let mut errors = super::bounds::Terms::default();
    let mut v = 0.0;
    for t in terms {
        v += t.v;
        values.push(t.v);
        errors.push(t.e);
    }
    Tracked::new(
        v,
        errors.independent() + values.accumulation() + U32 * v.abs(),
    )
}
