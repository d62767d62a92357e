//! Bad input is a clear error naming the op, the shapes and the dtypes, raised at the API
//! entry (the primitives it calls assume valid input): on the CubeCL backends of the test
//! device and on the NdArray fallback.

use burn::tensor::{DType, Shape, Tensor, TensorData, backend::Backend};
use liger_burn::functional;
use liger_burn::nn::{LayerNormConfig, RmsNormConfig};
use liger_burn::ops::validate;
use liger_burn::ops::{FusedOps, RmsNormOptions};
use liger_tests::BackendVisitor;
use liger_tests::errors::{assert_mentions, panic_message};

fn t<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(vec![0.5f32; n], shape), device)
}

struct BadInputs;

impl BackendVisitor for BadInputs {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        let opts = RmsNormOptions::llama(1e-6);
        // Weight length does not match the last dimension.
        let msg = panic_message(|| {
            functional::rms_norm(t::<B, 2>([4, 8], device), t::<B, 1>([7], device), opts);
        });
        assert_mentions("validation", &msg, &["rms_norm", "[7]", "[4, 8]"]);
        // Mismatched residual.
        let msg = panic_message(|| {
            functional::fused_add_rms_norm(
                t::<B, 2>([4, 8], device),
                t::<B, 2>([4, 9], device),
                t::<B, 1>([8], device),
                opts,
            );
        });
        assert_mentions(
            "validation",
            &msg,
            &["fused_add_rms_norm", "residual", "[4, 9]", "[4, 8]"],
        );
        // LayerNorm bias of the wrong length.
        let msg = panic_message(|| {
            functional::layer_norm(
                t::<B, 3>([2, 3, 5], device),
                t::<B, 1>([5], device),
                Some(t::<B, 1>([4], device)),
                1e-5,
            );
        });
        assert_mentions(
            "validation",
            &msg,
            &["layer_norm", "bias", "[4]", "[2, 3, 5]"],
        );
        // Empty input.
        let msg = panic_message(|| {
            functional::softmax(t::<B, 2>([0, 8], device), 1);
        });
        assert_mentions("validation", &msg, &["softmax", "empty", "[0, 8]"]);
        // Out-of-range dim.
        let msg = panic_message(|| {
            functional::log_softmax(t::<B, 2>([3, 8], device), 2);
        });
        assert_mentions("validation", &msg, &["log_softmax", "dim 2", "rank 2"]);
        // Weight dtype differs from x (where the device has f16).
        if B::supports_dtype(device, DType::F16) {
            let msg = panic_message(|| {
                functional::rms_norm(
                    t::<B, 2>([4, 8], device),
                    t::<B, 1>([8], device).cast(DType::F16),
                    opts,
                );
            });
            assert_mentions("validation", &msg, &["rms_norm", "F16", "F32"]);
        }
        // A dtype the backend's fused primitives do not take (f64 on the CubeCL backends),
        // where the device has it: refused at the entry, by name.
        if B::supports_dtype(device, DType::F64) && !B::fused_dtype_supported(DType::F64) {
            let msg = panic_message(|| {
                functional::rms_norm(
                    t::<B, 2>([4, 8], device).cast(DType::F64),
                    t::<B, 1>([8], device).cast(DType::F64),
                    opts,
                );
            });
            assert_mentions(
                label,
                &msg,
                &["rms_norm", "unsupported dtype F64", "[4, 8]"],
            );
        }
        // eps must be positive and finite, for every norm.
        for eps in [0.0, -1e-6, f64::NAN, f64::INFINITY] {
            let shown = format!("got {eps}");
            let msg = panic_message(|| {
                functional::rms_norm(
                    t::<B, 2>([4, 8], device),
                    t::<B, 1>([8], device),
                    RmsNormOptions::llama(eps),
                );
            });
            assert_mentions(label, &msg, &["rms_norm", "eps", &shown, "[4, 8]", "1e-6"]);
            let msg = panic_message(|| {
                functional::rms_norm(
                    t::<B, 2>([4, 8], device),
                    t::<B, 1>([8], device),
                    RmsNormOptions::gemma(eps),
                );
            });
            assert_mentions(label, &msg, &["rms_norm", "eps", &shown]);
            let msg = panic_message(|| {
                functional::fused_add_rms_norm(
                    t::<B, 2>([4, 8], device),
                    t::<B, 2>([4, 8], device),
                    t::<B, 1>([8], device),
                    RmsNormOptions::llama(eps),
                );
            });
            assert_mentions(
                label,
                &msg,
                &["fused_add_rms_norm", "eps", &shown, "[4, 8]"],
            );
            let msg = panic_message(|| {
                functional::layer_norm(
                    t::<B, 3>([2, 3, 5], device),
                    t::<B, 1>([5], device),
                    None,
                    eps,
                );
            });
            assert_mentions(
                label,
                &msg,
                &[
                    "layer_norm",
                    "eps",
                    "positive and finite",
                    &shown,
                    "[2, 3, 5]",
                ],
            );
            let msg = panic_message(|| {
                RmsNormConfig::new(8).with_epsilon(eps).init::<B>(device);
            });
            assert_mentions(label, &msg, &["rms_norm", "eps", &shown]);
            let msg = panic_message(|| {
                LayerNormConfig::new(8).with_epsilon(eps).init::<B>(device);
            });
            assert_mentions(label, &msg, &["layer_norm", "eps", &shown]);
        }
        eprintln!("{label}: bad inputs rejected");
    }
}

