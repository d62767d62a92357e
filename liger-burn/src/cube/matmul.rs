//! [`FusedOps::fused_matmul`](crate::ops::FusedOps::fused_matmul) on `CubeBackend`:
//! cuBLASLt on the CUDA runtime (cargo feature `cuda`; see [`super::cublaslt`]), hipBLASLt
//! on the ROCm runtime (cargo feature `rocm`; see [`super::hipblaslt`]), Burn's own matmul
//! everywhere else, and for what the vendor library is not used for (dtypes other than
//! f32, f16 and bf16; a library that does not load; a product its heuristic has no
//! algorithm for). A library that does not load is logged once, as a warning.

#[cfg(feature = "cuda")]
use super::cublaslt::Epilogue;
#[cfg(any(feature = "cuda", feature = "rocm"))]
use super::matmul_layout::{NeedsContiguous, contiguous_strides, gemm_layout};
use crate::ops::matmul_shape;
#[cfg(feature = "cuda")]
use crate::ops::validate;
use burn::tensor::{DType, Shape, TensorMetadata, ops::FloatTensorOps};
#[cfg(any(feature = "cuda", feature = "rocm"))]
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
#[cfg(feature = "cuda")]
use cubecl::cuda::CudaRuntime;
#[cfg(feature = "rocm")]
use cubecl::hip::HipRuntime;
use liger_cubecl_kernels::counters::{self, Kernel};

/// How many `fused_matmul` calls of `CubeBackend` ran so far in the caller's counting
/// scope, per path (so tests and benchmarks can prove which path ran; zero unless the
/// kernels' `launch-counters` feature is on). Not part of the stable API.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulCounts {
    /// Products run on a vendor library (cuBLASLt, hipBLASLt).
    pub vendor: u64,
    /// Products run on Burn's own matmul.
    pub backend: u64,
    /// Of the vendor products, those queued on the device thread without the caller
    /// waiting (cuBLASLt; see `cube::cublaslt`).
    pub queued: u64,
    /// Pairs of a 2-D product's gradients run as one chain on the vendor library
    /// (`fused_matmul_backward`; each product also counts in `vendor`).
    pub backward_pairs: u64,
}

/// See [`MatmulCounts`].
#[doc(hidden)]
pub fn matmul_counts() -> MatmulCounts {
    MatmulCounts {
        vendor: counters::get(Kernel::matmul_vendor),
        backend: counters::get(Kernel::matmul_backend),
        queued: counters::get(Kernel::matmul_vendor_queued),
        backward_pairs: counters::get(Kernel::matmul_vendor_backward_pair),
    }
}

/// `lhs [..., m, k] · rhs [..., k, n]`.
pub(crate) fn matmul<R, F, I, BT>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let out_shape = matmul_shape(&lhs.shape(), &rhs.shape());
    let (lhs, rhs) = match vendor::<R>(lhs, rhs, out_shape) {
        Ok(out) => {
            counters::record(Kernel::matmul_vendor);
            return out;
        }
        Err(inputs) => inputs,
    };
    counters::record(Kernel::matmul_backend);
    CubeBackend::<R, F, I, BT>::float_matmul(lhs, rhs)
}

/// Both gradients of `lhs [m, k] · rhs [k, n]` from `grad [m, n]` (see
/// [`FusedOps::fused_matmul_backward`](crate::ops::FusedOps::fused_matmul_backward)): on
/// a vendor library one [`vendor_chain`] of the two products into outputs allocated
/// here, so one ordering against CubeCL's stream for both; else the default composition
/// (two [`matmul`] calls).
pub(crate) fn matmul_backward<R, F, I, BT>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    grad: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    crate::ops::compose::check_matmul_backward(&lhs, &rhs, &grad);
    let (m, k, n) = (
        lhs.meta.shape()[0],
        lhs.meta.shape()[1],
        rhs.meta.shape()[1],
    );
    let dtype = lhs.dtype;
    if m > 0 && k > 0 && n > 0 && chain_supported::<R>(&lhs.device, &[dtype]) {
        let grad_lhs = super::empty_like(&lhs, Shape::new([m, k]), dtype);
        let grad_rhs = super::empty_like(&rhs, Shape::new([k, n]), dtype);
        let chain = vec![
            ChainedProduct {
                lhs: grad.clone(),
                rhs: Cube::<R, F, I, BT>::float_swap_dims(rhs.clone(), 0, 1),
                out: grad_lhs.clone(),
                alpha: 1.0,
                accumulate: false,
            },
            ChainedProduct {
                lhs: Cube::<R, F, I, BT>::float_swap_dims(lhs.clone(), 0, 1),
                rhs: grad.clone(),
                out: grad_rhs.clone(),
                alpha: 1.0,
                accumulate: false,
            },
        ];
        match vendor_chain(chain) {
            Ok(()) => {
                counters::record(Kernel::matmul_vendor_backward_pair);
                return (grad_lhs, grad_rhs);
            }
            Err(why) => log::debug!("liger matmul backward: one product at a time: {why}"),
        }
    }
    crate::ops::compose::matmul_backward::<Cube<R, F, I, BT>>(lhs, rhs, grad)
}

