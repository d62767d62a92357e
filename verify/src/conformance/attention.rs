//! Attention: its independent f64 reference (forward, `lse` and the gradients of q, k, v
//! for every mask kind: causal, sliding window, document ids, any combination, or a given
//! `[seq, seq]` mask), random problems, the row-wise comparison the attention test suites
//! use, and the conformance cases of `liger check` (the flash kernels through
//! `functional::attention` under each mask kind, compared element by element).

use super::bounds::{self, Expected, unit_roundoff};
use super::{Comparison, HostCase, Op, Rng, compare_all, poison};
use burn::backend::Autodiff;
use burn::tensor::{DType, Int, Tensor, TensorData};
use liger_burn::functional;
use liger_burn::ops::{AttentionKernel, AttentionOptions, FusedOps};

/// One attention problem. `q: [batch, q_heads, seq, head_dim]`, `k, v: [batch, kv_heads,
/// seq, head_dim]`.
#[derive(Clone, Debug)]
pub struct Problem {
    /// Batch.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Sequence length.
    pub seq: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Query `i` sees keys `j ≤ i`.
    pub causal: bool,
    /// Query `i` sees keys `j > i - window`.
    pub window: Option<usize>,
    /// `[batch, seq]` document ids: query `i` sees keys of its own document.
    pub documents: Option<Vec<i64>>,
    /// `[seq, seq]`, `true` where query `i` must not see key `j` (on top of the rest).
    pub mask: Option<Vec<bool>>,
}

impl Problem {
    /// A causal problem without window, documents or mask.
    pub fn causal(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        seq: usize,
        head_dim: usize,
    ) -> Self {
        Self {
            batch,
            q_heads,
            kv_heads,
            seq,
            head_dim,
            causal: true,
            window: None,
            documents: None,
            mask: None,
        }
    }

    /// Whether query `i` of batch row `b` sees key `j`.
    pub fn visible(&self, b: usize, i: usize, j: usize) -> bool {
        let s = self.seq;
        (!self.causal || j <= i)
            && self.window.is_none_or(|w| j + w > i)
            && self
                .documents
                .as_ref()
                .is_none_or(|d| d[b * s + i] == d[b * s + j])
            && self.mask.as_ref().is_none_or(|m| !m[i * s + j])
    }

    /// Elements of q (and of the output and dq).
    pub fn q_len(&self) -> usize {
        self.batch * self.q_heads * self.seq * self.head_dim
    }

    /// Elements of k (v, dk, dv).
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.seq * self.head_dim
    }

    /// Short description for messages.
    pub fn describe(&self) -> String {
        format!(
            "b{} hq{} hkv{} s{} d{} causal {} window {:?} documents {} mask {}",
            self.batch,
            self.q_heads,
            self.kv_heads,
            self.seq,
            self.head_dim,
            self.causal,
            self.window,
            self.documents.is_some(),
            self.mask.is_some()
        )
    }
}

/// Random document ids: each batch row cut into pieces of 1 to `max_len` positions with
/// non-decreasing ids (packed rows), unless `shuffled` (then ids repeat out of order, so
/// pieces of one document are not adjacent).
pub fn random_documents(
    rng: &mut Rng,
    batch: usize,
    seq: usize,
    max_len: usize,
    shuffled: bool,
) -> Vec<i64> {
    let mut ids = Vec::with_capacity(batch * seq);
    for _ in 0..batch {
        let mut id = 0i64;
        let mut left = 0usize;
        for _ in 0..seq {
            if left == 0 {
                id += 1;
                left = 1 + rng.below(max_len);
            }
            left -= 1;
            ids.push(if shuffled { id % 3 } else { id });
        }
    }
    ids
}

