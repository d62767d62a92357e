//! The tensor-core variant of the flash kernels expanded (the `#[cube]` code run into CubeCL
//! IR, on the default wgpu adapter's client) and compiled to CUDA C++ by CubeCL's own CUDA
//! compiler, on any machine: a device without `cmma` (lavapipe in CI) cannot run them, but
//! this catches expansion panics and checks the generated `wmma` calls. `LIGER_DUMP_CUDA=DIR` writes the sources there for
//! review (a test-only switch, not a library knob).

use super::*;
use cubecl::Compiler as _;
use cubecl::prelude::{AddressType, KernelLauncher, KernelSettings};
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};

type R = WgpuRuntime;

fn cuda_source(def: cubecl::prelude::KernelDefinition) -> String {
    let mut compiler = CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default();
    let kernel = compiler
        .compile(
            def,
            // As the CUDA runtime sets them.
            &CompilationOptions {
                supports_features: CppSupportedFeatures {
                    fast_math: true,
                    ..Default::default()
                },
                ..Default::default()
            },
            cubecl::prelude::ExecutionMode::Unchecked,
            AddressType::U32.unsigned_type(),
        )
        .expect("the CUDA compiler accepts the kernel");
    format!("{kernel}")
}

fn dump(name: &str, source: &str) {
    if let Ok(dir) = std::env::var("LIGER_DUMP_CUDA") {
        std::fs::write(format!("{dir}/{name}.cu"), source).unwrap();
    }
}

fn settings(g: &FlashGeometry) -> KernelSettings {
    KernelSettings::default()
        .cube_dim(CubeDim::new_1d(g.units))
        .address_type(AddressType::U32)
}

fn check_source(name: &str, source: &str) {
    dump(name, source);
    assert!(source.contains("wmma"), "{name}: no wmma call:\n{source}");
    assert!(
        source.contains("mma_sync"),
        "{name}: no mma_sync:\n{source}"
    );
    // `fast_exp`: the hardware exponential, not libm's.
    assert!(source.contains("__expf("), "{name}: no __expf:\n{source}");
    assert!(
        !source.contains(" exp("),
        "{name}: an accurate exp:\n{source}"
    );
}

