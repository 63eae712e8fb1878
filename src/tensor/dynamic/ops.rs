//! Each op on dynamic operands, as ops on their padded buffers.
//!
//! The rules (docs/dynamic-shapes.md lists them for users):
//! - elementwise ops run on the padding too; an operand that is static,
//!   or padded to a smaller capacity, along a dynamic result axis is
//!   padded to the result's capacity;
//! - reductions, extrema and argmax over a dynamic axis first replace the
//!   padding by the reduction's identity; `mean` divides by the length;
//! - a matmul contracting over a dynamic axis zeroes the padding of both
//!   operands (a select, so NaN padding cannot leak), except an operand
//!   whose padding is zero already (a cache grown by `cat`: see
//!   `V::zero_pad`);
//! - `cat` along a dynamic axis writes each later operand into the first
//!   one's buffer with `dynamic_update_slice` at its run-time offset;
//! - `narrow` on a dynamic axis, or at a start that changes, is a
//!   `dynamic_slice` at a run-time start;
//! - a reshape keeps each dynamic axis as an axis of its own; one that
//!   would merge it with others cannot be exact and is an `Err`.

use super::pad::{mask, pad_to};
use super::sites::{capacity, Kind};
use super::slice::{cat, narrow};
use super::{dim, Ctx, P, V};
use crate::tensor::{Arg, Tensor};
use crate::{Device, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{BinaryOp, DType, Literal, Op, ReduceOp, Shape};
use smallvec::SmallVec;

/// An operand: a value or a host scalar.
enum O {
    V(V),
    S(Literal, DType),
}

/// Records `op` (already validated on the logical shapes: `shape` is its
/// logical result) on dynamic operands or at a dynamic site (`site`: the
/// site's dynamic axes and whether its start is run-time).
pub(crate) fn apply(
    op: &Op,
    args: &[Arg<'_>],
    shape: Shape,
    site: (u32, bool),
    loc: Origin,
) -> Result<Tensor> {
    let device = args
        .iter()
        .find_map(|a| match a {
            Arg::T(t) => Some(t.device()),
            Arg::Scalar(..) => None,
        })
        .expect("every op with operands has a tensor operand");
    let ctx = Ctx {
        device,
        loc,
        name: op.name(),
    };
    let os: SmallVec<[O; 3]> = args
        .iter()
        .map(|a| match a {
            Arg::T(t) => O::V(V::of(t)),
            Arg::Scalar(l, d) => O::S(*l, *d),
        })
        .collect();
    let v = |k: usize| match &os[k] {
        O::V(v) => v,
        O::S(..) => unreachable!("operand {k} of {} is a tensor", op.name()),
    };
    let out = match op {
        Op::Unary(_) | Op::Convert(_) | Op::Binary(_) | Op::Compare(_) | Op::Select => {
            elementwise(&ctx, op, &os, &shape, 0)?
        }
        Op::BroadcastTo(_) => broadcast(&ctx, v(0), &shape, site.0)?,
        Op::Reduce {
            op: r,
            axes,
            keepdim,
        } => reduce(&ctx, *r, axes, *keepdim, v(0), &shape)?,
        Op::ArgMax { axis, keepdim } => argmax(&ctx, *axis, *keepdim, v(0), &shape)?,
        Op::Reshape(_) => reshape(&ctx, v(0), &shape)?,
        Op::Permute(perm) => {
            let x = v(0);
            let t = ctx.rec(Op::Permute(perm.clone()), &[P::T(x.t.clone())])?;
            let mask = perm
                .iter()
                .enumerate()
                .filter(|(_, &p)| x.is_dyn(p))
                .fold(0, |m, (i, _)| m | (1 << i));
            let limit = Shape(perm.iter().map(|&p| x.limit.dims()[p]).collect());
            V {
                t,
                shape,
                mask,
                limit,
                zero_pad: false,
            }
        }
        Op::ShardingConstraint(_) => {
            // A layout, not a value: the padded buffer keeps its metadata.
            let x = v(0);
            let t = ctx.rec(op.clone(), &[P::T(x.t.clone())])?;
            V {
                t,
                shape,
                mask: x.mask,
                limit: x.limit.clone(),
                zero_pad: false,
            }
        }
        Op::Slice { axis, start, len } => narrow(&ctx, v(0), *axis, *start, *len, site)?,
        Op::Concat { axis } => {
            let vs: Vec<&V> = (0..os.len()).map(v).collect();
            cat(&ctx, &vs, *axis, &shape, site.0)?
        }
        Op::MatMul => matmul(&ctx, v(0), v(1), &shape)?,
        Op::IndexSelect { axis } => index_select(&ctx, v(0), v(1), *axis, &shape)?,
        Op::ScatterAdd { axis } if scatter_aligned(v(0), v(2), *axis) => {
            scatter_add(&ctx, (v(0), v(1), v(2)), *axis, &shape)?
        }
        Op::RandomUniform { dtype, .. } if site.0 != 0 => {
            super::random::rand_uniform(&ctx, v(0), &shape, *dtype, site.0)?
        }
        Op::Input { .. }
        | Op::Constant { .. }
        | Op::Arange { .. }
        | Op::RandomUniform { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice { .. }
        | Op::Reverse(_)
        | Op::Conv(_)
        | Op::ScatterAdd { .. }
        | Op::Custom(_) => {
            let mut args: SmallVec<[P; 3]> = SmallVec::new();
            for o in &os {
                args.push(match o {
                    O::V(v) => P::T(exact(&ctx, v, "this op")?.t),
                    O::S(l, d) => P::S(*l, *d),
                });
            }
            let t = ctx.rec(op.clone(), &args)?;
            V::of(&Tensor(t))
        }
    };
    Ok(out.into_tensor())
}

/// `v` with its padding cut off: exact shapes, compiled per length as
/// without dynamic dimensions. The way out for what cannot be made exact
/// on padded values, taken only for axes that became dynamic by
/// themselves: an axis declared with [`Tensor::mark_dynamic`] is a
/// promise not to recompile, so breaking it is an `Err` naming `what`.
fn exact(ctx: &Ctx<'_>, v: &V, what: &str) -> Result<V> {
    if let Some(a) = (0..v.shape.rank()).find(|&a| v.is_dyn(a) && v.limit.dims()[a] > 0) {
        return Err(ctx.err(
            format!(
                "{what} cannot be made exact on dynamic axis {a} (length {}, capacity {}, declared by mark_dynamic); keep the dynamic axis as its own axis",
                v.len(a),
                v.cap(a)
            ),
            format!("{}{}", v.dtype(), v.shape),
        ));
    }
    if v.mask != 0 && crate::metrics::explaining() {
        crate::metrics::dynamic_static(format!(
            "{} {}{} at {}:{} cut to exact shapes ({what} cannot run on padded values): compiled per length",
            ctx.name,
            v.dtype(),
            v.shape,
            ctx.loc.file(),
            ctx.loc.line()
        ));
    }
    let mut t = v.t.clone();
    for a in 0..v.shape.rank() {
        t = pad_to(ctx, &t, a, v.len(a), a)?;
    }
    Ok(V::of(&Tensor(t)))
}

/// An `arange` at a site whose result axis is dynamic (`site_mask`): the
/// same iota at capacity length. (`full` is a rank-0 constant broadcast
/// to its shape: the broadcast's own site makes it dynamic.)
pub(crate) fn nullary(
    op: Op,
    shape: Shape,
    dtype: DType,
    site_mask: u32,
    device: &Device,
    loc: Origin,
) -> Result<Tensor> {
    let ctx = Ctx {
        device,
        loc,
        name: op.name(),
    };
    let Op::Arange {
        start, step, len, ..
    } = op
    else {
        return Err(crate::Error::internal(format!(
            "{} has no dynamic form",
            op.name()
        )));
    };
    let len = if site_mask & 1 != 0 {
        capacity(loc, Kind::Arange, 0, len)
    } else {
        len
    };
    let op = Op::Arange {
        start,
        step,
        len,
        dtype,
    };
    let t = ctx.rec(op, &[])?;
    let rank = shape.rank();
    Ok(V {
        t,
        shape,
        mask: site_mask & ((1u32 << rank) - 1),
        limit: Shape(SmallVec::from_elem(0, rank)),
        zero_pad: false,
    }
    .into_tensor())
}

/// Dynamic axes of a broadcast result of logical shape `r` (the last
/// `skip` axes left out): per axis, the capacity where an operand
/// contributes a dynamic axis of the result's size, with its maximum.
fn result_axes(vs: &[&V], r: &Shape, skip: usize) -> Vec<Option<(usize, usize)>> {
    let n = r.rank() - skip;
    (0..n)
        .map(|a| {
            let mut best: Option<(usize, usize)> = None;
            for v in vs {
                let vr = v.shape.rank() - skip;
                if a + vr < n {
                    continue;
                }
                let j = a + vr - n;
                if v.is_dyn(j) && v.len(j) == r.dims()[a] {
                    let (c, l) = best.unwrap_or((0, 0));
                    let lim = if l == 0 { v.limit.dims()[j] } else { l };
                    best = Some((c.max(v.cap(j)), lim));
                }
            }
            best
        })
        .collect()
}

/// `v` padded or cut so it broadcasts physically against a result with
/// dynamic axes `axes` and logical shape `r` (the last `skip` axes left
/// alone).
fn align(
    ctx: &Ctx<'_>,
    v: &V,
    r: &Shape,
    axes: &[Option<(usize, usize)>],
    skip: usize,
) -> Result<std::sync::Arc<crate::lazy::TensorInner>> {
    let mut t = v.t.clone();
    let n = axes.len();
    let vr = v.shape.rank() - skip;
    for j in 0..vr {
        let a = j + n - vr;
        // A static size-1 axis always broadcasts (whatever the length it
        // meets: the structure must not depend on a length being 1); a
        // dynamic axis of the result's length, or a static one of its
        // size, is padded to the capacity; a dynamic axis broadcast from
        // length 1 is cut to 1.
        let want = match axes[a] {
            Some((cap, _)) if v.is_dyn(j) && v.len(j) == r.dims()[a] => cap,
            Some((cap, _)) if !v.is_dyn(j) && v.len(j) != 1 => cap,
            _ if v.is_dyn(j) => v.len(j),
            _ => v.cap(j),
        };
        t = pad_to(ctx, &t, j, want, j)?;
    }
    Ok(t)
}

/// Unary, binary, compare, select and convert: the op on aligned buffers.
fn elementwise(ctx: &Ctx<'_>, op: &Op, os: &[O], r: &Shape, skip: usize) -> Result<V> {
    let vs: Vec<&V> = os
        .iter()
        .filter_map(|o| match o {
            O::V(v) => Some(v),
            O::S(..) => None,
        })
        .collect();
    let axes = result_axes(&vs, r, skip);
    let mut args: SmallVec<[P; 3]> = SmallVec::new();
    for o in os {
        args.push(match o {
            O::V(v) => P::T(align(ctx, v, r, &axes, skip)?),
            O::S(l, d) => P::S(*l, *d),
        });
    }
    let t = ctx.rec(op.clone(), &args)?;
    Ok(V::with_axes(t, r, &axes))
}

/// `broadcast_to`: dynamic axes of the operand carry over; a broadcast
/// axis marked dynamic at this site gets a capacity.
fn broadcast(ctx: &Ctx<'_>, x: &V, r: &Shape, site: u32) -> Result<V> {
    let mut axes = result_axes(&[x], r, 0);
    for (a, ax) in axes.iter_mut().enumerate() {
        if ax.is_none() && site & (1 << a) != 0 {
            *ax = Some((capacity(ctx.loc, Kind::Broadcast, a, r.dims()[a]), 0));
        }
    }
    let t = align(ctx, x, r, &axes, 0)?;
    let phys: Vec<usize> = (0..r.rank())
        .map(|a| axes[a].map_or(r.dims()[a], |(c, _)| c))
        .collect();
    let t = ctx.rec(Op::BroadcastTo(Shape::new(&phys)), &[P::T(t)])?;
    Ok(V::with_axes(t, r, &axes))
}

/// `x` broadcast to `like`'s logical shape with `like`'s dynamic axes and
/// capacities: a `zeros_like` of a value with dynamic axes is dynamic
/// from its first call, in the same bucket, instead of being learnt by its
/// line after a length has changed there.
pub(crate) fn broadcast_like(x: &Tensor, like: &Tensor, loc: Origin) -> Result<Tensor> {
    let l = V::of(like);
    let ctx = Ctx {
        device: like.device(),
        loc,
        name: "broadcast_to",
    };
    let axes: Vec<Option<(usize, usize)>> = (0..l.shape.rank())
        .map(|a| l.is_dyn(a).then(|| (l.cap(a), l.limit.dims()[a])))
        .collect();
    let t = align(&ctx, &V::of(x), &l.shape, &axes, 0)?;
    let t = ctx.rec(Op::BroadcastTo(l.t.shape.clone()), &[P::T(t)])?;
    Ok(V::with_axes(t, &l.shape, &axes).into_tensor())
}

/// The view left after removing (or keeping as 1) the reduced `axes`.
fn reduced_view(
    x: &V,
    t: std::sync::Arc<crate::lazy::TensorInner>,
    axes: &[usize],
    keepdim: bool,
    r: &Shape,
) -> V {
    let mut mask = 0;
    let mut limit = SmallVec::new();
    let mut k = 0;
    for a in 0..x.shape.rank() {
        let gone = axes.contains(&a);
        if gone && !keepdim {
            continue;
        }
        if !gone && x.is_dyn(a) {
            mask |= 1 << k;
        }
        limit.push(if gone { 0 } else { x.limit.dims()[a] });
        k += 1;
    }
    V {
        t,
        shape: r.clone(),
        mask,
        limit: Shape(limit),
        zero_pad: false,
    }
}

/// Reductions: padding becomes the identity; `mean` is a sum divided by
/// the run-time count (in f32 for half types, as the static lowering).
fn reduce(
    ctx: &Ctx<'_>,
    op: ReduceOp,
    axes: &[usize],
    keepdim: bool,
    x: &V,
    r: &Shape,
) -> Result<V> {
    let dt = x.dtype();
    let dyn_reduced = axes.iter().any(|&a| x.is_dyn(a));
    let mut t = x.t.clone();
    for &a in axes {
        if x.is_dyn(a) {
            t = mask(ctx, &t, a, x.len(a), op.identity(dt))?;
        }
    }
    let axes_v: lazyfuse_ir::Axes = axes.iter().copied().collect();
    let t = if op == ReduceOp::Mean && dyn_reduced {
        let acc = if matches!(dt, DType::BF16 | DType::F16) {
            DType::F32
        } else {
            dt
        };
        let xin = if acc != dt {
            ctx.rec(Op::Convert(acc), &[P::T(t)])?
        } else {
            t
        };
        let s = ctx.rec(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: axes_v,
                keepdim,
            },
            &[P::T(xin)],
        )?;
        let count: usize = axes.iter().map(|&a| x.len(a)).product();
        let n = ctx.rec(Op::Convert(acc), &[dim(count)])?;
        let m = ctx.rec(Op::Binary(BinaryOp::Div), &[P::T(s), P::T(n)])?;
        if acc != dt {
            ctx.rec(Op::Convert(dt), &[P::T(m)])?
        } else {
            m
        }
    } else {
        ctx.rec(
            Op::Reduce {
                op,
                axes: axes_v,
                keepdim,
            },
            &[P::T(t)],
        )?
    };
    Ok(reduced_view(x, t, axes, keepdim, r))
}

/// The smallest value of a dtype (padding before an argmax).
fn lowest(dt: DType) -> Literal {
    match dt {
        d if d.is_float() => Literal::Float(f64::NEG_INFINITY),
        DType::I32 => Literal::Int(i32::MIN as i64),
        DType::I64 => Literal::Int(i64::MIN),
        DType::Bool => Literal::Bool(false),
        _ => Literal::Int(0),
    }
}

/// `argmax`: padding becomes the lowest value, so the first maximum is a
/// logical element (padding comes after every logical index).
fn argmax(ctx: &Ctx<'_>, axis: usize, keepdim: bool, x: &V, r: &Shape) -> Result<V> {
    let mut t = x.t.clone();
    if x.is_dyn(axis) {
        t = mask(ctx, &t, axis, x.len(axis), lowest(x.dtype()))?;
    }
    let t = ctx.rec(Op::ArgMax { axis, keepdim }, &[P::T(t)])?;
    Ok(reduced_view(x, t, &[axis], keepdim, r))
}

/// A reshape that keeps every dynamic axis an axis of its own: axis `d`
/// maps to the output axis with the same logical prefix product and size.
fn reshape(ctx: &Ctx<'_>, x: &V, r: &Shape) -> Result<V> {
    let pre = |s: &Shape, k: usize| -> usize { s.dims()[..k].iter().product() };
    let mut phys = r.clone();
    let mut mask = 0;
    let mut limit = Shape(SmallVec::from_elem(0, r.rank()));
    let mut last_e: Option<usize> = None;
    for d in (0..x.shape.rank()).filter(|&d| x.is_dyn(d)) {
        let (p, len) = (pre(&x.shape, d), x.len(d));
        let from = last_e.map_or(0, |e| e + 1);
        let e = (from..r.rank()).find(|&e| pre(r, e) == p && r.dims()[e] == len);
        // The static dims between two dynamic axes must regroup among
        // themselves, or padding would land inside logical rows.
        let ok = e.is_some_and(|e| {
            let after_in: usize = x.shape.dims()[d + 1..].iter().product();
            let after_out: usize = r.dims()[e + 1..].iter().product();
            after_in == after_out
        });
        let Some(e) = e.filter(|_| ok) else {
            let what = format!("a reshape merging dynamic axis {d} with other axes");
            let x = exact(ctx, x, &what)?;
            let t = ctx.rec(Op::Reshape(r.clone()), &[P::T(x.t)])?;
            return Ok(V::of(&Tensor(t)));
        };
        phys.0[e] = x.cap(d);
        mask |= 1 << e;
        limit.0[e] = x.limit.dims()[d];
        last_e = Some(e);
    }
    let t = ctx.rec(Op::Reshape(phys), &[P::T(x.t.clone())])?;
    Ok(V {
        t,
        shape: r.clone(),
        mask,
        limit,
        zero_pad: false,
    })
}

/// `matmul`: batch axes as elementwise ops; a dynamic contraction axis is
/// zeroed past its length in both operands; dynamic `m` and `n` carry.
fn matmul(ctx: &Ctx<'_>, a: &V, b: &V, r: &Shape) -> Result<V> {
    let (ra, rb, rr) = (a.shape.rank(), b.shape.rank(), r.rank());
    let mut axes = result_axes(&[a, b], r, 2);
    let mut ta = align(ctx, a, r, &axes, 2)?;
    let mut tb = align(ctx, b, r, &axes, 2)?;
    let (ka, kb) = (ra - 1, rb - 2);
    if a.is_dyn(ka) || b.is_dyn(kb) {
        let cap = a.cap(ka).max(b.cap(kb));
        let k = a.len(ka);
        ta = pad_to(ctx, &ta, ka, cap, ka)?;
        tb = pad_to(ctx, &tb, kb, cap, kb)?;
        // An operand whose padding is all zero (a cache grown by `cat`, or
        // a static operand zero-filled to the capacity just now) adds only
        // `x * 0` terms where the other, masked operand holds zeros too.
        let zero_fill = !crate::config::poison_padding();
        if !(zero_fill && a.zero_pad) {
            ta = mask(ctx, &ta, ka, k, Literal::Int(0))?;
        }
        if !(zero_fill && b.zero_pad) {
            tb = mask(ctx, &tb, kb, k, Literal::Int(0))?;
        }
    }
    let t = ctx.rec(Op::MatMul, &[P::T(ta), P::T(tb)])?;
    let m = a
        .is_dyn(ra - 2)
        .then(|| (a.cap(ra - 2), a.limit.dims()[ra - 2]));
    let nn = b
        .is_dyn(rb - 1)
        .then(|| (b.cap(rb - 1), b.limit.dims()[rb - 1]));
    axes.push(m);
    axes.push(nn);
    debug_assert_eq!(axes.len(), rr);
    Ok(V::with_axes(t, r, &axes))
}

/// `index_select`: indices clamped to the logical length of a dynamic
/// indexed axis (the gather would clamp to the capacity); a dynamic index
/// list makes the result axis dynamic.
fn index_select(ctx: &Ctx<'_>, x: &V, idx: &V, axis: usize, r: &Shape) -> Result<V> {
    let mut i = idx.t.clone();
    if x.is_dyn(axis) {
        let last = Literal::Dim(x.len(axis).saturating_sub(1) as i64);
        i = ctx.rec(
            Op::Binary(BinaryOp::Minimum),
            &[P::T(i), P::S(last, idx.dtype())],
        )?;
    }
    let mut axes: Vec<Option<(usize, usize)>> = (0..r.rank())
        .map(|a| x.is_dyn(a).then(|| (x.cap(a), x.limit.dims()[a])))
        .collect();
    axes[axis] = idx.is_dyn(0).then(|| (idx.cap(0), idx.limit.dims()[0]));
    let t = ctx.rec(Op::IndexSelect { axis }, &[P::T(x.t.clone()), P::T(i)])?;
    Ok(V::with_axes(t, r, &axes))
}

/// Whether `index_add` can run on padded values: the target's indexed axis
/// is static and every other axis is padded alike in target and source.
fn scatter_aligned(x: &V, src: &V, axis: usize) -> bool {
    !x.is_dyn(axis)
        && (0..x.shape.rank())
            .filter(|&a| a != axis)
            .all(|a| x.is_dyn(a) == src.is_dyn(a) && (!x.is_dyn(a) || x.cap(a) == src.cap(a)))
}

/// `index_add` of a dynamic number of slices (a lookup's gradient over a
/// dynamic sequence): index list and source padded to one capacity, the
/// padded source slices zeroed, so they add nothing wherever they point.
fn scatter_add(ctx: &Ctx<'_>, (x, idx, src): (&V, &V, &V), axis: usize, r: &Shape) -> Result<V> {
    let (mut i, mut s) = (idx.t.clone(), src.t.clone());
    if idx.is_dyn(0) || src.is_dyn(axis) {
        let cap = idx.t.shape.dims()[0].max(src.t.shape.dims()[axis]);
        i = pad_to(ctx, &i, 0, cap, 0)?;
        s = pad_to(ctx, &s, axis, cap, axis)?;
        s = mask(ctx, &s, axis, src.len(axis), Literal::Int(0))?;
    }
    let t = ctx.rec(
        Op::ScatterAdd { axis },
        &[P::T(x.t.clone()), P::T(i), P::T(s)],
    )?;
    let axes: Vec<Option<(usize, usize)>> = (0..r.rank())
        .map(|a| x.is_dyn(a).then(|| (x.cap(a), x.limit.dims()[a])))
        .collect();
    Ok(V::with_axes(t, r, &axes))
}
