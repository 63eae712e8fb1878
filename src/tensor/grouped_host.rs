//! `ragged_dot` on the CPU plugin as host kernels: a grouped matrix
//! product in Rust (`lazyfuse_xla::kernels`: the `gemm` crate over each
//! group's rows, on the machine's cores through rayon), called by XLA as a
//! custom call in the middle of the fused region. This file records the
//! kernels; their gradients (the other forms) are autograd's built-in
//! rules (`autograd/ragged.rs`).
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
use crate::Result;
use lazyfuse_ir::{CustomKernel, DType, HostFn, KernelBody, Op, Shape};
use lazyfuse_xla::kernels::RaggedForm as Form;
use std::sync::Arc;

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
    lhs.ragged_host(Form::Product, rhs, sizes).map(Some)
}

impl Tensor {
    /// Records the ragged product `form` of `self` (the lhs), `rhs` and
    /// `sizes` as its host kernel (shapes as `form` needs them).
    #[track_caller]
    pub(crate) fn ragged_host(&self, form: Form, rhs: &Tensor, sizes: &Tensor) -> Result<Tensor> {
        record(form, self, rhs, sizes)
    }
}

/// Records `form` on the operands.
#[track_caller]
fn record(form: Form, lhs: &Tensor, rhs: &Tensor, sizes: &Tensor) -> Result<Tensor> {
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
    Tensor::apply(
        Op::Custom(kernel),
        &[lhs, rhs, sizes],
        crate::site::caller(),
    )
}

/// The kernel function of `form`, registered under its name.
fn host_fn(form: Form) -> Result<HostFn> {
    lazyfuse_xla::kernels::ragged_dot(form).map_err(crate::Error::internal)
}
