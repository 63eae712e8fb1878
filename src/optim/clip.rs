//! Gradient clipping by global norm, recorded lazily: the norm and the
//! scaled gradients stay pending and fuse into the optimizer step's graph,
//! so clipping costs no sync and no host round trip (PyTorch's
//! `clip_grad_norm_`, without its device-to-host read when the norm is
//! only used to scale).

use crate::autograd::NoGradGuard;
use crate::nn::Param;
use crate::{DType, Error, Result, Tensor};

/// Scales the gradients of `params` so their global L2 norm is at most
/// `max_norm`, and returns that norm (before clipping) as a pending f32
/// scalar, or `None` when no parameter has a gradient.
///
/// Every gradient is multiplied by `min(1, max_norm / (norm + 1e-6))`, as
/// PyTorch does: a norm within the bound leaves them (almost exactly)
/// unchanged, and a non-finite norm makes them non-finite, which the caller
/// can detect by reading the returned norm. Squares are summed in f32 for
/// half-precision gradients. Nothing runs until the next sync point (the
/// optimizer's step), where the clipping fuses with the update.
#[track_caller]
pub fn clip_grad_norm(params: &[Param], max_norm: f64) -> Result<Option<Tensor>> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::op(
            "clip_grad_norm",
            format!("max_norm must be finite and positive, got {max_norm}"),
            format!("{} parameters", params.len()),
            crate::site::caller(),
        ));
    }
    let _ng = NoGradGuard::new();
    let grads: Vec<(&Param, Tensor)> = params
        .iter()
        .filter_map(|p| p.grad().map(|g| (p, g)))
        .collect();
    let Some(first) = grads.first() else {
        return Ok(None);
    };
    let device = first.1.device().clone();
    let mut total: Option<Tensor> = None;
    for (_, g) in &grads {
        if !g.dtype().is_float() {
            return Err(Error::op(
                "clip_grad_norm",
                "gradients must be float tensors",
                g.describe(),
                crate::site::caller(),
            ));
        }
        if !g.device().same_device(&device) {
            return Err(Error::op(
                "clip_grad_norm",
                "every gradient must be on one device",
                g.describe(),
                crate::site::caller(),
            ));
        }
        let g32 = as_dtype(g, DType::F32)?;
        let sq = g32.mul(&g32)?.sum(.., false)?;
        total = Some(match total {
            None => sq,
            Some(t) => t.add(&sq)?,
        });
    }
    let norm = total.expect("at least one gradient").sqrt()?;
    let scale = Tensor::full(max_norm, &[], DType::F32, &device)?
        .div(&norm.add(1e-6)?)?
        .minimum(1.0)?;
    // One scale per gradient dtype, not a conversion per parameter.
    let mut scales: Vec<(DType, Tensor)> = Vec::new();
    for (p, g) in grads {
        let s = match scales.iter().find(|(d, _)| *d == g.dtype()) {
            Some((_, s)) => s.clone(),
            None => {
                let s = as_dtype(&scale, g.dtype())?;
                scales.push((g.dtype(), s.clone()));
                s
            }
        };
        p.tensor().set_grad(Some(g.mul(&s)?));
    }
    Ok(Some(norm))
}

/// `t` as `dtype`, recording a conversion only when the dtype differs.
#[track_caller]
fn as_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
    }
}
