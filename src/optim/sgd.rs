//! Stochastic gradient descent with momentum and (L2) weight decay.

use super::{zero_state, Optimizer, StepScalars};
use crate::autograd::NoGradGuard;
use crate::nn::Param;
use crate::{Result, Tensor};

/// PyTorch's SGD: `g += wd * p; buf = momentum * buf + g; p -= lr * buf`
/// (no momentum: `p -= lr * g`).
pub struct Sgd {
    params: Vec<Param>,
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    bufs: Vec<Tensor>,
}

impl Sgd {
    /// SGD over `params`; momentum and weight decay may be 0.
    pub fn new(params: Vec<Param>, lr: f64, momentum: f64, weight_decay: f64) -> Result<Sgd> {
        let bufs = if momentum != 0.0 {
            zero_state(&params)?
        } else {
            Vec::new()
        };
        Ok(Sgd {
            params,
            lr,
            momentum,
            weight_decay,
            bufs,
        })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _ng = NoGradGuard::new();
        let mut scalars = StepScalars::new(vec![self.lr]);
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = p.grad() else { continue };
            let w = p.tensor();
            let lr = scalars.get(w.dtype(), w.device())?[0].clone();
            if self.weight_decay != 0.0 {
                g = g.add(&w.mul(self.weight_decay)?)?;
            }
            if self.momentum != 0.0 {
                self.bufs[i] = self.bufs[i].mul(self.momentum)?.add(&g)?;
                g = self.bufs[i].clone();
            }
            p.update(w.sub(&g.mul(&lr)?)?)?;
        }
        // The step's state is what it needs: parameters and momentum.
        let params: Vec<Tensor> = self.params.iter().map(|p| p.tensor()).collect();
        let need: Vec<&Tensor> = params.iter().chain(&self.bufs).collect();
        crate::realize_all(&need)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
}
