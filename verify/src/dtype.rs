//! The element types the fused kernels read.

use burn::tensor::DType;
use clap::ValueEnum;

/// Element type of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl DtypeArg {
    /// The Burn dtype.
    pub fn dtype(self) -> DType {
        match self {
            DtypeArg::F32 => DType::F32,
            DtypeArg::F16 => DType::F16,
            DtypeArg::Bf16 => DType::BF16,
        }
    }

    /// Short name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DtypeArg::F32 => "f32",
            DtypeArg::F16 => "f16",
            DtypeArg::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DtypeArg::F32 => 4,
            DtypeArg::F16 | DtypeArg::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for DtypeArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Short name of a Burn float dtype (for results that carry a `DType`).
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "other",
    }
}
