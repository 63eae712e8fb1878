//! Padding: growing a value to a capacity, masking what lies past a
//! length, and the host side (padding uploads, stripping downloads).

use super::{dim, fill, Ctx, P};
use crate::lazy::TensorInner;
use crate::metrics::FlushReason;
use crate::Result;
use lazyfuse_ir::{interp, CmpOp, DType, HostTensor, Literal, Op, Shape};
use std::sync::Arc;

/// `x` with axis `axis` made `cap` long: cut when longer (only padding is
/// cut: callers keep every length within `cap`), padded with [`fill`]
/// when shorter. `salt` picks the poison value.
pub(super) fn pad_to(
    ctx: &Ctx<'_>,
    x: &Arc<TensorInner>,
    axis: usize,
    cap: usize,
    salt: usize,
) -> Result<Arc<TensorInner>> {
    let have = x.shape.dims()[axis];
    if have == cap {
        return Ok(x.clone());
    }
    if have > cap {
        return ctx.rec(
            Op::Slice {
                axis,
                start: 0,
                len: cap,
            },
            &[P::T(x.clone())],
        );
    }
    let mut shape = x.shape.clone();
    shape.0[axis] = cap - have;
    let c = ctx.rec(
        Op::Constant {
            value: fill(x.dtype, salt),
            shape,
            dtype: x.dtype,
        },
        &[],
    )?;
    ctx.rec(Op::Concat { axis }, &[P::T(x.clone()), P::T(c)])
}

/// `x` with every element at index `>= len` along `axis` replaced by
/// `value`: an iota compared with the run-time length, and a select (a
/// select, not a multiply, so NaN padding cannot leak through).
pub(super) fn mask(
    ctx: &Ctx<'_>,
    x: &Arc<TensorInner>,
    axis: usize,
    len: usize,
    value: Literal,
) -> Result<Arc<TensorInner>> {
    let cap = x.shape.dims()[axis];
    let iota = ctx.rec(
        Op::Arange {
            start: Literal::Int(0),
            step: Literal::Int(1),
            len: cap,
            dtype: DType::I32,
        },
        &[],
    )?;
    let keep = ctx.rec(Op::Compare(CmpOp::Lt), &[P::T(iota), dim(len)])?;
    let mut col = Shape::new(&vec![1; x.shape.rank()]);
    col.0[axis] = cap;
    let keep = ctx.rec(Op::Reshape(col), &[P::T(keep)])?;
    ctx.rec(
        Op::Select,
        &[P::T(keep), P::T(x.clone()), P::S(value, x.dtype)],
    )
}

/// `x`, already computed (or being computed), padded to `cap` along
/// `axis` outside any region: downloaded, filled as [`pad_to`] fills, and
/// uploaded again. A cache that outgrows its bucket so enters the next one
/// as the same buffer shape the next steps pass in: the step that crosses
/// the boundary runs the new bucket's executable instead of compiling a
/// growth program of its own (one compile per boundary, not two), at the
/// cost of one copy of the cache, once per bucket. `None` where that does
/// not apply (a value still recorded, a sharded one, a failed one: the
/// graph pads it, and reports the failure where it is used).
pub(super) fn regrow_computed(
    ctx: &Ctx<'_>,
    x: &Arc<TensorInner>,
    axis: usize,
    cap: usize,
) -> Option<Arc<TensorInner>> {
    if x.is_pending() || x.mesh().is_some() || x.shape.dims()[axis] >= cap {
        return None;
    }
    let buf = x.materialize(FlushReason::Realize).ok()?;
    let rt = &ctx.device.rt;
    let host = rt.download(&buf).ok()?;
    let padded = pad_host(&host, &[(axis, cap)]);
    let grown = rt.upload(&padded, ctx.device.ordinal).ok()?;
    crate::metrics::add(&crate::metrics::COUNTERS.dynamic_regrows, 1);
    if crate::metrics::explaining() {
        crate::metrics::dynamic_marked(format!(
            "axis {axis} grown {} -> {cap} outside the program at {}:{}",
            x.shape.dims()[axis],
            ctx.loc.file(),
            ctx.loc.line()
        ));
    }
    Some(TensorInner::ready(grown, ctx.device))
}

/// A host array padded to `cap` along each `(axis, cap)` (uploads).
pub(crate) fn pad_host(h: &HostTensor, caps: &[(usize, usize)]) -> HostTensor {
    let mut out = h.clone();
    for &(axis, cap) in caps {
        let have = out.shape.dims()[axis];
        if have >= cap {
            continue;
        }
        let mut shape = out.shape.clone();
        shape.0[axis] = cap - have;
        let c = Op::Constant {
            value: fill(out.dtype, axis),
            shape,
            dtype: out.dtype,
        };
        let pad = interp::eval_op(&c, &[]).expect("a constant of the host array's dtype");
        out = interp::eval_op(&Op::Concat { axis }, &[&out, &pad])
            .expect("shapes agree outside the padded axis");
    }
    out
}

/// The logical elements of a padded host array (downloads).
pub(crate) fn unpad_host(h: HostTensor, logical: &Shape) -> HostTensor {
    let mut out = h;
    for (axis, &len) in logical.dims().iter().enumerate() {
        if out.shape.dims()[axis] != len {
            let op = Op::Slice {
                axis,
                start: 0,
                len,
            };
            out = interp::eval_op(&op, &[&out]).expect("a length within its capacity");
        }
    }
    out
}