/// The reference results, f64, flattened like the tensors.
#[derive(Clone, Debug)]
pub struct Reference {
    /// `[batch, q_heads, seq, head_dim]`.
    pub out: Vec<f64>,
    /// `[batch, q_heads, seq]`; `None` where a query sees no key.
    pub lse: Vec<Option<f64>>,
    /// `[batch, q_heads, seq, head_dim]`.
    pub grad_q: Vec<f64>,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub grad_k: Vec<f64>,
    /// `[batch, kv_heads, seq, head_dim]`.
    pub grad_v: Vec<f64>,
    /// The magnitudes of the terms each element sums (the same sums over absolute values:
    /// `Σ_j p_j |v_j|` for the output, `scale Σ_j p_j (|dP_j| + |D|) |k_j|` for `grad_q`, …),
    /// the scale of its rounding error: `[out, grad_q, grad_k, grad_v]`.
    pub magnitude: [Vec<f64>; 4],
    /// The same sums with each `p_j` weighted by `|s_j| + |lse|`: a probability computed
    /// as `exp(s_j - lse)` in f32 carries a relative error of about `u_f32·(|s_j| + |lse|)`
    /// (large scores make it dominant), `[out, grad_q, grad_k, grad_v]`.
    pub exp_magnitude: [Vec<f64>; 4],
    /// The sums of the other factor alone (`Σ_j |v_j|` for the output, …): probabilities
    /// and `dS` below the smallest normal are rounded to an absolute step (f16: 2⁻²⁵; f32
    /// flushed to zero: 2⁻¹²⁶), `[out, grad_q, grad_k, grad_v]`.
    pub absolute_magnitude: [Vec<f64>; 4],
    /// What f32's flush-to-zero can take from each term beyond [`Self::absolute_magnitude`]
    /// (which counts a flushed probability in the output and `grad_v`, and a flushed `dS`),
    /// in units of its smallest normal (2⁻¹²⁶; every dtype accumulates in f32): a flushed
    /// probability reaching `grad_q` and `grad_k` through `dS = p·(dP − D)`, times
    /// `scale·(|dP_j| + |D|)·|k_j|` (`|q_i|` for `grad_k`), and one each for the term's
    /// product and the running sum flushed (a result below 2⁻¹²⁶ comes out 0).
    /// `[out, grad_q, grad_k, grad_v]`.
    pub flush_magnitude: [Vec<f64>; 4],
}

impl Reference {
    /// The error bound of each `row_len`-wide row of tensor `which` (0 out, 1 grad_q,
    /// 2 grad_k, 3 grad_v) in `dtype`, the scores rounded to `scores`:
    /// `tol·‖magnitude_r‖ + 8·u_scores·‖exp_magnitude_r‖ + 2·step·‖absolute_magnitude_r‖`
    /// `+ 2⁻¹²⁶·‖flush_magnitude_r‖ + step_stored·√row_len`, `step` the dtype's absolute
    /// rounding step below its smallest normal (intermediates), `step_stored` the same for
    /// the stored result (f16 only: 2⁻²⁵; a key few queries see in a causal mask can have
    /// a gradient that small). The flash kernels keep scores in f32; the blockwise path
    /// rounds them to the input dtype, as eager attention does.
    pub fn row_bounds(
        &self,
        which: usize,
        row_len: usize,
        tol: f64,
        dtype: DType,
        scores: DType,
    ) -> Vec<f64> {
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let (m, e, a, f) = (
            &self.magnitude[which],
            &self.exp_magnitude[which],
            &self.absolute_magnitude[which],
            &self.flush_magnitude[which],
        );
        let u32_ = unit_roundoff(scores);
        let (step, stored) = absolute_steps(dtype);
        let stored = stored * (row_len as f64).sqrt();
        (0..m.len() / row_len.max(1))
            .map(|r| {
                let span = r * row_len..(r + 1) * row_len;
                tol * norm(&m[span.clone()])
                    + 8.0 * u32_ * norm(&e[span.clone()])
                    + 2.0 * step * norm(&a[span.clone()])
                    + F32_SMALLEST_NORMAL * norm(&f[span])
                    + stored
            })
            .collect()
    }

    /// The error bound of each element of tensor `which` (as [`Self::row_bounds`]): the
    /// same terms, each from the magnitudes of the one sum the element is, so a wrong
    /// element cannot hide among right ones of its row.
    pub fn element_bounds(&self, which: usize, tol: f64, dtype: DType, scores: DType) -> Vec<f64> {
        let u32_ = unit_roundoff(scores);
        let (step, stored) = absolute_steps(dtype);
        let (m, e, a, f) = (
            &self.magnitude[which],
            &self.exp_magnitude[which],
            &self.absolute_magnitude[which],
            &self.flush_magnitude[which],
        );
        (0..m.len())
            .map(|i| {
                tol * m[i]
                    + 8.0 * u32_ * e[i]
                    + 2.0 * step * a[i]
                    + F32_SMALLEST_NORMAL * f[i]
                    + stored
            })
            .collect()
    }
}

