//! Runtime configuration: every environment variable lazyfuse reads, in one
//! place (the README's table lists the same set), plus per-thread overrides.
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

/// `TPU_FUSION`: `0` turns fusion off (every op its own region).
pub const FUSION: &str = "TPU_FUSION";
/// `TPU_LAUNCH_BLOCKING`: `1` waits for every execution where it is launched.
pub const LAUNCH_BLOCKING: &str = "TPU_LAUNCH_BLOCKING";
/// `TPU_METRICS`: `1` prints the metrics report at exit.
pub const METRICS: &str = "TPU_METRICS";
/// `TPU_DUMP_DIR`: where region StableHLO and the flush log are written.
pub const DUMP_DIR: &str = "TPU_DUMP_DIR";
/// `TPU_CACHE_DIR`: the persistent compile cache.
pub const CACHE_DIR: &str = "TPU_CACHE_DIR";
/// `TPU_CACHE_MAX_BYTES`: size bound of the persistent compile cache.
pub const CACHE_MAX_BYTES: &str = "TPU_CACHE_MAX_BYTES";
/// `TPU_PJRT_PLUGIN`: a PJRT plugin to load instead of the provisioned CPU one.
pub const PJRT_PLUGIN: &str = "TPU_PJRT_PLUGIN";
/// `TPU_MAX_PENDING_OPS`: flush a thread's graph once it holds this many nodes.
pub const MAX_PENDING_OPS: &str = "TPU_MAX_PENDING_OPS";
/// `TPU_MAX_EXECUTABLES`: compiled executables kept in memory per runtime.
pub const MAX_EXECUTABLES: &str = "TPU_MAX_EXECUTABLES";
/// `LAZYFUSE_GPU_MEMORY_FRACTION`: fraction of GPU memory the CUDA client may use.
pub const GPU_MEMORY_FRACTION: &str = "LAZYFUSE_GPU_MEMORY_FRACTION";
/// `LAZYFUSE_GPU_PREALLOCATE`: `0` makes the CUDA client allocate on demand.
pub const GPU_PREALLOCATE: &str = "LAZYFUSE_GPU_PREALLOCATE";
/// `LAZYFUSE_GPU_ALLOCATOR`: the CUDA client's allocator (`bfc`, `cuda_async`, ...).
pub const GPU_ALLOCATOR: &str = "LAZYFUSE_GPU_ALLOCATOR";
/// `LAZYFUSE_CACHE`: where the CPU and CUDA plugins are provisioned.
pub const PLUGIN_CACHE: &str = "LAZYFUSE_CACHE";
/// `LAZYFUSE_MALLOC_TUNING`: `0` keeps glibc's default mmap/trim thresholds.
pub const MALLOC_TUNING: &str = "LAZYFUSE_MALLOC_TUNING";
/// `1`: compile without fused multiply-add, so fused results equal unfused
/// ones bit for bit (slower elementwise code; see the README's semantics).
pub const STRICT_FP: &str = "LAZYFUSE_STRICT_FP";
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
/// XLA's own log threshold (0 info, 1 warnings, 2 errors), read by the
/// plugin when it first logs; lazyfuse sets 1 when it is unset.
pub const XLA_LOG_LEVEL: &str = "TF_CPP_MIN_LOG_LEVEL";
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

/// The value of `name` if set and not empty (an empty variable counts as
/// unset, so `VAR= cmd` disables an override).
pub(crate) fn non_empty(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

fn flag(name: &str) -> Option<bool> {
    std::env::var(name)
        .ok()
        .map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no" | ""))
}

/// A directory named by `name`, read once per process.
fn cached_dir(cell: &'static OnceLock<Option<PathBuf>>, name: &str) -> Option<&'static PathBuf> {
    cell.get_or_init(|| non_empty(name).map(PathBuf::from))
        .as_ref()
}

/// `TPU_DUMP_DIR`, if set.
pub(crate) fn dump_dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    cached_dir(&D, DUMP_DIR)
}

/// `TPU_CACHE_DIR`, if set.
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

/// `TPU_CACHE_MAX_BYTES`, default [`DEFAULT_CACHE_MAX_BYTES`].
pub(crate) fn cache_max_bytes() -> u64 {
    static M: OnceLock<u64> = OnceLock::new();
    *M.get_or_init(|| {
        std::env::var(CACHE_MAX_BYTES)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_CACHE_MAX_BYTES)
    })
}

/// A CUDA client option variable's trimmed value, if set and non-empty.
pub(crate) fn gpu_option(name: &str) -> Option<String> {
    non_empty(name).map(|v| v.to_string_lossy().trim().to_string())
}

/// `TPU_PJRT_PLUGIN`, read when a default device is asked for.
pub(crate) fn plugin_override() -> Option<PathBuf> {
    non_empty(PJRT_PLUGIN).map(PathBuf::from)
}

/// The user cache root for provisioning: `LAZYFUSE_CACHE`, else
/// `$XDG_CACHE_HOME/lazyfuse` (absolute values only, as the XDG spec says),
/// else `$HOME/.cache/lazyfuse`.
pub(crate) fn plugin_cache_root() -> Option<PathBuf> {
    if let Some(dir) = non_empty(PLUGIN_CACHE) {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME").map(PathBuf::from) {
        if dir.is_absolute() {
            return Some(dir.join("lazyfuse"));
        }
    }
    non_empty("HOME").map(|h| PathBuf::from(h).join(".cache").join("lazyfuse"))
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

/// Process-wide fusion default: on unless `TPU_FUSION=0`.
fn fusion_default() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| flag(FUSION).unwrap_or(true))
}

thread_local! {
    static THREAD_FUSION: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether ops recorded on this thread are fused (see `lazyfuse::set_fusion`).
pub fn fusion_enabled() -> bool {
    THREAD_FUSION
        .with(|f| f.get())
        .unwrap_or_else(fusion_default)
}

/// Sets this thread's fusion mode. The lazy layer flushes the thread's
/// graphs before calling this (`lazyfuse::set_fusion`).
pub(crate) fn set_thread_fusion(on: bool) {
    THREAD_FUSION.with(|f| f.set(Some(on)));
}

static MAX_PENDING: AtomicUsize = AtomicUsize::new(0);

/// The pending-graph cap: a thread's graph is flushed once it holds this many
/// nodes (`TPU_MAX_PENDING_OPS`, default 20,000), bounding memory and compile size.
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
    let d = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(default);
    cell.store(d, Ordering::Relaxed);
    d
}

static MAX_EXES: AtomicUsize = AtomicUsize::new(0);

/// How many compiled executables a runtime keeps in memory
/// (`TPU_MAX_EXECUTABLES`, default 4,096); the least recently used beyond
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

/// `TPU_METRICS=1`: print the metrics report at exit.
pub(crate) fn metrics_at_exit() -> bool {
    static M: OnceLock<bool> = OnceLock::new();
    *M.get_or_init(|| flag(METRICS).unwrap_or(false))
}

/// `LAZYFUSE_STRICT_FP=1`: no multiply-add contraction in compiled code.
/// Read once: it is part of every executable's compile options.
pub fn strict_fp() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| flag(STRICT_FP).unwrap_or(false))
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
        std::env::var(WAIT_POLL_US)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_WAIT_POLL_US)
    }))
}

/// `TPU_LAUNCH_BLOCKING=1`: wait for every execution as it is launched, so an
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
