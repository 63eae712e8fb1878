//! Trains a DLRM (`lazyfuse_models::Dlrm`, the reference layout) on
//! synthetic Criteo-shaped click data and reports the held-out AUC.
//!
//! Each sample has 13 dense features and 26 categorical ones with Criteo's
//! spread of cardinalities (one table of 1M rows, a few of 100K and 10K,
//! many small), ids drawn from a power law (popular ids repeat), and a
//! click drawn from a hidden logistic model of both, so there is a signal
//! to learn. The tables train with sparse gradients: each step reads and
//! updates only the rows in its batch, in place (`SparseSgd`), the MLPs
//! with SGD. Run: `cargo run --release --example train_dlrm [steps]`

#[path = "support/progress.rs"]
mod progress;
#[path = "support/rng.rs"]
mod rng;

use lazyfuse::optim::{params_of, Optimizer, Sgd, SparseSgd};
use lazyfuse::{metrics, no_grad, Device, Result, Tensor};
use lazyfuse_models::{Dlrm, DlrmConfig};
use progress::Progress;
use rng::Rng;

const DENSE: usize = 13;

/// Criteo's shape: 26 categorical features, from 1M ids down to a handful.
fn cardinalities() -> Vec<usize> {
    let mut c = vec![1_000_000, 100_000, 100_000, 10_000, 10_000, 10_000];
    c.extend([
        1000, 500, 300, 200, 100, 100, 50, 50, 30, 20, 20, 10, 10, 10, 5, 5, 4, 3, 3, 2,
    ]);
    c
}

/// One batch: dense features, per table ids and offsets (one id per
/// sample, as Criteo has), and the clicks.
struct Batch {
    dense: Vec<f32>,
    ids: Vec<Vec<i64>>,
    clicks: Vec<f32>,
}

/// The hidden per-id effect of feature `k` (a hash in [-1, 1)).
fn effect(k: usize, id: usize) -> f64 {
    let h = lazyfuse::ir::splitmix64((k as u64) << 40 ^ id as u64);
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

fn batch(n: usize, cards: &[usize], rng: &mut Rng) -> Batch {
    let mut b = Batch {
        dense: Vec::with_capacity(n * DENSE),
        ids: vec![Vec::with_capacity(n); cards.len()],
        clicks: Vec::with_capacity(n),
    };
    for _ in 0..n {
        let mut logit = -0.5;
        for j in 0..DENSE {
            let v = rng.normal();
            logit += 0.3 * v * if j % 2 == 0 { 1.0 } else { -1.0 };
            b.dense.push(v as f32);
        }
        for (k, &card) in cards.iter().enumerate() {
            // Power law: id = card^u - 1 with u uniform, so small ids are common.
            let id = ((card as f64).powf(rng.uniform()) as usize)
                .saturating_sub(1)
                .min(card - 1);
            logit += 0.6 * effect(k, id) / (1.0 + k as f64 / 8.0);
            b.ids[k].push(id as i64);
        }
        let p = 1.0 / (1.0 + (-logit).exp());
        b.clicks.push((rng.uniform() < p) as u8 as f32);
    }
    b
}

/// A batch on the device: dense features, per table `(ids, offsets)`, clicks.
type DeviceBatch = (Tensor, Vec<(Tensor, Tensor)>, Tensor);

/// The device inputs of a batch.
fn upload(b: &Batch, dev: &Device) -> Result<DeviceBatch> {
    let n = b.clicks.len();
    let offsets = Tensor::arange(0.0, n as f64, lazyfuse::DType::I64, dev)?;
    let sparse = b
        .ids
        .iter()
        .map(|ids| Ok((Tensor::from_slice(ids, &[n], dev)?, offsets.clone())))
        .collect::<Result<Vec<_>>>()?;
    Ok((
        Tensor::from_slice(&b.dense, &[n, DENSE], dev)?,
        sparse,
        Tensor::from_slice(&b.clicks, &[n], dev)?,
    ))
}

/// The probability that a random click scores above a random non-click.
fn auc(scores: &[f32], labels: &[f32]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut pos) = (0.0, 0.0);
    for (r, &i) in order.iter().enumerate() {
        if labels[i] > 0.5 {
            rank_sum += (r + 1) as f64;
            pos += 1.0;
        }
    }
    let neg = labels.len() as f64 - pos;
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let dev = Device::cpu()?;
    let cards = cardinalities();
    let cfg = DlrmConfig {
        bottom: vec![DENSE, 64, 16],
        tables: cards.clone(),
        top_hidden: vec![64, 1],
    };
    let rows: usize = cards.iter().sum();
    println!(
        "train_dlrm: {} tables ({rows} rows of 16), bottom {:?}, top {} -> {:?}, batch 256",
        cards.len(),
        cfg.bottom,
        cfg.top_input(),
        cfg.top_hidden
    );
    let model = Dlrm::new(&cfg, 0, &dev)?;
    let mut dense_opt = Sgd::new(params_of(&model.dense_parameters()), 0.1, 0.0, 0.0)?;
    let sparse_opt = SparseSgd::new(0.1);
    let tables: Vec<_> = model.tables.iter().collect();
    let mut rng = Rng(11);
    let test = batch(8192, &cards, &mut rng);
    let mut bar = Progress::new(steps);
    let mut curve = Vec::new();
    for step in 1..=steps {
        let b = batch(256, &cards, &mut rng);
        let (dense, sparse, y) = upload(&b, &dev)?;
        dense_opt.zero_grad();
        let p = model.forward(&dense, &sparse)?;
        let loss = p.binary_cross_entropy(&y)?;
        loss.backward()?;
        dense_opt.step()?;
        sparse_opt.step(&tables)?;
        let l = loss.item::<f32>()?;
        if step % (steps / 8).max(1) == 0 {
            curve.push((step, l));
        }
        bar.update(step, l);
    }
    let (secs, rate) = (bar.elapsed(), bar.rate(steps));
    let (dense, sparse, _) = upload(&test, &dev)?;
    let scores = no_grad(|| model.forward(&dense, &sparse))?.to_vec::<f32>()?;
    let a = auc(&scores, &test.clicks);
    let m = metrics::snapshot();
    println!(
        "loss curve: {}",
        curve
            .iter()
            .map(|(s, l)| format!("{s}:{l:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "summary: {steps} steps in {secs:.1} s ({rate:.1} steps/s), held-out AUC {a:.4}, {} compiles",
        m.compiles
    );
    Ok(())
}
