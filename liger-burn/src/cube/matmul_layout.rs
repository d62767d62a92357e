//! How a row-major batched product `out[..., m, n] = lhs[..., m, k] · rhs[..., k, n]` of
//! strided tensors maps onto column-major BLAS calls without copies.
//!
//! Column-major BLAS sees a row-major `[r, c]` matrix as its transpose, so the product is
//! computed as `outᵀ = rhsᵀ · lhsᵀ`: BLAS's `A` is `rhs`, its `B` is `lhs`, with BLAS sizes
//! `M = n`, `N = m`, `K = k`. Each operand needs unit stride in one of its two matrix
//! dimensions: unit column stride (row-major, the usual case) is read as stored, unit row
//! stride (a transposed view, e.g. Burn's `swap_dims` / `transpose`) with BLAS's
//! transpose flag. Anything else (stride 0 in a matrix dimension, or no unit stride) must
//! be made contiguous first.
//!
//! Batch dimensions (broadcast to the output's) become one strided batch: the batch
//! stride of a broadcast operand (size 1 against a larger batch) is 0. The innermost
//! batch dimensions whose strides nest (`stride[i] = stride[i+1] · size[i+1]` for every
//! operand) form the strided batch; any outer ones are looped over, one BLAS call each.

/// The most BLAS calls (outer batch iterations) a layout may take before the operands
/// are made contiguous instead (which nests their batch strides).
pub(crate) const MAX_CALLS: usize = 16;

/// A matrix as the BLAS reads it: stored column-major `rows × cols` with leading dimension
/// `ld`, used transposed or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BlasMatrix {
    /// Whether the BLAS transposes it (`op = T`).
    pub transposed: bool,
    /// Rows of the stored column-major matrix.
    pub rows: u64,
    /// Columns of the stored column-major matrix.
    pub cols: u64,
    /// Leading dimension (elements between columns), at least `rows`.
    pub ld: i64,
}

/// The stored form of a row-major logical `[rows, cols]` matrix with strides
/// `(row_stride, col_stride)` such that the BLAS operation on it yields its transpose
/// `[cols, rows]`; `None` when it has no unit stride the BLAS can use.
pub(crate) fn transpose_of(
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
) -> Option<BlasMatrix> {
    // A single row (column) has no row (column) stride to speak of.
    let row_major = (col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols.max(1));
    let col_major = (row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows.max(1));
    if row_major {
        // Row-major memory read column-major is the transpose already.
        Some(BlasMatrix {
            transposed: false,
            rows: cols as u64,
            cols: rows as u64,
            ld: if rows == 1 { cols.max(1) } else { row_stride } as i64,
        })
    } else if col_major {
        Some(BlasMatrix {
            transposed: true,
            rows: rows as u64,
            cols: cols as u64,
            ld: if cols == 1 { rows.max(1) } else { col_stride } as i64,
        })
    } else {
        None
    }
}

/// A product laid out for the BLAS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GemmLayout {
    /// BLAS sizes: `M = n`, `N = m`, `K = k`.
    pub m: u64,
    /// See `m`.
    pub n: u64,
    /// See `m`.
    pub k: u64,
    /// BLAS `A`: `rhsᵀ` (`[n, k]`).
    pub a: BlasMatrix,
    /// BLAS `B`: `lhsᵀ` (`[k, m]`).
    pub b: BlasMatrix,
    /// Leading dimension of the (contiguous) output read column-major: `n`.
    pub ld_out: i64,
    /// Matrices per BLAS call (the strided batch).
    pub batch: u64,
    /// Batch strides, in elements, of rhs (BLAS `A`), lhs (BLAS `B`) and the output; 0
    /// for a broadcast operand.
    pub batch_strides: [i64; 3],
    /// Element offsets of rhs, lhs and the output for each BLAS call.
    pub calls: Vec<[u64; 3]>,
}

/// Which operands must be made contiguous before a layout exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NeedsContiguous {
    /// The left operand.
    pub lhs: bool,
    /// The right operand.
    pub rhs: bool,
}

