//! GeGLU `gelu_tanh(gate) * up`: forward and both gradients against the f64 reference and stock Burn
//! (`activation::gelu_approximate(gate) * up`) on every backend of the test device and every dtype it has,
//! under forced grid striding and split launches too; one-sided gradient tracking; bad
//! input; the `GeGluMlp` module (record layout, forward).

use burn::backend::NdArray;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{Tensor, TensorData, activation, backend::Backend};
use liger_burn::conformance::{Op, Rng};
use liger_burn::nn::{GeGluMlp, GeGluMlpConfig};
use liger_tests::glu::{
    check_bad_inputs, check_dtype_validation, check_op_with_elementwise_limits,
    check_partial_tracking,
};

#[test]
fn geglu_matches_reference_and_burn() {
    liger_tests::check_op(Op::GeGlu);
}

#[test]
fn geglu_grid_strided_and_split_launches() {
    check_op_with_elementwise_limits(Op::GeGlu);
}

#[test]
fn geglu_one_input_tracked() {
    check_partial_tracking(Op::GeGlu);
}

#[test]
fn geglu_bad_inputs_are_rejected() {
    check_bad_inputs(Op::GeGlu);
}

#[test]
fn geglu_dtype_validation() {
    check_dtype_validation(Op::GeGlu);
}

/// The same MLP written with burn `Linear`s only (the Hugging Face field names).
#[derive(Module, Debug)]
struct StockMlp<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
}

impl<B: Backend> StockMlp<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = self.gate_proj.forward(x.clone());
        let up = self.up_proj.forward(x);
        self.down_proj
            .forward(activation::gelu_approximate(gate) * up)
    }
}

#[test]
fn geglu_mlp_loads_stock_record_and_matches() {
    type B = NdArray;
    let device = Default::default();
    let mut rng = Rng::from_env();
    let seed = rng.seed();
    for bias in [false, true] {
        let (d_model, d_ff) = (12, 40);
        let stock_mlp = || StockMlp::<B> {
            gate_proj: LinearConfig::new(d_model, d_ff)
                .with_bias(bias)
                .init(&device),
            up_proj: LinearConfig::new(d_model, d_ff)
                .with_bias(bias)
                .init(&device),
            down_proj: LinearConfig::new(d_ff, d_model)
                .with_bias(bias)
                .init(&device),
        };
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = recorder.record(stock_mlp().into_record(), ()).unwrap();
        // Both modules from the saved bytes (parameters are initialized lazily, so a
        // clone of a fresh module would draw its own values).
        let stock = stock_mlp()
            .load_record(Recorder::<B>::load(&recorder, bytes.clone(), &device).unwrap());
        let record = Recorder::<B>::load(&recorder, bytes, &device)
            .expect("the liger MLP loads the stock record");
        let ours: GeGluMlp<B> = GeGluMlpConfig::new(d_model, d_ff)
            .with_bias(bias)
            .init::<B>(&device)
            .load_record(record);
        assert_eq!(ours.gate_proj.bias.is_some(), bias);

        let x = Tensor::<B, 3>::from_data(
            TensorData::new(rng.vec(2 * 3 * d_model, -2.0, 2.0, 0.0), [2, 3, d_model]),
            &device,
        );
        assert_eq!(
            ours.gate_proj.weight.val().into_data(),
            stock.gate_proj.weight.val().into_data()
        );
        let a = ours.forward(x.clone()).into_data().to_vec::<f32>().unwrap();
        let b = stock.forward(x).into_data().to_vec::<f32>().unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
                "bias {bias} [{i}]: liger {x} vs stock {y} (seed {seed})"
            );
        }

        // And back: the stock struct loads the liger module's record.
        let bytes = recorder.record(ours.into_record(), ()).unwrap();
        let record = Recorder::<B>::load(&recorder, bytes, &device)
            .expect("the stock MLP loads the liger record");
        let back = stock_mlp().load_record(record);
        assert_eq!(
            back.down_proj.weight.val().into_data(),
            stock.down_proj.weight.val().into_data()
        );
    }
}

#[test]
fn geglu_mlp_defaults_and_any_rank() {
    type B = NdArray;
    let device = Default::default();
    let config = GeGluMlpConfig::new(8, 24);
    assert!(!config.bias, "no bias by default (Llama/Gemma MLPs)");
    let mlp = config.init::<B>(&device);
    assert!(mlp.gate_proj.bias.is_none() && mlp.down_proj.bias.is_none());
    assert_eq!(mlp.gate_proj.weight.dims(), [8, 24]);
    assert_eq!(mlp.down_proj.weight.dims(), [24, 8]);
    let y4 = mlp.forward(Tensor::<B, 4>::ones([2, 2, 3, 8], &device));
    assert_eq!(y4.dims(), [2, 2, 3, 8]);
    let y2 = mlp.forward(Tensor::<B, 2>::ones([3, 8], &device));
    let y4 = y4.into_data().to_vec::<f32>().unwrap();
    let y2 = y2.into_data().to_vec::<f32>().unwrap();
    assert_eq!(&y4[..24], &y2[..], "rows are independent of the rank");
}
