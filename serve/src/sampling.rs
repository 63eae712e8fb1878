//! Picking a sequence's next token from its logits row on the host:
//! penalties, log-probabilities, then greedy or seeded sampling.
//!
//! Each sequence draws from its own generator, seeded by the request, so
//! the same seed gives the same text whatever else shares the batch.

use lazyfuse::ir::SplitMix64;
use lazyfuse_models::{generate::pick, GenerateOptions};
use std::collections::HashMap;

/// What a request asked for, per sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Seed of this sequence's generator.
    pub seed: u64,
    /// Tokens that end the sequence besides the model's end tokens.
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's end tokens.
    pub ignore_eos: bool,
    /// Report the chosen token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of tokens already generated.
    pub frequency_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: 16,
            temperature: 1.0,
            top_p: None,
            top_k: None,
            seed: 0,
            stop_token_ids: vec![],
            ignore_eos: false,
            logprobs: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// The chosen token's log-probability and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// `log p(chosen)`.
    pub logprob: f32,
    /// `(token, log p)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One sequence's sampling state.
pub struct Sampler {
    params: SamplingParams,
    opts: GenerateOptions,
    rng: SplitMix64,
    counts: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: SamplingParams) -> Sampler {
        let opts = GenerateOptions {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            ..GenerateOptions::default()
        };
        Sampler {
            rng: SplitMix64::new(params.seed),
            params,
            opts,
            counts: HashMap::new(),
        }
    }

    /// The request's parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token from `logits` (one row), and its log-probabilities
    /// when asked for (of the distribution after penalties, before
    /// temperature and truncation, as OpenAI reports them).
    pub fn next(&mut self, logits: &mut [f32]) -> (u32, Option<TokenLogprobs>) {
        let (pp, fp) = (self.params.presence_penalty, self.params.frequency_penalty);
        if pp != 0.0 || fp != 0.0 {
            for (&tok, &n) in &self.counts {
                if let Some(l) = logits.get_mut(tok as usize) {
                    *l -= pp + fp * n as f32;
                }
            }
        }
        let tok = pick(logits, &self.opts, &mut self.rng);
        *self.counts.entry(tok).or_insert(0) += 1;
        let lp = self.params.logprobs.map(|k| logprobs(logits, tok, k));
        (tok, lp)
    }
}

/// Log-softmax of `logits` at `tok`, and the `k` largest entries.
fn logprobs(logits: &[f32], tok: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    if k > 0 {
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b].total_cmp(&logits[a]).then(a.cmp(&b))
        });
    }
    order.truncate(k);
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    TokenLogprobs {
        logprob: lp(tok as usize),
        top: order.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_steer_away_from_repeats_and_logprobs_normalise() {
        let params = SamplingParams {
            temperature: 0.0,
            frequency_penalty: 10.0,
            logprobs: Some(2),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params);
        let (a, lp) = s.next(&mut [0.0, 2.0, 1.0]);
        assert_eq!(a, 1);
        let lp = lp.unwrap();
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        let total: f64 = [0.0f64, 2.0, 1.0].iter().map(|l| l.exp()).sum();
        assert!((lp.logprob as f64 - (2.0 - total.ln())).abs() < 1e-6);
        // Token 1 was generated: 10 off its logit, so token 2 wins.
        assert_eq!(s.next(&mut [0.0, 2.0, 1.0]).0, 2);
    }

    #[test]
    fn one_seed_one_stream() {
        let p = SamplingParams {
            seed: 5,
            ..SamplingParams::default()
        };
        let row = [0.3f32, 0.1, 0.2, 0.25, 0.0];
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..20)
                .map(|_| s.next(&mut row.clone()).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&p), draw(&p));
    }
}
