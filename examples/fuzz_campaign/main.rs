//! A long differential fuzz campaign, outside CI:
//! `cargo run --release --example fuzz_campaign -- --programs 100000`.
//!
//! Each program comes from the same generator and three-way oracle as
//! `tests/fuzz_ops.rs` (`tests/fuzz_support`, included by path): it runs
//! fused and unfused on the XLA plugin and every observed value is checked
//! against the reference interpreter. Program `i` of seed `s` is built from
//! genes drawn from `(s, i)` alone, so `--seed s --replay i` reruns exactly
//! one program; worker threads share nothing but the plugin.
//!
//! A failing program is shrunk (`fuzz_support::shrink`) and written to
//! `--out` as a ready-to-paste regression test, and the campaign goes on.
//! Before it runs, each worker writes its current program to
//! `--out/worker<k>.rs`, so when a program kills the process (an abort in
//! XLA) the file holds it.
//!
//! At the end it prints programs per second and coverage (see
//! `coverage.rs`): counts over op × dtype × special-value class of the
//! operands × fused neighbours, and the combinations the generator never
//! built. `--coverage PATH` writes the table as JSON.
//!
//! The campaign runs in a child process that a supervisor restarts after a
//! crash, recording the crashing program (`supervise.rs`).
//!
//! Options: `--programs N` (default 1000), `--seed S` (default 1),
//! `--jobs J` (worker threads, default: the cores), `--max-genes G`
//! (default 24), `--out DIR` (default `target/fuzz_campaign`),
//! `--coverage PATH`, `--replay I`, `--shrink-budget B` (default 2000),
//! `--start I` (first program index; the supervisor's restarts use it),
//! `--unfused-every N` (default 1: the unfused run, which compiles one
//! executable per op and shape and so costs most of the time, checks one
//! program in `N`; fused runs are always checked, and a failure found
//! without it is still shrunk against the full check), `--learn-every N`
//! (default 1: the same for the output-selection learning runs, which
//! compile the program's regions again with other output sets).
//! `FUZZ_CAMPAIGN_ABORT_AT=I` makes the child abort at program `I`, to
//! check the supervisor.

#[path = "../../tests/fuzz_support/mod.rs"]
mod fuzz_support;

mod coverage;
mod supervise;

use coverage::Coverage;
use fuzz_support::oracle::{check_program_with, Checks};
use fuzz_support::values::Rng;
use fuzz_support::{build, check_program, random_genes, shrink_program, Gene, Program};
use indicatif::{ProgressBar, ProgressStyle};
use lazyfuse::Device;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct Options {
    programs: usize,
    seed: u64,
    jobs: usize,
    max_genes: usize,
    out: PathBuf,
    coverage: Option<PathBuf>,
    replay: Option<usize>,
    shrink_budget: usize,
    /// First program index (the supervisor resumes after a crash with it).
    start: usize,
    /// Run the campaign in this process (set by the supervisor).
    child: bool,
    /// Run the unfused check for one program in this many.
    unfused_every: usize,
    /// Run the output-selection learning check for one program in this many.
    learn_every: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        programs: 1000,
        seed: 1,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        max_genes: 24,
        out: PathBuf::from("target/fuzz_campaign"),
        coverage: None,
        replay: None,
        shrink_budget: 2000,
        start: 0,
        child: false,
        unfused_every: 1,
        learn_every: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--programs" => o.programs = num(value()?)? as usize,
            "--seed" => o.seed = num(value()?)?,
            "--jobs" => o.jobs = (num(value()?)? as usize).max(1),
            "--max-genes" => o.max_genes = (num(value()?)? as usize).max(1),
            "--out" => o.out = PathBuf::from(value()?),
            "--coverage" => o.coverage = Some(PathBuf::from(value()?)),
            "--replay" => o.replay = Some(num(value()?)? as usize),
            "--shrink-budget" => o.shrink_budget = num(value()?)? as usize,
            "--start" => o.start = num(value()?)? as usize,
            "--child" => o.child = true,
            "--unfused-every" => o.unfused_every = (num(value()?)? as usize).max(1),
            "--learn-every" => o.learn_every = (num(value()?)? as usize).max(1),
            "--help" | "-h" => return Err(String::new()),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// The genes of program `index` of `seed`: 1 to `max_genes` of them.
fn genes(seed: u64, index: usize, max_genes: usize) -> Vec<Gene> {
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64);
    let n = 1 + rng.below(max_genes);
    random_genes(&mut rng, n)
}

