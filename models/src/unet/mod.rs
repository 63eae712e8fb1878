//! diffusers' `UNet2DModel`, loaded from a diffusers checkpoint directory
//! (`config.json` and `diffusion_pytorch_model.safetensors`, or
//! `model.safetensors`) with diffusers' parameter names
//! (`conv_in.weight`, `down_blocks.1.attentions.0.to_q.weight`,
//! `mid_block.resnets.0.norm1.bias`, `up_blocks.0.upsamplers.0.conv.weight`).
//!
//! The denoiser of DDPM/DDIM image diffusion: a sinusoidal timestep
//! embedding through an MLP, a down path of residual (and attention)
//! blocks that halves the resolution per level, a mid block, and an up
//! path that concatenates the down path's outputs as skips. The samplers
//! that drive it are in [`crate::diffusion`].

mod blocks;
pub mod config;

use crate::weights::Checkpoint;
use crate::{ModelError, Result};
use blocks::{act, BlockCfg, Conv, Init, Inner, Resample, ResnetBlock, SpatialAttention, Weights};
pub use config::{Activation, Resampler, UNet2DConfig};
use lazyfuse::nn::{join, GroupNorm, Linear, Module, Param};
use lazyfuse::{DType, Device, Tensor};
use std::cell::Cell;
use std::path::Path;

/// A down or up block: residual blocks, each followed by attention in the
/// `Attn*` kinds, then the resampler unless it is the last level.
struct Level {
    resnets: Vec<ResnetBlock>,
    attentions: Vec<SpatialAttention>,
    resample: Option<Resample>,
}

impl Level {
    fn layer(&self, i: usize, h: &Tensor, temb_act: &Tensor) -> Result<Tensor> {
        let h = self.resnets[i].forward(h, temb_act)?;
        match self.attentions.get(i) {
            Some(a) => a.forward(&h),
            None => Ok(h),
        }
    }

    fn visit(&self, p: &str, out: &mut Vec<(String, Param)>) {
        for (i, r) in self.resnets.iter().enumerate() {
            r.visit(&format!("{p}.resnets.{i}"), out);
        }
        for (i, a) in self.attentions.iter().enumerate() {
            a.visit(&format!("{p}.attentions.{i}"), out);
        }
    }
}

/// diffusers' `UNet2DModel` (see the module docs). Parameters are
/// trainable; [`Module::parameters`] lists them under diffusers' names.
pub struct UNet2DModel {
    /// The configuration it was built from.
    pub config: UNet2DConfig,
    /// `[half]` sinusoid frequencies of the timestep embedding.
    freqs: Vec<f32>,
    conv_in: Conv,
    linear_1: Linear,
    linear_2: Linear,
    class_embedding: Option<Param>,
    down: Vec<Level>,
    mid: Option<(Vec<ResnetBlock>, Vec<SpatialAttention>)>,
    up: Vec<Level>,
    conv_norm_out: GroupNorm,
    conv_out: Conv,
}

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

impl UNet2DModel {
    /// Loads a diffusers UNet2DModel directory: `config.json` and
    /// `diffusion_pytorch_model.safetensors` (or `model.safetensors`,
    /// sharded or not). A missing or misshapen tensor, or a config this
    /// port does not build, is an `Err` naming it.
    pub fn load(dir: &Path, dev: &Device) -> Result<UNet2DModel> {
        let config = UNet2DConfig::load(dir)?;
        let stem = ["diffusion_pytorch_model", "model"]
            .into_iter()
            .find(|s| {
                dir.join(format!("{s}.safetensors")).is_file()
                    || dir.join(format!("{s}.safetensors.index.json")).is_file()
            })
            .unwrap_or("diffusion_pytorch_model");
        let c = Checkpoint::open_stem(dir, stem)?;
        UNet2DModel::from_checkpoint(config, &c, dev)
    }

    /// Builds the model of `config` from `c`'s tensors.
    pub fn from_checkpoint(
        config: UNet2DConfig,
        c: &Checkpoint,
        dev: &Device,
    ) -> Result<UNet2DModel> {
        let w = Weights {
            ck: Some(c),
            dev,
            seed: Cell::new(0),
        };
        UNet2DModel::build(config, &w)
    }

