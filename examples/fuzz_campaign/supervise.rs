//! Campaigns that survive crashes.
//!
//! A program that kills the process (an abort or SIGFPE inside XLA: the
//! worst kind of finding) would end a campaign of 100,000 programs at the
//! first one. So by default the campaign runs in a child process
//! (`--child`) and this parent restarts it after a crash: each worker
//! records the index of its current program in `--out/worker<k>.index`, the
//! parent replays every program that was in flight on its own (`--replay`,
//! in a fresh child) to find the one that crashes, writes it to
//! `--out/crash_seed<s>_program<i>.rs`, and resumes after the in-flight
//! indices (`--start`); an in-flight program that fails without crashing
//! is written like any finding. Crashing programs are not shrunk: every
//! shrinking step could kill the process again. Each child prints its own
//! statistics and coverage, so after a restart the report covers the
//! programs since it.

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Instant;

/// What the parent needs of the options.
pub struct Plan<'a> {
    pub args: &'a [String],
    pub out: &'a Path,
    pub seed: u64,
    pub max_genes: usize,
    pub start: usize,
}

/// The arguments without `--start N` (the parent sets it per child).
fn without_start(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--start" {
            it.next();
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// The program indices workers had in flight when the child died.
fn in_flight(out: &Path) -> Vec<usize> {
    let mut v: Vec<usize> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".index"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .collect();
    v.sort_unstable();
    v
}

fn clear_indices(out: &Path) {
    for e in std::fs::read_dir(out).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().ends_with(".index") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A clean exit of the child: 0 (no finding) or 1 (findings written).
fn finished(s: &ExitStatus) -> bool {
    matches!(s.code(), Some(0) | Some(1))
}

/// Runs the campaign in children until it completes; returns the exit code.
pub fn supervise(plan: &Plan<'_>) -> i32 {
    let exe = std::env::current_exe().expect("the campaign's own path");
    let base = without_start(plan.args);
    let t0 = Instant::now();
    let (mut start, mut crashes, mut restarts) = (plan.start, 0usize, 0usize);
    loop {
        clear_indices(plan.out);
        let status = Command::new(&exe)
            .args(&base)
            .args(["--child", "--start", &start.to_string()])
            .status()
            .expect("starting the campaign child");
        if finished(&status) {
            eprintln!(
                "fuzz_campaign: done in {:.0} s, {restarts} restart(s) after crashes, {crashes} crashing program(s) in {}",
                t0.elapsed().as_secs_f64(),
                plan.out.display()
            );
            return if crashes > 0 {
                1
            } else {
                status.code().unwrap_or(1)
            };
        }
        let suspects = in_flight(plan.out);
        let Some(&last) = suspects.last() else {
            eprintln!("fuzz_campaign: the child died ({status}) with no program in flight");
            return 2;
        };
        restarts += 1;
        for i in suspects {
            let replay = Command::new(&exe)
                .args(["--child", "--replay", &i.to_string()])
                .args(["--seed", &plan.seed.to_string()])
                .args(["--max-genes", &plan.max_genes.to_string()])
                .arg("--out")
                .arg(plan.out.join("replay"))
                .output()
                .expect("starting a replay child");
            let program = String::from_utf8_lossy(&replay.stdout);
            if replay.status.code() == Some(1) {
                // In flight when another program crashed, and failing: kept
                // (unshrunk) like any finding.
                let name = format!("fail_seed{}_program{i}.rs", plan.seed);
                std::fs::write(plan.out.join(&name), program.as_bytes())
                    .expect("writing a finding");
                eprintln!("fuzz_campaign: program {i} fails, written to {name}");
                continue;
            }
            if finished(&replay.status) {
                continue;
            }
            crashes += 1;
            let name = format!("crash_seed{}_program{i}.rs", plan.seed);
            let text = format!(
                "// program {i} of seed {} kills the process: {}\n{program}",
                plan.seed, replay.status
            );
            std::fs::write(plan.out.join(&name), text).expect("writing a crash");
            eprintln!(
                "fuzz_campaign: program {i} crashes ({}), written to {name}",
                replay.status
            );
        }
        start = last + 1;
    }
}
