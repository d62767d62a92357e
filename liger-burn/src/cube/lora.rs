//! The LoRA linear layer on `CubeBackend`. Where its products run on a vendor library
//! (cuBLASLt on CUDA), each direction is one chain of products under one ordering against
//! CubeCL's stream ([`vendor_chain`]), with the scale as the product's `alpha` and the
//! backward's sum as its `beta = 1`, between the casts to the compute dtype and back;
//! everywhere else, and for empty shapes, the default composition ([`compose::lora`]),
//! whose products and elementwise ops each synchronize on their own.
//!
//! Forward ([`parts`]), with `c` the compute dtype: the base path `x·W` rounded to the
//! activation dtype (the frozen layer's output, as PEFT's) plus the bias,
//! `h = s·(c(x_a)·c(A)ᵀ)` and the adapter path `h·c(B)ᵀ`; their sum, whose casts the
//! fusion stream fuses, is [`compose::lora::add_adapter`]. Backward of `g`:
//! `grad_B = c(g)ᵀ·h`, `u = s·(c(g)·c(B))`, `grad_A = uᵀ·c(x_a)`, and the input gradient
//! `g·Wᵀ` (stored in `c`) `+= u·c(A)`, rounded once (a separate adapter input gets `u·c(A)`
//! of its own). Against the composition this leaves out roundings only (of `h` before its
//! scale; of the base path's input gradient before the sum), as the bounds of
//! `compose::lora` allow.

use super::matmul::{ChainedProduct, chain_supported, vendor_chain};
use crate::ops::compose::lora::LayerDims;
use crate::ops::compose::{self, to_dtype};
use crate::ops::{LoraLinearGrads, LoraLinearGradsWanted, LoraLinearParts, LoraOptions};
use burn::tensor::{DType, Shape, TensorMetadata, ops::FloatTensorOps};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// `[..., d]` → `[rows, d]`.
fn flat<R, F, I, BT>(x: CubeTensor<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    compose::lora::rows::<CubeBackend<R, F, I, BT>>(x)
}

/// The 2-D transpose, a view.
fn t<R, F, I, BT>(x: CubeTensor<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    CubeBackend::<R, F, I, BT>::float_transpose(x)
}

/// Whether the chains run for a layer of `dims` with activations of `dtype` and adapters
/// computing in `c`.
fn chained<R: CubeRuntime>(device: &R::Device, dims: &LayerDims, dtype: DType, c: DType) -> bool {
    [dims.rows, dims.d_in, dims.d_out, dims.rank]
        .iter()
        .all(|d| *d > 0)
        && chain_supported::<R>(device, &[dtype, c])
}

/// See [`FusedOps::fused_lora_linear_parts`](crate::ops::FusedOps::fused_lora_linear_parts).
pub(crate) fn parts<R, F, I, BT>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    adapter_x: Option<CubeTensor<R>>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    options: LoraOptions,
) -> LoraLinearParts<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    let shape = x.shape();
    let dtype = x.dtype;
    let c = options.precision.compute_dtype(dtype);
    let dims = LayerDims::of(&shape, &weight.shape(), &a.shape());
    let (rows, d_out, rank) = (dims.rows, dims.d_out, dims.rank);
    if !chained::<R>(&x.device, &dims, dtype, c) {
        return compose::lora::parts::<Cube<R, F, I, BT>>(
            x, weight, bias, adapter_x, a, b, options,
        );
    }
    let x2 = flat::<R, F, I, BT>(x.clone());
    let xa_c = to_dtype::<Cube<R, F, I, BT>>(
        match &adapter_x {
            Some(t) => flat::<R, F, I, BT>(t.clone()),
            None => x2.clone(),
        },
        c,
    );
    let a_c = to_dtype::<Cube<R, F, I, BT>>(a.clone(), c);
    let b_c = to_dtype::<Cube<R, F, I, BT>>(b.clone(), c);
    let base = super::empty_like(&x2, Shape::new([rows, d_out]), dtype);
    let hidden = super::empty_like(&x2, Shape::new([rows, rank]), c);
    let adapter = super::empty_like(&x2, Shape::new([rows, d_out]), c);
    let chain = vec![
        ChainedProduct {
            lhs: x2,
            rhs: weight.clone(),
            out: base.clone(),
            alpha: 1.0,
            accumulate: false,
        },
        ChainedProduct {
            lhs: xa_c,
            rhs: t::<R, F, I, BT>(a_c),
            out: hidden.clone(),
            alpha: options.scale as f32,
            accumulate: false,
        },
        ChainedProduct {
            lhs: hidden.clone(),
            rhs: t::<R, F, I, BT>(b_c),
            out: adapter.clone(),
            alpha: 1.0,
            accumulate: false,
        },
    ];
    if let Err(why) = vendor_chain(chain) {
        log::debug!("liger lora_linear: the composition on CUDA: {why}");
        return compose::lora::parts::<Cube<R, F, I, BT>>(
            x, weight, bias, adapter_x, a, b, options,
        );
    }
    let base = match bias {
        Some(bias) => {
            let bias = Cube::<R, F, I, BT>::float_reshape(bias, Shape::new([1, d_out]));
            Cube::<R, F, I, BT>::float_add(base, bias)
        }
        None => base,
    };
    LoraLinearParts {
        base,
        adapter,
        hidden,
    }
}

