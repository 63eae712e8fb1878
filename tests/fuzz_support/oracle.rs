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

use super::program::{Program, Step};
use super::values::{literal_for, max_finite, nudge, unit_roundoff};
use lazyfuse::ir::{interp, BinaryOp, CmpOp, DType, HostTensor, Op, ReduceOp, Shape, UnaryOp};
use lazyfuse::{Device, FusionGuard, Tensor};

/// Runs `program` fused and unfused and checks both against the interpreter.
/// `Err` describes the first mismatch (run, value, op, element).
pub fn check_program(program: &Program, dev: &Device) -> Result<(), String> {
    check_program_with(program, dev, true)
}

/// [`check_program`], with the unfused run only when `unfused` is set: it
/// compiles one executable per op and shape, most of a check's compile time,
/// so long campaigns may run it for a share of their programs (the fused
/// runs are always checked against the interpreter).
pub fn check_program_with(program: &Program, dev: &Device, unfused: bool) -> Result<(), String> {
    let fused = run(program, dev, true)?;
    verify(program, &fused).map_err(|e| format!("fused run: {e}"))?;
    if program.num_ops() % 3 == 0 {
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
    if unfused {
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
        Op::Binary(BinaryOp::Add) => t.add_scalar(v),
        Op::Binary(BinaryOp::Sub) => t.sub_scalar(v),
        Op::Binary(BinaryOp::Mul) => t.mul_scalar(v),
        Op::Binary(BinaryOp::Div) => t.div_scalar(v),
        Op::Binary(BinaryOp::Pow) => t.pow_scalar(v),
        Op::Binary(BinaryOp::Maximum) => t.maximum_scalar(v),
        Op::Binary(BinaryOp::Minimum) => t.minimum_scalar(v),
        Op::Compare(CmpOp::Eq) => t.eq_scalar(v),
        Op::Compare(CmpOp::Ne) => t.ne_scalar(v),
        Op::Compare(CmpOp::Lt) => t.lt_scalar(v),
        Op::Compare(CmpOp::Le) => t.le_scalar(v),
        Op::Compare(CmpOp::Gt) => t.gt_scalar(v),
        Op::Compare(CmpOp::Ge) => t.ge_scalar(v),
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
    let _mode = FusionGuard::new(fuse);
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
            Step::Input(h) => Some(Tensor::from_host(h, dev)),
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

/// What a check knows about a value.
#[derive(Clone, Debug)]
enum Known {
    /// Observed by the run under test.
    Seen(HostTensor),
    /// Not observed: the interpreter's envelope from observed ancestors.
    Range(Envelope),
}

/// The set of acceptable results of one op, element by element.
#[derive(Clone, Debug)]
struct Envelope {
    /// The interpreter on unperturbed operands.
    center: HostTensor,
    /// Min/max over variants (NaN variants excluded); i64 for integer dtypes.
    lo: Vec<f64>,
    hi: Vec<f64>,
    ilo: Vec<i64>,
    ihi: Vec<i64>,
    nan_any: Vec<bool>,
    nan_all: Vec<bool>,
    /// The op's own error allowance (floats).
    own: Vec<f64>,
    /// The op moves bits: the result must equal `center` bit for bit.
    bitwise: bool,
}

impl Envelope {
    /// Representative values of this envelope for use as an operand:
    /// center, and the lower and upper bounds widened by the own error.
    fn variants(&self) -> Vec<HostTensor> {
        let c = &self.center;
        if !c.dtype.is_float() {
            if self.ilo == self.ihi {
                return vec![c.clone()];
            }
            return vec![
                c.clone(),
                HostTensor::from_i64(&self.ilo, c.shape.clone(), c.dtype),
                HostTensor::from_i64(&self.ihi, c.shape.clone(), c.dtype),
            ];
        }
        if self.own.iter().all(|&e| e == 0.0) && self.lo == self.hi {
            return vec![c.clone()];
        }
        let pick = |i: usize, v: f64| if self.nan_all[i] { f64::NAN } else { v };
        let lo: Vec<f64> = (0..self.lo.len())
            .map(|i| pick(i, self.lo[i] - self.own[i]))
            .collect();
        let hi: Vec<f64> = (0..self.hi.len())
            .map(|i| pick(i, self.hi[i] + self.own[i]))
            .collect();
        vec![
            c.clone(),
            nudge(&HostTensor::from_f64(&lo, c.shape.clone(), c.dtype), false),
            nudge(&HostTensor::from_f64(&hi, c.shape.clone(), c.dtype), true),
        ]
    }
}

/// Ops whose result is a copy of operand bits.
fn is_bitwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Input { .. }
            | Op::Constant { .. }
            | Op::Select
            | Op::Reshape(_)
            | Op::Permute(_)
            | Op::BroadcastTo(_)
            | Op::Slice { .. }
            | Op::Concat { .. }
    )
}

/// Ops whose operands are nudged (rounding-sensitive arithmetic).
fn nudges_operands(op: &Op) -> bool {
    match op {
        Op::Unary(u) => !matches!(
            u,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Floor
        ),
        Op::Binary(b) => !matches!(b, BinaryOp::Maximum | BinaryOp::Minimum),
        Op::Reduce { op, .. } => matches!(op, ReduceOp::Sum | ReduceOp::Mean),
        Op::MatMul => true,
        _ => false,
    }
}

/// Checks every observed value of one run.
pub fn verify(program: &Program, seen: &[Option<HostTensor>]) -> Result<(), String> {
    let mut known: Vec<Known> = Vec::with_capacity(seen.len());
    let mut dtypes: Vec<DType> = Vec::new();
    for step in &program.steps {
        let Some((op, args)) = step_op(step) else {
            continue;
        };
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
                known.push(match recompute_slack(&op, actual) {
                    Some(own) => Known::Range(Envelope {
                        own,
                        bitwise: false,
                        ..exact_envelope(actual.clone())
                    }),
                    None => Known::Seen(actual.clone()),
                });
            }
            None => known.push(Known::Range(env)),
        }
    }
    Ok(())
}

