//! Two training runs of one model compared: their shared inputs, every parameter's
//! gradient named by its module path, and the first one that differs between the runs.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use liger_models::{LigerConfig, ModelConfig};
use liger_verify::conformance::Rng;

/// Shared inputs of two runs: `[2, 11]` random token ids (row-major) and a seed for the
/// model's initialization, drawn from `rng`.
pub fn run_inputs(rng: &mut Rng, config: &ModelConfig) -> (Vec<i64>, [usize; 2], u64) {
    let shape = [2, 11];
    let ids = (0..shape[0] * shape[1])
        .map(|_| rng.below(config.vocab_size) as i64)
        .collect();
    (ids, shape, rng.next_u64() >> 1)
}

/// Every kernel on, with deterministic gradients: the flash backward's atomic dQ sums may
/// otherwise differ in their last bits from run to run on CUDA.
pub fn deterministic_kernels() -> LigerConfig {
    LigerConfig {
        deterministic: true,
        ..LigerConfig::all()
    }
}

/// A parameter's path (`model.layers.0.self_attn.q_proj.weight`) and its gradient as f32
/// (`None` when it got none: a frozen parameter).
pub type NamedGrad = (String, Option<Vec<f32>>);

/// Every float parameter's gradient in `grads`, in the module's visiting order.
pub fn named_grads<A: AutodiffBackend, M: Module<A>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<NamedGrad> {
    struct Collect<'a> {
        grads: &'a GradientsParams,
        path: Vec<String>,
        out: Vec<NamedGrad>,
    }
    impl<A: AutodiffBackend> ModuleVisitor<A> for Collect<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
            let grad = self.grads.get::<A::InnerBackend, D>(param.id).map(|g| {
                g.into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .expect("gradient values")
            });
            self.out.push((self.path.join("."), grad));
        }
    }
    let mut c = Collect {
        grads,
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

/// The first parameter whose gradient differs in any bit between `a` and `b` (or is
/// present in one and not the other), by path.
pub fn first_difference(a: &[NamedGrad], b: &[NamedGrad]) -> Option<String> {
    assert_eq!(
        a.len(),
        b.len(),
        "the two runs have different parameter lists"
    );
    a.iter().zip(b).find_map(|((name, x), (_, y))| {
        let same = match (x, y) {
            (Some(x), Some(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            (None, None) => true,
            _ => false,
        };
        (!same).then(|| name.clone())
    })
}

/// Checks that [`first_difference`] sees a doubled element in the last gradient and a
/// gradient dropped from the first one that has one.
pub fn assert_differences_seen(grads: &[NamedGrad]) {
    let mut doubled = grads.to_vec();
    let last = doubled
        .iter_mut()
        .rev()
        .find(|(_, g)| g.is_some())
        .expect("a gradient");
    let values = last.1.as_mut().unwrap();
    values[0] = 2.0 * values[0] + 1.0;
    let name = last.0.clone();
    assert_eq!(first_difference(&doubled, grads), Some(name));
    let mut dropped = grads.to_vec();
    let first = dropped.iter_mut().find(|(_, g)| g.is_some()).unwrap();
    first.1 = None;
    let name = first.0.clone();
    assert_eq!(first_difference(&dropped, grads), Some(name));
}
