//! The tensor-core variants of the flash kernels (`cmma` and register-level `mma.sync`)
//! expanded (the `#[cube]` code run into CubeCL IR, on the default wgpu adapter's client)
//! and compiled to CUDA C++ by CubeCL's own CUDA compiler ([`crate::cuda_source`]), on any
//! machine: a device without tensor cores (lavapipe in CI) cannot run them, but this
//! catches expansion panics and checks the generated products.

use super::*;
use crate::cuda_source::{cuda_source, dump};
use crate::patched_launch::SourcePatch;
use cubecl::prelude::{AddressType, KernelLauncher, KernelSettings};
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

type R = WgpuRuntime;

/// As a launch sets them: the register-mma kernels declare 64-bit addresses, the others
/// take the 32-bit default.
fn settings(g: &FlashGeometry, address: AddressType) -> KernelSettings {
    KernelSettings::default()
        .cube_dim(CubeDim::new_1d(g.units))
        .address_type(address)
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

/// A placeholder array for kernel arguments (only the code is wanted).
fn placeholder(h: &Handle) -> ArrayArg<R> {
    // Safety: the kernels are expanded and compiled, never launched.
    unsafe { ArrayArg::<R>::from_raw_parts(h.clone(), 4) }
}

/// The CUDA source of flash kernel `$module::$kernel` for geometry `$g`, element type
/// `$elem` and vectors of `$n`; `$mma` gives the scope CUDA's manual-product layouts.
/// Arguments are named by kind: `io` (the input-dtype arrays), `f32s`, `i32s`, `pairs`
/// (f32 pairs), `u32`, `f32`; then the comptime arguments after the geometry.
macro_rules! flash_source {
    (@arg $launcher:ident $h:ident $m:ident io) => {
        <Array<Vector<$m::F, $m::N>> as LaunchArg>::register(placeholder(&$h), &mut $launcher)
    };
    (@arg $launcher:ident $h:ident $m:ident f32s) => {
        <Array<f32> as LaunchArg>::register(placeholder(&$h), &mut $launcher)
    };
    (@arg $launcher:ident $h:ident $m:ident i32s) => {
        <Array<i32> as LaunchArg>::register(placeholder(&$h), &mut $launcher)
    };
    (@arg $launcher:ident $h:ident $m:ident pairs) => {
        <Array<Vector<f32, Const<2>>> as LaunchArg>::register(placeholder(&$h), &mut $launcher)
    };
    (@arg $launcher:ident $h:ident $m:ident atomic_pairs) => {
        <Array<Atomic<Vector<f32, Const<2>>>> as LaunchArg>::register(
            placeholder(&$h),
            &mut $launcher,
        )
    };
    (@arg $launcher:ident $h:ident $m:ident u32) => {
        <u32 as LaunchArg>::register(1u32, &mut $launcher)
    };
    (@arg $launcher:ident $h:ident $m:ident f32) => {
        <f32 as LaunchArg>::register(1.0f32, &mut $launcher)
    };
    ($client:ident, $m:ident :: $kernel:ident, $g:expr, $elem:expr, $n:expr, $mma:expr,
     [$($kind:ident),* $(,)?], [$($comptime:expr),* $(,)?]) => {{
        let g: FlashGeometry = $g;
        let s = settings(&g, if $mma { AddressType::U64 } else { AddressType::U32 });
        let h = $client.empty(64);
        let mut launcher = KernelLauncher::<R>::new(s.clone());
        launcher.with_scope(|scope| {
            scope.device_properties($client.properties());
            if $mma {
                scope.runtime_properties = std::rc::Rc::new(cuda_mma_properties());
            }
            scope.register_size::<DynamicSize<$m::_N>>($n);
            scope.register_type::<DynamicScalar<$m::_F>>($elem);
        });
        let kernel = $m::$kernel::<R>::new(
            s,
            $client.clone(),
            $(flash_source!(@arg launcher h $m $kind),)*
            $n,
            g,
            $($comptime,)*
            $elem,
        );
        cuda_source(kernel.define())
    }};
}

const MASKS: [AttentionMask; 2] = [
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
];

/// A geometry of `variant` for `kernel` with the hardware exponential.
fn geometry(
    kernel: FlashKernel,
    variant: FlashVariant,
    head_dim: usize,
    n: usize,
) -> FlashGeometry {
    FlashGeometry {
        fast_exp: true,
        ..flash_geometry(kernel, variant, head_dim, n, 16)
    }
}

/// The `cmma` geometry of `kernel` with its `index`th tiling of [`cmma_tilings`] (its
/// last where it has fewer).
fn cmma_geometry(kernel: FlashKernel, head_dim: usize, n: usize, index: usize) -> FlashGeometry {
    let mut tiling = MmaTiling::cmma_default(head_dim);
    let tilings = cmma_tilings(kernel, head_dim);
    let t = tilings[index.min(tilings.len() - 1)];
    match kernel {
        FlashKernel::Forward => tiling.forward = t,
        FlashKernel::BackwardKv => tiling.backward_kv = t,
        FlashKernel::BackwardQ => tiling.backward_q = t,
    }
    FlashGeometry {
        fast_exp: true,
        ..tiled_geometry(kernel, FlashVariant::TensorCores, head_dim, n, 16, tiling)
    }
}

#[test]
fn tensor_core_default_geometry_is_the_first_cmma_tiling() {
    for head_dim in [64usize, 128] {
        for kernel in FLASH_KERNELS {
            assert_eq!(
                geometry(kernel, FlashVariant::TensorCores, head_dim, 8),
                cmma_geometry(kernel, head_dim, 8, 0)
            );
        }
    }
}

#[test]
fn tensor_core_kernels_compile_to_cuda() {
    let client = R::client(&WgpuDevice::DefaultDevice);
    let bf16: StorageType = ElemType::Float(FloatKind::BF16).into();
    let n = 8usize;
    // Every tiling of every kernel; the smaller ones (devices with less shared memory)
    // with the first mask only.
    let most = |d| {
        FLASH_KERNELS
            .iter()
            .map(|k| cmma_tilings(*k, d).len())
            .max()
            .unwrap()
    };
    for (head_dim, index) in [64usize, 128]
        .into_iter()
        .flat_map(|d| (0..most(d)).map(move |i| (d, i)))
    {
        let masks = if index == 0 { &MASKS[..] } else { &MASKS[..1] };
        for &mask in masks {
            let docs = mask.documents;
            let source = flash_source!(
                client,
                flash_forward_kernel::FlashForwardKernel,
                cmma_geometry(FlashKernel::Forward, head_dim, n, index),
                bf16,
                n,
                false,
                [
                    io, io, io, i32s, i32s, i32s, io, f32s, u32, u32, u32, u32, f32
                ],
                [mask]
            );
            check_source(&format!("forward_d{head_dim}_t{index}_{docs}"), &source);
            let source = flash_source!(
                client,
                flash_backward_kv_kernel::FlashBackwardKvKernel,
                cmma_geometry(FlashKernel::BackwardKv, head_dim, n, index),
                bf16,
                n,
                false,
                [
                    io, io, io, io, f32s, f32s, i32s, i32s, i32s, io, io, u32, u32, u32, u32, f32
                ],
                [mask]
            );
            check_source(&format!("backward_kv_d{head_dim}_t{index}_{docs}"), &source);
            let source = flash_source!(
                client,
                flash_backward_q_kernel::FlashBackwardQKernel,
                cmma_geometry(FlashKernel::BackwardQ, head_dim, n, index),
                bf16,
                n,
                false,
                [
                    io, io, io, io, f32s, f32s, i32s, i32s, i32s, io, u32, u32, u32, u32, f32
                ],
                [mask]
            );
            check_source(&format!("backward_q_d{head_dim}_t{index}_{docs}"), &source);
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
fn register_mma_kernels_compile_to_cuda() {
    use mma::{
        flash_backward_kv_mma_kernel, flash_backward_q_mma_kernel, flash_forward_mma_kernel,
    };
    let client = R::client(&WgpuDevice::DefaultDevice);
    let n = 8usize;
    let v = FlashVariant::Mma;
    let check = |name: &str, source: &str| {
        dump(name, source);
        assert!(
            source.contains("mma.sync.aligned.m16n8k16"),
            "{name}: no m16n8k16 mma.sync:\n{source}"
        );
        assert!(
            source.contains("ldmatrix"),
            "{name}: no ldmatrix:\n{source}"
        );
        assert!(!source.contains("wmma"), "{name}: a wmma call:\n{source}");
        // The base-2 hardware exponential (`exp2`): `__powf` of 2, no `__expf` nor libm.
        assert!(
            source.contains("__powf(float(2.0)"),
            "{name}: no __powf(2, x):\n{source}"
        );
        assert!(!source.contains("__expf("), "{name}: an __expf:\n{source}");
        assert!(
            !source.contains(" exp("),
            "{name}: an accurate exp:\n{source}"
        );
        // The plans' source patch takes every one of them (`LIGER_DUMP_CUDA` writes the
        // patched source beside the kernel's, for `scripts/sass_static.py`).
        let patched = SourcePatch::Exp2FlushToZero
            .apply(source)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !patched.contains("__powf"),
            "{name}: a 2^x left:\n{patched}"
        );
        assert_eq!(
            patched.matches("exp2_flush_to_zero(").count(),
            source.matches("__powf(float(2.0), ").count() + 1,
            "{name}: the calls and the helper"
        );
        dump(&format!("{name}_exp2_ftz"), &patched);
    };
    // Each kernel with one and with two 16-row m-tiles a plane (the plans use both).
    let tiled = |kernel: FlashKernel, head_dim: usize, tiles: u32| {
        let g = geometry(kernel, v, head_dim, n);
        assert!(g.mma);
        FlashGeometry {
            own_rows: 16 * g.planes * tiles,
            ..g
        }
    };
    for (dtype, kind) in [(FloatKind::BF16, "bf16"), (FloatKind::F16, "f16")] {
        let elem: StorageType = ElemType::Float(dtype).into();
        for (head_dim, tiles) in [64usize, 128].into_iter().flat_map(|d| [(d, 1u32), (d, 2)]) {
            for mask in MASKS {
                let docs = mask.documents;
                let forward = |g: FlashGeometry| {
                    flash_source!(
                        client,
                        flash_forward_mma_kernel::FlashForwardMmaKernel,
                        g,
                        elem,
                        n,
                        true,
                        [
                            io, io, io, i32s, i32s, i32s, io, f32s, u32, u32, u32, u32, f32
                        ],
                        [mask]
                    )
                };
                let g = tiled(FlashKernel::Forward, head_dim, tiles);
                check(
                    &format!("forward_mma_{kind}_d{head_dim}_t{tiles}_{docs}"),
                    &forward(g),
                );
                let source = forward(FlashGeometry {
                    planes: 12,
                    units: 12 * 32,
                    own_rows: 16 * 12 * tiles,
                    ..g
                });
                check(
                    &format!("forward_mma_{kind}_d{head_dim}_t{tiles}_p12_{docs}"),
                    &source,
                );
                assert!(source.contains("__launch_bounds__(384)"));
                // The forward's 128-key steps (one m-tile a plane only).
                if tiles == 1 {
                    let source = forward(FlashGeometry {
                        step_rows: 128,
                        s_cols: 128,
                        ..g
                    });
                    check(
                        &format!("forward_mma_{kind}_d{head_dim}_t1_s128_{docs}"),
                        &source,
                    );
                }
                let source = flash_source!(
                    client,
                    flash_backward_q_mma_kernel::FlashBackwardQMmaKernel,
                    tiled(FlashKernel::BackwardQ, head_dim, tiles),
                    elem,
                    n,
                    true,
                    [
                        io, io, io, io, f32s, f32s, i32s, i32s, i32s, io, u32, u32, u32, u32, f32
                    ],
                    [mask]
                );
                check(
                    &format!("backward_q_mma_{kind}_d{head_dim}_t{tiles}_{docs}"),
                    &source,
                );
                // Both output paths: whole dK/dV, and f32 parts of a split group; dQ from
                // its own kernel, and summed atomically here.
                // 4, 8 (head_dim 128's default strips) and 12 planes a cube (CUDA's
                // register bound follows the cube's size); and the warp grid (one
                // geometry, whatever the m-tiles of the strips).
                let parts = if docs { 3u32 } else { 1 };
                let dq_placements = [(false, false), (true, false), (true, true)];
                let base = tiled(FlashKernel::BackwardKv, head_dim, tiles);
                let mut kv_geometries: Vec<(String, FlashGeometry)> = dq_placements
                    .into_iter()
                    .flat_map(|dq| [(dq, 4u32), (dq, 8), (dq, 12)])
                    .map(|((atomic_dq, deferred_dq), planes)| {
                        let g = FlashGeometry {
                            atomic_dq,
                            deferred_dq,
                            planes,
                            units: planes * 32,
                            own_rows: 16 * planes * tiles,
                            ..base
                        };
                        assert!(g.dq_split().is_some(), "{g:?}");
                        let name = format!(
                            "backward_kv_mma_{kind}_d{head_dim}_t{tiles}_p{planes}_{docs}_parts{parts}_dq{atomic_dq}_deferred{deferred_dq}"
                        );
                        (name, g)
                    })
                    .collect();
                if tiles == 1 {
                    let g = FlashGeometry {
                        atomic_dq: true,
                        warp_grid: true,
                        planes: 8,
                        units: 256,
                        own_rows: 128,
                        step_rows: 64,
                        ..base
                    };
                    let name =
                        format!("backward_kv_grid_mma_{kind}_d{head_dim}_{docs}_parts{parts}");
                    kv_geometries.push((name, g));
                }
                for (name, g) in kv_geometries {
                    let source = flash_source!(
                        client,
                        flash_backward_kv_mma_kernel::FlashBackwardKvMmaKernel,
                        g,
                        elem,
                        n,
                        true,
                        [
                            io,
                            io,
                            io,
                            io,
                            f32s,
                            f32s,
                            i32s,
                            i32s,
                            i32s,
                            io,
                            io,
                            pairs,
                            pairs,
                            atomic_pairs,
                            u32,
                            u32,
                            u32,
                            u32,
                            f32,
                            u32
                        ],
                        [mask, parts]
                    );
                    check(&name, &source);
                    assert_eq!(source.contains("atomicAdd"), g.atomic_dq, "{name}");
                    assert!(
                        source.contains(&format!("__launch_bounds__({})", g.units)),
                        "{name}: not bound to {} planes",
                        g.planes
                    );
                }
            }
        }
    }
}
