//! A tensor's value and where it is: the state machine of lazy execution,
//! and its side of the executor's [`Slot`] seam.

use super::graph::ThreadGraph;
use crate::executor::{Latch, Slot};
use crate::metrics::FlushReason;
use crate::runtime::DeviceBuffer;
use crate::{Device, Error, Result};
use lazyfuse_ir::{DType, NodeId, Shape};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// What a tensor handle points at: its type, its device, where its value
/// is, and one slot for the autograd layer above (type-erased, so this
/// layer does not name it).
pub(crate) struct TensorInner {
    pub shape: Shape,
    pub dtype: DType,
    pub device: Device,
    pub state: Mutex<TensorState>,
    /// Set only for tensors that take part in differentiation (so untracked
    /// tensors pay one empty `OnceLock`).
    pub autograd: OnceLock<Arc<dyn Any + Send + Sync>>,
}

/// Where a tensor's value is.
pub(crate) enum TensorState {
    /// Recorded in `graph` (of generation `gen`) as `node`.
    Pending {
        graph: Arc<ThreadGraph>,
        node: NodeId,
        gen: u64,
    },
    /// Flushed: a queued or running job computes it; wait on the latch.
    InFlight(Arc<Latch>),
    /// Materialised on the device.
    Ready(Arc<DeviceBuffer>),
    /// Its computation failed; reading it returns this error.
    Failed(Error),
}

impl TensorInner {
    /// A tensor whose value is already on `device`.
    pub(crate) fn ready(buf: Arc<DeviceBuffer>, device: &Device) -> Arc<TensorInner> {
        Arc::new(TensorInner {
            shape: buf.shape.clone(),
            dtype: buf.dtype,
            device: device.clone(),
            state: Mutex::new(TensorState::Ready(buf)),
            autograd: OnceLock::new(),
        })
    }

    /// The device buffer if the value is already materialised (no flush).
    pub(crate) fn ready_buffer(&self) -> Option<Arc<DeviceBuffer>> {
        match &*self.state.lock() {
            TensorState::Ready(b) => Some(b.clone()),
            _ => None,
        }
    }

    /// True while the value is only recorded in its thread's graph.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(*self.state.lock(), TensorState::Pending { .. })
    }

    /// True once the value is computed (or failed). Never blocks.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(
            *self.state.lock(),
            TensorState::Ready(_) | TensorState::Failed(_)
        )
    }

    /// Flushes whatever graph holds this value, waits for it, and returns
    /// its device buffer.
    pub(crate) fn materialize(&self, reason: FlushReason) -> Result<Arc<DeviceBuffer>> {
        loop {
            let st = self.state.lock();
            match &*st {
                TensorState::Ready(b) => return Ok(b.clone()),
                TensorState::Failed(e) => return Err(e.clone()),
                TensorState::Pending { graph, .. } => {
                    let graph = graph.clone();
                    drop(st);
                    graph.flush(reason);
                }
                TensorState::InFlight(latch) => {
                    let latch = latch.clone();
                    drop(st);
                    latch.wait();
                }
            }
        }
    }
}

impl Slot for TensorInner {
    fn start(&self, latch: &Arc<Latch>) {
        *self.state.lock() = TensorState::InFlight(latch.clone());
    }

    fn bind(&self, value: Result<Arc<DeviceBuffer>>) {
        let mut st = self.state.lock();
        if matches!(*st, TensorState::InFlight(_)) {
            *st = match value {
                Ok(b) => TensorState::Ready(b),
                Err(e) => TensorState::Failed(e),
            };
        }
    }

    fn read(&self) -> Result<Arc<DeviceBuffer>> {
        loop {
            let st = self.state.lock();
            match &*st {
                TensorState::Ready(b) => return Ok(b.clone()),
                TensorState::Failed(e) => return Err(e.clone()),
                // Queued jobs run in order, so the producer has finished
                // unless jobs run on their flushing threads (launch
                // blocking), where it started earlier on another thread and
                // never waits for us.
                TensorState::InFlight(latch) => {
                    let latch = latch.clone();
                    drop(st);
                    latch.wait();
                }
                TensorState::Pending { .. } => {
                    return Err(Error::internal("input computed out of order"))
                }
            }
        }
    }
}
