//! One chunk's rows of a distillation from a frozen teacher: the soft loss (a divergence
//! between the teacher's and the student's tempered distributions), the hard loss (cross
//! entropy against the targets) and the gradient of their weighted sum with respect to the
//! student's logits, in one kernel.
//!
//! For a row with student logits `s` (width `V`), teacher logits `t` (width `V_t ≥ V`; the
//! student is padded with zero logits up to `V_t`, as Liger-Kernel does), temperature `τ`:
//!
//! - `log Q = log_softmax(s/τ)`, `log P = log_softmax(t/τ)` over `V_t` columns;
//! - the soft loss `Σ_c D_c` and `dX_c = ∂D/∂log Q_c`: the JSD with `β`,
//!   `M = βP + (1−β)Q`: `D = β P (log P − log M) + (1−β) Q (log Q − log M)`,
//!   `dX = (1−β) Q (log Q − log M)`; the forward KL (`β = 0`): `D = P (log P − log Q)`,
//!   `dX = −P`; the reverse KL (`β = 1`): `D = Q (log Q − log P)`, `dX = D + Q`; the TVD:
//!   `D = ½ |Q − P|`, `dX = ±½ Q` (`+` where `Q > P`);
//! - the hard loss `lse(s) − s_y` (over the `V` columns, without temperature);
//! - `grad_c = σ (w_s (dX_c − Q_c Σ dX) + w_h (softmax(s)_c − δ_cy))` for `c < V`, with
//!   `σ` the device-side scale (`[1]` f32, e.g. one over the non-ignored rows) and the
//!   weights `w_s` (the soft loss's, over `τ`: the chain rule's factor) and `w_h`.
//!
//! Rows whose target is `ignore_index` or outside `[0, V)` get losses 0 and a zero
//! gradient. Everything is f32 whatever the logits' dtype; the gradient is rounded once.
//!
//! Pass 1 reads both rows with online max / sum-of-exp accumulators for `s/τ`, `t/τ` and
//! (when they differ from `s/τ`'s) `s`; pass 2 reads them again for the loss and `Σ dX`;
//! pass 3 writes the gradient. The gradient may be written over the student's logits
//! (`in_place`): each element is read and then written by the same unit, after every read
//! of the first two passes.

use crate::counters::{self, Kernel};
use crate::cross_entropy::{check_target_dtype, ignore_index_scalar};
use crate::launch::{KernelError, LaunchConfig, RowLaunch, array, check_float_dtype};
use crate::reduce::{ReduceOp, cube_reduce, online_update, shifted_exp, vector_sum};
use cubecl::prelude::*;
use cubecl::server::Handle;

/// The soft loss's divergence, a comptime choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DistillDivergence {
    /// The generalized Jensen-Shannon divergence with `0 < β < 1` (given at launch).
    Jsd,
    /// `KL(P ‖ Q)` (the JSD's `β = 0`).
    ForwardKl,
    /// `KL(Q ‖ P)` (the JSD's `β = 1`).
    ReverseKl,
    /// The total variation distance.
    Tvd,
}

/// `ln(eᵃ + eᵇ)` lane by lane, shifted by the larger operand.
#[cube]
fn log_add_exp<N: Size>(a: Vector<f32, N>, b: Vector<f32, N>) -> Vector<f32, N> {
    let m = select_many(a.greater_than(b), a, b);
    m + Vector::ln(Vector::exp(a - m) + Vector::exp(b - m))
}

/// `log M = log(βP + (1−β)Q)` of the JSD's mixture, from `log P`, `log Q` and `β`'s logarithms.
#[cube]
fn log_mixture<N: Size>(
    log_q: Vector<f32, N>,
    log_p: Vector<f32, N>,
    ln_beta: f32,
    ln_one_minus_beta: f32,
) -> Vector<f32, N> {
    log_add_exp::<N>(
        log_p + Vector::new(ln_beta),
        log_q + Vector::new(ln_one_minus_beta),
    )
}