/// Lays out `lhs [..., m, k] · rhs [..., k, n]` (shapes already validated: same rank ≥ 2,
/// batch dimensions equal or 1, inner dimensions equal) into a contiguous output of shape
/// `out`.
pub(crate) fn gemm_layout(
    lhs: (&[usize], &[usize]),
    rhs: (&[usize], &[usize]),
    out: &[usize],
) -> Result<GemmLayout, NeedsContiguous> {
    let (ls, lst) = lhs;
    let (rs, rst) = rhs;
    let rank = out.len();
    let (m, k, n) = (ls[rank - 2], ls[rank - 1], rs[rank - 1]);
    let a = transpose_of(k, n, rst[rank - 2], rst[rank - 1]);
    let b = transpose_of(m, k, lst[rank - 2], lst[rank - 1]);
    let (Some(a), Some(b)) = (a, b) else {
        return Err(NeedsContiguous {
            lhs: b.is_none(),
            rhs: a.is_none(),
        });
    };

    // Batch dimensions of size > 1, with each operand's stride (0 when broadcast).
    let mut dims: Vec<(usize, [usize; 3])> = Vec::new();
    let mut out_stride = m * n;
    let mut out_strides = vec![0; rank - 2];
    for d in (0..rank - 2).rev() {
        out_strides[d] = out_stride;
        out_stride *= out[d];
    }
    for d in 0..rank - 2 {
        if out[d] == 1 {
            continue;
        }
        let stride = |shape: &[usize], strides: &[usize]| {
            if shape[d] == 1 { 0 } else { strides[d] }
        };
        dims.push((out[d], [stride(rs, rst), stride(ls, lst), out_strides[d]]));
    }

    // The strided batch: the longest run of innermost dims whose strides nest.
    let mut inner = dims.len();
    let mut batch = 1usize;
    while inner > 0 {
        let (size, strides) = dims[inner - 1];
        let nests =
            inner == dims.len() || (0..3).all(|i| strides[i] == dims[inner].1[i] * dims[inner].0);
        if !nests || batch * size > i32::MAX as usize {
            break;
        }
        batch *= size;
        inner -= 1;
    }
    let batch_strides = dims
        .last()
        .filter(|_| inner < dims.len())
        .map_or([0; 3], |(_, s)| s.map(|v| v as i64));

    // One call per index of the outer dims.
    let outer = &dims[..inner];
    let count: usize = outer.iter().map(|(size, _)| size).product();
    if count > MAX_CALLS {
        // A contiguous copy nests an operand's batch strides, unless it is broadcast
        // (stride 0) in some batch dimension: those stay as they are.
        let fixable = |i: usize| {
            let nests = dims.windows(2).all(|w| w[0].1[i] == w[1].1[i] * w[1].0);
            !nests && dims.iter().all(|(_, s)| s[i] != 0)
        };
        let needs = NeedsContiguous {
            lhs: fixable(1),
            rhs: fixable(0),
        };
        if needs.lhs || needs.rhs {
            return Err(needs);
        }
    }
    layout_calls(m, n, k, a, b, batch, batch_strides, outer)
}

#[allow(clippy::too_many_arguments)]
fn layout_calls(
    m: usize,
    n: usize,
    k: usize,
    a: BlasMatrix,
    b: BlasMatrix,
    batch: usize,
    batch_strides: [i64; 3],
    outer: &[(usize, [usize; 3])],
) -> Result<GemmLayout, NeedsContiguous> {
    let mut calls = vec![[0u64; 3]];
    for (size, strides) in outer.iter().rev() {
        let mut next = Vec::with_capacity(calls.len() * size);
        for i in 0..*size {
            for c in &calls {
                next.push([0, 1, 2].map(|j| c[j] + (i * strides[j]) as u64));
            }
        }
        calls = next;
    }
    calls.sort_unstable_by_key(|c| c[2]);
    Ok(GemmLayout {
        m: n as u64,
        n: m as u64,
        k: k as u64,
        a,
        b,
        ld_out: n.max(1) as i64,
        batch: batch as u64,
        batch_strides,
        calls,
    })
}

