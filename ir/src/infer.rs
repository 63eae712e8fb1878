//! Shape and dtype inference: the single place that decides whether an op
//! applied to given operands is valid. The API calls it before recording, so a
//! bad call is an `Err` at the call site and never reaches the graph.

use crate::{Axes, BinaryOp, DType, Literal, Op, ReduceOp, Shape, UnaryOp};

/// Why an op cannot be applied to its operands (the caller adds op name, shapes and location).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InferError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError(msg.into()))
}

/// An operand as inference sees it.
pub type Operand<'a> = (&'a Shape, DType);

/// Output shape and dtype of `op` on `inputs`, or why it is invalid.
///
/// Checks the operand count, then hands the op to the rule of its family:
/// creation, elementwise (unary, binary, compare, select), reductions,
/// layout, matmul and indexing.
pub fn infer(op: &Op, inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    check_arity(op, inputs.len())?;
    match op {
        // Creation.
        Op::Input { shape, dtype } => Ok((shape.clone(), *dtype)),
        Op::Constant {
            value,
            shape,
            dtype,
        } => constant(*value, shape, *dtype),
        Op::Arange {
            start,
            step,
            len,
            dtype,
        } => arange(*start, *step, *len, *dtype),
        Op::RandomUniform { shape, dtype } => random_uniform(inputs[0], shape, *dtype),
        // Elementwise.
        Op::Unary(u) => unary(*u, inputs[0]),
        Op::Convert(to) => Ok((inputs[0].0.clone(), *to)),
        Op::Binary(b) => binary(*b, inputs),
        Op::Compare(_) => compare(inputs),
        Op::Select => select(inputs),
        // Reductions.
        Op::Reduce { op, axes, keepdim } => reduce(*op, axes, *keepdim, inputs[0]),
        Op::ArgMax { axis, keepdim } => argmax(*axis, *keepdim, inputs[0]),
        // Layout.
        Op::Reshape(to) => reshape(inputs[0], to),
        Op::Permute(perm) => permute(inputs[0], perm),
        Op::Reverse(axes) => reverse(inputs[0], axes),
        Op::BroadcastTo(to) => broadcast_to(inputs[0], to),
        Op::ShardingConstraint(split) => sharding_constraint(inputs[0], split),
        Op::Slice { axis, start, len } => slice(inputs[0], *axis, *start, *len),
        Op::Concat { axis } => concat(*axis, inputs),
        Op::DynamicSlice { axis, len } => dynamic_slice(inputs, *axis, *len),
        Op::DynamicUpdateSlice { axis } => dynamic_update_slice(inputs, *axis),
        // Contraction and indexing.
        Op::MatMul => matmul(inputs[0], inputs[1]),
        Op::Conv(spec) => crate::conv::infer_conv(spec, inputs[0], inputs[1]).map_err(InferError),
        Op::IndexSelect { axis } => index_select(*axis, inputs[0], inputs[1]),
        Op::ScatterAdd { axis } => {
            crate::scatter::infer_scatter_add(*axis, inputs[0], inputs[1], inputs[2])
                .map_err(InferError)
        }
        Op::Custom(k) => custom(k, inputs),
    }
}

/// A custom kernel: the operands must be exactly the declared parameters.
fn custom(k: &crate::CustomKernel, inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    if inputs.len() != k.params.len() {
        return err(format!(
            "kernel {} takes {} operand(s), got {}",
            k.name,
            k.params.len(),
            inputs.len()
        ));
    }
    for (i, ((s, d), (ws, wd))) in inputs.iter().zip(&k.params).enumerate() {
        if *s != ws || d != wd {
            return err(format!(
                "kernel {} operand {i} must be {wd}{ws}, got {d}{s}",
                k.name
            ));
        }
    }
    Ok(k.result.clone())
}

/// The operand count the op takes (at least one for variadic ops).
fn check_arity(op: &Op, got: usize) -> Result<(), InferError> {
    match op.arity() {
        Some(n) if got != n => err(format!("expects {n} operand(s), got {got}")),
        None if got == 0 => err("expects at least one operand"),
        _ => Ok(()),
    }
}

// ---- Creation -------------------------------------------------------------