    /// A freshly initialised model of `config` (PyTorch's layer
    /// initialisation, drawn from `seed`): for training from scratch and
    /// for benchmarks.
    pub fn random(config: UNet2DConfig, seed: u64, dev: &Device) -> Result<UNet2DModel> {
        let w = Weights {
            ck: None,
            dev,
            seed: Cell::new(seed),
        };
        UNet2DModel::build(config, &w)
    }

    /// Every layer, with the channel arithmetic of diffusers' constructors.
    fn build(config: UNet2DConfig, w: &Weights) -> Result<UNet2DModel> {
        let cfg = BlockCfg {
            groups: config.norm_num_groups,
            eps: config.norm_eps,
            act: config.act_fn,
            scale_shift: config.scale_shift,
        };
        let chans = config.block_out_channels.clone();
        let levels = chans.len();
        let (c0, temb) = (chans[0], config.time_embed_dim);
        let half = c0 / 2;
        // diffusers: exp(-ln(10000) * i / (half - shift)) in float32.
        let denom = half as f32 - config.freq_shift as f32;
        let freqs = (0..half)
            .map(|i| ((-(10000f32.ln()) * i as f32) / denom).exp())
            .collect();
        let attention = |p: &str, ch: usize, groups: Option<usize>, rescale: f64| {
            SpatialAttention::load(w, p, config.attention(ch), groups, config.norm_eps, rescale)
        };
        let resnet = |p: &str, cin: usize, cout: usize, scale: f64, inner: Inner| {
            ResnetBlock::load(w, p, (cin, cout, temb), cfg, scale, inner)
        };
        let conv_in = w.conv("conv_in", config.in_channels, c0, 3)?;
        let mut down = Vec::new();
        for (i, &attn) in config.down_attention.iter().enumerate() {
            let p = format!("down_blocks.{i}");
            let (cin, cout) = (chans[i.saturating_sub(1)], chans[i]);
            let mut resnets = Vec::new();
            let mut attentions = Vec::new();
            for j in 0..config.layers_per_block {
                let from = if j == 0 { cin } else { cout };
                resnets.push(resnet(
                    &format!("{p}.resnets.{j}"),
                    from,
                    cout,
                    1.0,
                    Inner::None,
                )?);
                if attn {
                    let a = format!("{p}.attentions.{j}");
                    attentions.push(attention(&a, cout, Some(cfg.groups), 1.0)?);
                }
            }
            let q = format!("{p}.downsamplers.0");
            let resample = if i + 1 == levels {
                None
            } else if attn && config.downsample_type == Resampler::Resnet {
                Some(Resample::Resnet(Box::new(resnet(
                    &q,
                    cout,
                    cout,
                    1.0,
                    Inner::Down,
                )?)))
            } else {
                let conv = w.conv(&format!("{q}.conv"), cout, cout, 3)?;
                Some(Resample::Conv(
                    conv.strided(config.downsample_padding),
                    Inner::Down,
                ))
            };
            down.push(Level {
                resnets,
                attentions,
                resample,
            });
        }
        let top = chans[levels - 1];
        let mid = if config.mid_block {
            let s = config.mid_block_scale_factor;
            let r0 = resnet("mid_block.resnets.0", top, top, s, Inner::None)?;
            let r1 = resnet("mid_block.resnets.1", top, top, s, Inner::None)?;
            let groups = match config.attn_norm_num_groups {
                Some(g) => Some(g),
                None if !config.scale_shift => Some(cfg.groups),
                None => None,
            };
            let attentions = if config.add_attention {
                vec![attention("mid_block.attentions.0", top, groups, s)?]
            } else {
                Vec::new()
            };
            Some((vec![r0, r1], attentions))
        } else {
            None
        };
        let rev: Vec<usize> = chans.iter().rev().copied().collect();
        let mut up = Vec::new();
        for (i, &attn) in config.up_attention.iter().enumerate() {
            let p = format!("up_blocks.{i}");
            let prev = rev[i.saturating_sub(1)];
            let cout = rev[i];
            let skip_in = rev[(i + 1).min(levels - 1)];
            let n = config.layers_per_block + 1;
            let mut resnets = Vec::new();
            let mut attentions = Vec::new();
            for j in 0..n {
                let skip = if j + 1 == n { skip_in } else { cout };
                let from = if j == 0 { prev } else { cout };
                let r = resnet(
                    &format!("{p}.resnets.{j}"),
                    from + skip,
                    cout,
                    1.0,
                    Inner::None,
                )?;
                resnets.push(r);
                if attn {
                    let a = format!("{p}.attentions.{j}");
                    attentions.push(attention(&a, cout, Some(cfg.groups), 1.0)?);
                }
            }
            let q = format!("{p}.upsamplers.0");
            let resample = if i + 1 == levels {
                None
            } else if attn && config.upsample_type == Resampler::Resnet {
                Some(Resample::Resnet(Box::new(resnet(
                    &q,
                    cout,
                    cout,
                    1.0,
                    Inner::Up,
                )?)))
            } else {
                let conv = w.conv(&format!("{q}.conv"), cout, cout, 3)?;
                Some(Resample::Conv(conv, Inner::Up))
            };
            up.push(Level {
                resnets,
                attentions,
                resample,
            });
        }
        let class_embedding = match config.num_class_embeds {
            Some(n) => Some(w.tensor("class_embedding.weight", &[n, temb], Init::Normal)?),
            None => None,
        };
        Ok(UNet2DModel {
            freqs,
            conv_in,
            linear_1: w.linear("time_embedding.linear_1", c0, temb)?,
            linear_2: w.linear("time_embedding.linear_2", temb, temb)?,
            class_embedding,
            down,
            mid,
            up,
            conv_norm_out: w.group_norm("conv_norm_out", cfg.groups, c0, cfg.eps)?,
            conv_out: w.conv("conv_out", c0, config.out_channels, 3)?,
            config,
        })
    }

