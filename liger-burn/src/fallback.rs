//! [`FusedOps`] for backends without CubeCL: the trait's default bodies, i.e. the exact
//! compositions of stock Burn ops in [`crate::ops::compose`]. Same API, same results,
//! no fused kernels.

#[cfg(feature = "ndarray")]
mod ndarray {
    use crate::ops::FusedOps;
    use burn::backend::NdArray;
    use burn::backend::ndarray::{
        FloatNdArrayElement, IntNdArrayElement, NdArrayTensor, QuantElement, SharedArray,
    };

    impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> FusedOps for NdArray<E, I, Q>
    where
        NdArrayTensor: From<SharedArray<E>>,
        NdArrayTensor: From<SharedArray<I>>,
    {
    }
}

#[cfg(feature = "tch")]
impl<E: burn::backend::libtorch::TchElement> crate::ops::FusedOps for burn::backend::LibTorch<E> {}
