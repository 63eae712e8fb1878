//! Process-wide counters: what was recorded, flushed, compiled, run and moved.
//! Cheap relaxed atomics, so counting never slows the hot path measurably.
//!
//! Timings go into fixed log2-bucket histograms (one per phase), reported as
//! count, total and p50/p90/p99 estimates. Recording is the one hot phase: it
//! is timed only when `LAZYFUSE_METRICS` is set or [`set_timing`] switched it on.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

mod report;

pub(crate) use report::install_exit_report;
pub use report::{report, report_full};

/// Why a pending graph was flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushReason {
    /// A value was read to the host (`to_vec`, `item`, `Display`).
    Read,
    /// `realize()` materialised a tensor on the device.
    Realize,
    /// `lazyfuse::sync()`.
    Sync,
    /// Fusion is off: every op runs when recorded.
    Eager,
    /// The pending graph reached its size cap.
    GraphCap,
    /// Another thread used a tensor pending in this thread's graph.
    CrossThread,
    /// The fusion mode of the thread changed.
    ModeChange,
    /// The recording thread exited: its pending values (some may be held by
    /// other threads) are computed rather than left in a graph nobody owns.
    ThreadExit,
}

impl FlushReason {
    /// Every reason, in report order.
    pub const ALL: [FlushReason; 8] = [
        FlushReason::Read,
        FlushReason::Realize,
        FlushReason::Sync,
        FlushReason::Eager,
        FlushReason::GraphCap,
        FlushReason::CrossThread,
        FlushReason::ModeChange,
        FlushReason::ThreadExit,
    ];

    /// Name used in the report.
    pub fn name(self) -> &'static str {
        match self {
            FlushReason::Read => "read",
            FlushReason::Realize => "realize",
            FlushReason::Sync => "sync",
            FlushReason::Eager => "eager",
            FlushReason::GraphCap => "graph_cap",
            FlushReason::CrossThread => "cross_thread",
            FlushReason::ModeChange => "mode_change",
            FlushReason::ThreadExit => "thread_exit",
        }
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* pub flushes: [AtomicU64; 8] }
        pub(crate) static COUNTERS: Counters = Counters { $($name: AtomicU64::new(0),)* flushes: [const { AtomicU64::new(0) }; 8] };

        /// A point-in-time copy of every counter.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// Flushes by reason, in [`FlushReason::ALL`] order.
            pub flushes_by_reason: [u64; 8],
            /// Recompiles (a known op structure compiled again with other
            /// types or attributes) by cause, in [`crate::fusion::Cause::ALL`] order.
            pub recompiles_by_cause: [u64; 4],
        }

        /// Reads every counter.
        pub fn snapshot() -> Snapshot {
            Snapshot {
                $($name: COUNTERS.$name.load(Relaxed),)*
                flushes_by_reason: std::array::from_fn(|i| COUNTERS.flushes[i].load(Relaxed)),
                recompiles_by_cause: recompile_counts(),
            }
        }

        impl Snapshot {
            /// Every counter as a `(name, value)` pair, derived totals and
            /// per-reason and per-cause splits included: what bindings and
            /// reports list.
            pub fn entries(&self) -> Vec<(String, u64)> {
                let mut v = vec![$((stringify!($name).to_string(), self.$name),)*];
                v.push(("flushes".to_string(), self.flushes()));
                for r in FlushReason::ALL {
                    v.push((format!("flushes_{}", r.name()), self.flushes_for(r)));
                }
                v.push(("recompiles".to_string(), self.recompiles()));
                for c in crate::fusion::Cause::ALL {
                    v.push((format!("recompiles_{}", c.name()), self.recompiles_by_cause[c as usize]));
                }
                v
            }
        }
    };
}

