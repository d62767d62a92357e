//! One AdamW step over one parameter tensor in one pass over memory: the parameter, its
//! gradient and the moments are read once and the parameter and the moments written once,
//! where Burn's `AdamW` runs a dozen elementwise ops, each a pass of its own.
//!
//! The math is Burn 0.21's `AdamW` (`burn-optim`, `optim/adamw.rs`), op for op in f32, with
//! its scalars computed on the host the way Burn computes them (see [`AdamWScalars`]):
//!
//! ```text
//! m  = β₁·m + (1-β₁)·g              (step 1: m = (1-β₁)·g)
//! v  = β₂·v + (1-β₂)·g²             (step 1: v = (1-β₂)·g²)
//! v̂max = max(v̂max, v)              (AMSGrad only; step 1: v)
//! δ  = (m / (1-β₁ᵗ)) / (√(v / (1-β₂ᵗ)) + ε)
//! p  = p·(1 - lr·wd) - lr·δ         (cautious: p - [sign p = sign m]·lr·wd·p - lr·δ)
//! ```
//!
//! which is PyTorch's `torch.optim.AdamW` (decoupled weight decay applied to the old
//! parameter, ε added to the bias-corrected root) up to rounding: PyTorch folds the bias
//! corrections into the step size (`p -= lr/(1-β₁ᵗ) · m / (√v/√(1-β₂ᵗ) + ε)`), Burn
//! divides the moments by them, as here.
//!
//! Each buffer has its own dtype: the parameter `P`, the gradient `G`, the moments `S`
//! (f32, f16 or bf16 each), and an optional low-precision copy of the updated parameter
//! `C`, written in the same pass. Mixed-precision training updates an f32 master copy from
//! a bf16 gradient and writes the bf16 working weights at once. Everything is widened to
//! f32 on load and rounded once on the store.
//!
//! The parameter and the moments are updated in place when the caller owns them
//! ([`AdamWBuffers::in_place`]), else written to fresh buffers; either way each element is
//! read and written once. The geometry is [`crate::elementwise`]'s: vectorized loads, a
//! cube per block of `units × vectors_per_unit` vectors, grid striding past the device's
//! cube limit, several launches past 2³⁰ vectors.

use crate::counters::{self, Kernel};
use crate::elementwise::ElementwiseLaunch;
use crate::launch::{ElementwiseConfig, KernelError, array, check_float_dtype};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Most vectors one launch addresses (32-bit indices; see [`crate::elementwise`]).
const MAX_VECTORS_PER_LAUNCH: usize = 1 << 30;

/// The comptime shape of a step: which buffers are read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdamWVariant {
    /// The first step: the moments are not read (they start at zero).
    pub first: bool,
    /// The parameter and the moments are read from and written to the same buffers.
    pub in_place: bool,
    /// AMSGrad: a third state buffer, the running maximum of `v`.
    pub amsgrad: bool,
    /// Cautious weight decay (no decay where the parameter's sign differs from `m`'s).
    pub cautious: bool,
    /// The updated parameter is also written, in the copy's dtype, to the copy buffer.
    pub write_copy: bool,
}

/// The step's scalars, runtime arguments of the kernel (the learning rate changes every
/// step and the bias corrections with the step count: neither is compiled in).
///
/// [`AdamWScalars::burn`] computes them as Burn's `AdamW` does, in the same precisions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// `β₁`.
    pub beta_1: f32,
    /// `β₂`.
    pub beta_2: f32,
    /// `1 - β₁` (f32).
    pub one_minus_beta_1: f32,
    /// `1 - β₂` (f32).
    pub one_minus_beta_2: f32,
    /// `1 - β₁ᵗ` (f32).
    pub bias_correction_1: f32,
    /// `1 - β₂ᵗ` (f32).
    pub bias_correction_2: f32,
    /// `ε`, added to the bias-corrected root.
    pub epsilon: f32,
    /// The learning rate, rounded to f32.
    pub lr: f32,
    /// `lr · wd` (computed in f64, rounded to f32): the cautious decay's rate.
    pub decay_rate: f32,
    /// `1 - lr · wd` (computed in f64, rounded to f32): the decoupled decay's factor.
    pub decay_factor: f32,
}

