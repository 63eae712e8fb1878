//! Runtime configuration: every environment variable lazyfuse reads, in one
//! place (docs/configuration.md lists the same set), plus per-thread overrides.
//! The XLA backend's own variables (which plugin, where plugins are
//! provisioned, the CUDA client's options, strict floating point) are
//! `lazyfuse_xla::env`'s: `LAZYFUSE_PJRT_PLUGIN` (alias `TPU_PJRT_PLUGIN`),
//! `LAZYFUSE_CACHE`, `LAZYFUSE_GPU_MEMORY_FRACTION`,
//! `LAZYFUSE_GPU_PREALLOCATE`, `LAZYFUSE_GPU_ALLOCATOR`,
//! `LAZYFUSE_STRICT_FP`.
//!
//! Every variable is spelled `LAZYFUSE_*`. Those the seed spelled `LAZYFUSE_*`
//! keep that name as an alias ([`alias`]), read only when the `LAZYFUSE_*`
//! name is unset.
//!
//! A leaf of the layer stack: it imports nothing of the crate. Values that
//! steer the hot path (fusion default, launch blocking, the graph cap) are
//! read once and cached; paths used at a few well-defined moments (plugin
//! provisioning) are read when asked, so a process can point them elsewhere
//! before first use.

use std::cell::Cell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `LAZYFUSE_FUSION`: `0` turns fusion off (every op its own region).
pub const FUSION: &str = "LAZYFUSE_FUSION";
/// `LAZYFUSE_LAUNCH_BLOCKING`: `1` waits for every execution where it is launched.
pub const LAUNCH_BLOCKING: &str = "LAZYFUSE_LAUNCH_BLOCKING";
/// `LAZYFUSE_METRICS`: `1` prints the metrics summary at exit, `full` every
/// raw figure.
pub const METRICS: &str = "LAZYFUSE_METRICS";
/// `LAZYFUSE_DUMP_DIR`: where region StableHLO and the flush log are written.
pub const DUMP_DIR: &str = "LAZYFUSE_DUMP_DIR";
/// `LAZYFUSE_CACHE_DIR`: the persistent compile cache.
pub const CACHE_DIR: &str = "LAZYFUSE_CACHE_DIR";
/// `LAZYFUSE_CACHE_MAX_BYTES`: size bound of the persistent compile cache.
pub const CACHE_MAX_BYTES: &str = "LAZYFUSE_CACHE_MAX_BYTES";
/// `LAZYFUSE_MAX_PENDING_OPS`: flush a thread's graph once it holds this many nodes.
pub const MAX_PENDING_OPS: &str = "LAZYFUSE_MAX_PENDING_OPS";
/// `LAZYFUSE_MAX_EXECUTABLES`: compiled executables kept in memory per runtime.
pub const MAX_EXECUTABLES: &str = "LAZYFUSE_MAX_EXECUTABLES";
/// `LAZYFUSE_MALLOC_TUNING`: `0` keeps glibc's default mmap/trim thresholds.
pub const MALLOC_TUNING: &str = "LAZYFUSE_MALLOC_TUNING";
/// `LAZYFUSE_POISON_PADDING=1`: fill the padding of dynamic axes with NaN
/// and infinities instead of zeros (a debug switch: results must not change).
pub const POISON_PADDING: &str = "LAZYFUSE_POISON_PADDING";
/// `LAZYFUSE_DYNAMIC_BUCKETS`: capacities of dynamic axes, `pow2` (default)
/// or `linear:N` (multiples of N).
pub const DYNAMIC_BUCKETS: &str = "LAZYFUSE_DYNAMIC_BUCKETS";
/// `LAZYFUSE_AUTO_DYNAMIC=0`: never mark a dimension dynamic by itself
/// (`Tensor::mark_dynamic` still works).
pub const AUTO_DYNAMIC: &str = "LAZYFUSE_AUTO_DYNAMIC";
/// `LAZYFUSE_LAYERS_PER_REGION`: stacked layers (chained copies of one
/// block) run together in one region, up to this many (default
/// [`DEFAULT_LAYERS_PER_REGION`]; `1`: one region per layer, the smallest
/// compiles).
pub const LAYERS_PER_REGION: &str = "LAZYFUSE_LAYERS_PER_REGION";
/// `LAZYFUSE_INLINE_WAITS`: `0` queues every flush to the executor thread,
/// even one whose caller waits for it at once (see [`inline_waits`]).
pub const INLINE_WAITS: &str = "LAZYFUSE_INLINE_WAITS";
/// `LAZYFUSE_WAIT_POLL_US`: how long after launching an execution a
/// waiting thread polls for its completion before sleeping (default
/// [`DEFAULT_WAIT_POLL_US`]; `0`: sleep at once). See [`wait_poll`].
pub const WAIT_POLL_US: &str = "LAZYFUSE_WAIT_POLL_US";
/// `LAZYFUSE_HOST_KERNELS=0`: never lower an op to one of lazyfuse's own
/// host kernels (`ragged_dot`'s grouped product on the CPU plugin); the
/// op is then composed from primitives, as on other devices.
pub const HOST_KERNELS: &str = "LAZYFUSE_HOST_KERNELS";
/// glibc's own variables: when the user set either, lazyfuse leaves malloc alone.
pub const GLIBC_MALLOC_VARS: [&str; 2] = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"];

