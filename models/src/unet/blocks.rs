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
use lazyfuse::{Device, Tensor};

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

/// Reads the layers of one checkpoint onto one device, trainable.
pub(crate) struct Weights<'a> {
    pub(crate) ck: &'a Checkpoint,
    pub(crate) dev: &'a Device,
}

impl Weights<'_> {
    /// The shape of `name`, or an `Err` naming it.
    pub(crate) fn shape(&self, name: &str) -> Result<Vec<usize>> {
        self.ck
            .shape(name)
            .ok_or_else(|| ck(format!("checkpoint has no {name:?}")))
    }

    fn tensor(&self, name: &str, dims: &[usize]) -> Result<Param> {
        let v = self.ck.f32(name, dims)?;
        Ok(Param::new(Tensor::from_slice(&v, dims, self.dev)?)?)
    }

    /// `prefix.weight` `[o, i, k, k]` and `prefix.bias` `[o]`, stride 1,
    /// "same" padding.
    pub(crate) fn conv(&self, prefix: &str) -> Result<Conv> {
        let name = format!("{prefix}.weight");
        let shape = self.shape(&name)?;
        if shape.len() != 4 || shape[2] != shape[3] {
            return Err(ck(format!(
                "{name:?} must be a square 2-D convolution kernel, got {shape:?}"
            )));
        }
        let p = (shape[2] / 2) as i64;
        Ok(Conv {
            weight: self.tensor(&name, &shape)?,
            bias: self.tensor(&format!("{prefix}.bias"), &shape[..1])?,
            stride: 1,
            pad: [(p, p), (p, p)],
        })
    }

    /// A PyTorch `[out, in]` linear layer with bias, trainable.
    pub(crate) fn linear(&self, prefix: &str) -> Result<Linear> {
        let shape = self.shape(&format!("{prefix}.weight"))?;
        let [out, inp] = shape[..] else {
            return Err(ck(format!(
                "{prefix:?}.weight must be [out, in], got {shape:?}"
            )));
        };
        let frozen = Loader {
            ck: self.ck,
            dev: self.dev,
        }
        .linear(prefix, inp, out, true)?;
        Ok(Linear {
            weight: Param::new(frozen.weight.tensor())?,
            bias: frozen.bias.map(|b| Param::new(b.tensor())).transpose()?,
        })
    }

    /// `prefix.weight` and `prefix.bias` as a group norm over `groups`.
    pub(crate) fn group_norm(&self, prefix: &str, groups: usize, eps: f64) -> Result<GroupNorm> {
        let c = self.shape(&format!("{prefix}.weight"))?;
        let w = self.tensor(&format!("{prefix}.weight"), &c)?.tensor();
        let b = self.tensor(&format!("{prefix}.bias"), &c)?.tensor();
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

    pub(crate) fn out_channels(&self) -> usize {
        self.bias.tensor().dims()[0]
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
    pub(crate) fn load(
        w: &Weights,
        p: &str,
        cfg: BlockCfg,
        output_scale: f64,
        inner: Inner,
    ) -> Result<ResnetBlock> {
        let shortcut = format!("{p}.conv_shortcut.weight");
        Ok(ResnetBlock {
            norm1: w.group_norm(&format!("{p}.norm1"), cfg.groups, cfg.eps)?,
            conv1: w.conv(&format!("{p}.conv1"))?,
            time_emb_proj: w.linear(&format!("{p}.time_emb_proj"))?,
            norm2: w.group_norm(&format!("{p}.norm2"), cfg.groups, cfg.eps)?,
            conv2: w.conv(&format!("{p}.conv2"))?,
            conv_shortcut: if w.ck.contains(&shortcut) {
                Some(w.conv(&format!("{p}.conv_shortcut"))?)
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
    pub(crate) fn load(
        w: &Weights,
        p: &str,
        heads: usize,
        groups: Option<usize>,
        eps: f64,
        rescale: f64,
    ) -> Result<SpatialAttention> {
        let group_norm = match groups {
            Some(g) => Some(w.group_norm(&format!("{p}.group_norm"), g, eps)?),
            None => None,
        };
        let to_q = w.linear(&format!("{p}.to_q"))?;
        let inner = to_q.weight.tensor().dims()[1];
        if heads == 0 || inner % heads != 0 {
            return Err(ck(format!(
                "{p}.to_q has {inner} outputs, not a multiple of the {heads} heads"
            )));
        }
        Ok(SpatialAttention {
            group_norm,
            to_q,
            to_k: w.linear(&format!("{p}.to_k"))?,
            to_v: w.linear(&format!("{p}.to_v"))?,
            to_out: w.linear(&format!("{p}.to_out.0"))?,
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
