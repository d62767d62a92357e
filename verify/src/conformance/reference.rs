//! Naive f64 reference implementations, written independently of the kernels and of
//! Burn: plain loops over row-major `[rows, d]` slices. Each `*_backward` takes the
//! upstream gradient and returns every input gradient.

/// RMSNorm forward: `(y, rstd)`.
pub fn rms_norm(x: &[f64], w: &[f64], d: usize, eps: f64, offset: f64) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; x.len()];
    let mut rstds = Vec::new();
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let rstd = 1.0 / (ms + eps).sqrt();
        for i in 0..d {
            out[i] = row[i] * rstd * (offset + w[i]);
        }
        rstds.push(rstd);
    }
    (y, rstds)
}

/// RMSNorm backward: `(dx, dw, dw_scale)`; `dw_scale[j] = Σ_rows |dy · x̂|` is the
/// magnitude the f32 accumulation error of `dw[j]` scales with (see [`super::compare_sum`]).
pub fn rms_norm_backward(
    dy: &[f64],
    x: &[f64],
    w: &[f64],
    d: usize,
    eps: f64,
    offset: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; x.len()];
    let mut dw = vec![0.0; d];
    let mut scale = vec![0.0; d];
    for ((row, g), out) in x.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let rstd = 1.0 / (ms + eps).sqrt();
        // y_i = x_i r s_i with r = (mean(x²)+eps)^-1/2, dr/dx_j = -r³ x_j / d.
        let dot: f64 = (0..d).map(|i| g[i] * (offset + w[i]) * row[i]).sum();
        for j in 0..d {
            out[j] = g[j] * (offset + w[j]) * rstd - dot * rstd.powi(3) * row[j] / d as f64;
            dw[j] += g[j] * row[j] * rstd;
            scale[j] += (g[j] * row[j] * rstd).abs();
        }
    }
    (dx, dw, scale)
}

/// LayerNorm forward: `y`.
pub fn layer_norm(x: &[f64], gamma: &[f64], beta: Option<&[f64]>, d: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..d {
            out[i] = (row[i] - mean) * rstd * gamma[i] + beta.map_or(0.0, |b| b[i]);
        }
    }
    y
}

/// Gradients of LayerNorm, with the accumulation scales of the row-reduced ones.
pub struct LayerNormGrads {
    /// `dx`.
    pub dx: Vec<f64>,
    /// `dγ`.
    pub dgamma: Vec<f64>,
    /// `dβ`.
    pub dbeta: Vec<f64>,
    /// `Σ_rows |dy · x̂|`.
    pub dgamma_scale: Vec<f64>,
    /// `Σ_rows |dy|`.
    pub dbeta_scale: Vec<f64>,
}

/// LayerNorm backward.
pub fn layer_norm_backward(
    dy: &[f64],
    x: &[f64],
    gamma: &[f64],
    d: usize,
    eps: f64,
) -> LayerNormGrads {
    let mut dx = vec![0.0; x.len()];
    let mut dgamma = vec![0.0; d];
    let mut dbeta = vec![0.0; d];
    let mut dgamma_scale = vec![0.0; d];
    let mut dbeta_scale = vec![0.0; d];
    let n = d as f64;
    for ((row, g), out) in x.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let gh: Vec<f64> = (0..d).map(|i| g[i] * gamma[i]).collect();
        let sum_gh: f64 = gh.iter().sum();
        let sum_gh_xhat: f64 = (0..d).map(|i| gh[i] * xhat[i]).sum();
        for i in 0..d {
            out[i] = rstd / n * (n * gh[i] - sum_gh - xhat[i] * sum_gh_xhat);
            dgamma[i] += g[i] * xhat[i];
            dbeta[i] += g[i];
            dgamma_scale[i] += (g[i] * xhat[i]).abs();
            dbeta_scale[i] += g[i].abs();
        }
    }
    LayerNormGrads {
        dx,
        dgamma,
        dbeta,
        dgamma_scale,
        dbeta_scale,
    }
}

/// Softmax over rows of `d`.
pub fn softmax(x: &[f64], d: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for i in 0..d {
            out[i] = (row[i] - max).exp() / sum;
        }
    }
    y
}

/// Softmax backward from the input: `dx_i = y_i (g_i - Σ g_j y_j)`.
pub fn softmax_backward(dy: &[f64], x: &[f64], d: usize) -> Vec<f64> {
    let y = softmax(x, d);
    let mut dx = vec![0.0; x.len()];
    for ((yr, g), out) in y.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let dot: f64 = (0..d).map(|i| g[i] * yr[i]).sum();
        for i in 0..d {
            out[i] = yr[i] * (g[i] - dot);
        }
    }
    dx
}

/// Log-softmax over rows of `d`.
pub fn log_softmax(x: &[f64], d: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        for i in 0..d {
            out[i] = row[i] - lse;
        }
    }
    y
}

/// Log-softmax backward from the input: `dx_i = g_i - softmax_i Σ g_j`.
pub fn log_softmax_backward(dy: &[f64], x: &[f64], d: usize) -> Vec<f64> {
    let p = softmax(x, d);
    let mut dx = vec![0.0; x.len()];
    for ((pr, g), out) in p.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let sum: f64 = g.iter().sum();
        for i in 0..d {
            out[i] = g[i] - pr[i] * sum;
        }
    }
    dx
}
