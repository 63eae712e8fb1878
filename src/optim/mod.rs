//! Optimizers: SGD (momentum, weight decay) and AdamW.
//!
//! An update is recorded as ordinary ops under `no_grad` for every parameter,
//! then one sync runs the whole update as one fused graph. Host scalars are
//! region parameters anyway (the planner's scalar lifting), so a changing
//! learning rate never recompiles; the per-step values (learning rate,
//! AdamW's bias corrections) are additionally uploaded once per step as
//! shared rank-0 tensors, so every parameter's update reads one buffer
//! instead of each passing its own copy.
//! State buffers are materialised at construction, so the first step records
//! the same graph as every later one.

mod adamw;
mod clip;
mod sgd;
mod sparse;

pub use adamw::AdamW;
pub use clip::clip_grad_norm;
pub use sgd::Sgd;
pub use sparse::SparseSgd;

use crate::nn::Param;
use crate::{DType, Device, HostTensor, Result, Shape, Tensor};
use std::collections::HashMap;

/// What every optimizer offers the training loop.
pub trait Optimizer {
    /// Applies one update from the parameters' accumulated gradients
    /// (parameters without a gradient are left alone) and syncs.
    fn step(&mut self) -> Result<()>;
    /// The parameters this optimizer updates.
    fn params(&self) -> &[Param];
    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        self.params().iter().for_each(Param::zero_grad);
    }
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
        let key = (dtype, device.client_id(), device.ordinal());
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
