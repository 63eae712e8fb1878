//! Runtime configuration: environment defaults and per-thread overrides.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn env_flag(name: &str) -> Option<bool> {
    std::env::var(name)
        .ok()
        .map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no" | ""))
}

/// Process-wide fusion default: on unless `TPU_FUSION=0`.
fn fusion_default() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| env_flag("TPU_FUSION").unwrap_or(true))
}

thread_local! {
    static FUSION: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether ops recorded on this thread are fused (see [`set_fusion`]).
pub fn fusion_enabled() -> bool {
    FUSION.with(|f| f.get()).unwrap_or_else(fusion_default)
}

/// Switches fusion on or off for the calling thread, flushing what it has
/// pending first so earlier ops keep the mode they were recorded under.
/// Per thread, so concurrent tests and workers never change each other's mode.
pub fn set_fusion(on: bool) {
    let _ = crate::context::sync_thread(crate::metrics::FlushReason::ModeChange);
    FUSION.with(|f| f.set(Some(on)));
}

/// Restores the previous fusion mode of this thread when dropped.
#[must_use = "the previous mode is restored when the guard is dropped"]
pub struct FusionGuard {
    previous: bool,
}

impl FusionGuard {
    /// Sets fusion to `on` until the guard is dropped.
    pub fn new(on: bool) -> Self {
        let previous = fusion_enabled();
        set_fusion(on);
        FusionGuard { previous }
    }
}

impl Drop for FusionGuard {
    fn drop(&mut self) {
        set_fusion(self.previous);
    }
}

static MAX_PENDING: AtomicUsize = AtomicUsize::new(0);

/// The pending-graph cap: a thread's graph is flushed once it holds this many
/// nodes (`TPU_MAX_PENDING_OPS`, default 20,000), bounding memory and compile size.
pub fn max_pending_ops() -> usize {
    let v = MAX_PENDING.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let d = std::env::var("TPU_MAX_PENDING_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(20_000);
    MAX_PENDING.store(d, Ordering::Relaxed);
    d
}

/// Overrides the pending-graph cap for the whole process.
pub fn set_max_pending_ops(n: usize) {
    MAX_PENDING.store(n.max(1), Ordering::Relaxed);
}

/// `TPU_METRICS=1`: print the metrics report at exit.
pub(crate) fn metrics_at_exit() -> bool {
    env_flag("TPU_METRICS").unwrap_or(false)
}

/// `TPU_LAUNCH_BLOCKING=1`: wait for every execution as it is launched, so an
/// execution error is reported by the region (and op) that caused it.
pub fn launch_blocking() -> bool {
    static B: OnceLock<bool> = OnceLock::new();
    *B.get_or_init(|| env_flag("TPU_LAUNCH_BLOCKING").unwrap_or(false))
}
