//! Finding the PJRT plugin lazyfuse runs on, and provisioning the default CPU
//! plugin on first use (the CUDA plugin: [`cuda`]; the wheel mechanics both
//! share: `fetch`).
//!
//! Why provisioning: XLA's CPU plugin is a ~260 MB shared library that is not
//! reasonable to vendor or build, but it is published on PyPI as the wheel
//! `xla-cpu-pjrt`. lazyfuse pins one exact wheel (version and SHA-256), fetches
//! it once with `pip` into a per-user cache, and loads it from there on every
//! later run. Users who cannot or do not want to download point
//! `LAZYFUSE_PJRT_PLUGIN` at a plugin they already have.

pub mod cuda;
mod distributed;
mod driver;
mod fetch;

pub use distributed::{CpuOptions, Distributed};
pub use driver::DriverInfo;

use fetch::{PinnedWheel, TempDir};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Environment variable naming a PJRT plugin to use instead of the default.
pub const PLUGIN_ENV: &str = crate::env::PJRT_PLUGIN;
/// Environment variable overriding the cache directory.
pub const CACHE_ENV: &str = crate::env::PLUGIN_CACHE;

/// The pinned plugin wheel: name, version and the SHA-256 of
/// `xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl` on PyPI.
const WHEEL_NAME: &str = "xla-cpu-pjrt";
const WHEEL_VERSION: &str = "0.0.1";
const WHEEL_SHA256: &str = "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc";
/// Where the shared library sits inside the wheel.
const SO_IN_WHEEL: &str = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
/// Cache layout: `<cache>/<CACHE_SUBDIR>/<SO_NAME>`.
const CACHE_SUBDIR: &str = "xla-cpu-pjrt-0.0.1";
const SO_NAME: &str = "xla_cpu_pjrt.so";

/// Why the plugin could not be located or provisioned.
///
/// The message states what failed (with the underlying error or the tail of
/// pip's output) and how to fix it, so it can be shown to a user as is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProvisionError {
    message: String,
}

impl ProvisionError {
    pub(crate) fn new(message: impl Into<String>) -> ProvisionError {
        ProvisionError {
            message: message.into(),
        }
    }

    /// A provisioning step failed: adds the three ways out.
    fn step(what: impl std::fmt::Display, target: &Path) -> ProvisionError {
        ProvisionError::new(format!(
            "could not provision the XLA CPU PJRT plugin ({WHEEL_NAME}=={WHEEL_VERSION}): {what}\n\
             To fix this, do one of:\n  \
             - install python3 with pip and make sure PyPI is reachable, then retry;\n  \
             - set {PLUGIN_ENV}=/path/to/xla_cpu_pjrt.so to use a plugin you already have;\n  \
             - put xla_cpu_pjrt.so (from the {WHEEL_NAME} {WHEEL_VERSION} wheel) at {}",
            target.display()
        ))
    }
}

/// Where the default CPU plugin lives, provisioning it on first use.
///
/// Resolution order:
/// 1. `$LAZYFUSE_PJRT_PLUGIN`, if set and non-empty: that file must exist.
/// 2. The user cache: `$LAZYFUSE_CACHE`, else `$XDG_CACHE_HOME/lazyfuse`,
///    else `$HOME/.cache/lazyfuse`; the plugin is
///    `xla-cpu-pjrt-0.0.1/xla_cpu_pjrt.so` inside it.
/// 3. If it is not cached yet: download the pinned wheel from PyPI with
///    `python3 -m pip download --require-hashes` (so only the exact,
///    hash-checked wheel is accepted), extract the library with python's
///    `zipfile`, and atomically rename it into the cache. Concurrent processes
///    may all download, but each only ever sees a complete file.
///
/// Blocking; the download (~63 MB) happens at most once per cache directory.
pub fn default_plugin_path() -> Result<PathBuf, ProvisionError> {
    if let Some(path) = crate::env::plugin_override() {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(ProvisionError::new(format!(
                "{PLUGIN_ENV} is set to {}, but no file exists there; point {PLUGIN_ENV} at a \
                 PJRT plugin shared library (e.g. xla_cpu_pjrt.so), or unset it to use the \
                 automatically provisioned CPU plugin",
                path.display()
            )))
        };
    }

    let cache = cache_dir()?;
    let target = cache.join(CACHE_SUBDIR).join(SO_NAME);
    if target.is_file() {
        return Ok(target);
    }

    // One provisioning at a time within this process; other processes are
    // handled by the atomic rename.
    static PROVISIONING: Mutex<()> = Mutex::new(());
    let _guard = PROVISIONING.lock().unwrap_or_else(|p| p.into_inner());
    if target.is_file() {
        return Ok(target);
    }
    provision(&target)?;
    Ok(target)
}

/// The lazyfuse cache directory (see [`default_plugin_path`]).
pub(crate) fn cache_dir() -> Result<PathBuf, ProvisionError> {
    if let Some(dir) = crate::env::plugin_cache_root() {
        return Ok(dir);
    }
    Err(ProvisionError::new(format!(
        "cannot locate the PJRT plugin: none of {CACHE_ENV}, XDG_CACHE_HOME or HOME is \
         set, so there is no cache directory to provision it into; set {CACHE_ENV}=/some/dir, \
         or set {PLUGIN_ENV}=/path/to/the/plugin.so"
    )))
}

/// Downloads the pinned wheel and installs the plugin at `target`.
fn provision(target: &Path) -> Result<(), ProvisionError> {
    let dir = target.parent().expect("target has a parent");
    fs::create_dir_all(dir).map_err(|e| {
        ProvisionError::step(
            format!("cannot create cache directory {}: {e}", dir.display()),
            target,
        )
    })?;
    // Scratch space next to the target, so the final rename stays within one
    // filesystem (and is therefore atomic).
    let tmp = TempDir::create_in(dir).map_err(|e| {
        ProvisionError::step(
            format!(
                "cannot create a temporary directory in {}: {e}",
                dir.display()
            ),
            target,
        )
    })?;

    tracing::info!(
        cache = %target.display(),
        "lazyfuse: downloading the XLA CPU PJRT plugin ({WHEEL_NAME}=={WHEEL_VERSION}, ~63 MB) from PyPI; this happens once"
    );
    let wheel = PinnedWheel {
        name: WHEEL_NAME,
        version: WHEEL_VERSION,
        sha256: WHEEL_SHA256,
    };
    let wheels =
        fetch::download(&[wheel], &tmp.path).map_err(|e| ProvisionError::step(e, target))?;
    let staged = tmp.path.join(SO_NAME);
    fetch::extract_member(&wheels[0], SO_IN_WHEEL, &staged)
        .map_err(|e| ProvisionError::step(e, target))?;

    fs::rename(&staged, target).map_err(|e| {
        ProvisionError::step(
            format!(
                "cannot move {} into place at {}: {e}",
                staged.display(),
                target.display()
            ),
            target,
        )
    })?;
    tracing::info!(path = %target.display(), "lazyfuse: XLA CPU PJRT plugin installed");
    Ok(())
}
