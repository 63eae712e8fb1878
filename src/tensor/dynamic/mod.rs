//! Dynamic dimensions: lengths that change without recompiling.
//!
//! A dynamic axis has a static *capacity* (a bucket, part of the region
//! key, because it is the buffer's and the graph node's dimension) and a
//! *logical length*, the size the program sees. Lengths reach compiled
//! code only as [`Literal::Dim`] scalars, which are always region
//! parameters, so every length in a bucket runs the same executable.
//!
//! The graph is recorded padded: this layer sits between the typed op
//! methods and the lazy layer, and turns each op on dynamic operands into
//! ops on the padded buffers that ignore the padding exactly (masked
//! reductions, contractions and extrema, `dynamic_update_slice` for a
//! growing `cat`, `dynamic_slice` for a `narrow` at a run-time start).
//! Everything below (planner, keys, lowering, the interpreter device)
//! sees ordinary static ops. Every decision here depends on capacities and
//! static dimensions only, never on a length's value, so one structure
//! serves a whole bucket.
//!
//! Where axes become dynamic:
//! - [`Tensor::mark_dynamic`] declares one, with its maximum;
//! - automatically ([`sites`]): a recording site (source line and op)
//!   whose result size changes from one call to the next marks that axis
//!   dynamic from then on, which is what would otherwise recompile;
//! - and from operands to results, by the rules in [`ops`].

mod ops;
mod pad;
mod random;
pub(crate) mod sites;
mod slice;

pub(crate) use ops::{apply, broadcast_like, nullary};
pub(crate) use pad::{pad_host, unpad_host};

use super::Tensor;
use crate::lazy::{LazyArg, Logical, TensorInner};
use crate::{Device, Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{infer, DType, InferError, Literal, Op, Shape};
use smallvec::SmallVec;
use std::sync::Arc;

/// An operand of a padded op: a value or a host scalar.
pub(super) enum P {
    /// A recorded or materialised value (its padded buffer).
    T(Arc<TensorInner>),
    /// A host scalar (recorded as a rank-0 constant; a [`Literal::Dim`]
    /// is always a region parameter).
    S(Literal, DType),
}

impl LazyArg for P {
    fn operand(&self) -> std::result::Result<&Arc<TensorInner>, (Literal, DType)> {
        match self {
            P::T(t) => Ok(t),
            P::S(l, d) => Err((*l, *d)),
        }
    }
}

/// A value as this layer sees it: the padded tensor and its logical view.
#[derive(Clone)]
pub(super) struct V {
    /// The padded value (its `shape` is the capacity shape).
    pub t: Arc<TensorInner>,
    /// The logical shape.
    pub shape: Shape,
    /// Dynamic axes (bit per axis).
    pub mask: u32,
    /// Declared maximum per axis, 0 for none.
    pub limit: Shape,
    /// Every padding element is zero (see [`Logical::zero_padded`]); true
    /// of a value without padding. Only [`slice::cat`] and
    /// [`Tensor::mark_dynamic`] set it on a value with padding; every other
    /// op's result leaves it false.
    pub zero_pad: bool,
}

impl V {
    /// The result view from its padded value and dynamic axes.
    pub fn with_axes(t: Arc<TensorInner>, shape: &Shape, axes: &[Option<(usize, usize)>]) -> V {
        let mut mask = 0;
        let mut limit = Shape(SmallVec::from_elem(0, shape.rank()));
        for (a, ax) in axes.iter().enumerate() {
            if let Some((_, l)) = ax {
                mask |= 1 << a;
                limit.0[a] = *l;
            }
        }
        V {
            t,
            shape: shape.clone(),
            mask,
            limit,
            zero_pad: false,
        }
    }

    /// The view of a tensor (static tensors: logical = padded, no mask).
    pub fn of(t: &Tensor) -> V {
        match t.0.logical() {
            Some(l) => V {
                t: t.0.clone(),
                shape: l.shape.clone(),
                mask: l.mask,
                limit: l.limit.clone(),
                zero_pad: l.zero_padded,
            },
            None => V {
                t: t.0.clone(),
                shape: t.0.shape.clone(),
                mask: 0,
                limit: Shape(SmallVec::from_elem(0, t.0.shape.rank())),
                zero_pad: true,
            },
        }
    }

    /// True when axis `a` is dynamic.
    pub fn is_dyn(&self, a: usize) -> bool {
        self.mask & (1 << a) != 0
    }

    /// The capacity (padded size) of axis `a`.
    pub fn cap(&self, a: usize) -> usize {
        self.t.shape.dims()[a]
    }

    /// The logical length of axis `a`.
    pub fn len(&self, a: usize) -> usize {
        self.shape.dims()[a]
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.t.dtype
    }

    /// The public handle. A value whose padded shape equals its logical
    /// one and has no dynamic axis is an ordinary tensor.
    pub fn into_tensor(self) -> Tensor {
        if self.mask != 0 || self.t.shape != self.shape {
            self.t.set_logical(Logical {
                shape: self.shape,
                mask: self.mask,
                limit: self.limit,
                zero_padded: self.zero_pad,
            });
        }
        Tensor(self.t)
    }
}

/// Where and for what padded ops are recorded.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub device: &'a Device,
    pub loc: Origin,
    pub name: &'static str,
}