/// One failure, shrunk.
struct Finding {
    index: usize,
    why: String,
    test: String,
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            let usage = "usage: fuzz_campaign [--programs N] [--seed S] [--jobs J] \
                [--max-genes G] [--out DIR] [--coverage PATH] [--replay I] [--shrink-budget B] \
                [--start I] [--unfused-every N] [--learn-every N]";
            eprintln!("{e}\n{usage}");
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    if !o.child {
        std::fs::create_dir_all(&o.out).expect("creating --out");
        let args: Vec<String> = std::env::args().skip(1).collect();
        std::process::exit(supervise::supervise(&supervise::Plan {
            args: &args,
            out: &o.out,
            seed: o.seed,
            max_genes: o.max_genes,
            start: o.start,
        }));
    }
    let dev = Device::cpu().unwrap_or_else(|e| {
        eprintln!("fuzz_campaign: the XLA plugin did not load: {e}");
        std::process::exit(1)
    });
    std::fs::create_dir_all(&o.out).expect("creating --out");
    // Checks the supervisor: the child aborts at this program index.
    let abort_at: Option<usize> = std::env::var("FUZZ_CAMPAIGN_ABORT_AT")
        .ok()
        .and_then(|v| v.parse().ok());
    if let Some(i) = o.replay {
        let p = build(&genes(o.seed, i, o.max_genes));
        println!("{}", p.to_rust_test(&format!("seed{}_program{i}", o.seed)));
        if abort_at == Some(i) {
            std::process::abort();
        }
        match check_program(&p, &dev) {
            Ok(()) => println!("program {i} of seed {}: passes", o.seed),
            Err(e) => {
                println!("program {i} of seed {}: FAILS\n{e}", o.seed);
                std::process::exit(1);
            }
        }
        return;
    }

    let bar = ProgressBar::new(o.programs as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} programs, {per_sec}, eta {eta} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let next = AtomicUsize::new(o.start);
    bar.set_position(o.start as u64);
    let coverage = Mutex::new(Coverage::default());
    let findings: Mutex<Vec<Finding>> = Mutex::new(Vec::new());
    let start = Instant::now();
    let m0 = lazyfuse::metrics::snapshot();
    let o = Arc::new(o);
    std::thread::scope(|s| {
        for worker in 0..o.jobs {
            let (o, dev, bar) = (o.clone(), dev.clone(), bar.clone());
            let (next, coverage, findings, start) = (&next, &coverage, &findings, &start);
            s.spawn(move || {
                let current = o.out.join(format!("worker{worker}.rs"));
                let index = o.out.join(format!("worker{worker}.index"));
                let mut local = Coverage::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= o.programs {
                        break;
                    }
                    let p = build(&genes(o.seed, i, o.max_genes));
                    let name = format!("seed{}_program{i}", o.seed);
                    std::fs::write(&current, p.to_rust_test(&name)).expect("writing worker file");
                    std::fs::write(&index, i.to_string()).expect("writing worker index");
                    local.add(&p);
                    if abort_at == Some(i) {
                        std::process::abort();
                    }
                    let checks = Checks {
                        unfused: i % o.unfused_every == 0,
                        learning: i % o.learn_every == 0,
                    };
                    if let Err(why) = check_program_with(&p, &dev, checks) {
                        let f = shrink_failure(&o, &dev, i, &p, why);
                        bar.println(format!("program {i}: FAILS, written to --out: {}", f.why));
                        let path = o.out.join(format!("fail_{name}.rs"));
                        let text = format!("// {}\n{}", f.why.replace('\n', "\n// "), f.test);
                        std::fs::write(path, text).expect("writing a finding");
                        let mut all = findings.lock().unwrap();
                        all.push(f);
                        bar.set_message(format!("{} failing", all.len()));
                    }
                    bar.inc(1);
                    let done = bar.position();
                    if !std::io::stderr().is_terminal() && done % 250 == 0 {
                        // Not a terminal (a log file): a plain line instead.
                        let secs = start.elapsed().as_secs_f64();
                        let failing = findings.lock().unwrap().len();
                        eprintln!(
                            "{done}/{} programs, {secs:.0} s, {:.2} programs/s, {failing} failing",
                            o.programs,
                            (done as usize - o.start) as f64 / secs
                        );
                    }
                }
                let _ = std::fs::remove_file(&current);
                let _ = std::fs::remove_file(&index);
                coverage.lock().unwrap().merge(local);
            });
        }
    });
    bar.finish();
    let secs = start.elapsed().as_secs_f64();
    let m1 = lazyfuse::metrics::snapshot();
    let findings = findings.into_inner().unwrap();
    let coverage = coverage.into_inner().unwrap();
    println!(
        "fuzz_campaign: seed {}: programs {}..{} in {secs:.0} s ({:.2} programs/s, {} jobs, unfused run for 1 in {}, learning runs for 1 in {}), {} compiles ({:.0} s compiling), {} failing",
        o.seed,
        o.start,
        o.programs,
        o.programs.saturating_sub(o.start) as f64 / secs,
        o.jobs,
        o.unfused_every,
        o.learn_every,
        m1.compiles - m0.compiles,
        (m1.compile_ns - m0.compile_ns) as f64 * 1e-9,
        findings.len()
    );
    print!("{}", coverage.report());
    if let Some(path) = &o.coverage {
        std::fs::write(path, coverage.to_json()).expect("writing --coverage");
        println!("coverage table written to {}", path.display());
    }
    for f in &findings {
        println!(
            "\nprogram {} of seed {}: {}\n{}",
            f.index, o.seed, f.why, f.test
        );
    }
    if !findings.is_empty() {
        std::process::exit(1);
    }
}

/// Shrinks a failing program and describes the minimum.
fn shrink_failure(o: &Options, dev: &Device, index: usize, p: &Program, why: String) -> Finding {
    let small = shrink_program(p, o.shrink_budget, &mut |q| check_program(q, dev).is_err());
    let why = check_program(&small, dev).err().unwrap_or(why);
    Finding {
        index,
        why,
        test: small.to_rust_test(&format!("fuzz_seed{}_program{index}", o.seed)),
    }
}
