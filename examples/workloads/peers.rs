//! Running the peers: the Python scripts (`--peers PYTHON`: the shared
//! peers script for WORKLOADS.md's base workloads, this repository's for
//! the later ones; `--torch-frontend PYTHON`: the PyTorch front end) and the
//! Rust peers (`--peer-systems candle,burn`: `peers/rust`, built on first
//! use).
//! Every peer is a process of its own that prints one
//! `name<TAB>system<TAB>ms ms` line per workload.

use crate::{defs, Args, Record};
use std::path::PathBuf;

/// The peer systems written in Rust (`peers/rust`), which need no Python.
const RUST_SYSTEMS: [&str; 2] = ["candle", "burn"];

/// A peer's command line before its arguments.
pub struct Cmd {
    program: PathBuf,
    script: Option<PathBuf>,
}

impl Cmd {
    fn python(python: &str, script: PathBuf) -> Cmd {
        Cmd {
            program: PathBuf::from(python),
            script: Some(script),
        }
    }
}

/// The Rust peers named in `--peer-systems` on `names` (the base
/// workloads; others give no row): `peers/rust` is built (`cargo build
/// --release`, its own workspace, minutes the first time) and run.
fn rust_peers(args: &Args, names: &[String]) -> Vec<Record> {
    let Some(systems) = &args.peer_systems else {
        return Vec::new();
    };
    let systems: Vec<&str> = systems
        .split(',')
        .filter(|s| RUST_SYSTEMS.contains(s))
        .collect();
    if systems.is_empty() || args.device != "cpu" {
        return Vec::new();
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/rust");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("cannot build the Rust peers in {}", dir.display());
        return Vec::new();
    }
    let base: Vec<String> = names
        .iter()
        .filter(|n| !defs::lazyfuse_only(n) && !defs::repo_peers(n))
        .cloned()
        .collect();
    if base.is_empty() {
        return Vec::new();
    }
    let cmd = Cmd {
        program: dir.join("target/release/lazyfuse-rust-peers"),
        script: None,
    };
    run_peers(
        &cmd,
        &args.device,
        &systems.join(","),
        &base,
        args.iters,
        args.warmup,
    )
}

/// Runs one invocation of the peers script; returns its records and whether it succeeded.
fn run_peers_once(
    cmd: &Cmd,
    device: &str,
    system: &str,
    names: &[String],
    iters: usize,
    warmup: usize,
) -> (Vec<Record>, bool) {
    // The peers run on the same kind of device: JAX on the GPU for
    // `--device cuda`, on the CPU otherwise (it would pick a GPU if it saw one).
    let platform = if device == "cuda" { "cuda" } else { "cpu" };
    let out = std::process::Command::new(&cmd.program)
        .env("JAX_PLATFORMS", platform)
        .args(&cmd.script)
        .args(names)
        .args([
            "--systems",
            system,
            "--iters",
            &iters.to_string(),
            "--warmup",
            &warmup.to_string(),
        ])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cannot run peers with {}: {e}", cmd.program.display());
            return (vec![], false);
        }
    };
    let records = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let ms = f.get(2)?.trim_end_matches(" ms").parse().ok()?;
            Some(Record {
                workload: f[0].into(),
                system: f[1].into(),
                median_ms: ms,
                compiles_timed: None,
                step_peak_mb: None,
            })
        })
        .collect();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        eprintln!("peer {system} failed on {names:?}: {last}");
    }
    (records, out.status.success())
}

/// Runs the peers, one system at a time; a system that crashes on one
/// workload is rerun workload by workload so the others still count.
fn run_peers(
    cmd: &Cmd,
    device: &str,
    systems: &str,
    names: &[String],
    iters: usize,
    warmup: usize,
) -> Vec<Record> {
    let mut all = Vec::new();
    for system in systems.split(',').filter(|s| !s.is_empty()) {
        let (records, ok) = run_peers_once(cmd, device, system, names, iters, warmup);
        if ok || names.len() == 1 {
            all.extend(records);
            continue;
        }
        for n in names {
            let (r, _) =
                run_peers_once(cmd, device, system, std::slice::from_ref(n), iters, warmup);
            all.extend(r);
        }
    }
    all
}

/// One round of the peers (`--peers`), on the workloads they implement,
/// and of the PyTorch front end (`--torch-frontend`: the same workloads
/// in plain PyTorch on the lazyfuse device and under `torch.compile`).
pub fn peers_round(args: &Args, names: &[String]) -> Vec<Record> {
    let mut out = other_peers(args, names);
    out.extend(rust_peers(args, names));
    if let Some(py) = &args.torch_frontend {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/benches/workloads.py");
        let systems = args
            .frontend_systems
            .as_deref()
            .unwrap_or("lf_device,lf_device_unfused,lf_compile,inductor");
        out.extend(run_peers(
            &Cmd::python(py, script),
            &args.device,
            systems,
            names,
            args.iters,
            args.warmup,
        ));
    }
    out
}

/// The peer systems (`--peers`): PyTorch, torch_xla and JAX.
fn other_peers(args: &Args, names: &[String]) -> Vec<Record> {
    let Some(py) = &args.peers else {
        return Vec::new();
    };
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers/workloads.py");
    // On a GPU only JAX runs on the same device (the torch peers are CPU).
    let default_peers = if args.device == "cuda" {
        "jaxjit,jaxeager"
    } else {
        "torch,xla,jaxjit,jaxeager"
    };
    let systems = args.peer_systems.as_deref().unwrap_or(default_peers);
    let systems: Vec<&str> = systems
        .split(',')
        .filter(|s| !RUST_SYSTEMS.contains(s))
        .collect();
    if systems.is_empty() {
        return Vec::new();
    }
    let systems = &systems.join(",");
    // The shared script defines WORKLOADS.md's base workloads; the ones
    // added since have their peers in this repository's script.
    let (repo, shared): (Vec<String>, Vec<String>) = names
        .iter()
        .filter(|n| !defs::lazyfuse_only(n))
        .cloned()
        .partition(|n| defs::repo_peers(n));
    let repo_script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/peers/more_workloads.py");
    let mut records = Vec::new();
    for (script, names) in [(&script, shared), (&repo_script, repo)] {
        if !names.is_empty() {
            records.extend(run_peers(
                &Cmd::python(py, script.clone()),
                &args.device,
                systems,
                &names,
                args.iters,
                args.warmup,
            ));
        }
    }
    records
}
