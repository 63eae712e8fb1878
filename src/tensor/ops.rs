//! The op methods. Each is a thin, `#[track_caller]` wrapper that builds an IR
//! [`Op`] and hands it to [`Tensor::apply`], which validates (error at the call
//! site) and records. Families are macro-generated: no copy-pasted op code.

use super::operand::{Dims, Operand};
use super::{Arg, Tensor};
use crate::{Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{
    normalize_axis, Axes, BinaryOp, CmpOp, DType, InferError, Op, ReduceOp, Shape, UnaryOp,
};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    Tensor::apply(Op::Unary(UnaryOp::$op), &[self], crate::site::caller())
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
    ($($(#[$doc:meta])* $name:ident => $op:expr),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// `rhs` is a tensor (NumPy broadcasting, same dtype) or a host
                /// scalar converted to this tensor's dtype: see [`Operand`].
                #[track_caller]
                #[inline]
                pub fn $name(&self, rhs: impl Operand) -> Result<Tensor> {
                    let loc = crate::site::caller();
                    let rhs = rhs.to_arg(self, stringify!($name), loc)?.0;
                    Tensor::apply_args($op, &[Arg::T(self), rhs], loc)
                }
            )*
        }
    };
}

binary_methods!(
    /// Elementwise `self + rhs`.
    add => Op::Binary(BinaryOp::Add),
    /// Elementwise `self - rhs`.
    sub => Op::Binary(BinaryOp::Sub),
    /// Elementwise `self * rhs`.
    mul => Op::Binary(BinaryOp::Mul),
    /// Elementwise `self / rhs` (integers truncate toward zero).
    div => Op::Binary(BinaryOp::Div),
    /// Elementwise `self ^ rhs`.
    pow => Op::Binary(BinaryOp::Pow),
    /// Elementwise NaN-propagating maximum.
    maximum => Op::Binary(BinaryOp::Maximum),
    /// Elementwise NaN-propagating minimum.
    minimum => Op::Binary(BinaryOp::Minimum),
    /// `self == rhs`, a bool tensor (NaN compares unequal to everything).
    eq => Op::Compare(CmpOp::Eq),
    /// `self != rhs`, a bool tensor.
    ne => Op::Compare(CmpOp::Ne),
    /// `self < rhs`, a bool tensor.
    lt => Op::Compare(CmpOp::Lt),
    /// `self <= rhs`, a bool tensor.
    le => Op::Compare(CmpOp::Le),
    /// `self > rhs`, a bool tensor.
    gt => Op::Compare(CmpOp::Gt),
    /// `self >= rhs`, a bool tensor.
    ge => Op::Compare(CmpOp::Ge),
);

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// Over `dims`: one axis (`-1`), several (`[0, 2]`) or all
                /// (`..`); negative axes count from the end, an empty list
                /// reduces nothing. `keepdim` keeps reduced axes as size 1.
                #[track_caller]
                pub fn $name(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
                    let loc = crate::site::caller();
                    let axes = dims
                        .into()
                        .resolve(self.rank())
                        .map_err(|e| Error::op(stringify!($name), e, self.describe(), loc))?;
                    Tensor::apply(Op::Reduce { op: ReduceOp::$op, axes, keepdim }, &[self], loc)
                }
            )*
        }
    };
}

reduce_methods!(
    /// Sum.
    sum => Sum,
    /// Arithmetic mean (float).
    mean => Mean,
    /// Maximum (NaN-propagating).
    max => Max,
    /// Minimum (NaN-propagating).
    min => Min,
);

impl Tensor {
    pub(crate) fn axis(
        &self,
        op: &'static str,
        axis: isize,
        rank: usize,
        loc: Origin,
    ) -> Result<usize> {
        normalize_axis(axis, rank).map_err(|e| Error::op(op, e, self.describe(), loc))
    }

    /// Elementwise `cond ? on_true : on_false` with all three broadcast together;
    /// `self` is the bool condition.
    #[track_caller]
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        Tensor::apply(
            Op::Select,
            &[self, on_true, on_false],
            crate::site::caller(),
        )
    }

    /// Converts the element type (float to int truncates toward zero, saturating; NaN to 0).
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        Tensor::apply(Op::Convert(dtype), &[self], crate::site::caller())
    }

    /// Index (i64) of the first maximum along `axis` (NaN counts as the maximum).
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("argmax", axis, self.rank(), loc)?;
        Tensor::apply(Op::ArgMax { axis, keepdim }, &[self], loc)
    }

    /// Same elements in a new shape (row-major).
    #[track_caller]
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        Tensor::apply(
            Op::Reshape(Shape::new(dims)),
            &[self],
            crate::site::caller(),
        )
    }

    /// Reorders dimensions: output dim `i` is input dim `perm[i]` (negative
    /// counts from the end).
    #[track_caller]
    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        let loc = crate::site::caller();
        let perm = perm
            .iter()
            .map(|&a| self.axis("permute", a, self.rank(), loc))
            .collect::<Result<Axes>>()?;
        Tensor::apply(Op::Permute(perm), &[self], loc)
    }

    /// [`Tensor::permute`] with axes already normalised (the core's own
    /// layout code, which computes permutations as `usize`).
    #[track_caller]
    pub(crate) fn permute_axes(&self, perm: &[usize]) -> Result<Tensor> {
        Tensor::apply(
            Op::Permute(Axes::from_slice(perm)),
            &[self],
            crate::site::caller(),
        )
    }

    /// Swaps two dimensions (negative counts from the end).
    #[track_caller]
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let loc = crate::site::caller();
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
            crate::site::caller(),
        )
    }

    /// `len` elements from `start` along `axis`.
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("narrow", axis, self.rank(), loc)?;
        Tensor::apply(Op::Slice { axis, start, len }, &[self], loc)
    }

    /// Concatenates `tensors` (at least one, same dtype, equal other dims) along `axis`.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let loc = crate::site::caller();
        let first = tensors
            .first()
            .ok_or_else(|| Error::op("cat", "needs at least one tensor", String::new(), loc))?;
        let axis = first.axis("cat", axis, first.rank(), loc)?;
        Tensor::apply(Op::Concat { axis }, tensors, loc)
    }

    /// Removes dimension `axis`, which must have size 1.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let loc = crate::site::caller();
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
        let loc = crate::site::caller();
        let a = self.axis("unsqueeze", axis, self.rank() + 1, loc)?;
        let mut d = self.dims().to_vec();
        d.insert(a, 1);
        Tensor::apply(Op::Reshape(Shape::new(&d)), &[self], loc)
    }

    /// Batched matrix product `[..., m, k] x [..., k, n]`, batch dims broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        Tensor::apply(Op::MatMul, &[self, rhs], crate::site::caller())
    }
}