/// `constant`: the literal must be representable in `dtype`.
fn constant(value: Literal, shape: &Shape, dtype: DType) -> Result<(Shape, DType), InferError> {
    check_literal(value, dtype)?;
    Ok((shape.clone(), dtype))
}

/// `arange`: a numeric dtype that can represent `start` and `step`.
fn arange(
    start: Literal,
    step: Literal,
    len: usize,
    dtype: DType,
) -> Result<(Shape, DType), InferError> {
    if !dtype.is_numeric() {
        return err("arange needs a numeric dtype");
    }
    check_literal(start, dtype)?;
    check_literal(step, dtype)?;
    Ok((Shape::new(&[len]), dtype))
}

/// `rand_uniform`: an i64 scalar seed, a float dtype, and at most 2^32 - 1
/// elements (the counter is 32 bits).
fn random_uniform(
    (s, d): Operand<'_>,
    shape: &Shape,
    dtype: DType,
) -> Result<(Shape, DType), InferError> {
    if d != DType::I64 || s.rank() != 0 {
        return err(format!("the seed must be an i64 scalar, got {d}{s}"));
    }
    if !dtype.is_float() {
        return err(format!("needs a float dtype, got {dtype}"));
    }
    if shape.numel() as u64 > u32::MAX as u64 {
        return err("the counter is 32 bits: at most 2^32 - 1 elements");
    }
    Ok((shape.clone(), dtype))
}

// ---- Elementwise ----------------------------------------------------------

/// Unary ops keep the operand's type; `neg`, `abs` and `relu` take any
/// numeric dtype, the rest a float one.
fn unary(u: UnaryOp, (s, d): Operand<'_>) -> Result<(Shape, DType), InferError> {
    let ok = match u {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => d.is_numeric(),
        _ => d.is_float(),
    };
    if !ok {
        let need = if d.is_numeric() {
            "a float"
        } else {
            "a numeric"
        };
        return err(format!("needs {need} dtype, got {d}"));
    }
    Ok((s.clone(), d))
}

/// Binary ops broadcast two operands of one numeric dtype (`pow` not on u8).
/// The common shapes are cloned straight into the result (see
/// [`broadcast_to_either`]).
fn binary(b: BinaryOp, inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    let (x, y) = (inputs[0].0, inputs[1].0);
    let either = broadcast_to_either(x, y);
    let general = match either {
        Some(_) => None,
        None => Some(broadcast_general(x, y)?),
    };
    let d = same_dtype(inputs)?;
    if !d.is_numeric() {
        return err(format!("needs a numeric dtype, got {d}"));
    }
    if b == BinaryOp::Pow && d == DType::U8 {
        return err("pow is not defined for u8");
    }
    match (either, general) {
        (Some(s), _) => Ok((s.clone(), d)),
        (None, general) => Ok((general.expect("computed when neither"), d)),
    }
}

/// Comparisons broadcast two operands of one dtype to a bool result.
fn compare(inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    let shape = broadcast2(inputs)?;
    same_dtype(inputs)?;
    Ok((shape, DType::Bool))
}

/// `where_cond`: a bool condition, two branches of one dtype, all three
/// broadcast together.
fn select(inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    let (cs, cd) = inputs[0];
    if cd != DType::Bool {
        return err(format!("condition must be bool, got {cd}"));
    }
    let d = same_dtype(&inputs[1..])?;
    let s = broadcast2(&inputs[1..])?;
    let s = Shape::broadcast(cs, &s)
        .ok_or_else(|| InferError(format!("condition shape {cs} does not broadcast with {s}")))?;
    Ok((s, d))
}

// ---- Reductions -----------------------------------------------------------

/// Reductions over sorted, unique axes of a numeric operand (`mean`: float;
/// `max`/`min`: no zero-size reduced axis).
fn reduce(
    op: ReduceOp,
    axes: &Axes,
    keepdim: bool,
    (s, d): Operand<'_>,
) -> Result<(Shape, DType), InferError> {
    check_axes_sorted(axes, s.rank())?;
    match op {
        ReduceOp::Mean if !d.is_float() => {
            return err(format!("mean needs a float dtype, got {d}"))
        }
        _ if !d.is_numeric() => return err(format!("needs a numeric dtype, got {d}")),
        ReduceOp::Max | ReduceOp::Min if axes.iter().any(|&a| s.dims()[a] == 0) => {
            return err(format!("cannot take {} over a zero-size axis", op.name()))
        }
        _ => {}
    }
    Ok((reduced_shape(s, axes, keepdim), d))
}

