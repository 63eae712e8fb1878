//! `ragged_dot` on the CPU plugin as host kernels: a grouped matrix
//! product in Rust (the `gemm` crate over each group's rows, on the
//! machine's cores through rayon), called by XLA as a custom call in the
//! middle of the fused region.
//!
//! Why: XLA's CPU backend has no fast grouped product. Its own
//! `ragged_dot` is a slow path, and the static-shape composition
//! (`grouped.rs`: tiles of rows, each with its group's matrix gathered,
//! one batched product) copies a whole expert matrix per tile, which
//! costs more than the product. A host kernel reads each group's rows and
//! matrix in place and does exactly the real work.
//!
//! Three kernels, each with a gradient: the product (`lhs [m, k]`, `rhs
//! [g, k, n]`), the product with each matrix transposed (the lhs gradient:
//! `dy [m, n]` times `rhs[g]ᵀ`), and the rhs gradient (`lhs[rows of g]ᵀ
//! dy[rows of g]`, `[g, k, n]`). Group sizes follow `jax.lax.ragged_dot`:
//! negative sizes count as 0, rows past their sum are 0, and sizes whose
//! sum passes `m` are cut at `m`. f32 and f64; other dtypes (and other
//! devices, meshes, `LAZYFUSE_HOST_KERNELS=0`) use the composition.

use super::Tensor;
use crate::autograd::custom::{register, GradFn};
use crate::Result;
use lazyfuse_ir::{host_kernels, CustomKernel, DType, HostArg, HostFn, HostOut, KernelBody, Op};
use lazyfuse_ir::{HostElement, Shape};
use std::sync::{Arc, OnceLock};

/// Which product a kernel computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `out[rows of g] = lhs[rows of g] @ rhs[g]`.
    Product,
    /// `out[rows of g] = lhs[rows of g] @ rhs[g]ᵀ`.
    Transposed,
    /// `out[g] = lhs[rows of g]ᵀ @ rhs[rows of g]`.
    RhsGrad,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Product => "lazyfuse.ragged_dot",
            Form::Transposed => "lazyfuse.ragged_dot_nt",
            Form::RhsGrad => "lazyfuse.ragged_dot_rhs_grad",
        }
    }
}

/// The host-kernel `ragged_dot`, or `None` where it does not apply (the
/// caller then composes it). The operands are already checked.
pub(super) fn ragged_dot(lhs: &Tensor, rhs: &Tensor, sizes: &Tensor) -> Result<Option<Tensor>> {
    // Not for values on a mesh (XLA's partitioner cannot split a host
    // call) or with dynamic axes (the kernel's signature is static).
    let plain = |t: &Tensor| t.0.mesh().is_none() && t.0.logical().is_none();
    if !matches!(lhs.dtype(), DType::F32 | DType::F64)
        || ![lhs, rhs, sizes].iter().all(|t| plain(t))
        || !lhs.device().runs_host_kernels()
    {
        return Ok(None);
    }
    apply(Form::Product, lhs, rhs, sizes).map(Some)
}

/// Records `form` on the operands.
#[track_caller]
fn apply(form: Form, lhs: &Tensor, rhs: &Tensor, sizes: &Tensor) -> Result<Tensor> {
    let (m, g) = (lhs.dims()[0], sizes.dims()[0]);
    let result = match form {
        Form::Product => vec![m, rhs.dims()[2]],
        Form::Transposed => vec![m, rhs.dims()[1]],
        Form::RhsGrad => vec![g, lhs.dims()[1], rhs.dims()[1]],
    };
    let sig = |t: &Tensor| (Shape::new(t.dims()), t.dtype());
    let kernel = Arc::new(CustomKernel {
        name: form.name().to_string(),
        body: KernelBody::Host(host_fn(form)?),
        params: vec![sig(lhs), sig(rhs), sig(sizes)],
        result: (Shape::new(&result), lhs.dtype()),
    });
    register(&kernel, gradient(form));
    Tensor::apply(
        Op::Custom(kernel),
        &[lhs, rhs, sizes],
        crate::site::caller(),
    )
}

