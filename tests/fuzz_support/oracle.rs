//! The three-way oracle: a program runs fused (with its sync events: reads in
//! the middle, early drops, reads from another thread), then unfused with
//! every value read as soon as it exists, and every value either run
//! observed is checked against the reference interpreter.
//!
//! # The check is local
//!
//! Each observed value is compared with the interpreter applied to the
//! *observed* values of its operands in the same run, not with an
//! end-to-end interpreter run. A long program then needs no tolerance that
//! grows with depth, and an ill-conditioned step (a cancelling subtraction,
//! `exp` of a large number) cannot turn an honest rounding difference made
//! three ops earlier into a false alarm. Values a run never observed (dropped
//! before any read) are evaluated by the interpreter from their observed
//! ancestors as an *envelope* (see below), so the check of their users
//! widens only along unobserved chains, exactly as far as needed.
//!
//! # Tolerances (floats; integers and bools are exact, NaN equals NaN)
//!
//! The expected value of an op is the envelope `[lo, hi]` of interpreter
//! results over operand variants, widened by the op's own error `e`:
//! `lo - e <= actual <= hi + e`, with an infinite actual accepted when the
//! envelope reaches the largest finite value (overflow boundary) and NaN
//! accepted exactly when some variant is NaN (required when all are).
//! - Operand variants: an observed float operand of an arithmetic op is tried
//!   as observed and nudged one ulp up and down. Inside a fused kernel XLA
//!   recomputes or contracts (FMA) an intermediate that it also returns, so
//!   the consumer may see a value one rounding away from the returned one;
//!   the nudge covers exactly that, and through the op's own condition it
//!   also covers cancellation (`a - b`), `exp`/`pow` amplification and the
//!   like. Exact ops (layout, select, compare, extrema, neg/abs/relu/floor,
//!   conversions) see their operands unchanged.
//! - Own error `e`, per element, with `u` the unit roundoff of the dtype
//!   (2^-24 f32, 2^-53 f64, 2^-11 f16, 2^-8 bf16) and `ulp = 2u|result|`:
//!   - layout ops, select, concat, inputs and constants: bit-exact, except
//!     that a bf16 subnormal may come back as a zero of its sign (an XLA CPU
//!     quirk that depended on the shape, seen with constants, which are now
//!     stored flushed: `subnormal_bf16_constants_read_back_as_zeros_in_every_shape`);
//!     neg/abs/relu/floor, maximum/minimum, max/min reductions, compares,
//!     float→int conversions, argmax: exact (±0 compare equal);
//!   - add, sub, mul, float→float convert, arange, sqrt: 1 ulp (XLA rounds
//!     half types through f32: a double rounding; the interpreter rounds once);
//!   - div, rsqrt: 2 ulp (XLA may refine a reciprocal estimate);
//!   - exp, log, tanh, sigmoid, sin, cos, pow: 4 ulp + 8u absolute (XLA uses
//!     polynomial approximations; absolute near the zeros of log/sin/cos);
//!   - gelu: 4 ulp + 16u(1 + |x|) absolute (XLA evaluates the formula op by
//!     op in the dtype, the interpreter in f64; `1 + tanh(..)` cancels for
//!     negative x, scaled by `x/2`);
//!   - sum: 2u·n·Σ|x| + 1 ulp, mean: that / n + 2 ulp (n summands in any
//!     order; half types accumulate in f32 so `u` is f32's for the sum);
//!   - matmul: 2u·k·(|a|·|b|) + 1 ulp (k products summed in any order);
//!   - maximum, minimum, relu, max, min: exact up to the smallest normal.
//!     XLA compares with subnormals read as zero but returns the chosen
//!     operand's bits unflushed, so `maximum(x, x)` of a subnormal `x` is `x`
//!     (the interpreter, which flushes, says 0) and a tie between a subnormal
//!     and a zero may return either;
//!   - plus 2x the smallest normal of f32/bf16/f64 (results at the flush-to-
//!     zero boundary) or of f16 its smallest subnormal.