/// `argmax` over a non-empty axis of a numeric operand, giving i64 indices.
fn argmax(axis: usize, keepdim: bool, (s, d): Operand<'_>) -> Result<(Shape, DType), InferError> {
    check_axis(axis, s)?;
    if !d.is_numeric() {
        return err(format!("needs a numeric dtype, got {d}"));
    }
    if s.dims()[axis] == 0 {
        return err("cannot take argmax over a zero-size axis");
    }
    Ok((reduced_shape(s, &[axis], keepdim), DType::I64))
}

// ---- Layout ---------------------------------------------------------------

/// `reshape` keeps the element count.
fn reshape((s, d): Operand<'_>, to: &Shape) -> Result<(Shape, DType), InferError> {
    if s.numel() != to.numel() {
        return err(format!(
            "cannot reshape {s} ({} elements) to {to} ({} elements)",
            s.numel(),
            to.numel()
        ));
    }
    Ok((to.clone(), d))
}

/// `permute` takes a permutation of `0..rank`.
fn permute((s, d): Operand<'_>, perm: &Axes) -> Result<(Shape, DType), InferError> {
    let mut seen = vec![false; s.rank()];
    if perm.len() != s.rank() {
        return err(format!(
            "permutation {perm:?} has wrong length for rank {}",
            s.rank()
        ));
    }
    for &p in perm {
        if p >= s.rank() || std::mem::replace(&mut seen[p], true) {
            return err(format!("{perm:?} is not a permutation of 0..{}", s.rank()));
        }
    }
    Ok((Shape(perm.iter().map(|&p| s.dims()[p]).collect()), d))
}

/// `flip`: sorted, unique axes of the operand; any dtype.
fn reverse((s, d): Operand<'_>, axes: &Axes) -> Result<(Shape, DType), InferError> {
    if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|&a| a >= s.rank()) {
        return err(format!(
            "axes {axes:?} must be sorted, unique and below rank {}",
            s.rank()
        ));
    }
    Ok((s.clone(), d))
}

/// A sharding constraint names one mesh axis (or none) per dimension,
/// each axis at most once.
fn sharding_constraint(
    (s, d): Operand<'_>,
    split: &crate::SplitAxes,
) -> Result<(Shape, DType), InferError> {
    if split.len() != s.rank() {
        return err(format!(
            "a sharding constraint needs one entry per dimension: {} given for shape {s}",
            split.len()
        ));
    }
    for (i, a) in split.iter().enumerate() {
        if a.is_some() && split[..i].contains(a) {
            return err(format!(
                "mesh axis {a:?} splits two dimensions in {split:?}"
            ));
        }
    }
    Ok((s.clone(), d))
}

/// `broadcast_to` follows NumPy's rules.
fn broadcast_to((s, d): Operand<'_>, to: &Shape) -> Result<(Shape, DType), InferError> {
    if !s.broadcasts_to(to) {
        return err(format!("shape {s} cannot be broadcast to {to}"));
    }
    Ok((to.clone(), d))
}

/// `narrow`: `start..start + len` within the axis.
fn slice(
    (s, d): Operand<'_>,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<(Shape, DType), InferError> {
    check_axis(axis, s)?;
    let dim = s.dims()[axis];
    if start.checked_add(len).is_none_or(|end| end > dim) {
        return err(format!(
            "range {start}..{start}+{len} out of bounds for axis {axis} of size {dim}"
        ));
    }
    let mut out = s.clone();
    out.0[axis] = len;
    Ok((out, d))
}

/// The run-time start of a dynamic slice or update: an integer scalar.
fn check_start((s, d): Operand<'_>) -> Result<(), InferError> {
    if s.rank() != 0 || !matches!(d, DType::I32 | DType::I64) {
        return err(format!(
            "the start must be an i32 or i64 scalar, got {d}{s}"
        ));
    }
    Ok(())
}

