//! Observability: recompile explanations, `LAZYFUSE_DUMP_DIR`, `LAZYFUSE_CACHE_DIR`
//! (the persistent compile cache) and `LAZYFUSE_LAUNCH_BLOCKING`.
//!
//! Environment toggles are read once per process, so tests that need one set
//! re-run this test binary as a child process (`common::child`).

mod common;
use common::child::{figure, is_child, run_child, tmpdir};
use common::{dev, metrics_lock};
use lazyfuse::fusion::Cause;
use lazyfuse::{metrics, DType, Device, Error, FusionGuard, Tensor};
use std::path::{Path, PathBuf};

/// A small program with three distinct regions; checks its own results
/// against plain Rust and prints the compile figures.
fn workload(d: &Device) {
    let xs: Vec<f32> = (0..48).map(|i| (i as f32 - 20.0) / 16.0).collect();
    let ws: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) / 8.0).collect();
    let x = Tensor::from_slice(&xs, &[6, 8], d).unwrap();
    let w = Tensor::from_slice(&ws, &[8, 4], d).unwrap();
    // Region 1: matmul, tanh, row sums.
    let y = x
        .matmul(&w)
        .unwrap()
        .tanh()
        .unwrap()
        .sum([-1], false)
        .unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (r, g) in got.iter().enumerate() {
        let want: f32 = (0..4)
            .map(|c| {
                (0..8)
                    .map(|k| xs[r * 8 + k] * ws[k * 4 + c])
                    .sum::<f32>()
                    .tanh()
            })
            .sum();
        assert!((g - want).abs() < 1e-4, "row {r}: {g} vs {want}");
    }
    // Region 2: exp, scale, column means.
    let z = (x.exp().unwrap() * 2.0).unwrap().mean([0], false).unwrap();
    let got = z.to_vec::<f32>().unwrap();
    for (c, g) in got.iter().enumerate() {
        let want = (0..6).map(|r| 2.0 * xs[r * 8 + c].exp()).sum::<f32>() / 6.0;
        assert!(
            (g - want).abs() < 1e-4 * want.abs().max(1.0),
            "col {c}: {g} vs {want}"
        );
    }
    // Region 3: max over everything of |x| - 1.
    let m = x.abs().unwrap().add(-1.0).unwrap().max(.., false).unwrap();
    let want = xs.iter().map(|v| v.abs() - 1.0).fold(f32::MIN, f32::max);
    assert_eq!(m.item::<f32>().unwrap(), want);
}

fn print_figures() {
    let s = metrics::snapshot();
    println!(
        "CHILD compiles={} disk_cache_hits={} disk_cache_misses={} disk_cache_stores={} disk_cache_rejected={} disk_cache_evictions={} compile_ns={}",
        s.compiles,
        s.disk_cache_hits,
        s.disk_cache_misses,
        s.disk_cache_stores,
        s.disk_cache_rejected,
        s.disk_cache_evictions,
        s.compile_ns,
    );
    println!("CHILD done=1");
}

#[test]
fn child_workload() {
    if !is_child("child_workload") {
        return;
    }
    workload(&dev());
    print_figures();
}

#[test]
fn child_spmd_workload() {
    if !is_child("child_spmd_workload") {
        return;
    }
    // The same three regions with x split over 2 of a 4-device client's
    // devices by rows and w by columns: SPMD programs.
    let d = Device::cpu_with_devices(4).unwrap();
    let mesh = lazyfuse::Mesh::new(&d, &[("dp", 2)]).unwrap();
    let xs: Vec<f32> = (0..48).map(|i| (i as f32 - 20.0) / 16.0).collect();
    let x = Tensor::from_slice(&xs, &[6, 8], &d).unwrap();
    let xsh = x.shard(&mesh, &[Some("dp"), None]).unwrap();
    let y = xsh.exp().unwrap().sum([0], false).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (c, g) in got.iter().enumerate() {
        let want: f32 = (0..6).map(|r| xs[r * 8 + c].exp()).sum();
        assert!(
            (g - want).abs() < 1e-4 * want.abs(),
            "col {c}: {g} vs {want}"
        );
    }
    print_figures();
}