impl Ctx<'_> {
    /// Records `op` on padded operands (inferring the padded result type).
    /// A failure here is a bug of this layer, not of the program.
    pub fn rec(&self, op: Op, args: &[P]) -> Result<Arc<TensorInner>> {
        let scalar = Shape::scalar();
        let operands: SmallVec<[(&Shape, DType); 3]> = args
            .iter()
            .map(|a| match a {
                P::T(t) => (&t.shape, t.dtype),
                P::S(_, d) => (&scalar, *d),
            })
            .collect();
        let (shape, dtype) = infer(&op, &operands).map_err(|e| {
            Error::internal(format!(
                "dynamic shapes: padded {} for {} failed: {e}",
                op.name(),
                self.name
            ))
        })?;
        drop(operands);
        crate::lazy::record(self.device, op, args, &shape, dtype, self.loc)
    }

    /// An error naming the user's op and line.
    pub fn err(&self, detail: impl std::fmt::Display, operands: String) -> Error {
        Error::op(
            self.name,
            InferError(detail.to_string()),
            operands,
            self.loc,
        )
    }
}

/// A run-time length or offset operand (always a region parameter).
pub(super) fn dim(v: usize) -> P {
    P::S(Literal::Dim(v as i64), DType::I32)
}

/// The capacity for a length under the bucket policy.
pub(crate) fn bucket(len: usize) -> usize {
    let n = len.max(1);
    match crate::config::dynamic_buckets() {
        crate::config::Buckets::Pow2 => n.next_power_of_two(),
        crate::config::Buckets::Linear(g) => n.div_ceil(g) * g,
    }
}

/// What padding holds: zeros, or with `LAZYFUSE_POISON_PADDING=1` NaN and
/// infinities (integers: large values), chosen by `salt` (a structural
/// position, so poisoned programs still compile once).
pub(super) fn fill(dtype: DType, salt: usize) -> Literal {
    if !crate::config::poison_padding() {
        return if dtype == DType::Bool {
            Literal::Bool(false)
        } else {
            Literal::Int(0)
        };
    }
    match dtype {
        d if d.is_float() => Literal::Float([f64::NAN, f64::INFINITY, f64::NEG_INFINITY][salt % 3]),
        DType::Bool => Literal::Bool(true),
        DType::U8 => Literal::Int(0xA5),
        DType::I32 => Literal::Int([i32::MAX as i64, i32::MIN as i64, 0x5A5A_5A5A][salt % 3]),
        _ => Literal::Int([i64::MAX, i64::MIN, 0x5A5A_5A5A_5A5A][salt % 3]),
    }
}

impl Tensor {
    /// The logical view, for tensors with dynamic axes.
    pub(crate) fn logical(&self) -> Option<&Logical> {
        self.0.logical()
    }

