//! Quickstart: eager-looking tensor code that lazyfuse records, fuses into one
//! XLA executable per step, compiles once and then serves from its cache.
//! Prints the results and the metrics report.
//!
//! Run: `cargo run --release --example quickstart`

use lazyfuse::{metrics, DType, Device, Tensor};

/// One forward pass of a tiny two-layer classifier: returns class probabilities.
fn forward(x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor) -> lazyfuse::Result<Tensor> {
    let h = x.matmul(w1)?.add(b1)?.gelu()?;
    let logits = h.matmul(w2)?;
    let shifted = logits.sub(&logits.max([-1], true)?)?;
    let e = shifted.exp()?;
    e.div(&e.sum([-1], true)?)
}

fn main() -> lazyfuse::Result<()> {
    let dev = Device::cpu()?;
    println!("device: {dev:?} ({} addressable)", dev.device_count());

    let w1 = (Tensor::randn(&[8, 16], 1, &dev)? * 0.35)?;
    let b1 = Tensor::zeros(&[16], DType::F32, &dev)?;
    let w2 = (Tensor::randn(&[16, 3], 2, &dev)? * 0.25)?;
    // Materialise the parameters once, so every step records the same graph.
    for p in [&w1, &b1, &w2] {
        p.realize()?;
    }

    for step in 0..3 {
        // A new batch each step; nothing below runs until a value is read.
        let x = Tensor::randn(&[4, 8], 100 + step, &dev)?;
        let probs = forward(&x, &w1, &b1, &w2)?;
        let pred = probs.argmax(-1, false)?;
        // Sync point: the step's graph is fused into one region and run.
        let before = metrics::snapshot();
        let classes = pred.to_vec::<i64>()?;
        let after = metrics::snapshot();
        println!(
            "step {step}: predicted classes {classes:?}, compiles this step: {}, cache hits: {}",
            after.compiles - before.compiles,
            after.cache_hits - before.cache_hits
        );
        if step == 2 {
            println!("probabilities:\n{probs}");
        }
    }

    println!("\nmetrics:\n{}", metrics::report());
    Ok(())
}
