//! The layers of diffusers' UNet2DModel, loaded by their state-dict
//! names: `ResnetBlock2D` (group norm, activation, 3x3 convolutions, the
//! time embedding added or applied as scale and shift, an optional 1x1
//! shortcut and an internal resampler), the spatial self-attention block
//! (`Attention` with a group norm and a residual connection) and the
//! strided-convolution and nearest-upsampling resamplers.

use super::config::Activation;
use crate::weights::{Checkpoint, Loader};
use crate::{ModelError, Result};
use lazyfuse::ir::ConvSpec;
use lazyfuse::nn::{join, GroupNorm, Linear, Module, Param};
use lazyfuse::{DType, Device, Tensor};
use std::cell::Cell;

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

/// Where a model's tensors come from: a checkpoint (each checked against
/// the shape the config implies) or fresh initialisation as PyTorch's
/// layers draw it (uniform in `±1/sqrt(fan_in)` for convolutions and
/// linear layers, scale 1 and shift 0 for norms, N(0, 1) for embeddings).
/// Either way the parameters are trainable.
pub(crate) struct Weights<'a> {
    pub(crate) ck: Option<&'a Checkpoint>,
    pub(crate) dev: &'a Device,
    /// Next seed of the fresh initialisation.
    pub(crate) seed: Cell<u64>,
}

/// How a fresh tensor is drawn.
#[derive(Clone, Copy)]
pub(crate) enum Init {
    Uniform(f64),
    Ones,
    Zeros,
    Normal,
}

impl Weights<'_> {
    /// `name` with shape `dims`: read, or drawn as `init` says.
    pub(crate) fn tensor(&self, name: &str, dims: &[usize], init: Init) -> Result<Param> {
        let t = match self.ck {
            Some(c) => Tensor::from_slice(&c.f32(name, dims)?, dims, self.dev)?,
            None => {
                let seed = lazyfuse::ir::splitmix64(self.seed.get());
                self.seed.set(seed);
                match init {
                    Init::Uniform(b) => Tensor::rand(dims, seed, self.dev)?.mul(2.0 * b)?.sub(b)?,
                    Init::Ones => Tensor::ones(dims, DType::F32, self.dev)?,
                    Init::Zeros => Tensor::zeros(dims, DType::F32, self.dev)?,
                    Init::Normal => Tensor::randn(dims, seed, self.dev)?,
                }
            }
        };
        Ok(Param::new(t)?)
    }

    /// `prefix.weight` `[cout, cin, k, k]` and `prefix.bias` `[cout]`,
    /// stride 1, "same" padding.
    pub(crate) fn conv(&self, prefix: &str, cin: usize, cout: usize, k: usize) -> Result<Conv> {
        let b = 1.0 / ((cin * k * k) as f64).sqrt();
        let p = (k / 2) as i64;
        Ok(Conv {
            weight: self.tensor(
                &format!("{prefix}.weight"),
                &[cout, cin, k, k],
                Init::Uniform(b),
            )?,
            bias: self.tensor(&format!("{prefix}.bias"), &[cout], Init::Uniform(b))?,
            stride: 1,
            pad: [(p, p), (p, p)],
        })
    }

    /// A PyTorch `[out, in]` linear layer with bias (held as `[in, out]`).
    pub(crate) fn linear(&self, prefix: &str, inp: usize, out: usize) -> Result<Linear> {
        let b = 1.0 / (inp as f64).sqrt();
        let weight = match self.ck {
            Some(c) => {
                let frozen = Loader {
                    ck: c,
                    dev: self.dev,
                }
                .linear(prefix, inp, out, false)?;
                Param::new(frozen.weight.tensor())?
            }
            None => self.tensor("", &[inp, out], Init::Uniform(b))?,
        };
        Ok(Linear {
            weight,
            bias: Some(self.tensor(&format!("{prefix}.bias"), &[out], Init::Uniform(b))?),
        })
    }

    /// `prefix.weight` and `prefix.bias` `[c]` as a group norm.
    pub(crate) fn group_norm(
        &self,
        prefix: &str,
        groups: usize,
        c: usize,
        eps: f64,
    ) -> Result<GroupNorm> {
        let w = self
            .tensor(&format!("{prefix}.weight"), &[c], Init::Ones)?
            .tensor();
        let b = self
            .tensor(&format!("{prefix}.bias"), &[c], Init::Zeros)?
            .tensor();
        Ok(GroupNorm::from_tensors(groups, w, b, eps)?)
    }
}

/// A 2-D convolution with bias and per-side padding (diffusers' strided
/// down-convolution with `padding=0` pads only the end).
pub(crate) struct Conv {
    weight: Param,
    bias: Param,
    stride: usize,
    pad: [(i64, i64); 2],
}