use super::envelope::{compare, exact_envelope, expect, observed, Known};
use super::program::{Program, Step};
use super::values::{literal_for, max_finite, nudge, unit_roundoff};
use lazyfuse::ir::{interp, BinaryOp, CmpOp, DType, HostTensor, Op, ReduceOp, Shape, UnaryOp};
use lazyfuse::{Device, FusionGuard, Tensor};

/// Runs `program` fused and unfused and checks both against the interpreter.
/// `Err` describes the first mismatch (run, value, op, element).
pub fn check_program(program: &Program, dev: &Device) -> Result<(), String> {
    check_program_with(program, dev, Checks::ALL)
}

/// Which runs beyond the plain fused one a check makes. Both cost compiles
/// (the unfused run one executable per op and shape, the learning runs new
/// output sets), so long campaigns may make them for a share of their
/// programs; the fused run is always checked against the interpreter.
#[derive(Clone, Copy, Debug)]
pub struct Checks {
    /// The unfused run, every value read as soon as it exists.
    pub unfused: bool,
    /// For programs whose op count is a multiple of 3: runs that drop
    /// everything unread, then a run whose reads follow what they taught
    /// the output selection (recomputes).
    pub learning: bool,
}

impl Checks {
    /// Every run.
    pub const ALL: Checks = Checks {
        unfused: true,
        learning: true,
    };
}

/// [`check_program`] with the runs `checks` asks for.
pub fn check_program_with(program: &Program, dev: &Device, checks: Checks) -> Result<(), String> {
    let fused = run(program, dev, true)?;
    verify(program, &fused).map_err(|e| format!("fused run: {e}"))?;
    if checks.learning && program.num_ops() % 3 == 0 {
        // Output selection: runs that drop every value unread teach this
        // thread's graph to leave those sites out, so the next run's
        // mid-program reads leave live values pending and its final reads
        // compute them late (recomputes). Results must not change.
        for _ in 0..2 {
            run_with(program, dev, true, false)?;
        }
        let late = run(program, dev, true)?;
        verify(program, &late).map_err(|e| format!("fused run after learning: {e}"))?;
    }
    if checks.unfused {
        let unfused = run(program, dev, false)?;
        verify(program, &unfused).map_err(|e| format!("unfused run: {e}"))?;
    }
    Ok(())
}

/// The value recorded by a value-defining step (`Input` is recorded as an
/// `Op::Input`), and its operands.
pub fn step_op(step: &Step) -> Option<(Op, Vec<usize>)> {
    Some(match step {
        Step::Input(h) => (
            Op::Input {
                shape: h.shape.clone(),
                dtype: h.dtype,
            },
            vec![],
        ),
        Step::Full { value, dims, dtype } => (
            Op::Constant {
                value: literal_for(*value, *dtype),
                shape: Shape::new(dims),
                dtype: *dtype,
            },
            vec![],
        ),
        Step::Arange {
            start,
            step,
            len,
            dtype,
        } => (
            Op::Arange {
                start: literal_for(*start, *dtype),
                step: literal_for(*step, *dtype),
                len: *len,
                dtype: *dtype,
            },
            vec![],
        ),
        Step::Apply { op, args } => (op.clone(), args.clone()),
        Step::Scalar { op, arg, .. } => (op.clone(), vec![*arg]),
        _ => return None,
    })
}

fn scalar_method(t: &Tensor, op: &Op, v: f64) -> lazyfuse::Result<Tensor> {
    match op {
        Op::Binary(BinaryOp::Add) => t.add(v),
        Op::Binary(BinaryOp::Sub) => t.sub(v),
        Op::Binary(BinaryOp::Mul) => t.mul(v),
        Op::Binary(BinaryOp::Div) => t.div(v),
        Op::Binary(BinaryOp::Pow) => t.pow(v),
        Op::Binary(BinaryOp::Maximum) => t.maximum(v),
        Op::Binary(BinaryOp::Minimum) => t.minimum(v),
        Op::Compare(CmpOp::Eq) => t.eq(v),
        Op::Compare(CmpOp::Ne) => t.ne(v),
        Op::Compare(CmpOp::Lt) => t.lt(v),
        Op::Compare(CmpOp::Le) => t.le(v),
        Op::Compare(CmpOp::Gt) => t.gt(v),
        Op::Compare(CmpOp::Ge) => t.ge(v),
        _ => panic!("not a scalar op: {op:?}"),
    }
}

