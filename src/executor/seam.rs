//! The executor's seam with the layer above: the values a job computes
//! ([`Slot`]), what enters it ([`Input`]), and the completion readers wait
//! on ([`Latch`]).

use crate::runtime::DeviceBuffer;
use crate::Result;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Completion of one flushed graph: readers of its values wait on it.
#[derive(Default)]
pub(crate) struct Latch {
    done: Mutex<bool>,
    cv: Condvar,
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
