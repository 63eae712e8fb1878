//! `ragged_dot`'s grouped products (`jax.lax.ragged_dot`): rows in
//! groups, each group's rows times its own matrix, on each group's rows in
//! place (the `gemm` crate). Three forms, so the product's gradients are
//! host kernels too: the product (`lhs [m, k]`, `rhs [g, k, n]`), the
//! product with each matrix transposed (`dy [m, n]` times `rhs[g]ᵀ`, the
//! lhs gradient) and the rhs gradient (`lhs[rows of g]ᵀ dy[rows of g]`,
//! `[g, k, n]`). Group sizes follow jax: negative sizes count as 0, rows
//! past their sum are 0, and sizes whose sum passes `m` are cut at `m`.

use super::Float;
use lazyfuse_ir::{DType, HostArg, HostOut};

/// Which grouped product a kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaggedForm {
    /// `out[rows of g] = lhs[rows of g] @ rhs[g]`.
    Product,
    /// `out[rows of g] = lhs[rows of g] @ rhs[g]ᵀ`.
    Transposed,
    /// `out[g] = lhs[rows of g]ᵀ @ rhs[rows of g]`.
    RhsGrad,
}

impl RaggedForm {
    /// The kernel's registered name.
    pub fn name(self) -> &'static str {
        match self {
            RaggedForm::Product => "lazyfuse.ragged_dot",
            RaggedForm::Transposed => "lazyfuse.ragged_dot_nt",
            RaggedForm::RhsGrad => "lazyfuse.ragged_dot_rhs_grad",
        }
    }

    /// Every form.
    pub const ALL: [RaggedForm; 3] = [
        RaggedForm::Product,
        RaggedForm::Transposed,
        RaggedForm::RhsGrad,
    ];
}

/// Each group's first row and row count, cut at `rows` (jax's rules).
fn groups(sizes: &HostArg<'_>, rows: usize) -> std::result::Result<Vec<(usize, usize)>, String> {
    let raw: Vec<i64> = if let Some(s) = sizes.as_slice::<i64>() {
        s.to_vec()
    } else if let Some(s) = sizes.as_slice::<i32>() {
        s.iter().map(|&v| v as i64).collect()
    } else {
        return Err(format!(
            "group sizes must be i32 or i64, got {}",
            sizes.dtype
        ));
    };
    let mut start = 0usize;
    Ok(raw
        .iter()
        .map(|&s| {
            let len = (s.max(0) as usize).min(rows - start);
            let g = (start, len);
            start += len;
            g
        })
        .collect())
}

/// Runs `form` on the call's buffers, by dtype.
pub(super) fn run(
    form: RaggedForm,
    a: &[HostArg<'_>],
    out: &mut HostOut<'_>,
) -> std::result::Result<(), String> {
    match out.dtype {
        DType::F32 => typed::<f32>(form, a, out),
        DType::F64 => typed::<f64>(form, a, out),
        d => Err(format!("{d} is not supported")),
    }
}

/// Checks the operand and result shapes of `form` (the kernels index
/// with them), returning `(rows, inner, cols)` of one group's product.
fn check(
    form: RaggedForm,
    ld: &[usize],
    rd: &[usize],
    od: &[usize],
    groups: usize,
) -> std::result::Result<(), String> {
    let ok = ld.len() == 2
        && match form {
            RaggedForm::Product => rd.len() == 3 && rd[1] == ld[1] && od == [ld[0], rd[2]],
            RaggedForm::Transposed => rd.len() == 3 && rd[2] == ld[1] && od == [ld[0], rd[1]],
            RaggedForm::RhsGrad => rd.len() == 2 && rd[0] == ld[0] && od == [groups, ld[1], rd[1]],
        }
        && (form == RaggedForm::RhsGrad || rd[0] == groups);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "operands {ld:?}, {rd:?} and result {od:?} do not fit {}",
            form.name()
        ))
    }
}

fn typed<T: Float>(
    form: RaggedForm,
    a: &[HostArg<'_>],
    out: &mut HostOut<'_>,
) -> std::result::Result<(), String> {
    let [lhs, rhs, sizes] = a else {
        return Err(format!("3 operands expected, got {}", a.len()));
    };
    let bad = || "operand dtypes differ from the result's".to_string();
    let (l, r) = (
        lhs.as_slice::<T>().ok_or_else(bad)?,
        rhs.as_slice::<T>().ok_or_else(bad)?,
    );
    let (ld, rd) = (lhs.dims, rhs.dims);
    check(form, ld, rd, out.dims, sizes.numel())?;
    let parts = groups(sizes, ld[0])?;
    let o = out.as_mut_slice::<T>().ok_or_else(bad)?;
    // What no group writes is zero: rows past the sizes' sum, or the
    // matrices of empty groups.
    match form {
        RaggedForm::Product | RaggedForm::Transposed => {
            let used: usize = parts.iter().map(|p| p.1).sum();
            let cols = out_cols(form, rd);
            o[used * cols..].iter_mut().for_each(|v| *v = T::ZERO);
        }
        RaggedForm::RhsGrad => {
            let each = ld[1] * rd[1];
            for (g, p) in parts.iter().enumerate() {
                if p.1 == 0 {
                    o[g * each..(g + 1) * each]
                        .iter_mut()
                        .for_each(|v| *v = T::ZERO);
                }
            }
        }
    }
    for (g, &(start, len)) in parts.iter().enumerate() {
        if len == 0 {
            continue;
        }
        // Each form as one product `[m, k] x [k, n]`: the output's offset
        // and row length, and each operand's offset and (column, row)
        // strides.
        let (m, k, n, out, lhs, rhs) = match form {
            RaggedForm::Product => {
                let (k, n) = (ld[1], rd[2]);
                (
                    len,
                    k,
                    n,
                    (start * n, n),
                    (start * k, 1, k),
                    (g * k * n, 1, n),
                )
            }
            RaggedForm::Transposed => {
                // rhs[g] is [q, p], read transposed; out rows are [q] long.
                let (p, q) = (ld[1], rd[1]);
                (
                    len,
                    p,
                    q,
                    (start * q, q),
                    (start * p, 1, p),
                    (g * q * p, p, 1),
                )
            }
            RaggedForm::RhsGrad => {
                // out[g] [k, n] = lhs[rows]ᵀ [k, len] @ rhs[rows] [len, n].
                let (k, n) = (ld[1], rd[1]);
                (
                    k,
                    len,
                    n,
                    (g * k * n, n),
                    (start * k, k, 1),
                    (start * n, 1, n),
                )
            }
        };
        // SAFETY: `check` proved the shapes, and `groups` keeps every
        // group's rows inside `[0, m)`: each pointer with its strides
        // addresses elements inside its slice; `o` is written only here.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                o[out.0..].as_mut_ptr(),
                1,
                out.1 as isize,
                false,
                l[lhs.0..].as_ptr(),
                lhs.1 as isize,
                lhs.2 as isize,
                r[rhs.0..].as_ptr(),
                rhs.1 as isize,
                rhs.2 as isize,
                T::ZERO,
                T::ONE,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            )
        }
    }
    Ok(())
}

/// The length of an output row of the row-wise forms.
fn out_cols(form: RaggedForm, rd: &[usize]) -> usize {
    match form {
        RaggedForm::Product => rd[2],
        _ => rd[1],
    }
}
