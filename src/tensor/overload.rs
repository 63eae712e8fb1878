//! `std::ops` overloads. They return `Result<Tensor>` (like candle) because a
//! shape or dtype mismatch is an error value, never a panic.

use super::{Arg, Tensor};
use crate::Result;
use lazyfuse_ir::{BinaryOp, Op, UnaryOp};
use std::ops::{Add, Div, Mul, Neg, Sub};
use std::panic::Location;

impl Tensor {
    /// `lhs <op> self` with a host scalar on the left.
    #[track_caller]
    fn scalar_lhs(&self, op: BinaryOp, lhs: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let c = self.scalar_operand(op.name(), lhs, loc)?;
        Tensor::apply_args(Op::Binary(op), &[c, Arg::T(self)], loc)
    }
}

macro_rules! overload {
    ($trait:ident, $method:ident, $tensor_fn:ident, $scalar_fn:ident, $op:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, &rhs)
            }
        }
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$scalar_fn(&self, rhs)
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$scalar_fn(&self, rhs)
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

overload!(Add, add, add, add_scalar, Add);
overload!(Sub, sub, sub, sub_scalar, Sub);
overload!(Mul, mul, mul, mul_scalar, Mul);
overload!(Div, div, div, div_scalar, Div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::apply(Op::Unary(UnaryOp::Neg), &[self], Location::caller())
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::apply(Op::Unary(UnaryOp::Neg), &[&self], Location::caller())
    }
}
