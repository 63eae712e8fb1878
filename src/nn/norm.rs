//! Normalisation over channels of channels-first inputs (`[n, c, ...]`):
//! batch norm, with the running statistics PyTorch keeps, and group norm.
//! Both are composites of recorded ops, so they fuse with the convolutions
//! around them and autograd differentiates them with no rule of their own.

use super::{join, Module, Param};
use crate::{Device, Error, Result, Tensor};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// `x` reshaped so a per-channel `[c]` vector broadcasts over `[n, c, ...]`.
fn per_channel(v: &Tensor, rank: usize) -> Result<Tensor> {
    let mut dims = vec![1; rank];
    dims[1] = v.dims()[0];
    v.reshape(&dims)
}

/// Every axis but the channel axis 1.
fn stat_axes(rank: usize) -> Vec<isize> {
    (0..rank as isize).filter(|&a| a != 1).collect()
}

/// Batch normalisation (PyTorch's `BatchNorm1d/2d/3d`): in training mode
/// each channel is normalised by its batch mean and biased variance, and
/// the running statistics move towards them (the variance unbiased) by
/// `momentum`; in evaluation mode the running statistics are used. The
/// running statistics are buffers, not parameters: no gradient, and an
/// optimizer never sees them.
pub struct BatchNorm {
    /// `[c]` scale (`None`: PyTorch's `affine=False`).
    pub weight: Option<Param>,
    /// `[c]` shift.
    pub bias: Option<Param>,
    running_mean: RwLock<Tensor>,
    running_var: RwLock<Tensor>,
    /// Weight of the new batch statistics in the running ones (0.1).
    pub momentum: f64,
    /// Added to the variance before the square root (1e-5).
    pub eps: f64,
    train: AtomicBool,
}

impl BatchNorm {
    /// A batch norm over `c` channels as PyTorch initialises one: scale 1,
    /// shift 0, running mean 0 and variance 1, momentum 0.1, eps 1e-5, in
    /// training mode.
    #[track_caller]
    pub fn new(c: usize, dev: &Device) -> Result<BatchNorm> {
        let dt = crate::DType::F32;
        BatchNorm::from_tensors(
            Some(Tensor::ones(&[c], dt, dev)?),
            Some(Tensor::zeros(&[c], dt, dev)?),
            Tensor::zeros(&[c], dt, dev)?,
            Tensor::ones(&[c], dt, dev)?,
            1e-5,
            0.1,
        )
    }

    /// A batch norm from loaded tensors, all `[c]` of one float dtype.
    #[track_caller]
    pub fn from_tensors(
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        running_mean: Tensor,
        running_var: Tensor,
        eps: f64,
        momentum: f64,
    ) -> Result<BatchNorm> {
        let loc = crate::site::caller();
        let c = running_mean.dims().first().copied().unwrap_or(0);
        let ok = |t: &Tensor| t.dims() == [c] && t.dtype() == running_mean.dtype();
        let all = [Some(&running_var), weight.as_ref(), bias.as_ref()];
        if running_mean.rank() != 1 || !all.into_iter().flatten().all(ok) {
            return Err(Error::op(
                "BatchNorm::from_tensors",
                "weight, bias and the running statistics must all be [c] of one dtype",
                running_mean.describe(),
                loc,
            ));
        }
        let frozen = |t: Tensor| -> Result<Tensor> {
            let t = t.detach()?;
            t.realize()?;
            Ok(t)
        };
        Ok(BatchNorm {
            weight: weight.map(Param::new).transpose()?,
            bias: bias.map(Param::new).transpose()?,
            running_mean: RwLock::new(frozen(running_mean)?),
            running_var: RwLock::new(frozen(running_var)?),
            momentum,
            eps,
            train: AtomicBool::new(true),
        })
    }

    /// The running mean (`[c]`).
    pub fn running_mean(&self) -> Tensor {
        self.running_mean.read().clone()
    }

    /// The running (unbiased) variance (`[c]`).
    pub fn running_var(&self) -> Tensor {
        self.running_var.read().clone()
    }

    /// Whether the module is in training mode.
    pub fn is_training(&self) -> bool {
        self.train.load(Ordering::Relaxed)
    }

    fn affine(&self, y: Tensor) -> Result<Tensor> {
        let r = y.rank();
        let y = match &self.weight {
            Some(w) => y.mul(&per_channel(&w.tensor(), r)?)?,
            None => y,
        };
        match &self.bias {
            Some(b) => y.add(&per_channel(&b.tensor(), r)?),
            None => Ok(y),
        }
    }
}

