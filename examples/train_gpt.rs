//! Character-level minGPT trained on a corpus generated in code, then sampled.
//!
//! The corpus (about 200 KB, seeded, see [`corpus`]) is produced by a small
//! grammar: simple English sentences about animals and places, and
//! arithmetic facts written out in words ("three plus four is seven."). It
//! has real structure at several scales: spelling, word order, agreement of
//! the arithmetic, so the loss drops clearly within a few hundred steps.
//! Pass a path to train on any UTF-8 text file instead.
//!
//! Every training step (forward, backward, AdamW) records one fused graph
//! that compiles on the first step and then hits the cache; sampling feeds a
//! fixed-length window so it compiles once too.
//! Run: `cargo run --release --example train_gpt [steps] [text-file]`
//!
//! On a device mesh of logical CPU devices: `--mesh dp=4` (data parallel:
//! the batch split, parameters replicated), `--mesh dp=4 --fsdp` (the
//! parameters split too), `--mesh dp=2,tp=2` (also Megatron tensor
//! parallelism of every block's linear layers over `tp`); `--steps N`
//! sets the step count. The printed `loss curve:` matches the one-device
//! run's within float rounding.

#[path = "support/progress.rs"]
mod progress;
#[path = "support/rng.rs"]
mod rng;

use lazyfuse::nn::{parallel, Block, Embedding, KvCache, LayerNorm, Linear, Module, Param};
use lazyfuse::optim::{params_of, AdamW, Optimizer};
use lazyfuse::{metrics, no_grad, DType, Device, Mesh, Result, Tensor};
use progress::Progress;
use rng::Rng;

const NUMBERS: [&str; 21] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

/// The generated training text: `bytes` characters of lines, each either a
/// sentence `the <adjective> <animal> <verb> <preposition> the <place>.` or
/// an arithmetic fact `<a> plus|minus <b> is <result>.` with operands and
/// results between zero and twenty.
fn corpus(bytes: usize, seed: u64) -> String {
    let adj = [
        "quick", "lazy", "small", "old", "young", "brown", "quiet", "happy", "clever", "tired",
    ];
    let animal = [
        "fox", "dog", "cat", "horse", "bird", "mouse", "rabbit", "sheep", "goat", "owl",
    ];
    let verb = [
        "runs", "sleeps", "sits", "waits", "jumps", "walks", "hides", "sings",
    ];
    let prep = ["in", "near", "under", "behind", "beside", "over"];
    let place = [
        "barn", "river", "garden", "forest", "house", "field", "hill", "road",
    ];
    let mut rng = Rng(seed);
    let mut s = String::with_capacity(bytes + 80);
    while s.len() < bytes {
        if rng.below(2) == 0 {
            let line = format!(
                "the {} {} {} {} the {}.\n",
                rng.pick(&adj),
                rng.pick(&animal),
                rng.pick(&verb),
                rng.pick(&prep),
                rng.pick(&place)
            );
            s.push_str(&line);
        } else {
            let a = rng.below(21);
            let b = rng.below(21);
            let line = if a + b <= 20 && rng.below(2) == 0 {
                format!(
                    "{} plus {} is {}.\n",
                    NUMBERS[a],
                    NUMBERS[b],
                    NUMBERS[a + b]
                )
            } else {
                let (hi, lo) = (a.max(b), a.min(b));
                format!(
                    "{} minus {} is {}.\n",
                    NUMBERS[hi],
                    NUMBERS[lo],
                    NUMBERS[hi - lo]
                )
            };
            s.push_str(&line);
        }
    }
    s
}

struct Config {
    block: usize,
    embd: usize,
    heads: usize,
    layers: usize,
    batch: usize,
}

struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