/// For an observed result of an op XLA evaluates by approximation (exp,
/// log, tanh, sigmoid, sin, cos, erf, gelu, pow): its own error allowance,
/// because a consumer in another region may see the op *recomputed* rather
/// than the returned value, and a recomputation can differ by that much:
/// LLVM folds the approximation of a constant operand at compile time, and
/// the vectorised and scalar loops of a kernel round differently
/// (`fuzz_regressions.rs::recomputed_erf_of_a_constant_differs_by_ulps`).
/// `None` for every other op: its consumers see it within one ulp (the
/// operand nudge).
fn recompute_slack(op: &Op, actual: &HostTensor) -> Option<Vec<f64>> {
    let approximated = matches!(
        op,
        Op::Unary(
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::Gelu
        ) | Op::Binary(BinaryOp::Pow)
    );
    if !approximated || !actual.dtype.is_float() {
        return None;
    }
    let u = unit_roundoff(actual.dtype);
    let slack = actual
        .to_f64_vec()
        .iter()
        .map(|x| {
            let e = 8.0 * u * x.abs() + 16.0 * u * (1.0 + x.abs());
            if e.is_finite() {
                e
            } else {
                0.0
            }
        })
        .collect();
    Some(slack)
}

fn exact_envelope(h: HostTensor) -> Envelope {
    let n = h.numel();
    let (f, ints) = if h.dtype.is_float() {
        (h.to_f64_vec(), vec![0; n])
    } else {
        (vec![0.0; n], h.to_i64_vec())
    };
    Envelope {
        nan_any: f.iter().map(|x| x.is_nan()).collect(),
        nan_all: f.iter().map(|x| x.is_nan()).collect(),
        lo: f.clone(),
        hi: f,
        ilo: ints.clone(),
        ihi: ints,
        own: vec![0.0; n],
        bitwise: true,
        center: h,
    }
}