    /// The sinusoidal embedding `[n, c0]` of timesteps `[n]` (float).
    fn time_proj(&self, t: &Tensor) -> Result<Tensor> {
        let half = self.freqs.len();
        let f = Tensor::from_slice(&self.freqs, &[1, half], t.device())?;
        let n = t.dims()[0];
        let e = t.reshape(&[n, 1])?.mul(&f)?;
        let (sin, cos) = (e.sin()?, e.cos()?);
        let parts = if self.config.flip_sin_to_cos {
            [&cos, &sin]
        } else {
            [&sin, &cos]
        };
        let emb = Tensor::cat(&parts, 1)?;
        let c0 = self.config.block_out_channels[0];
        Ok(if 2 * half < c0 {
            // An odd width: diffusers pads a zero column.
            Tensor::cat(&[&emb, &Tensor::zeros(&[n, 1], DType::F32, t.device())?], 1)?
        } else {
            emb
        })
    }

    /// The predicted noise (or sample, per the scheduler's training)
    /// `[n, out_channels, h, w]` for `sample [n, in_channels, h, w]` at
    /// `timesteps` (a scalar, `[1]` or `[n]`, any numeric dtype).
    pub fn forward(&self, sample: &Tensor, timesteps: &Tensor) -> Result<Tensor> {
        self.forward_with_class(sample, timesteps, None)
    }