counters!(
    /// Ops recorded into graphs, scalar constants included (added when
    /// their graph is flushed, so pending ops are not counted yet).
    ops_recorded,
    /// Regions executed on the device.
    regions_executed,
    /// XLA compilations (cache misses).
    compiles,
    /// Compile-cache hits.
    cache_hits,
    /// Executables dropped from memory to stay within `LAZYFUSE_MAX_EXECUTABLES`.
    executables_evicted,
    /// Time spent compiling, in nanoseconds.
    compile_ns,
    /// Time spent executing (enqueue to completion), in nanoseconds.
    execute_ns,
    /// Host-to-device transfers.
    h2d_transfers,
    /// Bytes moved host to device.
    h2d_bytes,
    /// Device-to-host transfers.
    d2h_transfers,
    /// Bytes moved device to host.
    d2h_bytes,
    /// Device-to-host transfers read straight from host memory (the CPU
    /// plugin's buffers), without the plugin's asynchronous copy.
    d2h_in_place,
    /// Device buffers currently alive.
    live_buffers,
    /// Bytes held by live device buffers.
    live_buffer_bytes,
    /// The most bytes live device buffers held at once.
    peak_live_buffer_bytes,
    /// Regions whose compile or execution failed.
    region_failures,
    /// Input buffers donated to XLA (reused for an output in place).
    buffers_donated,
    /// Executables loaded from the persistent cache (`LAZYFUSE_CACHE_DIR`) instead of compiled.
    disk_cache_hits,
    /// Persistent-cache lookups that found no entry.
    disk_cache_misses,
    /// Entries written to the persistent cache.
    disk_cache_stores,
    /// Entries found damaged or foreign (truncated, garbled, other version), removed and recompiled.
    disk_cache_rejected,
    /// Entries evicted to keep the cache directory within `LAZYFUSE_CACHE_MAX_BYTES`.
    disk_cache_evictions,
    /// Time spent loading executables from the persistent cache, in nanoseconds.
    disk_cache_load_ns,
    /// Live tensors a flush left out (kept pending) because the program was
    /// predicted not to use them.
    left_out,
    /// Left-out tensors computed later after all (read, used, or synced).
    recomputes,
    /// Values written by executed regions (their outputs): what flushes
    /// materialise.
    region_outputs,
    /// Flushes whose plan was replayed from an earlier flush with the same
    /// graph structure instead of planned again.
    plans_reused,
    /// Axes (and `narrow` starts) a recording site marked dynamic because
    /// its result changed size from one step to the next.
    dynamic_marks,
    /// Computed values padded to a larger capacity by a host copy, outside
    /// any program (a `cat`-grown cache entering its next bucket).
    dynamic_regrows,
    /// Collective ops (all-reduce, all-gather, reduce-scatter, all-to-all,
    /// collective-permute) in the SPMD programs executed, as one device
    /// runs them (XLA's combiner may bucket many into one).
    collectives,
    /// Bytes those collectives produce on one device (for an all-reduce,
    /// the bytes reduced: a ring moves 2(N-1)/N of them per device).
    collective_bytes,
    /// SPMD programs executed (one per region launched over a mesh).
    spmd_launches,
    /// Flushes run on the thread that waited for them (a read or a
    /// `realize()` with nothing else queued) instead of being handed to
    /// the executor thread: two thread wake-ups saved each.
    flushes_inline,
);

/// Most device ordinals whose live bytes are tracked.
pub const MAX_DEVICES: usize = 64;

static DEVICE_LIVE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static DEVICE_PEAK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Counts `bytes` as allocated (`add`) or freed on device `ordinal`.
pub(crate) fn device_bytes(ordinal: usize, bytes: u64, add: bool) {
    let Some(live) = DEVICE_LIVE.get(ordinal) else {
        return;
    };
    if add {
        let now = live.fetch_add(bytes, Relaxed) + bytes;
        DEVICE_PEAK[ordinal].fetch_max(now, Relaxed);
    } else {
        live.fetch_sub(bytes, Relaxed);
    }
}

/// Bytes of live device buffers on each device ordinal (a sharded buffer
/// counts its shard on each of its mesh's devices), up to the last device
/// that ever held one; by client, devices of the same ordinal add up.
pub fn device_live_bytes() -> Vec<u64> {
    per_device(&DEVICE_LIVE)
}

/// The most bytes each device ordinal held at once ([`device_live_bytes`]).
pub fn device_peak_bytes() -> Vec<u64> {
    per_device(&DEVICE_PEAK)
}

fn per_device(a: &[AtomicU64; MAX_DEVICES]) -> Vec<u64> {
    let used = DEVICE_PEAK
        .iter()
        .rposition(|p| p.load(Relaxed) > 0)
        .map_or(0, |i| i + 1);
    a[..used].iter().map(|x| x.load(Relaxed)).collect()
}

impl Snapshot {
    /// Total flushes over all reasons.
    pub fn flushes(&self) -> u64 {
        self.flushes_by_reason.iter().sum()
    }

    /// Flushes for one reason.
    pub fn flushes_for(&self, r: FlushReason) -> u64 {
        self.flushes_by_reason[r as usize]
    }

