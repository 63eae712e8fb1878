//! DLRM, the deep learning recommendation model, in the layout of the
//! reference implementation (facebookresearch/dlrm, `dlrm_s_pytorch.py`):
//! a bottom MLP over the dense features (`bot_l.0`, `bot_l.2`, ... with
//! ReLUs between), one sum-mode embedding bag per sparse feature
//! (`emb_l.<k>.weight`), the pairwise dot-product interaction of the bottom
//! output and the bags (strictly lower triangle, the bottom output kept
//! alongside), and a top MLP ending in a sigmoid (`top_l.0`, ...).
//!
//! The embedding tables use sparse gradients ([`lazyfuse::nn::EmbeddingBag`]
//! in sparse mode): a training step updates only the rows it read, in place,
//! with [`lazyfuse::optim::SparseSgd`], as the reference trains with
//! `sparse=True` and SGD.

use crate::weights::{Checkpoint, Loader};
use crate::{ModelError, Result};
use lazyfuse::nn::{join, EmbeddingBag, Linear, Module, Param};
use lazyfuse::{Device, Tensor};
use std::path::Path;

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

/// The sizes of a DLRM: `bottom` and `top` list every layer width, input
/// first (`bottom` ends at the embedding dim; `top` starts at the
/// interaction's width, [`DlrmConfig::top_input`], and ends at 1).
#[derive(Clone, Debug)]
pub struct DlrmConfig {
    /// Bottom MLP widths, from the dense feature count to the embedding dim.
    pub bottom: Vec<usize>,
    /// Rows of each sparse feature's table.
    pub tables: Vec<usize>,
    /// Top MLP widths after the interaction, ending at 1.
    pub top_hidden: Vec<usize>,
}

impl DlrmConfig {
    /// The embedding dim (the bottom MLP's output).
    pub fn dim(&self) -> usize {
        *self.bottom.last().unwrap_or(&0)
    }

    /// Width of the interaction: the bottom output and one dot product per
    /// pair of the `1 + tables` feature vectors.
    pub fn top_input(&self) -> usize {
        let f = 1 + self.tables.len();
        self.dim() + f * (f - 1) / 2
    }
}

/// A DLRM (see the module doc).
pub struct Dlrm {
    bottom: Vec<Linear>,
    /// One sparse embedding bag per sparse feature.
    pub tables: Vec<EmbeddingBag>,
    top: Vec<Linear>,
}

/// A trainable linear layer from the checkpoint's PyTorch `[out, in]`
/// weight (the loader's own layers are frozen inference weights).
fn trainable(l: &Loader<'_>, prefix: &str, inp: usize, out: usize) -> Result<Linear> {
    let f = l.linear(prefix, inp, out, true)?;
    Ok(Linear {
        weight: Param::new(f.weight.tensor())?,
        bias: f.bias.map(|b| Param::new(b.tensor())).transpose()?,
    })
}