impl Gpt {
    fn new(vocab: usize, c: &Config, dev: &Device) -> Result<Gpt> {
        Ok(Gpt {
            wte: Embedding::new(vocab, c.embd, 0.02, 1, dev)?,
            wpe: Embedding::new(c.block, c.embd, 0.02, 2, dev)?,
            blocks: (0..c.layers)
                .map(|i| Block::new(c.embd, c.heads, 0.0, 100 + 100 * i as u64, dev))
                .collect::<Result<_>>()?,
            ln_f: LayerNorm::new(c.embd, dev)?,
            head: Linear::normal(c.embd, vocab, 0.02, 3, dev)?,
        })
    }

    /// Logits `[B, T, vocab]` for token ids `[B, T]`.
    fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dims()[1];
        let pos = Tensor::arange(0.0, t as f64, DType::I64, ids.device())?;
        let mut x = self.wte.forward(ids)?.add(&self.wpe.forward(&pos)?)?;
        for b in &self.blocks {
            x = b.forward(&x)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }

    /// Logits `[B, T, vocab]` for ids `[B, T]` at positions `cache.len()..`,
    /// appending their keys and values to `cache` (incremental decoding).
    fn logits_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (t, p) = (ids.dims()[1], cache.len());
        let positions: Vec<i64> = (p as i64..(p + t) as i64).collect();
        let pos = Tensor::from_slice(&positions, &[t], ids.device())?;
        let mut x = self.wte.forward(ids)?.add(&self.wpe.forward(&pos)?)?;
        for (b, layer) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = b.forward_cached(&x, layer)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        self.wte.visit_params("wte", &mut v);
        self.wpe.visit_params("wpe", &mut v);
        for (i, b) in self.blocks.iter().enumerate() {
            b.visit_params(&format!("h.{i}"), &mut v);
        }
        self.ln_f.visit_params("ln_f", &mut v);
        self.head.visit_params("lm_head", &mut v);
        v
    }
}

/// A batch of `b` windows of `t + 1` tokens from `data`: inputs and next-token targets.
fn batch(data: &[i64], b: usize, t: usize, rng: &mut Rng) -> (Vec<i64>, Vec<i64>) {
    let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
    for _ in 0..b {
        let s = rng.below(data.len() - t - 1);
        x.extend_from_slice(&data[s..s + t]);
        y.extend_from_slice(&data[s + 1..s + t + 1]);
    }
    (x, y)
}

fn mean_loss(m: &Gpt, data: &[i64], c: &Config, rng: &mut Rng, dev: &Device) -> Result<f32> {
    let mut total = 0.0;
    for _ in 0..8 {
        let (x, y) = batch(data, c.batch, c.block, rng);
        let ids = Tensor::from_slice(&x, &[c.batch, c.block], dev)?;
        total += no_grad(|| m.logits(&ids)?.cross_entropy_ids(&y, None))?.item::<f32>()?;
    }
    Ok(total / 8.0)
}

/// Samples `n` characters after `prompt` with a KV cache: one prefill of
/// the last half window of `context` + prompt, then one id per step. When
/// the cache reaches the model's `block` positions, it starts again from
/// the last half window. The cache grows by `cat`, so the loop compiles one
/// executable per capacity bucket, not one per step.
fn sample(
    m: &Gpt,
    (context, prompt): (&[i64], &str),
    n: usize,
    chars: &[char],
    c: &Config,
    dev: &Device,
) -> Result<String> {
    let id_of = |ch: char| chars.iter().position(|&x| x == ch).unwrap_or(0) as i64;
    let mut ids: Vec<i64> = context.to_vec();
    ids.extend(prompt.chars().map(id_of));
    let mut rng = Rng(2024);
    let mut out = String::from(prompt);
    let mut cache = KvCache::new(m.blocks.len());
    let mut feed: Vec<i64> = ids[ids.len().saturating_sub(c.block / 2)..].to_vec();
    for _ in 0..n {
        if cache.len() + feed.len() > c.block {
            cache = KvCache::new(m.blocks.len());
            feed = ids[ids.len().saturating_sub(c.block / 2)..].to_vec();
        }
        let x = Tensor::from_slice(&feed, &[1, feed.len()], dev)?;
        let probs = no_grad(|| {
            let logits = m.logits_cached(&x, &mut cache)?;
            let t = logits.dims()[1];
            logits.narrow(1, t - 1, 1)?.mul(1.0 / 0.8)?.softmax(-1)
        })?;
        let p = probs.to_vec::<f32>()?;
        let mut u = rng.uniform() as f32;
        let next = p.iter().position(|&q| {
            u -= q;
            u <= 0.0
        });
        let next = next.unwrap_or(p.len() - 1);
        ids.push(next as i64);
        out.push(chars[next]);
        feed = vec![next as i64];
    }
    Ok(out)
}

