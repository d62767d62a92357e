//! The NdArray fallback divides where it needs a reciprocal: with burn-ndarray's `simd`
//! feature (on in Burn's default features, so in projects that depend on `burn` with
//! them; off in this workspace) Burn's `float_recip` on NdArray is the CPU's approximate
//! reciprocal (AVX-512's `vrcp14ps`, 2⁻¹⁴ relative) on the part of a buffer its SIMD loop
//! finds aligned and exact on the rest, so the result depends on where the allocator put
//! the buffer. Held here to a few f32 ulps against f64, far below that approximation's
//! error, on tensors large enough for the SIMD path (32 elements or more).

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use liger_burn::functional;
use liger_burn::ops::{FusedOps, RmsNormOptions};

fn host(t: burn::tensor::ops::FloatTensor<NdArray>) -> Vec<f32> {
    Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// Values spread over a few octaves, deterministic.
fn inputs(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 4.0 + (i % 7) as f32 * 0.01)
        .collect()
}

#[test]
fn ndarray_fallback_reciprocals_are_divisions() {
    let device = Default::default();
    let (rows, width) = (1024, 8);
    let x = inputs(rows * width);
    let xt = Tensor::<NdArray, 2>::from_data(TensorData::new(x.clone(), [rows, width]), &device);
    let w = Tensor::<NdArray, 1>::ones([width], &device);
    let eps = 1e-6;
    let out = <NdArray as FusedOps>::fused_rms_norm(
        xt.clone().into_primitive().tensor(),
        w.into_primitive().tensor(),
        RmsNormOptions::llama(eps),
    );
    let rstd = host(out.rstd);
    let mut worst = 0.0f64;
    for (r, row) in rstd.iter().zip(x.chunks(width)) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / width as f64;
        let exact = 1.0 / (ms + eps).sqrt();
        worst = worst.max((*r as f64 - exact).abs() / exact);
    }
    assert!(worst < 1e-6, "rms_norm rstd: max relative error {worst:e}");

    let y: Vec<f32> = functional::sigmoid(xt).into_data().to_vec::<f32>().unwrap();
    let worst = y
        .iter()
        .zip(&x)
        .map(|(&s, &v)| {
            let exact = 1.0 / (1.0 + (-(v as f64)).exp());
            (s as f64 - exact).abs() / exact
        })
        .fold(0.0, f64::max);
    assert!(worst < 1e-6, "sigmoid: max relative error {worst:e}");
}