#[test]
fn spmd_programs_are_cached_on_disk_too() {
    let dir = tmpdir("spmd");
    let env = [("LAZYFUSE_CACHE_DIR", dir.to_str().unwrap())];
    let cold = run_child("child_spmd_workload", &env);
    let n = figure(&cold, "compiles");
    assert!(n >= 1, "{cold:?}");
    assert_eq!(figure(&cold, "disk_cache_stores"), n);
    let warm = run_child("child_spmd_workload", &env);
    assert_eq!(figure(&warm, "compiles"), 0, "{warm:?}");
    assert_eq!(figure(&warm, "disk_cache_hits"), n);
    let _ = std::fs::remove_dir_all(&dir);
}

fn cache_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "lfx"))
        .collect();
    v.sort();
    v
}

#[test]
fn warm_persistent_cache_compiles_nothing_and_damaged_entries_are_recompiled() {
    let dir = tmpdir("cache");
    let env = [("LAZYFUSE_CACHE_DIR", dir.to_str().unwrap())];
    let cold = run_child("child_workload", &env);
    let n = figure(&cold, "compiles");
    assert!(n >= 3, "{cold:?}");
    assert_eq!(figure(&cold, "disk_cache_stores"), n);
    assert_eq!(figure(&cold, "disk_cache_hits"), 0);
    assert_eq!(cache_entries(&dir).len() as u64, n);

    let warm = run_child("child_workload", &env);
    assert_eq!(figure(&warm, "compiles"), 0, "{warm:?}");
    assert_eq!(figure(&warm, "disk_cache_hits"), n);
    eprintln!(
        "cold: {n} compiles, {:.1} ms compiling; warm: 0 compiles",
        figure(&cold, "compile_ns") as f64 / 1e6
    );

    // Damage three entries three ways: truncated, garbled payload, foreign header.
    let entries = cache_entries(&dir);
    let bytes = std::fs::read(&entries[0]).unwrap();
    std::fs::write(&entries[0], &bytes[..bytes.len() / 2]).unwrap();
    let mut garbled = std::fs::read(&entries[1]).unwrap();
    let mid = garbled.len() / 2;
    garbled[mid] ^= 0xff;
    std::fs::write(&entries[1], garbled).unwrap();
    let mut foreign = std::fs::read(&entries[2]).unwrap();
    foreign[..8].copy_from_slice(b"NOTOURS\0");
    std::fs::write(&entries[2], foreign).unwrap();

    let repaired = run_child("child_workload", &env);
    assert_eq!(figure(&repaired, "disk_cache_rejected"), 3, "{repaired:?}");
    assert_eq!(figure(&repaired, "compiles"), 3);
    assert_eq!(figure(&repaired, "disk_cache_hits"), n - 3);
    // The recompiled entries were written back.
    let again = run_child("child_workload", &env);
    assert_eq!(figure(&again, "compiles"), 0, "{again:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_writers_and_the_size_bound_keep_the_cache_valid() {
    let dir = tmpdir("concurrent");
    let env = [("LAZYFUSE_CACHE_DIR", dir.to_str().unwrap())];
    // Two processes compiling and publishing the same entries at once.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run_child("child_workload", &env));
        let b = s.spawn(|| run_child("child_workload", &env));
        (a.join().unwrap(), b.join().unwrap())
    });
    let n = figure(&a, "compiles").max(figure(&b, "compiles"));
    assert!(
        !std::fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".tmp-")),
        "no temporary file is left behind"
    );
    let warm = run_child("child_workload", &env);
    assert_eq!(figure(&warm, "compiles"), 0, "{warm:?}");
    assert_eq!(figure(&warm, "disk_cache_rejected"), 0);

    // A bound smaller than two entries keeps only the newest one.
    let small = tmpdir("bounded");
    let one = std::fs::metadata(&cache_entries(&dir)[0]).unwrap().len();
    let bound = (one + one / 2).to_string();
    let cache = small.join("cache");
    let bounded = run_child(
        "child_workload",
        &[
            ("LAZYFUSE_CACHE_DIR", cache.to_str().unwrap()),
            ("LAZYFUSE_CACHE_MAX_BYTES", &bound),
        ],
    );
    assert_eq!(figure(&bounded, "compiles"), n);
    assert!(
        figure(&bounded, "disk_cache_evictions") >= n - 2,
        "{bounded:?}"
    );
    assert!(
        cache_entries(&cache).len() <= 2,
        "{:?}",
        cache_entries(&cache)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&small);
}

