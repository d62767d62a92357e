//! Launching a `#[cube]` kernel with its compiled source patched.
//!
//! CubeCL compiles a kernel to source (CUDA C++ on CUDA) and hands that source to the
//! runtime's compiler with fixed options: cubecl-cuda 0.10 gives NVRTC no way to flush
//! subnormals to zero, and CubeCL has no inline PTX. Without flush-to-zero every
//! `ex2.approx.f32` carries a three-instruction fix-up for subnormal results (a compare and
//! two predicated multiplies around the hardware exponential), which in the register-mma
//! flash kernels is about a tenth of a step's instructions ([`SourcePatch`]).
//!
//! [`PatchedTask`] compiles the kernel as CubeCL's own task does, then rewrites the source;
//! the runtime compiles, caches and launches it as any other kernel, on the same stream,
//! with the same argument block. Launching a task of our own needs the kernel's arguments
//! gathered as CubeCL's `KernelLauncher` gathers them (its gathering is private), which
//! [`KernelArgs`] does: each array's buffer in declaration order and its lengths in the
//! metadata, each scalar in the info block.

use cubecl::backtrace::BackTrace;
use cubecl::prelude::*;
use cubecl::server::{Binding, KernelArguments};
use cubecl::{CompilationError, Compiler, CubeTask, InfoBuilder, ScalarArgType};

/// A rewrite of a kernel's compiled source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SourcePatch {
    /// Every `2^x` as the bare hardware `ex2.approx.ftz.f32`: under fast math CubeCL's
    /// CUDA compiler writes `2^x` as `__powf(2.0f, x)`, which NVRTC lowers to
    /// `ex2.approx.f32` plus the subnormal fix-up. With `.ftz` a result below `2^-126`
    /// is 0 instead of subnormal: in the flash kernels these are probabilities
    /// `2^-126` times the row's largest or less, which no f32 sum and no f16/bf16
    /// product can see; FlashAttention-2, built with `--use_fast_math`, flushes them
    /// the same way. Infinities and NaN pass as before (`2^-inf = 0`).
    Exp2FlushToZero,
}

/// The call CubeCL's CUDA compiler writes for `2^x` under fast math.
const EXP2_CALL: &str = "__powf(float(2.0), ";
/// Its replacement, defined by [`EXP2_FLUSH_TO_ZERO`].
const EXP2_FTZ_CALL: &str = "exp2_flush_to_zero(";
const EXP2_FLUSH_TO_ZERO: &str = "
__device__ __forceinline__ float exp2_flush_to_zero(float x) {
    float y;
    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));
    return y;
}
";

impl SourcePatch {
    /// `source` rewritten. A source without the patched construct (another runtime, or
    /// a kernel with no `2^x`) comes back unchanged; one that has it in a form the patch
    /// does not know is an error, never a silently different kernel.
    pub(crate) fn apply(self, source: &str) -> Result<String, String> {
        match self {
            SourcePatch::Exp2FlushToZero => exp2_flush_to_zero(source),
        }
    }
}

fn exp2_flush_to_zero(source: &str) -> Result<String, String> {
    let Some(first) = source.find(EXP2_CALL) else {
        return Ok(source.to_string());
    };
    // Each call's exponent is one variable (`__powf(float(2.0), l_12)`): the closing
    // parenthesis stays, so nothing else may sit inside the call.
    for (at, _) in source.match_indices(EXP2_CALL) {
        let rest = &source[at + EXP2_CALL.len()..];
        let arg = rest.split(')').next().unwrap_or_default();
        if arg.is_empty() || !arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "exp2 flush-to-zero patch: a 2^x call whose exponent is not one variable: \
                 `{EXP2_CALL}{}`",
                rest.chars().take(60).collect::<String>()
            ));
        }
    }
    // The helper goes after the headers, before the first function that may call it.
    let includes_end = source[..first]
        .rfind("#include")
        .map(|at| at + source[at..].find('\n').map_or(source.len() - at, |n| n + 1))
        .unwrap_or(0);
    Ok(format!(
        "{}{EXP2_FLUSH_TO_ZERO}{}",
        &source[..includes_end],
        source[includes_end..].replace(EXP2_CALL, EXP2_FTZ_CALL)
    ))
}

/// A kernel compiled as CubeCL compiles it, then its source rewritten by a [`SourcePatch`].
/// Its id is the kernel's id and the patch, so the runtime's caches (in memory and on disk)
/// keep it apart from the unpatched kernel.
pub(crate) struct PatchedTask<C: Compiler, K: CubeKernel> {
    task: KernelTask<C, K>,
    id: KernelId,
    patch: SourcePatch,
}

impl<C: Compiler, K: CubeKernel> PatchedTask<C, K> {
    /// `kernel` with `patch`; `address` is the address type its settings declare.
    pub(crate) fn new(kernel: K, address: AddressType, patch: SourcePatch) -> Self {
        let inner = kernel.id();
        let id = KernelId::new::<Self>()
            .address_type(address)
            .cube_dim(inner.cube_dim)
            .info((inner, patch));
        Self {
            task: KernelTask::new(kernel),
            id,
            patch,
        }
    }
}