/// f32's smallest normal, 2⁻¹²⁶: what flush-to-zero takes at most from one value.
const F32_SMALLEST_NORMAL: f64 = f32::MIN_POSITIVE as f64;

/// The absolute rounding steps of `dtype`: of the intermediates below the smallest normal
/// (f32 products may flush results below 2⁻¹²⁶ to zero, as GPU drivers run f32 with
/// flush-to-zero; f16 stores numbers below 2⁻¹⁴ in steps of 2⁻²⁴), and of each stored
/// result (below f16's smallest normal the final rounding is absolute, half a subnormal
/// step, 2⁻²⁵, however small the result; bf16 and f32 store subnormals, and what the f32
/// accumulator flushes before the store is [`Reference::flush_magnitude`]'s).
fn absolute_steps(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (2f64.powi(-25), 2f64.powi(-25)),
        _ => (2f64.powi(-126), 0.0),
    }
}

/// Naive attention in f64 and its gradients for the upstream gradient `g`. A query that
/// sees no key has output 0 and no gradient.
pub fn reference(p: &Problem, q: &[f64], k: &[f64], v: &[f64], g: &[f64]) -> Reference {
    let (b, hq, hk, s, d) = (p.batch, p.q_heads, p.kv_heads, p.seq, p.head_dim);
    let scale = (d as f64).powf(-0.5);
    let qi = |bi: usize, h: usize, i: usize| ((bi * hq + h) * s + i) * d;
    let ki = |bi: usize, h: usize, j: usize| ((bi * hk + h) * s + j) * d;
    let mut r = Reference {
        out: vec![0.0; q.len()],
        lse: vec![None; b * hq * s],
        grad_q: vec![0.0; q.len()],
        grad_k: vec![0.0; k.len()],
        grad_v: vec![0.0; v.len()],
        magnitude: [
            vec![0.0; q.len()],
            vec![0.0; q.len()],
            vec![0.0; k.len()],
            vec![0.0; v.len()],
        ],
        exp_magnitude: [
            vec![0.0; q.len()],
            vec![0.0; q.len()],
            vec![0.0; k.len()],
            vec![0.0; v.len()],
        ],
        absolute_magnitude: [
            vec![0.0; q.len()],
            vec![0.0; q.len()],
            vec![0.0; k.len()],
            vec![0.0; v.len()],
        ],
        flush_magnitude: [
            vec![0.0; q.len()],
            vec![0.0; q.len()],
            vec![0.0; k.len()],
            vec![0.0; v.len()],
        ],
    };
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in 0..s {
                let qo = qi(bi, h, i);
                let seen: Vec<usize> = (0..s).filter(|&j| p.visible(bi, i, j)).collect();
                if seen.is_empty() {
                    continue;
                }
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let ko = ki(bi, kh, j);
                        scale * (0..d).map(|e| q[qo + e] * k[ko + e]).sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                r.lse[(bi * hq + h) * s + i] = Some(max + sum.ln());
                let prob: Vec<f64> = scores.iter().map(|x| (x - max).exp() / sum).collect();
                let dp: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let vo = ki(bi, kh, j);
                        (0..d).map(|e| g[qo + e] * v[vo + e]).sum()
                    })
                    .collect();
                let dot: f64 = prob.iter().zip(&dp).map(|(a, b)| a * b).sum();
                // Kernels take D = Σ_e dO_e·O_e from the output rounded to the input dtype:
                // its error scales with Σ_e |dO_e·O_e|, not with D.
                let out_row: Vec<f64> = (0..d)
                    .map(|e| {
                        seen.iter()
                            .zip(&prob)
                            .map(|(&j, p)| p * v[ki(bi, kh, j) + e])
                            .sum::<f64>()
                    })
                    .collect();
                let dot_mag: f64 = (0..d).map(|e| (g[qo + e] * out_row[e]).abs()).sum();
                for (n, &j) in seen.iter().enumerate() {
                    let ko = ki(bi, kh, j);
                    let ds = prob[n] * (dp[n] - dot);
                    let ds_mag = prob[n] * (dp[n].abs() + dot.abs().max(dot_mag));
                    // Weight of the f32 exponent's error in this probability.
                    let w = scores[n].abs() + (max + sum.ln()).abs();
                    let [m_out, m_q, m_k, m_v] = &mut r.magnitude;
                    let [e_out, e_q, e_k, e_v] = &mut r.exp_magnitude;
                    let [a_out, a_q, a_k, a_v] = &mut r.absolute_magnitude;
                    let [f_out, f_q, f_k, f_v] = &mut r.flush_magnitude;
                    // A flushed probability reaches dS times (dP − D).
                    let ds_per_prob = scale * (dp[n].abs() + dot.abs().max(dot_mag));
                    for e in 0..d {
                        r.out[qo + e] += prob[n] * v[ko + e];
                        r.grad_v[ko + e] += prob[n] * g[qo + e];
                        r.grad_q[qo + e] += scale * ds * k[ko + e];
                        r.grad_k[ko + e] += scale * ds * q[qo + e];
                        m_out[qo + e] += prob[n] * v[ko + e].abs();
                        m_v[ko + e] += prob[n] * g[qo + e].abs();
                        m_q[qo + e] += scale * ds_mag * k[ko + e].abs();
                        m_k[ko + e] += scale * ds_mag * q[qo + e].abs();
                        e_out[qo + e] += w * prob[n] * v[ko + e].abs();
                        e_v[ko + e] += w * prob[n] * g[qo + e].abs();
                        e_q[qo + e] += w * scale * ds_mag * k[ko + e].abs();
                        e_k[ko + e] += w * scale * ds_mag * q[qo + e].abs();
                        a_out[qo + e] += v[ko + e].abs();
                        a_v[ko + e] += g[qo + e].abs();
                        a_q[qo + e] += scale * k[ko + e].abs();
                        a_k[ko + e] += scale * q[qo + e].abs();
                        f_out[qo + e] += 2.0;
                        f_v[ko + e] += 2.0;
                        f_q[qo + e] += ds_per_prob * k[ko + e].abs() + 2.0;
                        f_k[ko + e] += ds_per_prob * q[qo + e].abs() + 2.0;
                    }
                }
            }
        }
    }
    r
}

