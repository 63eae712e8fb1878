//! Tests of environment toggles, which are read once per process: such a
//! test re-runs its own test binary as a child process with the toggle set
//! (`child_*` tests do nothing unless `LAZYFUSE_TEST_CHILD` names them) and
//! reads back what the child printed as `CHILD name=value` lines.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "LAZYFUSE_TEST_CHILD";

/// True in the child process started for `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Runs the test `name` of this binary in a child process with `env` set
/// (and the observability toggles of this process cleared); returns the
/// `CHILD k=v` figures it printed. Panics with its output if it failed.
pub fn run_child(name: &str, env: &[(&str, &str)]) -> HashMap<String, String> {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name);
    for v in [
        "CACHE_DIR",
        "CACHE_MAX_BYTES",
        "DUMP_DIR",
        "LAUNCH_BLOCKING",
        "METRICS",
        "FUSION",
    ] {
        cmd.env_remove(format!("LAZYFUSE_{v}"));
        cmd.env_remove(format!("TPU_{v}"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {name} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains("CHILD done=1"),
        "child {name} did not run\n{stdout}\n{stderr}"
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once("CHILD ").map(|(_, rest)| rest))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn figure(m: &HashMap<String, String>, k: &str) -> u64 {
    m.get(k)
        .unwrap_or_else(|| panic!("child printed no {k}: {m:?}"))
        .parse()
        .unwrap()
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lazyfuse-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
