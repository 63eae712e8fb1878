//! Vector-Jacobian products of a function, without touching the caller's
//! tensors: what a front end needs to lower an op's explicit backward
//! (`torch.ops.aten.convolution_backward` in an AOT-autograd graph) through
//! the runtime's own gradient rules instead of a second copy of them.

use super::NO_GRAD_DEPTH;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Turns tracking back on for a scope, whatever `no_grad` the caller is in.
struct Tracking(u32);

impl Tracking {
    fn on() -> Tracking {
        Tracking(NO_GRAD_DEPTH.with(|d| d.replace(0)))
    }
}

impl Drop for Tracking {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(self.0));
    }
}

/// The gradients of `<f(inputs), cotangent>` with respect to each input:
/// `jax.vjp`, or `torch.autograd.grad(f(inputs), inputs, cotangent)`.
///
/// `f` runs on fresh leaves holding the inputs' values, so the inputs'
/// own gradients and graphs are untouched, and tracking is on even inside
/// [`crate::no_grad`]. An input `f` does not use gets zeros. The forward and
/// backward ops are recorded like any others (pending, fused at the next
/// read). The cotangent must have the result's shape and dtype.
#[track_caller]
pub fn vjp(
    inputs: &[&Tensor],
    cotangent: &Tensor,
    f: impl FnOnce(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<Tensor>> {
    let loc = crate::site::caller();
    let _on = Tracking::on();
    let leaves = inputs
        .iter()
        .map(|t| {
            let l = t.detach()?;
            l.set_requires_grad(true)?;
            Ok(l)
        })
        .collect::<Result<Vec<_>>>()?;
    let y = f(&leaves)?;
    if y.shape() != cotangent.shape() || y.dtype() != cotangent.dtype() {
        return Err(Error::op(
            "vjp",
            "the cotangent must have the function result's shape and dtype",
            format!("{}, {}", y.describe(), cotangent.describe()),
            loc,
        ));
    }
    if y.requires_grad() {
        y.mul(&cotangent.detach()?)?.sum(.., false)?.backward()?;
    }
    leaves
        .iter()
        .map(|l| match l.grad() {
            Some(g) => Ok(g),
            None => Tensor::zeros(l.dims(), l.dtype(), l.device()),
        })
        .collect()
}
