//! Reductions over leading axes, which XLA's CPU backend runs one strided
//! column per output, unvectorised: a float sum as a product with a vector
//! of ones (its GEMV kernels read the rows in order), a max/min as a tree
//! of elementwise extrema over whole rows.

use super::emit::{i64_array, ty, Emitter};
use lazyfuse_ir::{DType, Literal, ReduceOp, Shape};

/// The fewest kept elements for which a float sum over leading axes is
/// lowered as a product with a vector of ones ([`sum_as_dot`]).
const DOT_SUM_MIN_KEPT: usize = 64;

/// `shape` viewed as `[n, kept]` rows: the first `k` dims' product and the
/// rest's.
fn split(shape: &Shape, k: usize) -> (usize, usize) {
    let dims = shape.dims();
    (dims[..k].iter().product(), dims[k..].iter().product())
}

/// [`split`] when `axes` are the leading axes of `shape` and leave at
/// least one.
fn rows_kept(shape: &Shape, axes: &[usize]) -> Option<(usize, usize)> {
    let leading = axes.iter().enumerate().all(|(i, &a)| a == i);
    (leading && axes.len() < shape.rank()).then(|| split(shape, axes.len()))
}

/// Whether a float sum over `axes` of `shape` runs as [`sum_as_dot`]:
/// the axes are the leading ones, at least two elements each are summed,
/// and enough elements are kept for the strided loop to be slow.
pub(super) fn leading_sum_as_dot(shape: &Shape, axes: &[usize]) -> bool {
    rows_kept(shape, axes).is_some_and(|(n, kept)| n >= 2 && kept >= DOT_SUM_MIN_KEPT)
}

/// A float sum over the leading axes of `x` as a `dot_general` of a vector
/// of ones with `x` viewed as `[n, kept]`. XLA's CPU backend sums over a
/// major axis one output at a time down a strided column (a bias gradient,
/// `[256, 1024]` summed over the batch, took 500 us where the same sum over
/// the minor axis took 75 us); as a matrix-vector product it runs in its
/// GEMV kernels, which read the rows in order.
pub(super) fn sum_as_dot(
    e: &mut Emitter<'_>,
    x: &str,
    shape: &Shape,
    axes: &[usize],
    acc: DType,
) -> String {
    let (n, kept) = split(shape, axes.len());
    let s2 = Shape::new(&[n, kept]);
    let v = e.reshape(x, shape, &s2, acc);
    let ones = e.constant(Literal::Float(1.0), &Shape::new(&[n]), acc);
    let attr = "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]>";
    let out = Shape::new(&[kept]);
    let y = e.op(
        "stablehlo.dot_general",
        &[(&ones, ty(&Shape::new(&[n]), acc)), (&v, ty(&s2, acc))],
        attr,
        &ty(&out, acc),
    );
    let flat = lazyfuse_ir::reduced_shape(shape, axes, false);
    e.reshape(&y, &out, &flat, acc)
}

/// The most rows a max/min over leading axes folds as a tree
/// ([`extremum_tree`]); the tree's code grows with them.
const TREE_MAX_ROWS: usize = 1024;

/// Whether a max/min over `axes` of `shape` runs as [`extremum_tree`]: the
/// axes are the leading ones, over 2 to [`TREE_MAX_ROWS`] rows, keeping
/// at least [`DOT_SUM_MIN_KEPT`] elements.
pub(super) fn leading_extremum_as_tree(op: ReduceOp, shape: &Shape, axes: &[usize]) -> bool {
    matches!(op, ReduceOp::Max | ReduceOp::Min)
        && rows_kept(shape, axes)
            .is_some_and(|(n, kept)| (2..=TREE_MAX_ROWS).contains(&n) && kept >= DOT_SUM_MIN_KEPT)
}

/// A max/min over the leading axes of `x`, viewed as `[n, kept]`, as a
/// tree of elementwise extrema of its halves (the rows padded with the
/// identity to a power of two). XLA's CPU reduce walks one strided column
/// per output, unvectorised: the max of `[1024, 1024]` over its rows took
/// 2.05 ms (jax.jit 0.15 ms). The tree is one loop over the kept elements
/// that reads whole rows, vectorised. NaN propagates as in the elementwise
/// `maximum`/`minimum` (XLA's fast min/max is off).
pub(super) fn extremum_tree(
    e: &mut Emitter<'_>,
    op: ReduceOp,
    x: &str,
    shape: &Shape,
    axes: &[usize],
    acc: DType,
) -> String {
    let (n, kept) = split(shape, axes.len());
    let body = if op == ReduceOp::Max {
        "stablehlo.maximum"
    } else {
        "stablehlo.minimum"
    };
    let s2 = Shape::new(&[n, kept]);
    let mut v = e.reshape(x, shape, &s2, acc);
    let mut rows = n.next_power_of_two();
    if rows != n {
        let init = e.constant(op.identity(acc), &Shape::scalar(), acc);
        let attrs = format!(
            "edge_padding_high = {}, edge_padding_low = {}, interior_padding = {}",
            i64_array([rows - n, 0]),
            i64_array([0, 0]),
            i64_array([0, 0])
        );
        v = e.op(
            "stablehlo.pad",
            &[(&v, ty(&s2, acc)), (&init, ty(&Shape::scalar(), acc))],
            &attrs,
            &ty(&Shape::new(&[rows, kept]), acc),
        );
    }
    while rows > 1 {
        let half = rows / 2;
        let (from, to) = (Shape::new(&[rows, kept]), Shape::new(&[half, kept]));
        let part = |e: &mut Emitter<'_>, start: usize| {
            let attr = format!(
                "start_indices = {}, limit_indices = {}, strides = {}",
                i64_array([start, 0]),
                i64_array([start + half, kept]),
                i64_array([1, 1])
            );
            e.op(
                "stablehlo.slice",
                &[(&v, ty(&from, acc))],
                &attr,
                &ty(&to, acc),
            )
        };
        let (top, bottom) = (part(e, 0), part(e, half));
        v = e.eltwise(body, &[&top, &bottom], &to, acc, acc);
        rows = half;
    }
    let flat = lazyfuse_ir::reduced_shape(shape, axes, false);
    e.reshape(&v, &Shape::new(&[1, kept]), &flat, acc)
}