#[test]
fn tensor_core_kernels_compile_to_cuda() {
    let client = R::client(&WgpuDevice::DefaultDevice);
    let bf16: StorageType = ElemType::Float(FloatKind::BF16).into();
    let n = 8usize;
    let empty = || client.empty(64);
    let arr = |h: &Handle| unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), 4) };
    for head_dim in [64usize, 128] {
        for mask in [
            AttentionMask {
                causal: true,
                window: false,
                documents: false,
            },
            AttentionMask {
                causal: true,
                window: true,
                documents: true,
            },
        ] {
            let g = flash_geometry(
                FlashKernel::Forward,
                FlashVariant::TensorCores,
                head_dim,
                n,
                16,
            );
            let g = FlashGeometry {
                fast_exp: true,
                ..g
            };
            let s = settings(&g);
            let mut launcher = KernelLauncher::<R>::new(s.clone());
            launcher.with_scope(|scope| {
                scope.device_properties(client.properties());
                scope.register_size::<DynamicSize<flash_forward_kernel::_N>>(n);
                scope.register_type::<DynamicScalar<flash_forward_kernel::_F>>(bf16);
            });
            let h = empty();
            macro_rules! reg {
                ($t:ty, $v:expr) => {
                    <$t as LaunchArg>::register($v, &mut launcher)
                };
            }
            type FV = Array<Vector<flash_forward_kernel::F, flash_forward_kernel::N>>;
            let kernel = flash_forward_kernel::FlashForwardKernel::<R>::new(
                s,
                client.clone(),
                reg!(FV, arr(&h)),
                reg!(FV, arr(&h)),
                reg!(FV, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(FV, arr(&h)),
                reg!(Array<f32>, arr(&h)),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(f32, 1.0f32),
                n,
                g,
                mask,
                bf16,
            );
            let source = cuda_source(kernel.define());
            check_source(&format!("forward_d{head_dim}_{}", mask.documents), &source);

            let g = flash_geometry(
                FlashKernel::BackwardKv,
                FlashVariant::TensorCores,
                head_dim,
                n,
                16,
            );
            let g = FlashGeometry {
                fast_exp: true,
                ..g
            };
            let s = settings(&g);
            let mut launcher = KernelLauncher::<R>::new(s.clone());
            launcher.with_scope(|scope| {
                scope.device_properties(client.properties());
                scope.register_size::<DynamicSize<flash_backward_kv_kernel::_N>>(n);
                scope.register_type::<DynamicScalar<flash_backward_kv_kernel::_F>>(bf16);
            });
            type KV = Array<Vector<flash_backward_kv_kernel::F, flash_backward_kv_kernel::N>>;
            let kernel = flash_backward_kv_kernel::FlashBackwardKvKernel::<R>::new(
                s,
                client.clone(),
                reg!(KV, arr(&h)),
                reg!(KV, arr(&h)),
                reg!(KV, arr(&h)),
                reg!(KV, arr(&h)),
                reg!(Array<f32>, arr(&h)),
                reg!(Array<f32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(KV, arr(&h)),
                reg!(KV, arr(&h)),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(f32, 1.0f32),
                n,
                g,
                mask,
                bf16,
            );
            let source = cuda_source(kernel.define());
            check_source(
                &format!("backward_kv_d{head_dim}_{}", mask.documents),
                &source,
            );

            let g = flash_geometry(
                FlashKernel::BackwardQ,
                FlashVariant::TensorCores,
                head_dim,
                n,
                16,
            );
            let g = FlashGeometry {
                fast_exp: true,
                ..g
            };
            let s = settings(&g);
            let mut launcher = KernelLauncher::<R>::new(s.clone());
            launcher.with_scope(|scope| {
                scope.device_properties(client.properties());
                scope.register_size::<DynamicSize<flash_backward_q_kernel::_N>>(n);
                scope.register_type::<DynamicScalar<flash_backward_q_kernel::_F>>(bf16);
            });
            type QV = Array<Vector<flash_backward_q_kernel::F, flash_backward_q_kernel::N>>;
            let kernel = flash_backward_q_kernel::FlashBackwardQKernel::<R>::new(
                s,
                client.clone(),
                reg!(QV, arr(&h)),
                reg!(QV, arr(&h)),
                reg!(QV, arr(&h)),
                reg!(QV, arr(&h)),
                reg!(Array<f32>, arr(&h)),
                reg!(Array<f32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(Array<i32>, arr(&h)),
                reg!(QV, arr(&h)),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(u32, 1u32),
                reg!(f32, 1.0f32),
                n,
                g,
                mask,
                bf16,
            );
            let source = cuda_source(kernel.define());
            check_source(
                &format!("backward_q_d{head_dim}_{}", mask.documents),
                &source,
            );
        }
    }
}

#[test]
fn document_ranges_kernel_compiles_to_cuda() {
    let client = R::client(&WgpuDevice::DefaultDevice);
    let s = KernelSettings::default()
        .cube_dim(CubeDim::new_1d(128))
        .address_type(AddressType::U32);
    let mut launcher = KernelLauncher::<R>::new(s.clone());
    launcher.with_scope(|scope| scope.device_properties(client.properties()));
    let h = client.empty(64);
    let arr = |h: &Handle| unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), 4) };
    macro_rules! reg {
        ($t:ty, $v:expr) => {
            <$t as LaunchArg>::register($v, &mut launcher)
        };
    }
    let kernel = document_ranges_kernel::DocumentRangesKernel::<R>::new(
        s,
        client.clone(),
        reg!(Array<i32>, arr(&h)),
        reg!(Array<i32>, arr(&h)),
        reg!(u32, 1u32),
        reg!(u32, 1u32),
        reg!(u32, 1u32),
        reg!(u32, 1u32),
    );
    let source = cuda_source(kernel.define());
    dump("document_ranges", &source);
    assert!(source.contains("document_ranges_kernel"), "{source}");
}