/// `acc + lhs · rhs` for `acc: [m, n]` (f32 or the inputs' dtype), `lhs: [m, k]`,
/// `rhs: [k, n]` (see
/// [`FusedOps::fused_matmul_add`](crate::ops::FusedOps::fused_matmul_add)): on the vendor library
/// into `acc`'s own buffer (BLAS `beta = 1`, the product accumulated and added in f32,
/// rounded once to `acc`'s dtype) when nothing else holds it and it is contiguous;
/// otherwise the default composition (the product rounded to the inputs' dtype, cast and
/// added).
pub(crate) fn matmul_add<R, F, I, BT>(
    acc: CubeTensor<R>,
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (acc, lhs, rhs) = match vendor_add::<R>(acc, lhs, rhs) {
        Ok(out) => {
            counters::record(Kernel::matmul_vendor);
            return out;
        }
        Err(inputs) => inputs,
    };
    crate::ops::compose::matmul_add::<CubeBackend<R, F, I, BT>>(acc, lhs, rhs)
}

/// `value` as type `To` when it is one (`R` is the runtime `To` is written for), or back.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn same_type<From: 'static, To: 'static>(value: From) -> Result<To, From> {
    let boxed: Box<dyn std::any::Any> = Box::new(value);
    match boxed.downcast::<To>() {
        Ok(to) => Ok(*to),
        Err(boxed) => Err(*boxed.downcast::<From>().expect("the value as it was boxed")),
    }
}

/// `value` as type `To`, which it is (a runtime's tensors converted back after
/// [`same_type`] matched them).
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn known_type<From: 'static, To: 'static>(value: From) -> To {
    same_type(value).unwrap_or_else(|_| panic!("a value of the runtime it was matched as"))
}

/// `run` on `operands` when `R` is the runtime `S` (a vendor library's), or the operands
/// back: for another runtime, or when `run` gives them back (the library declined).
#[cfg(any(feature = "cuda", feature = "rocm"))]
#[allow(clippy::result_large_err)]
fn on_runtime<R: CubeRuntime, S: CubeRuntime, const N: usize>(
    operands: [CubeTensor<R>; N],
    run: impl FnOnce([CubeTensor<S>; N]) -> Result<CubeTensor<S>, [CubeTensor<S>; N]>,
) -> Result<CubeTensor<R>, [CubeTensor<R>; N]> {
    match same_type::<_, [CubeTensor<S>; N]>(operands) {
        Ok(operands) => run(operands).map(known_type).map_err(known_type),
        Err(operands) => Err(operands),
    }
}

/// [`matmul_add`] on the vendor library in place, or the operands back.
#[allow(clippy::result_large_err, clippy::type_complexity)]
fn vendor_add<R: CubeRuntime>(
    acc: CubeTensor<R>,
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    let writable = acc.can_mut()
        && (acc.dtype == DType::F32 || acc.dtype == lhs.dtype)
        && acc.meta.strides().to_vec() == contiguous_strides(acc.meta.shape());
    let operands = [acc, lhs, rhs];
    #[cfg(feature = "cuda")]
    let operands = match on_runtime::<R, CudaRuntime, 3>(operands, |[acc, lhs, rhs]| {
        if !writable {
            return Err([acc, lhs, rhs]);
        }
        let out_shape = acc.shape();
        cuda_product(lhs, rhs, out_shape, None, Some(acc), Epilogue::None).map_err(
            |(why, lhs, rhs, acc)| {
                log::debug!("liger matmul_add: Burn's matmul on CUDA: {why}");
                [acc.expect("the accumulator comes back"), lhs, rhs]
            },
        )
    }) {
        Ok(out) => return Ok(out),
        Err(operands) => operands,
    };
    #[cfg(feature = "rocm")]
    let operands = match on_runtime::<R, HipRuntime, 3>(operands, |[acc, lhs, rhs]| {
        if !writable {
            return Err([acc, lhs, rhs]);
        }
        let out_shape = acc.shape();
        rocm_product(lhs, rhs, out_shape, Some(acc)).map_err(|(why, lhs, rhs, acc)| {
            log::debug!("liger matmul_add: Burn's matmul on ROCm: {why}");
            [acc.expect("the accumulator comes back"), lhs, rhs]
        })
    }) {
        Ok(out) => return Ok(out),
        Err(operands) => operands,
    };
    let [acc, lhs, rhs] = operands;
    Err((acc, lhs, rhs))
}