#[test]
fn a_changing_shape_recompiles_once_and_says_why() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    // Exact shapes: with dynamic axes the second call at the new width
    // would run a bucket's executable (tests/dynamic_compiles.rs).
    lazyfuse::set_auto_dynamic(false);
    let d = dev();
    let step = |cols: usize| -> (u32, Vec<f32>) {
        let x = Tensor::from_vec(
            (0..3 * cols).map(|i| i as f32 / 7.0).collect(),
            &[3, cols],
            &d,
        )
        .unwrap();
        let line = line!() + 1;
        let y = (x.sin().unwrap() * 3.0).unwrap().sum([-1], false).unwrap();
        (line, y.to_vec::<f32>().unwrap())
    };
    let before = metrics::snapshot();
    let (line, _) = step(29);
    step(29);
    let mid = metrics::snapshot();
    step(31);
    step(31);
    let after = metrics::snapshot();
    assert_eq!(
        mid.compiles - before.compiles,
        1,
        "first shape compiles once"
    );
    assert_eq!(
        after.compiles - mid.compiles,
        1,
        "the new shape compiles once"
    );
    assert_eq!(after.recompiles() - before.recompiles(), 1, "{after:?}");
    let shape = Cause::Shape as usize;
    assert_eq!(
        after.recompiles_by_cause[shape] - before.recompiles_by_cause[shape],
        1
    );
    let origin = format!("{}:{line}", file!());
    let ours: Vec<_> = lazyfuse::explain::recent()
        .into_iter()
        .filter(|r| r.origin == origin)
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    let r = &ours[0];
    assert_eq!(r.cause, Cause::Shape);
    assert_eq!(r.what, "input 0 shape [3, 29] -> [3, 31]");
    let text = r.to_string();
    assert!(text.contains(&format!("(recorded at {origin})")), "{text}");
    let report = metrics::report_full();
    assert!(report.contains(&format!("recompile: {text}")), "{report}");
    assert!(report.contains("recompiles_shape: "), "{report}");
    assert!(report.contains("compile_time_ns_p50: "), "{report}");
    assert!(report.contains("cache_hit_rate: "), "{report}");
    // A dtype change is its own cause.
    let x64 = Tensor::from_vec((0..3 * 31).map(|i| i as f64).collect(), &[3, 31], &d).unwrap();
    // (Bound first: temporaries alive at the read would be extra outputs,
    // another structure.)
    let y64 = x64
        .sin()
        .unwrap()
        .mul(3.0)
        .unwrap()
        .sum([-1], false)
        .unwrap();
    y64.to_vec::<f64>().unwrap();
    let dtype = Cause::DType as usize;
    assert_eq!(
        metrics::snapshot().recompiles_by_cause[dtype] - before.recompiles_by_cause[dtype],
        1,
        "{:?}",
        lazyfuse::explain::recent()
    );
}

#[test]
fn child_dump() {
    if !is_child("child_dump") {
        return;
    }
    workload(&dev());
    print_figures();
}