/// Row-wise tolerance of attention's results in `dtype` for problem `p`, relative to the
/// magnitude of the terms each row sums ([`Reference::magnitude`]).
///
/// f32 accumulation: a sum of `n` terms computed in f32, in any order, is within the
/// conformance bounds' accumulation error ([`bounds::accumulation`]: `min((n − 1)·u,
/// λ·√n·u)` of the sum of the terms' magnitudes). The longest chain a result goes through
/// is a key's gradient: `dP = g·v` and `D = g·out` (`head_dim` terms each), then the sum
/// over every query of its group (`group · seq` terms: grouped-query heads share the key);
/// the online softmax's rescaling and the final division add a few roundings (counted as
/// 8).
/// The exponentials' own error is [`Reference::row_bounds`]' `exp_magnitude` term.
///
/// Half precision, on top: each probability is rounded once to the input dtype before
/// `P·V` (as the reference implementations do), `dS` once before its products, and every
/// result once: 4u of the dtype (bf16: 0.0156, f16: 0.0020), while a wrong row (zero,
/// doubled, another row's) is off by about its whole norm.
pub fn row_tolerance(dtype: DType, p: &Problem) -> f64 {
    let group = p.q_heads / p.kv_heads.max(1);
    let f32_sums = bounds::accumulation(group * p.seq + 2 * p.head_dim, 1.0) + 8.0 * bounds::U32;
    match dtype {
        DType::F16 | DType::BF16 => 4.0 * unit_roundoff(dtype) + f32_sums,
        _ => f32_sums,
    }
}

/// Compares `actual` with `expected` row by row (`bounds.len()` rows): every element
/// finite and `‖actual_r − expected_r‖₂ ≤ bounds[r]` ([`Reference::row_bounds`]: a rounding
/// error scales with the magnitudes of the terms a row sums, not with a result that
/// cancels). A row whose bound is zero (the reference sums nothing into it: a query that
/// sees no key, a key no query sees) must be within the mean bound of the tensor's rows
/// of zero. Row-wise, not norm-wise over the tensor: a wrong, missing or swapped row
/// fails even among many right ones. Returns the worst ratio `error / bound` (≤ 1
/// passes) or a message naming the row.
pub fn compare_rows(
    name: &str,
    actual: &[f64],
    expected: &[f64],
    bounds: &[f64],
) -> Result<f64, String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{name}: {} elements, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    if let Some(i) = actual.iter().position(|x| !x.is_finite()) {
        return Err(format!("{name}: element {i} is {}", actual[i]));
    }
    let rows = bounds.len();
    let row_len = expected.len() / rows.max(1);
    let mean = bounds.iter().sum::<f64>() / rows.max(1) as f64;
    let mut worst = 0.0f64;
    for (r, &bound) in bounds.iter().enumerate() {
        let span = r * row_len..(r + 1) * row_len;
        let err = actual[span.clone()]
            .iter()
            .zip(&expected[span])
            .map(|(a, e)| (a - e) * (a - e))
            .sum::<f64>()
            .sqrt();
        let bound = if bound > 0.0 { bound } else { mean }.max(f64::MIN_POSITIVE);
        let ratio = err / bound;
        if ratio > 1.0 {
            return Err(format!(
                "{name}: row {r} of {rows}: error {err:.3e} exceeds {bound:.3e}"
            ));
        }
        worst = worst.max(ratio);
    }
    Ok(worst)
}