/// Executes the program through the public API and returns what it observed
/// of each value (`None`: never read, dropped first).
pub fn run(program: &Program, dev: &Device, fuse: bool) -> Result<Vec<Option<HostTensor>>, String> {
    run_with(program, dev, fuse, true)
}

/// [`run`]; with `read_at_end` false the values still alive at the end are
/// dropped unread instead of read.
pub fn run_with(
    program: &Program,
    dev: &Device,
    fuse: bool,
    read_at_end: bool,
) -> Result<Vec<Option<HostTensor>>, String> {
    run_placed(program, dev, fuse, read_at_end, &|_, t| Ok(t))
}

/// Places input `k` (0-based among the program's inputs) of a run, for
/// example on a device mesh.
pub type Place<'a> = &'a dyn Fn(usize, Tensor) -> lazyfuse::Result<Tensor>;

/// [`run_with`], each input put where `place` says before use.
pub fn run_placed(
    program: &Program,
    dev: &Device,
    fuse: bool,
    read_at_end: bool,
    place: Place<'_>,
) -> Result<Vec<Option<HostTensor>>, String> {
    let _mode = FusionGuard::new(fuse);
    let mut inputs = 0;
    let mode = if fuse { "fused" } else { "unfused" };
    let n = program.num_values();
    let mut tensors: Vec<Option<Tensor>> = Vec::with_capacity(n);
    let mut seen: Vec<Option<HostTensor>> = vec![None; n];
    let get = |ts: &[Option<Tensor>], i: usize| -> Result<Tensor, String> {
        ts.get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| format!("{mode}: step uses v{i}, which is dropped or undefined"))
    };
    let read = |t: &Tensor, i: usize, seen: &mut Vec<Option<HostTensor>>| -> Result<(), String> {
        let h = t
            .to_host()
            .map_err(|e| format!("{mode}: reading v{i} failed: {e}"))?;
        if let Some(prev) = &seen[i] {
            if prev.bytes != h.bytes {
                return Err(format!("{mode}: v{i} changed between two reads"));
            }
        }
        seen[i] = Some(h);
        Ok(())
    };
    for step in &program.steps {
        let made = match step {
            Step::Input(h) => {
                inputs += 1;
                Some(Tensor::from_host(h, dev).and_then(|t| place(inputs - 1, t)))
            }
            Step::Full { value, dims, dtype } => Some(Tensor::full(*value, dims, *dtype, dev)),
            Step::Arange {
                start,
                step,
                len,
                dtype,
            } => Some(Tensor::arange_step(
                *start,
                start + (*len as f64 - 0.5) * step,
                *step,
                *dtype,
                dev,
            )),
            Step::Apply { op, args } => {
                let ts: Vec<Tensor> = args
                    .iter()
                    .map(|&i| get(&tensors, i))
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&Tensor> = ts.iter().collect();
                Some(Tensor::apply_op(op.clone(), &refs))
            }
            Step::Scalar { op, arg, value } => {
                Some(scalar_method(&get(&tensors, *arg)?, op, *value))
            }
            Step::Read(i) => {
                read(&get(&tensors, *i)?, *i, &mut seen)?;
                None
            }
            Step::Drop(i) => {
                tensors[*i] = None;
                None
            }
            Step::ReadOnThread(i) => {
                let t = get(&tensors, *i)?;
                let h = std::thread::spawn(move || t.to_host())
                    .join()
                    .map_err(|_| format!("{mode}: reading v{i} on another thread panicked"))?
                    .map_err(|e| format!("{mode}: reading v{i} on another thread failed: {e}"))?;
                if seen[*i].as_ref().is_some_and(|p| p.bytes != h.bytes) {
                    return Err(format!("{mode}: v{i} read differently on two threads"));
                }
                seen[*i] = Some(h);
                None
            }
            Step::Sync => {
                lazyfuse::sync();
                None
            }
        };
        if let Some(r) = made {
            let i = tensors.len();
            let t = r.map_err(|e| format!("{mode}: the API rejected well-typed v{i}: {e}"))?;
            if !fuse {
                read(&t, i, &mut seen)?;
            }
            tensors.push(Some(t));
        }
    }
    if read_at_end {
        for (i, t) in tensors.iter().enumerate() {
            if let Some(t) = t {
                read(t, i, &mut seen)?;
            }
        }
    }
    drop(tensors);
    lazyfuse::sync();
    let left = lazyfuse::pending_ops(dev);
    if left != 0 {
        return Err(format!("{mode}: {left} ops still pending after sync()"));
    }
    Ok(seen)
}

