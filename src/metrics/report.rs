//! The metrics report in two forms: a short summary a person reads at the
//! end of a run (counts, times in ms, the cache hit rate, compiles and why
//! they happened), and the full list of raw figures (every counter and
//! every histogram field, one `name: value` line each) for tools and tests.
//! `LAZYFUSE_METRICS=1` prints the summary at exit, `LAZYFUSE_METRICS=full`
//! the full list.

use super::{
    distribution, snapshot, FlushReason, Phase, Snapshot, RECENT_OUTPUTS, RECENT_RECOMPILES,
};
use std::fmt::Write;

/// How many recompile explanations the summary shows (the most recent).
const SUMMARY_RECOMPILES: usize = 5;

/// A short summary of what lazyfuse did so far in this process:
///
/// ```text
/// lazyfuse: 1,204 ops recorded, 12 flushes (read 10, sync 2), 14 regions run
/// compiles: 3 in 412.3 ms; cache hits: 11 (78.6% of executables requested)
/// time: plan 0.341 ms, launch 1.200 ms, await 3.400 ms
/// outputs: 10 values written, 2 left out, 0 recomputed
/// memory: 3 live buffers (12.0 KiB), peak 48.0 KiB; to device 2 (8.0 KiB), to host 12 (48 B)
/// recompile: input 0 shape [3, 29] -> [3, 31] (recorded at src/main.rs:12:9)
/// ```
///
/// Lines with nothing to say (no recompiles, no SPMD programs) are left
/// out. [`report_full`] has every raw figure.
pub fn report() -> String {
    let snap = snapshot();
    let mut s = String::new();
    let flushes: Vec<String> = FlushReason::ALL
        .iter()
        .filter(|&&r| snap.flushes_for(r) > 0)
        .map(|&r| format!("{} {}", r.name(), count(snap.flushes_for(r))))
        .collect();
    let _ = writeln!(
        s,
        "lazyfuse: {} ops recorded, {} flushes{}, {} regions run",
        count(snap.ops_recorded),
        count(snap.flushes()),
        if flushes.is_empty() {
            String::new()
        } else {
            format!(" ({})", flushes.join(", "))
        },
        count(snap.regions_executed)
    );
    let _ = writeln!(s, "{}", compiles_line(&snap));
    let times: Vec<String> = [Phase::Record, Phase::Plan, Phase::Launch, Phase::Await]
        .iter()
        .filter_map(|&p| {
            let d = distribution(p);
            (d.count > 0).then(|| format!("{} {}", phase_word(p), ms(d.sum)))
        })
        .collect();
    if !times.is_empty() {
        let _ = writeln!(s, "time: {}", times.join(", "));
    }
    let _ = writeln!(
        s,
        "outputs: {} values written, {} left out, {} recomputed",
        count(snap.region_outputs),
        count(snap.left_out),
        count(snap.recomputes)
    );
    let _ = writeln!(
        s,
        "memory: {} live buffers ({}), peak {}; to device {} ({}), to host {} ({})",
        count(snap.live_buffers),
        bytes(snap.live_buffer_bytes),
        bytes(snap.peak_live_buffer_bytes),
        count(snap.h2d_transfers),
        bytes(snap.h2d_bytes),
        count(snap.d2h_transfers),
        bytes(snap.d2h_bytes)
    );
    if snap.spmd_launches > 0 {
        let _ = writeln!(
            s,
            "spmd: {} programs run, {} collectives ({})",
            count(snap.spmd_launches),
            count(snap.collectives),
            bytes(snap.collective_bytes)
        );
    }
    if snap.region_failures > 0 {
        let _ = writeln!(s, "failures: {} regions", count(snap.region_failures));
    }
    let recent = RECENT_RECOMPILES.lock();
    for r in recent
        .iter()
        .skip(recent.len().saturating_sub(SUMMARY_RECOMPILES))
    {
        let _ = writeln!(s, "recompile: {r}");
    }
    s
}

