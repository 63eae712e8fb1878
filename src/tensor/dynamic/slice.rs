//! `narrow` and `cat` on dynamic axes: slices at run-time starts, and
//! growth by writing into a capacity buffer.

use super::pad::pad_to;
use super::sites::{capacity, Kind};
use super::{dim, Ctx, P, V};
use crate::lazy::TensorInner;
use crate::Result;
use lazyfuse_ir::{Op, Shape};
use std::sync::Arc;

/// `narrow`: a `dynamic_slice` at a run-time start on a dynamic axis or
/// at a site whose start changes; a result length that changes at this
/// site is itself dynamic (the operand is padded by that capacity first,
/// so the slice never runs off the end, where XLA would clamp the start).
pub(super) fn narrow(
    ctx: &Ctx<'_>,
    x: &V,
    axis: usize,
    start: usize,
    len: usize,
    site: (u32, bool),
) -> Result<V> {
    let dyn_len = site.0 & (1 << axis) != 0;
    let runtime = x.is_dyn(axis) || site.1 || dyn_len;
    let mut shape = x.shape.clone();
    shape.0[axis] = len;
    let mut out = V {
        t: x.t.clone(),
        shape,
        mask: x.mask & !(1 << axis),
        limit: x.limit.clone(),
        zero_pad: false,
    };
    out.limit.0[axis] = 0;
    if !runtime {
        out.t = ctx.rec(Op::Slice { axis, start, len }, &[P::T(x.t.clone())])?;
        return Ok(out);
    }
    let size = if dyn_len {
        capacity(ctx.loc, Kind::Narrow, axis, len)
    } else {
        len
    };
    let mut t = x.t.clone();
    if dyn_len {
        let grown = x.cap(axis) + size;
        t = pad_to(ctx, &t, axis, grown, axis)?;
        out.mask |= 1 << axis;
    }
    out.t = ctx.rec(Op::DynamicSlice { axis, len: size }, &[P::T(t), dim(start)])?;
    Ok(out)
}

/// Each axis's capacity and declared maximum over the operands dynamic
/// along it (`None` where none is).
fn dynamic_axes(vs: &[&V], rank: usize) -> Vec<Option<(usize, usize)>> {
    (0..rank)
        .map(|a| {
            let dynamic: Vec<&&V> = vs.iter().filter(|v| v.is_dyn(a)).collect();
            if dynamic.is_empty() {
                return None;
            }
            let cap = dynamic.iter().map(|v| v.cap(a)).max().unwrap_or(0);
            let lim = dynamic
                .iter()
                .map(|v| v.limit.dims()[a])
                .find(|&l| l > 0)
                .unwrap_or(0);
            Some((cap, lim))
        })
        .collect()
}

/// The operands' buffers padded to a common capacity on every axis but
/// `axis`, and cut to their lengths along it unless the cat runs `along`
/// it (into a capacity buffer).
fn aligned(
    ctx: &Ctx<'_>,
    vs: &[&V],
    axes: &[Option<(usize, usize)>],
    axis: usize,
    along: bool,
) -> Result<Vec<Arc<TensorInner>>> {
    let mut parts = Vec::with_capacity(vs.len());
    for v in vs {
        let mut t = v.t.clone();
        for (a, ax) in axes.iter().enumerate() {
            if a != axis {
                t = pad_to(ctx, &t, a, ax.map_or(v.len(a), |(c, _)| c), a)?;
            } else if !along {
                t = pad_to(ctx, &t, a, v.len(a), a)?;
            }
        }
        parts.push(t);
    }
    Ok(parts)
}