/// Whether [`matmul`] runs `dtype` products on a vendor library on `device`.
pub(crate) fn uses_vendor_library<R: CubeRuntime>(device: &R::Device, dtype: DType) -> bool {
    let device = device as &dyn std::any::Any;
    #[cfg(feature = "cuda")]
    if let Some(device) = device.downcast_ref::<cubecl::cuda::CudaDevice>() {
        return super::cublaslt::data_type(dtype).is_ok()
            && super::cublaslt::device_support(device).is_ok();
    }
    #[cfg(feature = "rocm")]
    if let Some(device) = device.downcast_ref::<cubecl::hip::AmdDevice>() {
        return super::hipblaslt::data_type(dtype).is_ok()
            && super::hipblaslt::device_support(device).is_ok();
    }
    let _ = (device, dtype);
    false
}

/// The product on the vendor library, or the inputs back for Burn's matmul (a library
/// that failed to load is logged once, as a warning, when the device's engine is set up;
/// per-product reasons at debug level).
#[allow(clippy::result_large_err)]
fn vendor<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    out_shape: Shape,
) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>)> {
    let inputs = [lhs, rhs];
    #[cfg(feature = "cuda")]
    let inputs = match on_runtime::<R, CudaRuntime, 2>(inputs, |[lhs, rhs]| {
        cuda_product(lhs, rhs, out_shape.clone(), None, None, Epilogue::None).map_err(
            |(why, lhs, rhs, _)| {
                log::debug!("liger matmul: Burn's matmul on CUDA: {why}");
                [lhs, rhs]
            },
        )
    }) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    #[cfg(feature = "rocm")]
    let inputs = match on_runtime::<R, HipRuntime, 2>(inputs, |[lhs, rhs]| {
        rocm_product(lhs, rhs, out_shape.clone(), None).map_err(|(why, lhs, rhs, _)| {
            log::debug!("liger matmul: Burn's matmul on ROCm: {why}");
            [lhs, rhs]
        })
    }) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    let _ = out_shape;
    let [lhs, rhs] = inputs;
    Err((lhs, rhs))
}

/// Why a ROCm product went back to Burn's matmul, with its inputs (and the accumulator).
#[cfg(feature = "rocm")]
type RocmDeclined = (
    super::hipblaslt::Unavailable,
    CubeTensor<HipRuntime>,
    CubeTensor<HipRuntime>,
    Option<CubeTensor<HipRuntime>>,
);

/// The product on hipBLASLt: into a new tensor, or added to `acc` in place (`acc`:
/// contiguous, f32 or the inputs' dtype, `out_shape`, nothing else holding its buffer).
#[cfg(feature = "rocm")]
#[allow(clippy::result_large_err)]
fn rocm_product(
    lhs: CubeTensor<HipRuntime>,
    rhs: CubeTensor<HipRuntime>,
    out_shape: Shape,
    acc: Option<CubeTensor<HipRuntime>>,
) -> Result<CubeTensor<HipRuntime>, RocmDeclined> {
    use super::hipblaslt::{self, Product};
    let dtype = lhs.dtype;
    if let Err(why) = hipblaslt::data_type(dtype) {
        return Err((why, lhs, rhs, acc));
    }
    let device = lhs.device.clone();
    if let Err(why) = hipblaslt::device_support(&device) {
        return Err((why, lhs, rhs, acc));
    }
    let out_dims = out_shape.to_vec();
    if out_shape.num_elements() == 0 || lhs.meta.shape()[out_dims.len() - 1] == 0 {
        // Nothing to multiply: an empty product, or zeros (k = 0).
        return Ok(acc.unwrap_or_else(|| {
            burn_cubecl::ops::numeric::zeros_client(lhs.client.clone(), device, out_shape, dtype)
        }));
    }
    let accumulate = acc.is_some();
    let out = acc.unwrap_or_else(|| super::empty_like(&lhs, out_shape, dtype));
    let (lhs, rhs, layout) = blas_operands(lhs, rhs, &out_dims);
    let product = Product {
        lhs: &lhs,
        rhs: &rhs,
        out: &out,
        layout: &layout,
        accumulate,
        alpha: 1.0,
    };
    match hipblaslt::run_chain(&device, &[product]) {
        Ok(()) => Ok(out),
        Err(why) => Err((why, lhs, rhs, accumulate.then_some(out))),
    }
}