/// The divergence's elementwise values `D_c`.
#[cube]
fn divergence_value<N: Size>(
    log_q: Vector<f32, N>,
    log_p: Vector<f32, N>,
    beta: f32,
    ln_beta: f32,
    ln_one_minus_beta: f32,
    #[comptime] divergence: DistillDivergence,
) -> Vector<f32, N> {
    let q = Vector::exp(log_q);
    let p = Vector::exp(log_p);
    match divergence {
        DistillDivergence::ForwardKl => p * (log_p - log_q),
        DistillDivergence::ReverseKl => q * (log_q - log_p),
        DistillDivergence::Jsd => {
            let log_m = log_mixture::<N>(log_q, log_p, ln_beta, ln_one_minus_beta);
            let student = q * (log_q - log_m);
            let teacher = p * (log_p - log_m);
            teacher * Vector::new(beta) + student * Vector::new(1.0f32 - beta)
        }
        DistillDivergence::Tvd => Vector::abs(q - p) * Vector::new(0.5f32),
    }
}

/// The divergence's derivatives `dX_c = ∂D/∂log Q_c`.
#[cube]
fn divergence_dx<N: Size>(
    log_q: Vector<f32, N>,
    log_p: Vector<f32, N>,
    beta: f32,
    ln_beta: f32,
    ln_one_minus_beta: f32,
    #[comptime] divergence: DistillDivergence,
) -> Vector<f32, N> {
    let q = Vector::exp(log_q);
    match divergence {
        DistillDivergence::ForwardKl => Vector::new(0.0f32) - Vector::exp(log_p),
        DistillDivergence::ReverseKl => q * (log_q - log_p) + q,
        DistillDivergence::Jsd => {
            let log_m = log_mixture::<N>(log_q, log_p, ln_beta, ln_one_minus_beta);
            q * (log_q - log_m) * Vector::new(1.0f32 - beta)
        }
        DistillDivergence::Tvd => {
            let p = Vector::exp(log_p);
            let half = Vector::new(0.5f32);
            let sign = select_many(q.greater_than(p), half, Vector::new(0.0f32) - half);
            sign * q
        }
    }
}

/// One vector of the student's logits in f32, from wherever the launch bound them.
#[cube]
fn student_vector<F: Float, N: Size>(
    student: &Array<Vector<F, N>>,
    grad: &Array<Vector<F, N>>,
    index: usize,
    #[comptime] in_place: bool,
) -> Vector<f32, N> {
    if in_place {
        Vector::<f32, N>::cast_from(grad[index])
    } else {
        Vector::<f32, N>::cast_from(student[index])
    }
}

/// `max + ln(Σ exp(x − max))` of the cube's running pairs.
#[cube]
fn cube_lse(
    local_max: f32,
    local_sum: f32,
    scratch: &mut SharedMemory<f32>,
    #[comptime] use_plane: bool,
) -> f32 {
    let row_max = cube_reduce(local_max, scratch, ReduceOp::Max, use_plane);
    let rescaled = local_sum * f32::exp(local_max - row_max);
    let row_sum = cube_reduce(rescaled, scratch, ReduceOp::Sum, use_plane);
    row_max + f32::ln(row_sum)
}

