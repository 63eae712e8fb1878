//! Neural-network building blocks on top of autograd.
//!
//! Convention: a [`Param`] is a shared, replaceable slot holding a leaf tensor
//! that requires grad (tensors are immutable handles, so an optimizer updates
//! a parameter by putting a new tensor in its slot). A [`Module`] exposes its
//! parameters with dotted names (`h.0.attn.c_attn.weight`), which are the keys
//! [`save`] and [`load`] use in safetensors files.

mod attention;
mod bag;
mod io;
mod kv;
mod layers;
pub mod moe;
mod norm;
pub mod parallel;

pub use attention::{Block, CausalSelfAttention};
pub use bag::EmbeddingBag;
pub use io::{load, load_tensors, save, save_tensors};
pub use kv::{KvCache, LayerCache};
pub use layers::{Conv2d, Dropout, Embedding, LayerNorm, Linear};
pub use norm::{BatchNorm, GroupNorm};

use crate::{Error, Result, Tensor};
use parking_lot::RwLock;
use std::sync::Arc;

/// A trainable tensor slot shared by a module and its optimizer.
#[derive(Clone)]
pub struct Param(Arc<RwLock<Tensor>>);

impl Param {
    /// Wraps `value` as a parameter: materialised now (so every training step
    /// records the same graph) and marked as requiring grad.
    #[track_caller]
    pub fn new(value: Tensor) -> Result<Param> {
        let v = Self::prepare(value)?;
        Ok(Param(Arc::new(RwLock::new(v))))
    }

    /// Wraps `value` as a parameter that does not require grad (PyTorch's
    /// `requires_grad_(False)`): materialised now, and recording no tape,
    /// so inference with loaded weights pays nothing for autograd.
    #[track_caller]
    pub fn frozen(value: Tensor) -> Result<Param> {
        let v = value.detach()?;
        v.realize()?;
        Ok(Param(Arc::new(RwLock::new(v))))
    }

    #[track_caller]
    fn prepare(value: Tensor) -> Result<Tensor> {
        let v = value.detach()?;
        v.realize()?;
        v.set_requires_grad(true)?;
        Ok(v)
    }

    /// The current value (a leaf that requires grad).
    pub fn tensor(&self) -> Tensor {
        self.0.read().clone()
    }

    /// Replaces the value with `value` (same shape and dtype), which becomes
    /// a fresh leaf. Does not materialise it: optimizers sync once per step.
    #[track_caller]
    pub fn set(&self, value: Tensor) -> Result<()> {
        let old = self.tensor();
        if old.shape() != value.shape() || old.dtype() != value.dtype() {
            return Err(Error::op(
                "Param::set",
                "the new value must keep the parameter's shape and dtype",
                format!("{}, {}", old.describe(), value.describe()),
                crate::site::caller(),
            ));
        }
        let v = value.detach()?;
        v.set_requires_grad(true)?;
        *self.0.write() = v;
        Ok(())
    }

    /// Replaces the value of a frozen parameter (a sparse embedding table
    /// updated by its optimizer): as [`Param::set`], but the new value does
    /// not require grad either.
    #[track_caller]
    pub(crate) fn set_frozen(&self, value: Tensor) -> Result<()> {
        let old = self.tensor();
        if old.shape() != value.shape() || old.dtype() != value.dtype() {
            return Err(Error::op(
                "Param::set",
                "the new value must keep the parameter's shape and dtype",
                format!("{}, {}", old.describe(), value.describe()),
                crate::site::caller(),
            ));
        }
        *self.0.write() = value.detach()?;
        Ok(())
    }

    /// Replaces the value with an optimizer's update of it: as [`Param::set`],
    /// but the gradient the update consumed stays readable (as in PyTorch,
    /// `p.grad()` after `step()` is the step's gradient until `zero_grad`).
    /// Marked cold: a flush leaves it out from the first step unless the
    /// program is seen to read it, holding the old weights it reads (not
    /// updated in place) until it dies; only when what it reads is more
    /// than twice its size does the step compute it instead.
    #[track_caller]
    pub(crate) fn update(&self, value: Tensor) -> Result<()> {
        let grad = self.grad();
        if let Some(g) = &grad {
            g.0.set_cold();
        }
        self.set(value)?;
        self.0.read().set_grad(grad);
        Ok(())
    }

    /// The accumulated gradient of the current value.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.read().grad()
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        self.0.read().zero_grad()
    }
}

/// A layer or model: a forward function plus named parameters.
pub trait Module {
    /// Applies the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Appends `(prefix + name, param)` for every parameter, in a fixed order.
    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>);

    /// Switches training behaviour (dropout) on or off; a no-op by default.
    fn set_train(&self, _train: bool) {}

    /// Every parameter with its dotted name.
    fn parameters(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        self.visit_params("", &mut v);
        v
    }
}

/// `prefix.name` (or `name` at the top level): the dotted parameter path.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}