impl AdamWScalars {
    /// The scalars of step `time` (1 for the first step), computed as Burn 0.21's `AdamW`
    /// computes them: `1 - β` and the bias corrections `1 - βᵗ` (`powi`) in f32, the decay
    /// `lr · wd` in f64 (the learning rate is an f64, the weight decay an f32), every
    /// scalar an f32 when it meets the tensor.
    pub fn burn(
        lr: f64,
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        weight_decay: f32,
        time: usize,
    ) -> Self {
        let t = time.min(i32::MAX as usize) as i32;
        let decay_rate = lr * weight_decay as f64;
        Self {
            beta_1,
            beta_2,
            one_minus_beta_1: 1.0 - beta_1,
            one_minus_beta_2: 1.0 - beta_2,
            bias_correction_1: 1.0 - beta_1.powi(t),
            bias_correction_2: 1.0 - beta_2.powi(t),
            epsilon,
            lr: lr as f32,
            decay_rate: decay_rate as f32,
            decay_factor: (1.0 - decay_rate) as f32,
        }
    }
}

/// The buffers of one step, each `len` contiguous elements of its dtype.
pub struct AdamWBuffers<'a> {
    /// The parameter (read; written too when `in_place`).
    pub param: &'a Handle,
    /// Its dtype.
    pub param_dtype: StorageType,
    /// The gradient (read).
    pub grad: &'a Handle,
    /// Its dtype.
    pub grad_dtype: StorageType,
    /// `m`, `v` and, with AMSGrad, `v̂max`, as read (ignored on the first step; the same as
    /// `state_out` when `in_place`).
    pub state_in: [Option<&'a Handle>; 3],
    /// The same three, as written.
    pub state_out: [Option<&'a Handle>; 3],
    /// The moments' dtype.
    pub state_dtype: StorageType,
    /// Where the updated parameter goes when not in place.
    pub param_out: Option<&'a Handle>,
    /// The low-precision copy of the updated parameter, and its dtype.
    pub copy: Option<(&'a Handle, StorageType)>,
    /// Read and write the parameter and the moments in the same buffers (`param`,
    /// `state_out`); `param_out` and `state_in` are then unused.
    pub in_place: bool,
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel<P: Float, G: Float, S: Float, C: Float, N: Size>(
    param: &Array<Vector<P, N>>,
    param_out: &mut Array<Vector<P, N>>,
    grad: &Array<Vector<G, N>>,
    m_in: &Array<Vector<S, N>>,
    v_in: &Array<Vector<S, N>>,
    vmax_in: &Array<Vector<S, N>>,
    m_out: &mut Array<Vector<S, N>>,
    v_out: &mut Array<Vector<S, N>>,
    vmax_out: &mut Array<Vector<S, N>>,
    copy: &mut Array<Vector<C, N>>,
    len: u32,
    beta_1: f32,
    beta_2: f32,
    one_minus_beta_1: f32,
    one_minus_beta_2: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    lr: f32,
    decay_rate: f32,
    decay_factor: f32,
    #[comptime] variant: AdamWVariant,
    #[comptime] units: u32,
    #[comptime] vectors_per_unit: u32,
    #[define(P, G, S, C)] _dtypes: [StorageType; 4],
) {
    let len = len as usize;
    let block = comptime!((units * vectors_per_unit) as usize);
    let first = comptime!(variant.first);
    let in_place = comptime!(variant.in_place);
    let amsgrad = comptime!(variant.amsgrad);
    let cautious = comptime!(variant.cautious);
    let write_copy = comptime!(variant.write_copy);
    let mut start = CUBE_POS * block;
    while start < len {
        let unit_first = start + UNIT_POS as usize;
        let mut rp = Array::<Vector<P, N>>::new(vectors_per_unit as usize);
        let mut rg = Array::<Vector<G, N>>::new(vectors_per_unit as usize);
        let mut rm = Array::<Vector<S, N>>::new(vectors_per_unit as usize);
        let mut rv = Array::<Vector<S, N>>::new(vectors_per_unit as usize);
        let mut rx = Array::<Vector<S, N>>::new(vectors_per_unit as usize);
        // Every load first (in the buffers' dtypes), so they are all in flight together...
        #[unroll]
        for k in 0..vectors_per_unit {
            let i = unit_first + k as usize * units as usize;
            if i < len {
                if in_place {
                    rp[k as usize] = param_out[i];
                } else {
                    rp[k as usize] = param[i];
                }
                rg[k as usize] = grad[i];
                if !first {
                    if in_place {
                        rm[k as usize] = m_out[i];
                        rv[k as usize] = v_out[i];
                        if amsgrad {
                            rx[k as usize] = vmax_out[i];
                        }
                    } else {
                        rm[k as usize] = m_in[i];
                        rv[k as usize] = v_in[i];
                        if amsgrad {
                            rx[k as usize] = vmax_in[i];
                        }
                    }
                }
            }
        }
        // ...then the update in f32, Burn's op order, and the stores.
        #[unroll]
        for k in 0..vectors_per_unit {
            let i = unit_first + k as usize * units as usize;
            if i < len {
                let g = Vector::<f32, N>::cast_from(rg[k as usize]);
                let p = Vector::<f32, N>::cast_from(rp[k as usize]);
                let mut m = g * Vector::new(one_minus_beta_1);
                let mut v = g * g * Vector::new(one_minus_beta_2);
                if !first {
                    m = Vector::<f32, N>::cast_from(rm[k as usize]) * Vector::new(beta_1) + m;
                    v = Vector::<f32, N>::cast_from(rv[k as usize]) * Vector::new(beta_2) + v;
                }
                let mut v_used = v;
                if amsgrad {
                    if !first {
                        let old = Vector::<f32, N>::cast_from(rx[k as usize]);
                        v_used = select_many(old.greater_than(v), old, v);
                    }
                    vmax_out[i] = Vector::<S, N>::cast_from(v_used);
                }
                let m_hat = m / Vector::new(bias_correction_1);
                let v_hat = v_used / Vector::new(bias_correction_2);
                let delta = m_hat / (Vector::sqrt(v_hat) + Vector::new(epsilon));
                let mut decayed = p * Vector::new(decay_factor);
                if cautious {
                    // No decay where the parameter and `m` differ in sign (`≥ 0` each).
                    let zero = Vector::<f32, N>::new(0.0);
                    let one = Vector::<f32, N>::new(1.0);
                    let p_sign = select_many(p.greater_equal(zero), one, zero);
                    let m_sign = select_many(m.greater_equal(zero), one, zero);
                    let decay =
                        select_many(p_sign.not_equal(m_sign), zero, p * Vector::new(decay_rate));
                    decayed = p - decay;
                }
                let updated = decayed - delta * Vector::new(lr);
                m_out[i] = Vector::<S, N>::cast_from(m);
                v_out[i] = Vector::<S, N>::cast_from(v);
                param_out[i] = Vector::<P, N>::cast_from(updated);
                if write_copy {
                    copy[i] = Vector::<C, N>::cast_from(updated);
                }
            }
        }
        start += CUBE_COUNT * block;
    }
}

/// One AdamW step over `len` elements (see the module docs for the math and the buffers).
///
/// Panics when a buffer the variant needs is missing; returns an error for a dtype the
/// kernel does not read.
pub fn adamw_step<R: Runtime>(
    client: &ComputeClient<R>,
    config: &ElementwiseConfig,
    buffers: &AdamWBuffers<'_>,
    len: usize,
    first: bool,
    cautious: bool,
    scalars: &AdamWScalars,
) -> Result<(), KernelError> {
    const OP: &str = "adamw_step";
    check_float_dtype(OP, buffers.param_dtype)?;
    check_float_dtype(OP, buffers.grad_dtype)?;
    check_float_dtype(OP, buffers.state_dtype)?;
    let copy_dtype = buffers.copy.map_or(buffers.param_dtype, |(_, d)| d);
    check_float_dtype(OP, copy_dtype)?;
    let amsgrad = buffers.state_out[2].is_some();
    let variant = AdamWVariant {
        first,
        in_place: buffers.in_place,
        amsgrad,
        cautious,
        write_copy: buffers.copy.is_some(),
    };
    let need = |h: Option<&Handle>, what: &str| -> Handle {
        h.unwrap_or_else(|| panic!("{OP}: the {what} buffer is missing ({variant:?})"))
            .clone()
    };
    let state_out = [
        need(buffers.state_out[0], "m output"),
        need(buffers.state_out[1], "v output"),
    ];
    let state_in = if first || buffers.in_place {
        None
    } else {
        Some([
            need(buffers.state_in[0], "m input"),
            need(buffers.state_in[1], "v input"),
        ])
    };
    let vmax_in =
        (amsgrad && !first && !buffers.in_place).then(|| need(buffers.state_in[2], "v̂max input"));
    let param_out = if buffers.in_place {
        buffers.param.clone()
    } else {
        need(buffers.param_out, "parameter output")
    };
    if len == 0 {
        return Ok(());
    }
    let widest = [
        buffers.param_dtype,
        buffers.grad_dtype,
        buffers.state_dtype,
        copy_dtype,
    ]
    .iter()
    .map(|d| d.size())
    .max()
    .unwrap_or(4);
    let geometry = ElementwiseLaunch::new(client, config, len, widest);
    let vector_size = geometry.vector_size;
    let vectors = len / vector_size;
    let dummy = client.empty(vector_size * widest);
    let per_launch = config
        .vectors_per_launch
        .map_or(MAX_VECTORS_PER_LAUNCH, |v| {
            let align = client.properties().memory.alignment.max(1) as usize;
            v.next_multiple_of(align).min(MAX_VECTORS_PER_LAUNCH)
        });
    let mut done = 0usize;
    while done < vectors {
        let count = (vectors - done).min(per_launch);
        let slice = |h: &Handle, dtype: StorageType| {
            let offset = (done * vector_size * dtype.size()) as u64;
            if offset == 0 {
                array::<R>(h, count)
            } else {
                array::<R>(&h.clone().offset_start(offset), count)
            }
        };
        let unused = || array::<R>(&dummy, 1);
        let state = buffers.state_dtype;
        let (m_in, v_in) = match &state_in {
            Some([m, v]) => (slice(m, state), slice(v, state)),
            None => (unused(), unused()),
        };
        let vmax_in = vmax_in.as_ref().map_or_else(unused, |h| slice(h, state));
        let vmax_out = buffers.state_out[2].map_or_else(unused, |h| slice(h, state));
        let param_in = if buffers.in_place {
            unused()
        } else {
            slice(buffers.param, buffers.param_dtype)
        };
        let copy = buffers
            .copy
            .map_or_else(unused, |(h, dtype)| slice(h, dtype));
        // Safety: each bound array is `count` vectors of a buffer of at least
        // `done + count` vectors (the callers pass buffers of `len` elements), every index
        // the kernel touches is below `count`, and the unused bindings are never accessed
        // (the variant is comptime).
        unsafe {
            adamw_kernel::launch_unchecked::<R>(
                client,
                geometry.cube_count(count),
                CubeDim::new_1d(geometry.units),
                vector_size,
                param_in,
                slice(&param_out, buffers.param_dtype),
                slice(buffers.grad, buffers.grad_dtype),
                m_in,
                v_in,
                vmax_in,
                slice(&state_out[0], state),
                slice(&state_out[1], state),
                vmax_out,
                copy,
                count as u32,
                scalars.beta_1,
                scalars.beta_2,
                scalars.one_minus_beta_1,
                scalars.one_minus_beta_2,
                scalars.bias_correction_1,
                scalars.bias_correction_2,
                scalars.epsilon,
                scalars.lr,
                scalars.decay_rate,
                scalars.decay_factor,
                variant,
                geometry.units,
                geometry.vectors_per_unit,
                [buffers.param_dtype, buffers.grad_dtype, state, copy_dtype],
            );
        }
        done += count;
    }
    counters::record(if buffers.in_place {
        Kernel::adamw_step_in_place
    } else {
        Kernel::adamw_step
    });
    Ok(())
}
