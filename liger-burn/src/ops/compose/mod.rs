//! Exact compositions of stock Burn ops: the default bodies of [`FusedOps`](super::FusedOps).
//!
//! They compute in f32 whatever the input dtype (casting once on the way in and
//! once on the way out), so they are the same math as the fused kernels and
//! serve as the fallback on backends without CubeCL (NdArray, LibTorch, ...).

pub mod activation;
pub mod adamw;
pub mod attention;
pub(crate) mod chunked_linear;
pub mod cross_entropy;
pub mod distill_rows;
pub mod divergence;
pub mod embedding;
pub mod fused_linear_distill;
pub mod fused_linear_grpo;
pub mod fused_linear_kto;
pub mod fused_linear_preference;
pub mod glu;
pub mod layer_norm;
pub mod linear;
pub mod linear_cross_entropy;
pub mod lora;
pub mod rms_norm;
pub mod rope;
pub mod softmax;

use burn::tensor::{DType, FloatDType, Shape, TensorMetadata, backend::Backend, ops::FloatTensor};

pub(crate) fn to_f32<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    if x.dtype() == DType::F32 {
        x
    } else {
        B::float_cast(x, FloatDType::F32)
    }
}

/// `acc + lhs · rhs`: the default body of
/// [`FusedOps::fused_matmul_add`](crate::ops::FusedOps::fused_matmul_add) (the product
/// rounded to the inputs' dtype, then added in `acc`'s dtype).
pub fn matmul_add<B: crate::ops::FusedOps>(
    acc: FloatTensor<B>,
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
) -> FloatTensor<B> {
    let dtype = acc.dtype();
    B::float_add(acc, to_dtype::<B>(B::fused_matmul(lhs, rhs), dtype))
}

/// `(grad · rhsᵀ, lhsᵀ · grad)` for `lhs: [m, k]`, `rhs: [k, n]`, `grad: [m, n]`: the
/// default body of
/// [`FusedOps::fused_matmul_backward`](crate::ops::FusedOps::fused_matmul_backward), two
/// `fused_matmul` calls on transposed views.
pub fn matmul_backward<B: crate::ops::FusedOps>(
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    check_matmul_backward(&lhs, &rhs, &grad);
    let grad_lhs = B::fused_matmul(grad.clone(), B::float_swap_dims(rhs, 0, 1));
    let grad_rhs = B::fused_matmul(B::float_swap_dims(lhs, 0, 1), grad);
    (grad_lhs, grad_rhs)
}

/// Panics, naming the op, the shapes and the dtypes, unless `lhs: [m, k]`,
/// `rhs: [k, n]` and `grad: [m, n]` are 2-D of one dtype.
pub(crate) fn check_matmul_backward<T: TensorMetadata>(lhs: &T, rhs: &T, grad: &T) {
    let (l, r, g) = (lhs.shape(), rhs.shape(), grad.shape());
    let ok = l.num_dims() == 2
        && r.num_dims() == 2
        && g.num_dims() == 2
        && l[1] == r[0]
        && g[0] == l[0]
        && g[1] == r[1]
        && lhs.dtype() == rhs.dtype()
        && grad.dtype() == lhs.dtype();
    if !ok {
        panic!(
            "matmul_backward: lhs must be [m, k], rhs [k, n] and grad [m, n], of one dtype; \
             got lhs {l:?} ({:?}), rhs {r:?} ({:?}), grad {g:?} ({:?})",
            lhs.dtype(),
            rhs.dtype(),
            grad.dtype()
        );
    }
}

pub(crate) fn to_dtype<B: Backend>(x: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if x.dtype() == dtype {
        return x;
    }
    let float = match dtype {
        DType::F64 => FloatDType::F64,
        DType::F32 | DType::Flex32 => FloatDType::F32,
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        other => panic!("liger: cannot cast a float tensor to non-float dtype {other:?}"),
    };
    B::float_cast(x, float)
}

/// `1 / x` by an IEEE division, in `x`'s dtype.
///
/// Not Burn's `float_recip`: with burn-ndarray's `simd` feature (on in Burn's default
/// features, so in any build where a crate depends on `burn` with them) NdArray computes
/// it with the CPU's approximate reciprocal (AVX-512's `vrcp14ps`, 2⁻¹⁴ relative) on the
/// part of the buffer its SIMD loop finds aligned and exactly on the rest: a result that
/// depends on where the allocator put the buffer, so two runs of the same computation (a
/// training run and its resumption) could differ.
pub(crate) fn reciprocal<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let ones = B::float_ones(x.shape(), &B::float_device(&x), x.dtype().into());
    B::float_div(ones, x)
}

/// `[d]` → `[1, ..., 1, d]` with `rank` dims, to broadcast a per-feature vector.
pub(crate) fn broadcast_row<B: Backend>(v: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let d = v.shape().num_elements();
    let mut dims = vec![1; rank];
    dims[rank - 1] = d;
    B::float_reshape(v, Shape::from(dims))
}

/// Sum `[..., d]` over every dimension but the last: `[d]`.
///
/// Two-level (blocked) summation: a plain f32 sum over tens of thousands of rows loses
/// about `rows · 2⁻²⁴` of relative precision on backends that sum sequentially; summing
/// blocks of 256 rows first keeps the error near that of the kernels' per-cube partials.
pub(crate) fn sum_rows<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    use burn::tensor::{Tensor, TensorPrimitive};
    const BLOCK: usize = 256;
    let shape = x.shape();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d.max(1);
    let flat = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(
        x,
        Shape::new([rows, d]),
    )));
    fn blocked<B: Backend>(t: Tensor<B, 2>) -> Tensor<B, 1> {
        let [rows, d] = t.dims();
        if rows <= 4 * BLOCK {
            return t.sum_dim(0).reshape([d]);
        }
        let main = rows / BLOCK * BLOCK;
        let partial = t
            .clone()
            .slice(0..main)
            .reshape([main / BLOCK, BLOCK, d])
            .sum_dim(1)
            .reshape([main / BLOCK, d]);
        let mut total = blocked(partial);
        if main < rows {
            total = total + t.slice(main..rows).sum_dim(0).reshape([d]);
        }
        total
    }
    blocked(flat).into_primitive().tensor()
}
