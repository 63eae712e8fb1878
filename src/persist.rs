//! `LAZYFUSE_CACHE_DIR=dir`: a persistent compile cache shared by processes.
//!
//! Why: a compile costs 20-150 ms, so a program that compiles 50 regions
//! spends seconds before its first step, every run. Compiled executables are
//! serialised through PJRT and stored one file per entry; a later run of the
//! same program loads them instead of compiling.
//!
//! Entry identity (the file name) hashes everything that makes a serialized
//! executable valid: the region key *and* its StableHLO text (so a change of
//! the lowering never serves a stale executable), the plugin (canonical path,
//! size, mtime, platform name and version), the compile-options bytes, the
//! host CPU (model and feature flags: CPU executables hold machine code for
//! them), the lazyfuse version and [`FORMAT_VERSION`].
//!
//! Robustness: an entry is `header (magic, format version, entry key,
//! payload length, payload checksum) + payload`. A truncated, garbled or
//! foreign entry fails validation (or deserialisation), is removed, counted
//! as rejected and recompiled, never a crash. Writers write a temporary file
//! and rename it into place, so concurrent processes writing the same entry
//! each publish a whole file and readers never see a partial one. The
//! directory is bounded (`LAZYFUSE_CACHE_MAX_BYTES`, default 1 GiB): after each
//! store the least recently used entries (by mtime, touched on every hit) are
//! evicted. Every failure of the cache is logged and ignored: the cache can
//! make a run faster, never make it fail.

use crate::metrics::{self, COUNTERS as C};
use lazyfuse_fusion::RegionKey;
use lazyfuse_xla::pjrt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// Bumped whenever the entry layout, the identity recipe or the calling
/// convention of executables changes (2: lifted scalars arrive packed).
pub const FORMAT_VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"LZFXEXE\0";
/// magic, version, entry key, payload length, checksum.
const HEADER_LEN: usize = 8 + 4 + 16 + 8 + 8;
const EXT: &str = "lfx";
/// Temporary files older than this are leftovers of a crashed writer.
const STALE_TMP: Duration = Duration::from_secs(600);

fn dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| {
        let d = crate::config::cache_dir()?.clone();
        if let Err(e) = std::fs::create_dir_all(&d) {
            tracing::warn!("LAZYFUSE_CACHE_DIR {}: cannot create: {e}", d.display());
            return None;
        }
        Some(d)
    })
    .as_ref()
}

/// `LAZYFUSE_CACHE_MAX_BYTES` (default 1 GiB).
fn max_bytes() -> u64 {
    crate::config::cache_max_bytes()
}

/// 128 bits from two fixed-key hashers over the same data.
fn hash128(feed: impl Fn(&mut ahash::AHasher)) -> u128 {
    let mut a = lazyfuse_ir::stable_hasher();
    let mut b = lazyfuse_ir::stable_hasher();
    0xa5u8.hash(&mut b);
    feed(&mut a);
    feed(&mut b);
    ((a.finish() as u128) << 64) | b.finish() as u128
}

/// FNV-1a over 8-byte words (then the tail): a checksum whose value is fixed
/// by this code alone, so any build of lazyfuse agrees on it.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    const P: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(P);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(P);
    }
    (h ^ bytes.len() as u64).wrapping_mul(P)
}

/// The host CPU: model name and feature flags of the first processor.
fn cpu_identity() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .unwrap_or("")
            .to_string()
    };
    format!(
        "{}|{}|{}|{}",
        std::env::consts::ARCH,
        field("model name"),
        field("flags"),
        field("Features")
    )
}

/// The identity of the compiler behind `client` (see the module docs),
/// computed once per plugin path.
fn identity(client: &pjrt::Client, plugin: &Path) -> u128 {
    static IDS: Mutex<Option<HashMap<PathBuf, u128>>> = Mutex::new(None);
    let mut ids = IDS.lock();
    let ids = ids.get_or_insert_with(HashMap::new);
    if let Some(&id) = ids.get(plugin) {
        return id;
    }
    let canon = plugin
        .canonicalize()
        .unwrap_or_else(|_| plugin.to_path_buf());
    let (len, mtime) = std::fs::metadata(&canon)
        .map(|m| {
            let t = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            (m.len(), t)
        })
        .unwrap_or((0, 0));
    let platform = client.platform_name().unwrap_or_default();
    let version = client.platform_version().unwrap_or_default();
    let cpu = cpu_identity();
    let id = hash128(|h| {
        FORMAT_VERSION.hash(h);
        env!("CARGO_PKG_VERSION").hash(h);
        canon.hash(h);
        len.hash(h);
        mtime.hash(h);
        platform.hash(h);
        version.hash(h);
        client.compile_options().hash(h);
        cpu.hash(h);
    });
    ids.insert(plugin.to_path_buf(), id);
    id
}

