//! `UNet2DModel`'s config.json as diffusers writes it, with diffusers'
//! defaults for every key left out. Settings this port does not build
//! (Fourier or learned timestep embeddings, skip blocks, spatial
//! conditioning) are a [`ModelError::Config`] naming the key, never a
//! silently different model.

use crate::{ModelError, Result};
use serde_json::Value;
use std::path::Path;

fn cfg(msg: impl Into<String>) -> ModelError {
    ModelError::Config(msg.into())
}

/// The activation between layers (`act_fn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (`"silu"`, `"swish"`).
    Silu,
    /// Exact (erf) GELU (`"gelu"`).
    Gelu,
    /// `max(x, 0)` (`"relu"`).
    Relu,
}

/// How a down block halves the resolution, and an up block doubles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resampler {
    /// A strided 3x3 convolution (down) or nearest upsampling and a 3x3
    /// convolution (up): `"conv"`.
    Conv,
    /// A residual block that average-pools (down) or upsamples (up)
    /// inside: `"resnet"`.
    Resnet,
}

/// A `UNet2DModel` configuration (diffusers' field names).
#[derive(Clone, Debug)]
pub struct UNet2DConfig {
    /// Default spatial size of samples (`sample_size`), for sampling.
    pub sample_size: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Map the input from [0, 1] to [-1, 1] first.
    pub center_input_sample: bool,
    /// Width of the time embedding (`block_out_channels[0] * 4` by default).
    pub time_embed_dim: usize,
    /// Shift of the sinusoid's frequency denominator (`freq_shift`).
    pub freq_shift: f64,
    /// Cosines before sines in the timestep embedding.
    pub flip_sin_to_cos: bool,
    /// Down block kinds: `true` for `AttnDownBlock2D`, `false` for
    /// `DownBlock2D`.
    pub down_attention: Vec<bool>,
    /// Up block kinds: `true` for `AttnUpBlock2D`, `false` for `UpBlock2D`.
    pub up_attention: Vec<bool>,
    /// Whether there is a `UNetMidBlock2D`.
    pub mid_block: bool,
    /// Channels of each resolution level.
    pub block_out_channels: Vec<usize>,
    /// Residual blocks per down block (up blocks have one more).
    pub layers_per_block: usize,
    /// The mid block's residual scale (`mid_block_scale_factor`).
    pub mid_block_scale_factor: f64,
    /// Padding of the strided down-convolution; 0 pads one row and column
    /// at the end instead.
    pub downsample_padding: usize,
    /// Resampler of attention down blocks (plain down blocks always
    /// convolve).
    pub downsample_type: Resampler,
    /// Resampler of attention up blocks.
    pub upsample_type: Resampler,
    /// `act_fn`.
    pub act_fn: Activation,
    /// Channels per attention head (`None`: one head over all channels).
    pub attention_head_dim: Option<usize>,
    /// Groups of every group norm.
    pub norm_num_groups: usize,
    /// Groups of the mid block's attention norm (`None`: as the resnets',
    /// or no norm with scale-shift conditioning).
    pub attn_norm_num_groups: Option<usize>,
    /// Epsilon of every group norm.
    pub norm_eps: f64,
    /// `resnet_time_scale_shift == "scale_shift"`: the time embedding
    /// scales and shifts the normalised features instead of being added.
    pub scale_shift: bool,
    /// Whether the mid block has attention.
    pub add_attention: bool,
    /// Class conditioning: `Some(n)` for an `n`-row embedding table added
    /// to the time embedding.
    pub num_class_embeds: Option<usize>,
}

