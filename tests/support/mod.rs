//! Shared test support: which device the suites run on, and the backends over it (each
//! CubeCL backend on both reduction paths, through the per-thread `test-hooks` override).
//!
//! `LIGER_TEST_DEVICE` picks the device: `wgpu-cpu` (default: Mesa's lavapipe, the CI
//! device), `vulkan` (the first real Vulkan adapter), `cuda`, or `ndarray` (the stock-op
//! fallback only).

use burn::tensor::DType;
use liger_burn::ops::FusedOps;
use liger_burn::test_hooks::{launch_config_override, override_launch_config};
use liger_cubecl_kernels::{LaunchConfig, ReductionPath};
use liger_verify::conformance::{self, CaseResult, Op, Rng};

/// A generator of fresh random inputs (from `LIGER_SEED` when set, else the clock), whose
/// seed goes to the test's captured output: a failing test prints how to rerun it.
pub fn fresh_rng() -> Rng {
    let rng = Rng::from_env();
    let seed = rng.seed();
    eprintln!("random inputs from seed {seed} (rerun with LIGER_SEED={seed})");
    rng
}

/// The launch geometry in force on this thread: a test's own override, else the default.
pub fn current_geometry() -> LaunchConfig {
    launch_config_override().unwrap_or_default()
}

/// The configured test device name.
pub fn device_name() -> String {
    std::env::var("LIGER_TEST_DEVICE").unwrap_or_else(|_| "wgpu-cpu".into())
}

/// Something to run on every backend under test.
pub trait BackendVisitor {
    /// Called once per backend; `label` names it in failure messages.
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device);
}

/// Visits the backends of the configured device: on a CubeCL device both the fusion
/// backend (Burn's default) and the plain `CubeBackend`, each on both reduction paths;
/// plus the NdArray fallback.
pub fn for_each_backend(v: &mut impl BackendVisitor) {
    let name = device_name();
    match name.as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" | "vulkan" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice, WgpuRuntime};
            type Plain = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;
            let device = if name == "wgpu-cpu" {
                WgpuDevice::Cpu
            } else {
                WgpuDevice::DefaultDevice
            };
            for path in [ReductionPath::Plane, ReductionPath::Shared] {
                let _geometry = override_launch_config(current_geometry().with_reduction(path));
                v.visit::<Wgpu>(&format!("{name}/fusion/{path:?}"), &device);
                v.visit::<Plain>(&format!("{name}/cube/{path:?}"), &device);
            }
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            use burn::backend::cuda::{Cuda, CudaDevice};
            let device = CudaDevice::default();
            for path in [ReductionPath::Plane, ReductionPath::Shared] {
                let _geometry = override_launch_config(current_geometry().with_reduction(path));
                v.visit::<Cuda>(&format!("cuda/fusion/{path:?}"), &device);
            }
        }
        "ndarray" => {}
        other => panic!(
            "LIGER_TEST_DEVICE={other} is not available in this build (enabled: wgpu-cpu/vulkan with the \
             `vulkan` or `wgpu` feature, cuda with `cuda`, ndarray)"
        ),
    }
    #[cfg(feature = "ndarray")]
    v.visit::<burn::backend::NdArray>("ndarray/fallback", &Default::default());
}

/// The dtypes to test on a backend: f32 always, f16 and bf16 where the device has them.
pub fn dtypes<B: FusedOps>(device: &B::Device) -> Vec<DType> {
    let mut dtypes = vec![DType::F32];
    for dtype in [DType::F16, DType::BF16] {
        if B::supports_dtype(device, dtype) {
            dtypes.push(dtype);
        } else {
            eprintln!(
                "note: {dtype:?} not supported by {} on this device; not tested here",
                B::name(device)
            );
        }
    }
    dtypes
}

/// Runs `op`'s conformance sweep (the quick shapes) on every backend and dtype, failing
/// with every failing comparison listed.
pub fn check_op(op: Op) {
    sweep(|o| o == op, true, op.name());
}

/// The quick conformance sweep of every op `select` picks.
pub fn check_ops(select: impl Fn(Op) -> bool) {
    sweep(select, true, "quick sweep");
}

pub mod attention;
pub use liger_verify::conformance::bounded;
pub mod errors;
pub mod glu;
pub mod tensors;

