//! `liger_burn::nn::{RmsNorm, LayerNorm}` records are interchangeable with
//! `burn::nn::{RmsNorm, LayerNorm}`: saved by one, loaded by the other (named format,
//! so struct and field names must agree).

use burn::backend::NdArray;
use burn::module::{Module, Param};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{DType, Tensor, TensorData};

type B = NdArray;

fn tensor(v: Vec<f32>) -> Param<Tensor<B, 1>> {
    let n = v.len();
    Param::from_tensor(Tensor::from_data(
        TensorData::new(v, [n]),
        &Default::default(),
    ))
}

fn values(p: &Param<Tensor<B, 1>>) -> Vec<f32> {
    p.val().into_data().to_vec::<f32>().unwrap()
}

#[test]
fn rms_norm_records_interchange() {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
    let device = Default::default();
    let mut rng = liger_tests::fresh_rng();
    let g = rng.vec(24, -1.0, 1.0, 0.0);

    let mut stock = burn::nn::RmsNormConfig::new(24)
        .with_epsilon(1e-6)
        .init::<B>(&device);
    stock.gamma = tensor(g.clone());
    let bytes = recorder.record(stock.into_record(), ()).unwrap();
    let record =
        Recorder::<B>::load(&recorder, bytes, &device).expect("liger RmsNorm loads burn's record");
    let ours = liger_burn::nn::RmsNormConfig::new(24)
        .init::<B>(&device)
        .load_record(record);
    assert_eq!(values(&ours.gamma), g);
    // As in Burn, `epsilon` is configuration: a loaded record keeps the module's own value.
    assert_eq!(ours.epsilon, 1e-5);

    let g2 = rng.vec(24, -1.0, 1.0, 0.0);
    let mut ours = ours;
    ours.gamma = tensor(g2.clone());
    let bytes = recorder.record(ours.into_record(), ()).unwrap();
    let record =
        Recorder::<B>::load(&recorder, bytes, &device).expect("burn RmsNorm loads liger's record");
    let stock = burn::nn::RmsNormConfig::new(24)
        .init::<B>(&device)
        .load_record(record);
    assert_eq!(values(&stock.gamma), g2);
}

#[test]
fn layer_norm_records_interchange() {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
    let device = Default::default();
    let mut rng = liger_tests::fresh_rng();
    let (g, b) = (rng.vec(10, -1.0, 1.0, 0.0), rng.vec(10, -1.0, 1.0, 0.0));

    let mut stock = burn::nn::LayerNormConfig::new(10).init::<B>(&device);
    stock.gamma = tensor(g.clone());
    stock.beta = Some(tensor(b.clone()));
    let bytes = recorder.record(stock.into_record(), ()).unwrap();
    let record = Recorder::<B>::load(&recorder, bytes, &device)
        .expect("liger LayerNorm loads burn's record");
    let ours = liger_burn::nn::LayerNormConfig::new(10)
        .init::<B>(&device)
        .load_record(record);
    assert_eq!(values(&ours.gamma), g);
    assert_eq!(values(ours.beta.as_ref().unwrap()), b);

    let bytes = recorder.record(ours.into_record(), ()).unwrap();
    let record = Recorder::<B>::load(&recorder, bytes, &device)
        .expect("burn LayerNorm loads liger's record");
    let stock = burn::nn::LayerNormConfig::new(10)
        .init::<B>(&device)
        .load_record(record);
    assert_eq!(values(&stock.gamma), g);
    assert_eq!(values(stock.beta.as_ref().unwrap()), b);
}

/// The modules compute what the functional API computes, and liger's LayerNorm equals
/// burn's on the same record.
#[test]
fn layer_norm_module_matches_burn_module() {
    let device = Default::default();
    let mut rng = liger_tests::fresh_rng();
    let mut stock = burn::nn::LayerNormConfig::new(33).init::<B>(&device);
    stock.gamma = tensor(rng.vec(33, 0.5, 1.5, 0.0));
    stock.beta = Some(tensor(rng.vec(33, -0.5, 0.5, 0.0)));
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(stock.clone().into_record(), ()).unwrap();
    let record = Recorder::<B>::load(&recorder, bytes, &device).unwrap();
    let ours = liger_burn::nn::LayerNormConfig::new(33)
        .init::<B>(&device)
        .load_record(record);
    let x = Tensor::<B, 3>::from_data(
        TensorData::new(rng.vec(2 * 5 * 33, -2.0, 2.0, 1.0), [2, 5, 33]),
        &device,
    );
    let f64s = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
    let x_values = f64s(x.clone().into_data().to_vec::<f32>().unwrap());
    let a = f64s(ours.forward(x.clone()).into_data().to_vec::<f32>().unwrap());
    let b = f64s(stock.forward(x).into_data().to_vec::<f32>().unwrap());
    // Each within its f32 bound of the f64 LayerNorm, so within twice that of each other.
    let reference = liger_verify::conformance::reference::layer_norm(
        DType::F32,
        &x_values,
        &f64s(values(&stock.gamma)),
        Some(&f64s(values(stock.beta.as_ref().unwrap()))),
        &vec![0.0; x_values.len()],
        33,
        1e-5,
        10,
    );
    let output = &reference[0];
    assert_eq!(output.tensor, "output");
    let seed = rng.seed();
    let c = output.check(&a);
    assert!(c.passed, "liger's LayerNorm: {c:?} (seed {seed})");
    let c = output.against(b, &output.bounds).check(&a);
    assert!(
        c.passed,
        "liger's LayerNorm against Burn's: {c:?} (seed {seed})"
    );
    liger_tests::tensors::assert_rejects_wrong(output, "LayerNorm");
}