/// The interpreter's envelope for `op` on operands known as `ops`.
fn expect(op: &Op, ops: &[Known]) -> Result<Envelope, String> {
    let nudge_ops = nudges_operands(op);
    let choices: Vec<Vec<HostTensor>> = ops
        .iter()
        .map(|k| match k {
            Known::Seen(h) if nudge_ops && h.dtype.is_float() => {
                vec![h.clone(), nudge(h, true), nudge(h, false)]
            }
            Known::Seen(h) => vec![h.clone()],
            Known::Range(e) => e.variants(),
        })
        .collect();
    // The cartesian product of the operands' variants, centers first.
    let mut combos: Vec<Vec<usize>> = vec![vec![]];
    for c in &choices {
        combos = combos
            .into_iter()
            .flat_map(|p| {
                (0..c.len()).map(move |j| {
                    let mut q = p.clone();
                    q.push(j);
                    q
                })
            })
            .collect();
        combos.truncate(81);
    }
    let mut results = Vec::with_capacity(combos.len());
    for combo in &combos {
        let args: Vec<&HostTensor> = combo
            .iter()
            .enumerate()
            .map(|(k, &j)| &choices[k][j])
            .collect();
        results.push(
            interp::eval_op(op, &args)
                .map_err(|e| format!("interpreter rejected {}: {e}", op.name()))?,
        );
    }
    let center = results[0].clone();
    let n = center.numel();
    let all_seen = ops.iter().all(|k| matches!(k, Known::Seen(_)));
    let mut env = Envelope {
        lo: vec![f64::INFINITY; n],
        hi: vec![f64::NEG_INFINITY; n],
        ilo: vec![i64::MAX; n],
        ihi: vec![i64::MIN; n],
        nan_any: vec![false; n],
        nan_all: vec![true; n],
        own: vec![0.0; n],
        bitwise: is_bitwise(op) && all_seen,
        center: center.clone(),
    };
    for r in &results {
        if center.dtype.is_float() {
            for (i, x) in r.to_f64_vec().into_iter().enumerate() {
                if x.is_nan() {
                    env.nan_any[i] = true;
                } else {
                    env.nan_all[i] = false;
                    env.lo[i] = env.lo[i].min(x);
                    env.hi[i] = env.hi[i].max(x);
                }
            }
        } else {
            for (i, x) in r.to_i64_vec().into_iter().enumerate() {
                env.nan_all[i] = false;
                env.ilo[i] = env.ilo[i].min(x);
                env.ihi[i] = env.ihi[i].max(x);
            }
        }
    }
    if center.dtype.is_float() {
        let centers: Vec<&HostTensor> = choices.iter().map(|c| &c[0]).collect();
        env.own = own_error(op, &centers, &center);
        // A NaN center with finite variants: scale by the finite bounds instead.
        let u = unit_roundoff(center.dtype);
        for i in 0..n {
            if env.own[i].is_nan() {
                env.own[i] = 8.0 * u * env.lo[i].abs().max(env.hi[i].abs());
            }
        }
        for (i, open) in overflow_possible(op, &centers).into_iter().enumerate() {
            if open {
                env.nan_any[i] = true;
                env.nan_all[i] = false;
                env.lo[i] = f64::NEG_INFINITY;
                env.hi[i] = f64::INFINITY;
            }
        }
    }
    Ok(env)
}

/// Per element of an accumulation (matmul, sum, mean): whether the
/// magnitudes of its terms add up past the largest finite value of the type
/// XLA accumulates in (f32 below f64). Then some summation order, or a fused
/// multiply-add that skips a product's rounding, overflows an intermediate
/// and the result is +inf, -inf or NaN depending on that order: all are
/// accepted (`inf * x + 1e30 * 1e30` in f32 is NaN with the products rounded
/// and -inf in f64; `fuzz_regressions.rs::matmul_products_overflow_in_f32`).
fn overflow_possible(op: &Op, operands: &[&HostTensor]) -> Vec<bool> {
    let bound = match op {
        Op::MatMul => interp::eval_op(op, &[&abs64(operands[0]), &abs64(operands[1])]),
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean,
            axes,
            keepdim,
        } => interp::eval_op(
            &Op::Reduce {
                op: ReduceOp::Sum,
                axes: axes.clone(),
                keepdim: *keepdim,
            },
            &[&abs64(operands[0])],
        ),
        _ => return Vec::new(),
    };
    let big = if operands[0].dtype == DType::F64 {
        f64::MAX
    } else {
        f32::MAX as f64
    };
    let bound = bound.expect("|terms| is well typed").to_f64_vec();
    bound.into_iter().map(|b| b > big).collect()
}

/// Elementwise `|x|` of a float or integer tensor, as f64.
fn abs64(h: &HostTensor) -> HostTensor {
    let v: Vec<f64> = h.to_f64_vec().iter().map(|x| x.abs()).collect();
    HostTensor::from_f64(&v, h.shape.clone(), DType::F64)
}

