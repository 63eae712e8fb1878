//! Reductions, argmax and the matrix product. Floats accumulate in f64 in
//! row-major element order and round once; integers accumulate in wrapping i64.

use super::elementwise::{fmax, fmin, Values};
use super::layout::StridedIndex;
use crate::{reduced_shape, DType, HostTensor, ReduceOp, Shape};

/// For each element of a row-major tensor of `shape`, in order, the flat index
/// of the output element it reduces into when `axes` are reduced.
fn reduce_targets(shape: &Shape, axes: &[usize]) -> StridedIndex {
    let mut strides = reduced_shape(shape, axes, true).strides();
    for &a in axes {
        strides[a] = 0;
    }
    StridedIndex::new(shape.dims(), &strides, 0)
}

/// Folds `vals` (a tensor of `shape`) over `axes` into `n_out` accumulators
/// starting at `init`; with `init = None` each accumulator starts at its first element.
fn fold<T: Copy>(
    vals: &[T],
    shape: &Shape,
    axes: &[usize],
    n_out: usize,
    init: Option<T>,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut acc = vec![init; n_out];
    for (&v, o) in vals.iter().zip(reduce_targets(shape, axes)) {
        acc[o] = Some(match acc[o] {
            Some(a) => f(a, v),
            None => v,
        });
    }
    acc.into_iter()
        .map(|a| a.expect("infer rejects max/min over zero-size axes"))
        .collect()
}

/// `op` over `axes` (sorted, unique) of `x`, producing `shape`. Sum of nothing
/// is 0, mean divides by the number of reduced elements (0 → NaN), max/min
/// propagate NaN. No axes is the identity.
pub(crate) fn reduce(op: ReduceOp, x: &HostTensor, axes: &[usize], shape: Shape) -> HostTensor {
    if axes.is_empty() {
        return HostTensor { shape, ..x.clone() };
    }
    let n = shape.numel();
    let s = &x.shape;
    let out = match Values::of(x) {
        Values::F(v) => Values::F(match op {
            ReduceOp::Sum => fold(&v, s, axes, n, Some(0.0), |a, b| a + b),
            ReduceOp::Mean => {
                let count: usize = axes.iter().map(|&a| s.dims()[a]).product();
                let sums = fold(&v, s, axes, n, Some(0.0), |a, b| a + b);
                sums.into_iter().map(|t| t / count as f64).collect()
            }
            ReduceOp::Max => fold(&v, s, axes, n, None, fmax),
            ReduceOp::Min => fold(&v, s, axes, n, None, fmin),
        }),
        Values::I(v) => Values::I(match op {
            ReduceOp::Sum => fold(&v, s, axes, n, Some(0), i64::wrapping_add),
            ReduceOp::Max => fold(&v, s, axes, n, None, i64::max),
            ReduceOp::Min => fold(&v, s, axes, n, None, i64::min),
            ReduceOp::Mean => unreachable!("infer rejects integer mean"),
        }),
    };
    out.encode(shape, x.dtype)
}

/// Index of the first element along the middle axis of `v` viewed as
/// `[outer, len, inner]` that no later element `beats`, in output row-major order.
fn first_max<T: Copy>(
    v: &[T],
    (outer, len, inner): (usize, usize, usize),
    beats: impl Fn(T, T) -> bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| v[(o * len + j) * inner + i];
            let mut best = 0;
            for j in 1..len {
                if beats(at(j), at(best)) {
                    best = j;
                }
            }
            out.push(best as i64);
        }
    }
    out
}

/// i64 index of the first maximum along `axis`; the first NaN beats everything.
pub(crate) fn argmax(x: &HostTensor, axis: usize, shape: Shape) -> HostTensor {
    let dims = x.shape.dims();
    let view = (
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    );
    let idx = match Values::of(x) {
        Values::F(v) => first_max(&v, view, |a, best| {
            !best.is_nan() && (a.is_nan() || a > best)
        }),
        Values::I(v) => first_max(&v, view, |a, best| a > best),
    };
    HostTensor::from_i64(&idx, shape, DType::I64)
}

/// Row-major `[batch, m, n]` products of `[m, k]` blocks of `a` and `[k, n]`
/// blocks of `b` starting at the paired base offsets; `acc(sum, x, y)` adds `x * y`.
fn contract<T: Copy>(
    (a, a_base): (&[T], &[usize]),
    (b, b_base): (&[T], &[usize]),
    (m, k, n): (usize, usize, usize),
    zero: T,
    acc: impl Fn(T, T, T) -> T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(a_base.len() * m * n);
    for (&ab, &bb) in a_base.iter().zip(b_base) {
        for i in 0..m {
            for j in 0..n {
                let mut sum = zero;
                for p in 0..k {
                    sum = acc(sum, a[ab + i * k + p], b[bb + p * n + j]);
                }
                out.push(sum);
            }
        }
    }
    out
}

/// `[..., m, k] x [..., k, n]` with NumPy-broadcast batch dims, producing `shape`.
pub(crate) fn matmul(a: &HostTensor, b: &HostTensor, shape: Shape) -> HostTensor {
    let r = shape.rank();
    let (m, n) = (shape.dims()[r - 2], shape.dims()[r - 1]);
    let k = a.shape.dims()[a.shape.rank() - 1];
    let batch = Shape::new(&shape.dims()[..r - 2]);
    // Offset of the matrix each output batch element reads from an operand.
    let bases = |s: &Shape, block: usize| -> Vec<usize> {
        let own = Shape::new(&s.dims()[..s.rank() - 2]);
        StridedIndex::broadcast(&own, &batch)
            .map(|i| i * block)
            .collect()
    };
    let (a_base, b_base) = (bases(&a.shape, m * k), bases(&b.shape, k * n));
    let out = match (Values::of(a), Values::of(b)) {
        (Values::F(x), Values::F(y)) => Values::F(contract(
            (&x, &a_base),
            (&y, &b_base),
            (m, k, n),
            0.0,
            |s, p, q| s + p * q,
        )),
        (Values::I(x), Values::I(y)) => Values::I(contract(
            (&x, &a_base),
            (&y, &b_base),
            (m, k, n),
            0,
            |s, p, q| s.wrapping_add(p.wrapping_mul(q)),
        )),
        _ => unreachable!("infer checks that operand dtypes match"),
    };
    out.encode(shape, a.dtype)
}
