//! The op methods. Each is a thin, `#[track_caller]` wrapper that builds an IR
//! [`Op`] and hands it to [`Tensor::apply`], which validates (error at the call
//! site) and records. Families are macro-generated: no copy-pasted op code.

use super::create::literal_for;
use super::{Arg, Tensor};
use crate::{Error, Result};
use lazyfuse_ir::{
    normalize_axes, normalize_axis, Axes, BinaryOp, CmpOp, DType, InferError, Op, ReduceOp, Shape,
    UnaryOp,
};
use std::panic::Location;

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    Tensor::apply(Op::Unary(UnaryOp::$op), &[self], Location::caller())
                }
            )*
        }
    };
}

unary_methods!(
    /// `-x`.
    neg => Neg,
    /// `|x|`.
    abs => Abs,
    /// `e^x` (float).
    exp => Exp,
    /// Natural logarithm (float).
    log => Log,
    /// Square root (float).
    sqrt => Sqrt,
    /// `1/sqrt(x)` (float).
    rsqrt => Rsqrt,
    /// Hyperbolic tangent (float).
    tanh => Tanh,
    /// `1/(1+e^-x)` (float).
    sigmoid => Sigmoid,
    /// `max(x, 0)`.
    relu => Relu,
    /// GELU, tanh approximation (float).
    gelu => Gelu,
    /// Sine (float).
    sin => Sin,
    /// Cosine (float).
    cos => Cos,
    /// Round toward negative infinity (float).
    floor => Floor,
    /// The Gauss error function (float); exact GELU is built on it.
    erf => Erf,
);

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                /// NumPy broadcasting; both operands must share a dtype.
                #[track_caller]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    Tensor::apply(Op::Binary(BinaryOp::$op), &[self, rhs], Location::caller())
                }

                /// Same op with a host scalar on the right (converted to this tensor's dtype).
                #[track_caller]
                pub fn $scalar(&self, rhs: f64) -> Result<Tensor> {
                    let loc = Location::caller();
                    let c = self.scalar_operand(stringify!($scalar), rhs, loc)?;
                    Tensor::apply_args(Op::Binary(BinaryOp::$op), &[Arg::T(self), c], loc)
                }
            )*
        }
    };
}

binary_methods!(
    /// Elementwise `self + rhs`.
    add, add_scalar => Add,
    /// Elementwise `self - rhs`.
    sub, sub_scalar => Sub,
    /// Elementwise `self * rhs`.
    mul, mul_scalar => Mul,
    /// Elementwise `self / rhs` (integers truncate toward zero).
    div, div_scalar => Div,
    /// Elementwise `self ^ rhs`.
    pow, pow_scalar => Pow,
    /// Elementwise NaN-propagating maximum.
    maximum, maximum_scalar => Maximum,
    /// Elementwise NaN-propagating minimum.
    minimum, minimum_scalar => Minimum,
);

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                /// Broadcasting; returns a bool tensor. NaN compares unequal to everything.
                #[track_caller]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    Tensor::apply(Op::Compare(CmpOp::$op), &[self, rhs], Location::caller())
                }

                /// Same comparison against a host scalar.
                #[track_caller]
                pub fn $scalar(&self, rhs: f64) -> Result<Tensor> {
                    let loc = Location::caller();
                    let c = self.scalar_operand(stringify!($scalar), rhs, loc)?;
                    Tensor::apply_args(Op::Compare(CmpOp::$op), &[Arg::T(self), c], loc)
                }
            )*
        }
    };
}

compare_methods!(
    /// `self == rhs`.
    eq, eq_scalar => Eq,
    /// `self != rhs`.
    ne, ne_scalar => Ne,
    /// `self < rhs`.
    lt, lt_scalar => Lt,
    /// `self <= rhs`.
    le, le_scalar => Le,
    /// `self > rhs`.
    gt, gt_scalar => Gt,
    /// `self >= rhs`.
    ge, ge_scalar => Ge,
);

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident, $all:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                /// Over `axes` (negative counts from the end; empty = no reduction).
                #[track_caller]
                pub fn $name(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
                    let loc = Location::caller();
                    let axes = self.axes(stringify!($name), axes, loc)?;
                    Tensor::apply(Op::Reduce { op: ReduceOp::$op, axes, keepdim }, &[self], loc)
                }

                /// Over every axis, to a scalar.
                #[track_caller]
                pub fn $all(&self) -> Result<Tensor> {
                    let axes: Axes = (0..self.rank()).collect();
                    Tensor::apply(Op::Reduce { op: ReduceOp::$op, axes, keepdim: false }, &[self], Location::caller())
                }
            )*
        }
    };
}

reduce_methods!(
    /// Sum.
    sum, sum_all => Sum,
    /// Arithmetic mean (float).
    mean, mean_all => Mean,
    /// Maximum (NaN-propagating).
    max, max_all => Max,
    /// Minimum (NaN-propagating).
    min, min_all => Min,
);