/// The op's own rounding error allowance per element (see the module doc).
fn own_error(op: &Op, operands: &[&HostTensor], result: &HostTensor) -> Vec<f64> {
    let d = result.dtype;
    let u = unit_roundoff(d);
    let floor = match d {
        DType::F16 => 2.0 * 2f64.powi(-24),
        DType::F64 => 2.0 * f64::MIN_POSITIVE,
        _ => 2.0 * f32::MIN_POSITIVE as f64,
    };
    let r = result.to_f64_vec();
    let ulps = |k: f64| -> Vec<f64> { r.iter().map(|x| k * 2.0 * u * x.abs() + floor).collect() };
    let sane = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
    match op {
        Op::Unary(UnaryOp::Sqrt) | Op::Arange { .. } => ulps(1.0),
        Op::Convert(_) if operands[0].dtype != d => ulps(1.0),
        Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) => ulps(1.0),
        Op::Binary(BinaryOp::Div) | Op::Unary(UnaryOp::Rsqrt) => ulps(2.0),
        Op::Unary(UnaryOp::Gelu) => {
            let x = operands[0].to_f64_vec();
            ulps(4.0)
                .iter()
                .zip(&x)
                .map(|(e, x)| sane(e + 16.0 * u * (1.0 + x.abs())))
                .collect()
        }
        Op::Unary(
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Erf,
        )
        | Op::Binary(BinaryOp::Pow) => ulps(4.0).iter().map(|e| e + 8.0 * u).collect(),
        Op::Reduce {
            op: rop @ (ReduceOp::Sum | ReduceOp::Mean),
            axes,
            keepdim,
        } => {
            let acc_u = if matches!(d, DType::BF16 | DType::F16) {
                unit_roundoff(DType::F32)
            } else {
                u
            };
            let n: usize = axes.iter().map(|&a| operands[0].shape.dims()[a]).product();
            let sum_abs = interp::eval_op(
                &Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: axes.clone(),
                    keepdim: *keepdim,
                },
                &[&abs64(operands[0])],
            )
            .expect("sum of |x| is well typed")
            .to_f64_vec();
            let (div, k) = if *rop == ReduceOp::Mean {
                (n.max(1) as f64, 2.0)
            } else {
                (1.0, 1.0)
            };
            ulps(k)
                .iter()
                .zip(&sum_abs)
                .map(|(e, s)| sane(e + 2.0 * acc_u * n as f64 * s / div))
                .collect()
        }
        Op::MatMul => {
            let k = operands[0].shape.dims()[operands[0].shape.rank() - 1];
            let bound = interp::eval_op(&Op::MatMul, &[&abs64(operands[0]), &abs64(operands[1])])
                .expect("|a| x |b| is well typed")
                .to_f64_vec();
            ulps(1.0)
                .iter()
                .zip(&bound)
                .map(|(e, b)| sane(e + 2.0 * u * k as f64 * b))
                .collect()
        }
        Op::Binary(BinaryOp::Maximum | BinaryOp::Minimum)
        | Op::Unary(UnaryOp::Relu)
        | Op::Reduce {
            op: ReduceOp::Max | ReduceOp::Min,
            ..
        } => vec![floor; r.len()],
        _ => vec![0.0; r.len()],
    }
}

/// Checks an observed value against its envelope.
fn compare(actual: &HostTensor, env: &Envelope) -> Result<(), String> {
    let c = &env.center;
    if actual.shape != c.shape || actual.dtype != c.dtype {
        return Err(format!(
            "got {}{}, expected {}{}",
            actual.dtype, actual.shape, c.dtype, c.shape
        ));
    }
    let d = c.dtype;
    if env.bitwise {
        let w = d.size_in_bytes();
        let (a, e) = (actual.to_f64_vec(), c.to_f64_vec());
        for (i, (x, y)) in actual.bytes.chunks(w).zip(c.bytes.chunks(w)).enumerate() {
            let both_nan = d.is_float() && a[i].is_nan() && e[i].is_nan();
            // Known XLA CPU quirk: some code paths move bf16 through f32
            // under flush-to-zero (seen with constants, now stored flushed).
            let bf16_flushed = d == DType::BF16
                && a[i] == 0.0
                && e[i] != 0.0
                && e[i].abs() < f32::MIN_POSITIVE as f64
                && a[i].is_sign_negative() == e[i].is_sign_negative();
            if x != y && !both_nan && !bf16_flushed {
                return Err(format!(
                    "element {i}: got {} ({x:02x?}), expected bit-exact {} ({y:02x?})",
                    a[i], e[i]
                ));
            }
        }
        return Ok(());
    }
    if !d.is_float() {
        for (i, x) in actual.to_i64_vec().into_iter().enumerate() {
            if x < env.ilo[i] || x > env.ihi[i] {
                return Err(format!(
                    "element {i}: got {x}, expected {} (range {}..={})",
                    c.to_i64_vec()[i],
                    env.ilo[i],
                    env.ihi[i]
                ));
            }
        }
        return Ok(());
    }
    let big = max_finite(d);
    for (i, x) in actual.to_f64_vec().into_iter().enumerate() {
        let (lo, hi, e) = (env.lo[i], env.hi[i], env.own[i]);
        let ok = if x.is_nan() {
            env.nan_any[i]
        } else if env.nan_all[i] {
            false
        } else if x == f64::INFINITY {
            hi == f64::INFINITY || hi + e >= big
        } else if x == f64::NEG_INFINITY {
            lo == f64::NEG_INFINITY || lo - e <= -big
        } else {
            lo.min(big) - e <= x && x <= hi.max(-big) + e
        };
        if !ok {
            return Err(format!(
                "element {i}: got {x:e}, expected {:e} (envelope [{lo:e}, {hi:e}] ± {e:e}, NaN {}) (dtype {d})",
                c.to_f64_vec()[i],
                if env.nan_all[i] { "required" } else if env.nan_any[i] { "allowed" } else { "not allowed" },
            ));
        }
    }
    Ok(())
}
