//! Gradients of the ragged-product host kernels (`tensor/grouped_host.rs`,
//! `lazyfuse_xla::kernels::RaggedForm`): each form's gradients are the
//! other forms, so training a mixture-of-experts layer on the CPU plugin
//! runs host kernels both ways. Built in, keyed by the kernel's name, so
//! recording a product registers nothing.

use crate::{Result, Tensor};
use lazyfuse_ir::CustomKernel;
use lazyfuse_xla::kernels::RaggedForm as Form;

/// The operands' gradients when `kernel` is a ragged-product form (`None`
/// for any other kernel). The group sizes get none.
pub(super) fn gradient(
    kernel: &CustomKernel,
    x: &[Tensor],
    dy: &Tensor,
) -> Option<Result<Vec<Option<Tensor>>>> {
    kernel.host()?;
    let form = Form::ALL.into_iter().find(|f| f.name() == kernel.name)?;
    let (lhs, rhs, sizes) = (&x[0], &x[1], &x[2]);
    let grads = || -> Result<Vec<Option<Tensor>>> {
        let (dl, dr) = match form {
            // y = lhs @ rhs[g]: dlhs = dy @ rhs[g]ᵀ, drhs[g] = lhsᵀ dy.
            Form::Product => (
                dy.ragged_host(Form::Transposed, rhs, sizes)?,
                lhs.ragged_host(Form::RhsGrad, dy, sizes)?,
            ),
            // y = lhs @ rhs[g]ᵀ: dlhs = dy @ rhs[g], drhs[g] = dyᵀ lhs.
            Form::Transposed => (
                dy.ragged_host(Form::Product, rhs, sizes)?,
                dy.ragged_host(Form::RhsGrad, lhs, sizes)?,
            ),
            // y[g] = lhsᵀ rhs: dlhs = rhs @ dy[g]ᵀ, drhs = lhs @ dy[g].
            Form::RhsGrad => (
                rhs.ragged_host(Form::Transposed, dy, sizes)?,
                lhs.ragged_host(Form::Product, dy, sizes)?,
            ),
        };
        Ok(vec![Some(dl), Some(dr), None])
    };
    Some(grads())
}
