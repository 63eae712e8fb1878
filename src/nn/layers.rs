//! The basic layers: `Linear`, `Conv2d`, `Embedding`, `LayerNorm`, `Dropout`.
//! Initialisation follows PyTorch's defaults, drawn from explicit seeds.

use super::{join, Module, Param};
use crate::{DType, Device, Error, Key, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `x @ weight + bias`, weight stored `[in, out]` so no transpose is needed.
pub struct Linear {
    /// `[in, out]` weight.
    pub weight: Param,
    /// `[out]` bias, if any.
    pub bias: Option<Param>,
}

impl Linear {
    /// Weights and bias uniform in `±1/sqrt(in)` (PyTorch's default), from
    /// `key` (a [`Key`], a `u64` seed, or `dev.next_key()`).
    pub fn new(
        d_in: usize,
        d_out: usize,
        bias: bool,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Linear> {
        let seed = key.into().bits();
        let b = 1.0 / (d_in as f64).sqrt();
        let u = |dims: &[usize], s: u64| Tensor::rand(dims, s, dev)?.mul(2.0 * b)?.sub(b);
        Ok(Linear {
            weight: Param::new(u(&[d_in, d_out], seed)?)?,
            bias: if bias {
                Some(Param::new(u(&[d_out], seed ^ 0xb1a5)?)?)
            } else {
                None
            },
        })
    }

    /// A layer with weights from `N(0, std^2)` and zero bias (GPT-2's init).
    pub fn normal(
        d_in: usize,
        d_out: usize,
        std: f64,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Linear> {
        Ok(Linear {
            weight: Param::new(Tensor::randn(&[d_in, d_out], key, dev)?.mul(std)?)?,
            bias: Some(Param::new(Tensor::zeros(&[d_out], DType::F32, dev)?)?),
        })
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.tensor())?;
        match &self.bias {
            Some(b) => y.add(b.tensor()),
            None => Ok(y),
        }
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
        if let Some(b) = &self.bias {
            out.push((join(prefix, "bias"), b.clone()));
        }
    }
}

/// 2-D convolution over NCHW inputs ([`Tensor::conv2d`]): weight
/// `[c_out, c_in / groups, kh, kw]`, optional bias `[c_out]`.
pub struct Conv2d {
    /// `[c_out, c_in / groups, kh, kw]` kernel.
    pub weight: Param,
    /// `[c_out]` bias, if any.
    pub bias: Option<Param>,
    /// Step between windows (rows, cols).
    pub stride: (usize, usize),
    /// Zero padding on each side (rows, cols).
    pub padding: (usize, usize),
    /// Spacing between kernel taps (rows, cols).
    pub dilation: (usize, usize),
    /// Channel groups (`c_in` for depthwise).
    pub groups: usize,
}

impl Conv2d {
    /// Weights and bias uniform in `±1/sqrt(fan_in)`, `fan_in = c_in / groups
    /// * kh * kw` (PyTorch's default), from `key`. `groups` must divide
    /// `c_in` and `c_out`.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn new(
        c_in: usize,
        c_out: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
        bias: bool,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Conv2d> {
        let seed = key.into().bits();
        if groups == 0 || c_in % groups != 0 || c_out % groups != 0 || kernel.0 * kernel.1 == 0 {
            return Err(Error::op(
                "Conv2d::new",
                format!(
                    "groups ({groups}) must be positive and divide c_in ({c_in}) and c_out ({c_out}), \
                     and the kernel {kernel:?} must be non-empty"
                ),
                String::new(),
                crate::site::caller(),
            ));
        }
        let fan_in = c_in / groups * kernel.0 * kernel.1;
        let b = 1.0 / (fan_in as f64).sqrt();
        let u = |dims: &[usize], s: u64| Tensor::rand(dims, s, dev)?.mul(2.0 * b)?.sub(b);
        Ok(Conv2d {
            weight: Param::new(u(&[c_out, c_in / groups, kernel.0, kernel.1], seed)?)?,
            bias: if bias {
                Some(Param::new(u(&[c_out], seed ^ 0xb1a5)?)?)
            } else {
                None
            },
            stride,
            padding,
            dilation,
            groups,
        })
    }
}

impl Module for Conv2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.bias.as_ref().map(Param::tensor);
        x.conv2d(
            &self.weight.tensor(),
            b.as_ref(),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
        if let Some(b) = &self.bias {
            out.push((join(prefix, "bias"), b.clone()));
        }
    }
}

/// A lookup table: integer ids `[...]` to rows `[..., dim]` of `weight`.
pub struct Embedding {
    /// `[vocab, dim]` table.
    pub weight: Param,
}

impl Embedding {
    /// `N(0, std^2)` rows from `key` (PyTorch uses std 1, GPT-2 0.02).
    pub fn new(
        vocab: usize,
        dim: usize,
        std: f64,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Embedding> {
        let w = Tensor::randn(&[vocab, dim], key, dev)?.mul(std)?;
        Ok(Embedding {
            weight: Param::new(w)?,
        })
    }

    /// Looks up ids given on the host, checking each is in `0..vocab`.
    #[track_caller]
    pub fn forward_ids(&self, ids: &[i64], dims: &[usize]) -> Result<Tensor> {
        let w = self.weight.tensor();
        let vocab = w.dims()[0] as i64;
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| !(0..vocab).contains(&id))
        {
            return Err(Error::op(
                "embedding",
                format!("id {i} is {id}, outside 0..{vocab}"),
                w.describe(),
                crate::site::caller(),
            ));
        }
        self.forward(&Tensor::from_slice(ids, dims, w.device())?)
    }
}

impl Module for Embedding {
    /// Ids out of range clamp to the first or last row (checked ids: [`Embedding::forward_ids`]).
    #[track_caller]
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let w = self.weight.tensor();
        if !ids.dtype().is_int() {
            return Err(Error::op(
                "embedding",
                format!("ids must be integer, got {}", ids.dtype()),
                w.describe(),
                crate::site::caller(),
            ));
        }
        let rows = w.index_select(0, &ids.reshape(&[ids.numel()])?)?;
        let mut dims = ids.dims().to_vec();
        dims.push(w.dims()[1]);
        rows.reshape(&dims)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
    }
}

