//! Checking a cached plugin library against its pinned SHA-256 before it is
//! loaded.
//!
//! Why: pip checks the wheel's hash when it downloads it, but the library
//! then sits in a user cache for months, where a half-written copy, another
//! tool or a person can change it; loading a shared library runs its code.
//! So the library's own hash is pinned too and checked before every load.
//! Hashing ~270 MB takes about a second, too long for every process, so a
//! successful check leaves a stamp beside the library (`<so>.sha256`: the
//! hash, the file's size and modification time); a later load whose file
//! still has that size and time trusts the stamp, and any other file is
//! hashed again.

use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// The stamp file of `so`.
pub(crate) fn stamp_path(so: &Path) -> PathBuf {
    let mut name = so.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    so.with_file_name(name)
}

/// `size mtime_ns` of a file, the part of the stamp that must still match.
fn identity(so: &Path) -> std::io::Result<String> {
    let m = fs::metadata(so)?;
    let mtime = m
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {mtime}", m.len()))
}

/// SHA-256 of a file, as lowercase hex.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks that `so` hashes to `want`: trusted from its stamp when the file
/// is unchanged since it was last checked, else hashed (and the stamp
/// rewritten when it matches). `Err` is the hash found, or why the file
/// could not be read.
pub(crate) fn check(so: &Path, want: &str) -> Result<(), String> {
    let id = identity(so).map_err(|e| format!("cannot read {}: {e}", so.display()))?;
    let stamp = stamp_path(so);
    if let Ok(s) = fs::read_to_string(&stamp) {
        if s.trim() == format!("{want} {id}") {
            return Ok(());
        }
    }
    let got = sha256_file(so).map_err(|e| format!("cannot read {}: {e}", so.display()))?;
    if got != want {
        return Err(format!(
            "{} has SHA-256 {got}, not the pinned {want}",
            so.display()
        ));
    }
    // A stamp that cannot be written only costs the next process a hash.
    if let Err(e) = fs::write(&stamp, format!("{want} {id}\n")) {
        tracing::debug!(path = %stamp.display(), error = %e, "lazyfuse: cannot write the plugin's hash stamp");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_is_hashed_again_and_refused() {
        let dir = std::env::temp_dir().join(format!("lazyfuse-verify-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let so = dir.join("lib.so");
        fs::write(&so, b"abc").unwrap();
        // SHA-256("abc").
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&so).unwrap(), abc);
        check(&so, abc).unwrap();
        assert!(fs::read_to_string(stamp_path(&so))
            .unwrap()
            .starts_with(abc));
        check(&so, abc).unwrap(); // from the stamp
        fs::write(&so, b"abd").unwrap();
        // The stamp names the hash it vouches for: another pinned hash is
        // never taken from it.
        let e = check(&so, &"0".repeat(64)).unwrap_err();
        assert!(e.contains("not the pinned"), "{e}");
        fs::write(&so, b"abcd").unwrap(); // another size: hashed again
        let e = check(&so, abc).unwrap_err();
        assert!(e.contains("lib.so has SHA-256"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