impl Tensor {
    /// A host scalar operand of this tensor's dtype, validated for `op`.
    /// Inlined into each `*_scalar` method, with the error built out of
    /// line: returned through memory, the operand was written in parts and
    /// read back whole, a store-forwarding stall on every scalar op.
    #[inline(always)]
    pub(crate) fn scalar_operand(
        &self,
        op: &'static str,
        v: f64,
        loc: &'static Location<'static>,
    ) -> Result<Arg<'static>> {
        let value = literal_for(v, self.dtype());
        match lazyfuse_ir::check_literal(value, self.dtype()) {
            Ok(()) => Ok(Arg::Scalar(value, self.dtype())),
            Err(e) => Err(self.scalar_error(op, e, v, loc)),
        }
    }

    /// [`Tensor::scalar_operand`]'s error: a value the dtype cannot hold.
    #[cold]
    #[inline(never)]
    fn scalar_error(
        &self,
        op: &'static str,
        e: lazyfuse_ir::InferError,
        v: f64,
        loc: &'static Location<'static>,
    ) -> Error {
        Error::op(op, e, format!("{}, {v}", self.describe()), loc)
    }

    pub(crate) fn axes(
        &self,
        op: &'static str,
        axes: &[isize],
        loc: &'static Location<'static>,
    ) -> Result<Axes> {
        normalize_axes(axes, self.rank()).map_err(|e| Error::op(op, e, self.describe(), loc))
    }

    pub(crate) fn axis(
        &self,
        op: &'static str,
        axis: isize,
        rank: usize,
        loc: &'static Location<'static>,
    ) -> Result<usize> {
        normalize_axis(axis, rank).map_err(|e| Error::op(op, e, self.describe(), loc))
    }

    /// Elementwise `cond ? on_true : on_false` with all three broadcast together;
    /// `self` is the bool condition.
    #[track_caller]
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        Tensor::apply(Op::Select, &[self, on_true, on_false], Location::caller())
    }

    /// Converts the element type (float to int truncates toward zero, saturating; NaN to 0).
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        Tensor::apply(Op::Convert(dtype), &[self], Location::caller())
    }

    /// Index (i64) of the first maximum along `axis` (NaN counts as the maximum).
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = self.axis("argmax", axis, self.rank(), loc)?;
        Tensor::apply(Op::ArgMax { axis, keepdim }, &[self], loc)
    }

    /// Same elements in a new shape (row-major).
    #[track_caller]
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        Tensor::apply(Op::Reshape(Shape::new(dims)), &[self], Location::caller())
    }

    /// Reorders dimensions: output dim `i` is input dim `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Tensor::apply(
            Op::Permute(Axes::from_slice(perm)),
            &[self],
            Location::caller(),
        )
    }

    /// Swaps two dimensions (negative counts from the end).
    #[track_caller]
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let (a, b) = (
            self.axis("transpose", d0, self.rank(), loc)?,
            self.axis("transpose", d1, self.rank(), loc)?,
        );
        let mut perm: Axes = (0..self.rank()).collect();
        perm.swap(a, b);
        Tensor::apply(Op::Permute(perm), &[self], loc)
    }

    /// NumPy-style broadcast to `dims`.
    #[track_caller]
    pub fn broadcast_to(&self, dims: &[usize]) -> Result<Tensor> {
        Tensor::apply(
            Op::BroadcastTo(Shape::new(dims)),
            &[self],
            Location::caller(),
        )
    }

    /// `len` elements from `start` along `axis`.
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = self.axis("narrow", axis, self.rank(), loc)?;
        Tensor::apply(Op::Slice { axis, start, len }, &[self], loc)
    }

    /// Concatenates `tensors` (at least one, same dtype, equal other dims) along `axis`.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let first = tensors
            .first()
            .ok_or_else(|| Error::op("cat", "needs at least one tensor", String::new(), loc))?;
        let axis = first.axis("cat", axis, first.rank(), loc)?;
        Tensor::apply(Op::Concat { axis }, tensors, loc)
    }

    /// Removes dimension `axis`, which must have size 1.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let a = self.axis("squeeze", axis, self.rank(), loc)?;
        if self.dims()[a] != 1 {
            let e = InferError(format!("dimension {a} has size {}, not 1", self.dims()[a]));
            return Err(Error::op("squeeze", e, self.describe(), loc));
        }
        let mut d = self.dims().to_vec();
        d.remove(a);
        Tensor::apply(Op::Reshape(Shape::new(&d)), &[self], loc)
    }

    /// Inserts a size-1 dimension at `axis` (in `-(rank+1)..=rank`).
    #[track_caller]
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let a = self.axis("unsqueeze", axis, self.rank() + 1, loc)?;
        let mut d = self.dims().to_vec();
        d.insert(a, 1);
        Tensor::apply(Op::Reshape(Shape::new(&d)), &[self], loc)
    }

    /// Batched matrix product `[..., m, k] x [..., k, n]`, batch dims broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        Tensor::apply(Op::MatMul, &[self, rhs], Location::caller())
    }
}
