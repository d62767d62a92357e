//! Sigmoid: forward and gradient against the f64 reference and stock Burn
//! (`activation::sigmoid`) on every backend of the test device and every dtype it has,
//! under forced grid striding and split launches too; bad input; stock Burn's
//! `sigmoid` primitive on `Liger<_>` with input the kernels do not take.

use burn::backend::Autodiff;
use burn::tensor::{DType, Tensor, activation};
use liger_burn::Liger;
use liger_burn::conformance::Op;
use liger_burn::ops::FusedOps;
use liger_tests::BackendVisitor;
use liger_tests::glu::{
    check_bad_inputs, check_dtype_validation, check_op_with_elementwise_limits,
};

#[test]
fn sigmoid_matches_reference_and_burn() {
    liger_tests::check_op(Op::Sigmoid);
}

#[test]
fn sigmoid_grid_strided_and_split_launches() {
    check_op_with_elementwise_limits(Op::Sigmoid);
}

#[test]
fn sigmoid_bad_inputs_are_rejected() {
    check_bad_inputs(Op::Sigmoid);
}

#[test]
fn sigmoid_dtype_validation() {
    check_dtype_validation(Op::Sigmoid);
}

/// `Liger<B>`'s override takes everything stock `sigmoid` takes: an empty tensor is its own
/// result, f64 (where the device has it) goes to `B`'s own primitive.
#[test]
fn stock_sigmoid_on_liger_accepts_what_burn_accepts() {
    struct Fallback;
    impl BackendVisitor for Fallback {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let empty = Tensor::<Liger<B>, 2>::zeros([0, 8], device);
            let y = activation::sigmoid(empty);
            assert_eq!((y.dims(), y.dtype()), ([0, 8], DType::F32), "{label}");
            let x = Tensor::<Liger<Autodiff<B>>, 2>::zeros([0, 8], device).require_grad();
            assert_eq!(activation::sigmoid(x).dims(), [0, 8], "{label}");
            if B::supports_dtype(device, DType::F64) {
                let x =
                    Tensor::<Liger<B>, 1>::from_floats([-1.0, 0.0, 2.5], device).cast(DType::F64);
                let y = activation::sigmoid(x)
                    .cast(DType::F32)
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap();
                let stock = Tensor::<B, 1>::from_floats([-1.0, 0.0, 2.5], device).cast(DType::F64);
                let s = activation::sigmoid(stock)
                    .cast(DType::F32)
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap();
                eprintln!("{label}: f64 checked");
                for (a, b) in y.iter().zip(&s) {
                    assert!(
                        (a - b).abs() <= 1e-6,
                        "{label}: f64 goes to B's sigmoid: {y:?} vs {s:?}"
                    );
                }
            }
        }
    }
    let _guard = liger_tests::lock();
    liger_tests::for_each_backend(&mut Fallback);
}
