//! The engine: one thread that owns the model and the paged KV cache and
//! runs continuous batching.
//!
//! Every iteration it takes new requests and cancellations, drops
//! sequences whose client is gone, admits waiting sequences while the
//! batch and the cache have room (reusing cached prefix blocks), runs one
//! prefill chunk (so a long prompt never stalls the running decodes for
//! more than one chunk), then one decode step over every decoding
//! sequence. Shapes come from fixed buckets (rows, chunk tokens, blocks
//! attended), all compiled at warm-up, so batch composition never
//! compiles.

use crate::blocks::{chain_hash, BlockPool};
use crate::buckets::Buckets;
use crate::metrics::Metrics;
use crate::seq::{EventKind, Finish, Seq, SeqRequest};
use lazyfuse_models::{Llama, PagedKv, PagedStep};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

/// A message to the engine.
pub enum Cmd {
    /// Generate a sequence.
    Submit(SeqRequest),
    /// Stop generating choice `choice` of request `req` (a stop string
    /// matched on the text side).
    Cancel {
        /// The request.
        req: u64,
        /// The choice.
        choice: usize,
    },
}

/// The engine's state.
pub struct Engine {
    model: Llama,
    kv: PagedKv,
    pool: BlockPool,
    buckets: Buckets,
    eos: Vec<u32>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    metrics: Arc<Metrics>,
    compiles_at_ready: u64,
}

fn compiles() -> u64 {
    lazyfuse::metrics::snapshot().compiles
}

impl Engine {
    /// An engine over `model` with a cache of `num_blocks` blocks.
    pub fn new(
        model: Llama,
        buckets: Buckets,
        num_blocks: usize,
        eos: Vec<u32>,
        metrics: Arc<Metrics>,
    ) -> lazyfuse_models::Result<Engine> {
        let kv = PagedKv::new(&model, buckets.block_size, num_blocks)?;
        let pool = BlockPool::new(num_blocks, buckets.block_size);
        metrics.kv_blocks_total.set(pool.capacity() as i64);
        Ok(Engine {
            model,
            kv,
            pool,
            buckets,
            eos,
            waiting: VecDeque::new(),
            running: vec![],
            metrics,
            compiles_at_ready: 0,
        })
    }

    /// Runs every bucket once (writing only the scratch block), so serving
    /// never compiles; `progress(done, total)` after each.
    pub fn warm_up(
        &mut self,
        progress: &mut dyn FnMut(usize, usize),
    ) -> lazyfuse_models::Result<()> {
        let shapes = self.buckets.all_shapes();
        for (i, &(b, t, n)) in shapes.iter().enumerate() {
            let step = PagedStep {
                tokens: vec![vec![0; t]; b],
                starts: vec![0; b],
                lens: vec![0; b],
                tables: vec![vec![0; n]; b],
            };
            self.model
                .forward_paged(&step, &mut self.kv)?
                .to_vec::<f32>()?;
            progress(i + 1, shapes.len());
        }
        self.compiles_at_ready = compiles();
        self.metrics.compiles.set(self.compiles_at_ready as i64);
        Ok(())
    }