impl Module for Gpt {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(ids)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        for (n, p) in self.params() {
            out.push((format!("{prefix}{n}"), p));
        }
    }
}

/// What the command line asks for.
struct Args {
    steps: usize,
    text: Option<String>,
    /// Mesh axes (`--mesh dp=2,tp=2`).
    mesh: Vec<(String, usize)>,
    fsdp: bool,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        steps: 1000,
        text: None,
        mesh: Vec::new(),
        fsdp: false,
    };
    let mut positional = 0;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--steps" => {
                let v = it.next().ok_or("--steps needs a number")?;
                a.steps = v
                    .parse()
                    .map_err(|_| format!("--steps {v}: not a number"))?;
            }
            "--mesh" => {
                let v = it.next().ok_or("--mesh needs axes, as dp=4 or dp=2,tp=2")?;
                for axis in v.split(',') {
                    let (name, size) = axis
                        .split_once('=')
                        .ok_or(format!("--mesh {v}: write axes as name=size"))?;
                    let size = size
                        .parse()
                        .map_err(|_| format!("--mesh {v}: {size} is not a size"))?;
                    a.mesh.push((name.to_string(), size));
                }
            }
            "--fsdp" => a.fsdp = true,
            _ if positional == 0 && !arg.starts_with("--") => {
                a.steps = arg
                    .parse()
                    .map_err(|_| format!("{arg}: not a step count"))?;
                positional += 1;
            }
            _ if positional == 1 && !arg.starts_with("--") => {
                a.text = Some(arg);
                positional += 1;
            }
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    if a.fsdp && a.mesh.is_empty() {
        return Err("--fsdp needs a --mesh".into());
    }
    Ok(a)
}

