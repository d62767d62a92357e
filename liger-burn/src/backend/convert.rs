//! Zero-cost moves of Burn's backend-generic structs between `Liger<B>` and `B`.
//!
//! The primitives of `Liger<B>` *are* those of `B`, so `FloatTensor<Liger<B>>` and
//! `FloatTensor<B>` are the same type. A struct generic over the backend itself, such as
//! `TensorPrimitive<B>` or `MaxPool2dWithIndices<B>`, is however a different type for
//! `Liger<B>` and `B` (even though its fields are the same): the generated delegation
//! (`delegate.rs`) passes such arguments as `arg.lower()` and returns such results as
//! `result.lift()`. Each conversion only moves the fields.
//!
//! `scripts/gen_delegation.py` detects these types in the Burn signatures; a new one shows up as
//! a compile error "no method named `lift`/`lower`" until it is added to the list below.

use super::Liger;
use crate::ops::FusedOps;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::{
    DeformConv2dBackward, MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward,
    MaxPool2dWithIndices, TransactionPrimitive,
};
use burn::tensor::quantization::QuantizationParametersPrimitive;

/// `X<B>` → `X<Liger<B>>`.
pub(crate) trait Lift {
    type Output;
    fn lift(self) -> Self::Output;
}

/// `X<Liger<B>>` → `X<B>`.
pub(crate) trait Lower {
    type Output;
    fn lower(self) -> Self::Output;
}

/// Both directions for a struct whose fields are all public and backend primitives.
macro_rules! rewrap_struct {
    ($($name:ident { $($field:ident),+ $(,)? })+) => {$(
        impl<B: FusedOps> Lift for $name<B> {
            type Output = $name<Liger<B>>;
            fn lift(self) -> Self::Output {
                $name { $($field: self.$field),+ }
            }
        }
        impl<B: FusedOps> Lower for $name<Liger<B>> {
            type Output = $name<B>;
            fn lower(self) -> Self::Output {
                $name { $($field: self.$field),+ }
            }
        }
    )+};
}

rewrap_struct! {
    DeformConv2dBackward { x_grad, offset_grad, weight_grad, mask_grad, bias_grad }
    MaxPool1dBackward { x_grad }
    MaxPool1dWithIndices { output, indices }
    MaxPool2dBackward { x_grad }
    MaxPool2dWithIndices { output, indices }
    QuantizationParametersPrimitive { scales }
}

impl<B: FusedOps> Lift for TensorPrimitive<B> {
    type Output = TensorPrimitive<Liger<B>>;
    fn lift(self) -> Self::Output {
        match self {
            TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
            TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
        }
    }
}

impl<B: FusedOps> Lower for TensorPrimitive<Liger<B>> {
    type Output = TensorPrimitive<B>;
    fn lower(self) -> Self::Output {
        match self {
            TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
            TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
        }
    }
}

/// Only this direction is needed (`TransactionOps::tr_execute` takes one). The private
/// registration order is not carried over: it is always empty here, because
/// `TransactionPrimitive::execute_async` takes it out before calling `tr_execute`, which only
/// reads the four public lists.
impl<B: FusedOps> Lower for TransactionPrimitive<Liger<B>> {
    type Output = TransactionPrimitive<B>;
    fn lower(self) -> Self::Output {
        TransactionPrimitive::new(
            self.read_floats,
            self.read_qfloats,
            self.read_ints,
            self.read_bools,
        )
    }
}