impl UNet2DConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<UNet2DConfig> {
        let p = dir.join("config.json");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| cfg(format!("cannot read {}: {e}", p.display())))?;
        UNet2DConfig::from_json(&text).map_err(|e| cfg(format!("{}: {e}", p.display())))
    }

    /// Parses a config.json body.
    pub fn from_json(text: &str) -> Result<UNet2DConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| cfg(e.to_string()))?;
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        let int = |k: &str, d: usize| -> Result<usize> {
            match get(k) {
                None => Ok(d),
                Some(x) => x
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| cfg(format!("{k:?} must be a non-negative integer"))),
            }
        };
        let opt_int = |k: &str| -> Result<Option<usize>> {
            get(k)
                .map(|x| {
                    x.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| cfg(format!("{k:?} must be an integer or null")))
                })
                .transpose()
        };
        let num = |k: &str, d: f64| -> Result<f64> {
            get(k).map_or(Ok(d), |x| {
                x.as_f64()
                    .ok_or_else(|| cfg(format!("{k:?} must be a number")))
            })
        };
        let boolean = |k: &str, d: bool| -> Result<bool> {
            get(k).map_or(Ok(d), |x| {
                x.as_bool()
                    .ok_or_else(|| cfg(format!("{k:?} must be true or false")))
            })
        };
        let string = |k: &str, d: &str| -> Result<String> {
            get(k).map_or(Ok(d.to_string()), |x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| cfg(format!("{k:?} must be a string")))
            })
        };
        let strings = |k: &str, d: &[&str]| -> Result<Vec<String>> {
            match get(k) {
                None => Ok(d.iter().map(|s| s.to_string()).collect()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| cfg(format!("{k:?} must list strings")))
                    })
                    .collect(),
                Some(_) => Err(cfg(format!("{k:?} must be a list"))),
            }
        };
        let block_out_channels: Vec<usize> = match get("block_out_channels") {
            None => vec![224, 448, 672, 896],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| cfg("\"block_out_channels\" must list integers"))?,
            Some(_) => return Err(cfg("\"block_out_channels\" must be a list")),
        };
        let kinds = |k: &str, d: &[&str], plain: &str, attn: &str| -> Result<Vec<bool>> {
            strings(k, d)?
                .iter()
                .map(|s| match s.as_str() {
                    x if x == plain => Ok(false),
                    x if x == attn => Ok(true),
                    other => Err(cfg(format!(
                        "{k:?}: block type {other:?} is not supported (only {plain:?} and {attn:?})"
                    ))),
                })
                .collect()
        };
        let down_attention = kinds(
            "down_block_types",
            &[
                "DownBlock2D",
                "AttnDownBlock2D",
                "AttnDownBlock2D",
                "AttnDownBlock2D",
            ],
            "DownBlock2D",
            "AttnDownBlock2D",
        )?;
        let up_attention = kinds(
            "up_block_types",
            &[
                "AttnUpBlock2D",
                "AttnUpBlock2D",
                "AttnUpBlock2D",
                "UpBlock2D",
            ],
            "UpBlock2D",
            "AttnUpBlock2D",
        )?;
        let levels = block_out_channels.len();
        if levels == 0 || down_attention.len() != levels || up_attention.len() != levels {
            return Err(cfg(format!(
                "block_out_channels ({levels}), down_block_types ({}) and up_block_types ({}) must have the same non-zero length",
                down_attention.len(),
                up_attention.len()
            )));
        }
        let mid_block = match get("mid_block_type") {
            None => true,
            Some(Value::String(s)) if s == "UNetMidBlock2D" => true,
            Some(other) => {
                return Err(cfg(format!(
                    "\"mid_block_type\" {other} is not supported (only \"UNetMidBlock2D\" or null)"
                )))
            }
        };
        // diffusers writes null for "no mid block".
        let mid_block = mid_block && !v.get("mid_block_type").is_some_and(Value::is_null);
        let time_embedding_type = string("time_embedding_type", "positional")?;
        if time_embedding_type != "positional" {
            return Err(cfg(format!(
                "\"time_embedding_type\" {time_embedding_type:?} is not supported (only \"positional\")"
            )));
        }
        if let Some(t) = get("class_embed_type") {
            return Err(cfg(format!(
                "\"class_embed_type\" {t} is not supported (only null, with num_class_embeds)"
            )));
        }
        let resampler = |k: &str| -> Result<Resampler> {
            match string(k, "conv")?.as_str() {
                "conv" => Ok(Resampler::Conv),
                "resnet" => Ok(Resampler::Resnet),
                other => Err(cfg(format!(
                    "{k:?} {other:?} is not supported (\"conv\" or \"resnet\")"
                ))),
            }
        };
        let act_fn = match string("act_fn", "silu")?.as_str() {
            "silu" | "swish" => Activation::Silu,
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            other => {
                return Err(cfg(format!(
                    "\"act_fn\" {other:?} is not supported (silu, swish, gelu, relu)"
                )))
            }
        };
        let scale_shift = match string("resnet_time_scale_shift", "default")?.as_str() {
            "default" => false,
            "scale_shift" => true,
            other => {
                return Err(cfg(format!(
                    "\"resnet_time_scale_shift\" {other:?} is not supported (default, scale_shift)"
                )))
            }
        };
        let sample_size = match get("sample_size") {
            Some(Value::Array(a)) => a.first().and_then(Value::as_u64).unwrap_or(32) as usize,
            _ => int("sample_size", 32)?,
        };
        let c = UNet2DConfig {
            sample_size,
            in_channels: int("in_channels", 3)?,
            out_channels: int("out_channels", 3)?,
            center_input_sample: boolean("center_input_sample", false)?,
            time_embed_dim: opt_int("time_embedding_dim")?.unwrap_or(block_out_channels[0] * 4),
            freq_shift: num("freq_shift", 0.0)?,
            flip_sin_to_cos: boolean("flip_sin_to_cos", true)?,
            down_attention,
            up_attention,
            mid_block,
            layers_per_block: int("layers_per_block", 2)?,
            mid_block_scale_factor: num("mid_block_scale_factor", 1.0)?,
            downsample_padding: int("downsample_padding", 1)?,
            downsample_type: resampler("downsample_type")?,
            upsample_type: resampler("upsample_type")?,
            act_fn,
            attention_head_dim: match v.get("attention_head_dim") {
                None => Some(8),
                Some(Value::Null) => None,
                Some(_) => opt_int("attention_head_dim")?,
            },
            norm_num_groups: int("norm_num_groups", 32)?,
            attn_norm_num_groups: opt_int("attn_norm_num_groups")?,
            norm_eps: num("norm_eps", 1e-5)?,
            scale_shift,
            add_attention: boolean("add_attention", true)?,
            num_class_embeds: opt_int("num_class_embeds")?,
            block_out_channels,
        };
        let bad_groups = c
            .block_out_channels
            .iter()
            .find(|&&ch| c.norm_num_groups == 0 || ch % c.norm_num_groups != 0);
        if let Some(ch) = bad_groups {
            return Err(cfg(format!(
                "norm_num_groups ({}) must divide every block width ({ch} does not)",
                c.norm_num_groups
            )));
        }
        if c.block_out_channels[0] < 2 {
            return Err(cfg("block_out_channels[0] must be at least 2"));
        }
        Ok(c)
    }

    /// `(channels, heads, head_dim)` of an attention block at width
    /// `channels`: `channels / attention_head_dim` heads (diffusers'
    /// rule), or one head over every channel when the dim is unset.
    pub(crate) fn attention(&self, channels: usize) -> (usize, usize, usize) {
        match self.attention_head_dim {
            Some(d) if d > 0 => (channels, channels / d, d),
            _ => (channels, 1, channels),
        }
    }
}