    /// Total recompiles over all causes.
    pub fn recompiles(&self) -> u64 {
        self.recompiles_by_cause.iter().sum()
    }

    /// Executables served without compiling (memory or persistent cache)
    /// over all executables requested; 0 before the first request.
    pub fn cache_hit_rate(&self) -> f64 {
        let hits = self.cache_hits + self.disk_cache_hits;
        let all = hits + self.compiles;
        if all == 0 {
            0.0
        } else {
            hits as f64 / all as f64
        }
    }
}

/// A phase whose durations (or sizes) are kept as a histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Recording one op (only timed with `LAZYFUSE_METRICS` or [`set_timing`]).
    Record,
    /// Planning one flush.
    Plan,
    /// One XLA compile.
    Compile,
    /// Loading one executable from the persistent cache.
    DiskCacheLoad,
    /// Enqueueing one region (including the wait with `LAZYFUSE_LAUNCH_BLOCKING=1`).
    Launch,
    /// Awaiting one launched region.
    Await,
    /// One host-to-device transfer.
    HostToDevice,
    /// One device-to-host transfer.
    DeviceToHost,
    /// Regions per flush (a count, not a time).
    RegionsPerFlush,
}

impl Phase {
    /// Every phase, in report order.
    pub const ALL: [Phase; 9] = [
        Phase::Record,
        Phase::Plan,
        Phase::Compile,
        Phase::DiskCacheLoad,
        Phase::Launch,
        Phase::Await,
        Phase::HostToDevice,
        Phase::DeviceToHost,
        Phase::RegionsPerFlush,
    ];

    /// Name used in the report (`<name>_p50` ...).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Record => "record_ns",
            Phase::Plan => "plan_ns",
            Phase::Compile => "compile_time_ns",
            Phase::DiskCacheLoad => "disk_cache_load_time_ns",
            Phase::Launch => "launch_ns",
            Phase::Await => "await_ns",
            Phase::HostToDevice => "h2d_ns",
            Phase::DeviceToHost => "d2h_ns",
            Phase::RegionsPerFlush => "regions_per_flush",
        }
    }
}

/// A log2-bucket histogram: bucket `i` counts values in `[2^i, 2^(i+1))`
/// (bucket 0 also holds 0). Lock-free; quantiles are bucket estimates
/// (within a factor of 1.5).
struct Histogram {
    buckets: [AtomicU64; 64],
    count: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; 64],
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    fn observe(&self, v: u64) {
        let i = 63 - (v | 1).leading_zeros() as usize;
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(v, Relaxed);
    }

    /// The `q` quantile (0..=1): the midpoint of the bucket holding it.
    fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if i == 0 {
                    1
                } else {
                    (1u64 << i) + (1u64 << (i - 1))
                };
            }
        }
        u64::MAX
    }
}

static HISTOGRAMS: [Histogram; 9] = [const { Histogram::new() }; 9];

/// Adds one observation of `phase` (nanoseconds, or a count for
/// [`Phase::RegionsPerFlush`]).
pub(crate) fn observe(phase: Phase, v: u64) {
    HISTOGRAMS[phase as usize].observe(v);
}

/// Adds the time since `t0` to `phase`.
pub(crate) fn observe_since(phase: Phase, t0: std::time::Instant) {
    observe(phase, t0.elapsed().as_nanos() as u64);
}

/// Count, total and p50/p90/p99 estimate of one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Distribution {
    /// Observations.
    pub count: u64,
    /// Sum of the observed values.
    pub sum: u64,
    /// Median estimate.
    pub p50: u64,
    /// 90th percentile estimate.
    pub p90: u64,
    /// 99th percentile estimate.
    pub p99: u64,
}

/// The distribution observed so far for `phase`.
pub fn distribution(phase: Phase) -> Distribution {
    let h = &HISTOGRAMS[phase as usize];
    Distribution {
        count: h.count.load(Relaxed),
        sum: h.sum.load(Relaxed),
        p50: h.quantile(0.5),
        p90: h.quantile(0.9),
        p99: h.quantile(0.99),
    }
}

static TIMING: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Switches per-op recording timing on or off (default: on iff `LAZYFUSE_METRICS` is set).
pub fn set_timing(on: bool) {
    TIMING.store(if on { 2 } else { 1 }, Relaxed);
}

