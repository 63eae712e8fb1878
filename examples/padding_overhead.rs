//! What padding costs: the `decode_kv` workload (the runner's definition,
//! unchanged) on the same prompt lengths with dynamic axes (bucketed
//! capacities) and with exact shapes (`set_auto_dynamic(false)`, one
//! executable per length).
//!
//! Compiles are kept out of the comparison: each mode first runs the
//! generations twice (compiling what it needs), then a fresh copy of the
//! workload runs the same generations again, timed, with every executable
//! cached. Exact shapes compile about 200 executables per generation, so
//! this takes minutes.
//!
//!     cargo run --release --example padding_overhead -- [GENERATIONS]

#[path = "workloads/defs.rs"]
#[allow(dead_code)]
mod defs;

use lazyfuse::{metrics, set_auto_dynamic, Device, Result};
use std::time::Instant;

/// Milliseconds of each of `n` timed generations, and the compiles they
/// needed, after untimed passes over the same generations.
fn timed(dev: &Device, n: usize) -> Result<(Vec<f64>, u64)> {
    let build = defs::all()
        .into_iter()
        .find(|w| w.name == "decode_kv")
        .expect("the runner defines decode_kv")
        .build;
    // Two untimed passes: the first length a site sees runs exact shapes
    // (nothing is dynamic yet), so the second pass is the first to run
    // every generation bucketed.
    for _ in 0..2 {
        let mut warm = build(dev)?;
        for _ in 0..n {
            warm()?;
        }
    }
    let mut step = build(dev)?;
    let before = metrics::snapshot().compiles;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        step()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((ms, metrics::snapshot().compiles - before))
}

fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let dev = Device::cpu()?;
    let (bucketed, c1) = timed(&dev, n)?;
    set_auto_dynamic(false);
    let (exact, c2) = timed(&dev, n)?;
    set_auto_dynamic(true);
    let total = |v: &[f64]| v.iter().sum::<f64>();
    println!("generation ms, bucketed: {bucketed:.1?} ({c1} compiles while timed)");
    println!("generation ms, exact:    {exact:.1?} ({c2} compiles while timed)");
    println!(
        "padding overhead: bucketed / exact = {:.3}",
        total(&bucketed) / total(&exact)
    );
    Ok(())
}