// `s` gets the padding's zeros before the student's columns are read over them.
#[allow(unused_assignments, clippy::too_many_arguments)]
#[cube(launch_unchecked)]
fn distill_rows_kernel<F: Float, I: Int, N: Size>(
    student: &Array<Vector<F, N>>,
    teacher: &Array<Vector<F, N>>,
    grad: &mut Array<Vector<F, N>>,
    targets: &Array<I>,
    grad_scale: &Array<f32>,
    soft_loss: &mut Array<f32>,
    hard_loss: &mut Array<f32>,
    rows: u32,
    student_vectors: u32,
    teacher_vectors: u32,
    ignore_index: InputScalar,
    inv_temperature: f32,
    beta: f32,
    ln_beta: f32,
    ln_one_minus_beta: f32,
    soft_weight: f32,
    hard_weight: f32,
    #[comptime] divergence: DistillDivergence,
    #[comptime] has_ignore: bool,
    #[comptime] separate_hard: bool,
    #[comptime] compute_grad: bool,
    #[comptime] in_place: bool,
    #[comptime] units: u32,
    #[comptime] use_plane: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let mut scratch = SharedMemory::<f32>::new(units as usize);
    let sv = student_vectors as usize;
    let tv = teacher_vectors as usize;
    let inv_t = Vector::<f32, N>::new(inv_temperature);
    let mut row = CUBE_POS;
    while row < rows as usize {
        let s_base = row * sv;
        let t_base = row * tv;
        let y = targets[row];
        // Uniform over the cube (every unit reads the same target); no barrier sits under
        // it: invalid rows run the reductions like any other and only skip the stores.
        let mut valid = y >= I::new(0) && y < I::cast_from(sv * N::value());
        if has_ignore {
            valid = valid && y != ignore_index.get::<I>();
        }
        let mut y_vec = sv;
        let mut y_lane = 0usize;
        let mut s_y = 0.0f32;
        if valid {
            let yi = usize::cast_from(y);
            y_vec = yi / N::value();
            y_lane = yi % N::value();
            let v = student_vector::<F, N>(student, grad, s_base + y_vec, in_place);
            #[unroll]
            for k in 0..N::value() {
                if y_lane == k as usize {
                    s_y = v[k];
                }
            }
        }

        // Pass 1: the running maxima and sums of exp of s/τ, t/τ and s.
        let mut max_q = f32::min_value();
        let mut sum_q = 0.0f32;
        let mut max_p = f32::min_value();
        let mut sum_p = 0.0f32;
        let mut max_h = f32::min_value();
        let mut sum_h = 0.0f32;
        let mut j = UNIT_POS as usize;
        while j < tv {
            // Columns past the student's vocabulary are its zero padding.
            let mut s = Vector::<f32, N>::new(0.0);
            if j < sv {
                s = student_vector::<F, N>(student, grad, s_base + j, in_place);
                if separate_hard {
                    online_update::<N>(s, &mut max_h, &mut sum_h);
                }
            }
            let t = Vector::<f32, N>::cast_from(teacher[t_base + j]);
            online_update::<N>(s * inv_t, &mut max_q, &mut sum_q);
            online_update::<N>(t * inv_t, &mut max_p, &mut sum_p);
            j += CUBE_DIM as usize;
        }
        let lse_q = cube_lse(max_q, sum_q, &mut scratch, use_plane);
        let lse_p = cube_lse(max_p, sum_p, &mut scratch, use_plane);
        let mut lse_h = lse_q;
        if separate_hard {
            lse_h = cube_lse(max_h, sum_h, &mut scratch, use_plane);
        }

        // Pass 2: the soft loss and Σ dX.
        let mut local_loss = 0.0f32;
        let mut local_dx = 0.0f32;
        let mut j = UNIT_POS as usize;
        while j < tv {
            let mut s = Vector::<f32, N>::new(0.0);
            if j < sv {
                s = student_vector::<F, N>(student, grad, s_base + j, in_place);
            }
            let t = Vector::<f32, N>::cast_from(teacher[t_base + j]);
            let log_q = s * inv_t - Vector::new(lse_q);
            let log_p = t * inv_t - Vector::new(lse_p);
            local_loss += vector_sum::<N>(divergence_value::<N>(
                log_q,
                log_p,
                beta,
                ln_beta,
                ln_one_minus_beta,
                divergence,
            ));
            if compute_grad {
                local_dx += vector_sum::<N>(divergence_dx::<N>(
                    log_q,
                    log_p,
                    beta,
                    ln_beta,
                    ln_one_minus_beta,
                    divergence,
                ));
            }
            j += CUBE_DIM as usize;
        }
        let soft = cube_reduce(local_loss, &mut scratch, ReduceOp::Sum, use_plane);
        let mut sum_dx = 0.0f32;
        if compute_grad {
            sum_dx = cube_reduce(local_dx, &mut scratch, ReduceOp::Sum, use_plane);
        }
        if UNIT_POS == 0 {
            let mut soft_row = 0.0f32;
            let mut hard_row = 0.0f32;
            if valid {
                soft_row = soft;
                hard_row = lse_h - s_y;
            }
            soft_loss[row] = soft_row;
            hard_loss[row] = hard_row;
        }

        // Pass 3: the gradient of the student's V columns.
        if compute_grad {
            let scale = grad_scale[0];
            let w_soft = Vector::<f32, N>::new(scale * soft_weight);
            let w_hard = Vector::<f32, N>::new(scale * hard_weight);
            let mut j = UNIT_POS as usize;
            while j < sv {
                let mut g = Vector::<f32, N>::new(0.0);
                if valid {
                    let s = student_vector::<F, N>(student, grad, s_base + j, in_place);
                    let t = Vector::<f32, N>::cast_from(teacher[t_base + j]);
                    let log_q = s * inv_t - Vector::new(lse_q);
                    let log_p = t * inv_t - Vector::new(lse_p);
                    let dx = divergence_dx::<N>(
                        log_q,
                        log_p,
                        beta,
                        ln_beta,
                        ln_one_minus_beta,
                        divergence,
                    );
                    let q = Vector::exp(log_q);
                    let mut probs = q;
                    if separate_hard {
                        probs = shifted_exp::<N>(s - Vector::new(lse_h));
                    }
                    if j == y_vec {
                        #[unroll]
                        for k in 0..N::value() {
                            if y_lane == k as usize {
                                probs[k] -= 1.0f32;
                            }
                        }
                    }
                    g = (dx - q * Vector::new(sum_dx)) * w_soft + probs * w_hard;
                }
                grad[s_base + j] = Vector::<F, N>::cast_from(g);
                j += CUBE_DIM as usize;
            }
        }
        row += CUBE_COUNT;
    }
}