/// Why a CUDA product went back to Burn's matmul, with its inputs (and the accumulator).
#[cfg(feature = "cuda")]
pub(crate) type Declined = (
    super::cublaslt::Unavailable,
    CubeTensor<cubecl::cuda::CudaRuntime>,
    CubeTensor<cubecl::cuda::CudaRuntime>,
    Option<CubeTensor<cubecl::cuda::CudaRuntime>>,
);

/// The product on cuBLASLt with `ordering` (`None`: the device's default) and `epilogue`:
/// into a new tensor, or added to `acc` in place (`acc`: contiguous, f32 or the inputs'
/// dtype, `out_shape`, nothing else holding its buffer). An empty product with an
/// epilogue is declined (its vector would be left unwritten).
#[cfg(feature = "cuda")]
#[allow(clippy::result_large_err)]
pub(crate) fn cuda_product(
    lhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    rhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    out_shape: Shape,
    ordering: Option<super::cublaslt::MatmulOrdering>,
    acc: Option<CubeTensor<cubecl::cuda::CudaRuntime>>,
    epilogue: Epilogue<'_>,
) -> Result<CubeTensor<cubecl::cuda::CudaRuntime>, Declined> {
    use super::cublaslt;
    let dtype = lhs.dtype;
    if let Err(why) = cublaslt::data_type(dtype) {
        return Err((why, lhs, rhs, acc));
    }
    let device = lhs.device.clone();
    if let Err(why) = cublaslt::device_support(&device) {
        return Err((why, lhs, rhs, acc));
    }
    let out_dims = out_shape.to_vec();
    let empty = out_shape.num_elements() == 0 || lhs.meta.shape()[out_dims.len() - 1] == 0;
    if empty && !matches!(epilogue, Epilogue::None) {
        let why = cublaslt::Unavailable::NoAlgorithm("an empty product with an epilogue".into());
        return Err((why, lhs, rhs, acc));
    }
    if let Some(acc) = acc {
        if empty {
            return Ok(acc); // Nothing to add.
        }
        return product_into(lhs, rhs, &out_dims, ordering, acc, true, epilogue);
    }
    if empty {
        // Nothing to multiply: an empty product, or zeros (k = 0).
        return Ok(burn_cubecl::ops::numeric::zeros_client(
            lhs.client.clone(),
            device,
            out_shape,
            dtype,
        ));
    }
    let out = super::empty_like(&lhs, out_shape, dtype);
    product_into(lhs, rhs, &out_dims, ordering, out, false, epilogue)
}

/// The operands of a vendor product into `out_dims` and their layout: an operand whose
/// strides the BLAS cannot read is made contiguous first (a launch on CubeCL's stream).
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn blas_operands<R: CubeRuntime>(
    mut lhs: CubeTensor<R>,
    mut rhs: CubeTensor<R>,
    out_dims: &[usize],
) -> (
    CubeTensor<R>,
    CubeTensor<R>,
    super::matmul_layout::GemmLayout,
) {
    loop {
        let l = (lhs.meta.shape().to_vec(), lhs.meta.strides().to_vec());
        let r = (rhs.meta.shape().to_vec(), rhs.meta.strides().to_vec());
        match gemm_layout((&l.0, &l.1), (&r.0, &r.1), out_dims) {
            Ok(layout) => return (lhs, rhs, layout),
            Err(NeedsContiguous {
                lhs: fix_l,
                rhs: fix_r,
            }) => {
                let dense = |t: &CubeTensor<_>| {
                    t.meta.strides().to_vec() == contiguous_strides(t.meta.shape())
                };
                // A contiguous operand always has a layout (see `matmul_layout`).
                assert!(
                    (fix_l && !dense(&lhs)) || (fix_r && !dense(&rhs)),
                    "matmul: no cuBLASLt layout for contiguous operands {l:?} x {r:?}"
                );
                if fix_l {
                    lhs = into_contiguous(lhs);
                }
                if fix_r {
                    rhs = into_contiguous(rhs);
                }
            }
        }
    }
}

