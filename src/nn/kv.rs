//! Incremental decoding: a key/value cache for [`CausalSelfAttention`] and
//! [`Block`], grown with `cat` one step at a time.
//!
//! The cache is written the way an eager user writes it (Hugging Face's
//! dynamic cache): no capacity, no padding, no positions to track. Its
//! sequence axis becomes dynamic by itself after the first growth
//! (`Tensor`'s dynamic dimensions), so a decode loop compiles a handful of
//! executables, one per capacity bucket, instead of one per step.

use super::{Block, CausalSelfAttention, Module};
use crate::{DType, Error, Result, Tensor};
use std::panic::Location;

/// One layer's cached keys and values, `[B, heads, S, head_dim]` each.
#[derive(Clone, Default)]
pub struct LayerCache {
    kv: Option<(Tensor, Tensor)>,
}

impl LayerCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached keys and values, if any.
    pub fn get(&self) -> Option<&(Tensor, Tensor)> {
        self.kv.as_ref()
    }
}

/// A cache for every layer of a model.
#[derive(Clone, Default)]
pub struct KvCache {
    /// One entry per block, in order.
    pub layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `n_layers` blocks.
    pub fn new(n_layers: usize) -> Self {
        KvCache {
            layers: vec![LayerCache::new(); n_layers],
        }
    }

    /// Positions cached so far (those of the first layer).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CausalSelfAttention {
    /// [`Module::forward`] for `x` (`[B, T, C]`) at positions `P..P+T`, where
    /// `P` is `cache.len()`: queries attend to every cached position and to
    /// the new ones up to their own; the new keys and values are appended.
    #[track_caller]
    pub fn forward_cached(&self, x: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(Error::op(
                "CausalSelfAttention::forward_cached",
                format!("needs a [B, T, C] input, got rank {}", x.rank()),
                x.describe(),
                Location::caller(),
            ));
        }
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let hd = c / self.n_head;
        let [q, mut k, mut v] = self.heads(x)?;
        if let Some((pk, pv)) = &cache.kv {
            k = Tensor::cat(&[pk, &k], 2)?;
            v = Tensor::cat(&[pv, &v], 2)?;
        }
        cache.kv = Some((k.clone(), v.clone()));
        let s = k.dims()[2];
        let mut att = q
            .matmul(&k.transpose(-1, -2)?)?
            .mul_scalar(1.0 / (hd as f64).sqrt())?;
        if t > 1 {
            // Query i (position s - t + i) sees keys up to its own position.
            let rows = Tensor::arange(0.0, t as f64, DType::I64, x.device())?
                .add_scalar((s - t) as f64)?;
            let cols = Tensor::arange(0.0, s as f64, DType::I64, x.device())?;
            let future = cols.unsqueeze(0)?.gt(&rows.unsqueeze(1)?)?;
            att = att.masked_fill(&future, f64::NEG_INFINITY)?;
        }
        let att = self.attn_drop.forward(&att.softmax(-1)?)?;
        let y = att
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, t, c])?;
        self.resid_drop.forward(&self.c_proj.forward(&y)?)
    }
}

impl Block {
    /// [`Module::forward`] with the attention's keys and values cached
    /// (see [`CausalSelfAttention::forward_cached`]).
    #[track_caller]
    pub fn forward_cached(&self, x: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        let x = x.add(&self.attn.forward_cached(&self.ln_1.forward(x)?, cache)?)?;
        let m = self.c_fc.forward(&self.ln_2.forward(&x)?)?.gelu()?;
        x.add(&self.drop.forward(&self.c_proj.forward(&m)?)?)
    }
}