/// Compares `lse` (f32 values, [`liger_cubecl_kernels::attention::NO_KEY_LSE`] where a
/// query sees no key) with the reference, to `tol` absolute (lse is a log: its error is
/// the relative error of the row's sum).
pub fn compare_lse(actual: &[f64], expected: &[Option<f64>], tol: f64) -> Result<(), String> {
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        match e {
            Some(e) if (a - e).abs() <= tol * (1.0 + e.abs()) => {}
            None if *a == f32::MAX as f64 => {}
            _ => return Err(format!("lse[{i}] = {a}, expected {e:?}")),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The conformance cases
// ---------------------------------------------------------------------------------------

/// The sweep's `(seq, head_dim)`: one row and odd lengths, head dimensions the flash
/// kernels take (multiples of 16), lengths spanning several key blocks of every tiling
/// with a partial last one in the full sweep.
pub fn shapes(quick: bool) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 16), (13, 32), (37, 64), (100, 128), (70, 80)];
    if !quick {
        shapes.extend([(257, 64), (130, 128), (1031, 64), (520, 128)]);
    }
    shapes
}

/// The problem `op` runs at `(seq, head_dim)`: grouped-query heads (two query heads a key
/// head), batch 2 up to 200 positions and 1 beyond (the reference is `O(seq²)`), causal;
/// a window of a third of the sequence, or documents of up to a quarter of it each; or
/// every query seeing every key.
pub fn problem(op: Op, seq: usize, head_dim: usize, rng: &mut Rng) -> Problem {
    let (batch, q_heads, kv_heads) = if seq > 200 { (1, 2, 1) } else { (2, 4, 2) };
    let mut p = Problem::causal(batch, q_heads, kv_heads, seq, head_dim);
    match op {
        Op::Attention => {}
        Op::AttentionWindow => p.window = Some((seq / 3).max(1)),
        Op::AttentionDocuments => {
            p.documents = Some(random_documents(rng, batch, seq, (seq / 4).max(2), false));
        }
        Op::AttentionBidirectional => p.causal = false,
        other => unreachable!("{other:?} is not an attention op"),
    }
    p
}

/// The options `op` runs `p` with: the documents' case asks for deterministic gradients
/// (the query gradient from its own kernel rather than summed by atomic adds).
fn options(op: Op, p: &Problem) -> AttentionOptions {
    AttentionOptions {
        causal: p.causal,
        window: p.window,
        ..AttentionOptions::causal(p.head_dim)
    }
    .with_deterministic(op == Op::AttentionDocuments)
}

/// The inputs of a case as drawn (before rounding): q, k in `[-2, 2]`, v in `[-1, 1]`, the
/// upstream gradient in `[-1.5, 1.5]`.
struct Drawn {
    p: Problem,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
}

fn draw(op: Op, seq: usize, head_dim: usize, rng: &mut Rng) -> Drawn {
    let p = problem(op, seq, head_dim, rng);
    let (ql, kl) = (p.q_len(), p.kv_len());
    Drawn {
        q: rng.vec(ql, -2.0, 2.0, 0.0),
        k: rng.vec(kl, -2.0, 2.0, 0.0),
        v: rng.vec(kl, -1.0, 1.0, 0.0),
        g: rng.vec(ql, -1.5, 1.5, 0.0),
        p,
    }
}

