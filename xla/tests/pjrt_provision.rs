//! Plugin provisioning, end to end: resolution order, failure messages, and a
//! real download from PyPI into a fresh cache that is then loaded and run.
//!
//! One test function (environment variables are process-global), in its own
//! test binary, so it also gets its own copy of the plugin library.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Instant;

use common::*;
use lazyfuse_xla::pjrt::{Client, Plugin};
use lazyfuse_xla::plugin::default_plugin_path;

fn set(k: &str, v: impl AsRef<std::ffi::OsStr>) {
    std::env::set_var(k, v);
}

fn unset(k: &str) {
    std::env::remove_var(k);
}

#[test]
fn provisioning_end_to_end() {
    // Resolve the real plugin before the test rewrites the environment.
    let real = plugin_path();
    for k in [
        "LAZYFUSE_PJRT_PLUGIN",
        "TPU_PJRT_PLUGIN",
        "LAZYFUSE_CACHE",
        "XDG_CACHE_HOME",
    ] {
        unset(k);
    }
    let scratch = TempDir::new("provision");

    // (1) LAZYFUSE_PJRT_PLUGIN wins, and must exist.
    set("LAZYFUSE_PJRT_PLUGIN", "/nonexistent/plugin.so");
    let e = default_plugin_path().unwrap_err();
    assert!(e.to_string().contains("LAZYFUSE_PJRT_PLUGIN"), "{e}");
    assert!(e.to_string().contains("/nonexistent/plugin.so"), "{e}");
    eprintln!("--- missing LAZYFUSE_PJRT_PLUGIN:\n{e}");
    set("LAZYFUSE_PJRT_PLUGIN", &real);
    assert_eq!(default_plugin_path().unwrap(), real);
    // The seed's spelling is an alias, read when the new name is unset.
    set("LAZYFUSE_PJRT_PLUGIN", "");
    set("TPU_PJRT_PLUGIN", &real);
    assert_eq!(default_plugin_path().unwrap(), real);
    set("LAZYFUSE_PJRT_PLUGIN", "/nonexistent/plugin.so");
    assert!(default_plugin_path().is_err(), "the new name wins");
    set("LAZYFUSE_PJRT_PLUGIN", ""); // empty = unset
    set("TPU_PJRT_PLUGIN", "");

    // (1') A name from the catalog instead of a path: an unknown word is an
    // error listing the names; a known one is installed and checked (3c).
    set("LAZYFUSE_PJRT_PLUGIN", "no-such-plugin");
    let e = default_plugin_path().unwrap_err().to_string();
    assert!(e.contains("xla-cpu, jax-cpu, zml-cpu"), "{e}");
    set("LAZYFUSE_PJRT_PLUGIN", "");

    // (2) A pre-populated cache is looked up without any download, in the
    // documented precedence: LAZYFUSE_CACHE > XDG_CACHE_HOME/lazyfuse >
    // HOME/.cache/lazyfuse. The files here are placeholders, so each lookup
    // is refused by the SHA-256 check, naming the file it found.
    let fake = |root: PathBuf| {
        let p = root.join("xla-cpu-pjrt-0.0.1").join("xla_cpu_pjrt.so");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"placeholder").unwrap();
        p
    };
    let found = |want: &PathBuf| {
        let e = default_plugin_path().unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} has SHA-256", want.display())),
            "{e}"
        );
        assert!(e.contains(&format!("rm {}", want.display())), "{e}");
        assert!(e.contains("pip download"), "{e}");
        e
    };
    let home = scratch.path().join("home");
    let in_home = fake(home.join(".cache").join("lazyfuse"));
    let xdg = scratch.path().join("xdg");
    let in_xdg = fake(xdg.join("lazyfuse"));
    let own = scratch.path().join("own");
    let in_own = fake(own.clone());
    let real_home = std::env::var_os("HOME");
    set("HOME", &home);
    eprintln!("--- a changed cached plugin:\n{}", found(&in_home));
    set("XDG_CACHE_HOME", &xdg);
    found(&in_xdg);
    set("XDG_CACHE_HOME", "relative/ignored");
    found(&in_home);
    set("LAZYFUSE_CACHE", &own);
    found(&in_own);
    // A named plugin is looked up and checked in the same cache.
    let jax = own
        .join("lammps-jax-pjrt-cpu-0.11.2")
        .join("pjrt_c_api_cpu_plugin.so");
    std::fs::create_dir_all(jax.parent().unwrap()).unwrap();
    std::fs::write(&jax, b"not the pinned build").unwrap();
    set("LAZYFUSE_PJRT_PLUGIN", "jax-cpu");
    let e = found(&jax);
    assert!(e.contains("lammps-jax-pjrt-cpu==0.11.2"), "{e}");
    set("LAZYFUSE_PJRT_PLUGIN", "");
    match &real_home {
        Some(h) => set("HOME", h),
        None => unset("HOME"),
    }
    unset("XDG_CACHE_HOME");

    // (3a) Provisioning failure (no python3 on PATH): one clear error.
    let empty_cache = scratch.path().join("no-python");
    set("LAZYFUSE_CACHE", &empty_cache);
    let real_path = std::env::var_os("PATH").unwrap();
    set("PATH", "/nonexistent-bin");
    let e = default_plugin_path().unwrap_err();
    set("PATH", &real_path);
    let msg = e.to_string();
    eprintln!("--- no python3:\n{msg}");
    assert!(msg.contains("python3"), "{msg}");
    assert!(
        msg.contains("LAZYFUSE_PJRT_PLUGIN=/path/to/xla_cpu_pjrt.so"),
        "{msg}"
    );
    assert!(
        msg.contains(
            &empty_cache
                .join("xla-cpu-pjrt-0.0.1/xla_cpu_pjrt.so")
                .display()
                .to_string()
        ),
        "{msg}"
    );
    // No partial state left behind.
    let leftovers: Vec<_> = std::fs::read_dir(empty_cache.join("xla-cpu-pjrt-0.0.1"))
        .unwrap()
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // (3a') pip fails (unreachable index): the error quotes pip's output.
    set("PIP_INDEX_URL", "http://127.0.0.1:9/simple");
    set("PIP_RETRIES", "0");
    set("PIP_TIMEOUT", "2");
    let e = default_plugin_path().unwrap_err();
    for k in ["PIP_INDEX_URL", "PIP_RETRIES", "PIP_TIMEOUT"] {
        unset(k);
    }
    let msg = e.to_string();
    eprintln!("--- pip failure:\n{msg}");
    assert!(msg.contains("pip download"), "{msg}");
    assert!(msg.contains("failed (exit status"), "{msg}");
    assert!(
        msg.contains("LAZYFUSE_PJRT_PLUGIN=/path/to/xla_cpu_pjrt.so"),
        "{msg}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(empty_cache.join("xla-cpu-pjrt-0.0.1"))
        .unwrap()
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // (3b) The real thing: download the pinned wheel from PyPI into a fresh cache.
    let cache = scratch.path().join("cache");
    set("LAZYFUSE_CACHE", &cache);
    let t = Instant::now();
    let path = default_plugin_path().unwrap();
    eprintln!("--- provisioned {} in {:?}", path.display(), t.elapsed());
    assert_eq!(
        path,
        cache.join("xla-cpu-pjrt-0.0.1").join("xla_cpu_pjrt.so")
    );
    let entries: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut entries: Vec<_> = entries.iter().map(|e| e.to_string_lossy()).collect();
    entries.sort();
    assert_eq!(
        entries,
        ["xla_cpu_pjrt.so", "xla_cpu_pjrt.so.sha256"],
        "temporary files left behind, or no hash stamp"
    );
    // Second call: cached, and checked from the stamp, so instant.
    let t = Instant::now();
    assert_eq!(default_plugin_path().unwrap(), path);
    assert!(t.elapsed().as_millis() < 100);

    // And the provisioned plugin works.
    let plugin = Plugin::load(&path).unwrap();
    assert_eq!(plugin.api_version().0, 0);
    let c = Client::new(plugin).unwrap();
    assert_eq!(
        f32_vec(&download(&doubled_1_to_6(&c))),
        [2., 4., 6., 8., 10., 12.]
    );
}
