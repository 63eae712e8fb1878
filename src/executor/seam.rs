//! The executor's seam with the layer above: the values a job computes
//! ([`Slot`]), what enters it ([`Input`]), and the completion readers wait
//! on ([`Latch`]).

use crate::runtime::DeviceBuffer;
use crate::Result;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{fence, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// Completion of one flushed graph: readers of its values wait on it.
#[derive(Default)]
pub(crate) struct Latch {
    done: Mutex<bool>,
    cv: Condvar,
    /// A sequence number, odd while the job binds its outputs: the only
    /// time the executor holds a strong handle to a value it computes
    /// (see [`Latch::outside_binding`]).
    binding: AtomicU64,
}

impl Latch {
    /// Blocks until the job has bound its values.
    pub(crate) fn wait(&self) {
        let mut d = self.done.lock();
        while !*d {
            self.cv.wait(&mut d);
        }
    }

    pub(super) fn open(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }

    /// Runs `bind`, the job's loop that upgrades each output's weak handle
    /// for the moment it takes to bind it, marked as binding (also if it
    /// unwinds).
    pub(crate) fn binding(&self, bind: impl FnOnce()) {
        struct Section<'a>(&'a AtomicU64);
        impl Drop for Section<'_> {
            fn drop(&mut self) {
                fence(SeqCst);
                self.0.fetch_add(1, SeqCst);
            }
        }
        self.binding.fetch_add(1, SeqCst);
        fence(SeqCst);
        let _section = Section(&self.binding);
        bind();
    }

    /// `read`'s result at a moment this job is not binding its outputs,
    /// so a strong count `read` takes of one of them counts only the
    /// program's handles, not the executor's passing one. Output prediction
    /// judges a value dead by that count: the executor's handle would
    /// delay the judgement by a flush, depending on when the worker ran.
    /// `read` may run more than once; a reader that meets the binding loop
    /// waits the few microseconds it takes.
    pub(crate) fn outside_binding<R>(&self, read: impl Fn() -> R) -> R {
        loop {
            let before = self.binding.load(SeqCst);
            if before % 2 == 0 {
                fence(SeqCst);
                let r = read();
                fence(SeqCst);
                if self.binding.load(SeqCst) == before {
                    return r;
                }
            }
            std::thread::yield_now();
        }
    }
}

/// A value computed by a job, as the layer above represents it.
pub(crate) trait Slot: Send + Sync {
    /// The job computing this value was queued: readers must wait on `latch`.
    /// Called under the queue lock, so a graph that observes the value in
    /// flight is always queued after the job computing it.
    fn start(&self, latch: &Arc<Latch>);
    /// The job finished: the value, or why it could not be computed. Has no
    /// effect on a slot that is not in flight (already bound).
    fn bind(&self, value: Result<Arc<DeviceBuffer>>);
    /// The value, for a later job that reads it (waits for its latch).
    fn read(&self) -> Result<Arc<DeviceBuffer>>;
}

/// A graph input: a materialised buffer, or a value an earlier (already
/// queued) job computes, read when this graph's job runs.
pub(crate) enum Input {
    /// Already on the device.
    Buffer(Arc<DeviceBuffer>),
    /// Being computed by an earlier job.
    Future(Arc<dyn Slot>),
}