/// Default pending-graph cap.
pub const DEFAULT_MAX_PENDING_OPS: usize = 20_000;
/// Default of [`MAX_EXECUTABLES`]. Each executable holds a few memory maps of
/// JIT code; Linux allows 65,530 maps per process, which a process with
/// tens of thousands of distinct shapes reached (the fuzz campaign, after
/// about 18,000 compiles: "LLVM compilation error: Cannot allocate memory").
pub const DEFAULT_MAX_EXECUTABLES: usize = 4096;
/// Default of [`LAYERS_PER_REGION`]. A two-layer decoder's step is then one
/// launch instead of four (embedding, layer, layer, head): `decode_kv` ran
/// about 9% faster and the tiny Llama decoded about 13% more tokens/s on
/// average over alternating runs (more under load), for about twice the
/// compile time of the first generation (BENCHMARKS.md).
pub const DEFAULT_LAYERS_PER_REGION: usize = 4;
/// Default bound of the persistent compile cache.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

/// The seed's `TPU_*` spelling of a `LAZYFUSE_*` variable that had one,
/// read when the `LAZYFUSE_*` name is unset (the XLA backend's alias,
/// `TPU_PJRT_PLUGIN`, is `lazyfuse-xla`'s).
pub fn alias(name: &str) -> Option<&'static str> {
    Some(match name {
        FUSION => "TPU_FUSION",
        LAUNCH_BLOCKING => "TPU_LAUNCH_BLOCKING",
        METRICS => "TPU_METRICS",
        DUMP_DIR => "TPU_DUMP_DIR",
        CACHE_DIR => "TPU_CACHE_DIR",
        CACHE_MAX_BYTES => "TPU_CACHE_MAX_BYTES",
        MAX_PENDING_OPS => "TPU_MAX_PENDING_OPS",
        MAX_EXECUTABLES => "TPU_MAX_EXECUTABLES",
        _ => return None,
    })
}

/// The value of `name`, or of its alias when `name` is unset.
fn var(name: &str) -> Option<String> {
    lookup(name, |n| std::env::var(n).ok())
}

/// `name`'s value as `get` reads variables: its own, else its alias's.
fn lookup<T>(name: &str, get: impl Fn(&str) -> Option<T>) -> Option<T> {
    get(name).or_else(|| alias(name).and_then(get))
}

/// The value of `name` (or its alias) if set and not empty (an empty
/// variable counts as unset, so `VAR= cmd` disables an override).
pub(crate) fn non_empty(name: &str) -> Option<OsString> {
    lookup(name, |n| std::env::var_os(n).filter(|v| !v.is_empty()))
}

fn flag(name: &str) -> Option<bool> {
    var(name).map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no" | ""))
}

/// A directory named by `name`, read once per process.
fn cached_dir(cell: &'static OnceLock<Option<PathBuf>>, name: &str) -> Option<&'static PathBuf> {
    cell.get_or_init(|| non_empty(name).map(PathBuf::from))
        .as_ref()
}

/// `LAZYFUSE_DUMP_DIR`, if set.
pub(crate) fn dump_dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    cached_dir(&D, DUMP_DIR)
}

/// `LAZYFUSE_CACHE_DIR`, if set.
pub(crate) fn cache_dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    cached_dir(&D, CACHE_DIR)
}

/// [`LAYERS_PER_REGION`], read once (a value that is not a positive
/// integer is the default).
pub fn layers_per_region() -> usize {
    static L: OnceLock<usize> = OnceLock::new();
    *L.get_or_init(|| {
        std::env::var(LAYERS_PER_REGION)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(DEFAULT_LAYERS_PER_REGION)
    })
}

/// `LAZYFUSE_CACHE_MAX_BYTES`, default [`DEFAULT_CACHE_MAX_BYTES`].
pub(crate) fn cache_max_bytes() -> u64 {
    static M: OnceLock<u64> = OnceLock::new();
    *M.get_or_init(|| {
        std::env::var(CACHE_MAX_BYTES)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_CACHE_MAX_BYTES)
    })
}

