//! Helpers shared by the reference interpreter tests.
#![allow(dead_code)]

use lazyfuse_ir::interp::eval_op;
use lazyfuse_ir::{Axes, Element, HostTensor, Op, Shape};

pub const NAN: f64 = f64::NAN;

pub fn t<T: Element>(data: &[T], dims: &[usize]) -> HostTensor {
    HostTensor::from_slice(data, Shape::new(dims))
}

pub fn ev(op: Op, inputs: &[&HostTensor]) -> HostTensor {
    eval_op(&op, inputs).unwrap_or_else(|e| panic!("{}: {e}", op.name()))
}

pub fn axes(a: &[usize]) -> Axes {
    Axes::from_slice(a)
}

/// Asserts shape and values, treating NaN as equal to NaN and -0.0 as distinct from 0.0.
pub fn assert_f64(t: &HostTensor, dims: &[usize], want: &[f64]) {
    assert_eq!(t.shape.dims(), dims, "shape");
    let got = t.to_f64_vec();
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "element {i}: got {g:?}, want {w:?} (all: {got:?})");
    }
}

pub fn assert_vals<T: Element + PartialEq>(t: &HostTensor, dims: &[usize], want: &[T]) {
    assert_eq!(t.shape.dims(), dims, "shape");
    assert_eq!(t.to_vec::<T>().expect("dtype"), want);
}