impl Dlrm {
    /// A fresh model initialised as the reference does it: linear weights
    /// normal with std `sqrt(2 / (in + out))`, biases normal with std
    /// `sqrt(1 / out)`, tables uniform in `±sqrt(1 / rows)`.
    pub fn new(cfg: &DlrmConfig, seed: u64, dev: &Device) -> Result<Dlrm> {
        let mut next = seed.wrapping_mul(0xA24B_AED4_963E_E407);
        let mut seed = || {
            next = lazyfuse::ir::splitmix64(next);
            next
        };
        let mut mlp = |widths: &[usize]| -> Result<Vec<Linear>> {
            widths
                .windows(2)
                .map(|w| {
                    let (i, o) = (w[0], w[1]);
                    let wt =
                        Tensor::randn(&[i, o], seed(), dev)?.mul((2.0 / (i + o) as f64).sqrt())?;
                    let b = Tensor::randn(&[o], seed(), dev)?.mul((1.0 / o as f64).sqrt())?;
                    Ok(Linear {
                        weight: Param::new(wt)?,
                        bias: Some(Param::new(b)?),
                    })
                })
                .collect()
        };
        let bottom = mlp(&cfg.bottom)?;
        let mut top_w = vec![cfg.top_input()];
        top_w.extend(&cfg.top_hidden);
        let top = mlp(&top_w)?;
        let tables = cfg
            .tables
            .iter()
            .map(|&rows| {
                Ok(EmbeddingBag::new(
                    rows,
                    cfg.dim(),
                    false,
                    true,
                    seed(),
                    dev,
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Dlrm {
            bottom,
            tables,
            top,
        })
    }

    /// Loads `dir/model.safetensors` with the reference's parameter names;
    /// the widths are read off the weights.
    pub fn load(dir: &Path, dev: &Device) -> Result<Dlrm> {
        let c = Checkpoint::open(dir)?;
        let l = Loader { ck: &c, dev };
        let mlp = |name: &str| -> Result<Vec<Linear>> {
            let mut layers = Vec::new();
            while let Some(s) = c.shape(&format!("{name}.{}.weight", 2 * layers.len())) {
                let [o, i] = s[..] else {
                    return Err(ck(format!(
                        "{name}.{}.weight must be [out, in]",
                        2 * layers.len()
                    )));
                };
                layers.push(trainable(
                    &l,
                    &format!("{name}.{}", 2 * layers.len()),
                    i,
                    o,
                )?);
            }
            if layers.is_empty() {
                return Err(ck(format!("checkpoint has no {name}.0.weight")));
            }
            Ok(layers)
        };
        let (bottom, top) = (mlp("bot_l")?, mlp("top_l")?);
        let mut tables = Vec::new();
        while let Some(s) = c.shape(&format!("emb_l.{}.weight", tables.len())) {
            let name = format!("emb_l.{}.weight", tables.len());
            let w = Tensor::from_slice(&c.f32(&name, &s)?, &s, dev)?;
            tables.push(EmbeddingBag::from_tensor(w, false, true)?);
        }
        Ok(Dlrm {
            bottom,
            tables,
            top,
        })
    }

    /// Click probabilities `[batch]` of dense features `[batch, n_dense]`
    /// and, per table, the ids and bag offsets of its feature (`sparse[k]`
    /// = `(ids, offsets)`, one bag per sample).
    pub fn forward(&self, dense: &Tensor, sparse: &[(Tensor, Tensor)]) -> Result<Tensor> {
        if sparse.len() != self.tables.len() {
            return Err(ModelError::Config(format!(
                "the model has {} tables, {} sparse features given",
                self.tables.len(),
                sparse.len()
            )));
        }
        let mut x = dense.clone();
        for l in &self.bottom {
            x = l.forward(&x)?.relu()?;
        }
        let b = x.dims()[0];
        let d = x.dims()[1];
        let mut feats = vec![x.reshape(&[b, 1, d])?];
        for (t, (ids, offsets)) in self.tables.iter().zip(sparse) {
            feats.push(t.forward_bags(ids, offsets, None)?.reshape(&[b, 1, d])?);
        }
        let refs: Vec<&Tensor> = feats.iter().collect();
        let t = Tensor::cat(&refs, 1)?;
        let z = t.matmul(&t.transpose(1, 2)?)?;
        // The strictly lower triangle, row by row, as the reference orders it.
        let f = feats.len();
        let pairs: Vec<i64> = (0..f)
            .flat_map(|i| (0..i).map(move |j| (i * f + j) as i64))
            .collect();
        let idx = Tensor::from_slice(&pairs, &[pairs.len()], dense.device())?;
        let zflat = z.reshape(&[b, f * f])?.index_select(1, &idx)?;
        let mut h = Tensor::cat(&[&x, &zflat], 1)?;
        for (i, l) in self.top.iter().enumerate() {
            h = l.forward(&h)?;
            h = if i + 1 < self.top.len() {
                h.relu()?
            } else {
                h.sigmoid()?
            };
        }
        Ok(h.reshape(&[b])?)
    }

    /// The dense parameters (MLPs), for a dense optimizer; the tables are
    /// [`SparseSgd`](lazyfuse::optim::SparseSgd)'s.
    pub fn dense_parameters(&self) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        for (name, layers) in [("bot_l", &self.bottom), ("top_l", &self.top)] {
            for (i, l) in layers.iter().enumerate() {
                l.visit_params(&join(name, &(2 * i).to_string()), &mut out);
            }
        }
        out
    }
}