/// Checks every observed value of one run.
pub fn verify(program: &Program, seen: &[Option<HostTensor>]) -> Result<(), String> {
    let mut known: Vec<Known> = Vec::with_capacity(seen.len());
    let mut dtypes: Vec<DType> = Vec::new();
    let mut products: Vec<bool> = Vec::new();
    for step in &program.steps {
        let Some((op, args)) = step_op(step) else {
            continue;
        };
        products.push(carries_product(&op, &args, &products));
        let i = known.len();
        let env = match step {
            Step::Input(h) => exact_envelope(h.clone()),
            Step::Scalar { op, arg, value } => {
                let d = dtypes[*arg];
                let c = interp::eval_op(
                    &Op::Constant {
                        value: literal_for(*value, d),
                        shape: Shape::scalar(),
                        dtype: d,
                    },
                    &[],
                )
                .map_err(|e| format!("v{i}: interpreter rejected the scalar: {e}"))?;
                expect(op, &[known[*arg].clone(), Known::Seen(c)])
                    .map_err(|e| format!("v{i}: {e}"))?
            }
            _ => {
                let ops: Vec<Known> = args.iter().map(|&a| known[a].clone()).collect();
                expect(&op, &ops).map_err(|e| format!("v{i}: {e}"))?
            }
        };
        dtypes.push(env.center.dtype);
        match &seen[i] {
            Some(actual) => {
                compare(actual, &env).map_err(|e| {
                    format!("v{i} = {} of {args:?}: {e}", super::program::op_rust(&op))
                })?;
                if may_contract(&op, &args, &products) && actual.dtype.is_float() {
                    known.push(Known::Range(env));
                } else {
                    known.push(observed(&op, actual));
                }
            }
            None => known.push(Known::Range(env)),
        }
    }
    Ok(())
}

/// True when value `op` of `args` is a product, or a layout of one: what
/// XLA may contract with an addition into a fused multiply-add.
fn carries_product(op: &Op, args: &[usize], products: &[bool]) -> bool {
    match op {
        Op::Binary(BinaryOp::Mul) => true,
        Op::Reshape(_)
        | Op::Permute(_)
        | Op::Reverse(_)
        | Op::BroadcastTo(_)
        | Op::Slice { .. }
        | Op::Concat { .. } => args.iter().any(|&a| products[a]),
        _ => false,
    }
}

/// True for an addition or subtraction with a product operand. A consumer
/// in another region may see it recomputed, and the recomputation may be a
/// fused multiply-add where the returned value rounded the product, so
/// consumers see it as its envelope (any rounding of the operands), not as
/// the returned bits. Only arithmetic consumers nudged their operands
/// before; a slice of `slice(x * c) - x * c` recomputed was a rounding
/// error of the product instead of 0 (`fuzz_campaign` seed 1001, program
/// 1204; `fuzz_regressions/oracle.rs::a_layout_of_a_contracted_difference_is_accepted`).
///
/// A sum or mean of a product too: newer XLA CPU builds (the `jax-cpu`
/// plugin) fuse the product into the reduction's loop and contract it with
/// the accumulation, so a recomputed `mean(x * c)` is one rounding away
/// from the returned one (`fuzz_ops` seed 20261208 on `jax-cpu`;
/// `fuzz_regressions/oracle.rs::a_recomputed_mean_of_a_product_may_be_contracted`).
fn may_contract(op: &Op, args: &[usize], products: &[bool]) -> bool {
    matches!(
        op,
        Op::Binary(BinaryOp::Add | BinaryOp::Sub)
            | Op::Reduce {
                op: ReduceOp::Sum | ReduceOp::Mean,
                ..
            }
    ) && args.iter().any(|&a| products[a])
}