/// Row-major contiguous strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The largest power of two, at most 256, dividing `address` and every one of `steps`
/// (byte offsets between the matrices a call reads): the alignment BLAS may assume.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn alignment(address: u64, steps: impl IntoIterator<Item = u64>) -> u32 {
    let all = steps.into_iter().fold(address | 256, |acc, s| acc | s);
    1 << all.trailing_zeros().min(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(
        ls: &[usize],
        lst: &[usize],
        rs: &[usize],
        rst: &[usize],
        out: &[usize],
    ) -> Result<GemmLayout, NeedsContiguous> {
        gemm_layout((ls, lst), (rs, rst), out)
    }

    /// Evaluates a layout on the host with the column-major BLAS semantics, as a check
    /// of the mapping itself: `out` row-major contiguous.
    fn run(l: &GemmLayout, lhs: &[f64], rhs: &[f64], out_len: usize) -> Vec<f64> {
        let mut out = vec![f64::NAN; out_len];
        let at = |mat: &BlasMatrix, data: &[f64], base: usize, i: usize, j: usize| {
            // Element (i, j) of op(X).
            let (r, c) = if mat.transposed { (j, i) } else { (i, j) };
            data[base + r + c * mat.ld as usize]
        };
        for call in &l.calls {
            for batch in 0..l.batch as usize {
                let base = |x: usize| (call[x] as i64 + batch as i64 * l.batch_strides[x]) as usize;
                for i in 0..l.m as usize {
                    for j in 0..l.n as usize {
                        let mut acc = 0.0;
                        for p in 0..l.k as usize {
                            acc += at(&l.a, rhs, base(0), i, p) * at(&l.b, lhs, base(1), p, j);
                        }
                        out[base(2) + i + j * l.ld_out as usize] = acc;
                    }
                }
            }
        }
        out
    }

    /// Reference product of strided inputs, row-major contiguous output.
    fn reference(
        ls: &[usize],
        lst: &[usize],
        rs: &[usize],
        rst: &[usize],
        out: &[usize],
        lhs: &[f64],
        rhs: &[f64],
    ) -> Vec<f64> {
        let rank = out.len();
        let (m, k, n) = (ls[rank - 2], ls[rank - 1], rs[rank - 1]);
        let total: usize = out.iter().product();
        let mut res = vec![0.0; total];
        let ost = contiguous_strides(out);
        for (idx, slot) in res.iter_mut().enumerate() {
            let coords: Vec<usize> = (0..rank).map(|d| idx / ost[d] % out[d]).collect();
            let off = |shape: &[usize], strides: &[usize]| -> usize {
                (0..rank - 2)
                    .map(|d| {
                        if shape[d] == 1 {
                            0
                        } else {
                            coords[d] * strides[d]
                        }
                    })
                    .sum()
            };
            let (i, j) = (coords[rank - 2], coords[rank - 1]);
            let (lo, ro) = (off(ls, lst), off(rs, rst));
            *slot = (0..k)
                .map(|p| {
                    lhs[lo + i * lst[rank - 2] + p * lst[rank - 1]]
                        * rhs[ro + p * rst[rank - 2] + j * rst[rank - 1]]
                })
                .sum();
        }
        let _ = (m, n);
        res
    }

    fn check(
        ls: &[usize],
        lst: &[usize],
        rs: &[usize],
        rst: &[usize],
        out: &[usize],
    ) -> GemmLayout {
        let l = layout(ls, lst, rs, rst, out).expect("a layout");
        let span = |s: &[usize], st: &[usize]| {
            s.iter().zip(st).map(|(d, t)| (d - 1) * t).sum::<usize>() + 1
        };
        let lhs: Vec<f64> = (0..span(ls, lst)).map(|i| (i % 7) as f64 - 3.0).collect();
        let rhs: Vec<f64> = (0..span(rs, rst))
            .map(|i| (i % 5) as f64 * 0.5 - 1.0)
            .collect();
        let total = out.iter().product();
        assert_eq!(
            run(&l, &lhs, &rhs, total),
            reference(ls, lst, rs, rst, out, &lhs, &rhs),
            "{ls:?}/{lst:?} x {rs:?}/{rst:?}"
        );
        l
    }

    #[test]
    fn plain_2d_is_one_call_without_transposes() {
        let l = check(&[3, 4], &[4, 1], &[4, 5], &[5, 1], &[3, 5]);
        assert!(!l.a.transposed && !l.b.transposed);
        assert_eq!((l.m, l.n, l.k, l.batch, l.calls.len()), (5, 3, 4, 1, 1));
    }

    #[test]
    fn transposed_views_become_flags() {
        // lhs = [4, 3]ᵀ, rhs = [5, 4]ᵀ (strides of swap_dims on contiguous tensors).
        let l = check(&[3, 4], &[1, 3], &[4, 5], &[1, 4], &[3, 5]);
        assert!(l.a.transposed && l.b.transposed);
        let l = check(&[3, 4], &[1, 3], &[4, 5], &[5, 1], &[3, 5]);
        assert!(!l.a.transposed && l.b.transposed);
    }

    #[test]
    fn batches_nest_into_one_strided_call() {
        let l = check(
            &[2, 3, 4, 5],
            &[60, 20, 5, 1],
            &[2, 3, 5, 6],
            &[90, 30, 6, 1],
            &[2, 3, 4, 6],
        );
        assert_eq!((l.batch, l.calls.len()), (6, 1));
        assert_eq!(l.batch_strides, [30, 20, 24]);
    }

    #[test]
    fn broadcast_batch_has_stride_zero() {
        let l = check(&[1, 3, 4], &[12, 4, 1], &[5, 4, 2], &[8, 2, 1], &[5, 3, 2]);
        assert_eq!((l.batch, l.calls.len()), (5, 1));
        assert_eq!(l.batch_strides[1], 0);
        let l = check(&[5, 3, 4], &[12, 4, 1], &[1, 4, 2], &[8, 2, 1], &[5, 3, 2]);
        assert_eq!(l.batch_strides[0], 0);
    }

    #[test]
    fn mixed_broadcasts_loop_over_outer_dims() {
        let l = check(
            &[1, 3, 2, 4],
            &[24, 8, 4, 1],
            &[2, 1, 4, 5],
            &[20, 20, 5, 1],
            &[2, 3, 2, 5],
        );
        assert_eq!((l.batch, l.calls.len()), (3, 2));
    }

    #[test]
    fn permuted_batch_dims_loop_or_ask_for_a_copy() {
        // [b, s, h, d] swapped to [b, h, s, d]: heads nest, batches do not.
        let (b, s, h, d) = (3, 4, 2, 5);
        let q = [b, h, s, d];
        let qs = [s * h * d, d, h * d, 1];
        let kt = [b, h, d, s]; // the same layout transposed in its matrix dims
        let kts = [s * h * d, d, 1, h * d];
        let l = check(&q, &qs, &kt, &kts, &[b, h, s, s]);
        assert_eq!((l.batch, l.calls.len()), (h as u64, b));
        // Too many outer calls: a copy is asked for instead.
        let big = [MAX_CALLS + 1, h, s, d];
        let bigt = [MAX_CALLS + 1, h, d, s];
        let e = layout(&big, &qs, &bigt, &kts, &[MAX_CALLS + 1, h, s, s]).unwrap_err();
        assert!(e.lhs && e.rhs);
    }

    #[test]
    fn unusable_strides_ask_for_a_copy() {
        // Column stride 2 (a strided slice), and stride 0 (an expanded matrix).
        let e = layout(&[3, 4], &[8, 2], &[4, 5], &[5, 1], &[3, 5]).unwrap_err();
        assert!(e.lhs && !e.rhs);
        let e = layout(&[3, 4], &[4, 1], &[4, 5], &[0, 1], &[3, 5]).unwrap_err();
        assert!(!e.lhs && e.rhs);
    }

    #[test]
    fn single_rows_and_columns() {
        check(&[1, 4], &[4, 1], &[4, 1], &[1, 1], &[1, 1]);
        check(&[1, 4], &[7, 1], &[4, 3], &[1, 4], &[1, 3]);
        check(&[3, 1], &[1, 9], &[1, 5], &[5, 1], &[3, 5]);
    }

    #[test]
    fn alignments() {
        assert_eq!(alignment(0x1000, []), 256);
        assert_eq!(alignment(0x1002, []), 2);
        assert_eq!(alignment(0x1000, [6]), 2);
        assert_eq!(alignment(0x1000, [64, 128]), 64);
    }
}
