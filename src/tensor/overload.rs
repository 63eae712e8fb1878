//! `std::ops` overloads. They return `Result<Tensor>` (like candle) because a
//! shape or dtype mismatch is an error value, never a panic.

use super::create::literal_for;
use super::operand::Operand;
use super::{Arg, Tensor};
use crate::Result;
use lazyfuse_ir::{BinaryOp, Op, UnaryOp};
use std::ops::{Add, Div, Mul, Neg, Sub};

impl Tensor {
    /// `lhs <op> self` with a host scalar on the left.
    #[track_caller]
    fn scalar_lhs(&self, op: BinaryOp, lhs: f64) -> Result<Tensor> {
        let loc = crate::site::caller();
        let c = self.scalar_operand(op.name(), literal_for(lhs, self.dtype()), loc)?;
        Tensor::apply_args(Op::Binary(op), &[c, Arg::T(self)], loc)
    }
}

macro_rules! overload {
    ($trait:ident, $method:ident, $op:ident) => {
        impl<R: Operand> $trait<R> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl<R: Operand> $trait<R> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                rhs.scalar_lhs(BinaryOp::$op, self)
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                rhs.scalar_lhs(BinaryOp::$op, self)
            }
        }
    };
}

overload!(Add, add, Add);
overload!(Sub, sub, Sub);
overload!(Mul, mul, Mul);
overload!(Div, div, Div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::apply(Op::Unary(UnaryOp::Neg), &[self], crate::site::caller())
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::apply(Op::Unary(UnaryOp::Neg), &[&self], crate::site::caller())
    }
}
