//! The two argument types that keep the op API regular: [`Operand`], the
//! right-hand side of a binary op or comparison (a tensor or a host scalar,
//! one method per op instead of a `_scalar` twin), and [`Dims`], the axes of
//! a reduction (one axis, several, or all of them; negative axes count from
//! the end, as everywhere in the API).

use super::create::literal_for;
use super::{Arg, Tensor};
use crate::{Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{normalize_axes, Axes, DType, Literal};
use smallvec::SmallVec;
use std::ops::RangeFull;

/// The right-hand operand of an elementwise binary op or comparison: a
/// tensor (`&Tensor` or `Tensor`, broadcast with NumPy's rules, same dtype)
/// or a host scalar (`f64`, `f32`, `i64`, `i32`, `bool`), converted to the
/// tensor's dtype and recorded as a region parameter, so a new value never
/// recompiles. `x.add(&y)`, `x.add(1.0)` and `x.gt(0)` are the same method.
pub trait Operand: sealed::ToArg {}

impl<T: sealed::ToArg> Operand for T {}

pub(crate) mod sealed {
    use super::*;

    /// How an operand becomes a recorded argument next to `lhs`. Sealed: the
    /// recorded forms are the core's business.
    pub trait ToArg {
        #[doc(hidden)]
        fn to_arg<'a>(
            &'a self,
            lhs: &Tensor,
            op: &'static str,
            loc: Origin,
        ) -> Result<Recorded<'a>>;
    }

    /// An operand in its recorded form (opaque outside the core).
    #[doc(hidden)]
    pub struct Recorded<'a>(pub(crate) Arg<'a>);
}

impl sealed::ToArg for &Tensor {
    #[inline(always)]
    fn to_arg<'a>(
        &'a self,
        _: &Tensor,
        _: &'static str,
        _: Origin,
    ) -> Result<sealed::Recorded<'a>> {
        Ok(sealed::Recorded(Arg::T(self)))
    }
}

impl sealed::ToArg for Tensor {
    #[inline(always)]
    fn to_arg<'a>(
        &'a self,
        _: &Tensor,
        _: &'static str,
        _: Origin,
    ) -> Result<sealed::Recorded<'a>> {
        Ok(sealed::Recorded(Arg::T(self)))
    }
}

/// Host scalars: each type's value made a literal of the tensor's dtype
/// (`$lit`: through `f64` for floats, exact for integers and `bool`).
macro_rules! scalar_operands {
    ($($t:ty => |$v:ident, $d:ident| $lit:expr),* $(,)?) => {$(
        impl sealed::ToArg for $t {
            #[inline(always)]
            fn to_arg<'a>(&'a self, lhs: &Tensor, op: &'static str, loc: Origin) -> Result<sealed::Recorded<'a>> {
                let ($v, $d) = (*self, lhs.dtype());
                lhs.scalar_operand(op, $lit, loc).map(sealed::Recorded)
            }
        }
    )*};
}

scalar_operands!(
    f64 => |v, d| literal_for(v, d),
    f32 => |v, d| literal_for(v as f64, d),
    i64 => |v, d| int_literal(v, d),
    i32 => |v, d| int_literal(v as i64, d),
    bool => |v, d| int_literal(v as i64, d),
);

/// An integer host scalar as a literal of `dtype`: exact for integer
/// dtypes (no round trip through `f64`, which loses bits past 2^53).
fn int_literal(v: i64, dtype: DType) -> Literal {
    match dtype {
        DType::Bool => Literal::Bool(v != 0),
        d if d.is_int() => Literal::Int(v),
        _ => Literal::Float(v as f64),
    }
}