/// The compiles line: how many, how long, the cache's hit rate, and the
/// recompiles by cause.
fn compiles_line(snap: &Snapshot) -> String {
    let hits = snap.cache_hits + snap.disk_cache_hits;
    let mut line = format!(
        "compiles: {} in {}; cache hits: {} ({:.1}% of executables requested)",
        count(snap.compiles),
        ms(snap.compile_ns),
        count(hits),
        100.0 * snap.cache_hit_rate()
    );
    if snap.disk_cache_hits > 0 {
        let _ = write!(line, ", {} from disk", count(snap.disk_cache_hits));
    }
    let causes: Vec<String> = crate::fusion::Cause::ALL
        .iter()
        .filter(|&&c| snap.recompiles_by_cause[c as usize] > 0)
        .map(|&c| format!("{} {}", c.name(), snap.recompiles_by_cause[c as usize]))
        .collect();
    if !causes.is_empty() {
        let _ = write!(line, "; recompiles: {}", causes.join(", "));
    }
    line
}

/// The word for `p` in the summary's time line.
fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Record => "record",
        Phase::Plan => "plan",
        Phase::Launch => "launch",
        Phase::Await => "await",
        _ => p.name(),
    }
}

/// `n` with thousands separators.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nanoseconds as milliseconds.
fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// A byte count in B, KiB, MiB or GiB.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Every raw figure, one `name: value` line each: every counter, the cache
/// hit rate, count/total/p50/p90/p99 of each [`Phase`], and the most recent
/// recompile explanations (`recompile: ...`) and output decisions
/// (`output: ...`).
pub fn report_full() -> String {
    let mut s = String::new();
    let snap = snapshot();
    for (k, v) in snap.entries() {
        let _ = writeln!(s, "{k}: {v}");
    }
    let _ = writeln!(s, "cache_hit_rate: {:.4}", snap.cache_hit_rate());
    for p in Phase::ALL {
        let d = distribution(p);
        let n = p.name();
        let _ = writeln!(s, "{n}_count: {}", d.count);
        let _ = writeln!(s, "{n}_total: {}", d.sum);
        let _ = writeln!(s, "{n}_p50: {}", d.p50);
        let _ = writeln!(s, "{n}_p90: {}", d.p90);
        let _ = writeln!(s, "{n}_p99: {}", d.p99);
    }
    for r in RECENT_RECOMPILES.lock().iter() {
        let _ = writeln!(s, "recompile: {r}");
    }
    for r in RECENT_OUTPUTS.lock().iter() {
        let _ = writeln!(s, "output: {r}");
    }
    s
}

fn print_summary() {
    eprint!("lazyfuse metrics\n{}", report());
}

fn print_full() {
    eprint!("lazyfuse metrics\n{}", report_full());
}

/// Registers the exit report once per process: the summary with
/// `LAZYFUSE_METRICS=1`, every raw figure with `LAZYFUSE_METRICS=full`.
pub(crate) fn install_exit_report() {
    if crate::config::metrics_at_exit() {
        let print = if crate::config::metrics_full() {
            print_full
        } else {
            print_summary
        };
        crate::exit::on_exit(crate::exit::Stage::Report, print);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_written_for_people() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(ms(1_500_000), "1.500 ms");
        assert_eq!(bytes(48), "48 B");
        assert_eq!(bytes(12 * 1024), "12.0 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn the_summary_is_short_and_the_full_report_has_every_field() {
        let summary = report();
        assert!(summary.starts_with("lazyfuse: "), "{summary}");
        assert!(summary.contains("compiles: "), "{summary}");
        assert!(
            summary.lines().count() <= 8 + SUMMARY_RECOMPILES,
            "{summary}"
        );
        let full = report_full();
        for field in [
            "ops_recorded: ",
            "compile_time_ns_p50: ",
            "cache_hit_rate: ",
        ] {
            assert!(full.contains(field), "{field} in {full}");
        }
    }
}
