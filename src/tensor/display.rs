//! `Display` and `Debug`: both are sync points that show values, like eager frameworks.

use super::Tensor;
use lazyfuse_ir::{DType, HostTensor};
use std::fmt;

const MAX_SHOWN: usize = 6;

fn fmt_elem(h: &HostTensor, i: usize, vals: &[f64]) -> String {
    match h.dtype {
        DType::Bool => (vals[i] != 0.0).to_string(),
        d if d.is_int() => format!("{}", vals[i] as i64),
        _ => {
            let v = vals[i];
            if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
                format!("{v:.1}")
            } else {
                format!("{v:.5}")
            }
        }
    }
}

fn write_nested(
    f: &mut fmt::Formatter<'_>,
    h: &HostTensor,
    vals: &[f64],
    dim: usize,
    offset: usize,
) -> fmt::Result {
    let dims = h.shape.dims();
    if dim == dims.len() {
        return f.write_str(&fmt_elem(h, offset, vals));
    }
    let stride: usize = dims[dim + 1..].iter().product();
    f.write_str("[")?;
    let n = dims[dim];
    for i in 0..n {
        if n > MAX_SHOWN && i == MAX_SHOWN / 2 {
            f.write_str("..., ")?;
        }
        if n > MAX_SHOWN && (MAX_SHOWN / 2..n - MAX_SHOWN / 2).contains(&i) {
            continue;
        }
        write_nested(f, h, vals, dim + 1, offset + i * stride)?;
        if i + 1 < n {
            f.write_str(", ")?;
        }
    }
    f.write_str("]")
}

impl fmt::Display for Tensor {
    /// Flushes and prints the values, e.g. `[[1.0, 2.0], [3.0, 4.0]] f32[2, 2]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_host() {
            Ok(h) => {
                let vals = h.to_f64_vec();
                write_nested(f, &h, &vals, 0, 0)?;
                write!(f, " {}{}", h.dtype, h.shape)
            }
            Err(e) => write!(f, "<error: {e}> {}", self.describe()),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({self})")
    }
}
