//! Validation of a matrix product's inputs, Burn's `matmul` semantics: `lhs: [..., m, k]`,
//! `rhs: [..., k, n]` of one rank ≥ 2 and one float dtype, batch dimensions equal or 1
//! (broadcast). Empty dimensions are allowed (the product is then empty, or zeros when
//! `k = 0`).

use super::{LigerError, fail};
use burn::tensor::{DType, Shape, TensorMetadata};

/// Validates a matrix product's inputs; returns the output shape `[...batch, m, n]`, the
/// batch dimensions broadcast.
pub fn matmul(op: &str, lhs: (&Shape, DType), rhs: (&Shape, DType)) -> Result<Shape, LigerError> {
    let ((ls, ld), (rs, rd)) = (lhs, rhs);
    let describe = || format!("lhs {ls:?} ({ld:?}), rhs {rs:?} ({rd:?})");
    if ls.num_dims() < 2 || ls.num_dims() != rs.num_dims() {
        return fail(format!(
            "{op}: lhs and rhs must have the same rank, at least 2 ([..., m, k] and [..., k, n]); got {}",
            describe()
        ));
    }
    if !ld.is_float() || ld != rd {
        return fail(format!(
            "{op}: lhs and rhs must have the same float dtype; got {}",
            describe()
        ));
    }
    let rank = ls.num_dims();
    if ls[rank - 1] != rs[rank - 2] {
        return fail(format!(
            "{op}: the inner dimensions differ (lhs [..., m, k] has k = {}, rhs [..., k, n] has k = {}); got {}",
            ls[rank - 1],
            rs[rank - 2],
            describe()
        ));
    }
    let mut out = Vec::with_capacity(rank);
    for d in 0..rank - 2 {
        let (a, b) = (ls[d], rs[d]);
        out.push(match (a, b) {
            _ if a == b => a,
            (1, _) => b,
            (_, 1) => a,
            _ => {
                return fail(format!(
                    "{op}: batch dimension {d} is {a} in lhs and {b} in rhs; they must be equal or 1 \
                     (broadcast); got {}",
                    describe()
                ));
            }
        });
    }
    out.push(ls[rank - 2]);
    out.push(rs[rank - 1]);
    Ok(Shape::from(out))
}

/// [`matmul`] on tensors of any layer (Burn primitives, CubeCL or fusion tensors).
pub fn matmul_tensors<T: TensorMetadata>(op: &str, lhs: &T, rhs: &T) -> Result<Shape, LigerError> {
    matmul(op, (&lhs.shape(), lhs.dtype()), (&rhs.shape(), rhs.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: &[usize]) -> Shape {
        Shape::from(d.to_vec())
    }

    #[test]
    fn broadcasts_batch_dims() {
        let out = matmul(
            "matmul",
            (&shape(&[1, 3, 2, 4]), DType::F32),
            (&shape(&[2, 1, 4, 5]), DType::F32),
        )
        .unwrap();
        assert_eq!(out, shape(&[2, 3, 2, 5]));
    }

    #[test]
    fn rejects_bad_inputs_naming_shapes_and_dtypes() {
        let bad = [
            (
                shape(&[2, 3]),
                DType::F32,
                shape(&[4, 5]),
                DType::F32,
                "inner",
            ),
            (
                shape(&[2, 3]),
                DType::F32,
                shape(&[3, 5]),
                DType::BF16,
                "dtype",
            ),
            (shape(&[3]), DType::F32, shape(&[3]), DType::F32, "rank"),
            (
                shape(&[2, 3, 4]),
                DType::F32,
                shape(&[4, 5]),
                DType::F32,
                "rank",
            ),
            (
                shape(&[2, 2, 3]),
                DType::F32,
                shape(&[3, 3, 5]),
                DType::F32,
                "batch",
            ),
            (
                shape(&[2, 3]),
                DType::I32,
                shape(&[3, 5]),
                DType::I32,
                "float",
            ),
        ];
        for (l, ld, r, rd, what) in bad {
            let err = matmul("matmul", (&l, ld), (&r, rd)).unwrap_err().0;
            assert!(err.starts_with("matmul:"), "{what}: {err}");
            assert!(err.contains(&format!("{l:?}")), "{what}: {err}");
            assert!(err.contains(&format!("{rd:?}")), "{what}: {err}");
        }
    }
}