/// The capacity of a cat's result along `axis`: the first operand's when
/// it is dynamic and holds the result, else the declared maximum (`Err`
/// past it), else the site's bucketed capacity for `total`.
fn cat_capacity(
    ctx: &Ctx<'_>,
    vs: &[&V],
    first: &Arc<TensorInner>,
    axis: usize,
    total: usize,
    limit: usize,
) -> Result<usize> {
    let first_cap = first.shape.dims()[axis];
    if vs[0].is_dyn(axis) && first_cap >= total {
        return Ok(first_cap);
    }
    if limit == 0 {
        return Ok(capacity(ctx.loc, Kind::Cat, axis, total));
    }
    if total > limit {
        let d: Vec<String> = vs
            .iter()
            .map(|v| format!("{}{}", v.dtype(), v.shape))
            .collect();
        return Err(ctx.err(
            format!("the result's axis {axis} would have length {total}, beyond its declared maximum {limit} (mark_dynamic)"),
            d.join(", "),
        ));
    }
    Ok(limit)
}

/// Room past the capacity for the padding of later operands, so no write
/// runs off the end (XLA would move it back by clamping). A dynamic
/// operand's whole capacity, not its padding: the structure must not
/// depend on a length.
fn write_slack(vs: &[&V], parts: &[Arc<TensorInner>], axis: usize) -> usize {
    vs[1..]
        .iter()
        .zip(&parts[1..])
        .map(|(v, p)| {
            if v.is_dyn(axis) {
                p.shape.dims()[axis]
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0)
}

/// `cat`: operands aligned on the other axes; along a dynamic axis (or a
/// site whose result length changes), later operands are written into the
/// first one's buffer at their run-time offsets. The result is dynamic
/// along it only when its length changes at this site or was declared.
pub(super) fn cat(ctx: &Ctx<'_>, vs: &[&V], axis: usize, r: &Shape, site: u32) -> Result<V> {
    let mut axes = dynamic_axes(vs, r.rank());
    let along = axes[axis].is_some() || site & (1 << axis) != 0;
    let parts = aligned(ctx, vs, &axes, axis, along)?;
    if !along {
        let args: Vec<P> = parts.into_iter().map(P::T).collect();
        let t = ctx.rec(Op::Concat { axis }, &args)?;
        return Ok(V::with_axes(t, r, &axes));
    }
    let total = r.dims()[axis];
    let limit = axes[axis].map_or(0, |(_, l)| l);
    let cap = cat_capacity(ctx, vs, &parts[0], axis, total, limit)?;
    let slack = write_slack(vs, &parts, axis);
    let mut first = parts[0].clone();
    if vs[0].is_dyn(axis) && Arc::ptr_eq(&first, &vs[0].t) && vs[0].cap(axis) < cap {
        // A computed cache that outgrows its capacity: copied into the
        // new capacity outside the program, which then is the one every
        // later length of this bucket runs.
        if let Some(grown) = super::pad::regrow_computed(ctx, &first, axis, cap) {
            first = grown;
        }
    }
    let mut buf = pad_to(ctx, &first, axis, cap + slack, axis)?;
    let mut at = vs[0].len(axis);
    for (v, p) in vs[1..].iter().zip(&parts[1..]) {
        let op = Op::DynamicUpdateSlice { axis };
        buf = ctx.rec(op, &[P::T(buf), P::T(p.clone()), dim(at)])?;
        at += v.len(axis);
    }
    if limit == 0 && site & (1 << axis) == 0 {
        // The result's length has not changed at this site, although its
        // operands' lengths vary (a fixed-size cache written after a prompt
        // of any length): the result is exact. The cut depends on the
        // capacities and that steady length only, so it compiles once.
        buf = pad_to(ctx, &buf, axis, total, axis)?;
        axes[axis] = None;
        return Ok(V::with_axes(buf, r, &axes));
    }
    if slack > 0 {
        buf = pad_to(ctx, &buf, axis, cap, axis)?;
    }
    // All padding is zero when the buffer's only padding is along `axis`,
    // the first operand's padding (if any) was zero and `pad_to` added zero
    // fill, and only static operands were written into it, at logical
    // offsets: a growing cache, whose contractions then need no mask on it.
    let zero_pad = !crate::config::poison_padding()
        && slack == 0
        && vs[0].zero_pad
        && axes
            .iter()
            .enumerate()
            .all(|(a, ax)| a == axis || ax.is_none());
    axes[axis] = Some((cap, limit));
    let mut out = V::with_axes(buf, r, &axes);
    out.zero_pad = zero_pad;
    Ok(out)
}
