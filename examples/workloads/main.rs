//! The workload runner: times the workloads of `../shared/WORKLOADS.md` fused
//! and unfused (and optionally the peers, in the same run) and prints median
//! ms per iteration, compiles during the timed part, and ratios.
//!
//! ```text
//! cargo run --release --example workloads -- [--fusion on|off|both] [--json PATH]
//!     [--chart PATH.png] [--iters N] [--warmup N] [--rounds N] [--peers PYTHON]
//!     [--peer-systems torch,xla,jaxjit,jaxeager] [--torch-frontend PYTHON]
//!     [--frontend-systems lf_device,lf_device_unfused,lf_compile,inductor]
//!     [--device cpu|cuda|interp] [NAME...]
//!
//! `--torch-frontend PYTHON` (a Python with torch and the `lazyfuse`
//! package) adds the same workloads written in plain PyTorch
//! (`python/benches/workloads.py`): on the lazyfuse device fused and
//! unfused, under `torch.compile(backend="lazyfuse")`, and under inductor.
//!
//! `--rounds N` repeats the whole measurement N times, lazyfuse and the
//! peers alternating, and reports each system's median over the rounds of
//! its per-round medians. On a shared host the load drifts over minutes;
//! one pass times lazyfuse and the peers minutes apart, so a burst of load
//! lands on one side only. Alternating rounds spread it over both.
//!
//! With both fused and unfused lazyfuse (`--fusion both`), each runs in a
//! process of its own every round (this binary again, with `--fusion on` or
//! `off`), as each peer system does: one system's allocations would
//! otherwise shape the other's heap. A fused `adam_200_small` step right
//! after 20 unfused ones in one process took 1.2-1.5x its time in a fresh
//! one for tens of steps (glibc's free-chunk consolidation on the executor
//! thread). Its workloads are set up and warmed up again each round.
//!
//! `--device cuda` runs on GPU 0 (`Device::cuda`) and the JAX peers on the
//! same GPU (`JAX_PLATFORMS=cuda`); the default peer systems are then
//! `jaxjit,jaxeager`, since the torch peers run on the CPU.
//! ```
//!
//! `--chart` also draws the ratios as a PNG bar chart (see `chart.rs`).

mod chart;
mod defs;
mod memory;
mod peers;

use lazyfuse::{metrics, Device, FusionGuard};
use peers::peers_round;
use std::collections::BTreeMap;
use std::time::Instant;

struct Args {
    fusion: Vec<bool>,
    json: Option<String>,
    chart: Option<std::path::PathBuf>,
    iters: usize,
    warmup: usize,
    rounds: usize,
    peers: Option<String>,
    peer_systems: Option<String>,
    torch_frontend: Option<String>,
    frontend_systems: Option<String>,
    device: String,
    names: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        fusion: vec![true, false],
        json: None,
        chart: None,
        iters: 20,
        warmup: 3,
        rounds: 1,
        peers: None,
        peer_systems: None,
        torch_frontend: None,
        frontend_systems: None,
        device: "cpu".into(),
        names: vec![],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--fusion" => {
                a.fusion = match val("--fusion")?.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![true, false],
                    o => return Err(format!("--fusion takes on|off|both, not {o}")),
                }
            }
            "--json" => a.json = Some(val("--json")?),
            "--chart" => a.chart = Some(val("--chart")?.into()),
            "--iters" => {
                a.iters = val("--iters")?
                    .parse()
                    .map_err(|e| format!("--iters: {e}"))?
            }
            "--warmup" => {
                a.warmup = val("--warmup")?
                    .parse()
                    .map_err(|e| format!("--warmup: {e}"))?
            }
            "--rounds" => {
                a.rounds = val("--rounds")?
                    .parse::<usize>()
                    .map_err(|e| format!("--rounds: {e}"))?
                    .max(1)
            }
            "--peers" => a.peers = Some(val("--peers")?),
            "--peer-systems" => a.peer_systems = Some(val("--peer-systems")?),
            "--torch-frontend" => a.torch_frontend = Some(val("--torch-frontend")?),
            "--frontend-systems" => a.frontend_systems = Some(val("--frontend-systems")?),
            "--device" => {
                a.device = val("--device")?;
                if !["cpu", "cuda", "interp"].contains(&a.device.as_str()) {
                    return Err(format!("--device takes cpu|cuda|interp, not {}", a.device));
                }
            }
            "-h" | "--help" => return Err(String::new()),
            name if !name.starts_with('-') => a.names.push(name.to_string()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

struct Record {
    workload: String,
    system: String,
    median_ms: f64,
    compiles_timed: Option<u64>,
    /// MB the resident-set peak of the timed steps rose above the resident
    /// size before them (lazyfuse rows on Linux; `memory.rs`).
    step_peak_mb: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: workloads [--fusion on|off|both] [--json PATH] [--chart PATH.png] [--iters N] [--warmup N] [--rounds N] [--peers PYTHON] [--peer-systems LIST] [--torch-frontend PYTHON] [--frontend-systems LIST] [--device cpu|cuda|interp] [NAME...]");
            std::process::exit(2);
        }
    };
    if let Some(Err(e)) = args.chart.as_deref().map(chart::check_path) {
        eprintln!("{e}");
        std::process::exit(2);
    }
    if args.fusion.len() > 1 {
        return run_systems_apart(&args);
    }
    let dev = match args.device.as_str() {
        "cuda" => Device::cuda(0),
        "interp" => Ok(Device::interpreter()),
        _ => Device::cpu(),
    }
    .unwrap_or_else(|e| {
        eprintln!("no {} device: {e}", args.device);
        std::process::exit(1)
    });
    eprintln!("device: {dev:?}");
    let all = defs::all();
    let names = workload_names(&args, &all);
    let mut benches = Vec::new();
    for name in &names {
        let w = all.iter().find(|w| w.name == name).expect("checked");
        for &fuse in &args.fusion {
            let _g = FusionGuard::new(fuse);
            let step = (w.build)(&dev).unwrap_or_else(|e| panic!("{name}: setup failed: {e}"));
            benches.push((name.clone(), fuse, step));
        }
    }
    let mut rounds: Vec<Vec<Record>> = Vec::new();
    for round in 0..args.rounds {
        if args.rounds > 1 {
            eprintln!("round {} of {}", round + 1, args.rounds);
        }
        let mut records = Vec::new();
        for (name, fuse, step) in &mut benches {
            records.push(time_lazyfuse(name, *fuse, step, &args, round == 0));
        }
        records.extend(peers_round(&args, &names));
        rounds.push(records);
    }
    report(&args, &names, across_rounds(rounds));
}

