//! The one process-exit hook. Layers register what must happen when the
//! process ends (executors drain their in-flight work, then the
//! `LAZYFUSE_METRICS` report is printed) and the hook runs them in [`Stage`]
//! order, whatever order they were registered in.
//!
//! The drain must come before the plugin's own teardown. The plugin
//! registers the destructors of statics it creates on first use (MLIR's
//! type registry, made by the first compile) with `atexit` too, and exit
//! runs those newest first: a static first used by a compile that is
//! still in flight when `main` returns (a worker thread's: `main` need
//! not touch a device at all) is registered after any hook of ours and
//! destroyed before it, under the compile's feet. So the drain runs from
//! a destructor of the main thread's thread-local storage, which `exit`
//! runs before any `atexit` handler; it is armed by a constructor that
//! runs on the main thread before `main`. The `atexit` hook remains for
//! the report, and for a process that exits from another thread.
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

/// Runs (once) the callbacks of stages up to `last`, in stage order.
fn run_through(last: Stage) {
    // Never unwind across the C boundary or out of a destructor.
    let _ = std::panic::catch_unwind(|| {
        let mut cbs: Vec<Callback> = {
            let mut all = CALLBACKS.lock();
            let (now, later) = all.drain(..).partition(|(s, _)| *s <= last);
            *all = later;
            now
        };
        cbs.sort_by_key(|(s, _)| *s);
        for (_, f) in cbs {
            let _ = std::panic::catch_unwind(f);
        }
    });
}

extern "C" fn run_callbacks() {
    run_through(Stage::Report);
}

/// Runs the main thread's exit drain when its thread-local storage is
/// destroyed: the first thing `exit` does (see the module doc).
struct MainThreadExit;

impl Drop for MainThreadExit {
    fn drop(&mut self) {
        run_through(Stage::Drain);
    }
}

thread_local! {
    static MAIN_THREAD_EXIT: MainThreadExit = const { MainThreadExit };
}

/// Registers the main thread's exit drain before `main` runs (a
/// constructor runs on the thread that loads the program).
#[ctor::ctor(unsafe)]
fn arm_main_thread_exit() {
    // `try_with`: during start-up there is nothing to report if it fails.
    let _ = MAIN_THREAD_EXIT.try_with(|_| ());
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
