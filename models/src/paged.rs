//! A paged key/value cache and the forward step that reads and writes it,
//! for serving many sequences of different lengths at once.
//!
//! Keys and values live in one pool of `num_blocks` blocks of `block_size`
//! positions, `[layers, 2, num_blocks * block_size, kv_heads * head_dim]`
//! (keys, then values, per layer). A
//! sequence owns a *block table*: the blocks that hold its positions in
//! order. A step gathers each row's blocks (its past) per layer, attends
//! to that past and to the step's own tokens, and writes the step's keys
//! and values for all layers at the end, after every read: one
//! `dynamic_update_slice` per row (per block, for a chunk) at a run-time
//! slot, in place when the old pool dies. Rows of different lengths,
//! admitted and retired at any step, share one executable per (rows,
//! tokens, blocks) shape: the lengths, slots and tables reach it only as
//! data. Blocks can be shared between sequences (a common prompt prefix)
//! because a row only ever writes past its own length.
//!
//! Block 0 is scratch: padding rows and padding tokens write there, and a
//! table's unused entries point there (masked out), so it is never handed
//! to a sequence.

use crate::llama::Llama;
use crate::{ModelError, Result};
use lazyfuse::nn::Module;
use lazyfuse::{DType, Tensor};

/// The pool of every layer's keys and values.
pub struct PagedKv {
    /// Positions per block.
    pub block_size: usize,
    /// Blocks in the pool, the scratch block 0 included.
    pub num_blocks: usize,
    /// `[layers, 2, num_blocks * block_size, kv_heads * head_dim]`.
    pool: Tensor,
}

/// One step for `B` rows of `t` tokens each.
///
/// `t` is 1 (a decode step: any start) or a multiple of the block size with
/// every start on a block boundary (a prefill chunk), so a row's writes are
/// whole blocks or single positions.
#[derive(Clone, Debug)]
pub struct PagedStep {
    /// `B` rows of `t` token ids (padding: any valid id).
    pub tokens: Vec<Vec<u32>>,
    /// Position of each row's first token.
    pub starts: Vec<usize>,
    /// Real tokens in each row (the rest is padding); 0 marks a padding row.
    pub lens: Vec<usize>,
    /// Each row's block table, all of one length `n` (the attention span
    /// is `n * block_size` positions); entries past the row's blocks are 0.
    pub tables: Vec<Vec<u32>>,
}

impl PagedKv {
    /// Bytes one block takes over all layers, keys and values (f32).
    pub fn bytes_per_block(model: &Llama, block_size: usize) -> usize {
        let c = &model.config;
        c.num_hidden_layers * 2 * block_size * c.num_key_value_heads * c.head_dim * 4
    }

    /// A zeroed pool of `num_blocks` blocks (at least 2: block 0 is scratch).
    pub fn new(model: &Llama, block_size: usize, num_blocks: usize) -> Result<PagedKv> {
        if block_size == 0 || num_blocks < 2 {
            return Err(ModelError::Config(format!(
                "a paged cache needs a block size > 0 and at least 2 blocks, got {block_size} and {num_blocks}"
            )));
        }
        let c = &model.config;
        let dims = [
            c.num_hidden_layers,
            2,
            num_blocks * block_size,
            c.num_key_value_heads * c.head_dim,
        ];
        let pool = Tensor::zeros(&dims, DType::F32, model.device())?;
        pool.realize()?;
        Ok(PagedKv {
            block_size,
            num_blocks,
            pool,
        })
    }
}

impl PagedStep {
    fn check(&self, model: &Llama, kv: &PagedKv) -> Result<(usize, usize, usize)> {
        let b = self.tokens.len();
        let t = self.tokens.first().map_or(0, Vec::len);
        let n = self.tables.first().map_or(0, Vec::len);
        let bs = kv.block_size;
        let bad = |m: String| Err(ModelError::Config(format!("paged step: {m}")));
        if b == 0 || t == 0 || n == 0 {
            return bad(format!("{b} rows of {t} tokens over {n} blocks"));
        }
        if self.tokens.iter().any(|r| r.len() != t)
            || self.tables.iter().any(|r| r.len() != n)
            || self.starts.len() != b
            || self.lens.len() != b
            || self.tables.len() != b
        {
            return bad("rows of different shapes".into());
        }
        if t != 1 && (t % bs != 0 || self.starts.iter().any(|s| s % bs != 0)) {
            return bad(format!(
                "a chunk of {t} tokens must be whole blocks of {bs} starting on a block boundary"
            ));
        }
        for r in 0..b {
            if self.lens[r] > t || (self.lens[r] > 0 && self.starts[r] + t > n * bs) {
                return bad(format!(
                    "row {r}: {} tokens at {} do not fit {n} blocks of {bs}",
                    self.lens[r], self.starts[r]
                ));
            }
        }
        if let Some(bad_block) = self
            .tables
            .iter()
            .flatten()
            .find(|&&x| x as usize >= kv.num_blocks)
        {
            return bad(format!(
                "block {bad_block} is outside the pool of {}",
                kv.num_blocks
            ));
        }
        let (_, t_checked) = model.check_ids(&self.tokens)?;
        Ok((b, t_checked, n))
    }

    /// The pool row each write segment starts at (`[B * segments]`) and the
    /// segment length: one position per decode row, whole blocks per chunk.
    fn slots(&self, bs: usize) -> (Vec<i32>, usize) {
        let t = self.tokens[0].len();
        let (seg, nseg) = if t == 1 { (1, 1) } else { (bs, t / bs) };
        let mut out = Vec::with_capacity(self.tokens.len() * nseg);
        for r in 0..self.tokens.len() {
            for s in 0..nseg {
                let pos = self.starts[r] + s * seg;
                // Segments wholly past the row's real tokens go to scratch.
                let slot = if s * seg < self.lens[r] {
                    self.tables[r][pos / bs] as usize * bs + pos % bs
                } else {
                    0
                };
                out.push(slot as i32);
            }
        }
        (out, seg)
    }

