//! Quickstart: a small eager-looking computation that lazyfuse records, fuses
//! into one XLA executable, and runs. Prints the result and the metrics report.
//!
//! Run: `cargo run --release --example quickstart`

use lazyfuse::{metrics, DType, Device, Tensor};

fn main() -> lazyfuse::Result<()> {
    let dev = Device::cpu()?;

    // A tiny two-layer network's forward pass on a batch of 4.
    let x = Tensor::randn(&[4, 8], 0, &dev)?;
    let w1 = (Tensor::randn(&[8, 16], 1, &dev)? * 0.35)?;
    let b1 = Tensor::zeros(&[16], DType::F32, &dev)?;
    let w2 = (Tensor::randn(&[16, 3], 2, &dev)? * 0.25)?;

    // Nothing below runs yet: each call is checked and recorded.
    let h = x.matmul(&w1)?.add(&b1)?.gelu()?;
    let logits = h.matmul(&w2)?;
    let shifted = logits.sub(&logits.max(&[-1], true)?)?;
    let probs = shifted.exp()?.div(&shifted.exp()?.sum(&[-1], true)?)?;
    let pred = probs.argmax(-1, false)?;

    // Sync points: the graph is flushed, fused, compiled once and run.
    println!("probabilities:\n{probs}");
    println!("predicted class per row: {:?}", pred.to_vec::<i64>()?);
    println!("row sums: {:?}", probs.sum(&[-1], false)?.to_vec::<f32>()?);

    // Run the same step again: same graph structure, so only cache hits.
    let again = x.matmul(&w1)?.add(&b1)?.gelu()?.matmul(&w2)?;
    println!(
        "second run max |diff|: {}",
        again.sub(&logits)?.abs()?.max_all()?.item::<f32>()?
    );

    println!("\nmetrics:\n{}", metrics::report());
    Ok(())
}