impl Module for BatchNorm {
    /// Normalises `x` `[n, c, ...]` (training or evaluation mode, see
    /// [`Module::set_train`]); in training mode also records the update of
    /// the running statistics, which lands with the step's next flush.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.running_mean.read().dims()[0];
        if x.rank() < 2 || x.dims()[1] != c || !x.dtype().is_float() {
            return Err(Error::op(
                "BatchNorm",
                format!("input must be a float [n, {c}, ...] tensor"),
                x.describe(),
                crate::site::caller(),
            ));
        }
        let r = x.rank();
        if !self.is_training() {
            let mean = per_channel(&self.running_mean(), r)?;
            let inv = per_channel(&self.running_var().add(self.eps)?.rsqrt()?, r)?;
            return self.affine(x.sub(&mean)?.mul(&inv)?);
        }
        let axes = stat_axes(r);
        let mean = x.mean(&axes[..], true)?;
        let xc = x.sub(&mean)?;
        let var = xc.mul(&xc)?.mean(&axes[..], true)?;
        let y = xc.mul(&var.add(self.eps)?.rsqrt()?)?;
        let n = x.numel() / c.max(1);
        crate::no_grad(|| -> Result<()> {
            let m = self.momentum;
            let unbias = n as f64 / (n.max(2) - 1) as f64;
            let rm = self.running_mean();
            let rv = self.running_var();
            let new_mean = rm
                .mul(1.0 - m)?
                .add(&mean.detach()?.reshape(&[c])?.mul(m)?)?;
            let new_var = rv
                .mul(1.0 - m)?
                .add(&var.detach()?.reshape(&[c])?.mul(m * unbias)?)?;
            *self.running_mean.write() = new_mean;
            *self.running_var.write() = new_var;
            Ok(())
        })?;
        self.affine(y)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        if let Some(w) = &self.weight {
            out.push((join(prefix, "weight"), w.clone()));
        }
        if let Some(b) = &self.bias {
            out.push((join(prefix, "bias"), b.clone()));
        }
    }

    fn set_train(&self, train: bool) {
        self.train.store(train, Ordering::Relaxed);
    }
}

/// Group normalisation (PyTorch's `GroupNorm`): the channels of each
/// sample split into `groups`, each normalised by its own mean and biased
/// variance over its channels and positions, then a per-channel affine.
pub struct GroupNorm {
    /// Channel groups (dividing the channels).
    pub groups: usize,
    /// `[c]` scale.
    pub weight: Param,
    /// `[c]` shift.
    pub bias: Param,
    /// Added to the variance (1e-5).
    pub eps: f64,
}

impl GroupNorm {
    /// `groups` groups over `c` channels, scale 1 and shift 0 (f32).
    #[track_caller]
    pub fn new(groups: usize, c: usize, eps: f64, dev: &Device) -> Result<GroupNorm> {
        let dt = crate::DType::F32;
        GroupNorm::from_tensors(
            groups,
            Tensor::ones(&[c], dt, dev)?,
            Tensor::zeros(&[c], dt, dev)?,
            eps,
        )
    }

    /// A group norm from loaded `[c]` scale and shift.
    #[track_caller]
    pub fn from_tensors(
        groups: usize,
        weight: Tensor,
        bias: Tensor,
        eps: f64,
    ) -> Result<GroupNorm> {
        let c = weight.dims().first().copied().unwrap_or(0);
        if weight.rank() != 1 || bias.dims() != [c] || groups == 0 || c % groups != 0 {
            return Err(Error::op(
                "GroupNorm::from_tensors",
                format!("weight and bias must be [c] with c divisible by the {groups} groups"),
                format!("{}, {}", weight.describe(), bias.describe()),
                crate::site::caller(),
            ));
        }
        Ok(GroupNorm {
            groups,
            weight: Param::new(weight)?,
            bias: Param::new(bias)?,
            eps,
        })
    }
}

impl Module for GroupNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.weight.tensor().dims()[0];
        if x.rank() < 2 || x.dims()[1] != c || !x.dtype().is_float() {
            return Err(Error::op(
                "GroupNorm",
                format!("input must be a float [n, {c}, ...] tensor"),
                x.describe(),
                crate::site::caller(),
            ));
        }
        let n = x.dims()[0];
        let g = x.reshape(&[n, self.groups, x.numel() / (n * self.groups).max(1)])?;
        let mean = g.mean(-1, true)?;
        let gc = g.sub(&mean)?;
        let var = gc.mul(&gc)?.mean(-1, true)?;
        let y = gc.mul(&var.add(self.eps)?.rsqrt()?)?.reshape(x.dims())?;
        let r = x.rank();
        y.mul(&per_channel(&self.weight.tensor(), r)?)?
            .add(&per_channel(&self.bias.tensor(), r)?)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
        out.push((join(prefix, "bias"), self.bias.clone()));
    }
}