/// CUDA's register layouts for manual products, as the CUDA runtime declares them (the
/// wgpu client expanding the kernel here has none).
fn cuda_mma_properties() -> cubecl::ir::TargetProperties {
    use cubecl::ir::{ContiguousElements, MatrixLayout, MmaProperties, TargetProperties};
    TargetProperties {
        mma: MmaProperties {
            register_size_bits: 32,
            const_plane_size: 32,
            register_layout_a: MatrixLayout::RowMajor,
            register_layout_b: MatrixLayout::ColMajor,
            register_layout_acc: MatrixLayout::RowMajor,
            register_duplication_a: 1,
            register_duplication_b: 1,
            register_duplication_acc: 1,
            contiguous_elements: ContiguousElements::new(
                cubecl_cpp::cuda::mma::contiguous_elements_cuda,
            ),
        },
    }
}

#[test]
fn register_mma_forward_compiles_to_cuda() {
    let client = R::client(&WgpuDevice::DefaultDevice);
    let n = 8usize;
    let h = client.empty(64);
    let arr = |h: &Handle| unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), 4) };
    for (dtype, kind) in [(FloatKind::BF16, "bf16"), (FloatKind::F16, "f16")] {
        let elem: StorageType = ElemType::Float(dtype).into();
        for head_dim in [64usize, 128] {
            for mask in [
                AttentionMask {
                    causal: true,
                    window: false,
                    documents: false,
                },
                AttentionMask {
                    causal: true,
                    window: true,
                    documents: true,
                },
            ] {
                let g = FlashGeometry {
                    fast_exp: true,
                    ..flash_geometry(FlashKernel::Forward, FlashVariant::Mma, head_dim, n, 16)
                };
                assert!(g.mma && g.own_rows == 16 * g.planes);
                let s = settings(&g);
                let mut launcher = KernelLauncher::<R>::new(s.clone());
                launcher.with_scope(|scope| {
                    scope.device_properties(client.properties());
                    scope.runtime_properties = std::rc::Rc::new(cuda_mma_properties());
                    scope.register_size::<DynamicSize<mma::flash_forward_mma_kernel::_N>>(n);
                    scope.register_type::<DynamicScalar<mma::flash_forward_mma_kernel::_F>>(elem);
                });
                macro_rules! reg {
                    ($t:ty, $v:expr) => {
                        <$t as LaunchArg>::register($v, &mut launcher)
                    };
                }
                type FV = Array<
                    Vector<mma::flash_forward_mma_kernel::F, mma::flash_forward_mma_kernel::N>,
                >;
                let kernel = mma::flash_forward_mma_kernel::FlashForwardMmaKernel::<R>::new(
                    s,
                    client.clone(),
                    reg!(FV, arr(&h)),
                    reg!(FV, arr(&h)),
                    reg!(FV, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(FV, arr(&h)),
                    reg!(Array<f32>, arr(&h)),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(f32, 1.0f32),
                    n,
                    g,
                    mask,
                    elem,
                );
                let source = cuda_source(kernel.define());
                let name = format!("forward_mma_{kind}_d{head_dim}_{}", mask.documents);
                dump(&name, &source);
                assert!(
                    source.contains("mma.sync.aligned.m16n8k16"),
                    "{name}: no m16n8k16 mma.sync:\n{source}"
                );
                assert!(!source.contains("wmma"), "{name}: a wmma call:\n{source}");
                assert!(source.contains("__expf("), "{name}: no __expf:\n{source}");

                let g = FlashGeometry {
                    fast_exp: true,
                    ..flash_geometry(FlashKernel::BackwardQ, FlashVariant::Mma, head_dim, n, 16)
                };
                assert!(g.mma);
                let s = settings(&g);
                let mut launcher = KernelLauncher::<R>::new(s.clone());
                launcher.with_scope(|scope| {
                    scope.device_properties(client.properties());
                    scope.runtime_properties = std::rc::Rc::new(cuda_mma_properties());
                    scope.register_size::<DynamicSize<mma::flash_backward_q_mma_kernel::_N>>(n);
                    scope
                        .register_type::<DynamicScalar<mma::flash_backward_q_mma_kernel::_F>>(elem);
                });
                macro_rules! reg {
                    ($t:ty, $v:expr) => {
                        <$t as LaunchArg>::register($v, &mut launcher)
                    };
                }
                type QV = Array<
                    Vector<
                        mma::flash_backward_q_mma_kernel::F,
                        mma::flash_backward_q_mma_kernel::N,
                    >,
                >;
                let kernel = mma::flash_backward_q_mma_kernel::FlashBackwardQMmaKernel::<R>::new(
                    s,
                    client.clone(),
                    reg!(QV, arr(&h)),
                    reg!(QV, arr(&h)),
                    reg!(QV, arr(&h)),
                    reg!(QV, arr(&h)),
                    reg!(Array<f32>, arr(&h)),
                    reg!(Array<f32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(QV, arr(&h)),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(f32, 1.0f32),
                    n,
                    g,
                    mask,
                    elem,
                );
                let source = cuda_source(kernel.define());
                let name = format!("backward_q_mma_{kind}_d{head_dim}_{}", mask.documents);
                dump(&name, &source);
                assert!(
                    source.contains("mma.sync.aligned.m16n8k16"),
                    "{name}: no m16n8k16 mma.sync:\n{source}"
                );
                assert!(!source.contains("wmma"), "{name}: a wmma call:\n{source}");

                // Both output paths: whole dK/dV, and f32 parts of a split group.
                let parts = if mask.documents { 3u32 } else { 1 };
                let g = FlashGeometry {
                    fast_exp: true,
                    ..flash_geometry(FlashKernel::BackwardKv, FlashVariant::Mma, head_dim, n, 16)
                };
                assert!(g.mma);
                let s = settings(&g);
                let mut launcher = KernelLauncher::<R>::new(s.clone());
                launcher.with_scope(|scope| {
                    scope.device_properties(client.properties());
                    scope.runtime_properties = std::rc::Rc::new(cuda_mma_properties());
                    scope.register_size::<DynamicSize<mma::flash_backward_kv_mma_kernel::_N>>(n);
                    scope.register_type::<DynamicScalar<mma::flash_backward_kv_mma_kernel::_F>>(
                        elem,
                    );
                });
                macro_rules! reg {
                    ($t:ty, $v:expr) => {
                        <$t as LaunchArg>::register($v, &mut launcher)
                    };
                }
                type KV = Array<
                    Vector<
                        mma::flash_backward_kv_mma_kernel::F,
                        mma::flash_backward_kv_mma_kernel::N,
                    >,
                >;
                let kernel = mma::flash_backward_kv_mma_kernel::FlashBackwardKvMmaKernel::<R>::new(
                    s,
                    client.clone(),
                    reg!(KV, arr(&h)),
                    reg!(KV, arr(&h)),
                    reg!(KV, arr(&h)),
                    reg!(KV, arr(&h)),
                    reg!(Array<f32>, arr(&h)),
                    reg!(Array<f32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(Array<i32>, arr(&h)),
                    reg!(KV, arr(&h)),
                    reg!(KV, arr(&h)),
                    reg!(Array<Vector<f32, Const<2>>>, arr(&h)),
                    reg!(Array<Vector<f32, Const<2>>>, arr(&h)),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(u32, 1u32),
                    reg!(f32, 1.0f32),
                    reg!(u32, 1u32),
                    n,
                    g,
                    mask,
                    parts,
                    elem,
                );
                let source = cuda_source(kernel.define());
                let name = format!(
                    "backward_kv_mma_{kind}_d{head_dim}_{}_parts{parts}",
                    mask.documents
                );
                dump(&name, &source);
                assert!(
                    source.contains("mma.sync.aligned.m16n8k16"),
                    "{name}: no m16n8k16 mma.sync:\n{source}"
                );
                assert!(!source.contains("wmma"), "{name}: a wmma call:\n{source}");
            }
        }
    }
}