/// The reference of `p` as the suite compares it: per element, the bound of
/// [`Reference::element_bounds`], the scores rounded to `scores` (f32 in the flash kernels).
fn expected(p: &Problem, inputs: [&[f64]; 4], dtype: DType, scores: DType) -> Vec<Expected> {
    let [q, k, v, g] = inputs;
    let r = reference(p, q, k, v, g);
    let tol = row_tolerance(dtype, p);
    let rows_q = p.batch * p.q_heads * p.seq;
    let rows_kv = p.batch * p.kv_heads * p.seq;
    [
        ("output", &r.out, rows_q),
        ("grad_q", &r.grad_q, rows_q),
        ("grad_k", &r.grad_k, rows_kv),
        ("grad_v", &r.grad_v, rows_kv),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (name, values, rows))| {
        Expected::new(
            name,
            values.clone(),
            r.element_bounds(i, tol, dtype, scores),
            rows,
        )
    })
    .collect()
}

/// See [`super::host_case`]: the last rows dropped are the last tenth of the keys (what a
/// kernel that skips the last key block gives).
pub fn host_case(op: Op, seq: usize, head_dim: usize, dtype: DType, rng: &mut Rng) -> HostCase {
    let d = draw(op, seq, head_dim, rng);
    let inputs = [&d.q, &d.k, &d.v, &d.g].map(|x| super::host_input(x, dtype));
    let refs = [&inputs[0][..], &inputs[1], &inputs[2], &inputs[3]];
    let live = seq - (seq / 10).max(1).min(seq);
    let mut dropped = d.p.clone();
    dropped.mask = Some((0..seq * seq).map(|ij| ij % seq >= live).collect());
    HostCase {
        expected: expected(&d.p, refs, dtype, DType::F32),
        without_last_rows: expected(&dropped, refs, dtype, DType::F32),
    }
}

/// Runs `op` at `(seq, head_dim)` in `dtype` on `device` through `Autodiff<B>`: the flash
/// kernels where the backend has them for the problem, else the blockwise composition
/// (scores rounded to the dtype, as eager attention; the bounds say so).
pub fn run<B: FusedOps>(
    op: Op,
    seq: usize,
    head_dim: usize,
    dtype: DType,
    device: &B::Device,
    rng: &mut Rng,
) -> Vec<Comparison> {
    type A<B> = Autodiff<B>;
    let d = draw(op, seq, head_dim, rng);
    let p = &d.p;
    let options = options(op, p);
    let flash = B::flash_attention_variant(device, dtype, head_dim, &options).is_some();
    let (kernel, scores) = if flash {
        (AttentionKernel::Flash, DType::F32)
    } else {
        (AttentionKernel::Blockwise, dtype)
    };
    let options = options.with_kernel(kernel);
    let tensor = |values: &[f32], heads: usize| {
        let t = Tensor::<B, 4>::from_data(
            TensorData::new(
                super::no_subnormals(values.to_vec()),
                [p.batch, heads, seq, head_dim],
            ),
            device,
        )
        .cast(dtype);
        let r = super::to_f64(t.clone());
        (t, r)
    };
    let (q, qr) = tensor(&d.q, p.q_heads);
    let (k, kr) = tensor(&d.k, p.kv_heads);
    let (v, vr) = tensor(&d.v, p.kv_heads);
    let (g, gr) = tensor(&d.g, p.q_heads);
    let [q, k, v] = [q, k, v].map(|t| Tensor::<A<B>, 4>::from_inner(t).require_grad());
    let ids = p.documents.as_ref().map(|ids| {
        Tensor::<A<B>, 2, Int>::from_data(TensorData::new(ids.clone(), [p.batch, seq]), device)
    });
    let (ql, kl, rows) = (p.q_len(), p.kv_len(), p.batch * p.q_heads * seq);
    poison::<B>(&[ql, ql, kl, kl, rows], dtype, device);
    let out = match ids {
        Some(ids) => {
            functional::attention_with_documents(q.clone(), k.clone(), v.clone(), ids, options)
        }
        None => functional::attention(q.clone(), k.clone(), v.clone(), None, options),
    };
    let grads = (out.clone() * Tensor::from_inner(g)).sum().backward();
    let grad = |t: &Tensor<A<B>, 4>| super::to_f64(t.grad(&grads).expect("a gradient"));
    let actual = vec![
        ("output", super::to_f64(out.inner())),
        ("grad_q", grad(&q)),
        ("grad_k", grad(&k)),
        ("grad_v", grad(&v)),
    ];
    let expected = expected(p, [&qr, &kr, &vr, &gr], dtype, scores);
    compare_all(actual, &expected)
}