/// The kernel function of `form`, registered once under its name.
fn host_fn(form: Form) -> Result<HostFn> {
    static FNS: OnceLock<std::result::Result<[HostFn; 3], String>> = OnceLock::new();
    let fns = FNS.get_or_init(|| {
        let fns = [
            HostFn::new(|a: &[HostArg<'_>], o: &mut HostOut<'_>| run(Form::Product, a, o)),
            HostFn::new(|a: &[HostArg<'_>], o: &mut HostOut<'_>| run(Form::Transposed, a, o)),
            HostFn::new(|a: &[HostArg<'_>], o: &mut HostOut<'_>| run(Form::RhsGrad, a, o)),
        ];
        for (f, form) in fns
            .iter()
            .zip([Form::Product, Form::Transposed, Form::RhsGrad])
        {
            host_kernels::register(form.name(), f)?;
        }
        Ok(fns)
    });
    let fns = fns
        .as_ref()
        .map_err(|e| crate::Error::internal(e.clone()))?;
    Ok(fns[form as usize].clone())
}

/// The gradient rule of `form`'s kernel (sizes get none).
fn gradient(form: Form) -> Arc<GradFn> {
    Arc::new(move |x: &[Tensor], _y: &Tensor, dy: &Tensor| {
        let (lhs, rhs, sizes) = (&x[0], &x[1], &x[2]);
        let (dl, dr) = match form {
            // y = lhs @ rhs[g]: dlhs = dy @ rhs[g]ᵀ, drhs[g] = lhsᵀ dy.
            Form::Product => (
                apply(Form::Transposed, dy, rhs, sizes)?,
                apply(Form::RhsGrad, lhs, dy, sizes)?,
            ),
            // y = lhs @ rhs[g]ᵀ: dlhs = dy @ rhs[g], drhs[g] = dyᵀ lhs.
            Form::Transposed => (
                apply(Form::Product, dy, rhs, sizes)?,
                apply(Form::RhsGrad, dy, lhs, sizes)?,
            ),
            // y[g] = lhsᵀ rhs: dlhs = rhs @ dy[g]ᵀ, drhs = lhs @ dy[g].
            Form::RhsGrad => (
                apply(Form::Transposed, rhs, dy, sizes)?,
                apply(Form::Product, lhs, dy, sizes)?,
            ),
        };
        Ok(vec![Some(dl), Some(dr), None])
    })
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
fn run(form: Form, a: &[HostArg<'_>], out: &mut HostOut<'_>) -> std::result::Result<(), String> {
    match out.dtype {
        DType::F32 => typed::<f32>(form, a, out),
        DType::F64 => typed::<f64>(form, a, out),
        d => Err(format!("{d} is not supported")),
    }
}

/// The float types the kernels run on.
trait Float: HostElement {
    const ZERO: Self;
    const ONE: Self;
}

impl Float for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}

impl Float for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// Checks the operand and result shapes of `form` (the kernels index
/// with them), returning `(rows, inner, cols)` of one group's product.
fn check(
    form: Form,
    ld: &[usize],
    rd: &[usize],
    od: &[usize],
    groups: usize,
) -> std::result::Result<(), String> {
    let ok = ld.len() == 2
        && match form {
            Form::Product => rd.len() == 3 && rd[1] == ld[1] && od == [ld[0], rd[2]],
            Form::Transposed => rd.len() == 3 && rd[2] == ld[1] && od == [ld[0], rd[1]],
            Form::RhsGrad => rd.len() == 2 && rd[0] == ld[0] && od == [groups, ld[1], rd[1]],
        }
        && (form == Form::RhsGrad || rd[0] == groups);
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
    form: Form,
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
        Form::Product | Form::Transposed => {
            let used: usize = parts.iter().map(|p| p.1).sum();
            let cols = out_cols(form, rd);
            o[used * cols..].iter_mut().for_each(|v| *v = T::ZERO);
        }
        Form::RhsGrad => {
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
    let par = gemm::Parallelism::Rayon(0);
    for (g, &(start, len)) in parts.iter().enumerate() {
        if len == 0 {
            continue;
        }
        // SAFETY: `check` proved the shapes, and `groups` keeps every
        // group's rows inside `[0, m)`: each pointer with its strides
        // addresses elements inside its slice; `o` is written only here.
        unsafe {
            match form {
                Form::Product => {
                    let (k, n) = (ld[1], rd[2]);
                    gemm::gemm(
                        len,
                        n,
                        k,
                        o[start * n..].as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        l[start * k..].as_ptr(),
                        1,
                        k as isize,
                        r[g * k * n..].as_ptr(),
                        1,
                        n as isize,
                        T::ZERO,
                        T::ONE,
                        false,
                        false,
                        false,
                        par,
                    )
                }
                Form::Transposed => {
                    // rhs[g] is [q, p]; out rows are [q] long.
                    let (p, q) = (ld[1], rd[1]);
                    gemm::gemm(
                        len,
                        q,
                        p,
                        o[start * q..].as_mut_ptr(),
                        1,
                        q as isize,
                        false,
                        l[start * p..].as_ptr(),
                        1,
                        p as isize,
                        r[g * q * p..].as_ptr(),
                        p as isize,
                        1,
                        T::ZERO,
                        T::ONE,
                        false,
                        false,
                        false,
                        par,
                    )
                }
                Form::RhsGrad => {
                    // out[g] [k, n] = lhs[rows]ᵀ [k, len] @ rhs[rows] [len, n].
                    let (k, n) = (ld[1], rd[1]);
                    gemm::gemm(
                        k,
                        n,
                        len,
                        o[g * k * n..].as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        l[start * k..].as_ptr(),
                        k as isize,
                        1,
                        r[start * n..].as_ptr(),
                        1,
                        n as isize,
                        T::ZERO,
                        T::ONE,
                        false,
                        false,
                        false,
                        par,
                    )
                }
            }
        }
    }
    Ok(())
}

/// The length of an output row of the row-wise forms.
fn out_cols(form: Form, rd: &[usize]) -> usize {
    match form {
        Form::Product => rd[2],
        _ => rd[1],
    }
}
