//! Optimizers: SGD (momentum, weight decay) and AdamW.
//!
//! An update is recorded as ordinary ops under `no_grad` for every parameter,
//! then one sync runs the whole update as one fused graph. Everything that
//! changes between steps (learning rate, AdamW's bias corrections) enters the
//! graph as an uploaded scalar tensor, never as a compiled-in constant, so
//! changing the learning rate or advancing the step count never recompiles.
//! State buffers are materialised at construction, so the first step records
//! the same graph as every later one.

mod adamw;
mod sgd;

pub use adamw::AdamW;
pub use sgd::Sgd;

use crate::nn::Param;
use crate::{DType, Device, HostTensor, Result, Shape, Tensor};
use std::collections::HashMap;

/// What every optimizer offers the training loop.
pub trait Optimizer {
    /// Applies one update from the parameters' accumulated gradients
    /// (parameters without a gradient are left alone) and syncs.
    fn step(&mut self) -> Result<()>;
    /// Clears every parameter's gradient.
    fn zero_grad(&self);
    /// The learning rate of the next step.
    fn lr(&self) -> f64;
    /// Changes the learning rate (no recompilation).
    fn set_lr(&mut self, lr: f64);
}

/// Parameters of a module list, without names.
pub fn params_of(named: &[(String, Param)]) -> Vec<Param> {
    named.iter().map(|(_, p)| p.clone()).collect()
}

/// Per-step host scalars uploaded once per dtype and device and shared by
/// every parameter's update (deduplicated as one graph input).
pub(crate) struct StepScalars {
    values: Vec<f64>,
    cache: HashMap<(DType, u32, usize), Vec<Tensor>>,
}

impl StepScalars {
    pub(crate) fn new(values: Vec<f64>) -> Self {
        StepScalars {
            values,
            cache: HashMap::new(),
        }
    }

    /// The scalars as rank-0 tensors of `dtype` on `device`.
    pub(crate) fn get(&mut self, dtype: DType, device: &Device) -> Result<&[Tensor]> {
        let key = (dtype, device.rt.id, device.ordinal);
        if !self.cache.contains_key(&key) {
            let ts = self
                .values
                .iter()
                .map(|&v| {
                    Tensor::from_host(&HostTensor::from_f64(&[v], Shape::scalar(), dtype), device)
                })
                .collect::<Result<Vec<_>>>()?;
            self.cache.insert(key, ts);
        }
        Ok(&self.cache[&key])
    }
}

/// Zero state buffers shaped like `params`, materialised now.
pub(crate) fn zero_state(params: &[Param]) -> Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| {
            let z = p.tensor().detach()?.zeros_like()?;
            z.realize()?;
            Ok(z)
        })
        .collect()
}