/// `dynamic_slice`: `len` fits in the axis; the start is an integer scalar.
fn dynamic_slice(
    inputs: &[Operand<'_>],
    axis: usize,
    len: usize,
) -> Result<(Shape, DType), InferError> {
    let (s, d) = inputs[0];
    check_axis(axis, s)?;
    check_start(inputs[1])?;
    if len > s.dims()[axis] {
        return err(format!(
            "length {len} exceeds axis {axis} of size {}",
            s.dims()[axis]
        ));
    }
    let mut out = s.clone();
    out.0[axis] = len;
    Ok((out, d))
}

/// `dynamic_update_slice`: the update has x's dtype and shape except a
/// shorter or equal `axis`; the start is an integer scalar.
fn dynamic_update_slice(inputs: &[Operand<'_>], axis: usize) -> Result<(Shape, DType), InferError> {
    let ((s, d), (u, du)) = (inputs[0], inputs[1]);
    check_axis(axis, s)?;
    check_start(inputs[2])?;
    if du != d {
        return err(format!("dtypes differ: {d} and {du}"));
    }
    let fits = u.rank() == s.rank()
        && (0..s.rank()).all(|i| {
            if i == axis {
                u.dims()[i] <= s.dims()[i]
            } else {
                u.dims()[i] == s.dims()[i]
            }
        });
    if !fits {
        return err(format!("update {u} does not fit {s} along axis {axis}"));
    }
    Ok((s.clone(), d))
}

/// `cat`: one dtype, and shapes that differ only along `axis`.
fn concat(axis: usize, inputs: &[Operand<'_>]) -> Result<(Shape, DType), InferError> {
    let (s0, d) = inputs[0];
    check_axis(axis, s0)?;
    let mut total = 0usize;
    for (s, dt) in inputs {
        if *dt != d {
            return err(format!("dtypes differ: {d} and {dt}"));
        }
        let same_rest = s.rank() == s0.rank()
            && (0..s0.rank()).all(|i| i == axis || s.dims()[i] == s0.dims()[i]);
        if !same_rest {
            return err(format!("shapes {s0} and {s} differ outside axis {axis}"));
        }
        total += s.dims()[axis];
    }
    let mut out = s0.clone();
    out.0[axis] = total;
    Ok((out, d))
}

// ---- Contraction and indexing ---------------------------------------------

/// `matmul`: one numeric dtype, rank >= 2, equal contracting dims, and
/// batch dims that broadcast.
fn matmul((a, da): Operand<'_>, (b, db): Operand<'_>) -> Result<(Shape, DType), InferError> {
    if da != db {
        return err(format!("dtypes differ: {da} and {db}"));
    }
    if !da.is_numeric() {
        return err(format!("needs a numeric dtype, got {da}"));
    }
    if a.rank() < 2 || b.rank() < 2 {
        return err(format!("operands must have rank >= 2, got {a} and {b}"));
    }
    let (m, k) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
    let (k2, n) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
    if k != k2 {
        return err(format!("contracting dims differ: {a} x {b} ({k} vs {k2})"));
    }
    let ba = Shape::new(&a.dims()[..a.rank() - 2]);
    let bb = Shape::new(&b.dims()[..b.rank() - 2]);
    let mut batch = Shape::broadcast(&ba, &bb)
        .ok_or_else(|| InferError(format!("batch dims {ba} and {bb} do not broadcast")))?;
    batch.0.push(m);
    batch.0.push(n);
    Ok((batch, da))
}

/// `index_select`: 1-D integer indices into an axis that is non-empty
/// unless no index is taken.
fn index_select(
    axis: usize,
    (s, d): Operand<'_>,
    (is, id): Operand<'_>,
) -> Result<(Shape, DType), InferError> {
    check_axis(axis, s)?;
    if !id.is_int() || is.rank() != 1 {
        return err(format!(
            "indices must be a 1-D integer tensor, got {id}{is}"
        ));
    }
    let k = is.dims()[0];
    if k > 0 && s.dims()[axis] == 0 {
        return err(format!("cannot select from axis {axis} of size 0"));
    }
    let mut out = s.clone();
    out.0[axis] = k;
    Ok((out, d))
}

/// Shape after reducing `axes`, keeping them as size 1 when `keepdim`.
pub fn reduced_shape(s: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Shape::scalar();
    for (i, &d) in s.dims().iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.0.push(1);
            }
        } else {
            out.0.push(d);
        }
    }
    out
}