/// Options of the distillation rows kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DistillRowsOptions {
    /// The soft loss's divergence; `beta` is read for [`DistillDivergence::Jsd`] only.
    pub divergence: DistillDivergence,
    /// The JSD's `β` in `(0, 1)`.
    pub beta: f32,
    /// `τ > 0`, dividing both rows' logits in the soft loss.
    pub temperature: f32,
    /// `w_s`: the soft loss's weight in the gradient (the kernel divides it by `τ`).
    pub soft_weight: f32,
    /// `w_h`: the hard loss's weight in the gradient.
    pub hard_weight: f32,
    /// Target value of rows that are skipped.
    pub ignore_index: i64,
}

/// Where the kernel writes the student's gradient.
#[derive(Clone, Copy, Debug)]
pub enum DistillGrad<'a> {
    /// No gradient (losses only).
    None,
    /// Over the student's logits (their buffer must not be shared with anything else),
    /// scaled by the `[1]` f32 buffer.
    InPlace {
        /// `[1]` f32 scale `σ`.
        scale: &'a Handle,
    },
    /// Into a `[rows, V]` buffer of the logits' dtype, scaled by the `[1]` f32 buffer.
    Into {
        /// `[1]` f32 scale `σ`.
        scale: &'a Handle,
        /// `[rows, V]` output.
        grad: &'a Handle,
    },
}

/// The buffers of one launch.
#[derive(Clone, Copy, Debug)]
pub struct DistillRowsBuffers<'a> {
    /// `[rows, V]` student logits of `dtype`.
    pub student: &'a Handle,
    /// `[rows, V_t]` teacher logits of `dtype`, `V_t ≥ V`.
    pub teacher: &'a Handle,
    /// `[rows]` integer targets of `target_dtype`.
    pub targets: &'a Handle,
    /// Where the gradient goes.
    pub grad: DistillGrad<'a>,
    /// `[rows]` f32 soft losses.
    pub soft_loss: &'a Handle,
    /// `[rows]` f32 hard losses.
    pub hard_loss: &'a Handle,
}