/// Whether lazyfuse may raise glibc's malloc thresholds (not when the user
/// set them, nor with `LAZYFUSE_MALLOC_TUNING=0`).
pub(crate) fn malloc_tuning() -> bool {
    let user_set = GLIBC_MALLOC_VARS
        .iter()
        .any(|k| std::env::var_os(k).is_some());
    let off = std::env::var(MALLOC_TUNING).is_ok_and(|v| v.trim() == "0");
    !(user_set || off)
}

/// Whether ops may use lazyfuse's built-in host kernels (see
/// [`HOST_KERNELS`]); read once.
pub fn host_kernels() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| flag(HOST_KERNELS).unwrap_or(true))
}

/// Process-wide fusion default: on unless `LAZYFUSE_FUSION=0`.
fn fusion_default() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| flag(FUSION).unwrap_or(true))
}

thread_local! {
    static THREAD_FUSION: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether ops recorded on this thread are fused (see `lazyfuse::FusionGuard`).
pub fn fusion_enabled() -> bool {
    THREAD_FUSION
        .with(|f| f.get())
        .unwrap_or_else(fusion_default)
}

/// Sets this thread's fusion mode. The lazy layer flushes the thread's
/// graphs before calling this (`lazyfuse::FusionGuard`).
pub(crate) fn set_thread_fusion(on: bool) {
    THREAD_FUSION.with(|f| f.set(Some(on)));
}

static MAX_PENDING: AtomicUsize = AtomicUsize::new(0);

/// The pending-graph cap: a thread's graph is flushed once it holds this many
/// nodes (`LAZYFUSE_MAX_PENDING_OPS`, default 20,000), bounding memory and compile size.
pub fn max_pending_ops() -> usize {
    positive_setting(&MAX_PENDING, MAX_PENDING_OPS, DEFAULT_MAX_PENDING_OPS)
}

/// The value in `cell`, else the positive integer in environment variable
/// `var` (else `default`), kept in `cell` for next time; `0` in `cell` means
/// not read yet, and `set_*` overrides store into it.
fn positive_setting(cell: &AtomicUsize, var: &str, default: usize) -> usize {
    let v = cell.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let d = self::var(var)
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(default);
    cell.store(d, Ordering::Relaxed);
    d
}

static MAX_EXES: AtomicUsize = AtomicUsize::new(0);

/// How many compiled executables a runtime keeps in memory
/// (`LAZYFUSE_MAX_EXECUTABLES`, default 4,096); the least recently used beyond
/// that are dropped (and recompiled, or reloaded from the persistent cache,
/// when needed again).
pub fn max_executables() -> usize {
    positive_setting(&MAX_EXES, MAX_EXECUTABLES, DEFAULT_MAX_EXECUTABLES)
}

/// Overrides the executable cap for the whole process (tests).
pub fn set_max_executables(n: usize) {
    MAX_EXES.store(n.max(1), Ordering::Relaxed);
}

/// Overrides the pending-graph cap for the whole process.
pub fn set_max_pending_ops(n: usize) {
    MAX_PENDING.store(n.max(1), Ordering::Relaxed);
}

/// `LAZYFUSE_METRICS=1`: print the metrics summary at exit (`full`: every
/// raw figure).
pub(crate) fn metrics_at_exit() -> bool {
    static M: OnceLock<bool> = OnceLock::new();
    *M.get_or_init(|| flag(METRICS).unwrap_or(false))
}

/// `LAZYFUSE_METRICS=full`: the exit report lists every raw figure.
pub(crate) fn metrics_full() -> bool {
    var(METRICS).is_some_and(|v| v.trim().eq_ignore_ascii_case("full"))
}

/// Whether a flush that its caller waits for at once (a host read or a
/// `realize()`) runs on the calling thread when the device's executor has
/// nothing queued or running. Handing the job to the executor thread and
/// waiting for it to hand the result back costs two thread wake-ups and
/// gains nothing: the caller would block anyway, and with nothing queued
/// there is no earlier work to keep order with. `LAZYFUSE_INLINE_WAITS=0`
/// turns it off. Read once.
pub fn inline_waits() -> bool {
    static B: OnceLock<bool> = OnceLock::new();
    *B.get_or_init(|| flag(INLINE_WAITS).unwrap_or(true))
}

/// Default of [`WAIT_POLL_US`].
pub const DEFAULT_WAIT_POLL_US: u64 = 500;

/// How long after its launch a wait for an execution polls (yielding the
/// core between polls) before it sleeps on the plugin's event. A sleeping
/// waiter costs a futex wake-up and a reschedule when the execution ends,
/// tens of microseconds on a busy host: as long as a small program's whole
/// run, paid on every decode step of a small model. Only executables
/// whose previous run ended within the window are polled for: the waiter
/// for a longer program sleeps at once, leaving the cores to XLA's threads
/// (polling beside a two-thread elementwise kernel slowed it by ~10%).
/// 500 us covers a small model's decode step (~250-350 us here, which a
/// 200 us window left sleeping: ~15% slower in 6 of 6 alternating pairs)
/// without a measurable change to the programs between 200 and 500 us.
pub fn wait_poll() -> std::time::Duration {
    static P: OnceLock<u64> = OnceLock::new();
    std::time::Duration::from_micros(*P.get_or_init(|| {
        var(WAIT_POLL_US)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_WAIT_POLL_US)
    }))
}

