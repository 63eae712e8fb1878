//! Prints lazyfuse's `tracing` spans and events with `tracing-subscriber`:
//! `flush` (reason, nodes), `plan` (nodes), `region` (key, nodes), `compile`
//! (region key, StableHLO bytes), `execute` (args, bytes), `h2d`/`d2h`
//! (bytes), `record` (op, trace level), and the warn-level recompile
//! explanation when the input shape changes in the third step.
//!
//! Run: `cargo run --release --example trace`
//! (set `TRACE_RECORD=1` to see every recorded op as well).

use lazyfuse::{metrics, Device, Tensor};
use tracing_subscriber::fmt::format::FmtSpan;

fn step(x: &Tensor) -> lazyfuse::Result<Vec<f32>> {
    let y = (x.tanh()? * 2.0)?.sum([-1], false)?;
    y.to_vec::<f32>()
}

fn main() -> lazyfuse::Result<()> {
    let level = if std::env::var_os("TRACE_RECORD").is_some() {
        tracing::Level::TRACE
    } else {
        tracing::Level::DEBUG
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        // One line per closed span, with its fields and its duration.
        .with_span_events(FmtSpan::CLOSE)
        .with_target(false)
        .init();

    let dev = Device::cpu()?;
    for cols in [16, 16, 24] {
        let x = Tensor::randn(&[4, cols], 7, &dev)?;
        println!("cols {cols}: {:?}", step(&x)?);
    }
    let d = metrics::distribution(metrics::Phase::Compile);
    println!(
        "compiles: {}, recompiles: {}, compile p50 ~{:.1} ms",
        metrics::snapshot().compiles,
        metrics::snapshot().recompiles(),
        d.p50 as f64 / 1e6
    );
    Ok(())
}