/// Places `model` on `mesh`: FSDP over `dp` with `fsdp`, else replicated;
/// with a `tp` axis, every block's linear layers Megatron-split over it.
fn place(model: &Gpt, mesh: &Mesh, fsdp: bool) -> Result<()> {
    if fsdp {
        parallel::fully_sharded(model, mesh, "dp")?;
    } else {
        parallel::data_parallel(model, mesh)?;
    }
    if mesh.axes().any(|(a, _)| a == "tp") {
        for b in &model.blocks {
            parallel::column_parallel(&b.attn.c_attn, mesh, "tp")?;
            parallel::row_parallel(&b.attn.c_proj, mesh, "tp")?;
            parallel::column_parallel(&b.c_fc, mesh, "tp")?;
            parallel::row_parallel(&b.c_proj, mesh, "tp")?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!(
            "train_gpt: {e}\nusage: train_gpt [steps] [text-file] [--steps N] [--mesh dp=4|dp=2,tp=2] [--fsdp]"
        );
        std::process::exit(2)
    });
    let steps = args.steps;
    let text = match &args.text {
        Some(path) => std::fs::read_to_string(path).expect("readable UTF-8 text file"),
        None => corpus(200_000, 42),
    };
    let mut chars: Vec<char> = text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let data: Vec<i64> = text
        .chars()
        .map(|ch| chars.binary_search(&ch).unwrap() as i64)
        .collect();
    let split = data.len() * 9 / 10;
    let (train, val) = (&data[..split], &data[split..]);
    let c = Config {
        block: 64,
        embd: 64,
        heads: 4,
        layers: 2,
        batch: 16,
    };
    let axes: Vec<(&str, usize)> = args.mesh.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    let devices: usize = axes.iter().map(|(_, n)| n).product();
    let (dev, mesh) = if axes.is_empty() {
        (Device::cpu()?, None)
    } else {
        let dev = Device::cpu_with_devices(devices)?;
        let mesh = Mesh::new(&dev, &axes)?;
        (dev, Some(mesh))
    };
    let model = Gpt::new(chars.len(), &c, &dev)?;
    if let Some(m) = &mesh {
        place(&model, m, args.fsdp)?;
        println!(
            "train_gpt: mesh {m} ({}), batch split over dp",
            if args.fsdp {
                "FSDP"
            } else {
                "parameters replicated"
            }
        );
    }
    let params = model.params();
    let n_params: usize = params.iter().map(|(_, p)| p.tensor().numel()).sum();
    println!(
        "train_gpt: {} characters ({} distinct), {} layers x {} dims x {} heads, context {}, batch {}, {n_params} parameters",
        data.len(),
        chars.len(),
        c.layers,
        c.embd,
        c.heads,
        c.block,
        c.batch
    );
    let mut rng = Rng(1);
    let initial_val = mean_loss(&model, val, &c, &mut Rng(9), &dev)?;
    let mut opt = AdamW::new(params_of(&params), 3e-3, 0.01)?;
    let mut bar = Progress::new(steps);
    let mut curve = Vec::new();
    for step in 1..=steps {
        let warm = (step as f64 / 20.0).min(1.0);
        opt.set_lr(3e-3 * warm);
        let (x, y) = batch(train, c.batch, c.block, &mut rng);
        let mut ids = Tensor::from_slice(&x, &[c.batch, c.block], &dev)?;
        if let Some(m) = &mesh {
            ids = ids.shard(m, &[Some("dp"), None])?;
        }
        let loss = model.logits(&ids)?.cross_entropy_ids(&y, None)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        let l = loss.item::<f32>()?;
        if step == 1 || step % (steps / 10).max(1) == 0 {
            curve.push((step, l));
        }
        bar.update(step, l);
    }
    let (train_time, rate) = (bar.elapsed(), bar.rate(steps));
    let final_val = mean_loss(&model, val, &c, &mut Rng(9), &dev)?;
    println!(
        "loss curve: {}",
        curve
            .iter()
            .map(|(s, l)| format!("{s}:{l:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("samples:");
    let newline = chars.binary_search(&'\n').map(|i| i as i64).unwrap_or(0);
    let end = val
        .iter()
        .rposition(|&t| t == newline)
        .unwrap_or(val.len() - 1)
        + 1;
    let context = &val[end.saturating_sub(c.block)..end];
    let (before, t0) = (metrics::snapshot(), std::time::Instant::now());
    let prompts = ["the ", "three plus ", "twenty minus ", "the clever "];
    for prompt in prompts {
        let s = sample(&model, (context, prompt), 60, &chars, &c, &dev)?;
        println!("  {}", s.lines().next().unwrap_or(""));
    }
    let (secs, m) = (t0.elapsed().as_secs_f64(), metrics::snapshot());
    println!(
        "sampling: {} tokens in {secs:.2} s ({:.0} tokens/s), {} compiles",
        60 * prompts.len(),
        (60 * prompts.len()) as f64 / secs,
        m.compiles - before.compiles
    );
    println!(
        "summary: {steps} steps in {train_time:.1} s ({rate:.2} steps/s), validation loss {initial_val:.3} -> {final_val:.3} (uniform: {:.3}), {} compiles, {} cache hits",
        (chars.len() as f64).ln(),
        m.compiles,
        m.cache_hits
    );
    Ok(())
}