    /// The dynamic axes and their capacities (empty for a static tensor).
    /// A capacity is the size compiled code is specialised for; the length
    /// (`dims()[axis]`) may change up to it without a recompile.
    pub fn dynamic_axes(&self) -> Vec<(usize, usize)> {
        match self.logical() {
            Some(l) => (0..l.shape.rank())
                .filter(|a| l.mask & (1 << a) != 0)
                .map(|a| (a, self.0.shape.dims()[a]))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Declares `axis` dynamic with capacity `max`: later lengths up to
    /// `max` (a `cat` that grows it, a new prompt) run the executables
    /// compiled for this one, so a decode loop compiles once. Growing it
    /// beyond `max` is an `Err` at that call, never a silent clamp.
    #[track_caller]
    pub fn mark_dynamic(&self, axis: isize, max: usize) -> Result<Tensor> {
        let ctx = Ctx {
            device: self.device(),
            loc: crate::site::caller(),
            name: "mark_dynamic",
        };
        let a = self.axis("mark_dynamic", axis, self.rank(), ctx.loc)?;
        if a >= 32 {
            return Err(ctx.err("axes beyond 31 cannot be dynamic", self.describe()));
        }
        let len = self.dims()[a];
        if len > max || max == 0 {
            return Err(ctx.err(
                format!("axis {a} has length {len}, more than the maximum {max}"),
                self.describe(),
            ));
        }
        let v = V::of(self);
        let t = pad::pad_to(&ctx, &v.t, a, max, a)?;
        let mut limit = v.limit.clone();
        limit.0[a] = max;
        Ok(V {
            t,
            shape: v.shape,
            mask: v.mask | (1 << a),
            limit,
            // Zero fill added to padding that was zero (or absent).
            zero_pad: v.zero_pad && !crate::config::poison_padding(),
        }
        .into_tensor())
    }
}

#[cfg(test)]
mod tests {
    use super::V;
    use crate::{set_poison_padding, Device, Tensor};

    fn row(d: &Device, v: f32) -> Tensor {
        Tensor::from_slice(&[v; 4], &[1, 4], d).unwrap()
    }

    /// A cache declared dynamic and grown by `cat` has zero padding (its
    /// contractions skip the mask); cut by `narrow` it holds the cut rows,
    /// and so does what grows from it; poisoned padding is never zero.
    #[test]
    fn zero_padding_is_known_only_where_it_holds() {
        let d = Device::interpreter();
        let zero = |t: &Tensor| V::of(t).zero_pad;
        let c = row(&d, 1.0).mark_dynamic(0, 16).unwrap();
        assert!(zero(&c));
        let rows = [2.0, 3.0, 4.0, 5.0].map(|v| row(&d, v));
        let grown = Tensor::cat(&[&c, &rows[0], &rows[1], &rows[2], &rows[3]], 0).unwrap();
        assert_eq!(grown.dynamic_axes(), vec![(0, 16)]);
        assert!(zero(&grown), "a cache grown into zero fill");
        // A length that changes at one site from one flush to the next
        // makes the cut dynamic.
        let cut = [3, 4, 3]
            .map(|keep| {
                let t = grown.narrow(0, 0, keep).unwrap();
                crate::sync();
                t
            })
            .into_iter()
            .last()
            .unwrap();
        assert!(!cut.dynamic_axes().is_empty());
        assert!(!zero(&cut), "a cut cache holds the cut rows");
        // Growth from it is exact here (a new site) or, padded, not zero.
        let regrown = Tensor::cat(&[&cut, &row(&d, 4.0)], 0).unwrap();
        assert!(regrown.dynamic_axes().is_empty() || !zero(&regrown));
        let two = Tensor::cat(&[&grown, &grown], 0).unwrap();
        assert!(!zero(&two), "a dynamic operand written into the buffer");
        set_poison_padding(true);
        let p = row(&d, 1.0).mark_dynamic(0, 16).unwrap();
        let pg = Tensor::cat(&[&p, &row(&d, 2.0)], 0).unwrap();
        set_poison_padding(false);
        assert!(!zero(&p) && !zero(&pg), "poisoned padding");
    }
}
