//! Random draws of a varying size, at their bucket's capacity.
//!
//! `rand_uniform`'s i-th value depends only on its key and `i`, the
//! element's row-major index in the *logical* shape. A padded draw must
//! give every logical element the value an exact draw gives it, so that a
//! bucketed run computes the numbers of an exact one (dropout masks and
//! noise of a varying size compile once per bucket and change nothing).
//! When the only dynamic axis comes first (after unit axes: `[len, d]`,
//! `[1, len, d]`), padded and logical row-major indices agree and the
//! padded draw is the op itself; otherwise the draw is flat over every
//! padded element and each element picks its logical index from it (a
//! gather whose index uses the run-time lengths as strides). Either way the
//! structure depends on capacities only.

use super::sites::{capacity, Kind};
use super::{dim, Ctx, P, V};
use crate::Result;
use lazyfuse_ir::{BinaryOp, DType, Literal, Op, Shape};
use smallvec::SmallVec;
use std::sync::Arc;

/// `rand_uniform` of logical shape `shape` (dynamic axes `mask`, from its
/// site) drawn from the rank-0 `key`, padded to the site's capacities.
pub(super) fn rand_uniform(
    ctx: &Ctx<'_>,
    key: &V,
    shape: &Shape,
    dtype: DType,
    mask: u32,
) -> Result<V> {
    let rank = shape.rank();
    let mask = mask & ((1u64 << rank) - 1) as u32;
    let lens = shape.dims();
    let caps: SmallVec<[usize; 4]> = (0..rank)
        .map(|a| {
            if mask & (1 << a) != 0 {
                capacity(ctx.loc, Kind::Random, a, lens[a])
            } else {
                lens[a]
            }
        })
        .collect();
    let key = P::T(key.t.clone());
    if mask == 0 {
        let op = Op::RandomUniform {
            shape: shape.clone(),
            dtype,
        };
        return Ok(V::of(&crate::Tensor(ctx.rec(op, &[key])?)));
    }
    let last = (31 - mask.leading_zeros()) as usize;
    let leading = (0..last).all(|a| mask & (1 << a) == 0 && lens[a] == 1);
    let t = if leading {
        let op = Op::RandomUniform {
            shape: Shape::new(&caps),
            dtype,
        };
        ctx.rec(op, &[key])?
    } else {
        gathered(ctx, key, lens, &caps, mask, dtype)?
    };
    Ok(V {
        t,
        shape: shape.clone(),
        mask,
        limit: Shape(SmallVec::from_elem(0, rank)),
        zero_pad: false,
    })
}

/// A flat draw over every padded element, each element taking the value
/// at its logical row-major index (strides from the run-time lengths).
/// Padding elements take some other element's value: finite, and ignored.
fn gathered(
    ctx: &Ctx<'_>,
    key: P,
    lens: &[usize],
    caps: &[usize],
    mask: u32,
    dtype: DType,
) -> Result<Arc<crate::lazy::TensorInner>> {
    let total: usize = caps.iter().product();
    let flat = ctx.rec(
        Op::RandomUniform {
            shape: Shape::new(&[total]),
            dtype,
        },
        &[key],
    )?;
    let full = Shape::new(caps);
    let mut index: Option<Arc<crate::lazy::TensorInner>> = None;
    for a in 0..caps.len() {
        // Axis `a`'s logical stride: the product of the later lengths, a
        // run-time scalar where any of them is dynamic.
        let later = a + 1..caps.len();
        let stride: usize = lens[later.clone()].iter().product();
        let stride = if later.into_iter().any(|b| mask & (1 << b) != 0) {
            dim(stride)
        } else {
            P::S(Literal::Int(stride as i64), DType::I32)
        };
        let iota = ctx.rec(
            Op::Arange {
                start: Literal::Int(0),
                step: Literal::Int(1),
                len: caps[a],
                dtype: DType::I32,
            },
            &[],
        )?;
        let mut col = Shape::new(&vec![1; caps.len()]);
        col.0[a] = caps[a];
        let iota = ctx.rec(Op::Reshape(col), &[P::T(iota)])?;
        let iota = ctx.rec(Op::BroadcastTo(full.clone()), &[P::T(iota)])?;
        let term = ctx.rec(Op::Binary(BinaryOp::Mul), &[P::T(iota), stride])?;
        index = Some(match index {
            None => term,
            Some(i) => ctx.rec(Op::Binary(BinaryOp::Add), &[P::T(i), P::T(term)])?,
        });
    }
    let index = index.expect("a draw of rank 1 or more has a dynamic axis");
    let index = ctx.rec(Op::Reshape(Shape::new(&[total])), &[P::T(index)])?;
    let picked = ctx.rec(Op::IndexSelect { axis: 0 }, &[P::T(flat), P::T(index)])?;
    ctx.rec(Op::Reshape(full), &[P::T(picked)])
}