impl<C: Compiler, K: CubeKernel> KernelMetadata for PatchedTask<C, K> {
    fn name(&self) -> &'static str {
        self.task.name()
    }

    fn id(&self) -> KernelId {
        self.id.clone()
    }

    fn address_type(&self) -> StorageType {
        self.task.address_type()
    }
}

impl<C: Compiler, K: CubeKernel> CubeTask<C> for PatchedTask<C, K> {
    fn compile(
        &self,
        compiler: &mut C,
        compilation_options: &C::CompilationOptions,
        mode: ExecutionMode,
        address_type: StorageType,
    ) -> Result<CompiledKernel<C>, CompilationError> {
        let mut compiled = self
            .task
            .compile(compiler, compilation_options, mode, address_type)?;
        compiled.source =
            self.patch
                .apply(&compiled.source)
                .map_err(|reason| CompilationError::Generic {
                    reason,
                    backtrace: BackTrace::capture(),
                })?;
        Ok(compiled)
    }
}

/// A kernel's runtime arguments, gathered in declaration order as CubeCL's `KernelLauncher`
/// gathers them, for [`KernelArgs::launch_unchecked`].
pub(crate) struct KernelArgs {
    buffers: Vec<Binding>,
    info: InfoBuilder,
    address: AddressType,
    /// Resolves the kernel's element types (its `define`d dtype and vector size) as the
    /// launcher's scope does.
    scope: Scope,
}

impl KernelArgs {
    /// Arguments of a kernel with `address`-wide addresses, run by `client`.
    pub(crate) fn new<R: Runtime>(client: &ComputeClient<R>, address: AddressType) -> Self {
        let mut scope = Scope::root(false);
        scope.device_properties(client.properties());
        Self {
            buffers: Vec::new(),
            info: InfoBuilder::default(),
            address,
            scope,
        }
    }

    /// The scope that resolves element types: register the kernel's `define`d types in it
    /// (`register_type`, `register_size`) before the first array.
    pub(crate) fn scope(&mut self) -> &mut Scope {
        &mut self.scope
    }

    /// The next argument, an `Array<E>`; returns its compilation argument.
    pub(crate) fn array<R: Runtime, E: CubePrimitive>(
        &mut self,
        array: ArrayArg<R>,
    ) -> ArrayCompilationArg {
        let ty = E::as_type(&self.scope);
        let length = array.size();
        let ArrayArg::Handle { handle } = array else {
            panic!("patched launch: aliased arrays are not gathered");
        };
        let binding = handle.handle;
        self.info.metadata.register_array(
            binding.size_in_used() / ty.size() as u64,
            (length / ty.vector_size()) as u64,
            self.address,
        );
        self.buffers.push(binding);
        ArrayCompilationArg { inplace: None }
    }

    /// The next scalar argument.
    pub(crate) fn scalar<T: ScalarArgType>(&mut self, value: T) {
        self.info.scalars.push(value);
    }

    /// Launches `task` over `count` cubes with the gathered arguments.
    ///
    /// # Safety
    ///
    /// As the kernel's generated `launch_unchecked`: the kernel must stay inside its
    /// buffers.
    pub(crate) unsafe fn launch_unchecked<R: Runtime>(
        mut self,
        client: &ComputeClient<R>,
        count: CubeCount,
        task: Box<dyn CubeTask<R::Compiler>>,
    ) {
        let arguments = KernelArguments {
            buffers: self.buffers,
            info: self.info.finish(self.address),
            tensor_maps: Vec::new(),
        };
        // Safety: forwarded to the caller.
        unsafe { client.launch_unchecked(task, count, arguments) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n\
        extern \"C\" __global__ void k(float* o) {\n\
        const float l_1 = __powf(float(2.0), l_0);\n\
        const float l_2 = __powf(float(2.0), l_1);\n}\n";

    #[test]
    fn exp2_calls_become_the_flush_to_zero_helper_after_the_headers() {
        let patched = SourcePatch::Exp2FlushToZero.apply(SOURCE).unwrap();
        assert!(!patched.contains("__powf"), "{patched}");
        assert_eq!(patched.matches("exp2_flush_to_zero(l_").count(), 2);
        let helper = patched.find("__device__ __forceinline__").unwrap();
        assert!(helper > patched.find("#include <cuda_bf16.h>").unwrap());
        assert!(helper < patched.find("extern \"C\"").unwrap());
        assert!(patched.contains("ex2.approx.ftz.f32"));
    }

    #[test]
    fn sources_without_exp2_come_back_unchanged() {
        let source = "extern \"C\" __global__ void k(float* o) { o[0] = __expf(o[1]); }";
        assert_eq!(SourcePatch::Exp2FlushToZero.apply(source).unwrap(), source);
    }

    #[test]
    fn exp2_of_an_expression_is_refused() {
        let source = SOURCE.replace("l_0)", "l_0 * 2.0f)");
        let err = SourcePatch::Exp2FlushToZero.apply(&source).unwrap_err();
        assert!(err.contains("not one variable"), "{err}");
    }
}
