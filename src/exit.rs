//! The one process-exit hook. Layers register what must happen when the
//! process ends (executors drain their in-flight work, then the
//! `TPU_METRICS` report is printed) and a single `atexit` callback runs
//! them in [`Stage`] order, whatever order they were registered in.
//!
//! A leaf of the layer stack: it imports nothing of the crate.

use parking_lot::Mutex;

/// When an exit callback runs, earliest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// Wait for work still in flight (it would race the plugin's teardown).
    Drain,
    /// Report on what happened (after the drain, so the figures are final).
    Report,
}

/// A registered callback and when it runs.
type Callback = (Stage, fn());

static CALLBACKS: Mutex<Vec<Callback>> = Mutex::new(Vec::new());

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

extern "C" fn run_callbacks() {
    // Never unwind across the C boundary.
    let _ = std::panic::catch_unwind(|| {
        let mut cbs = std::mem::take(&mut *CALLBACKS.lock());
        cbs.sort_by_key(|(s, _)| *s);
        for (_, f) in cbs {
            let _ = std::panic::catch_unwind(f);
        }
    });
}

/// Runs `f` at process exit in `stage` (registering the same function twice
/// runs it once).
pub(crate) fn on_exit(stage: Stage, f: fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn` without captured state.
        unsafe {
            atexit(run_callbacks);
        }
    });
    let mut cbs = CALLBACKS.lock();
    if !cbs
        .iter()
        .any(|&(s, g)| s == stage && g as usize == f as usize)
    {
        cbs.push((stage, f));
    }
}