/// Runs the full (non-quick) conformance sweep of every op `select` picks on every backend
/// and dtype, failing with every failing comparison listed. For `#[ignore]`d tests run on
/// real devices: the full shapes are too large for a software rasterizer in CI.
pub fn check_ops_full(select: impl Fn(Op) -> bool) {
    sweep(select, false, "full sweep");
}

/// The conformance sweep of the ops `select` picks (quick or full shapes) on every backend
/// and dtype; panics naming `what`, the seed and every failing comparison.
fn sweep(select: impl Fn(Op) -> bool, quick: bool, what: &str) {
    struct Sweep<F> {
        select: F,
        quick: bool,
        rng: Rng,
        failures: Vec<String>,
        cases: usize,
    }
    impl<F: Fn(Op) -> bool> BackendVisitor for Sweep<F> {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            for op in Op::ALL.into_iter().filter(|op| (self.select)(*op)) {
                for dtype in dtypes::<B>(device) {
                    for (rows, width) in conformance::shapes(op, self.quick) {
                        let result: CaseResult = conformance::run_case::<B>(
                            op,
                            rows,
                            width,
                            dtype,
                            device,
                            &mut self.rng,
                        );
                        self.cases += 1;
                        for c in result.comparisons.iter().filter(|c| !c.passed) {
                            self.failures.push(format!(
                                "{label} {} {dtype:?} [{rows}, {width}] {}: max abs {:.3e}, max rel {:.3e}, {:.2} of its bound",
                                op.name(),
                                c.tensor,
                                c.max_abs,
                                c.max_rel,
                                c.max_used
                            ));
                        }
                    }
                }
            }
        }
    }
    let mut sweep = Sweep {
        select,
        quick,
        rng: crate::fresh_rng(),
        failures: Vec::new(),
        cases: 0,
    };
    let seed = sweep.rng.seed();
    for_each_backend(&mut sweep);
    assert!(sweep.cases > 0, "no case ran");
    assert!(
        sweep.failures.is_empty(),
        "{what} failed (seed {seed}, rerun with LIGER_SEED={seed}):\n{}",
        sweep.failures.join("\n")
    );
}

/// Visits a lighter set of backends for whole-model suites (where each visit runs many
/// kernels and the reduction path is already covered by the per-op suites): the device's
/// fusion backend (Burn's default) on the automatic reduction path, and the NdArray
/// fallback.
pub fn for_each_model_backend(v: &mut impl BackendVisitor) {
    let name = device_name();
    match name.as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" | "vulkan" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice};
            let device = if name == "wgpu-cpu" {
                WgpuDevice::Cpu
            } else {
                WgpuDevice::DefaultDevice
            };
            v.visit::<Wgpu>(&format!("{name}/fusion"), &device);
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            use burn::backend::cuda::{Cuda, CudaDevice};
            v.visit::<Cuda>("cuda/fusion", &CudaDevice::default());
        }
        "ndarray" => {}
        other => panic!(
            "LIGER_TEST_DEVICE={other} is not available in this build (enabled: wgpu-cpu/vulkan with the \
             `vulkan` or `wgpu` feature, cuda with `cuda`, ndarray)"
        ),
    }
    #[cfg(feature = "ndarray")]
    v.visit::<burn::backend::NdArray>("ndarray/fallback", &Default::default());
}

/// Whether `B`'s own f32 matmul on `device` rounds its operands to TF32 (Burn's CUDA
/// backend runs f32 products on tensor cores) at products of `x: [n, h]` by `Wᵀ: [h, v]`,
/// measured on fresh random inputs against f64. A comparison with a stock path built on
/// that matmul then has to be norm-wise within
/// [`TF32_NORMWISE`](liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE):
/// elementwise, TF32's 2⁻¹¹ rounding of each operand is far beyond f32's bounds.
pub fn stock_matmul_is_tf32<B: FusedOps>(
    (n, h, v): (usize, usize, usize),
    device: &B::Device,
    rng: &mut Rng,
) -> bool {
    use liger_verify::conformance::linear_cross_entropy::{f32_matmul_error, is_reduced_precision};
    is_reduced_precision(f32_matmul_error::<B>((n, h, v), device, rng))
}
