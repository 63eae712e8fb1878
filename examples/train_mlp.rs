//! Trains an MLP classifier on a 10-class spiral data set generated in code
//! (10 noisy spiral arms in the plane), reporting held-out accuracy.
//!
//! Every step (forward, backward, AdamW update) is recorded lazily and runs
//! as one fused XLA executable that is compiled once and then served from
//! the cache. Run: `cargo run --release --example train_mlp [steps]`

#[path = "support/progress.rs"]
mod progress;
#[path = "support/rng.rs"]
mod rng;

use lazyfuse::nn::{Linear, Module, Param};
use lazyfuse::optim::{params_of, AdamW, Optimizer};
use lazyfuse::{metrics, no_grad, Device, Result, Tensor};
use progress::Progress;
use rng::Rng;

const CLASSES: usize = 10;

/// `n` points: class `k` lies on the arm `theta = 2 pi k / 10 + 2.5 r`,
/// radius `r` uniform in `[0.15, 1]`, with Gaussian noise of 0.02 on each coordinate.
fn spirals(n: usize, rng: &mut Rng) -> (Vec<f32>, Vec<i64>) {
    let (mut x, mut y) = (Vec::with_capacity(2 * n), Vec::with_capacity(n));
    for i in 0..n {
        let k = i % CLASSES;
        let r = 0.15 + 0.85 * rng.uniform();
        let t = 2.0 * std::f64::consts::PI * k as f64 / CLASSES as f64 + 2.5 * r;
        x.push((r * t.cos() + 0.02 * rng.normal()) as f32);
        x.push((r * t.sin() + 0.02 * rng.normal()) as f32);
        y.push(k as i64);
    }
    (x, y)
}

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(dev: &Device) -> Result<Mlp> {
        let dims = [2, 128, 128, CLASSES];
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| Linear::new(d[0], d[1], true, 100 + i as u64, dev))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }

    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            l.visit_params(&format!("layers.{i}"), &mut v);
        }
        v
    }
}

fn accuracy(m: &Mlp, x: &Tensor, y: &[i64]) -> Result<f64> {
    let pred = no_grad(|| m.logits(x)?.argmax(-1, false))?.to_vec::<i64>()?;
    Ok(pred.iter().zip(y).filter(|(p, t)| p == t).count() as f64 / y.len() as f64)
}

fn main() -> Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let dev = Device::cpu()?;
    let mut rng = Rng(7);
    let (n_train, n_test, batch) = (8000, 2000, 256);
    let (xtr, ytr) = spirals(n_train, &mut rng);
    let (xte, yte) = spirals(n_test, &mut rng);
    let x_test = Tensor::from_slice(&xte, &[n_test, 2], &dev)?;

    let model = Mlp::new(&dev)?;
    let mut opt = AdamW::new(params_of(&model.params()), 3e-3, 1e-4)?;
    println!("train_mlp: 10-class spirals, {n_train} train / {n_test} test points, MLP 2-128-128-10, AdamW, batch {batch}");
    let mut bar = Progress::new(steps);
    let mut curve = Vec::new();
    for step in 1..=steps {
        // Cosine learning-rate decay: a new rate every step, never a recompile.
        let frac = step as f64 / steps as f64;
        opt.set_lr(3e-3 * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos()) + 1e-4);
        let start = (step * batch) % (n_train - batch);
        let xb = Tensor::from_slice(&xtr[2 * start..2 * (start + batch)], &[batch, 2], &dev)?;
        let loss = model
            .logits(&xb)?
            .cross_entropy_ids(&ytr[start..start + batch], None)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        let l = loss.item::<f32>()?;
        if step % (steps / 10).max(1) == 0 {
            curve.push((step, l));
        }
        bar.update(step, l);
    }
    let (train_time, rate) = (bar.elapsed(), bar.rate(steps));
    let acc = accuracy(&model, &x_test, &yte)?;
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
        "summary: {steps} steps in {train_time:.1} s ({rate:.0} steps/s), held-out accuracy {:.2}%, {} compiles, {} cache hits",
        100.0 * acc,
        m.compiles,
        m.cache_hits
    );
    if acc < 0.95 {
        eprintln!("warning: accuracy below the 95% target");
    }
    Ok(())
}