impl Tensor {
    /// A host scalar operand of this tensor's dtype, validated for `op`.
    /// Inlined into each op method, with the error built out of line:
    /// returned through memory, the operand was written in parts and read
    /// back whole, a store-forwarding stall on every scalar op.
    #[inline(always)]
    pub(crate) fn scalar_operand(
        &self,
        op: &'static str,
        value: Literal,
        loc: Origin,
    ) -> Result<Arg<'static>> {
        match lazyfuse_ir::check_literal(value, self.dtype()) {
            Ok(()) => Ok(Arg::Scalar(value, self.dtype())),
            Err(e) => Err(self.scalar_error(op, e, value, loc)),
        }
    }

    /// [`Tensor::scalar_operand`]'s error: a value the dtype cannot hold.
    #[cold]
    #[inline(never)]
    fn scalar_error(
        &self,
        op: &'static str,
        e: lazyfuse_ir::InferError,
        v: Literal,
        loc: Origin,
    ) -> Error {
        Error::op(op, e, format!("{}, {}", self.describe(), v.as_f64()), loc)
    }
}

/// The axes a reduction runs over: one axis (`-1`), several (`[0, 2]`,
/// `&[0, -1]`, a `Vec`), or all of them (`..` or [`Dims::All`]). Negative
/// axes count from the end; an empty list reduces nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dims {
    /// Every axis: the result is a scalar (or all ones with `keepdim`).
    All,
    /// The listed axes, each at most once.
    These(SmallVec<[isize; 4]>),
}

impl Dims {
    /// The axes, normalised and sorted, for a tensor of `rank`.
    pub(crate) fn resolve(
        &self,
        rank: usize,
    ) -> std::result::Result<Axes, lazyfuse_ir::InferError> {
        match self {
            Dims::All => Ok((0..rank).collect()),
            Dims::These(axes) => normalize_axes(axes, rank),
        }
    }
}

impl From<RangeFull> for Dims {
    fn from(_: RangeFull) -> Dims {
        Dims::All
    }
}

impl From<isize> for Dims {
    fn from(a: isize) -> Dims {
        Dims::These(SmallVec::from_slice(&[a]))
    }
}

impl From<i32> for Dims {
    fn from(a: i32) -> Dims {
        Dims::These(SmallVec::from_slice(&[a as isize]))
    }
}

impl From<&[isize]> for Dims {
    fn from(a: &[isize]) -> Dims {
        Dims::These(SmallVec::from_slice(a))
    }
}

impl<const N: usize> From<[isize; N]> for Dims {
    fn from(a: [isize; N]) -> Dims {
        Dims::These(SmallVec::from_slice(&a))
    }
}

impl<const N: usize> From<&[isize; N]> for Dims {
    fn from(a: &[isize; N]) -> Dims {
        Dims::These(SmallVec::from_slice(a))
    }
}

impl From<Vec<isize>> for Dims {
    fn from(a: Vec<isize>) -> Dims {
        Dims::These(SmallVec::from_vec(a))
    }
}

impl From<&Vec<isize>> for Dims {
    fn from(a: &Vec<isize>) -> Dims {
        Dims::These(SmallVec::from_slice(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_accept_one_several_or_all_axes() {
        assert_eq!(Dims::from(-1).resolve(3).unwrap().as_slice(), &[2]);
        assert_eq!(Dims::from([2, 0]).resolve(3).unwrap().as_slice(), &[0, 2]);
        assert_eq!(Dims::from(&[0, -1]).resolve(2).unwrap().as_slice(), &[0, 1]);
        assert_eq!(Dims::from(..).resolve(3).unwrap().as_slice(), &[0, 1, 2]);
        assert!(Dims::from(&[] as &[isize]).resolve(2).unwrap().is_empty());
        assert!(Dims::from([0, -2]).resolve(2).is_err(), "repeated axis");
        assert!(Dims::from(3).resolve(3).is_err(), "out of range");
    }

    #[test]
    fn integer_scalars_stay_exact() {
        let big = (1i64 << 60) + 1;
        assert_eq!(int_literal(big, DType::I64), Literal::Int(big));
        assert_eq!(int_literal(2, DType::F32), Literal::Float(2.0));
        assert_eq!(int_literal(0, DType::Bool), Literal::Bool(false));
    }
}