/// The entry key of one region compiled by one compiler.
fn entry_key(identity: u128, key: RegionKey, text: &str) -> u128 {
    hash128(|h| {
        identity.hash(h);
        key.0.hash(h);
        text.hash(h);
    })
}

fn entry_path(dir: &Path, entry: u128) -> PathBuf {
    dir.join(format!("{entry:032x}.{EXT}"))
}

/// Header plus payload.
pub(crate) fn encode(entry: u128, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    v.extend_from_slice(&entry.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(&checksum(payload).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The payload of a valid entry for `entry`, or why it is not one.
pub(crate) fn decode(bytes: &[u8], entry: u128) -> Result<&[u8], &'static str> {
    if bytes.len() < HEADER_LEN {
        return Err("truncated header");
    }
    let (h, payload) = bytes.split_at(HEADER_LEN);
    if &h[..8] != MAGIC {
        return Err("bad magic");
    }
    if u32::from_le_bytes(h[8..12].try_into().unwrap()) != FORMAT_VERSION {
        return Err("other format version");
    }
    if u128::from_le_bytes(h[12..28].try_into().unwrap()) != entry {
        return Err("entry key mismatch");
    }
    if u64::from_le_bytes(h[28..36].try_into().unwrap()) != payload.len() as u64 {
        return Err("payload length mismatch (truncated?)");
    }
    if u64::from_le_bytes(h[36..44].try_into().unwrap()) != checksum(payload) {
        return Err("checksum mismatch");
    }
    Ok(payload)
}

/// The executable stored for `key` with StableHLO `text`, if a valid entry
/// exists. A bad entry is removed and counted as rejected.
pub(crate) fn load(
    client: &pjrt::Client,
    plugin: &Path,
    key: RegionKey,
    text: &str,
) -> Option<pjrt::LoadedExecutable> {
    let dir = dir()?;
    let t0 = Instant::now();
    let entry = entry_key(identity(client, plugin), key, text);
    let path = entry_path(dir, entry);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(_) => {
            metrics::add(&C.disk_cache_misses, 1);
            return None;
        }
    };
    let reject = |why: &dyn std::fmt::Display| {
        tracing::warn!(
            "persistent cache entry {} rejected ({why}); recompiling",
            path.display()
        );
        metrics::add(&C.disk_cache_rejected, 1);
        let _ = std::fs::remove_file(&path);
        None
    };
    let payload = match decode(&bytes, entry) {
        Ok(p) => p,
        Err(why) => return reject(&why),
    };
    let exe = match client.deserialize_executable(payload) {
        Ok(e) => e,
        Err(e) => return reject(&e),
    };
    // Least recently used = oldest mtime: a hit makes the entry young again.
    if let Ok(f) = std::fs::File::options().write(true).open(&path) {
        let _ = f.set_modified(SystemTime::now());
    }
    metrics::add(&C.disk_cache_hits, 1);
    metrics::add(&C.disk_cache_load_ns, t0.elapsed().as_nanos() as u64);
    tracing::debug!(region = %key, bytes = bytes.len(), "persistent cache hit");
    Some(exe)
}

/// Stores a freshly compiled executable (best effort), then keeps the
/// directory within its size bound.
pub(crate) fn store(
    client: &pjrt::Client,
    plugin: &Path,
    key: RegionKey,
    text: &str,
    exe: &pjrt::LoadedExecutable,
) {
    let Some(dir) = dir() else { return };
    let entry = entry_key(identity(client, plugin), key, text);
    let payload = match exe.serialize() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(region = %key, "cannot serialize executable for the persistent cache: {e}");
            return;
        }
    };
    let path = entry_path(dir, entry);
    match write_atomically(dir, &path, &encode(entry, &payload)) {
        Ok(()) => {
            metrics::add(&C.disk_cache_stores, 1);
            evict(dir, max_bytes(), &path);
        }
        Err(e) => tracing::warn!("cannot write {}: {e}", path.display()),
    }
}