/// The workloads to run: those named, or all; exits on an unknown name.
fn workload_names(args: &Args, all: &[defs::Workload]) -> Vec<String> {
    if args.names.is_empty() {
        return all.iter().map(|w| w.name.to_string()).collect();
    }
    for name in &args.names {
        if !all.iter().any(|w| w.name == name) {
            eprintln!(
                "unknown workload {name}; known: {:?}",
                all.iter().map(|w| w.name).collect::<Vec<_>>()
            );
            std::process::exit(2);
        }
    }
    args.names.clone()
}

/// The table on stdout, and the `--json` and `--chart` files.
fn report(args: &Args, names: &[String], records: Vec<Record>) {
    print_table(&records, names);
    let mem: Vec<(&Record, f64)> = records
        .iter()
        .filter_map(|r| r.step_peak_mb.map(|m| (r, m)))
        .collect();
    if !mem.is_empty() {
        println!("\nPeak memory of the timed steps, above the resident size before them:\n");
        println!("| workload | system | step peak (MB) |\n|---|---|---|");
        for (r, m) in mem {
            println!("| {} | {} | {m:.1} |", r.workload, r.system);
        }
    }
    if let Some(path) = &args.json {
        let body: Vec<String> = records
            .iter()
            .map(|r| {
                let c = r.compiles_timed.map_or("null".to_string(), |c| c.to_string());
                let m = r.step_peak_mb.map_or("null".to_string(), |m| format!("{m:.1}"));
                format!(
                    "  {{\"workload\": \"{}\", \"system\": \"{}\", \"median_ms\": {:.4}, \"compiles_timed\": {c}, \"step_peak_mb\": {m}}}",
                    r.workload, r.system, r.median_ms
                )
            })
            .collect();
        std::fs::write(path, format!("[\n{}\n]\n", body.join(",\n")))
            .unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
    if let Some(path) = &args.chart {
        let figures: Vec<(&str, &str, f64)> = records
            .iter()
            .map(|r| (r.workload.as_str(), r.system.as_str(), r.median_ms))
            .collect();
        let data = chart::ChartData::from_figures(&figures, names);
        match chart::write_png(path, &data) {
            Ok(()) => eprintln!("chart written to {}", path.display()),
            Err(e) => {
                eprintln!("cannot write chart {}: {e}", path.display());
                std::process::exit(1);
            }
        }
    }
}

/// `--fusion both`: every round, each lazyfuse system in a child process of
/// its own running every workload (as each peer system runs), then the
/// peers; the same report as an in-process run.
fn run_systems_apart(args: &Args) {
    let names = workload_names(args, &defs::all());
    let mut rounds: Vec<Vec<Record>> = Vec::new();
    for round in 0..args.rounds {
        if args.rounds > 1 {
            eprintln!("round {} of {}", round + 1, args.rounds);
        }
        let mut records = Vec::new();
        for &fuse in &args.fusion {
            records.extend(run_system_child(args, fuse, &names));
        }
        records.extend(peers_round(args, &names));
        rounds.push(records);
    }
    report(args, &names, across_rounds(rounds));
}

/// The workloads on one lazyfuse system, timed by this binary in a child
/// process (`--fusion on|off --rounds 1 --json PATH`); its records.
fn run_system_child(args: &Args, fuse: bool, names: &[String]) -> Vec<Record> {
    let json = std::env::temp_dir().join(format!(
        "lazyfuse-workloads-{}-{fuse}.json",
        std::process::id()
    ));
    let exe = std::env::current_exe().expect("the runner's own path");
    let status = std::process::Command::new(exe)
        .args(["--fusion", if fuse { "on" } else { "off" }, "--rounds", "1"])
        .args(["--iters", &args.iters.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--device", &args.device])
        .arg("--json")
        .arg(&json)
        .args(names)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run the runner again: {e}"));
    if !status.success() {
        eprintln!("the runner with fusion {fuse} failed: {status}");
        std::process::exit(1);
    }
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    let _ = std::fs::remove_file(&json);
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    rows.iter()
        .map(|r| Record {
            workload: r["workload"].as_str().unwrap_or_default().to_string(),
            system: r["system"].as_str().unwrap_or_default().to_string(),
            median_ms: r["median_ms"].as_f64().unwrap_or(f64::NAN),
            compiles_timed: r["compiles_timed"].as_u64(),
            step_peak_mb: r["step_peak_mb"].as_f64(),
        })
        .collect()
}

/// Times one workload's step: warm-up (first round only), then `iters`
/// timed steps; returns their median and the compiles they caused.
fn time_lazyfuse(
    name: &str,
    fuse: bool,
    step: &mut defs::Step,
    args: &Args,
    first: bool,
) -> Record {
    let _g = FusionGuard::new(fuse);
    if first {
        for _ in 0..args.warmup {
            step().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    let before = metrics::snapshot();
    let peak = memory::StepPeak::start();
    let times: Vec<f64> = (0..args.iters)
        .map(|_| {
            let t0 = Instant::now();
            step().unwrap_or_else(|e| panic!("{name}: {e}"));
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let step_peak_mb = peak.finish();
    let after = metrics::snapshot();
    let system = if fuse {
        "lazyfuse"
    } else {
        "lazyfuse-nofusion"
    };
    let rec = Record {
        workload: name.to_string(),
        system: system.into(),
        median_ms: median(times),
        compiles_timed: Some(after.compiles - before.compiles),
        step_peak_mb,
    };
    eprintln!(
        "{name:<24} {system:<18} {:>10.3} ms  compiles(timed) {}  cache hits(timed) {}  step peak +{:.1} MB",
        rec.median_ms,
        after.compiles - before.compiles,
        after.cache_hits - before.cache_hits,
        step_peak_mb.unwrap_or(f64::NAN)
    );
    rec
}

/// One record per (workload, system): the median of its per-round medians,
/// with the compiles of every round's timed steps added up.
fn across_rounds(rounds: Vec<Vec<Record>>) -> Vec<Record> {
    let mut order: Vec<(String, String)> = Vec::new();
    type Acc = (Vec<f64>, Option<u64>, Option<f64>);
    let mut by: BTreeMap<(String, String), Acc> = BTreeMap::new();
    for r in rounds.into_iter().flatten() {
        let key = (r.workload, r.system);
        if !by.contains_key(&key) {
            order.push(key.clone());
        }
        let e = by.entry(key).or_insert((Vec::new(), None, None));
        e.0.push(r.median_ms);
        if let Some(c) = r.compiles_timed {
            e.1 = Some(e.1.unwrap_or(0) + c);
        }
        if let Some(m) = r.step_peak_mb {
            e.2 = Some(e.2.unwrap_or(0f64).max(m));
        }
    }
    order
        .into_iter()
        .map(|key| {
            let (ms, compiles, step_peak_mb) = by.remove(&key).unwrap_or_default();
            Record {
                workload: key.0,
                system: key.1,
                median_ms: median(ms),
                compiles_timed: compiles,
                step_peak_mb,
            }
        })
        .collect()
}

fn print_table(records: &[Record], names: &[String]) {
    let mut systems: Vec<String> = Vec::new();
    for r in records {
        if !systems.contains(&r.system) {
            systems.push(r.system.clone());
        }
    }
    let get: BTreeMap<(String, String), f64> = records
        .iter()
        .map(|r| ((r.workload.clone(), r.system.clone()), r.median_ms))
        .collect();
    print!("| workload |");
    for s in &systems {
        print!(" {s} |");
    }
    let ratio_cols: Vec<&String> = systems
        .iter()
        .filter(|s| s.as_str() != "lazyfuse")
        .collect();
    for s in &ratio_cols {
        print!(" {s} / lazyfuse |");
    }
    println!();
    println!("|{}", "---|".repeat(1 + systems.len() + ratio_cols.len()));
    for n in names {
        print!("| {n} |");
        for s in &systems {
            match get.get(&(n.clone(), s.clone())) {
                Some(ms) => print!(" {ms:.3} |"),
                None => print!(" - |"),
            }
        }
        let base = get.get(&(n.clone(), "lazyfuse".to_string()));
        for s in &ratio_cols {
            match (base, get.get(&(n.clone(), (*s).clone()))) {
                (Some(b), Some(o)) => print!(" {:.2}x |", o / b),
                _ => print!(" - |"),
            }
        }
        println!();
    }
}
