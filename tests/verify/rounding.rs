//! The references' rounding to bf16 and f16 is correct rounding: to nearest, ties to even,
//! for every value, including those just above a tie that `half`'s f64 conversion rounds
//! down.

use burn::tensor::{DType, bf16, f16};
use liger_verify::conformance::bounds::round_to;

/// Exact f32 values of every exponent the sweeps draw, with random mantissas, plus values
/// built to sit just above a bf16 tie (round bit set, the bits below it zero except the
/// last three of f32's mantissa).
fn samples() -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::new();
    for _ in 0..200_000 {
        let bits = next() as u32;
        // Exponents 2^-20 .. 2^20 and both signs.
        let exp = 107 + (bits >> 23) % 41;
        out.push(f32::from_bits(
            (bits & 0x8000_0000) | (exp << 23) | (bits & 0x007f_ffff),
        ));
    }
    for k in 0..5_000u32 {
        let exp = 107 + k % 41;
        let lsb_even_mantissa = (k % 64) << 17; // bf16 keeps mantissa bits 16..22
        let tie = 1 << 15;
        for low in 1..8u32 {
            out.push(f32::from_bits((exp << 23) | lsb_even_mantissa | tie | low));
        }
    }
    out
}

#[test]
fn bf16_rounding_is_to_nearest_even_for_every_f32() {
    let mut wrong = 0;
    for v in samples() {
        let expected = bf16::from_f32(v).to_f64();
        if round_to(DType::BF16, f64::from(v)) != expected {
            wrong += 1;
        }
    }
    assert_eq!(wrong, 0, "values rounded to bf16 away from the nearest");
    // The case `half`'s f64 path gets wrong: just above a tie with an even last bit.
    let v = f32::from_bits((127 << 23) | (1 << 15) | 1);
    assert_eq!(
        round_to(DType::BF16, f64::from(v)),
        bf16::from_f32(v).to_f64()
    );
    assert_ne!(
        bf16::from_f64(f64::from(v)).to_f64(),
        bf16::from_f32(v).to_f64()
    );
}

#[test]
fn f16_rounding_is_to_nearest_even() {
    for v in samples() {
        // In f16's normal range, f32 → f16 rounding is exact to compare against.
        if v.abs() < 6.2e-5 || v.abs() > 65000.0 {
            continue;
        }
        assert_eq!(
            round_to(DType::F16, f64::from(v)),
            f16::from_f32(v).to_f64(),
            "{v:e}"
        );
    }
    // An f64 just above an f16 tie, which rounding through f32 would take to the tie.
    let tie = 1.0 + 2f64.powi(-11);
    let v = tie + 2f64.powi(-40);
    assert_eq!(round_to(DType::F16, v), 1.0 + 2f64.powi(-10));
    assert_eq!(round_to(DType::F16, tie), 1.0);
}
