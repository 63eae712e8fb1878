//! Incremental decoding: the one key/value cache, in two forms.
//!
//! - **Growing** ([`KvCache::new`]): written the way an eager user writes
//!   it (Hugging Face's dynamic cache), with `cat` one step at a time: no
//!   capacity, no padding, no positions to track. Its sequence axis becomes
//!   dynamic by itself after the first growth (`Tensor`'s dynamic
//!   dimensions), so a decode loop compiles one executable per capacity
//!   bucket, not one per step. [`CausalSelfAttention`] and [`Block`] use it.
//! - **Fixed** ([`KvCache::fixed`]): zeroed buffers of a set capacity,
//!   written in place with `dynamic_update_slice` at a run-time start, with
//!   each sequence's left padding; attention covers the whole capacity with
//!   the unwritten and padding columns masked ([`KvCache::masked`]). A step
//!   has the same shapes at every position, so it compiles exactly once;
//!   the Llama models and batched serving use it.

use super::{Block, CausalSelfAttention, Module};
use crate::{DType, Device, Error, Result, Tensor};

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

    /// Positions cached so far (the buffer's length for a fixed cache).
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

    /// Appends `k` and `v` along the sequence axis (a growing cache) and
    /// returns the whole keys and values.
    #[track_caller]
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let kv = match &self.kv {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2)?, Tensor::cat(&[pv, v], 2)?),
            None => (k.clone(), v.clone()),
        };
        self.kv = Some(kv.clone());
        Ok(kv)
    }
}

/// What a fixed cache tracks on the host.
#[derive(Clone)]
struct Fixed {
    capacity: usize,
    /// Columns written so far (padding included).
    len: usize,
    /// Leading padding columns of each sequence (left-padded prompts).
    pads: Vec<usize>,
    /// This step's write position as a device scalar, made on the first
    /// write of the step and shared by every layer.
    start: Option<Tensor>,
}

/// A cache for every layer of a model: growing or fixed (see the module
/// documentation).
#[derive(Clone, Default)]
pub struct KvCache {
    /// One entry per layer, in order.
    pub layers: Vec<LayerCache>,
    fixed: Option<Fixed>,
}

