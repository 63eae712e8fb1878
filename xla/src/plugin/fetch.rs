//! Fetching pinned wheels from PyPI and unpacking them: the mechanics both
//! plugin provisioners share.
//!
//! Only `pip download --require-hashes` of exact versions is used, so only
//! the wheels whose SHA-256 lazyfuse pins are ever accepted, and python's
//! `zipfile` unpacks them (a wheel is a zip archive). Every failure is a
//! `String` saying what failed with the end of the tool's output; the
//! provisioners add how to get out of it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// One pinned wheel on PyPI: exact name, version and the SHA-256 of the one
/// file pip may accept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PinnedWheel {
    /// Distribution name as on PyPI.
    pub name: &'static str,
    /// Exact version.
    pub version: &'static str,
    /// SHA-256 of the wheel file (manylinux x86_64).
    pub sha256: &'static str,
}

/// Streams one member of a zip archive to a file: `argv = [wheel, member, dest]`.
const EXTRACT_MEMBER_PY: &str = "import shutil, sys, zipfile\n\
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
shutil.copyfileobj(src, dst, 1 << 20)\n";

/// Unpacks every member under one of the prefixes `argv[3:]` of wheel
/// `argv[1]` into directory `argv[2]`, keeping paths and the executable bits
/// the wheel records (`ptxas` must stay executable).
const EXTRACT_TREE_PY: &str = "import os, shutil, sys, zipfile\n\
wheel, dest, prefixes = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])\n\
with zipfile.ZipFile(wheel) as z:\n    \
for info in z.infolist():\n        \
name = info.filename\n        \
if info.is_dir() or not name.startswith(prefixes) or '..' in name.split('/'):\n            \
continue\n        \
out = os.path.join(dest, name)\n        \
os.makedirs(os.path.dirname(out), exist_ok=True)\n        \
with z.open(info) as src, open(out, 'wb') as dst:\n            \
shutil.copyfileobj(src, dst, 1 << 20)\n        \
mode = (info.external_attr >> 16) & 0o777\n        \
if mode:\n            \
os.chmod(out, mode | 0o600)\n";

/// Downloads `wheels` (hash-checked, no dependencies resolved) into `dest`
/// and returns each wheel's file, in the order given.
pub(crate) fn download(wheels: &[PinnedWheel], scratch: &Path) -> Result<Vec<PathBuf>, String> {
    let requirements = scratch.join("requirements.txt");
    let lines: String = wheels
        .iter()
        .map(|w| format!("{}=={} --hash=sha256:{}\n", w.name, w.version, w.sha256))
        .collect();
    fs::write(&requirements, lines)
        .map_err(|e| format!("cannot write {}: {e}", requirements.display()))?;
    let dest = scratch.join("wheels");
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
    ])
    .args([
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
    ])
    .arg("--dest")
    .arg(&dest)
    .arg("-r")
    .arg(&requirements);
    run(pip, "`python3 -m pip download` of the pinned wheels")?;
    wheels.iter().map(|w| find_wheel(&dest, w.name)).collect()
}

/// Extracts member `member` of `wheel` to the file `dest`.
pub(crate) fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<(), String> {
    let mut py = Command::new("python3");
    py.arg("-c")
        .arg(EXTRACT_MEMBER_PY)
        .arg(wheel)
        .arg(member)
        .arg(dest);
    run(
        py,
        "extracting the plugin from the wheel with python3 zipfile",
    )
}

/// Extracts the members of `wheel` under any of `prefixes` into `dest`.
pub(crate) fn extract_tree(wheel: &Path, dest: &Path, prefixes: &[&str]) -> Result<(), String> {
    let mut py = Command::new("python3");
    py.arg("-c")
        .arg(EXTRACT_TREE_PY)
        .arg(wheel)
        .arg(dest)
        .args(prefixes);
    let shown = wheel.file_name().unwrap_or_default().to_string_lossy();
    run(py, &format!("unpacking {shown} with python3 zipfile"))
}

/// Runs a command to completion; a failure quotes the end of its output.
fn run(mut cmd: Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (python3 is not installed or not on PATH)"
        } else {
            ""
        };
        format!("{what}: cannot run python3{hint}: {e}")
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
    if log.trim().is_empty() {
        log = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "{what} failed ({}):\n{}",
        out.status,
        tail.join("\n")
    ))
}

/// The one `.whl` of distribution `name` pip left in `dir` (wheel file
/// names spell the distribution with underscores).
fn find_wheel(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let stem = format!("{}-", name.replace('-', "_")).to_ascii_lowercase();
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let wheels: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().to_ascii_lowercase().starts_with(&stem))
        })
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "pip reported success but left {} wheel files of {name} in {}",
            wheels.len(),
            dir.display()
        )),
    }
}

/// A uniquely named directory, removed with its contents on drop.
pub(crate) struct TempDir {
    /// The directory.
    pub path: PathBuf,
}

impl TempDir {
    /// A new directory inside `parent` (same filesystem, so a rename out of
    /// it is atomic).
    pub(crate) fn create_in(parent: &Path) -> std::io::Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!(".provision-{}-{nanos}-{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.path.exists() {
            return;
        }
        if let Err(e) = fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "lazyfuse: cannot remove temporary directory");
        }
    }
}