    /// Serves commands until the channel closes and no work is left.
    pub fn run(mut self, rx: Receiver<Cmd>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish();
                match rx.recv() {
                    Ok(c) => self.handle(c),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => self.handle(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.reap();
            self.admit();
            // Prompt chunks up to the step budget, then one decode step:
            // a burst of arrivals gets its first tokens sooner, and a
            // running sequence waits at most one budget between tokens.
            let mut budget = self.buckets.prefill_budget;
            while budget > 0 {
                match self.prefill() {
                    Some(t) => budget = budget.saturating_sub(t),
                    None => break,
                }
                self.admit();
            }
            self.decode();
            self.publish();
        }
    }

    fn handle(&mut self, c: Cmd) {
        match c {
            Cmd::Submit(r) => self.waiting.push_back(Seq::new(r)),
            Cmd::Cancel { req, choice } => {
                let hit = |s: &Seq| s.req == req && s.choice == choice;
                self.waiting.retain(|s| !hit(s));
                if let Some(i) = self.running.iter().position(hit) {
                    let s = self.running.swap_remove(i);
                    self.pool.release(&s.blocks);
                }
            }
        }
    }

    /// Drops sequences whose client has gone (their receiver is closed).
    fn reap(&mut self) {
        self.waiting.retain(|s| !s.events.is_closed());
        let pool = &mut self.pool;
        self.running.retain(|s| {
            let gone = s.events.is_closed();
            if gone {
                pool.release(&s.blocks);
            }
            !gone
        });
    }

    /// Moves waiting sequences into the batch, oldest first, while the
    /// batch has a row free and the cache has blocks for the prompt.
    fn admit(&mut self) {
        let bs = self.buckets.block_size;
        while self.running.len() < self.buckets.max_batch() {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            // At least one token must run to give logits: the last one.
            let reusable = (seq.tokens.len() - 1) / bs;
            let (reused, hashes) = self.pool.lookup(&seq.tokens, reusable);
            let need = seq.tokens.len().div_ceil(bs) - reused.len();
            if self.pool.available() < need {
                self.pool.release(&reused);
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            seq.computed = reused.len() * bs;
            if seq.cached_tokens == 0 && seq.generated() == 0 {
                seq.cached_tokens = seq.computed;
                self.metrics.prompt_tokens.inc_by(seq.n_prompt as u64);
                self.metrics.prefix_hit_tokens.inc_by(seq.computed as u64);
            }
            self.pool.hits += reused.len() as u64;
            seq.blocks = reused;
            seq.hashes = hashes;
            for _ in 0..need {
                seq.blocks
                    .push(self.pool.allocate().expect("availability checked"));
            }
            self.running.push(seq);
        }
    }

    /// One chunk of the oldest sequence that still has prompt to run; the
    /// chunk's tokens (padding included), `None` when no prompt is left.
    fn prefill(&mut self) -> Option<usize> {
        let i = self.running.iter().position(|s| s.pending() > 1)?;
        let s = &self.running[i];
        let start = s.computed;
        let (t, len) = self.buckets.chunk(start, s.pending());
        let n = self.buckets.blocks_for(start + t);
        let step = PagedStep {
            tokens: vec![pad(&s.tokens[start..start + len], t)],
            starts: vec![start],
            lens: vec![len],
            tables: vec![table(&s.blocks, n)],
        };
        self.metrics.step("prefill");
        match self.run_step(&step) {
            Ok(mut logits) => {
                self.running[i].computed += len;
                self.name_full_blocks(i);
                if self.running[i].pending() == 0 {
                    if let Some(f) = self.sample(i, &mut logits) {
                        self.finish(vec![(i, f)]);
                    }
                }
            }
            Err(m) => self.fail(&[i], &m),
        }
        Some(t)
    }

    /// One token for every sequence that is decoding.
    fn decode(&mut self) {
        let bs = self.buckets.block_size;
        // Every decoding row needs the block its next position falls in;
        // when the cache is full the newest sequence gives its blocks back.
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if s.pending() != 1 || s.blocks.len() * bs > s.computed {
                i += 1;
                continue;
            }
            match self.pool.allocate() {
                Some(b) => self.running[i].blocks.push(b),
                None => {
                    self.preempt_newest();
                    continue;
                }
            }
            i += 1;
        }
        let rows: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].pending() == 1)
            .collect();
        if rows.is_empty() {
            return;
        }
        let b = self.buckets.rows(rows.len());
        let span = rows
            .iter()
            .map(|&i| self.running[i].computed + 1)
            .max()
            .unwrap_or(1);
        let n = self.buckets.blocks_for(span);
        let mut step = PagedStep {
            tokens: vec![vec![0]; b],
            starts: vec![0; b],
            lens: vec![0; b],
            tables: vec![vec![0; n]; b],
        };
        for (r, &i) in rows.iter().enumerate() {
            let s = &self.running[i];
            step.tokens[r] = vec![s.tokens[s.computed]];
            step.starts[r] = s.computed;
            step.lens[r] = 1;
            step.tables[r] = table(&s.blocks, n);
        }
        self.metrics.step("decode");
        let logits = match self.run_step(&step) {
            Ok(l) => l,
            Err(m) => return self.fail(&rows, &m),
        };
        let vocab = self.model.config.vocab_size;
        let mut done = vec![];
        for (r, &i) in rows.iter().enumerate() {
            self.running[i].computed += 1;
            self.name_full_blocks(i);
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            if let Some(f) = self.sample(i, &mut row) {
                done.push((i, f));
            }
        }
        self.finish(done);
    }

    /// Runs a step; a model error or a panic is a message for the rows.
    fn run_step(&mut self, step: &PagedStep) -> Result<Vec<f32>, String> {
        let (model, kv) = (&self.model, &mut self.kv);
        let run = || -> lazyfuse_models::Result<Vec<f32>> {
            Ok(model.forward_paged(step, kv)?.to_vec::<f32>()?)
        };
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("model step failed: {e}")),
            Err(_) => Err("model step panicked".into()),
        }
    }

    /// Names the sequence's newly filled blocks for the prefix cache.
    fn name_full_blocks(&mut self, i: usize) {
        let bs = self.buckets.block_size;
        let s = &mut self.running[i];
        while (s.hashes.len() + 1) * bs <= s.computed {
            let k = s.hashes.len();
            let parent = k.checked_sub(1).map_or(0, |p| s.hashes[p]);
            let h = chain_hash(parent, &s.tokens[k * bs..(k + 1) * bs]);
            self.pool.register(s.blocks[k], h);
            s.hashes.push(h);
        }
    }

    /// Picks sequence `i`'s next token; `Some` when the sequence ends.
    fn sample(&mut self, i: usize, logits: &mut [f32]) -> Option<Finish> {
        let max_len = self.buckets.max_model_len;
        let s = &mut self.running[i];
        let (tok, logprobs) = s.sampler.next(logits);
        s.tokens.push(tok);
        let now = Instant::now();
        match s.last_token {
            None => self.metrics.ttft.observe((now - s.arrived).as_secs_f64()),
            Some(t) => self.metrics.tpot.observe((now - t).as_secs_f64()),
        }
        s.last_token = Some(now);
        self.metrics.generation_tokens.inc();
        if !s.send(EventKind::Token { id: tok, logprobs }) {
            return Some(Finish::Stop); // the client is gone; reaped as finished
        }
        let p = s.sampler.params();
        if p.stop_token_ids.contains(&tok) || (!p.ignore_eos && self.eos.contains(&tok)) {
            Some(Finish::Stop)
        } else if s.generated() >= p.max_tokens || s.tokens.len() >= max_len {
            Some(Finish::Length)
        } else {
            None
        }
    }

    /// Ends the given sequences (indices into `running`).
    fn finish(&mut self, mut done: Vec<(usize, Finish)>) {
        done.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, f) in done {
            let s = self.running.swap_remove(i);
            self.metrics.e2e.observe(s.arrived.elapsed().as_secs_f64());
            s.send(EventKind::Done {
                finish: f,
                prompt_tokens: s.n_prompt,
                cached_tokens: s.cached_tokens,
            });
            self.pool.release(&s.blocks);
        }
    }

    /// Fails the given sequences with `message`; the others go on.
    ///
    /// The failed step wrote the pool in place, so its contents are lost:
    /// the engine starts a fresh pool and prefix cache, and every other
    /// running sequence is recomputed (as if preempted).
    fn fail(&mut self, rows: &[usize], message: &str) {
        let mut rows = rows.to_vec();
        rows.sort_unstable_by(|a, b| b.cmp(a));
        for i in rows {
            let s = self.running.swap_remove(i);
            s.send(EventKind::Error(message.to_string()));
        }
        let (bs, blocks) = (self.buckets.block_size, self.kv.num_blocks);
        match PagedKv::new(&self.model, bs, blocks) {
            Ok(kv) => self.kv = kv,
            // The device itself is failing: later steps fail their rows too.
            Err(e) => eprintln!("lazyfuse-serve: cannot rebuild the KV cache: {e}"),
        }
        self.pool = BlockPool::new(blocks, bs);
        while let Some(mut s) = self.running.pop() {
            s.blocks.clear();
            s.hashes.clear();
            s.computed = 0;
            self.metrics.preemptions.inc();
            self.waiting.push_front(s);
        }
    }

    /// Gives the newest running sequence's blocks back; it waits at the
    /// front of the queue and is recomputed (prompt and generated tokens)
    /// when it is admitted again.
    fn preempt_newest(&mut self) {
        let Some(mut s) = self.running.pop() else {
            return;
        };
        self.pool.release(&s.blocks);
        s.blocks.clear();
        s.hashes.clear();
        s.computed = 0;
        self.metrics.preemptions.inc();
        self.waiting.push_front(s);
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.running.set(self.running.len() as i64);
        m.waiting.set(self.waiting.len() as i64);
        m.kv_blocks_used.set(self.pool.used() as i64);
        m.kv_usage
            .set(self.pool.used() as f64 / self.pool.capacity().max(1) as f64);
        let c = compiles();
        m.compiles.set(c as i64);
        m.compiles_after_warmup
            .set(c.saturating_sub(self.compiles_at_ready) as i64);
    }
}

fn pad(tokens: &[u32], t: usize) -> Vec<u32> {
    let mut v = tokens.to_vec();
    v.resize(t, 0);
    v
}

fn table(blocks: &[u32], n: usize) -> Vec<u32> {
    let mut v: Vec<u32> = blocks.iter().take(n).copied().collect();
    v.resize(n, 0);
    v
}
