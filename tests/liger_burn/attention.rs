//! Attention (`liger_burn::functional::attention`, probabilities recomputed in the
//! backward): the output and the gradients of q, k and v against a naive f64 reference and
//! against eager attention composed of stock Burn ops under Burn's own autodiff, on every
//! backend of the test device and every dtype it has, for grouped-query heads, odd
//! lengths, one row, causal and sliding-window masks (given as a tensor, and built per block
//! from positions), a non-causal mask, one block and
//! many blocks (a partial last one), with an upstream gradient that is not 1; and bad
//! input.

use burn::backend::Autodiff;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Tensor, TensorData};
use liger_burn::functional::attention;
use liger_burn::ops::compose::attention::block_rows;
use liger_burn::ops::{AttentionKernel, AttentionOptions, FusedOps};
use liger_burn::test_hooks::{OverrideGuard, override_attention_block};
use liger_tests::errors::{assert_mentions, panic_message};
use liger_tests::tensors::{check, values};
use liger_tests::{BackendVisitor, dtypes, for_each_backend};
use liger_verify::conformance::{Rng, compare_normwise};

/// The block size on this thread while held (`None`: the default).
struct Blocks(#[allow(dead_code)] Option<OverrideGuard<usize>>);

impl Blocks {
    fn set(elements: Option<usize>) -> Self {
        Blocks(elements.map(override_attention_block))
    }
}

/// One attention problem.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    seq: usize,
    head_dim: usize,
    /// Sliding window (keys `i - window < j <= i`), or plain causal.
    window: Option<usize>,
    /// A non-causal mask (random, the diagonal always visible) with `causal: false`.
    bidirectional: bool,
    /// Score elements per block (`None`: the default, one block at these sizes).
    block: Option<usize>,
}

const fn case(batch: usize, q_heads: usize, kv_heads: usize, seq: usize, head_dim: usize) -> Case {
    Case {
        batch,
        q_heads,
        kv_heads,
        seq,
        head_dim,
        window: None,
        bidirectional: false,
        block: None,
    }
}

fn cases() -> Vec<Case> {
    vec![
        // One row, one head.
        case(1, 1, 1, 1, 8),
        // Grouped-query heads, odd length and width, one block.
        case(2, 4, 2, 13, 12),
        // Several blocks of 3 rows (partial last one), 3 query heads per kv head.
        Case {
            block: Some(3 * 6 * 37),
            ..case(1, 6, 2, 37, 16)
        },
        // Blocks of one row, batch 2, multi-query (one kv head).
        Case {
            block: Some(1),
            ..case(2, 3, 1, 10, 6)
        },
        // Mistral's sliding window across several blocks.
        Case {
            window: Some(5),
            block: Some(2 * 2 * 4 * 21),
            ..case(2, 2, 2, 21, 10)
        },
        // A non-causal mask: every block sees every key.
        Case {
            bidirectional: true,
            block: Some(2 * 4 * 19),
            ..case(1, 2, 1, 19, 8)
        },
    ]
}

/// `true` where query `i` must not see key `j`.
fn mask_values(c: &Case, rng: &mut Rng) -> Vec<bool> {
    let s = c.seq;
    let mut m = vec![false; s * s];
    for i in 0..s {
        for j in 0..s {
            m[i * s + j] = if c.bidirectional {
                i != j && rng.uniform() < 0.3
            } else {
                j > i || c.window.is_some_and(|w| i >= j + w)
            };
        }
    }
    m
}

/// Naive f64 attention and its gradients for the upstream gradient `g`:
/// `(out, grad_q, grad_k, grad_v)`, flattened `[b, h, s, d]` (k, v: kv heads).
#[allow(clippy::type_complexity)]
fn reference(
    c: &Case,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: &[bool],
    g: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, hq, hk, s, d) = (c.batch, c.q_heads, c.kv_heads, c.seq, c.head_dim);
    let scale = (d as f64).powf(-0.5);
    let qi = |bi: usize, h: usize, i: usize| ((bi * hq + h) * s + i) * d;
    let ki = |bi: usize, h: usize, j: usize| ((bi * hk + h) * s + j) * d;
    let mut out = vec![0.0; q.len()];
    let (mut gq, mut gk, mut gv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in 0..s {
                let (qo, go) = (qi(bi, h, i), qi(bi, h, i));
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        if mask[i * s + j] {
                            f64::NEG_INFINITY
                        } else {
                            let ko = ki(bi, kh, j);
                            scale * (0..d).map(|e| q[qo + e] * k[ko + e]).sum::<f64>()
                        }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exp: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = exp.iter().sum();
                let p: Vec<f64> = exp.iter().map(|x| x / sum).collect();
                let dp: Vec<f64> = (0..s)
                    .map(|j| {
                        let vo = ki(bi, kh, j);
                        (0..d).map(|e| g[go + e] * v[vo + e]).sum()
                    })
                    .collect();
                let dot: f64 = (0..s).map(|j| p[j] * dp[j]).sum();
                for j in 0..s {
                    let vo = ki(bi, kh, j);
                    let ds = p[j] * (dp[j] - dot);
                    for e in 0..d {
                        out[qo + e] += p[j] * v[vo + e];
                        gv[vo + e] += p[j] * g[go + e];
                        gq[qo + e] += scale * ds * k[vo + e];
                        gk[vo + e] += scale * ds * q[qo + e];
                    }
                }
            }
        }
    }
    (out, gq, gk, gv)
}

/// transformers' eager attention from stock Burn ops (k and v repeated per query head,
/// scores in the input dtype, masked softmax in f32), differentiated by Burn's autodiff.
fn eager<B: FusedOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Tensor<B, 2, Bool>,
) -> Tensor<B, 4> {
    let [b, hq, s, d] = q.dims();
    let hk = k.dims()[1];
    let repeat = |x: Tensor<B, 4>| {
        x.unsqueeze_dim::<5>(2)
            .expand([b, hk, hq / hk, s, d])
            .reshape([b, hq, s, d])
    };
    let dtype = q.dtype();
    let scores = q
        .matmul(repeat(k).swap_dims(2, 3))
        .mul_scalar((d as f64).powf(-0.5));
    let mask = mask.unsqueeze::<4>().expand([b, hq, s, s]);
    let scores = scores.cast(DType::F32).mask_fill(mask, f32::NEG_INFINITY);
    softmax(scores, 3).cast(dtype).matmul(repeat(v))
}

/// Output and gradients of q, k, v of `sum(attend(q, k, v) · g)` on `Autodiff<B>`.
fn run<B: FusedOps>(
    inputs: [&Tensor<B, 4>; 3],
    mask: &Tensor<B, 2, Bool>,
    g: &Tensor<B, 4>,
    attend: impl Fn(
        Tensor<Autodiff<B>, 4>,
        Tensor<Autodiff<B>, 4>,
        Tensor<Autodiff<B>, 4>,
        Tensor<Autodiff<B>, 2, Bool>,
    ) -> Tensor<Autodiff<B>, 4>,
) -> [Vec<f64>; 4] {
    let [q, k, v] = inputs.map(|t| Tensor::<Autodiff<B>, 4>::from_inner(t.clone()).require_grad());
    let out = attend(
        q.clone(),
        k.clone(),
        v.clone(),
        Tensor::from_inner(mask.clone()),
    );
    let grads = (out.clone() * Tensor::from_inner(g.clone()))
        .sum()
        .backward();
    let grad = |t: &Tensor<Autodiff<B>, 4>| values(t.grad(&grads).expect("a gradient"));
    [values(out.inner()), grad(&q), grad(&k), grad(&v)]
}

/// `liger check`'s attention cases (the flash kernels where the backend has them, each
/// mask kind, element-wise bounds), quick shapes.
#[test]
fn attention_conformance() {
    liger_tests::check_ops(liger_verify::conformance::Op::is_attention);
}

/// The full sweep: too large for a software rasterizer.
#[test]
#[ignore = "the full sweep: run on a GPU (LIGER_TEST_DEVICE=cuda)"]
fn attention_full_sweep() {
    liger_tests::check_ops_full(liger_verify::conformance::Op::is_attention);
}

#[test]
fn attention_matches_the_f64_reference_and_stock_eager_attention() {
    struct T(Rng);
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            // Stock eager attention's products are Burn's matmul, TF32 on CUDA: against
            // it, f32 results then agree within TF32's norm-wise bound.
            let tf32 = liger_tests::stock_matmul_is_tf32::<B>((64, 64, 64), device, &mut self.0);
            for dtype in dtypes::<B>(device) {
                // f32: rounding of the f32 softmax and products; half: scores and
                // probabilities rounded to 11 (8) significant bits, as eager attention.
                let (to_reference, to_eager) = match dtype {
                    DType::F32 if tf32 => (
                        2e-5,
                        liger_verify::conformance::linear_cross_entropy::TF32_NORMWISE,
                    ),
                    DType::F32 => (2e-5, 2e-5),
                    DType::F16 => (1e-2, 5e-3),
                    _ => (4e-2, 2e-2),
                };
                for c in cases() {
                    let _b = Blocks::set(c.block);
                    let rng = &mut self.0;
                    let (b, hq, hk, s, d) = (c.batch, c.q_heads, c.kv_heads, c.seq, c.head_dim);
                    let mut random = |h: usize, lo: f64, hi: f64| {
                        Tensor::<B, 4>::from_data(
                            TensorData::new(rng.vec(b * h * s * d, lo, hi, 0.0), [b, h, s, d]),
                            device,
                        )
                        .cast(dtype)
                    };
                    let (q, k, v) = (
                        random(hq, -2.0, 2.0),
                        random(hk, -2.0, 2.0),
                        random(hk, -1.0, 1.0),
                    );
                    // Upstream gradient away from 1 (and from 0).
                    let g = random(hq, 0.5, 1.5);
                    let mask_v = mask_values(&c, rng);
                    let mask = Tensor::<B, 2, Bool>::from_data(
                        TensorData::new(mask_v.clone(), [s, s]),
                        device,
                    );
                    let options = AttentionOptions {
                        scale: (d as f64).powf(-0.5),
                        causal: !c.bidirectional,
                        window: c.window,
                        kernel: AttentionKernel::Blockwise,
                        deterministic: false,
                    };
                    // The mask given as a tensor, and (causal cases) built from positions.
                    let given = run::<B>([&q, &k, &v], &mask, &g, |q, k, v, m| {
                        attention(q, k, v, Some(m), options)
                    });
                    let built = (!c.bidirectional).then(|| {
                        run::<B>([&q, &k, &v], &mask, &g, |q, k, v, _| {
                            attention(q, k, v, None, options)
                        })
                    });
                    let stock = run::<B>([&q, &k, &v], &mask, &g, eager);
                    let expected = reference(
                        &c,
                        &values(q.clone()),
                        &values(k.clone()),
                        &values(v.clone()),
                        &mask_v,
                        &values(g.clone()),
                    );
                    let expected = [expected.0, expected.1, expected.2, expected.3];
                    let blocks = s.div_ceil(block_rows(b, hq, s));
                    let what = format!("{c:?} {dtype:?} ({blocks} blocks)");
                    for (mask_kind, ours) in [("mask given", Some(given)), ("mask built", built)] {
                        let Some(ours) = ours else { continue };
                        let what = format!("{what} {mask_kind}");
                        for (i, name) in ["output", "grad_q", "grad_k", "grad_v"]
                            .into_iter()
                            .enumerate()
                        {
                            check(
                                label,
                                &format!("{what} vs f64"),
                                compare_normwise(name, &ours[i], &expected[i], to_reference),
                            );
                            check(
                                label,
                                &format!("{what} vs eager"),
                                compare_normwise(name, &ours[i], &stock[i], to_eager),
                            );
                        }
                    }
                }
            }
        }
    }
    for_each_backend(&mut T(liger_tests::fresh_rng()));
}

