//! Environment toggles, each checked in a child process (they are read once
//! per process): `LAZYFUSE_FUSION=0` sets the default mode,
//! `LAZYFUSE_METRICS=1` prints the report at exit, `LAZYFUSE_DUMP_DIR`
//! writes each compiled region. The seed's `TPU_*` spellings are aliases,
//! read when the `LAZYFUSE_*` name is unset.

mod common;
use lazyfuse::{DType, Tensor};
use std::process::Command;

const CHILD: &str = "LAZYFUSE_ENV_TEST_CHILD";

/// Re-runs this test binary's `child` test with extra environment.
fn run_child(envs: &[(&str, &str)]) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(exe);
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for v in ["FUSION", "METRICS", "DUMP_DIR", "LAUNCH_BLOCKING"] {
        c.env_remove(format!("LAZYFUSE_{v}"));
        c.env_remove(format!("TPU_{v}"));
    }
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The child's work: a small computation, reporting what it observed.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let d = common::dev();
    let x = Tensor::arange(0.0, 8.0, DType::F32, &d).unwrap();
    let y = x.exp().unwrap();
    println!("fusion_enabled={}", lazyfuse::fusion_enabled());
    println!("pending_after_op={}", y.is_pending());
    println!("sum={}", y.sum(.., false).unwrap().item::<f32>().unwrap());
}

/// The fusion mode a child reports with `envs` set.
fn child_fusion(envs: &[(&str, &str)]) -> bool {
    let out = run_child(envs);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    s.contains("fusion_enabled=true")
}

#[test]
fn the_seed_spelling_is_an_alias_the_lazyfuse_name_overrides() {
    assert!(!child_fusion(&[("TPU_FUSION", "0")]));
    assert!(child_fusion(&[
        ("TPU_FUSION", "0"),
        ("LAZYFUSE_FUSION", "1")
    ]));
    assert!(!child_fusion(&[
        ("TPU_FUSION", "1"),
        ("LAZYFUSE_FUSION", "0")
    ]));
}

#[test]
fn fusion_0_turns_fusion_off_by_default() {
    let out = run_child(&[("LAZYFUSE_FUSION", "0")]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(s.contains("fusion_enabled=false"), "{s}");
    assert!(
        s.contains("pending_after_op=false"),
        "ops run when recorded: {s}"
    );
    let out = run_child(&[]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("fusion_enabled=true") && s.contains("pending_after_op=true"),
        "{s}"
    );
}

#[test]
fn metrics_1_prints_the_summary_at_exit_and_full_every_figure() {
    let out = run_child(&[("TPU_METRICS", "1")]);
    assert!(out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("lazyfuse metrics"), "{e}");
    for start in ["lazyfuse: ", "compiles: ", "outputs: ", "memory: "] {
        assert!(
            e.lines().any(|l| l.starts_with(start)),
            "missing {start} in\n{e}"
        );
    }
    assert!(!e.contains("compile_time_ns_p50: "), "{e}");
    let out = run_child(&[("LAZYFUSE_METRICS", "full")]);
    assert!(out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    for name in [
        "ops_recorded: ",
        "compiles: ",
        "cache_hits: ",
        "flushes_read: ",
        "live_buffers: ",
        "compile_time_ns_p50: ",
    ] {
        assert!(
            e.lines().any(|l| l.starts_with(name)),
            "missing {name} in\n{e}"
        );
    }
    let quiet = run_child(&[]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("lazyfuse metrics"));
}

#[test]
fn dump_dir_writes_each_compiled_region() {
    let dir = std::env::temp_dir().join(format!("lazyfuse-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = run_child(&[("LAZYFUSE_DUMP_DIR", dir.to_str().unwrap())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let mlir: Vec<_> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "mlir"))
        .collect();
    assert!(!mlir.is_empty(), "{files:?}");
    let text = std::fs::read_to_string(mlir[0]).unwrap();
    assert!(
        text.contains("func.func public @main") && text.contains("env.rs:"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pipeline_off_gives_the_same_results() {
    let sum = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        s.lines()
            .find(|l| l.starts_with("sum="))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{s}"))
    };
    let blocking = sum(run_child(&[("LAZYFUSE_LAUNCH_BLOCKING", "1")]));
    let pipelined = sum(run_child(&[]));
    let unfused_blocking = sum(run_child(&[
        ("LAZYFUSE_LAUNCH_BLOCKING", "1"),
        ("LAZYFUSE_FUSION", "0"),
    ]));
    assert_eq!(blocking, pipelined);
    assert_eq!(blocking, unfused_blocking);
}