/// `LAZYFUSE_LAUNCH_BLOCKING=1`: wait for every execution as it is launched, so an
/// execution error is reported by the region (and op) that caused it.
pub fn launch_blocking() -> bool {
    static B: OnceLock<bool> = OnceLock::new();
    *B.get_or_init(|| flag(LAUNCH_BLOCKING).unwrap_or(false))
}

/// How the capacity of a dynamic axis is chosen from its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buckets {
    /// The next power of two (1, 2, 4, ...): a loop over lengths 1..n
    /// compiles about log2(n) executables.
    Pow2,
    /// The next multiple of the gap: less padding, more executables.
    Linear(usize),
}

/// `LAZYFUSE_DYNAMIC_BUCKETS` (read once; a malformed value is the default).
pub fn dynamic_buckets() -> Buckets {
    static B: OnceLock<Buckets> = OnceLock::new();
    *B.get_or_init(|| {
        let v = std::env::var(DYNAMIC_BUCKETS).unwrap_or_default();
        match v.trim().strip_prefix("linear:").map(|n| n.parse::<usize>()) {
            Some(Ok(n)) if n > 0 => Buckets::Linear(n),
            _ => Buckets::Pow2,
        }
    })
}

thread_local! {
    static THREAD_POISON: Cell<Option<bool>> = const { Cell::new(None) };
    static THREAD_AUTO_DYNAMIC: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether padding is poisoned on this thread: [`set_poison_padding`], else
/// `LAZYFUSE_POISON_PADDING=1` (read once).
pub fn poison_padding() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    THREAD_POISON
        .with(|c| c.get())
        .unwrap_or_else(|| *P.get_or_init(|| flag(POISON_PADDING).unwrap_or(false)))
}

/// Poisons (or zeroes) the padding of dynamic axes created on this thread
/// from now on, overriding `LAZYFUSE_POISON_PADDING` (a debug switch: a
/// correct program gives the same results either way).
pub fn set_poison_padding(on: bool) {
    THREAD_POISON.with(|c| c.set(Some(on)));
}

/// Whether this thread marks dimensions dynamic by itself:
/// [`set_auto_dynamic`], else `LAZYFUSE_AUTO_DYNAMIC` (read once; on by
/// default).
pub fn auto_dynamic() -> bool {
    static A: OnceLock<bool> = OnceLock::new();
    THREAD_AUTO_DYNAMIC
        .with(|c| c.get())
        .unwrap_or_else(|| *A.get_or_init(|| flag(AUTO_DYNAMIC).unwrap_or(true)))
}

/// Turns automatic dynamic dimensions on or off for this thread (off:
/// every new length is an exact shape and compiles, as without this
/// feature; the reference for tests and for debugging).
pub fn set_auto_dynamic(on: bool) {
    THREAD_AUTO_DYNAMIC.with(|c| c.set(Some(on)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_name_is_an_alias_of_its_lazyfuse_name() {
        for name in [
            FUSION,
            LAUNCH_BLOCKING,
            METRICS,
            DUMP_DIR,
            CACHE_DIR,
            CACHE_MAX_BYTES,
            MAX_PENDING_OPS,
            MAX_EXECUTABLES,
        ] {
            let seed = alias(name).unwrap();
            assert_eq!(name.strip_prefix("LAZYFUSE_"), seed.strip_prefix("TPU_"));
        }
        assert_eq!(alias(POISON_PADDING), None);
    }

    #[test]
    fn the_lazyfuse_name_wins_over_its_alias() {
        let env = |set: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                set.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        let only_seed = env(&[("TPU_FUSION", "0")]);
        assert_eq!(lookup(FUSION, only_seed).as_deref(), Some("0"));
        let both = env(&[("TPU_FUSION", "0"), ("LAZYFUSE_FUSION", "1")]);
        assert_eq!(lookup(FUSION, both).as_deref(), Some("1"));
        assert_eq!(
            lookup(POISON_PADDING, env(&[("TPU_POISON_PADDING", "1")])),
            None
        );
    }
}