/// Normalises possibly negative user axes against `rank`: sorted, unique, in range.
pub fn normalize_axes(axes: &[isize], rank: usize) -> Result<Axes, InferError> {
    let mut out = Axes::new();
    for &a in axes {
        let n = normalize_axis(a, rank)?;
        if out.contains(&n) {
            return err(format!("axis {a} repeated in {axes:?}"));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// Normalises one possibly negative axis against `rank`.
pub fn normalize_axis(a: isize, rank: usize) -> Result<usize, InferError> {
    let r = rank as isize;
    if a < -r || a >= r {
        return err(format!("axis {a} out of range for rank {rank}"));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// `axis` names a dimension of `s`.
fn check_axis(axis: usize, s: &Shape) -> Result<(), InferError> {
    if axis >= s.rank() {
        return err(format!("axis {axis} out of range for rank {}", s.rank()));
    }
    Ok(())
}

fn check_axes_sorted(axes: &Axes, rank: usize) -> Result<(), InferError> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank || (i > 0 && axes[i - 1] >= a) {
            return err(format!("axes {axes:?} invalid for rank {rank}"));
        }
    }
    Ok(())
}

/// Whether the literal `v` is representable in `d` (what inference checks
/// for a constant), for callers that validate a host scalar before it is
/// recorded.
#[inline]
pub fn check_literal(v: Literal, d: DType) -> Result<(), InferError> {
    // The common case, a float in a float dtype, decided inline (every
    // `x * 0.5` checks one).
    if matches!(v, Literal::Float(_)) && d.is_float() {
        return Ok(());
    }
    check_literal_slow(v, d)
}

/// [`check_literal`] for every other pairing.
fn check_literal_slow(v: Literal, d: DType) -> Result<(), InferError> {
    match (v, d) {
        (Literal::Float(f), d) if d.is_int() && (f.fract() != 0.0 || !f.is_finite()) => {
            err(format!("value {f} is not representable as {d}"))
        }
        (Literal::Float(f), DType::U8) | (Literal::Float(f), DType::I32)
            if !(int_range(d).0..=int_range(d).1).contains(&(f as i128)) =>
        {
            err(format!("value {f} is out of range for {d}"))
        }
        (Literal::Int(i) | Literal::Dim(i), d) if d.is_int() => {
            let (lo, hi) = int_range(d);
            if (i as i128) < lo || (i as i128) > hi {
                err(format!("value {i} is out of range for {d}"))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

fn int_range(d: DType) -> (i128, i128) {
    match d {
        DType::U8 => (0, 255),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    }
}

/// The broadcast shape of two operands.
fn broadcast2(inputs: &[Operand<'_>]) -> Result<Shape, InferError> {
    let (a, b) = (inputs[0].0, inputs[1].0);
    match broadcast_to_either(a, b) {
        Some(s) => Ok(s.clone()),
        None => broadcast_general(a, b),
    }
}

/// The broadcast shape of `a` and `b` when it is one of them: equal shapes
/// and a rank-0 operand (`x * 0.5`), the common cases. A reference, in a
/// register: a shape returned through memory was read back whole from the
/// narrower stores that wrote it, a stall on every elementwise op.
#[inline(always)]
fn broadcast_to_either<'a>(a: &'a Shape, b: &'a Shape) -> Option<&'a Shape> {
    if a == b || b.rank() == 0 {
        Some(a)
    } else if a.rank() == 0 {
        Some(b)
    } else {
        None
    }
}

/// [`broadcast2`] of two shapes of nonzero ranks that differ.
#[inline(never)]
fn broadcast_general(a: &Shape, b: &Shape) -> Result<Shape, InferError> {
    Shape::broadcast(a, b)
        .ok_or_else(|| InferError(format!("shapes {a} and {b} cannot be broadcast together")))
}

fn same_dtype(inputs: &[Operand<'_>]) -> Result<DType, InferError> {
    let d = inputs[0].1;
    for (_, o) in &inputs[1..] {
        if *o != d {
            return err(format!("dtypes differ: {d} and {o}"));
        }
    }
    Ok(d)
}
