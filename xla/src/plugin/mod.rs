//! Finding the PJRT plugin lazyfuse runs on, and provisioning CPU plugins
//! on first use (the CUDA plugin: [`cuda`]; the wheel mechanics both share:
//! `fetch`; the plugins known by name: [`catalog`]; the hash check before a
//! load: `verify`).
//!
//! Why provisioning: XLA's CPU plugin is a ~260 MB shared library that is not
//! reasonable to vendor or build, but it is published on PyPI as the wheel
//! `xla-cpu-pjrt`. lazyfuse pins one exact wheel (version and SHA-256), fetches
//! it once with `pip` into a per-user cache, and loads it from there on every
//! later run, after checking the library's own SHA-256. Users who cannot or
//! do not want to download point `LAZYFUSE_PJRT_PLUGIN` at a plugin they
//! already have; `LAZYFUSE_PJRT_PLUGIN=<name>` picks another plugin of the
//! [`catalog`], installed and checked the same way.

pub mod catalog;
pub mod cuda;
mod distributed;
mod driver;
mod fetch;
mod verify;

pub use catalog::CatalogPlugin;
pub use distributed::{CpuOptions, Distributed};
pub use driver::DriverInfo;

use fetch::TempDir;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Environment variable naming a PJRT plugin to use instead of the default.
pub const PLUGIN_ENV: &str = crate::env::PJRT_PLUGIN;
/// Environment variable overriding the cache directory.
pub const CACHE_ENV: &str = crate::env::PLUGIN_CACHE;

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

    /// A provisioning step of `p` failed: adds the three ways out.
    fn step(p: &CatalogPlugin, what: impl std::fmt::Display, target: &Path) -> ProvisionError {
        ProvisionError::new(format!(
            "could not provision the XLA CPU PJRT plugin {} ({}): {what}\n\
             To fix this, do one of:\n  \
             - install python3 with pip and make sure PyPI is reachable, then retry;\n  \
             - set {PLUGIN_ENV}=/path/to/{} to use a plugin you already have;\n  \
             - put {} (from the {} wheel: {}) at {}",
            p.name,
            p.requirement(),
            p.so_name,
            p.so_name,
            p.requirement(),
            p.install_command(),
            target.display()
        ))
    }
}

/// Where the default CPU plugin lives, provisioning it on first use.
///
/// Resolution order:
/// 1. `$LAZYFUSE_PJRT_PLUGIN`, if set and non-empty: the name of a
///    [`catalog`] plugin (`jax-cpu`, ...), installed as in 3; or else the
///    path of a plugin library, which must exist (loaded as it is).
/// 2. The user cache: `$LAZYFUSE_CACHE`, else `$XDG_CACHE_HOME/lazyfuse`,
///    else `$HOME/.cache/lazyfuse`; the default plugin is
///    `xla-cpu-pjrt-0.0.1/xla_cpu_pjrt.so` inside it.
/// 3. If it is not cached yet: download the pinned wheel from PyPI with
///    `python3 -m pip download --require-hashes` (so only the exact,
///    hash-checked wheel is accepted), extract the library with python's
///    `zipfile`, check its SHA-256, and atomically rename it into the cache.
///    Concurrent processes may all download, but each only ever sees a
///    complete file. A cached library is checked against its pinned SHA-256
///    before it is returned (see `verify`): a changed one is an `Err` saying
///    how to get the right one back.
///
/// Blocking; the download (~63 MB) happens at most once per cache directory.
pub fn default_plugin_path() -> Result<PathBuf, ProvisionError> {
    if let Some(value) = crate::env::plugin_override() {
        return match named_plugin(&value) {
            Some(p) => catalog_plugin_path(p),
            None if value.is_file() => Ok(value),
            None => Err(ProvisionError::new(format!(
                "{PLUGIN_ENV} is set to {}, but that is neither a file nor the name of a plugin \
                 lazyfuse installs ({}); point {PLUGIN_ENV} at a PJRT plugin shared library \
                 (e.g. xla_cpu_pjrt.so), name one of those, or unset it to use the \
                 automatically provisioned CPU plugin",
                value.display(),
                catalog::names()
            ))),
        };
    }
    catalog_plugin_path(catalog::DEFAULT)
}

/// The catalog entry `value` names, if it is a catalog name.
fn named_plugin(value: &Path) -> Option<&'static CatalogPlugin> {
    value.to_str().and_then(catalog::find)
}

/// The library of catalog plugin `p` in the user cache, provisioned on first
/// use and checked against its pinned SHA-256.
pub fn catalog_plugin_path(p: &'static CatalogPlugin) -> Result<PathBuf, ProvisionError> {
    let cache = cache_dir()?;
    let target = cache.join(p.dir).join(p.so_name);
    if !target.is_file() {
        // One provisioning at a time within this process; other processes
        // are handled by the atomic rename.
        static PROVISIONING: Mutex<()> = Mutex::new(());
        let _guard = PROVISIONING.lock().unwrap_or_else(|p| p.into_inner());
        if !target.is_file() {
            provision(p, &target)?;
        }
    }
    verify::check(&target, p.so_sha256).map_err(|e| {
        ProvisionError::new(format!(
            "refusing to load the {} plugin: {e}. The file is not the pinned build of {}; \
             remove it (rm {}) and run again, and lazyfuse downloads the pinned wheel again \
             (by hand: {})",
            p.name,
            p.requirement(),
            target.display(),
            p.install_command()
        ))
    })?;
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

/// Downloads `p`'s pinned wheel and installs its library at `target`.
fn provision(p: &CatalogPlugin, target: &Path) -> Result<(), ProvisionError> {
    let dir = target.parent().expect("target has a parent");
    fs::create_dir_all(dir).map_err(|e| {
        ProvisionError::step(
            p,
            format!("cannot create cache directory {}: {e}", dir.display()),
            target,
        )
    })?;
    // Scratch space next to the target, so the final rename stays within one
    // filesystem (and is therefore atomic).
    let tmp = TempDir::create_in(dir).map_err(|e| {
        ProvisionError::step(
            p,
            format!(
                "cannot create a temporary directory in {}: {e}",
                dir.display()
            ),
            target,
        )
    })?;

    tracing::info!(
        cache = %target.display(),
        "lazyfuse: downloading the XLA CPU PJRT plugin {} ({}, ~{} MB) from PyPI; this happens once",
        p.name,
        p.requirement(),
        p.download_mb
    );
    let wheels =
        fetch::download(&[p.wheel], &tmp.path).map_err(|e| ProvisionError::step(p, e, target))?;
    let staged = tmp.path.join(p.so_name);
    fetch::extract_member(&wheels[0], p.so_in_wheel, &staged)
        .map_err(|e| ProvisionError::step(p, e, target))?;
    verify::check(&staged, p.so_sha256).map_err(|e| ProvisionError::step(p, e, target))?;
    // The stamp moves with the library (same size and modification time).
    let stamp = verify::stamp_path(&staged);
    if stamp.is_file() {
        let _ = fs::rename(&stamp, verify::stamp_path(target));
    }

    fs::rename(&staged, target).map_err(|e| {
        ProvisionError::step(
            p,
            format!(
                "cannot move {} into place at {}: {e}",
                staged.display(),
                target.display()
            ),
            target,
        )
    })?;
    tracing::info!(path = %target.display(), "lazyfuse: XLA CPU PJRT plugin {} installed", p.name);
    Ok(())
}
