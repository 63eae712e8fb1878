//! Switching a thread's fusion mode. It lives in the lazy layer because a
//! switch must flush what the thread has pending first, so earlier ops keep
//! the mode they were recorded under; the mode itself is configuration.

use crate::metrics::FlushReason;

/// Switches fusion on or off for the calling thread, flushing what it has
/// pending first so earlier ops keep the mode they were recorded under.
fn set_fusion(on: bool) {
    let _ = super::sync_thread(FlushReason::ModeChange);
    crate::config::set_thread_fusion(on);
}

/// The fusion switch of the calling thread (the one toggle besides
/// `LAZYFUSE_FUSION=0`, which sets the process default): fusion is `on`
/// until the guard is dropped, then the previous mode returns. Switching
/// flushes what the thread has pending first, so earlier ops keep the mode
/// they were recorded under. Per thread, so concurrent tests and workers
/// never change each other's mode.
#[must_use = "the previous mode is restored when the guard is dropped"]
pub struct FusionGuard {
    previous: bool,
}

impl FusionGuard {
    /// Sets fusion to `on` until the guard is dropped.
    pub fn new(on: bool) -> Self {
        let previous = crate::config::fusion_enabled();
        set_fusion(on);
        FusionGuard { previous }
    }
}

impl Drop for FusionGuard {
    fn drop(&mut self) {
        set_fusion(self.previous);
    }
}
