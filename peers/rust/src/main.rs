//! The base workloads of WORKLOADS.md in candle and burn (CPU, f32),
//! written the way their users write them, timed like the Python peers: one
//! `name<TAB>system<TAB>ms ms` line per workload, the median of the timed
//! iterations. candle runs eagerly, op by op; its CPU matmuls are the
//! `gemm` crate's.
//!
//! burn runs on its `ndarray` backend (autodiff for training), eagerly too.
//!
//! Usage: `rust-peers [workload ...] [--systems candle,burn] [--iters N] [--warmup N]`.

mod burn_peers;
mod candle_peers;

use std::time::Instant;

/// One workload iteration.
pub type Step = Box<dyn FnMut() -> Result<(), String>>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn time(step: &mut Step, warmup: usize, iters: usize) -> Result<f64, String> {
    for _ in 0..warmup {
        step()?;
    }
    let mut ts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        step()?;
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(ts))
}

fn main() {
    let mut names = Vec::new();
    let (mut systems, mut iters, mut warmup) = ("candle".to_string(), 20usize, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |flag: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
        };
        match a.as_str() {
            "--systems" => systems = val("--systems"),
            "--iters" => iters = val("--iters").parse().expect("--iters N"),
            "--warmup" => warmup = val("--warmup").parse().expect("--warmup N"),
            _ => names.push(a),
        }
    }
    if names.is_empty() {
        names = candle_peers::NAMES.iter().map(|s| s.to_string()).collect();
    }
    let mut failed = false;
    for system in systems.split(',') {
        let build = match system {
            "candle" => candle_peers::build,
            "burn" => burn_peers::build,
            _ => {
                eprintln!("rust-peers: no system {system} (candle, burn)");
                continue;
            }
        };
        for name in &names {
            let result = build(name)
                .and_then(|step| step.map(|mut s| time(&mut s, warmup, iters)).transpose());
            match result {
                Ok(Some(ms)) => println!("{name}\t{system}\t{ms:.3} ms"),
                // A workload candle cannot express: no row.
                Ok(None) => {}
                Err(e) => {
                    eprintln!("rust-peers: {name} on {system}: {e}");
                    failed = true;
                }
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