/// Whether recording is timed.
pub fn timing_enabled() -> bool {
    match TIMING.load(Relaxed) {
        0 => {
            let on = crate::config::metrics_at_exit();
            set_timing(on);
            on
        }
        v => v == 2,
    }
}

/// Start of a recording measurement, when recording is timed.
#[inline]
pub(crate) fn record_start() -> Option<std::time::Instant> {
    timing_enabled().then(std::time::Instant::now)
}

/// End of a recording measurement started by [`record_start`].
#[inline]
pub(crate) fn record_end(t0: Option<std::time::Instant>) {
    if let Some(t0) = t0 {
        observe_since(Phase::Record, t0);
    }
}

pub(crate) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Relaxed);
}

pub(crate) fn sub(c: &AtomicU64, v: u64) {
    c.fetch_sub(v, Relaxed);
}

pub(crate) fn flush(r: FlushReason) {
    COUNTERS.flushes[r as usize].fetch_add(1, Relaxed);
}

/// Whether flushes describe what they left out and recomputed (for the
/// report): on with recording timing (`LAZYFUSE_METRICS`, [`set_timing`]).
pub(crate) fn explaining() -> bool {
    timing_enabled()
}

/// Output decisions shown in the report, most recent last.
static RECENT_OUTPUTS: parking_lot::Mutex<std::collections::VecDeque<String>> =
    parking_lot::Mutex::new(std::collections::VecDeque::new());
/// How many output decisions the report keeps.
pub const RECENT_OUTPUTS_KEPT: usize = 32;

fn keep_output_event(e: String) {
    let mut r = RECENT_OUTPUTS.lock();
    if r.len() >= RECENT_OUTPUTS_KEPT {
        r.pop_front();
    }
    r.push_back(e);
}

/// Notes a live tensor left out of a flush (`what`: op, type, recording
/// line, where the plan computed it, and why it was left out).
pub(crate) fn left_out(what: String) {
    keep_output_event(format!("left out: {what}"));
}

/// Notes an axis marked dynamic (`what`: op, axis, sizes, recording line).
pub(crate) fn dynamic_marked(what: String) {
    keep_output_event(format!("dynamic: {what}"));
}

/// Notes a size that changed but stayed static (`what`: the site, the
/// sizes, and why), so `explain` says what compiles per shape.
pub(crate) fn dynamic_static(what: String) {
    keep_output_event(format!("static: {what}"));
}

/// Notes a left-out tensor computed after all (`what`: op, type,
/// recording line, and the region that computes it).
pub(crate) fn recomputed(what: String) {
    keep_output_event(format!(
        "recompute (read or used after being left out): {what}"
    ));
}

/// The most recent output decisions (left-out tensors and recomputes),
/// oldest first. Recorded only while recording is timed ([`set_timing`]).
pub fn recent_output_decisions() -> Vec<String> {
    RECENT_OUTPUTS.lock().iter().cloned().collect()
}

/// Recompiles by cause index (`lazyfuse::fusion::Cause` order); the explain
/// layer counts into these so the report needs nothing above this module.
static RECOMPILES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// Explanations shown in the report, most recent last.
static RECENT_RECOMPILES: parking_lot::Mutex<std::collections::VecDeque<String>> =
    parking_lot::Mutex::new(std::collections::VecDeque::new());
/// How many explanations the report keeps.
pub const RECENT_RECOMPILES_KEPT: usize = 32;

/// Counts one recompile of cause index `cause` and keeps its explanation.
pub(crate) fn recompiled(cause: usize, explanation: String) {
    RECOMPILES[cause].fetch_add(1, Relaxed);
    let mut r = RECENT_RECOMPILES.lock();
    if r.len() >= RECENT_RECOMPILES_KEPT {
        r.pop_front();
    }
    r.push_back(explanation);
}

/// Recompiles so far by cause index.
pub(crate) fn recompile_counts() -> [u64; 4] {
    std::array::from_fn(|i| RECOMPILES[i].load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_bucket_estimates() {
        let h = Histogram::new();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=100u64 {
            h.observe(v * 1000);
        }
        // p50 = 50,000 lies in [32768, 65536): midpoint 49152.
        assert_eq!(h.quantile(0.5), 49_152);
        // p99 = 99,000 lies in [65536, 131072): midpoint 98304.
        assert_eq!(h.quantile(0.99), 98_304);
        assert_eq!(h.count.load(Relaxed), 100);
        h.observe(0);
        assert_eq!(h.buckets[0].load(Relaxed), 1);
    }
}
