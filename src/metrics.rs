//! Process-wide counters: what was recorded, flushed, compiled, run and moved.
//! Cheap relaxed atomics, so counting never slows the hot path measurably.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
}

impl FlushReason {
    /// Every reason, in report order.
    pub const ALL: [FlushReason; 7] = [
        FlushReason::Read,
        FlushReason::Realize,
        FlushReason::Sync,
        FlushReason::Eager,
        FlushReason::GraphCap,
        FlushReason::CrossThread,
        FlushReason::ModeChange,
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
        }
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* pub flushes: [AtomicU64; 7] }
        pub(crate) static C: Counters = Counters { $($name: AtomicU64::new(0),)* flushes: [const { AtomicU64::new(0) }; 7] };

        /// A point-in-time copy of every counter.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// Flushes by reason, in [`FlushReason::ALL`] order.
            pub flushes_by_reason: [u64; 7],
        }

        /// Reads every counter.
        pub fn snapshot() -> Snapshot {
            Snapshot {
                $($name: C.$name.load(Relaxed),)*
                flushes_by_reason: std::array::from_fn(|i| C.flushes[i].load(Relaxed)),
            }
        }

        impl Snapshot {
            fn lines(&self) -> Vec<(String, u64)> {
                let mut v = vec![$((stringify!($name).to_string(), self.$name),)*];
                v.push(("flushes".to_string(), self.flushes()));
                for r in FlushReason::ALL {
                    v.push((format!("flushes_{}", r.name()), self.flushes_for(r)));
                }
                v
            }
        }
    };
}

counters!(
    /// Ops recorded into graphs (including scalar constants and leaves).
    ops_recorded,
    /// Regions executed on the device.
    regions_executed,
    /// XLA compilations (cache misses).
    compiles,
    /// Compile-cache hits.
    cache_hits,
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
    /// Device buffers currently alive.
    live_buffers,
    /// Bytes held by live device buffers.
    live_buffer_bytes,
    /// Regions whose compile or execution failed.
    region_failures,
    /// Input buffers donated to XLA (reused for an output in place).
    buffers_donated,
);

impl Snapshot {
    /// Total flushes over all reasons.
    pub fn flushes(&self) -> u64 {
        self.flushes_by_reason.iter().sum()
    }

    /// Flushes for one reason.
    pub fn flushes_for(&self, r: FlushReason) -> u64 {
        self.flushes_by_reason[r as usize]
    }
}

pub(crate) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Relaxed);
}

pub(crate) fn sub(c: &AtomicU64, v: u64) {
    c.fetch_sub(v, Relaxed);
}

pub(crate) fn flush(r: FlushReason) {
    C.flushes[r as usize].fetch_add(1, Relaxed);
}

/// The metrics report: one `name: value` line per counter.
pub fn report() -> String {
    let mut s = String::new();
    for (k, v) in snapshot().lines() {
        let _ = writeln!(s, "{k}: {v}");
    }
    s
}

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

extern "C" fn print_report_at_exit() {
    // Never unwind across the C boundary.
    let _ = std::panic::catch_unwind(|| eprint!("lazyfuse metrics\n{}", report()));
}

/// Registers the `TPU_METRICS=1` exit report once per process.
pub(crate) fn install_exit_report() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if crate::config::metrics_at_exit() {
            // SAFETY: registering a plain `extern "C" fn` with no captured state.
            unsafe {
                atexit(print_report_at_exit);
            }
        }
    });
}