/// [`cuda_product`]'s launch: `out = lhs · rhs`, or `out += lhs · rhs` when `accumulate`.
#[cfg(feature = "cuda")]
#[allow(clippy::result_large_err)]
fn product_into(
    lhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    rhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    out_dims: &[usize],
    ordering: Option<super::cublaslt::MatmulOrdering>,
    out: CubeTensor<cubecl::cuda::CudaRuntime>,
    accumulate: bool,
    epilogue: Epilogue<'_>,
) -> Result<CubeTensor<cubecl::cuda::CudaRuntime>, Declined> {
    use super::cublaslt::{self, Product};
    let device = lhs.device.clone();
    let (lhs, rhs, layout) = blas_operands(lhs, rhs, out_dims);
    let product = Product {
        lhs: &lhs,
        rhs: &rhs,
        out: &out,
        layout: &layout,
        accumulate,
        alpha: 1.0,
        epilogue,
    };
    match cublaslt::run(&device, product, ordering) {
        Ok(_) => Ok(out),
        Err(why) => Err((why, lhs, rhs, accumulate.then_some(out))),
    }
}

/// One product of a [`vendor_chain`]: `out = alpha·(lhs · rhs)`, or
/// `out += alpha·(lhs · rhs)` when `accumulate` (summed in f32, rounded once to `out`'s
/// dtype). `lhs: [m, k]` and `rhs: [k, n]` of one dtype, any strides; `out: [m, n]`
/// contiguous, in their dtype or f32, allocated by the caller and held by nothing else.
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) struct ChainedProduct<R: CubeRuntime> {
    pub lhs: CubeTensor<R>,
    pub rhs: CubeTensor<R>,
    pub out: CubeTensor<R>,
    pub alpha: f32,
    pub accumulate: bool,
}

/// Whether [`vendor_chain`] runs products of each of `dtypes` on `device`.
pub(crate) fn chain_supported<R: CubeRuntime>(device: &R::Device, dtypes: &[DType]) -> bool {
    dtypes.iter().all(|d| uses_vendor_library::<R>(device, *d))
}

/// `products` in order on the vendor library under one ordering against CubeCL's stream
/// (cuBLASLt's device-side protocol, or hipBLASLt's host synchronization), so a later
/// product may read an earlier one's output: one ordering for the whole chain instead of
/// one per product. `Err` says why it did not run (nothing was launched but operands made
/// contiguous).
pub(crate) fn vendor_chain<R: CubeRuntime>(products: Vec<ChainedProduct<R>>) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    let products = match same_type::<_, Vec<ChainedProduct<CudaRuntime>>>(products) {
        Ok(cuda) => {
            return run_laid_out(cuda, |device, chain| {
                use super::cublaslt::{self, Epilogue, Product};
                let chain = chain
                    .iter()
                    .map(|p| Product {
                        lhs: &p.lhs,
                        rhs: &p.rhs,
                        out: &p.out,
                        layout: &p.layout,
                        accumulate: p.accumulate,
                        alpha: p.alpha,
                        epilogue: Epilogue::None,
                    })
                    .collect::<Vec<_>>();
                cublaslt::run_chain(device, &chain, None).map(|_| ())
            });
        }
        Err(other) => other,
    };
    #[cfg(feature = "rocm")]
    let products = match same_type::<_, Vec<ChainedProduct<HipRuntime>>>(products) {
        Ok(rocm) => {
            return run_laid_out(rocm, |device, chain| {
                use super::hipblaslt::{self, Product};
                let chain = chain
                    .iter()
                    .map(|p| Product {
                        lhs: &p.lhs,
                        rhs: &p.rhs,
                        out: &p.out,
                        layout: &p.layout,
                        accumulate: p.accumulate,
                        alpha: p.alpha,
                    })
                    .collect::<Vec<_>>();
                hipblaslt::run_chain(device, &chain)
            });
        }
        Err(other) => other,
    };
    let _ = products;
    Err("no vendor library for this runtime in this build".into())
}

