//! Trains a ResNet (torchvision's ResNet-18 layout at a quarter of its
//! width, `lazyfuse_models::ResNet`) on synthetic CIFAR-shaped images and
//! reports the held-out accuracy.
//!
//! Each of the 10 classes is a fixed random low-frequency colour pattern;
//! an image is its class's pattern, randomly shifted by up to 4 pixels and
//! buried in noise of about five times its amplitude, so the network has to learn
//! translation-tolerant features. Training mode (batch statistics) for the
//! steps, evaluation mode (running statistics) for the test set.
//! Run: `cargo run --release --example train_resnet [steps]`

#[path = "support/progress.rs"]
mod progress;
#[path = "support/rng.rs"]
mod rng;

use lazyfuse::nn::Module;
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{metrics, no_grad, Device, Tensor};
use lazyfuse_models::ResNet;
use progress::Progress;
use rng::Rng;

const CLASSES: usize = 10;
const SIDE: usize = 32;
const PIXELS: usize = 3 * SIDE * SIDE;

/// A smooth random pattern: a sum of a few random 2-D cosines per channel.
fn pattern(rng: &mut Rng) -> Vec<f32> {
    let mut p = vec![0f32; PIXELS];
    for c in 0..3 {
        for _ in 0..3 {
            let (fx, fy) = (rng.uniform() * 0.4, rng.uniform() * 0.4);
            let phase = rng.uniform() * std::f64::consts::TAU;
            for y in 0..SIDE {
                for x in 0..SIDE {
                    p[(c * SIDE + y) * SIDE + x] +=
                        ((fx * x as f64 + fy * y as f64 + phase).cos() * 0.6) as f32;
                }
            }
        }
    }
    p
}

/// `n` images with labels: pattern shifted (wrapping) plus noise.
fn images(n: usize, patterns: &[Vec<f32>], rng: &mut Rng) -> (Vec<f32>, Vec<i64>) {
    let (mut x, mut y) = (Vec::with_capacity(n * PIXELS), Vec::with_capacity(n));
    for _ in 0..n {
        let k = rng.below(CLASSES);
        let (dx, dy) = (rng.below(9), rng.below(9));
        for c in 0..3 {
            for r in 0..SIDE {
                for col in 0..SIDE {
                    let src = (c * SIDE + (r + dy) % SIDE) * SIDE + (col + dx) % SIDE;
                    x.push(patterns[k][src] + 5.0 * rng.normal() as f32);
                }
            }
        }
        y.push(k as i64);
    }
    (x, y)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dev = Device::cpu()?;
    let mut rng = Rng(5);
    let patterns: Vec<Vec<f32>> = (0..CLASSES).map(|_| pattern(&mut rng)).collect();
    let model = ResNet::random_with_width(false, [2, 2, 2, 2], 16, CLASSES, 1, &dev)?;
    let params = model.parameters();
    let count: usize = params.iter().map(|(_, p)| p.tensor().numel()).sum();
    let mut opt = Sgd::new(params_of(&params), 0.05, 0.9, 5e-4)?;
    let batch = 64;
    println!("train_resnet: ResNet-18 layout, width 16 ({count} parameters), 10-class shifted noisy patterns 3x32x32, SGD momentum 0.9, batch {batch}");
    let mut bar = Progress::new(steps);
    let mut curve = Vec::new();
    for step in 1..=steps {
        let (xb, yb) = images(batch, &patterns, &mut rng);
        let x = Tensor::from_slice(&xb, &[batch, 3, SIDE, SIDE], &dev)?;
        let loss = model.forward(&x)?.cross_entropy_ids(&yb, None)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        let l = loss.item::<f32>()?;
        if step % (steps / 10).max(1) == 0 {
            curve.push((step, l));
        }
        bar.update(step, l);
    }
    let (secs, rate) = (bar.elapsed(), bar.rate(steps));
    model.set_train(false);
    let (mut right, test_batches) = (0, 8);
    for _ in 0..test_batches {
        let (xb, yb) = images(batch, &patterns, &mut rng);
        let x = Tensor::from_slice(&xb, &[batch, 3, SIDE, SIDE], &dev)?;
        let pred = no_grad(|| model.forward(&x)?.argmax(-1, false))?.to_vec::<i64>()?;
        right += pred.iter().zip(&yb).filter(|(p, t)| p == t).count();
    }
    let acc = right as f64 / (test_batches * batch) as f64;
    println!(
        "loss curve: {}",
        curve
            .iter()
            .map(|(s, l)| format!("{s}:{l:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "summary: {steps} steps in {secs:.1} s ({rate:.2} steps/s), held-out accuracy {:.1}%, {} compiles",
        100.0 * acc,
        metrics::snapshot().compiles
    );
    Ok(())
}