impl Conv {
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut spec = ConvSpec::plain(2);
        spec.stride = [self.stride; 2].into_iter().collect();
        spec.padding = self.pad.into_iter().collect();
        let y = x.convolution(&self.weight.tensor(), &spec)?;
        let o = self.bias.tensor().dims()[0];
        Ok(y.add(&self.bias.tensor().reshape(&[1, o, 1, 1])?)?)
    }

    /// The same convolution with stride 2: padding `p` on every side, or
    /// with `p == 0` one row and column at the end (diffusers' `F.pad`).
    pub(crate) fn strided(mut self, p: usize) -> Conv {
        self.stride = 2;
        let p = p as i64;
        self.pad = if p == 0 {
            [(0, 1), (0, 1)]
        } else {
            [(p, p), (p, p)]
        };
        self
    }

    pub(crate) fn visit(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
        out.push((join(prefix, "bias"), self.bias.clone()));
    }
}

pub(crate) fn act(a: Activation, x: &Tensor) -> Result<Tensor> {
    Ok(match a {
        Activation::Silu => x.mul(&x.sigmoid()?)?,
        Activation::Gelu => x.gelu_exact()?,
        Activation::Relu => x.relu()?,
    })
}

/// Nearest-neighbour doubling of the two spatial dims.
pub(crate) fn upsample2x(x: &Tensor) -> Result<Tensor> {
    let d = x.dims();
    Ok(x.upsample_nearest(&[d[2] * 2, d[3] * 2])?)
}

/// The resampling inside a residual block (`up=True` / `down=True`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inner {
    None,
    Up,
    Down,
}

/// Settings shared by every residual block of a model.
#[derive(Clone, Copy)]
pub(crate) struct BlockCfg {
    pub(crate) groups: usize,
    pub(crate) eps: f64,
    pub(crate) act: Activation,
    pub(crate) scale_shift: bool,
}

/// diffusers' `ResnetBlock2D`.
pub(crate) struct ResnetBlock {
    norm1: GroupNorm,
    conv1: Conv,
    time_emb_proj: Linear,
    norm2: GroupNorm,
    conv2: Conv,
    conv_shortcut: Option<Conv>,
    cfg: BlockCfg,
    output_scale: f64,
    inner: Inner,
}

impl ResnetBlock {
    /// Block `p` from `cin` to `cout` channels; `temb` is the time
    /// embedding's width.
    pub(crate) fn load(
        w: &Weights,
        p: &str,
        (cin, cout, temb): (usize, usize, usize),
        cfg: BlockCfg,
        output_scale: f64,
        inner: Inner,
    ) -> Result<ResnetBlock> {
        let proj = if cfg.scale_shift { 2 * cout } else { cout };
        Ok(ResnetBlock {
            norm1: w.group_norm(&format!("{p}.norm1"), cfg.groups, cin, cfg.eps)?,
            conv1: w.conv(&format!("{p}.conv1"), cin, cout, 3)?,
            time_emb_proj: w.linear(&format!("{p}.time_emb_proj"), temb, proj)?,
            norm2: w.group_norm(&format!("{p}.norm2"), cfg.groups, cout, cfg.eps)?,
            conv2: w.conv(&format!("{p}.conv2"), cout, cout, 3)?,
            // diffusers projects the shortcut exactly when the width changes.
            conv_shortcut: if cin != cout {
                Some(w.conv(&format!("{p}.conv_shortcut"), cin, cout, 1)?)
            } else {
                None
            },
            cfg,
            output_scale,
            inner,
        })
    }

    /// `x [n, c, h, w]`, `temb_act = act(temb) [n, t]`.
    pub(crate) fn forward(&self, x: &Tensor, temb_act: &Tensor) -> Result<Tensor> {
        let a = self.cfg.act;
        let mut h = act(a, &self.norm1.forward(x)?)?;
        let mut x = x.clone();
        match self.inner {
            Inner::Up => {
                x = upsample2x(&x)?;
                h = upsample2x(&h)?;
            }
            Inner::Down => {
                x = x.avg_pool2d((2, 2), (2, 2), (0, 0))?;
                h = h.avg_pool2d((2, 2), (2, 2), (0, 0))?;
            }
            Inner::None => {}
        }
        let h = self.conv1.forward(&h)?;
        let t = self.time_emb_proj.forward(temb_act)?;
        let (n, tc) = (t.dims()[0], t.dims()[1]);
        let t = t.reshape(&[n, tc, 1, 1])?;
        let h = if self.cfg.scale_shift {
            let half = tc / 2;
            let (scale, shift) = (t.narrow(1, 0, half)?, t.narrow(1, half, half)?);
            self.norm2.forward(&h)?.mul(&scale.add(1.0)?)?.add(&shift)?
        } else {
            self.norm2.forward(&h.add(&t)?)?
        };
        let h = self.conv2.forward(&act(a, &h)?)?;
        let x = match &self.conv_shortcut {
            Some(c) => c.forward(&x)?,
            None => x,
        };
        let y = x.add(&h)?;
        Ok(if self.output_scale == 1.0 {
            y
        } else {
            y.div(self.output_scale)?
        })
    }