impl KvCache {
    /// An empty growing cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        KvCache {
            layers: vec![LayerCache::new(); n_layers],
            fixed: None,
        }
    }

    /// A fixed cache of `n_layers` layers with zeroed `[batch, heads,
    /// capacity, head_dim]` buffers, `batch = pads.len()`: sequence `i`
    /// starts after `pads[i]` padding columns, which are never attended to.
    #[track_caller]
    pub fn fixed(
        n_layers: usize,
        pads: &[usize],
        heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let dims = [pads.len(), heads, capacity, head_dim];
        let mut layers = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            let zeros = || Tensor::zeros(&dims, dtype, device);
            layers.push(LayerCache {
                kv: Some((zeros()?, zeros()?)),
            });
        }
        Ok(KvCache {
            layers,
            fixed: Some(Fixed {
                capacity,
                len: 0,
                pads: pads.to_vec(),
                start: None,
            }),
        })
    }

    /// Positions cached so far (those of the first layer; padding included).
    pub fn len(&self) -> usize {
        match &self.fixed {
            Some(f) => f.len,
            None => self.layers.first().map_or(0, LayerCache::len),
        }
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Columns a fixed cache holds; `None` for a growing one.
    pub fn capacity(&self) -> Option<usize> {
        self.fixed.as_ref().map(|f| f.capacity)
    }

    /// Sequences held: a fixed cache's, or the first layer's batch.
    pub fn batch(&self) -> usize {
        match &self.fixed {
            Some(f) => f.pads.len(),
            None => self
                .layers
                .first()
                .and_then(LayerCache::get)
                .map_or(0, |(k, _)| k.dims()[0]),
        }
    }

    /// Writes layer `i`'s keys and values for the step's `t` new columns
    /// (`[B, heads, t, head_dim]`) and returns the layer's whole keys and
    /// values: appended to a growing cache; written at column `len()` of a
    /// fixed one (`Err` past its capacity). Call [`KvCache::advance`] once
    /// every layer is written.
    #[track_caller]
    pub fn write(&mut self, i: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let loc = crate::site::caller();
        let layer = self.layers.get_mut(i).ok_or_else(|| {
            Error::op("KvCache::write", format!("no layer {i}"), k.describe(), loc)
        })?;
        let Some(f) = &mut self.fixed else {
            return layer.append(k, v);
        };
        let t = k.dims().get(2).copied().unwrap_or(0);
        if f.len + t > f.capacity {
            let m = format!(
                "the cache holds {} columns: {} used, {t} more asked for",
                f.capacity, f.len
            );
            return Err(Error::op("KvCache::write", m, k.describe(), loc));
        }
        let start = match &f.start {
            Some(s) => s.clone(),
            None => {
                let s = Tensor::from_slice(&[f.len as i32], &[], k.device())?;
                f.start = Some(s.clone());
                s
            }
        };
        let (pk, pv) = layer
            .kv
            .as_ref()
            .expect("a fixed cache's layers hold buffers");
        let kv = (
            pk.dynamic_update_slice(k, 2, &start)?,
            pv.dynamic_update_slice(v, 2, &start)?,
        );
        layer.kv = Some(kv.clone());
        Ok(kv)
    }

    /// `t` more columns were written to every layer (a fixed cache's
    /// position; a growing cache counts its columns itself).
    pub fn advance(&mut self, t: usize) {
        if let Some(f) = &mut self.fixed {
            f.len += t;
            f.start = None;
        }
    }

    /// The rotary position of each of the next `t` columns, per sequence,
    /// counted from its first real token (padding columns get 0; they are
    /// never attended to).
    pub fn positions(&self, t: usize) -> Vec<Vec<usize>> {
        let len = self.len();
        self.pads()
            .iter()
            .map(|&pad| (len..len + t).map(|c| c.saturating_sub(pad)).collect())
            .collect()
    }

    /// `[batch, 1, t, columns]` flattened, `columns` the capacity (a fixed
    /// cache) or `len() + t`: true where query column `len() + q` must not
    /// see key column `k` (a later column, or padding).
    pub fn masked(&self, t: usize) -> Vec<bool> {
        let len = self.len();
        let cols = self.capacity().unwrap_or(len + t);
        let pads = self.pads();
        let mut m = Vec::with_capacity(pads.len() * t * cols);
        for &pad in &pads {
            for q in len..len + t {
                m.extend((0..cols).map(|k| k > q || k < pad));
            }
        }
        m
    }

    /// Each sequence's padding columns (none in a growing cache).
    fn pads(&self) -> Vec<usize> {
        match &self.fixed {
            Some(f) => f.pads.clone(),
            None => vec![0; self.batch()],
        }
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
                crate::site::caller(),
            ));
        }
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let hd = c / self.n_head;
        let [q, k, v] = self.heads(x)?;
        let (k, v) = cache.append(&k, &v)?;
        let s = k.dims()[2];
        let mut att = q
            .matmul(&k.transpose(-1, -2)?)?
            .mul(1.0 / (hd as f64).sqrt())?;
        if t > 1 {
            // Query i (position s - t + i) sees keys up to its own position.
            let rows =
                Tensor::arange(0.0, t as f64, DType::I64, x.device())?.add((s - t) as f64)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_positions_follow_padding() {
        let d = Device::interpreter();
        let c = KvCache::fixed(0, &[0, 2], 1, 4, 1, DType::F32, &d).unwrap();
        assert_eq!(c.positions(3), vec![vec![0, 1, 2], vec![0, 0, 0]]);
        let m = c.masked(1);
        // Sequence 0, query column 0: sees key 0 only.
        assert_eq!(&m[0..4], &[false, true, true, true]);
        // Sequence 1 (two padding columns), query 0: sees nothing real.
        assert_eq!(&m[4..8], &[true, true, true, true]);
    }

    #[test]
    fn a_fixed_cache_writes_at_its_position_and_refuses_past_capacity() {
        let d = Device::interpreter();
        let mut c = KvCache::fixed(1, &[0], 1, 3, 2, DType::F32, &d).unwrap();
        for step in 0..3 {
            let k = Tensor::full(step as f64 + 1.0, &[1, 1, 1, 2], DType::F32, &d).unwrap();
            let (ka, _) = c.write(0, &k, &k).unwrap();
            c.advance(1);
            let got = ka.to_vec::<f32>().unwrap();
            let want: Vec<f32> = (0..3)
                .flat_map(|j| [if j <= step { j as f32 + 1.0 } else { 0.0 }; 2])
                .collect();
            assert_eq!(got, want, "step {step}");
        }
        let k = Tensor::zeros(&[1, 1, 1, 2], DType::F32, &d).unwrap();
        assert!(c.write(0, &k, &k).is_err());
        assert_eq!((c.len(), c.capacity(), c.batch()), (3, Some(3), 1));
    }

    #[test]
    fn a_growing_cache_appends() {
        let d = Device::interpreter();
        let mut c = KvCache::new(2);
        let k = Tensor::ones(&[1, 1, 2, 2], DType::F32, &d).unwrap();
        c.write(0, &k, &k).unwrap();
        let (ka, _) = c.write(0, &k, &k).unwrap();
        assert_eq!(ka.dims(), &[1, 1, 4, 2]);
        assert_eq!((c.len(), c.capacity(), c.batch()), (4, None, 1));
        assert_eq!(c.masked(1).len(), 5);
    }
}