/// Layer normalisation over the last dim with a learned scale and shift.
pub struct LayerNorm {
    /// `[dim]` scale.
    pub weight: Param,
    /// `[dim]` shift.
    pub bias: Param,
    /// Added to the variance before the square root.
    pub eps: f64,
}

impl LayerNorm {
    /// Scale 1, shift 0, `eps = 1e-5`.
    pub fn new(dim: usize, dev: &Device) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Param::new(Tensor::ones(&[dim], DType::F32, dev)?)?,
            bias: Param::new(Tensor::zeros(&[dim], DType::F32, dev)?)?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(
            Some(&self.weight.tensor()),
            Some(&self.bias.tensor()),
            self.eps,
        )
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
        out.push((join(prefix, "bias"), self.bias.clone()));
    }
}

/// Dropout with a deterministic key stream: call `n` of a module built with
/// key `k` uses `k.fold_in(n)`, so runs are reproducible and fused and
/// unfused runs drop the same elements. Starts in training mode.
pub struct Dropout {
    /// Probability of zeroing an element in training mode.
    pub p: f64,
    key: Key,
    calls: AtomicU64,
    train: AtomicBool,
}

impl Dropout {
    /// Drops with probability `p`, with masks drawn from `key`.
    pub fn new(p: f64, key: impl Into<Key>) -> Dropout {
        Dropout {
            p,
            key: key.into(),
            calls: AtomicU64::new(0),
            train: AtomicBool::new(true),
        }
    }
}

impl Module for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.train.load(Ordering::Relaxed) || self.p == 0.0 {
            return Ok(x.clone());
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        x.dropout(self.p, self.key.fold_in(n), true)
    }

    fn visit_params(&self, _prefix: &str, _out: &mut Vec<(String, Param)>) {}

    fn set_train(&self, train: bool) {
        self.train.store(train, Ordering::Relaxed);
    }
}