#[test]
fn bad_inputs_are_rejected_with_clear_errors() {
    liger_tests::for_each_backend(&mut BadInputs);
}

/// `Liger<B>`'s overrides are entries too: Burn's own API reaches them having checked only
/// what its primitives need, and the fused primitives behind them assume valid input.
struct LigerEntries;

impl BackendVisitor for LigerEntries {
    fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
        type L<B> = liger_burn::Liger<B>;
        let msg = panic_message(|| {
            burn::tensor::activation::softmax(t::<L<B>, 2>([0, 8], device), 1);
        });
        assert_mentions(label, &msg, &["softmax", "empty", "[0, 8]"]);
        let msg = panic_message(|| {
            burn::nn::LayerNormConfig::new(5)
                .init::<L<B>>(device)
                .forward(t::<L<B>, 2>([3, 4], device));
        });
        assert_mentions(label, &msg, &["layer_norm", "[5]", "[3, 4]"]);
    }
}

#[test]
fn liger_overrides_reject_bad_inputs() {
    liger_tests::for_each_backend(&mut LigerEntries);
}

/// What the entry asks each backend: every one takes the kernels' dtypes; the CubeCL
/// backends (and `Fusion` of them) nothing else, the stock-op fallback every float dtype;
/// `Autodiff<B>` and `Liger<B>` answer as `B`.
struct DtypeCapability;

impl BackendVisitor for DtypeCapability {
    fn visit<B: FusedOps>(&mut self, label: &str, _device: &B::Device) {
        use burn::backend::Autodiff;
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::Flex32] {
            assert!(B::fused_dtype_supported(dtype), "{label}: {dtype:?}");
        }
        let f64 = B::fused_dtype_supported(DType::F64);
        assert_eq!(f64, label.ends_with("fallback"), "{label}: F64");
        assert!(!B::fused_dtype_supported(DType::I32), "{label}: I32");
        assert_eq!(
            Autodiff::<B>::fused_dtype_supported(DType::F64),
            f64,
            "{label}"
        );
        assert_eq!(
            liger_burn::Liger::<B>::fused_dtype_supported(DType::F64),
            f64,
            "{label}"
        );
    }
}

#[test]
fn fused_dtype_capability_per_backend() {
    liger_tests::for_each_backend(&mut DtypeCapability);
}

#[test]
fn kernel_dtype_check_names_op_shape_and_dtype() {
    let err = validate::rows("softmax", (&Shape::new([2, 3]), DType::F64), true).unwrap_err();
    assert_mentions(
        "validation",
        &err.0,
        &["softmax", "unsupported dtype F64", "[2, 3]"],
    );
    let err = validate::rows("softmax", (&Shape::new([2, 3]), DType::I32), false).unwrap_err();
    assert_mentions("validation", &err.0, &["softmax", "float", "I32"]);
    // The fallback composes stock ops, so f64 is fine there.
    assert!(validate::rows("softmax", (&Shape::new([2, 3]), DType::F64), false).is_ok());
}

#[test]
fn invalid_rope_scaling_is_rejected_naming_the_parameter() {
    use burn::backend::NdArray;
    use liger_burn::ops::{Llama3RopeScaling, RopeLayout};
    let base = Llama3RopeScaling::llama3_1();
    let cases = [
        (
            Llama3RopeScaling {
                factor: 0.0,
                ..base
            },
            vec!["`factor`", "positive and finite", "got 0"],
        ),
        (
            Llama3RopeScaling {
                factor: f64::INFINITY,
                ..base
            },
            vec!["`factor`", "got inf"],
        ),
        (
            Llama3RopeScaling {
                low_freq_factor: -1.0,
                ..base
            },
            vec!["`low_freq_factor`", "got -1"],
        ),
        (
            Llama3RopeScaling {
                high_freq_factor: 1.0,
                ..base
            },
            vec![
                "`high_freq_factor`",
                "greater than `low_freq_factor` (1)",
                "got 1",
            ],
        ),
        (
            Llama3RopeScaling {
                original_max_position_embeddings: 0,
                ..base
            },
            vec!["`original_max_position_embeddings`", "got 0"],
        ),
    ];
    for (scaling, parts) in cases {
        let msg = panic_message(|| {
            functional::rope_tables::<NdArray>(
                500000.0,
                16,
                0..4,
                Some(scaling),
                RopeLayout::RotateHalf,
                DType::F32,
                &Default::default(),
            );
        });
        assert_mentions(
            &format!("{scaling:?}"),
            &msg,
            &[&["rope_tables"][..], &parts[..]].concat(),
        );
        assert!(scaling.check().is_err());
    }
    assert_eq!(base.check(), Ok(()));
}