/// Writes `bytes` to a temporary file in `dir`, then renames it to `path`:
/// readers see the old file, no file, or the whole new one.
pub(crate) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    let tmp = dir.join(format!(
        ".tmp-{}-{}-{name}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Removes the least recently used entries until the directory's entries
/// total at most `max` bytes (never `keep`, the entry just written), and
/// temporary files left by crashed writers. Returns the number evicted.
pub(crate) fn evict(dir: &Path, max: u64, keep: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut entries = Vec::new();
    let mut total = 0u64;
    for e in rd.flatten() {
        let path = e.path();
        let Ok(m) = e.metadata() else { continue };
        let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".tmp-") {
            if now.duration_since(mtime).unwrap_or_default() > STALE_TMP {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if path.extension().and_then(|x| x.to_str()) != Some(EXT) {
            continue;
        }
        total += m.len();
        entries.push((mtime, m.len(), path));
    }
    if total <= max {
        return 0;
    }
    entries.sort();
    let mut evicted = 0;
    for (_, len, path) in entries {
        if total <= max {
            break;
        }
        if path == keep {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            evicted += 1;
        }
    }
    metrics::add(&C.disk_cache_evictions, evicted as u64);
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("lazyfuse-persist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn entries_round_trip_and_damage_is_detected() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let e = encode(42, &payload);
        assert_eq!(decode(&e, 42).unwrap(), &payload[..]);
        assert_eq!(decode(&e, 43), Err("entry key mismatch"));
        assert_eq!(decode(&e[..20], 42), Err("truncated header"));
        assert_eq!(
            decode(&e[..e.len() - 1], 42),
            Err("payload length mismatch (truncated?)")
        );
        let mut garbled = e.clone();
        garbled[HEADER_LEN + 500] ^= 0x10;
        assert_eq!(decode(&garbled, 42), Err("checksum mismatch"));
        let mut other_version = e.clone();
        other_version[8] = other_version[8].wrapping_add(1);
        assert_eq!(decode(&other_version, 42), Err("other format version"));
        let mut bad_magic = e;
        bad_magic[0] = b'X';
        assert_eq!(decode(&bad_magic, 42), Err("bad magic"));
    }

    #[test]
    fn checksum_is_pinned() {
        // The checksum is part of the on-disk format: pin it.
        assert_eq!(checksum(b""), 0xaf63_bd4c_8601_b7df);
        assert_ne!(checksum(b"abcdefgh1"), checksum(b"abcdefgh2"));
    }

    #[test]
    fn eviction_removes_least_recently_used_first() {
        let d = tmpdir("evict");
        let t = SystemTime::now();
        let mut paths = Vec::new();
        for i in 0..4u64 {
            let p = d.join(format!("{i:032x}.{EXT}"));
            write_atomically(&d, &p, &[0u8; 100]).unwrap();
            // Entry 0 was used longest ago, entry 3 most recently.
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(t - Duration::from_secs(600 - 60 * i))
                .unwrap();
            paths.push(p);
        }
        let stale_tmp = d.join(".tmp-1-1-x.lfx");
        std::fs::write(&stale_tmp, b"partial").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&stale_tmp)
            .unwrap()
            .set_modified(t - Duration::from_secs(3600))
            .unwrap();
        // Within bound: nothing goes (but the stale temporary file does).
        assert_eq!(evict(&d, 400, &paths[3]), 0);
        assert!(!stale_tmp.exists());
        // 250 bytes allowed: the oldest go until it fits, never the entry
        // just written (here the oldest one).
        assert_eq!(evict(&d, 250, &paths[0]), 2);
        assert!(paths[0].exists(), "the entry just written is kept");
        assert!(!paths[1].exists() && !paths[2].exists());
        assert!(paths[3].exists(), "the most recently used entry is kept");
        let _ = std::fs::remove_dir_all(&d);
    }
}