    pub(crate) fn visit(&self, p: &str, out: &mut Vec<(String, Param)>) {
        self.norm1.visit_params(&join(p, "norm1"), out);
        self.conv1.visit(&join(p, "conv1"), out);
        self.time_emb_proj
            .visit_params(&join(p, "time_emb_proj"), out);
        self.norm2.visit_params(&join(p, "norm2"), out);
        self.conv2.visit(&join(p, "conv2"), out);
        if let Some(c) = &self.conv_shortcut {
            c.visit(&join(p, "conv_shortcut"), out);
        }
    }
}

/// diffusers' `Attention` over the positions of a feature map: optional
/// group norm, multi-head self-attention (scale `1/sqrt(head_dim)`), the
/// output projection, the residual, and the rescale.
pub(crate) struct SpatialAttention {
    group_norm: Option<GroupNorm>,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    heads: usize,
    rescale: f64,
}

impl SpatialAttention {
    /// Attention `p` over `c` channels in `heads` heads of `head_dim`.
    pub(crate) fn load(
        w: &Weights,
        p: &str,
        (c, heads, head_dim): (usize, usize, usize),
        groups: Option<usize>,
        eps: f64,
        rescale: f64,
    ) -> Result<SpatialAttention> {
        let group_norm = match groups {
            Some(g) => Some(w.group_norm(&format!("{p}.group_norm"), g, c, eps)?),
            None => None,
        };
        let inner = heads * head_dim;
        if inner == 0 {
            return Err(ck(format!("{p}: attention over {c} channels has no heads")));
        }
        Ok(SpatialAttention {
            group_norm,
            to_q: w.linear(&format!("{p}.to_q"), c, inner)?,
            to_k: w.linear(&format!("{p}.to_k"), c, inner)?,
            to_v: w.linear(&format!("{p}.to_v"), c, inner)?,
            to_out: w.linear(&format!("{p}.to_out.0"), inner, c)?,
            heads,
            rescale,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.dims().to_vec();
        let (n, c, hw) = (d[0], d[1], d[2] * d[3]);
        let flat = x.reshape(&[n, c, hw])?;
        let normed = match &self.group_norm {
            Some(g) => g.forward(&flat)?,
            None => flat,
        };
        let seq = normed.transpose(1, 2)?;
        let inner = self.to_q.weight.tensor().dims()[1];
        let hd = inner / self.heads;
        let split = |l: &Linear| -> Result<Tensor> {
            Ok(l.forward(&seq)?
                .reshape(&[n, hw, self.heads, hd])?
                .transpose(1, 2)?)
        };
        let (q, k, v) = (split(&self.to_q)?, split(&self.to_k)?, split(&self.to_v)?);
        let scores = q
            .matmul(&k.transpose(2, 3)?)?
            .mul(1.0 / (hd as f64).sqrt())?;
        let o = scores.softmax(-1)?.matmul(&v)?;
        let o = o.transpose(1, 2)?.reshape(&[n, hw, inner])?;
        let o = self.to_out.forward(&o)?.transpose(1, 2)?.reshape(&d)?;
        let y = o.add(x)?;
        Ok(if self.rescale == 1.0 {
            y
        } else {
            y.div(self.rescale)?
        })
    }

    pub(crate) fn visit(&self, p: &str, out: &mut Vec<(String, Param)>) {
        if let Some(g) = &self.group_norm {
            g.visit_params(&join(p, "group_norm"), out);
        }
        self.to_q.visit_params(&join(p, "to_q"), out);
        self.to_k.visit_params(&join(p, "to_k"), out);
        self.to_v.visit_params(&join(p, "to_v"), out);
        self.to_out.visit_params(&join(p, "to_out.0"), out);
    }
}

/// A down block's `downsamplers.0` or an up block's `upsamplers.0`.
pub(crate) enum Resample {
    /// Strided convolution (down) or nearest doubling then convolution (up).
    Conv(Conv, Inner),
    /// A residual block resampling inside.
    Resnet(Box<ResnetBlock>),
}

impl Resample {
    pub(crate) fn forward(&self, x: &Tensor, temb_act: &Tensor) -> Result<Tensor> {
        match self {
            Resample::Conv(c, Inner::Up) => c.forward(&upsample2x(x)?),
            Resample::Conv(c, _) => c.forward(x),
            Resample::Resnet(r) => r.forward(x, temb_act),
        }
    }

    pub(crate) fn visit(&self, p: &str, out: &mut Vec<(String, Param)>) {
        match self {
            Resample::Conv(c, _) => c.visit(&join(p, "conv"), out),
            Resample::Resnet(r) => r.visit(p, out),
        }
    }
}
