//! The embedding lookup and its gradient (`functional::embedding`, and
//! `burn::nn::Embedding` on `Liger<_>`): the conformance sweep (forward and the table's
//! gradient against f64, repeated and hot indices, rows never looked up, every dtype of
//! the device); an unmodified `burn::nn::Embedding` in both wrapping orders reaches the
//! fused gradient kernel and agrees with stock Burn to the bit in f32 (both sum in f32 in
//! position order); bad shapes are refused naming the op.

use burn::backend::Autodiff;
use burn::module::Param;
use burn::nn::{Embedding, EmbeddingConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use liger_burn::Liger;
use liger_burn::ops::FusedOps;
use liger_cubecl_kernels::counters::{self, Kernel};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_verify::conformance::Op;

#[test]
fn embedding_conformance() {
    liger_tests::check_op(Op::Embedding);
}

/// The full sweep: too large for a software rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn embedding_full_sweep() {
    liger_tests::check_ops_full(|op| op == Op::Embedding);
}

const VOCAB: usize = 11;
const D: usize = 24;
const BATCH: usize = 3;
const SEQ: usize = 17;

/// One step of `Embedding` with an upstream gradient: the output and the table's gradient.
fn step<A: AutodiffBackend>(
    table: &[f32],
    indices: &[i64],
    upstream: &[f32],
    device: &A::Device,
) -> (Vec<f32>, Vec<f32>) {
    let mut embedding: Embedding<A> = EmbeddingConfig::new(VOCAB, D).init(device);
    let weight = Tensor::<A, 2>::from_data(TensorData::new(table.to_vec(), [VOCAB, D]), device);
    embedding.weight = Param::from_tensor(weight.require_grad());
    let ids =
        Tensor::<A, 2, Int>::from_data(TensorData::new(indices.to_vec(), [BATCH, SEQ]), device);
    let y = embedding.forward(ids);
    let g = Tensor::<A, 3>::from_data(TensorData::new(upstream.to_vec(), [BATCH, SEQ, D]), device);
    let grads = (y.clone() * g).sum().backward();
    let grad = embedding
        .weight
        .val()
        .grad(&grads)
        .expect("the table's gradient");
    let values = |t: TensorData| t.convert::<f32>().to_vec::<f32>().expect("f32");
    (values(y.into_data()), values(grad.into_data()))
}

fn check_module<B: FusedOps>(device: &B::Device)
where
    Autodiff<B>: AutodiffBackend<Device = B::Device>,
    Liger<Autodiff<B>>: AutodiffBackend<Device = B::Device>,
    Autodiff<Liger<B>>: AutodiffBackend<Device = B::Device>,
{
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let table = rng.vec(VOCAB * D, -2.0, 2.0, 0.0);
    // Index 0 at a third of the positions; the last index never.
    let indices: Vec<i64> = (0..BATCH * SEQ)
        .map(|_| {
            if rng.below(3) == 0 {
                0
            } else {
                rng.below(VOCAB - 1) as i64
            }
        })
        .collect();
    let upstream = rng.vec(BATCH * SEQ * D, -1.0, 1.0, 0.0);
    let stock = step::<Autodiff<B>>(&table, &indices, &upstream, device);
    let last_row = &stock.1[(VOCAB - 1) * D..];
    assert!(
        last_row.iter().all(|v| *v == 0.0),
        "seed {seed}: stock's unused row"
    );
    for order in ["Liger<Autodiff<_>>", "Autodiff<Liger<_>>"] {
        let before = counters::get(Kernel::embedding_backward);
        let ours = if order == "Liger<Autodiff<_>>" {
            step::<Liger<Autodiff<B>>>(&table, &indices, &upstream, device)
        } else {
            step::<Autodiff<Liger<B>>>(&table, &indices, &upstream, device)
        };
        assert!(
            counters::get(Kernel::embedding_backward) > before,
            "{order} did not launch the fused embedding gradient (seed {seed})"
        );
        assert_eq!(ours.0, stock.0, "{order}: the lookup (seed {seed})");
        assert_eq!(
            ours.1, stock.1,
            "{order}: the table's gradient (seed {seed})"
        );
    }
}

#[test]
fn nn_embedding_reaches_the_fused_gradient_and_matches_stock() {
    match liger_tests::device_name().as_str() {
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "wgpu-cpu" => {
            use burn::backend::wgpu::{Wgpu, WgpuDevice, WgpuRuntime};
            check_module::<Wgpu>(&WgpuDevice::Cpu);
            check_module::<burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>>(&WgpuDevice::Cpu);
        }
        #[cfg(any(feature = "vulkan", feature = "wgpu"))]
        "vulkan" => check_module::<burn::backend::wgpu::Wgpu>(&Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => check_module::<burn::backend::Cuda>(&Default::default()),
        "ndarray" => {}
        other => panic!("no CubeCL device for LIGER_TEST_DEVICE={other} in this build"),
    }
}

/// Shapes Burn's `ModuleOps::embedding` cannot mean are refused by name, with the shapes.
#[test]
fn embedding_bad_shapes_are_rejected() {
    use burn::backend::NdArray;
    use burn::tensor::ops::ModuleOps;
    type L = Liger<NdArray>;
    let device = Default::default();
    let prim = |t: Tensor<L, 3>| match t.into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => unreachable!(),
    };
    let table = Tensor::<L, 3>::zeros([2, 5, 4], &device);
    let ids = Tensor::<L, 2, Int>::zeros([1, 3], &device);
    let msg = panic_message(|| {
        let _ = <L as ModuleOps<L>>::embedding(prim(table.clone()), ids.clone().into_primitive());
    });
    assert_mentions("embedding", &msg, &["embedding", "[2, 5, 4]", "[1, 3]"]);

    let table = Tensor::<L, 2>::zeros([5, 4], &device);
    let grad = Tensor::<L, 3>::zeros([1, 2, 4], &device);
    let table_prim = match table.into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => unreachable!(),
    };
    let msg = panic_message(|| {
        let _ = <L as ModuleOps<L>>::embedding_backward(
            table_prim.clone(),
            prim(grad.clone()),
            ids.clone().into_primitive(),
        );
    });
    assert_mentions(
        "embedding_backward",
        &msg,
        &["embedding_backward", "[1, 3]", "[1, 2, 4]"],
    );
}
