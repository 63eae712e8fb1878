//! Causal self-attention and the (minGPT / GPT-2) transformer block, written
//! with ordinary tensor ops so the whole block, forward and backward, fuses.

use super::{join, Dropout, LayerNorm, Linear, Module, Param};
use crate::{DType, Device, Error, Key, Result, Tensor};

/// `Err` unless `x` is `[B, T, C]` (checked before anything is recorded).
#[track_caller]
fn check_btc(op: &'static str, x: &Tensor) -> Result<()> {
    if x.rank() == 3 {
        return Ok(());
    }
    Err(Error::op(
        op,
        format!("needs a [B, T, C] input, got rank {}", x.rank()),
        x.describe(),
        crate::site::caller(),
    ))
}

/// Multi-head self-attention where position `t` attends to positions `<= t`.
pub struct CausalSelfAttention {
    /// Fused query/key/value projection `C -> 3C`.
    pub c_attn: Linear,
    /// Output projection `C -> C`.
    pub c_proj: Linear,
    /// Number of heads (`C` must divide by it).
    pub n_head: usize,
    /// Dropout on the attention weights.
    pub attn_drop: Dropout,
    /// Dropout on the output.
    pub resid_drop: Dropout,
}

impl CausalSelfAttention {
    /// `dim` must divide by `n_head`; GPT-2 initialisation (std 0.02) from `key`.
    #[track_caller]
    pub fn new(
        dim: usize,
        n_head: usize,
        dropout: f64,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Self> {
        let seed = key.into().bits();
        if n_head == 0 || dim % n_head != 0 {
            return Err(Error::op(
                "CausalSelfAttention::new",
                format!("dim {dim} must be a positive multiple of n_head {n_head}"),
                String::new(),
                crate::site::caller(),
            ));
        }
        Ok(CausalSelfAttention {
            c_attn: Linear::normal(dim, 3 * dim, 0.02, seed, dev)?,
            c_proj: Linear::normal(dim, dim, 0.02, seed.wrapping_add(1), dev)?,
            n_head,
            attn_drop: Dropout::new(dropout, seed.wrapping_add(2)),
            resid_drop: Dropout::new(dropout, seed.wrapping_add(3)),
        })
    }
}

impl CausalSelfAttention {
    /// Queries, keys and values of `x` (`[B, T, C]`), each `[B, heads, T,
    /// head_dim]` (shared by the full and the cached forward).
    pub(super) fn heads(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let (h, hd) = (self.n_head, c / self.n_head);
        let qkv = self.c_attn.forward(x)?;
        let head = |i: usize| {
            qkv.narrow(-1, i * c, c)?
                .reshape(&[b, t, h, hd])?
                .permute(&[0, 2, 1, 3])
        };
        Ok([head(0)?, head(1)?, head(2)?])
    }
}

impl Module for CausalSelfAttention {
    /// `x`: `[B, T, C]` to `[B, T, C]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_btc("CausalSelfAttention::forward", x)?;
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let hd = c / self.n_head;
        let [q, k, v] = self.heads(x)?;
        let att = q
            .matmul(&k.transpose(-1, -2)?)?
            .mul(1.0 / (hd as f64).sqrt())?;
        // Recorded as iota/compare ops: a constant of the step's graph, not an upload.
        let pos = Tensor::arange(0.0, t as f64, DType::I64, x.device())?;
        let future = pos.unsqueeze(0)?.gt(&pos.unsqueeze(1)?)?;
        let att = att.masked_fill(&future, f64::NEG_INFINITY)?.softmax(-1)?;
        let att = self.attn_drop.forward(&att)?;
        let y = att
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, t, c])?;
        self.resid_drop.forward(&self.c_proj.forward(&y)?)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        self.c_attn.visit_params(&join(prefix, "c_attn"), out);
        self.c_proj.visit_params(&join(prefix, "c_proj"), out);
    }

    fn set_train(&self, train: bool) {
        self.attn_drop.set_train(train);
        self.resid_drop.set_train(train);
    }
}

/// Pre-norm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`
/// with a `C -> 4C -> C` GELU (tanh) MLP.
pub struct Block {
    /// Norm before attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Norm before the MLP.
    pub ln_2: LayerNorm,
    /// MLP expansion `C -> 4C`.
    pub c_fc: Linear,
    /// MLP projection `4C -> C`.
    pub c_proj: Linear,
    /// Dropout on the MLP output.
    pub drop: Dropout,
}

impl Block {
    /// A block of width `dim` with `n_head` heads, initialised from `key`.
    #[track_caller]
    pub fn new(
        dim: usize,
        n_head: usize,
        dropout: f64,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<Block> {
        let seed = key.into().bits();
        Ok(Block {
            ln_1: LayerNorm::new(dim, dev)?,
            attn: CausalSelfAttention::new(dim, n_head, dropout, seed, dev)?,
            ln_2: LayerNorm::new(dim, dev)?,
            c_fc: Linear::normal(dim, 4 * dim, 0.02, seed.wrapping_add(10), dev)?,
            c_proj: Linear::normal(4 * dim, dim, 0.02, seed.wrapping_add(11), dev)?,
            drop: Dropout::new(dropout, seed.wrapping_add(12)),
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_btc("Block::forward", x)?;
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        let m = self.c_fc.forward(&self.ln_2.forward(&x)?)?.gelu()?;
        x.add(&self.drop.forward(&self.c_proj.forward(&m)?)?)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        self.ln_1.visit_params(&join(prefix, "ln_1"), out);
        self.attn.visit_params(&join(prefix, "attn"), out);
        self.ln_2.visit_params(&join(prefix, "ln_2"), out);
        self.c_fc.visit_params(&join(prefix, "mlp.c_fc"), out);
        self.c_proj.visit_params(&join(prefix, "mlp.c_proj"), out);
    }

    fn set_train(&self, train: bool) {
        self.attn.set_train(train);
        self.drop.set_train(train);
    }
}