/// The soft and hard losses of `rows` rows (`vocab` student and `teacher_vocab ≥ vocab`
/// teacher logits) and, when asked, their gradient (see the module docs for the math).
#[allow(clippy::too_many_arguments)]
pub fn distill_rows<R: Runtime>(
    client: &ComputeClient<R>,
    config: &LaunchConfig,
    buffers: DistillRowsBuffers<'_>,
    rows: usize,
    vocab: usize,
    teacher_vocab: usize,
    options: DistillRowsOptions,
    dtype: StorageType,
    target_dtype: StorageType,
) -> Result<(), KernelError> {
    const OP: &str = "distill_rows";
    check_float_dtype(OP, dtype)?;
    check_target_dtype(OP, target_dtype)?;
    if teacher_vocab < vocab || vocab == 0 {
        return Err(KernelError::Unsupported {
            op: OP,
            reason: format!(
                "the teacher's vocabulary ({teacher_vocab}) must be at least the student's ({vocab}), which must not be empty"
            ),
        });
    }
    let mut launch = RowLaunch::new(
        client,
        rows,
        teacher_vocab,
        dtype.size(),
        usize::MAX,
        config.softmax_forward_vectors_per_unit,
        config.reduction,
    );
    // One vector size for both rows: a power of two dividing both widths.
    while vocab % launch.vector_size != 0 {
        launch.vector_size /= 2;
    }
    let student_vectors = vocab / launch.vector_size;
    let teacher_vectors = teacher_vocab / launch.vector_size;
    // Bindings a configuration does not use are never touched (comptime branches); each
    // points at its own small buffer, allocated only for the configurations that need it,
    // so no buffer is bound twice.
    let placeholder = |bytes: usize| client.empty(bytes.max(4));
    let vector_bytes = dtype.size() * launch.vector_size;
    let n = rows * student_vectors;
    let (student_arg, grad_arg, scale_arg, compute_grad, in_place) = match buffers.grad {
        DistillGrad::None => (
            array::<R>(buffers.student, n),
            array::<R>(&placeholder(vector_bytes), 1),
            array::<R>(&placeholder(4), 1),
            false,
            false,
        ),
        DistillGrad::InPlace { scale } => (
            array::<R>(&placeholder(vector_bytes), 1),
            array::<R>(buffers.student, n),
            array::<R>(scale, 1),
            true,
            true,
        ),
        DistillGrad::Into { scale, grad } => (
            array::<R>(buffers.student, n),
            array::<R>(grad, n),
            array::<R>(scale, 1),
            true,
            false,
        ),
    };
    let (has_ignore, ignore) = ignore_index_scalar(options.ignore_index, target_dtype);
    // β's logarithms only enter the JSD's mixture (0 and 1 are the KLs, taken apart).
    let (beta, ln_beta, ln_one_minus_beta) = match options.divergence {
        DistillDivergence::Jsd => (options.beta, options.beta.ln(), (1.0 - options.beta).ln()),
        _ => (options.beta, 0.0, 0.0),
    };
    let inv_temperature = 1.0 / options.temperature;
    // The hard loss's softmax is the student's tempered one only at τ = 1 without padding.
    let separate_hard = inv_temperature != 1.0 || teacher_vocab != vocab;
    // Safety: every array length above is the item count of a buffer sized for exactly
    // these rows and widths (validated by the callers); indices stay below them, and
    // targets outside [0, vocab) are never used as indices.
    unsafe {
        distill_rows_kernel::launch_unchecked::<R>(
            client,
            launch.count(),
            launch.dim(),
            launch.vector_size,
            student_arg,
            array::<R>(buffers.teacher, rows * teacher_vectors),
            grad_arg,
            array::<R>(buffers.targets, rows),
            scale_arg,
            array::<R>(buffers.soft_loss, rows),
            array::<R>(buffers.hard_loss, rows),
            rows as u32,
            student_vectors as u32,
            teacher_vectors as u32,
            ignore,
            inv_temperature,
            beta,
            ln_beta,
            ln_one_minus_beta,
            options.soft_weight * inv_temperature,
            options.hard_weight,
            options.divergence,
            has_ignore,
            separate_hard,
            compute_grad,
            in_place,
            launch.units,
            launch.use_plane,
            [dtype, target_dtype],
        );
    }
    counters::record(Kernel::distill_rows);
    Ok(())
}
