//! Gradients of custom kernels: the rule a user registers with
//! `CustomOp::with_grad` (in the public `custom` module, which sits above
//! autograd), keyed by the kernel's symbol (its text and signature), so
//! every tensor recorded with the kernel finds it.

use crate::{Error, Result, Tensor};
use lazyfuse_ir::CustomKernel;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A custom kernel's gradient: given the operands, the result and the
/// result's gradient, each operand's gradient (`None` for none).
pub type GradFn = dyn Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

fn rules() -> &'static RwLock<HashMap<String, Arc<GradFn>>> {
    static RULES: OnceLock<RwLock<HashMap<String, Arc<GradFn>>>> = OnceLock::new();
    RULES.get_or_init(Default::default)
}

/// Registers (or replaces) `kernel`'s gradient.
pub(crate) fn register(kernel: &CustomKernel, f: Arc<GradFn>) {
    rules().write().insert(kernel.symbol(), f);
}

/// The operands' gradients of a recorded custom kernel.
pub(super) fn gradient(
    kernel: &CustomKernel,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    #[cfg(feature = "xla")]
    if let Some(grads) = super::ragged::gradient(kernel, x, g) {
        return grads;
    }
    let f = rules().read().get(&kernel.symbol()).cloned();
    let Some(f) = f else {
        return Err(Error::op(
            "backward",
            format!(
                "custom kernel {} has no gradient: give it one with CustomOp::with_grad",
                kernel.name
            ),
            y.describe(),
            crate::site::caller(),
        ));
    };
    let grads = f(x, y, g)?;
    if grads.len() != x.len() {
        return Err(Error::internal(format!(
            "the gradient of custom kernel {} returned {} gradient(s) for {} operand(s)",
            kernel.name,
            grads.len(),
            x.len()
        )));
    }
    for (i, (gi, xi)) in grads.iter().zip(x).enumerate() {
        if let Some(gi) = gi {
            if gi.dims() != xi.dims() || gi.dtype() != xi.dtype() {
                return Err(Error::internal(format!(
                    "the gradient of custom kernel {} for operand {i} is {:?} {}, the operand {:?} {}",
                    kernel.name,
                    gi.dims(),
                    gi.dtype(),
                    xi.dims(),
                    xi.dtype()
                )));
            }
        }
    }
    Ok(grads)
}