#[test]
fn blocks_cover_the_queries_within_the_score_budget() {
    // Default budget 2^27 scores: Llama-3.2-1B (32 heads) at 1K is one block; at 32K,
    // 128 rows (a multiple of 64) per block.
    assert_eq!(block_rows(1, 32, 1024), 1024);
    assert_eq!(block_rows(1, 32, 32768), 128);
    for (b, h, s) in [(1, 32, 4096), (2, 12, 16384), (1, 28, 100_000), (3, 7, 777)] {
        let rows = block_rows(b, h, s);
        assert!(rows >= 1 && rows <= s, "{b} {h} {s}: {rows}");
        assert!(
            b * h * rows * s <= 1 << 27 || rows == 1,
            "{b} {h} {s}: {rows}"
        );
    }
    let _b = Blocks::set(Some(10));
    assert_eq!(block_rows(1, 2, 4), 1);
}

#[test]
fn bad_attention_input_names_the_op_and_the_shapes() {
    struct T;
    impl BackendVisitor for T {
        fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
            let t = |dims: [usize; 4]| Tensor::<B, 4>::ones(dims, device);
            let mask = |s: usize| Tensor::<B, 2, Bool>::empty([s, s], device);
            let options = AttentionOptions::causal(8);
            // q, k, v dims, the mask's side, k's dtype.
            let attend = |q: [usize; 4], k: [usize; 4], v: [usize; 4], s: usize, k_dtype: DType| {
                attention(t(q), t(k).cast(k_dtype), t(v), Some(mask(s)), options);
            };
            let f32 = DType::F32;
            let cases: Vec<(&str, Box<dyn Fn()>, Vec<&str>)> = vec![
                (
                    "heads not a multiple",
                    Box::new(|| attend([1, 3, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 4, f32)),
                    vec!["attention", "multiple", "[1, 3, 4, 8]", "[1, 2, 4, 8]"],
                ),
                (
                    "head_dim mismatch",
                    Box::new(|| attend([1, 2, 4, 8], [1, 2, 4, 6], [1, 2, 4, 6], 4, f32)),
                    vec!["attention", "head_dim", "[1, 2, 4, 6]"],
                ),
                (
                    "k and v differ",
                    Box::new(|| attend([1, 2, 4, 8], [1, 2, 4, 8], [1, 1, 4, 8], 4, f32)),
                    vec!["attention", "k and v", "[1, 1, 4, 8]"],
                ),
                (
                    "mask shape",
                    Box::new(|| attend([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 5, f32)),
                    vec!["attention", "mask", "[5, 5]", "[4, 4]"],
                ),
                (
                    "dtype mismatch",
                    Box::new(|| attend([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], 4, DType::F16)),
                    vec!["attention", "dtype", "F16", "F32"],
                ),
                (
                    "empty",
                    Box::new(|| attend([1, 2, 0, 8], [1, 2, 0, 8], [1, 2, 0, 8], 0, f32)),
                    vec!["attention", "empty", "[1, 2, 0, 8]"],
                ),
            ];
            for (what, call, parts) in cases {
                if what == "dtype mismatch" && !B::supports_dtype(device, DType::F16) {
                    continue;
                }
                let msg = panic_message(call);
                assert_mentions(&format!("{label} {what}"), &msg, &parts);
            }
        }
    }
    for_each_backend(&mut T);
}

/// The flash-attention kernels of `liger_cubecl_kernels::attention` launched directly on the
/// test device's runtime: every variant the device runs (the FMA path everywhere, so CI on
/// lavapipe checks the flash algorithm itself; tensor cores where the device has `cmma`,
/// e.g. `LIGER_TEST_DEVICE=cuda`), against the f64 reference, with NaN-poisoned outputs.
mod flash_kernel {
    use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{CubeBackend, CubeRuntime};
    use liger_cubecl_kernels::attention::{
        AttentionMask, FlashBackwardArgs, FlashForwardArgs, FlashProblem, FlashVariant,
        KernelTiling, MmaTiling, document_ranges, flash_attention_backward_planned,
        flash_attention_planned, flash_plan, flash_plan_within, register_mma_supported,
        tensor_cores_supported,
    };
    use liger_tests::attention::{
        Problem, compare_lse, compare_rows, random_documents, reference, row_tolerance,
    };
    use liger_tests::device_name;
    use liger_tests::tensors::values;
    use liger_verify::conformance::Rng;

    type Plain<R> = CubeBackend<R, f32, i32, u32>;

    /// Something to run on the runtime of the test device.
    trait RuntimeVisitor {
        fn visit<R: CubeRuntime>(&mut self, label: &str, device: &R::Device);
    }

    fn for_each_runtime(v: &mut impl RuntimeVisitor) {
        let name = device_name();
        match name.as_str() {
            "wgpu-cpu" | "vulkan" => {
                use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
                let device = if name == "wgpu-cpu" {
                    WgpuDevice::Cpu
                } else {
                    WgpuDevice::DefaultDevice
                };
                v.visit::<WgpuRuntime>(&name, &device);
            }
            #[cfg(feature = "cuda")]
            "cuda" => {
                v.visit::<cubecl::cuda::CudaRuntime>("cuda", &Default::default());
            }
            _ => eprintln!("note: no CubeCL runtime on {name}; the flash kernels are not run"),
        }
    }

    fn upload<R: CubeRuntime>(
        values: Vec<f32>,
        shape: Vec<usize>,
        dtype: DType,
        device: &R::Device,
    ) -> CubeTensor<R> {
        let t = Tensor::<Plain<R>, 1>::from_data(
            TensorData::new(values, [shape.iter().product::<usize>()]),
            device,
        )
        .cast(dtype);
        let dims: [usize; 4] = match shape.len() {
            3 => [shape[0], shape[1], shape[2], 1],
            _ => [shape[0], shape[1], shape[2], shape[3]],
        };
        t.reshape(dims).into_primitive().tensor()
    }

    /// `[batch, seq]` i32 ids, contiguous: the kernels take raw handles, and a 2-D upload
    /// may get padded rows (CUDA pitches them), which the Burn glue makes contiguous first.
    fn contiguous_ids<R: CubeRuntime>(
        ids: &[i64],
        batch: usize,
        seq: usize,
        device: &R::Device,
    ) -> CubeTensor<R> {
        let t = Tensor::<Plain<R>, 1, Int>::from_data(
            TensorData::new(
                ids.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                [batch * seq],
            ),
            device,
        )
        .reshape([batch, seq]);
        let t: CubeTensor<R> = t.into_primitive();
        assert!(t.is_contiguous(), "the ids must be contiguous");
        t
    }

    fn read<R: CubeRuntime>(t: &CubeTensor<R>) -> Vec<f64> {
        values(Tensor::<Plain<R>, 4>::from_primitive(
            TensorPrimitive::Float(t.clone()),
        ))
    }

    /// The kernels' description of `p`, scaled by `1/√head_dim`.
    fn flash_problem(p: &Problem) -> FlashProblem {
        FlashProblem {
            batch: p.batch,
            q_heads: p.q_heads,
            kv_heads: p.kv_heads,
            seq: p.seq,
            head_dim: p.head_dim,
            scale: (p.head_dim as f64).powf(-0.5),
            mask: AttentionMask {
                causal: p.causal,
                window: p.window.is_some(),
                documents: p.documents.is_some(),
            },
            window: p.window.unwrap_or(0),
        }
    }

    /// Runs `p` forward and backward through the kernels; the results against the reference.
    /// `Ok` says whether the plan summed dQ atomically.
    fn check<R: CubeRuntime>(
        device: &R::Device,
        p: &Problem,
        dtype: DType,
        variant: FlashVariant,
        run: PlanRun,
        rng: &mut Rng,
        grow_keys: bool,
    ) -> Result<bool, String> {
        let (b, hq, hk, s, d) = (p.batch, p.q_heads, p.kv_heads, p.seq, p.head_dim);
        let mut k_values = rng.vec(p.kv_len(), -2.0, 2.0, 0.0);
        if grow_keys {
            // Scores that grow along the keys: the running max of a causal row moves by
            // more than the lazy-rescale threshold from block to block.
            for (i, x) in k_values.iter_mut().enumerate() {
                let pos = (i / d) % s;
                *x *= 1.0 + pos as f32 / 4.0;
            }
        }
        let q = upload::<R>(
            rng.vec(p.q_len(), -2.0, 2.0, 0.0),
            vec![b, hq, s, d],
            dtype,
            device,
        );
        let k = upload::<R>(k_values, vec![b, hk, s, d], dtype, device);
        let v = upload::<R>(
            rng.vec(p.kv_len(), -1.0, 1.0, 0.0),
            vec![b, hk, s, d],
            dtype,
            device,
        );
        let g = upload::<R>(
            rng.vec(p.q_len(), -1.0, 1.0, 0.0),
            vec![b, hq, s, d],
            dtype,
            device,
        );
        let nan = |shape: Vec<usize>, dtype| {
            let n = shape.iter().product();
            upload::<R>(vec![f32::NAN; n], shape, dtype, device)
        };
        let out = nan(vec![b, hq, s, d], dtype);
        let lse = nan(vec![b, hq, s], DType::F32);
        let ids: Option<CubeTensor<R>> = p
            .documents
            .as_ref()
            .map(|ids| contiguous_ids::<R>(ids, b, s, device));
        let problem = flash_problem(p);
        let client = q.client.clone();
        let mut plan = match run.max_shared {
            Some(max) => flash_plan_within(&client, d, dtype.into(), variant, max),
            None => flash_plan(&client, d, dtype.into(), variant),
        }
        .map_err(|e| e.to_string())?;
        if let Some(tiling) = run.tiling {
            plan = plan
                .with_tiling(&client, dtype.into(), tiling(d))
                .map_err(|e| e.to_string())?;
        }
        if run.deterministic {
            plan = plan.deterministic();
        }
        if run.other_launch {
            plan.exp2_flush_to_zero = !plan.exp2_flush_to_zero;
        }
        flash_attention_planned::<R>(
            &client,
            FlashForwardArgs {
                q: &q.handle,
                k: &k.handle,
                v: &v.handle,
                document_ids: ids.as_ref().map(|t| &t.handle),
                output: &out.handle,
                lse: &lse.handle,
            },
            problem,
            &plan,
            dtype.into(),
        )
        .map_err(|e| e.to_string())?;
        let (gq, gk, gv) = (
            nan(vec![b, hq, s, d], dtype),
            nan(vec![b, hk, s, d], dtype),
            nan(vec![b, hk, s, d], dtype),
        );
        flash_attention_backward_planned::<R>(
            &client,
            FlashBackwardArgs {
                grad_output: &g.handle,
                q: &q.handle,
                k: &k.handle,
                v: &v.handle,
                output: &out.handle,
                lse: &lse.handle,
                document_ids: ids.as_ref().map(|t| &t.handle),
                grad_q: &gq.handle,
                grad_k: &gk.handle,
                grad_v: &gv.handle,
            },
            problem,
            &plan,
            dtype.into(),
        )
        .map_err(|e| e.to_string())?;
        let (q_values, k_values, v_values) = (read(&q), read(&k), read(&v));
        let expected = reference(p, &q_values, &k_values, &v_values, &read(&g));
        let tol = row_tolerance(dtype, &p);
        let bounds = |which| expected.row_bounds(which, d, tol, dtype, DType::F32);
        let out_values = read(&out);
        compare_rows("output", &out_values, &expected.out, &bounds(0)).map_err(|e| {
            match &p.documents {
                Some(ids) if b > 1 => format!(
                    "{e}; {}",
                    diagnose_documents(p, ids, &out_values, &q_values, &k_values, &v_values, dtype)
                ),
                _ => e,
            }
        })?;
        compare_lse(&read(&lse), &expected.lse, tol)?;
        compare_rows("grad_q", &read(&gq), &expected.grad_q, &bounds(1))?;
        compare_rows("grad_k", &read(&gk), &expected.grad_k, &bounds(2))?;
        compare_rows("grad_v", &read(&gv), &expected.grad_v, &bounds(3))?;
        Ok(plan.sums_dq_atomically())
    }

    /// Which batch rows of a wrong document-masked output are wrong, and whether they match
    /// the output the ids of batch row 0 would give (a kernel reading the wrong row of ids).
    fn diagnose_documents(
        p: &Problem,
        ids: &[i64],
        out: &[f64],
        q: &[f64],
        k: &[f64],
        v: &[f64],
        dtype: DType,
    ) -> String {
        let s = p.seq;
        let per_batch = p.q_heads * s * p.head_dim;
        let zeros = vec![0.0; q.len()];
        let row_of = |ids: Vec<i64>| {
            let alt = Problem {
                documents: Some(ids),
                ..p.clone()
            };
            reference(&alt, q, k, v, &zeros).out
        };
        let first_row: Vec<i64> = (0..p.batch).flat_map(|_| ids[..s].to_vec()).collect();
        let without: Vec<i64> = vec![0; ids.len()];
        let candidates = [
            ("row 0's ids", row_of(first_row)),
            ("no document mask", row_of(without)),
        ];
        let expected = row_of(ids.to_vec());
        let tol = row_tolerance(dtype, &p) * 4.0;
        let close = |a: &[f64], e: &[f64]| {
            let err = a
                .iter()
                .zip(e)
                .map(|(x, y)| (x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm = e.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-30);
            err / norm <= tol
        };
        let mut notes = Vec::new();
        for bi in 0..p.batch {
            let span = bi * per_batch..(bi + 1) * per_batch;
            let right = close(&out[span.clone()], &expected[span.clone()]);
            let mut note = format!("batch row {bi}: {}", if right { "right" } else { "wrong" });
            if !right {
                for (name, alt) in &candidates {
                    if close(&out[span.clone()], &alt[span.clone()]) {
                        note += &format!(" (matches {name})");
                    }
                }
            }
            notes.push(note);
        }
        format!("diagnosis: {}", notes.join(", "))
    }

    /// The per-block `[min, max]` id tables the flash kernels skip blocks by, against the
    /// ids, for several batch rows, block sizes and a partial last block.
    #[test]
    fn document_ranges_are_each_blocks_least_and_greatest_id() {
        struct T(Rng);
        impl RuntimeVisitor for T {
            fn visit<R: CubeRuntime>(&mut self, label: &str, device: &R::Device) {
                for (batch, seq, block) in [(3usize, 100usize, 16usize), (2, 100, 64), (2, 17, 128)]
                {
                    let ids = random_documents(&mut self.0, batch, seq, 30, true);
                    let t = contiguous_ids::<R>(&ids, batch, seq, device);
                    let ranges = document_ranges::<R>(&t.client, &t.handle, batch, seq, block);
                    let blocks = seq.div_ceil(block);
                    let bytes = t.client.read_one(ranges).expect("read the document ranges");
                    let got: Vec<i32> = bytes
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    assert_eq!(got.len(), batch * blocks * 2, "{label}: table length");
                    for bi in 0..batch {
                        for blk in 0..blocks {
                            let span =
                                bi * seq + blk * block..bi * seq + ((blk + 1) * block).min(seq);
                            let lo = ids[span.clone()].iter().min().copied().unwrap() as i32;
                            let hi = ids[span].iter().max().copied().unwrap() as i32;
                            let at = (bi * blocks + blk) * 2;
                            assert_eq!(
                                (got[at], got[at + 1]),
                                (lo, hi),
                                "{label}: batch {batch} seq {seq} block {block}: row {bi} block {blk}"
                            );
                        }
                    }
                }
            }
        }
        for_each_runtime(&mut T(liger_tests::fresh_rng()));
    }

    /// A register-mma tiling at a head dimension.
    type Tiling = fn(usize) -> MmaTiling;

    /// How a run plans the kernels: the plan's own tiling or another, and dQ as the plan
    /// sums it (atomically in the dK/dV kernel where the device can) or from its own
    /// kernel ([`FlashPlan::deterministic`]).
    #[derive(Clone, Copy)]
    struct PlanRun {
        tiling: Option<Tiling>,
        deterministic: bool,
        /// Plan as a device with this much shared memory a cube would
        /// (`flash_plan_within`).
        max_shared: Option<usize>,
        /// The plan's `exp2_flush_to_zero` inverted: the kernels launched the other way
        /// (through the patched task where the plan takes the generated launch, and the
        /// reverse), so that both launches are checked wherever the kernels run.
        other_launch: bool,
    }

    impl PlanRun {
        const DEFAULT: PlanRun = PlanRun {
            tiling: None,
            deterministic: false,
            max_shared: None,
            other_launch: false,
        };
    }

    /// Register-mma tilings besides each plan's default, each kernel with one and two
    /// m-tiles a plane and steps of 16 to 64 rows: the kernels must be right under any
    /// tiling a plan may pick.
    fn other_tilings() -> Vec<(&'static str, Tiling)> {
        fn all(t: KernelTiling, deferred_dq: bool) -> MmaTiling {
            MmaTiling {
                forward: t,
                backward_q: t,
                backward_kv: t,
                deferred_dq,
            }
        }
        vec![
            ("one m-tile, 64-row steps, dQ deferred", |_| {
                all(KernelTiling::new(1, 64), true)
            }),
            ("one m-tile, 32-row steps, dQ in its step", |_| {
                all(KernelTiling::new(1, 32), false)
            }),
            ("two m-tiles, 32-row steps, dQ deferred", |_| {
                all(KernelTiling::new(2, 32), true)
            }),
            (
                "two m-tiles forward 16-row steps, dQ one 48, dK/dV two 48",
                |_| MmaTiling {
                    forward: KernelTiling::new(2, 16),
                    backward_q: KernelTiling::new(1, 48),
                    backward_kv: KernelTiling::new(2, 48),
                    deferred_dq: false,
                },
            ),
        ]
    }

    /// Register-mma tilings with other plane counts than the defaults': the forward and
    /// dK/dV on 4, 8 and 12 planes, and the forward's 128-key steps.
    fn other_plane_counts() -> Vec<(&'static str, Tiling)> {
        fn with(d: usize, forward: KernelTiling, kv: KernelTiling, deferred: bool) -> MmaTiling {
            MmaTiling {
                forward,
                backward_kv: kv,
                deferred_dq: deferred,
                ..MmaTiling::for_head_dim(d)
            }
        }
        fn k(plane_tiles: u32, step_rows: u32) -> KernelTiling {
            KernelTiling::new(plane_tiles, step_rows)
        }
        vec![
            (
                "forward and dK/dV on 4 planes, 64-row steps, dQ in its step",
                |d| with(d, k(1, 64), k(1, 64), false),
            ),
            (
                "forward on 12 planes, dK/dV on 12 planes, 32-row steps, dQ deferred",
                |d| with(d, k(2, 32).with_planes(12), k(1, 32).with_planes(12), true),
            ),
            (
                "forward on 8 planes, dK/dV on 8 planes, 16-row steps, dQ in its step",
                |d| with(d, k(1, 64).with_planes(8), k(1, 16).with_planes(8), false),
            ),
            (
                "forward with 128-key steps on 4 planes, dK/dV on 8 planes, dQ deferred",
                |d| with(d, k(1, 128), k(1, 64).with_planes(8), true),
            ),
            (
                "forward with 128-key steps on 8 planes, dK/dV on 4, dQ in its step",
                |d| with(d, k(1, 128).with_planes(8), k(2, 32), false),
            ),
        ]
    }

    /// The problems: odd lengths (1, 17, 100: partial last blocks), head_dim 64 and 128 (and
    /// 16, 32), GQA ratios 1, 2, 4, every mask kind and combination.
    fn problems(rng: &mut Rng) -> Vec<(Problem, bool)> {
        let c = Problem::causal;
        let docs =
            |rng: &mut Rng, b, s, len, shuffled| Some(random_documents(rng, b, s, len, shuffled));
        vec![
            (c(1, 1, 1, 1, 64), false),
            (c(2, 4, 2, 17, 64), false),
            (c(1, 4, 1, 100, 128), false),
            (c(1, 2, 2, 100, 64), true),
            (
                Problem {
                    causal: false,
                    ..c(1, 2, 1, 17, 32)
                },
                false,
            ),
            (
                Problem {
                    window: Some(5),
                    ..c(1, 4, 2, 100, 64)
                },
                false,
            ),
            (
                Problem {
                    window: Some(1),
                    ..c(1, 2, 2, 17, 16)
                },
                false,
            ),
            (
                Problem {
                    causal: false,
                    documents: docs(rng, 2, 100, 30, false),
                    ..c(2, 2, 1, 100, 64)
                },
                false,
            ),
            (
                Problem {
                    documents: docs(rng, 2, 100, 40, false),
                    ..c(2, 4, 1, 100, 128)
                },
                false,
            ),
            (
                Problem {
                    documents: docs(rng, 1, 17, 5, true),
                    ..c(1, 2, 1, 17, 64)
                },
                false,
            ),
            (
                Problem {
                    window: Some(9),
                    documents: docs(rng, 1, 100, 50, false),
                    ..c(1, 4, 2, 100, 64)
                },
                false,
            ),
            (
                Problem {
                    causal: false,
                    window: Some(7),
                    documents: docs(rng, 1, 17, 8, false),
                    ..c(1, 2, 2, 17, 128)
                },
                false,
            ),
        ]
    }

    /// The variants a device runs for `dtype` (FMA everywhere; tensor cores and register
    /// mma where it has them, and plans for them refused where it has not).
    fn variants<R: CubeRuntime>(
        client: &cubecl::prelude::ComputeClient<R>,
        dtype: DType,
    ) -> Vec<FlashVariant> {
        let mut variants = vec![FlashVariant::Fma];
        if tensor_cores_supported(client, dtype.into()) {
            variants.push(FlashVariant::TensorCores);
            if register_mma_supported(client, dtype.into()) {
                variants.push(FlashVariant::Mma);
            } else {
                assert!(flash_plan(client, 64, dtype.into(), FlashVariant::Mma).is_err());
            }
        } else {
            assert!(flash_plan(client, 64, dtype.into(), FlashVariant::TensorCores).is_err());
        }
        variants
    }

    /// The plans to run in a dtype, each with its name.
    type Runs = fn(DType) -> Vec<(&'static str, PlanRun)>;

    /// Runs the problems `keep` selects under `variant` with each tiling of `runs(dtype)`,
    /// in each dtype the device runs the variant in; every case runs and every failure is
    /// reported, so one device run shows the whole pattern.
    fn check_all(variant: FlashVariant, runs: Runs, keep: fn(&Problem) -> bool) {
        struct T {
            rng: Rng,
            ran: usize,
            /// Cases with no plan within their shared memory (see below).
            unplanned: usize,
            atomic_dq: usize,
            failures: Vec<String>,
            variant: FlashVariant,
            runs: Runs,
            keep: fn(&Problem) -> bool,
        }
        impl RuntimeVisitor for T {
            fn visit<R: CubeRuntime>(&mut self, label: &str, device: &R::Device) {
                let client = R::client(device);
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    if !<Plain<R> as burn::tensor::backend::Backend>::supports_dtype(device, dtype)
                    {
                        eprintln!("note: {dtype:?} not on {label}; not tested");
                        continue;
                    }
                    if !variants(&client, dtype).contains(&self.variant) {
                        eprintln!("note: no {:?} for {dtype:?} on {label}", self.variant);
                        continue;
                    }
                    let variant = self.variant;
                    for (run_name, run) in (self.runs)(dtype) {
                        for (p, grow) in problems(&mut self.rng) {
                            if !(self.keep)(&p) {
                                continue;
                            }
                            // Under 64 KiB of shared memory a cube (Vulkan on NVIDIA, or
                            // a run's smaller limit) the `cmma` backward fits only the
                            // smaller head dimensions: the others have no plan there (which
                            // fit is checked by the kernels crate's tiling tests). With
                            // more, every head dimension must plan.
                            let max = run
                                .max_shared
                                .unwrap_or(client.properties().hardware.max_shared_memory_size);
                            if variant == FlashVariant::TensorCores
                                && max < 64 << 10
                                && flash_plan_within(
                                    &client,
                                    p.head_dim,
                                    dtype.into(),
                                    variant,
                                    max,
                                )
                                .is_err()
                            {
                                self.unplanned += 1;
                                continue;
                            }
                            match check::<R>(device, &p, dtype, variant, run, &mut self.rng, grow) {
                                Ok(atomic_dq) => self.atomic_dq += usize::from(atomic_dq),
                                Err(e) => self.failures.push(format!(
                                    "{label} {dtype:?} {variant:?} {run_name} {}{}: {e}",
                                    p.describe(),
                                    if grow { " growing keys" } else { "" }
                                )),
                            }
                            self.ran += 1;
                        }
                    }
                }
            }
        }
        let mut t = T {
            rng: liger_tests::fresh_rng(),
            ran: 0,
            unplanned: 0,
            atomic_dq: 0,
            failures: Vec::new(),
            variant,
            runs,
            keep,
        };
        let seed = t.rng.seed();
        let start = std::time::Instant::now();
        for_each_runtime(&mut t);
        eprintln!(
            "flash kernel cases run ({variant:?}): {} in {:.0} s, {} with dQ summed atomically, {} without a plan within their shared memory",
            t.ran,
            start.elapsed().as_secs_f64(),
            t.atomic_dq,
            t.unplanned
        );
        assert!(
            t.failures.is_empty(),
            "{} of {} cases failed (seed {seed}, rerun with LIGER_SEED={seed}):\n{}",
            t.failures.len(),
            t.ran,
            t.failures.join("\n")
        );
    }

    /// One variant with its default plan, in every dtype the device runs it in (each
    /// variant a test of its own: the CUDA compiles of a variant's kernels for every
    /// problem take minutes).
    fn default_plans(variant: FlashVariant) {
        check_all(variant, |_| vec![("", PlanRun::DEFAULT)], |_| true);
    }

    /// The FMA kernels (every device; lavapipe in CI).
    #[test]
    fn flash_fma_kernels_match_the_f64_reference() {
        default_plans(FlashVariant::Fma);
    }

    /// The `cmma` kernels (devices with cooperative matrices), with the device's plan and
    /// with the plan of a device with 48 KiB of shared memory a cube (Vulkan on NVIDIA),
    /// which takes each kernel's smaller tilings. Where a limit under 64 KiB has no plan
    /// for a head dimension (128 at 48 KiB: the backward needs more), those problems do
    /// not run under it.
    #[test]
    fn flash_tensor_core_kernels_match_the_f64_reference() {
        check_all(
            FlashVariant::TensorCores,
            |_| {
                let within_48_kib = PlanRun {
                    max_shared: Some(48 << 10),
                    ..PlanRun::DEFAULT
                };
                vec![("", PlanRun::DEFAULT), ("within 48 KiB", within_48_kib)]
            },
            |_| true,
        );
    }

    /// The register-mma kernels with their default tiling (CUDA sm_80+).
    #[test]
    fn flash_register_mma_kernels_match_the_f64_reference() {
        default_plans(FlashVariant::Mma);
    }

    /// The default plan launched the other way (see [`PlanRun::other_launch`]).
    fn other_launch() -> Vec<(&'static str, PlanRun)> {
        let run = PlanRun {
            other_launch: true,
            ..PlanRun::DEFAULT
        };
        vec![("other launch", run)]
    }

    /// The FMA kernels through the patched task, whose arguments the kernels crate gathers
    /// in place of CubeCL's launcher (lavapipe in CI; f32).
    #[test]
    fn flash_fma_kernels_through_the_patched_launch_match_the_f64_reference() {
        check_all(
            FlashVariant::Fma,
            |d| {
                if d == DType::F32 {
                    other_launch()
                } else {
                    Vec::new()
                }
            },
            |_| true,
        );
    }

    /// The register-mma kernels launched the other way (bf16): head_dim 64 and below
    /// through CubeCL's generated launch, without the source patch their plans take on
    /// CUDA; larger heads through the patched task.
    #[test]
    fn flash_register_mma_kernels_through_the_other_launch_match_the_f64_reference() {
        check_all(
            FlashVariant::Mma,
            |d| {
                if d == DType::BF16 {
                    other_launch()
                } else {
                    Vec::new()
                }
            },
            |_| true,
        );
    }

    /// `tilings` as runs of their plans.
    fn tiling_runs(
        tilings: Vec<(&'static str, Tiling)>,
    ) -> impl Iterator<Item = (&'static str, PlanRun)> {
        tilings.into_iter().map(|(name, t)| {
            let run = PlanRun {
                tiling: Some(t),
                ..PlanRun::DEFAULT
            };
            (name, run)
        })
    }

    /// The register-mma kernels on other plane counts, in bf16, on the problems `keep`
    /// takes.
    fn plane_counts_on(keep: fn(&Problem) -> bool) {
        check_all(
            FlashVariant::Mma,
            |dtype| {
                if dtype != DType::BF16 {
                    return Vec::new();
                }
                tiling_runs(other_plane_counts()).collect()
            },
            keep,
        );
    }

    /// [`plane_counts_on`] the problems with head_dim 64 (a test for each head dimension,
    /// so that a GPU run can take them in parallel with each other and the tilings).
    #[test]
    fn flash_plane_counts_match_the_f64_reference_at_head_dim_64() {
        plane_counts_on(|p| p.head_dim == 64);
    }

    /// [`plane_counts_on`] the problems with a head_dim above 64.
    #[test]
    fn flash_plane_counts_match_the_f64_reference_above_head_dim_64() {
        plane_counts_on(|p| p.head_dim > 64);
    }

    /// The register-mma dK/dV kernel in FlashAttention-2's warp grid
    /// ([`KernelTiling::warp_grid`]), in f16 and bf16, on the problems with a head of 64
    /// or 128 (every mask kind), the other kernels at their defaults.
    #[test]
    fn flash_warp_grid_matches_the_f64_reference() {
        check_all(
            FlashVariant::Mma,
            |dtype| {
                if dtype == DType::F32 {
                    return Vec::new();
                }
                let grid: Tiling = |d| MmaTiling {
                    backward_kv: KernelTiling::warp_grid(),
                    ..MmaTiling::for_head_dim(d)
                };
                tiling_runs(vec![("dK/dV in the warp grid", grid)]).collect()
            },
            |p| p.head_dim.is_multiple_of(64),
        );
    }

    /// The register-mma kernels under the other tilings, and with dQ from its own kernel
    /// where the default sums it atomically, in bf16 (a tiling moves rows between planes,
    /// not the arithmetic), on the problems `keep` takes (every mask kind among those with
    /// head_dim 64 and 128).
    fn tilings_on(keep: fn(&Problem) -> bool) {
        check_all(
            FlashVariant::Mma,
            |dtype| {
                if dtype != DType::BF16 {
                    return Vec::new();
                }
                let deterministic = PlanRun {
                    deterministic: true,
                    ..PlanRun::DEFAULT
                };
                tiling_runs(other_tilings())
                    .chain([("default tiling, dQ kernel", deterministic)])
                    .collect()
            },
            keep,
        );
    }

    /// [`tilings_on`] the problems with head_dim 64 (a test for each head dimension, so
    /// that a GPU run can take them in parallel: each compiles every tiling's kernels).
    #[test]
    fn flash_tilings_match_the_f64_reference_at_head_dim_64() {
        tilings_on(|p| p.head_dim == 64);
    }

    /// [`tilings_on`] the problems with head_dim 128.
    #[test]
    fn flash_tilings_match_the_f64_reference_at_head_dim_128() {
        tilings_on(|p| p.head_dim == 128);
    }

    /// The register-mma kernels' times under candidate tilings: bf16, causal, the bench
    /// shapes; the forward, and the whole backward with dQ from its own kernel or summed
    /// atomically in dK/dV (in its step or deferred); the median of 5 runs after 2 (each
    /// run synchronized). One `tiling,...` CSV line each on stdout; the figures behind
    /// [`MmaTiling::for_head_dim`]. CUDA only; run with `--ignored`.
    #[test]
    #[ignore = "a timing run for a GPU, not a check"]
    fn flash_tilings_timed() {
        struct T;
        impl RuntimeVisitor for T {
            fn visit<R: CubeRuntime>(&mut self, label: &str, device: &R::Device) {
                let client = R::client(device);
                let dtype = DType::BF16;
                if !register_mma_supported(&client, dtype.into()) {
                    eprintln!("note: no register-level mma on {label}; nothing timed");
                    return;
                }
                let k = KernelTiling::new;
                // The candidates that came within about 5% of the fastest on an H200
                // (`benches/logs/flash_tilings_184cbf2.log`), the forward's 128-key steps and
                // dK/dV's warp grid.
                let forward = [k(1, 64), k(2, 64), k(1, 128), k(1, 128).with_planes(8)];
                let backward = [
                    k(1, 64),
                    k(2, 32),
                    k(1, 64).with_planes(8),
                    KernelTiling::warp_grid(),
                ];
                let mut rng = liger_tests::fresh_rng();
                println!("tiling,shape,kernel,plane_tiles,step_rows,planes,ms");
                for (b, s, hq, hk, d) in [
                    (1usize, 4096usize, 32usize, 8usize, 64usize),
                    (1, 16384, 32, 8, 64),
                    (1, 4096, 12, 2, 128),
                    (1, 16384, 12, 2, 128),
                ] {
                    let shape = format!("{b}x{s}x{hq}x{hk}x{d}");
                    let mut random = |h: usize, lo: f64, hi: f64| {
                        upload::<R>(
                            rng.vec(b * h * s * d, lo, hi, 0.0),
                            vec![b, h, s, d],
                            dtype,
                            device,
                        )
                    };
                    let (q, kk, v, g) = (
                        random(hq, -2.0, 2.0),
                        random(hk, -2.0, 2.0),
                        random(hk, -1.0, 1.0),
                        random(hq, -1.0, 1.0),
                    );
                    let (out, gq) = (random(hq, 0.0, 0.0), random(hq, 0.0, 0.0));
                    let (gk, gv) = (random(hk, 0.0, 0.0), random(hk, 0.0, 0.0));
                    let lse =
                        upload::<R>(vec![0.0; b * hq * s], vec![b, hq, s], DType::F32, device);
                    let problem = flash_problem(&Problem::causal(b, hq, hk, s, d));
                    let base = flash_plan(&client, d, dtype.into(), FlashVariant::Mma)
                        .expect("a register-mma plan");
                    let fwd_args = FlashForwardArgs {
                        q: &q.handle,
                        k: &kk.handle,
                        v: &v.handle,
                        document_ids: None,
                        output: &out.handle,
                        lse: &lse.handle,
                    };
                    let bwd_args = FlashBackwardArgs {
                        grad_output: &g.handle,
                        q: &q.handle,
                        k: &kk.handle,
                        v: &v.handle,
                        output: &out.handle,
                        lse: &lse.handle,
                        document_ids: None,
                        grad_q: &gq.handle,
                        grad_k: &gk.handle,
                        grad_v: &gv.handle,
                    };
                    let median_ms = |run: &dyn Fn()| {
                        let sync = || cubecl::future::block_on(client.sync()).expect("sync");
                        let mut times: Vec<f64> = (0..7)
                            .map(|_| {
                                let start = std::time::Instant::now();
                                run();
                                sync();
                                start.elapsed().as_secs_f64() * 1e3
                            })
                            .skip(2)
                            .collect();
                        times.sort_by(f64::total_cmp);
                        times[times.len() / 2]
                    };
                    let default = MmaTiling::for_head_dim(d);
                    let planned =
                        |tiling: MmaTiling| base.with_tiling(&client, dtype.into(), tiling);
                    // The forward's lse for the backward: the default tiling's.
                    flash_attention_planned::<R>(&client, fwd_args, problem, &base, dtype.into())
                        .expect("the forward");
                    for t in forward {
                        let Ok(plan) = planned(MmaTiling {
                            forward: t,
                            ..default
                        }) else {
                            continue;
                        };
                        let ms = median_ms(&|| {
                            flash_attention_planned::<R>(
                                &client,
                                fwd_args,
                                problem,
                                &plan,
                                dtype.into(),
                            )
                            .expect("the forward")
                        });
                        println!(
                            "tiling,{shape},forward,{},{},{},{ms:.4}",
                            t.plane_tiles, t.step_rows, t.planes
                        );
                    }
                    flash_attention_planned::<R>(&client, fwd_args, problem, &base, dtype.into())
                        .expect("the forward");
                    // The backward's whole time under each dK/dV candidate with dQ summed
                    // atomically in dK/dV, after a sync in its step and deferred to the
                    // next step's barrier (the warp grid sums it in its step only); the
                    // dQ kernel's tilings (deterministic plans) are timed in the earlier
                    // logs.
                    let runs = [
                        ("backward_kv_atomic_dq", false),
                        ("backward_kv_atomic_dq_deferred", true),
                    ];
                    for (kernel, deferred_dq) in runs {
                        if !base.atomic_dq {
                            continue;
                        }
                        for t in backward {
                            if t.warp_grid && deferred_dq {
                                continue;
                            }
                            let kernel = if t.warp_grid {
                                "backward_kv_atomic_dq_grid"
                            } else {
                                kernel
                            };
                            let Ok(plan) = planned(MmaTiling {
                                backward_kv: t,
                                deferred_dq,
                                ..default
                            }) else {
                                continue;
                            };
                            let ms = median_ms(&|| {
                                flash_attention_backward_planned::<R>(
                                    &client,
                                    bwd_args,
                                    problem,
                                    &plan,
                                    dtype.into(),
                                )
                                .expect("the backward")
                            });
                            println!(
                                "tiling,{shape},{kernel},{},{},{},{ms:.4}",
                                t.plane_tiles, t.step_rows, t.planes
                            );
                        }
                    }
                }
            }
        }
        for_each_runtime(&mut T);
    }
}

/// `functional::attention` / `attention_with_documents` on every backend of the test device
/// (fusion and plain CubeCL backends, NdArray) under each implementation it has: the
/// blockwise composition everywhere, the flash kernels on CubeCL backends
/// (`AttentionKernel::Flash`: the FMA variant on lavapipe, tensor cores on CUDA half
/// precision), and `Auto` (cuDNN's attention on CUDA where it takes the problem), `Auto`
/// also on the models' layout (q, k, v and the upstream gradient as transposed views of
/// `[batch, seq, heads, head_dim]` tensors, the output read back through the transpose and
/// reshape to `[batch, seq, hidden]`); forward and the gradients of q, k, v through
/// `Autodiff<B>` (upstream gradient random), against the f64 reference, for every mask kind.
mod paths {
    use burn::backend::Autodiff;
    use burn::tensor::{DType, Int, Tensor, TensorData};
    use liger_burn::functional::{attention, attention_with_documents};
    use liger_burn::ops::{AttentionKernel, AttentionOptions, FusedOps};
    use liger_cubecl_kernels::counters::{self, Kernel};
    use liger_tests::attention::{
        Problem, compare_rows, random_documents, reference, row_tolerance,
    };
    use liger_tests::tensors::values;
    use liger_tests::{BackendVisitor, dtypes, for_each_backend};
    use liger_verify::conformance::Rng;

    fn problems(rng: &mut Rng) -> Vec<Problem> {
        let c = Problem::causal;
        let docs = |rng: &mut Rng, b, s, len| Some(random_documents(rng, b, s, len, false));
        vec![
            c(1, 2, 1, 1, 16),
            c(2, 4, 2, 17, 64),
            Problem {
                window: Some(6),
                ..c(1, 4, 1, 37, 128)
            },
            Problem {
                documents: docs(rng, 2, 37, 12),
                ..c(2, 2, 2, 37, 32)
            },
            Problem {
                causal: false,
                documents: docs(rng, 1, 17, 6),
                ..c(1, 4, 4, 17, 64)
            },
            Problem {
                window: Some(4),
                documents: docs(rng, 1, 37, 20),
                ..c(1, 2, 1, 37, 16)
            },
        ]
    }

    /// Output and gradients of `sum(attention(q, k, v) · g)` on `Autodiff<B>`, all as
    /// `[batch, heads, seq, head_dim]`. With `sequence_major`, q, k, v and g are the
    /// transposed views of `[batch, seq, heads, head_dim]` leaves (as the models project
    /// them), and the output enters the sum through the transpose and reshape to `[batch,
    /// seq, hidden]`.
    fn run<B: FusedOps>(
        p: &Problem,
        dtype: DType,
        (kernel, sequence_major): (AttentionKernel, bool),
        deterministic: bool,
        rng: &mut Rng,
        device: &B::Device,
    ) -> ([Vec<f64>; 4], [Vec<f64>; 4]) {
        let (b, hq, hk, s, d) = (p.batch, p.q_heads, p.kv_heads, p.seq, p.head_dim);
        let mut random = |h: usize, lo: f64, hi: f64| {
            let dims = if sequence_major {
                [b, s, h, d]
            } else {
                [b, h, s, d]
            };
            Tensor::<Autodiff<B>, 4>::from_data(
                TensorData::new(rng.vec(b * h * s * d, lo, hi, 0.0), dims),
                device,
            )
            .cast(dtype)
        };
        let (leaf_q, leaf_k, leaf_v, leaf_g) = (
            random(hq, -2.0, 2.0).require_grad(),
            random(hk, -2.0, 2.0).require_grad(),
            random(hk, -1.0, 1.0).require_grad(),
            random(hq, -1.0, 1.0),
        );
        // [batch, heads, seq, head_dim] views of the leaves.
        let heads_major = |t: &Tensor<Autodiff<B>, 4>| {
            if sequence_major {
                t.clone().swap_dims(1, 2)
            } else {
                t.clone()
            }
        };
        let (q, k, v, g) = (
            heads_major(&leaf_q),
            heads_major(&leaf_k),
            heads_major(&leaf_v),
            heads_major(&leaf_g),
        );
        let options = AttentionOptions {
            scale: (d as f64).powf(-0.5),
            causal: p.causal,
            window: p.window,
            kernel,
            deterministic,
        };
        let out = match &p.documents {
            Some(ids) => {
                let ids = Tensor::<Autodiff<B>, 2, Int>::from_data(
                    TensorData::new(ids.clone(), [b, s]),
                    device,
                );
                attention_with_documents(q.clone(), k.clone(), v.clone(), ids, options)
            }
            None => attention(q.clone(), k.clone(), v.clone(), None, options),
        };
        let loss = if sequence_major {
            let hidden = |t: Tensor<Autodiff<B>, 4>| t.swap_dims(1, 2).reshape([b, s, hq * d]);
            (hidden(out.clone()) * hidden(g.clone())).sum()
        } else {
            (out.clone() * g.clone()).sum()
        };
        let grads = loss.backward();
        let grad = |t: &Tensor<Autodiff<B>, 4>| {
            let grad = t.grad(&grads).expect("a gradient");
            values(if sequence_major {
                grad.swap_dims(1, 2)
            } else {
                grad
            })
        };
        let inputs = [q, k, v, g].map(|t| values(t.inner()));
        (
            [
                values(out.inner()),
                grad(&leaf_q),
                grad(&leaf_k),
                grad(&leaf_v),
            ],
            inputs,
        )
    }

    /// `AttentionOptions::deterministic` through Burn's autodiff: the backward launches the
    /// flash kernels' dQ kernel (a plan that sums dQ by atomic adds in dK/dV, as CUDA's
    /// default does, launches none), and its gradients are the same bits on three runs of
    /// the same inputs (8 query heads on 2 kv heads over 512 tokens). The runs without the
    /// flag are reported, not checked: their atomic sums may happen to agree (they did on an
    /// H200).
    #[test]
    fn deterministic_attention_gives_the_same_gradients_every_run() {
        struct T(Rng);
        impl BackendVisitor for T {
            fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                let p = Problem::causal(1, 8, 2, 512, 64);
                for dtype in dtypes::<B>(device) {
                    let flash = B::flash_attention_variant(
                        device,
                        dtype,
                        p.head_dim,
                        &AttentionOptions::causal(p.head_dim).with_kernel(AttentionKernel::Flash),
                    );
                    if flash.is_none() {
                        continue;
                    }
                    eprintln!(
                        "note: {label} {dtype:?} {flash:?}: three runs with and without the flag"
                    );
                    let seed = self.0.seed();
                    for deterministic in [true, false] {
                        let dq_kernels = counters::get(Kernel::flash_attention_dq);
                        let runs: Vec<[Vec<f64>; 4]> = (0..3)
                            .map(|_| {
                                let mut rng = Rng::new(seed);
                                run::<B>(
                                    &p,
                                    dtype,
                                    (AttentionKernel::Flash, false),
                                    deterministic,
                                    &mut rng,
                                    device,
                                )
                                .0
                            })
                            .collect();
                        let same = runs.iter().all(|r| {
                            r.iter().zip(&runs[0]).all(|(a, b)| {
                                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                            })
                        });
                        if deterministic {
                            assert_eq!(
                                counters::get(Kernel::flash_attention_dq) - dq_kernels,
                                3,
                                "{label} {dtype:?} {}: deterministic attention's backward ran without the dQ kernel",
                                p.describe()
                            );
                            assert!(
                                same,
                                "{label} {dtype:?} {}: deterministic attention gave different gradients (seed {seed})",
                                p.describe()
                            );
                        } else {
                            eprintln!(
                                "note: {label} {dtype:?} {flash:?}: without the flag the runs {}",
                                if same { "agreed" } else { "differed" }
                            );
                        }
                    }
                }
            }
        }
        for_each_backend(&mut T(liger_tests::fresh_rng()));
    }

    #[test]
    fn attention_paths_match_the_f64_reference() {
        struct T(Rng);
        impl BackendVisitor for T {
            fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                let seed = self.0.seed();
                for dtype in dtypes::<B>(device) {
                    for p in problems(&mut self.0) {
                        let flash_here = B::flash_attention_variant(
                            device,
                            dtype,
                            p.head_dim,
                            &AttentionOptions::causal(p.head_dim)
                                .with_kernel(AttentionKernel::Flash),
                        )
                        .is_some();
                        let mut runs = vec![
                            (AttentionKernel::Blockwise, false),
                            (AttentionKernel::Auto, false),
                            (AttentionKernel::Auto, true),
                        ];
                        if flash_here {
                            runs.push((AttentionKernel::Flash, false));
                        }
                        // The same problem again: on CUDA its graphs are planned by now, so
                        // cuDNN's calls are queued without the caller waiting.
                        runs.push((AttentionKernel::Auto, false));
                        let repeat = runs.len() - 1;
                        for (run_index, (kernel, sequence_major)) in runs.into_iter().enumerate() {
                            let vendor_calls = liger_burn::cube::vendor_attention_calls();
                            let vendor_queued = liger_burn::cube::vendor_attention_queued();
                            let (ours, [q, k, v, g]) = run::<B>(
                                &p,
                                dtype,
                                (kernel, sequence_major),
                                false,
                                &mut self.0,
                                device,
                            );
                            let layout = if sequence_major {
                                "sequence-major"
                            } else {
                                "contiguous"
                            };
                            let vendor_ran =
                                liger_burn::cube::vendor_attention_calls() - vendor_calls;
                            // On CUDA, `Auto` runs cuDNN's attention for what it takes (a
                            // half dtype, head dimensions in 8s up to 128, no window or
                            // documents): its forward and backward both ran there.
                            if label.starts_with("cuda")
                                && kernel == AttentionKernel::Auto
                                && dtype != DType::F32
                                && p.window.is_none()
                                && p.documents.is_none()
                                && p.head_dim.is_multiple_of(8)
                                && p.head_dim <= 128
                            {
                                assert_eq!(
                                    vendor_ran,
                                    2,
                                    "{label} {dtype:?} {layout} {}: cuDNN ran {vendor_ran} of the forward and backward",
                                    p.describe()
                                );
                                if run_index == repeat {
                                    let queued =
                                        liger_burn::cube::vendor_attention_queued() - vendor_queued;
                                    assert_eq!(
                                        queued,
                                        2,
                                        "{label} {dtype:?} {}: {queued} of the repeated problem's cuDNN forward and backward were queued",
                                        p.describe()
                                    );
                                }
                            }
                            let expected = reference(&p, &q, &k, &v, &g);
                            let tol = row_tolerance(dtype, &p);
                            // The flash kernels and cuDNN keep the scores in f32; blockwise
                            // (and `Auto` where it picks blockwise) in the input dtype, as
                            // eager attention.
                            let scores = if kernel == AttentionKernel::Flash || vendor_ran == 2 {
                                DType::F32
                            } else {
                                dtype
                            };
                            let want = [
                                &expected.out,
                                &expected.grad_q,
                                &expected.grad_k,
                                &expected.grad_v,
                            ];
                            for (i, name) in ["output", "grad_q", "grad_k", "grad_v"]
                                .into_iter()
                                .enumerate()
                            {
                                let bounds = expected.row_bounds(i, p.head_dim, tol, dtype, scores);
                                if let Err(e) = compare_rows(name, &ours[i], want[i], &bounds) {
                                    panic!(
                                        "{label} {dtype:?} {kernel:?} {layout} {}: {e} (seed {seed}, rerun with LIGER_SEED={seed})",
                                        p.describe()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        for_each_backend(&mut T(liger_tests::fresh_rng()));
    }
}

/// The blockwise path with a given (padding) mask and `causal`: the same results whatever
/// the block size (the causal mask is enforced on top of the given one, so dropping the
/// keys after a block's last query never changes anything), and queries whose every key
/// the mask hides get output 0 and no gradient, not NaN.
mod given_mask {
    use super::Blocks;
    use burn::backend::Autodiff;
    use burn::tensor::{Bool, DType, Tensor, TensorData};
    use liger_burn::functional::attention;
    use liger_burn::ops::{AttentionKernel, AttentionOptions, FusedOps};
    use liger_tests::attention::{Problem, compare_rows, reference, row_tolerance};
    use liger_tests::tensors::values;
    use liger_tests::{BackendVisitor, dtypes, for_each_backend};
    use liger_verify::conformance::Rng;

    #[test]
    fn results_do_not_depend_on_the_block_size() {
        struct T(Rng);
        impl BackendVisitor for T {
            fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                let seed = self.0.seed();
                let (b, h, s, d) = (2, 2, 23, 16);
                // Left padding (keys 0..3 hidden: queries 0..3 see nothing under causal),
                // right padding (keys 20.. hidden) and random holes.
                let mut mask = vec![false; s * s];
                for i in 0..s {
                    for j in 0..s {
                        mask[i * s + j] = j < 3 || j >= 20 || (i != j && self.0.uniform() < 0.2);
                    }
                }
                let p = Problem {
                    mask: Some(mask.clone()),
                    ..Problem::causal(b, h, h, s, d)
                };
                for dtype in dtypes::<B>(device) {
                    let mut random = |lo: f64, hi: f64| {
                        Tensor::<Autodiff<B>, 4>::from_data(
                            TensorData::new(self.0.vec(b * h * s * d, lo, hi, 0.0), [b, h, s, d]),
                            device,
                        )
                        .cast(dtype)
                    };
                    let (q, k, v, g) = (
                        random(-2.0, 2.0).require_grad(),
                        random(-2.0, 2.0).require_grad(),
                        random(-1.0, 1.0).require_grad(),
                        random(-1.0, 1.0),
                    );
                    let m = Tensor::<Autodiff<B>, 2, Bool>::from_data(
                        TensorData::new(mask.clone(), [s, s]),
                        device,
                    );
                    let options =
                        AttentionOptions::causal(d).with_kernel(AttentionKernel::Blockwise);
                    let inputs = [&q, &k, &v, &g].map(|t| values(t.clone().inner()));
                    let expected = reference(&p, &inputs[0], &inputs[1], &inputs[2], &inputs[3]);
                    let want = [
                        &expected.out,
                        &expected.grad_q,
                        &expected.grad_k,
                        &expected.grad_v,
                    ];
                    // One block, blocks of 5 rows (a partial last one), blocks of one row.
                    let mut results = Vec::new();
                    for block in [None, Some(b * h * 5 * s), Some(1)] {
                        let _b = Blocks::set(block);
                        let out =
                            attention(q.clone(), k.clone(), v.clone(), Some(m.clone()), options);
                        let grads = (out.clone() * g.clone()).sum().backward();
                        let grad = |t: &Tensor<Autodiff<B>, 4>| values(t.grad(&grads).unwrap());
                        let ours = [values(out.inner()), grad(&q), grad(&k), grad(&v)];
                        for (i, name) in ["output", "grad_q", "grad_k", "grad_v"]
                            .into_iter()
                            .enumerate()
                        {
                            let bounds =
                                expected.row_bounds(i, d, row_tolerance(dtype, &p), dtype, dtype);
                            compare_rows(name, &ours[i], want[i], &bounds).unwrap_or_else(|e| {
                                panic!("{label} {dtype:?} block {block:?}: {e} (seed {seed})")
                            });
                        }
                        // Queries 0..3 see no key: exactly zero.
                        assert!(
                            (0..b * h).all(|bh| (0..3 * d).all(|e| ours[0][bh * s * d + e] == 0.0)),
                            "{label} {dtype:?} block {block:?}: a query that sees no key must give 0"
                        );
                        results.push(ours);
                    }
                    for r in &results[1..] {
                        for i in 0..4 {
                            let bounds =
                                expected.row_bounds(i, d, row_tolerance(dtype, &p), dtype, dtype);
                            compare_rows("block vs one block", &r[i], &results[0][i], &bounds)
                                .unwrap_or_else(|e| panic!("{label} {dtype:?}: {e} (seed {seed})"));
                        }
                    }
                }
            }
        }
        for_each_backend(&mut T(liger_tests::fresh_rng()));
    }

    #[test]
    fn a_window_of_zero_keys_is_refused_at_the_entry() {
        struct T;
        impl BackendVisitor for T {
            fn visit<B: FusedOps>(&mut self, label: &str, device: &B::Device) {
                let t = || Tensor::<B, 4>::ones([1, 2, 4, 8], device);
                let msg = liger_tests::errors::panic_message(|| {
                    attention(
                        t(),
                        t(),
                        t(),
                        None,
                        AttentionOptions::causal(8).with_window(Some(0)),
                    );
                });
                liger_tests::errors::assert_mentions(label, &msg, &["attention", "window of 0"]);
                let _ = DType::F32;
            }
        }
        for_each_backend(&mut T);
    }
}

/// The row-wise comparison the attention suites use rejects wrong results: zeros, 2×, a
/// dropped last row, a permuted gradient, dk and dv swapped; and accepts the reference with
/// noise within the tolerance.
#[test]
fn the_attention_comparison_rejects_wrong_results() {
    use liger_tests::attention::{
        Problem, compare_rows, random_documents, reference, row_tolerance,
    };
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    for p in [
        Problem::causal(2, 4, 2, 33, 16),
        Problem {
            window: Some(5),
            documents: Some(random_documents(&mut rng, 1, 40, 15, false)),
            ..Problem::causal(1, 2, 1, 40, 32)
        },
    ] {
        let q: Vec<f64> = rng
            .vec(p.q_len(), -2.0, 2.0, 0.0)
            .into_iter()
            .map(f64::from)
            .collect();
        let k: Vec<f64> = rng
            .vec(p.kv_len(), -2.0, 2.0, 0.0)
            .into_iter()
            .map(f64::from)
            .collect();
        let v: Vec<f64> = rng
            .vec(p.kv_len(), -1.0, 1.0, 0.0)
            .into_iter()
            .map(f64::from)
            .collect();
        let g: Vec<f64> = rng
            .vec(p.q_len(), -1.0, 1.0, 0.0)
            .into_iter()
            .map(f64::from)
            .collect();
        let r = reference(&p, &q, &k, &v, &g);
        let d = p.head_dim;
        for dtype in [burn::tensor::DType::F32, burn::tensor::DType::BF16] {
            let tol = row_tolerance(dtype, &p);
            let bounds = |i| r.row_bounds(i, d, tol, dtype, burn::tensor::DType::F32);
            let tensors = [&r.out, &r.grad_q, &r.grad_k, &r.grad_v];
            for (i, t) in tensors.iter().enumerate() {
                let b = bounds(i);
                // Accepted: the reference, and the reference with noise at half the bound.
                assert!(compare_rows("same", t, t, &b).is_ok());
                let noisy: Vec<f64> = t
                    .iter()
                    .enumerate()
                    .map(|(e, x)| {
                        x + 0.4 * b[e / d] / (d as f64).sqrt() * if e % 2 == 0 { 1.0 } else { -1.0 }
                    })
                    .collect();
                assert!(
                    compare_rows("noise", &noisy, t, &b).is_ok(),
                    "noise rejected (seed {seed})"
                );
                let wrong: Vec<(&str, Vec<f64>)> = vec![
                    ("zeros", vec![0.0; t.len()]),
                    ("2x", t.iter().map(|x| 2.0 * x).collect()),
                    // The last row that is not zero anyway (a query alone in its document
                    // has no q gradient).
                    ("last row dropped", {
                        let mut w = (*t).clone();
                        let norm = |r: usize| {
                            t[r * d..(r + 1) * d]
                                .iter()
                                .map(|x| x * x)
                                .sum::<f64>()
                                .sqrt()
                        };
                        let last = (0..b.len())
                            .rev()
                            .find(|&r| norm(r) > 2.0 * b[r])
                            .expect("a nonzero row");
                        w[last * d..(last + 1) * d]
                            .iter_mut()
                            .for_each(|x| *x = 0.0);
                        w
                    }),
                    ("rows reversed", {
                        let mut w: Vec<f64> = t.chunks(d).rev().flatten().copied().collect();
                        w.truncate(t.len());
                        w
                    }),
                    (
                        "transposed within rows",
                        t.chunks(d).flat_map(|c| c.iter().rev()).copied().collect(),
                    ),
                ];
                for (what, w) in wrong {
                    assert!(
                        compare_rows("wrong", &w, t, &b).is_err(),
                        "{what} of tensor {i} accepted ({}, {dtype:?}, seed {seed})",
                        p.describe()
                    );
                }
            }
            // dk and dv swapped.
            assert!(compare_rows("swap", &r.grad_v, &r.grad_k, &bounds(2)).is_err());
            assert!(compare_rows("swap", &r.grad_k, &r.grad_v, &bounds(3)).is_err());
        }
    }
}

/// GPUs run f32 with flush-to-zero: a probability, product or running sum below 2⁻¹²⁶
/// becomes 0, and a flushed probability reaches `dS = p·(dP − D)` times `dP − D`. A key
/// that the queries seeing it score about 88 below their other keys has probabilities at
/// 2⁻¹²⁶ and a gradient row around it. Attention computed in f64 with f32's flushes must
/// pass the f32 bounds, and fail them once its result is doubled.
#[test]
fn the_attention_bounds_cover_flush_to_zero() {
    use liger_tests::attention::{Problem, compare_rows, reference, row_tolerance};
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let p = Problem::causal(1, 1, 1, 6, 64);
    let (s, d) = (p.seq, p.head_dim);
    let mut draw = |n: usize, lo: f64, hi: f64| -> Vec<f64> {
        rng.vec(n, lo, hi, 0.0).into_iter().map(f64::from).collect()
    };
    let scale = (d as f64).powf(-0.5);
    let smallest_normal = f64::from(f32::MIN_POSITIVE);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut q = draw(p.q_len(), -2.0, 2.0);
    let mut k = draw(p.kv_len(), -2.0, 2.0);
    // Values and upstream gradients of a few units make |dP − D| tens.
    let v = draw(p.kv_len(), -4.0, 4.0);
    let g = draw(p.q_len(), -4.0, 4.0);
    // Queries 4 and 5 alike; key 4 scored `lse − ln(0.75·2⁻¹²⁶)` below query 4's keys 0..4.
    let (tiny_key, q4) = (4, q[4 * d..5 * d].to_vec());
    q[5 * d..6 * d].copy_from_slice(&q4);
    let lse4 = (0..tiny_key)
        .map(|j| scale * dot(&q4, &k[j * d..(j + 1) * d]))
        .map(f64::exp)
        .sum::<f64>()
        .ln();
    let target = lse4 + (0.75 * smallest_normal).ln();
    let q4_norm2 = dot(&q4, &q4);
    for e in 0..d {
        k[tiny_key * d + e] = target / scale * q4[e] / q4_norm2;
    }
    let ftz = |x: f64| if x.abs() < smallest_normal { 0.0 } else { x };
    let (mut out, mut gq, mut gk, mut gv) = (
        vec![0.0; q.len()],
        vec![0.0; q.len()],
        vec![0.0; k.len()],
        vec![0.0; v.len()],
    );
    let row = |t: &[f64], r: usize| t[r * d..(r + 1) * d].to_vec();
    for i in 0..s {
        let scores: Vec<f64> = (0..=i)
            .map(|j| scale * dot(&row(&q, i), &row(&k, j)))
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + scores.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let prob: Vec<f64> = scores.iter().map(|x| ftz((x - lse).exp())).collect();
        for (j, pj) in prob.iter().enumerate() {
            for e in 0..d {
                out[i * d + e] = ftz(out[i * d + e] + ftz(pj * v[j * d + e]));
                gv[j * d + e] = ftz(gv[j * d + e] + ftz(pj * g[i * d + e]));
            }
        }
        let big_d = dot(&row(&g, i), &row(&out, i));
        for (j, pj) in prob.iter().enumerate() {
            let ds = ftz(scale * ftz(pj * (dot(&row(&g, i), &row(&v, j)) - big_d)));
            for e in 0..d {
                gq[i * d + e] = ftz(gq[i * d + e] + ftz(ds * k[j * d + e]));
                gk[j * d + e] = ftz(gk[j * d + e] + ftz(ds * q[i * d + e]));
            }
        }
    }
    let r = reference(&p, &q, &k, &v, &g);
    assert!(
        row(&gk, tiny_key).iter().all(|&x| x == 0.0)
            && row(&r.grad_k, tiny_key).iter().any(|&x| x != 0.0),
        "key {tiny_key}'s gradient is not the flushed one (seed {seed})"
    );
    let tol = row_tolerance(burn::tensor::DType::F32, &p);
    for (which, (name, ours, want)) in [
        ("output", &out, &r.out),
        ("grad_q", &gq, &r.grad_q),
        ("grad_k", &gk, &r.grad_k),
        ("grad_v", &gv, &r.grad_v),
    ]
    .into_iter()
    .enumerate()
    {
        let f32_ = burn::tensor::DType::F32;
        let bounds = r.row_bounds(which, d, tol, f32_, f32_);
        compare_rows(name, ours, want, &bounds)
            .unwrap_or_else(|e| panic!("{e} under flush-to-zero (seed {seed})"));
        let doubled: Vec<f64> = want.iter().map(|x| 2.0 * x).collect();
        assert!(
            compare_rows(name, &doubled, want, &bounds).is_err(),
            "{name} doubled accepted (seed {seed})"
        );
    }
}

/// Stock Burn's `burn::tensor::module::attention` on `Liger<Autodiff<B>>` runs
/// `fused_attention` (the blockwise path's fused softmax on lavapipe, the flash kernels on
/// CUDA in half precision) and trains through its node: output and gradients against the
/// f64 reference; with a bias (which liger does not take) it runs Burn's own.
mod module_op {
    use burn::backend::Autodiff;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{DType, Tensor, TensorData};
    use liger_burn::Liger;
    use liger_cubecl_kernels::counters::{self, Kernel};
    use liger_tests::attention::{Problem, compare_rows, reference, row_tolerance};
    use liger_tests::tensors::values;

    /// Launches of liger's attention kernels and calls of cuDNN's (which CUDA runs for
    /// f16/bf16 heads it takes).
    fn launches() -> u64 {
        counters::get(Kernel::softmax_forward)
            + counters::get(Kernel::flash_attention_forward)
            + liger_burn::cube::vendor_attention_calls()
    }

    fn check<B: liger_burn::ops::FusedOps>(label: &str, device: &B::Device)
    where
        Liger<Autodiff<B>>: AutodiffBackend<Device = B::Device>,
    {
        type L<B> = Liger<Autodiff<B>>;
        let mut rng = liger_tests::fresh_rng();
        let seed = rng.seed();
        let (b, h, s, d) = (2, 3, 19, 32);
        for dtype in liger_tests::dtypes::<B>(device) {
            for causal in [true, false] {
                let mut random = |lo: f64, hi: f64| {
                    Tensor::<L<B>, 4>::from_data(
                        TensorData::new(rng.vec(b * h * s * d, lo, hi, 0.0), [b, h, s, d]),
                        device,
                    )
                    .cast(dtype)
                };
                let (q, k, v, g) = (
                    random(-2.0, 2.0).require_grad(),
                    random(-2.0, 2.0).require_grad(),
                    random(-1.0, 1.0).require_grad(),
                    random(-1.0, 1.0),
                );
                let options = AttentionModuleOptions {
                    scale: None,
                    softcap: None,
                    is_causal: causal,
                };
                // The fusion stream runs lazily: the counters are read after the values.
                let before = launches();
                let out = attention(q.clone(), k.clone(), v.clone(), None, None, options);
                let out_values = values(out.clone().inner());
                assert!(
                    launches() > before,
                    "{label} {dtype:?}: ModuleOps::attention did not reach fused_attention"
                );
                let grads = (out.clone() * g.clone()).sum().backward();
                let grad = |t: &Tensor<L<B>, 4>| values(t.grad(&grads).expect("a gradient"));
                let ours = [out_values, grad(&q), grad(&k), grad(&v)];
                let p = Problem {
                    causal,
                    ..Problem::causal(b, h, h, s, d)
                };
                let inputs = [&q, &k, &v, &g].map(|t| values(t.clone().inner()));
                let r = reference(&p, &inputs[0], &inputs[1], &inputs[2], &inputs[3]);
                let want = [&r.out, &r.grad_q, &r.grad_k, &r.grad_v];
                for (i, name) in ["output", "grad_q", "grad_k", "grad_v"]
                    .into_iter()
                    .enumerate()
                {
                    let bounds = r.row_bounds(i, d, row_tolerance(dtype, &p), dtype, dtype);
                    compare_rows(name, &ours[i], want[i], &bounds).unwrap_or_else(|e| {
                        panic!("{label} {dtype:?} causal {causal}: {e} (seed {seed})")
                    });
                }
                // A bias goes to Burn's own attention (no fused launch), same result.
                let bias = Tensor::<L<B>, 4>::zeros([b, h, s, s], device).cast(dtype);
                let before = launches();
                let stock = attention(q.clone(), k.clone(), v.clone(), None, Some(bias), options);
                let stock = values(stock.inner());
                assert_eq!(
                    launches(),
                    before,
                    "{label}: a bias must go to Burn's attention"
                );
                // Burn's own attention may run f32 on tensor cores (TF32: f16's 10-bit
                // mantissa), so its bound in f32 is f16's rounding.
                let stock_rounding = if dtype == DType::F32 {
                    DType::F16
                } else {
                    dtype
                };
                let bounds = r.row_bounds(
                    0,
                    d,
                    4.0 * row_tolerance(stock_rounding, &p),
                    stock_rounding,
                    stock_rounding,
                );
                compare_rows("stock output", &stock, &r.out, &bounds)
                    .unwrap_or_else(|e| panic!("{label} {dtype:?} stock: {e} (seed {seed})"));
                let _ = DType::F32;
            }
        }
    }

    #[test]
    fn burn_attention_runs_fused_attention_and_trains_through_it() {
        match liger_tests::device_name().as_str() {
            "wgpu-cpu" => {
                use burn::backend::wgpu::{Wgpu, WgpuDevice};
                check::<Wgpu>("wgpu-cpu/fusion", &WgpuDevice::Cpu);
            }
            "vulkan" => check::<burn::backend::wgpu::Wgpu>("vulkan/fusion", &Default::default()),
            #[cfg(feature = "cuda")]
            "cuda" => check::<burn::backend::Cuda>("cuda/fusion", &Default::default()),
            other => eprintln!("note: no CubeCL device for {other}; not run"),
        }
    }
}
