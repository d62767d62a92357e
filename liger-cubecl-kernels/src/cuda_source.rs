//! Test support: a kernel expanded on any client (lavapipe in CI) and compiled to CUDA C++
//! by CubeCL's own CUDA compiler, so tests can check what the CUDA runtime would be given
//! without a GPU. `LIGER_DUMP_CUDA=DIR` writes the sources there for review (a test-only
//! switch, not a library knob; `scripts/sass_static.py` compiles them to SASS).

use cubecl::Compiler as _;
use cubecl::prelude::{AddressType, KernelDefinition};
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};

/// The CUDA C++ of `def`, with the options the CUDA runtime compiles it with.
pub(crate) fn cuda_source(def: KernelDefinition) -> String {
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

/// Writes `source` to `$LIGER_DUMP_CUDA/{name}.cu` when the variable is set.
pub(crate) fn dump(name: &str, source: &str) {
    if let Ok(dir) = std::env::var("LIGER_DUMP_CUDA") {
        std::fs::write(format!("{dir}/{name}.cu"), source).unwrap();
    }
}