/// See [`FusedOps::fused_lora_linear_backward`](crate::ops::FusedOps::fused_lora_linear_backward).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<R, F, I, BT>(
    grad_output: CubeTensor<R>,
    adapter_input: CubeTensor<R>,
    separate: bool,
    weight: CubeTensor<R>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    hidden: CubeTensor<R>,
    options: LoraOptions,
    wanted: LoraLinearGradsWanted,
) -> LoraLinearGrads<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    let x_shape = adapter_input.shape();
    let dtype = adapter_input.dtype;
    let c = options.precision.compute_dtype(dtype);
    let dims = LayerDims::of(&x_shape, &weight.shape(), &a.shape());
    let (rows, d_in, d_out, rank) = (dims.rows, dims.d_in, dims.d_out, dims.rank);
    let (a_dtype, b_dtype) = (a.dtype, b.dtype);
    if !chained::<R>(&adapter_input.device, &dims, dtype, c) {
        return compose::lora::backward::<Cube<R, F, I, BT>>(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        );
    }
    let cast = |t: CubeTensor<R>, d: DType| to_dtype::<Cube<R, F, I, BT>>(t, d);
    let empty = |dims: [usize; 2], d: DType| super::empty_like(&hidden, Shape::new(dims), d);
    let g = flat::<R, F, I, BT>(grad_output.clone());
    let g_c = cast(g.clone(), c);
    let adapter_input_grad = wanted.x && !separate || wanted.adapter_x && separate;
    let mut chain = Vec::new();
    let grad_b = wanted.b.then(|| {
        let out = empty([d_out, rank], c);
        chain.push(ChainedProduct {
            lhs: t::<R, F, I, BT>(g_c.clone()),
            rhs: hidden.clone(),
            out: out.clone(),
            alpha: 1.0,
            accumulate: false,
        });
        out
    });
    // u = s·(g·B): the gradient of the rank-r hidden before its scale.
    let u = (wanted.a || adapter_input_grad).then(|| {
        let out = empty([rows, rank], c);
        chain.push(ChainedProduct {
            lhs: g_c.clone(),
            rhs: cast(b.clone(), c),
            out: out.clone(),
            alpha: options.scale as f32,
            accumulate: false,
        });
        out
    });
    let grad_a = match (&u, wanted.a) {
        (Some(u), true) => {
            let out = empty([rank, d_in], c);
            chain.push(ChainedProduct {
                lhs: t::<R, F, I, BT>(u.clone()),
                rhs: cast(flat::<R, F, I, BT>(adapter_input.clone()), c),
                out: out.clone(),
                alpha: 1.0,
                accumulate: false,
            });
            Some(out)
        }
        _ => None,
    };
    // The base path's g·Wᵀ, in `c` when the adapter path's gradient joins it.
    let joined = adapter_input_grad && !separate;
    let base_x = wanted.x.then(|| {
        let out = empty([rows, d_in], if joined { c } else { dtype });
        chain.push(ChainedProduct {
            lhs: g.clone(),
            rhs: t::<R, F, I, BT>(weight.clone()),
            out: out.clone(),
            alpha: 1.0,
            accumulate: false,
        });
        out
    });
    let adapter_grad = match (u, adapter_input_grad) {
        (Some(u), true) => {
            let (out, accumulate) = match (&base_x, joined) {
                (Some(base), true) => (base.clone(), true),
                _ => (empty([rows, d_in], c), false),
            };
            chain.push(ChainedProduct {
                lhs: u,
                rhs: cast(a.clone(), c),
                out: out.clone(),
                alpha: 1.0,
                accumulate,
            });
            (!joined).then_some(out)
        }
        _ => None,
    };
    if let Err(why) = vendor_chain(chain) {
        log::debug!("liger lora_linear backward: the composition on CUDA: {why}");
        return compose::lora::backward::<Cube<R, F, I, BT>>(
            grad_output,
            adapter_input,
            separate,
            weight,
            a,
            b,
            hidden,
            options,
            wanted,
        );
    }
    // `adapter_grad` is the separate input's; joined into `base_x` otherwise.
    let input_grad =
        |t: CubeTensor<R>| compose::lora::unrows::<Cube<R, F, I, BT>>(cast(t, dtype), &x_shape);
    LoraLinearGrads {
        grad_x: base_x.map(input_grad),
        grad_adapter_x: adapter_grad.map(input_grad),
        grad_a: grad_a.map(|t| cast(t, a_dtype)),
        grad_b: grad_b.map(|t| cast(t, b_dtype)),
    }
}