    /// `[B, 1, 1, t, span + t]`: keys a query must not see. The first
    /// `span` columns are the gathered past (visible before the row's
    /// start), the last `t` the step's own tokens (visible up to the
    /// query's own); a padding row sees nothing.
    fn mask(&self, span: usize) -> Vec<bool> {
        let t = self.tokens[0].len();
        let mut m = Vec::with_capacity(self.tokens.len() * t * (span + t));
        for r in 0..self.tokens.len() {
            let pad = self.lens[r] == 0;
            for i in 0..t {
                m.extend((0..span).map(|j| pad || j >= self.starts[r]));
                m.extend((0..t).map(|j| pad || j > i));
            }
        }
        m
    }
}

impl Llama {
    /// Logits `[B, vocab]` at each row's last real token, after writing the
    /// step's keys and values into `kv` at the rows' positions.
    ///
    /// The computation is [`Llama::forward_cached`]'s (the same rotary
    /// tables, grouped-query attention without repeated keys, masking with
    /// a finite fill), with the past read from each row's blocks.
    pub fn forward_paged(&self, step: &PagedStep, kv: &mut PagedKv) -> Result<Tensor> {
        let (b, t, n) = step.check(self, kv)?;
        let c = &self.config;
        let dev = self.device();
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (bs, span, kvw) = (kv.block_size, n * kv.block_size, nkv * hd);
        let layers = self.layers.len();
        let mut x = self.embed_ids(&step.tokens)?;
        let positions: Vec<Vec<usize>> = (0..b)
            .map(|r| (0..t).map(|i| step.starts[r] + i).collect())
            .collect();
        let (cos, sin) = self.rope_tables(&positions)?;
        let (cos, sin) = (cos.reshape(&[b, t, 1, hd])?, sin.reshape(&[b, t, 1, hd])?);
        let table: Vec<i64> = step.tables.iter().flatten().map(|&x| x as i64).collect();
        let table = Tensor::from_slice(&table, &[b * n], dev)?;
        let masked = Tensor::from_slice(&step.mask(span), &[b, 1, 1, t, span + t], dev)?;
        let mut written = Vec::with_capacity(2 * layers);
        for (i, l) in self.layers.iter().enumerate() {
            let h = self.rms_norm(&x, &l.input_norm)?;
            let qkv = l.qkv.forward(&h)?;
            let heads = |at: usize, k: usize| -> Result<Tensor> {
                Ok(qkv.narrow(-1, at * hd, k * hd)?.reshape(&[b, t, k, hd])?)
            };
            let q = Llama::rope(&self.head_norm(heads(0, nh)?, l, 0)?, &cos, &sin)?;
            let k_new = Llama::rope(&self.head_norm(heads(nh, nkv)?, l, 1)?, &cos, &sin)?;
            let v_new = heads(nh + nkv, nkv)?;
            written.push(k_new.reshape(&[b * t, kvw])?);
            written.push(v_new.reshape(&[b * t, kvw])?);
            // This layer's keys or values of every row's blocks.
            let old = |kind: usize| -> Result<Tensor> {
                Ok(kv
                    .pool
                    .narrow(0, i, 1)?
                    .narrow(1, kind, 1)?
                    .reshape(&[kv.num_blocks, bs * kvw])?
                    .index_select(0, &table)?
                    .reshape(&[b, span, nkv, hd])?
                    .permute(&[0, 2, 1, 3])?)
            };
            let (k_old, v_old) = (old(0)?, old(1)?);
            let (k_new, v_new) = (k_new.permute(&[0, 2, 1, 3])?, v_new.permute(&[0, 2, 1, 3])?);
            // The past and the step's own keys side by side: one product,
            // one softmax over both.
            let k_all = Tensor::cat(&[&k_old, &k_new], 2)?;
            let v_all = Tensor::cat(&[&v_old, &v_new], 2)?;
            let y = self.attend(&q.permute(&[0, 2, 1, 3])?, &k_all, &v_all, &masked)?;
            x = x.add(&l.o.forward(&y)?)?;
            x = self.mlp(&x, l)?;
        }
        // The step's keys and values `[layers, 2, B * t, kvw]`, written once
        // per row (per block, for a chunk) across all layers.
        let rows = Tensor::cat(&written.iter().collect::<Vec<_>>(), 0)?.reshape(&[
            layers,
            2,
            b * t,
            kvw,
        ])?;
        let (slots, seg) = step.slots(bs);
        let slots_t = Tensor::from_slice(&slots, &[slots.len()], dev)?;
        let nseg = slots.len() / b;
        let mut pool = kv.pool.clone();
        for j in 0..slots.len() {
            let (r, s) = (j / nseg, j % nseg);
            let start = slots_t.narrow(0, j, 1)?.reshape(&[])?;
            pool = pool.dynamic_update_slice(&rows.narrow(2, r * t + s * seg, seg)?, 2, &start)?;
        }
        kv.pool = pool;
        let h = c.hidden_size;
        let last = if t == 1 {
            x.reshape(&[b, h])?
        } else {
            let sel: Vec<i64> = (0..b)
                .map(|r| (r * t + step.lens[r].max(1) - 1) as i64)
                .collect();
            let sel = Tensor::from_slice(&sel, &[b], dev)?;
            x.reshape(&[b * t, h])?.index_select(0, &sel)?
        };
        Ok(self.rms_norm(&last, &self.norm)?.matmul(&self.lm_head)?)
    }
}
