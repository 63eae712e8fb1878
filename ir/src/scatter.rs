//! The shape rule of the indexed accumulate, `index_add`: the transpose of
//! `index_select`, so gradients of lookups (embedding tables, gathers) and
//! sparse updates of large tables are one scatter, not a one-hot product
//! over every row.

use crate::{DType, Shape};

/// Why the operands do not fit (inference wraps it in its error type).
fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

/// `index_add(x, idx, src)` along `axis`: `x` numeric, `idx` 1-D integer
/// of length `k`, `src` `x`'s shape with dim `axis` replaced by `k`, of
/// `x`'s dtype. The result has `x`'s type.
pub(crate) fn infer_scatter_add(
    axis: usize,
    (xs, xd): (&Shape, DType),
    (is, id): (&Shape, DType),
    (ss, sd): (&Shape, DType),
) -> Result<(Shape, DType), String> {
    if axis >= xs.rank() {
        return err(format!(
            "axis {axis} is out of range for rank {}",
            xs.rank()
        ));
    }
    if !xd.is_numeric() || sd != xd {
        return err(format!(
            "x and src must be numeric tensors of one dtype, got {xd} and {sd}"
        ));
    }
    if !id.is_int() || is.rank() != 1 {
        return err(format!(
            "indices must be a 1-D integer tensor, got {id}{is}"
        ));
    }
    let k = is.dims()[0];
    let mut want = xs.clone();
    want.0[axis] = k;
    if *ss != want {
        return err(format!(
            "src must have x's shape with axis {axis} of the {k} indices: {want}, got {ss}"
        ));
    }
    if k > 0 && xs.dims()[axis] == 0 {
        return err(format!("cannot add into axis {axis} of size 0"));
    }
    Ok((xs.clone(), xd))
}