/// A [`ChainedProduct`] with its operands laid out for the BLAS.
#[cfg(any(feature = "cuda", feature = "rocm"))]
struct LaidOut<R: CubeRuntime> {
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    out: CubeTensor<R>,
    layout: super::matmul_layout::GemmLayout,
    alpha: f32,
    accumulate: bool,
}

/// Lays `products` out and hands them to `run` (the library's chain), counting them as
/// vendor products when it ran them.
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn run_laid_out<R: CubeRuntime, E: core::fmt::Display>(
    products: Vec<ChainedProduct<R>>,
    run: impl FnOnce(&R::Device, &[LaidOut<R>]) -> Result<(), E>,
) -> Result<(), String> {
    let Some(device) = products.first().map(|p| p.out.device.clone()) else {
        return Ok(());
    };
    let laid_out = products
        .into_iter()
        .map(|p| {
            let dims = p.out.meta.shape().to_vec();
            let (lhs, rhs, layout) = blas_operands(p.lhs, p.rhs, &dims);
            LaidOut {
                lhs,
                rhs,
                out: p.out,
                layout,
                alpha: p.alpha,
                accumulate: p.accumulate,
            }
        })
        .collect::<Vec<_>>();
    run(&device, &laid_out).map_err(|why| why.to_string())?;
    for _ in 0..laid_out.len() {
        counters::record(Kernel::matmul_vendor);
    }
    Ok(())
}

/// `lhs [..., m, k] · rhs [..., k, n]` on cuBLASLt with an explicit `ordering` (`None`:
/// the device's default), for benchmarks and tests that compare the protocols; same
/// semantics as [`FusedOps::fused_matmul`](crate::ops::FusedOps::fused_matmul). `Err`
/// says why cuBLASLt was not used (nothing was launched).
#[cfg(feature = "cuda")]
pub fn cublaslt_matmul(
    lhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    rhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    ordering: Option<super::cublaslt::MatmulOrdering>,
) -> Result<CubeTensor<cubecl::cuda::CudaRuntime>, super::cublaslt::Unavailable> {
    let out_shape = match validate::matmul_tensors("matmul", &lhs, &rhs) {
        Ok(shape) => shape,
        Err(e) => panic!("{e}"),
    };
    let out = cuda_product(lhs, rhs, out_shape, ordering, None, Epilogue::None)
        .map_err(|(why, ..)| why)?;
    counters::record(Kernel::matmul_vendor);
    Ok(out)
}

/// `repeats` identical products `lhs · rhs` back to back on cuBLASLt between one host
/// synchronization before and one after (no per-call ordering): the baseline per-call
/// cost the ordering protocols add to, in seconds per call. For benchmarks; not part of
/// the stable API.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn cublaslt_repeated_products(
    lhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    rhs: CubeTensor<cubecl::cuda::CudaRuntime>,
    repeats: usize,
) -> Result<f64, super::cublaslt::Unavailable> {
    use super::cublaslt::{self, Product};
    let out_shape = match validate::matmul_tensors("matmul", &lhs, &rhs) {
        Ok(shape) => shape,
        Err(e) => panic!("{e}"),
    };
    cublaslt::data_type(lhs.dtype)?;
    let dims = out_shape.to_vec();
    let l = (lhs.meta.shape().to_vec(), lhs.meta.strides().to_vec());
    let r = (rhs.meta.shape().to_vec(), rhs.meta.strides().to_vec());
    let layout = gemm_layout((&l.0, &l.1), (&r.0, &r.1), &dims).unwrap_or_else(|_| {
        panic!("cublaslt_repeated_products: strides the BLAS cannot read: {l:?} x {r:?}")
    });
    let out = super::empty_like(&lhs, out_shape, lhs.dtype);
    let product = Product {
        lhs: &lhs,
        rhs: &rhs,
        out: &out,
        layout: &layout,
        accumulate: false,
        alpha: 1.0,
        epilogue: cublaslt::Epilogue::None,
    };
    cublaslt::run_repeated(&lhs.device, product, repeats)
}