#[test]
fn dumped_modules_compile_again_and_the_flush_log_names_the_lines() {
    let dir = tmpdir("dump");
    let figures = run_child(
        "child_dump",
        &[("LAZYFUSE_DUMP_DIR", dir.to_str().unwrap())],
    );
    let log = std::fs::read_to_string(dir.join("flush-log.txt")).unwrap();
    // Every region of the log names its file, which exists, and its ops
    // with the lines of this file that recorded them.
    let files: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split(" file ").nth(1))
        .collect();
    assert!(files.len() >= 3, "{log}");
    for f in &files {
        assert!(dir.join(f).exists(), "{f} missing\n{log}");
    }
    for op in ["matmul", "tanh", "exp", "mean", "abs", "max_all"] {
        let needle = format!("{op} @ {}:", file!());
        assert!(
            log.contains(&needle) || (op == "max_all" && log.contains("max @ ")),
            "{needle} not in\n{log}"
        );
    }
    let plugin = lazyfuse::xla::plugin::default_plugin_path().unwrap();
    let client =
        lazyfuse::xla::pjrt::Client::new(lazyfuse::xla::pjrt::Plugin::load(&plugin).unwrap())
            .unwrap();
    let mut modules = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "mlir") {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(
                text.contains(file!()),
                "loc() names the recording lines: {text}"
            );
            client
                .compile(&text)
                .unwrap_or_else(|e| panic!("{} does not compile again: {e}", p.display()));
            modules += 1;
        }
    }
    assert_eq!(modules as u64, figure(&figures, "compiles"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under `LAZYFUSE_LAUNCH_BLOCKING=1`: failures name the op that caused them,
/// poison its dependents with that error, and leave the runtime usable.
#[test]
fn child_launch_blocking() {
    if !is_child("child_launch_blocking") {
        return;
    }
    assert!(lazyfuse::launch_blocking());
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 4.0, 9.0], &[3], &d).unwrap();
    let expect_at = |e: &Error, stage: &str, op: &str, line: u32| {
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Xla { stage: s, .. } if *s == stage),
            "{stage}: {msg}"
        );
        assert!(msg.contains(&format!("{op} @ {}:{line}", file!())), "{msg}");
    };
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        // An execution failure.
        lazyfuse::testing::inject_execution_fault(Some("floor"));
        let line = line!() + 1;
        let bad = x.sqrt().unwrap().floor().unwrap();
        // Fused, the dependent fails at the read; unfused, floor already
        // ran (and failed) when recorded, so using it is the error.
        let r = bad.mul(2.0).and_then(|t| t.to_vec::<f32>());
        lazyfuse::testing::inject_execution_fault(None);
        let e = r.expect_err("the injected fault fails the execution");
        expect_at(&e, "execution", "floor", line);
        if !fuse {
            // Its own region: the dependent reports floor's error, not its own op.
            assert!(!e.to_string().contains("mul_scalar @"), "{e}");
        }
        // A compile failure.
        lazyfuse::testing::inject_compile_fault(Some("rsqrt"));
        let line = line!() + 1;
        let bad = x.sqrt().unwrap().rsqrt().unwrap();
        let r = bad.add(1.0).and_then(|t| t.to_vec::<f32>());
        lazyfuse::testing::inject_compile_fault(None);
        expect_at(&r.expect_err("compile fault"), "compile", "rsqrt", line);
        // The runtime stays usable.
        let ok = x.sqrt().unwrap().floor().unwrap().mul(2.0).unwrap();
        assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    }
    print_figures();
}

#[test]
fn launch_blocking_reports_failures_at_the_op() {
    run_child(
        "child_launch_blocking",
        &[("LAZYFUSE_LAUNCH_BLOCKING", "1")],
    );
}

#[test]
fn recording_timing_is_off_unless_asked() {
    let _l = metrics_lock();
    let d = dev();
    let before = metrics::distribution(metrics::Phase::Record).count;
    metrics::set_timing(true);
    let t = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let _ = t.add(1.0).unwrap();
    metrics::set_timing(false);
    let _ = t.add(2.0).unwrap();
    let after = metrics::distribution(metrics::Phase::Record).count;
    assert!(after > before, "timed while on");
    let _ = t.add(3.0).unwrap();
    assert_eq!(metrics::distribution(metrics::Phase::Record).count, after);
}
