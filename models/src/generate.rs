//! Generation: greedy decoding and sampling (temperature, top-k, top-p)
//! from a seed, stopping at the end-of-sequence tokens, for a batch of
//! prompts of different lengths (left-padded into one cache).
//!
//! Sampling runs on the host over the last position's logits: they are
//! read back every step anyway to pick the token, and doing it there keeps
//! the device step one executable whatever the sampling settings.

use crate::llama::Llama;
use crate::{ModelError, Result};
use lazyfuse::ir::SplitMix64;
use std::path::Path;

/// How to pick tokens and when to stop.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate per prompt (fewer if it reaches an end token).
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens before sampling.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability
    /// reaches `p` before sampling.
    pub top_p: Option<f32>,
    /// Seed of the sampling stream (sequence `i` uses its own stream).
    pub seed: u64,
    /// Tokens that end a sequence (from `generation_config.json` or `config.json`).
    pub eos_token_ids: Vec<u32>,
    /// Generate `max_new_tokens` whatever the tokens are.
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 32,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            eos_token_ids: vec![],
            ignore_eos: false,
        }
    }
}

/// End-of-sequence tokens of a checkpoint: `generation_config.json`'s
/// `eos_token_id` if it has one, else `config.json`'s.
pub fn eos_token_ids(dir: &Path, config_eos: &[u32]) -> Vec<u32> {
    let from_gen = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| crate::config::token_ids(v.get("eos_token_id")))
        .unwrap_or_default();
    if from_gen.is_empty() {
        config_eos.to_vec()
    } else {
        from_gen
    }
}

/// One token from `logits` (one row) as `opts` says, drawing from `rng`.
pub fn pick(logits: &[f32], opts: &GenerateOptions, rng: &mut SplitMix64) -> u32 {
    if logits.is_empty() {
        return 0;
    }
    let argmax = || {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if opts.temperature <= 0.0 {
        return argmax();
    }
    // Candidates by descending logit (index order breaks ties).
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(k) = opts.top_k {
        order.truncate(k.max(1));
    }
    let t = opts.temperature as f64;
    let top = logits[order[0]] as f64;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] as f64 - top) / t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = opts.top_p {
        let mut acc = 0.0;
        let keep = probs
            .iter()
            .position(|&q| {
                acc += q;
                acc >= p as f64
            })
            .map_or(probs.len(), |i| i + 1);
        order.truncate(keep);
        probs.truncate(keep);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    }
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut acc = 0.0;
    for (i, q) in order.iter().zip(&probs) {
        acc += q;
        if u < acc {
            return *i as u32;
        }
    }
    *order.last().expect("at least one candidate") as u32
}

impl Llama {
    /// Generates up to `opts.max_new_tokens` tokens after each prompt.
    ///
    /// Prompts of different lengths are left-padded into one cache (the
    /// padding is masked out and positions count from each prompt's first
    /// token), so a batch gives each prompt the tokens it gets alone.
    /// A sequence stops after an end token (which it keeps) unless
    /// `ignore_eos`; the returned rows hold only generated tokens.
    pub fn generate(&self, prompts: &[Vec<u32>], opts: &GenerateOptions) -> Result<Vec<Vec<u32>>> {
        self.generate_with(prompts, opts, &mut |_| {})
    }

    /// [`Llama::generate`], calling `on_step(n)` after the `n`-th token of
    /// every live sequence is picked (for progress bars).
    pub fn generate_with(
        &self,
        prompts: &[Vec<u32>],
        opts: &GenerateOptions,
        on_step: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<u32>>> {
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(ModelError::Config(
                "generate needs at least one non-empty prompt".into(),
            ));
        }
        let t = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let pads: Vec<usize> = prompts.iter().map(|p| t - p.len()).collect();
        let padded: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                std::iter::repeat_n(0, t - p.len())
                    .chain(p.iter().copied())
                    .collect()
            })
            .collect();
        self.check_ids(&padded)?;
        let capacity = t + opts.max_new_tokens.max(1);
        let mut cache = self.new_padded_cache(&pads, capacity)?;
        let vocab = self.config.vocab_size;
        let b = prompts.len();
        let mut rngs: Vec<SplitMix64> = (0..b as u64)
            .map(|i| SplitMix64::new(opts.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        let mut out = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut logits = self.forward_cached(&padded, &mut cache)?;
        for step in 0..opts.max_new_tokens {
            let last = logits.dims()[1] - 1;
            let rows: Vec<f32> = logits.narrow(1, last, 1)?.to_vec()?;
            let mut next = Vec::with_capacity(b);
            for i in 0..b {
                let tok = if done[i] {
                    0
                } else {
                    pick(&rows[i * vocab..(i + 1) * vocab], opts, &mut rngs[i])
                };
                if !done[i] {
                    out[i].push(tok);
                    done[i] = !opts.ignore_eos && opts.eos_token_ids.contains(&tok);
                }
                next.push(vec![tok]);
            }
            on_step(step + 1);
            if step + 1 == opts.max_new_tokens || done.iter().all(|&d| d) {
                break;
            }
            logits = self.forward_cached(&next, &mut cache)?;
        }
        Ok(out)
    }

    /// Greedy decoding of exactly `max_new` tokens after `prompt`.
    pub fn generate_greedy(&self, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
        let opts = GenerateOptions {
            max_new_tokens: max_new,
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        Ok(self.generate(&[prompt.to_vec()], &opts)?.remove(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_is_greedy_at_zero_temperature_and_respects_top_k() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        let mut rng = SplitMix64::new(7);
        assert_eq!(pick(&logits, &GenerateOptions::default(), &mut rng), 1);
        let opts = GenerateOptions {
            temperature: 1.0,
            top_k: Some(2),
            ..GenerateOptions::default()
        };
        for _ in 0..200 {
            assert!([1, 2].contains(&pick(&logits, &opts, &mut rng)));
        }
        let opts = GenerateOptions {
            temperature: 1.0,
            top_p: Some(0.01),
            ..GenerateOptions::default()
        };
        assert_eq!(pick(&logits, &opts, &mut rng), 1);
    }
}