    /// [`UNet2DModel::forward`] with class labels `[n]` (integer) for a
    /// class-conditional model (`num_class_embeds` in the config).
    pub fn forward_with_class(
        &self,
        sample: &Tensor,
        timesteps: &Tensor,
        class_labels: Option<&Tensor>,
    ) -> Result<Tensor> {
        let d = sample.dims();
        let m = 1 << (self.down.len() - 1);
        if d.len() != 4 || d[1] != self.config.in_channels || d[2] % m != 0 || d[3] % m != 0 {
            return Err(ModelError::Input(format!(
                "UNet2DModel: sample must be [n, {}, h, w] with h and w divisible by 2^{}, got {d:?}",
                self.config.in_channels,
                self.down.len() - 1
            )));
        }
        let n = d[0];
        let t = timesteps.to_dtype(DType::F32)?;
        let t = match t.numel() {
            1 => t.reshape(&[1])?.broadcast_to(&[n])?,
            m if m == n && t.rank() == 1 => t,
            _ => {
                return Err(ModelError::Input(format!(
                    "UNet2DModel: timesteps must be a scalar, [1] or [{n}], got {:?}",
                    timesteps.dims()
                )))
            }
        };
        let mut emb = self.linear_2.forward(&act(
            Activation::Silu,
            &self.linear_1.forward(&self.time_proj(&t)?)?,
        )?)?;
        match (&self.class_embedding, class_labels) {
            (Some(table), Some(ids)) => emb = emb.add(&table.tensor().index_select(0, ids)?)?,
            (Some(_), None) => {
                return Err(ModelError::Input(
                    "this UNet is class-conditional: pass class_labels".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(ModelError::Input(
                    "class_labels given but the UNet has no class embedding".into(),
                ))
            }
            (None, None) => {}
        }
        let temb_act = act(self.config.act_fn, &emb)?;
        let x = if self.config.center_input_sample {
            sample.mul(2.0)?.sub(1.0)?
        } else {
            sample.clone()
        };
        let mut h = self.conv_in.forward(&x)?;
        let mut skips = vec![h.clone()];
        for level in &self.down {
            for i in 0..level.resnets.len() {
                h = level.layer(i, &h, &temb_act)?;
                skips.push(h.clone());
            }
            if let Some(r) = &level.resample {
                h = r.forward(&h, &temb_act)?;
                skips.push(h.clone());
            }
        }
        if let Some((resnets, attentions)) = &self.mid {
            h = resnets[0].forward(&h, &temb_act)?;
            if let Some(a) = attentions.first() {
                h = a.forward(&h)?;
            }
            h = resnets[1].forward(&h, &temb_act)?;
        }
        for level in &self.up {
            for i in 0..level.resnets.len() {
                let skip = skips
                    .pop()
                    .ok_or_else(|| ck("the up path needs more skips than the down path made"))?;
                h = Tensor::cat(&[&h, &skip], 1)?;
                h = level.layer(i, &h, &temb_act)?;
            }
            if let Some(r) = &level.resample {
                h = r.forward(&h, &temb_act)?;
            }
        }
        let h = act(self.config.act_fn, &self.conv_norm_out.forward(&h)?)?;
        self.conv_out.forward(&h)
    }
}

impl Module for UNet2DModel {
    /// [`UNet2DModel::forward`] at timestep 0 (the trait has one input;
    /// call `forward` with timesteps directly).
    fn forward(&self, x: &Tensor) -> lazyfuse::Result<Tensor> {
        let t = Tensor::zeros(&[1], DType::F32, x.device())?;
        UNet2DModel::forward(self, x, &t).map_err(|e| match e {
            ModelError::Tensor(t) => t,
            other => lazyfuse::Error::Internal(other.to_string()),
        })
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        let p = |s: &str| join(prefix, s);
        self.conv_in.visit(&p("conv_in"), out);
        self.linear_1
            .visit_params(&p("time_embedding.linear_1"), out);
        self.linear_2
            .visit_params(&p("time_embedding.linear_2"), out);
        if let Some(t) = &self.class_embedding {
            out.push((p("class_embedding.weight"), t.clone()));
        }
        for (i, level) in self.down.iter().enumerate() {
            let b = p(&format!("down_blocks.{i}"));
            level.visit(&b, out);
            if let Some(r) = &level.resample {
                r.visit(&format!("{b}.downsamplers.0"), out);
            }
        }
        if let Some((resnets, attentions)) = &self.mid {
            for (i, r) in resnets.iter().enumerate() {
                r.visit(&p(&format!("mid_block.resnets.{i}")), out);
            }
            for (i, a) in attentions.iter().enumerate() {
                a.visit(&p(&format!("mid_block.attentions.{i}")), out);
            }
        }
        for (i, level) in self.up.iter().enumerate() {
            let b = p(&format!("up_blocks.{i}"));
            level.visit(&b, out);
            if let Some(r) = &level.resample {
                r.visit(&format!("{b}.upsamplers.0"), out);
            }
        }
        self.conv_norm_out.visit_params(&p("conv_norm_out"), out);
        self.conv_out.visit(&p("conv_out"), out);
    }
}
