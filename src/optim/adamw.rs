//! AdamW: Adam with decoupled weight decay (Loshchilov & Hutter).

use super::{zero_state, Optimizer, StepScalars};
use crate::autograd::NoGradGuard;
use crate::nn::Param;
use crate::{Result, Tensor};

/// `p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`.
/// The learning rate and both bias corrections are uploaded each step.
pub struct AdamW {
    params: Vec<Param>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    t: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    /// AdamW with PyTorch's defaults for `betas` (0.9, 0.999) and `eps` (1e-8).
    pub fn new(params: Vec<Param>, lr: f64, weight_decay: f64) -> Result<AdamW> {
        Self::with_betas(params, lr, (0.9, 0.999), 1e-8, weight_decay)
    }

    /// AdamW with every hyperparameter explicit.
    pub fn with_betas(
        params: Vec<Param>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Result<AdamW> {
        Ok(AdamW {
            m: zero_state(&params)?,
            v: zero_state(&params)?,
            params,
            lr,
            betas,
            eps,
            weight_decay,
            t: 0,
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.t
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) -> Result<()> {
        let _ng = NoGradGuard::new();
        self.t += 1;
        let (b1, b2) = self.betas;
        let t = self.t as i32;
        let mut scalars = StepScalars::new(vec![self.lr, 1.0 - b1.powi(t), 1.0 - b2.powi(t)]);
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let w = p.tensor();
            let s = scalars.get(w.dtype(), w.device())?;
            let (lr, bc1, bc2) = (&s[0], &s[1], &s[2]);
            let mut w2 = w.clone();
            if self.weight_decay != 0.0 {
                w2 = w2.sub(&w.mul(lr)?.mul(self.weight_decay)?)?;
            }
            self.m[i] = self.m[i].mul(b1)?.add(&g.mul(1.0 - b1)?)?;
            self.v[i] = self.v[i].mul(b2)?.add(&g.mul(&g)?.mul(1.0 - b2)?)?;
            let mhat = self.m[i].div(bc1)?;
            let denom = self.v[i].div(bc2)?.sqrt()?.add(self.eps)?;
            p.update(w2.sub(&mhat.div(&denom)?.mul(lr)?)?)?;
        }
        // The step's state is what it needs: parameters and both moments.
        let params: Vec<Tensor> = self.params.iter().map(|p| p.tensor()).collect();
        let need: Vec<&Tensor> = params.iter().chain(&self.m).chain(&self.v).collect();
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
