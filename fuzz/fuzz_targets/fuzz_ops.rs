//! Fuzz target: arbitrary bytes → genes (through `arbitrary`) → a well-typed
//! op program (`tests/fuzz_support`, shared with `tests/fuzz_ops.rs`) → the
//! same three-way oracle (fused, unfused, reference interpreter).
//!
//! Two entry points (see `fuzz/README.md`):
//! - with `--features libfuzzer` (what `cargo fuzz run` uses) a libFuzzer target;
//! - without it a plain binary: `fuzz_ops [FILE|DIR]...` replays inputs (e.g.
//!   a corpus or a crash artifact); with no arguments it runs `FUZZ_CASES`
//!   random inputs from `FUZZ_SEED`. A failure is shrunk greedily and printed
//!   as a ready-to-paste `#[test]` for `tests/fuzz_ops.rs`.
#![cfg_attr(feature = "libfuzzer", no_main)]

#[path = "../../tests/fuzz_support/mod.rs"]
#[allow(dead_code)]
mod fuzz_support;

use arbitrary::{Result, Unstructured};
use fuzz_support::{build, check_program, shrink, shrink_program, Gene};
use lazyfuse::Device;
use std::sync::OnceLock;

fn device() -> &'static Device {
    static D: OnceLock<Device> = OnceLock::new();
    D.get_or_init(|| Device::cpu().expect("the XLA CPU plugin must load"))
}

fn gene(u: &mut Unstructured<'_>) -> Result<Gene> {
    Ok(Gene {
        kind: u.arbitrary()?,
        a: u.arbitrary()?,
        b: u.arbitrary()?,
        c: u.arbitrary()?,
        seed: u.arbitrary()?,
    })
}

/// At most 32 genes: the bytes run out first for ordinary inputs.
fn genes(data: &[u8]) -> Vec<Gene> {
    let mut u = Unstructured::new(data);
    let mut out = Vec::new();
    while out.len() < 32 && u.len() >= 11 {
        match gene(&mut u) {
            Ok(g) => out.push(g),
            Err(_) => break,
        }
    }
    out
}

fn fails(genes: &[Gene]) -> Option<String> {
    check_program(&build(genes), device()).err()
}

/// Runs one input; panics (after shrinking) on a mismatch.
fn check(data: &[u8]) {
    let gs = genes(data);
    if gs.is_empty() {
        return;
    }
    if let Some(why) = fails(&gs) {
        let min = shrink(&gs, &mut |g| fails(g).is_some());
        let small = shrink_program(&build(&min), 3000, &mut |p| {
            check_program(p, device()).is_err()
        });
        let why_min = check_program(&small, device()).err().unwrap_or(why);
        panic!(
            "fuzz_ops mismatch:\n{why_min}\n\nminimal program as a test:\n\n{}",
            small.to_rust_test("fuzz_regression_name_me")
        );
    }
}

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));

#[cfg(not(feature = "libfuzzer"))]
fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a u64"))
            })
            .unwrap_or(default)
    };
    let paths: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let start = std::time::Instant::now();
    let mut n = 0usize;
    if paths.is_empty() {
        let (seed, cases) = (env("FUZZ_SEED", 1), env("FUZZ_CASES", 100));
        let mut rng = fuzz_support::values::Rng::new(seed);
        for _ in 0..cases {
            let len = 11 * (1 + rng.below(24));
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            check(&data);
            n += 1;
        }
        eprintln!(
            "fuzz_ops: seed {seed}: {n} random inputs passed in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    } else {
        for p in paths {
            let files: Vec<std::path::PathBuf> = if p.is_dir() {
                let mut v: Vec<_> = std::fs::read_dir(&p)
                    .expect("readable directory")
                    .map(|e| e.expect("directory entry").path())
                    .collect();
                v.sort();
                v
            } else {
                vec![p]
            };
            for f in files {
                check(&std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
                n += 1;
            }
        }
        eprintln!(
            "fuzz_ops: {n} inputs passed in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
}
