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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// [`TensorInner::flags`]: left out of a flush and kept pending.
const RETAINED: u8 = 1;

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
    /// Output-prediction bookkeeping ([`RETAINED`]).
    flags: AtomicU8,
    /// Set when the program reads or uses the value, once a flush computed
    /// it only because it was live. Shared with the predictor's watch list
    /// so the outcome survives the tensor.
    used: OnceLock<Arc<AtomicBool>>,
    /// The prediction site of a retained tensor.
    site: AtomicU64,
    /// Set for a tensor with dynamic axes: `shape` is then the padded
    /// (capacity) shape of the buffer and graph node, and this the shape
    /// the program sees.
    pub logical: OnceLock<Box<Logical>>,
    /// The device mesh the value lives on, for a sharded tensor and every
    /// value recorded from one (so mixing two meshes is an `Err` at the op
    /// that does it, not at the sync point).
    pub mesh: OnceLock<crate::spmd::Mesh>,
}

/// The logical view of a padded value: which axes are dynamic, their
/// lengths, and the most each may grow to.
#[derive(Clone, Debug)]
pub(crate) struct Logical {
    /// The shape the program sees (`Tensor::shape`).
    pub shape: Shape,
    /// Bit `a` set: axis `a` is dynamic (its capacity is the buffer's dim).
    pub mask: u32,
    /// Per axis, the declared maximum (`mark_dynamic`), 0 for none.
    pub limit: Shape,
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
    /// A tensor in `state`.
    pub(crate) fn new(shape: Shape, dtype: DType, device: &Device, state: TensorState) -> Self {
        TensorInner {
            shape,
            dtype,
            device: device.clone(),
            state: Mutex::new(state),
            autograd: OnceLock::new(),
            flags: AtomicU8::new(0),
            mesh: OnceLock::new(),
            used: OnceLock::new(),
            site: AtomicU64::new(0),
            logical: OnceLock::new(),
        }
    }

    /// A tensor whose value is already on `device`.
    pub(crate) fn ready(buf: Arc<DeviceBuffer>, device: &Device) -> Arc<TensorInner> {
        let (shape, dtype) = (buf.shape.clone(), buf.dtype);
        let mesh = buf.sharding().map(|s| s.mesh().clone());
        let t = TensorInner::new(shape, dtype, device, TensorState::Ready(buf));
        if let Some(m) = mesh {
            let _ = t.mesh.set(m);
        }
        Arc::new(t)
    }

    /// Notes that the program read or used this value.
    #[inline]
    pub(crate) fn mark_used(&self) {
        if let Some(u) = self.used.get() {
            u.store(true, Relaxed);
        }
    }

    /// A fresh "used" cell for watching this value: false until the program
    /// reads or uses it.
    pub(crate) fn watch_cell(&self) -> Arc<AtomicBool> {
        let u = self.used.get_or_init(Default::default).clone();
        u.store(false, Relaxed);
        u
    }

    /// Marks the value as left out of a flush (kept pending), from `site`.
    pub(crate) fn set_retained(&self, site: u64) {
        self.site.store(site, Relaxed);
        self.flags.fetch_or(RETAINED, Relaxed);
    }

    /// If the value was left out, clears that and returns its site: it is
    /// being computed after all (a recompute).
    #[inline]
    pub(crate) fn take_retained(&self) -> Option<u64> {
        if self.flags.load(Relaxed) & RETAINED == 0 {
            return None;
        }
        let was = self.flags.fetch_and(!RETAINED, Relaxed);
        (was & RETAINED != 0).then(|| self.site.load(Relaxed))
    }

    /// The device buffer if the value is already materialised (no flush).
    pub(crate) fn ready_buffer(&self) -> Option<Arc<DeviceBuffer>> {
        self.mark_used();
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
    pub(crate) fn materialize(self: &Arc<Self>, reason: FlushReason) -> Result<Arc<DeviceBuffer>> {
        self.mark_used();
        if matches!(reason, FlushReason::Read) {
            super::graph::count_sync_point();
        }
        loop {
            let st = self.state.lock();
            match &*st {
                TensorState::Ready(b) => return Ok(b.clone()),
                TensorState::Failed(e) => return Err(e.clone()),
                TensorState::Pending { graph, .. } => {
                    let graph = graph.clone();
                    drop(st);
                    graph.flush_for(reason, std::slice::from_ref(self));
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

/// Computes every tensor of `ts` (one flush per graph holding some of them,
/// other live tensors left to output prediction) and waits for them; the
/// first failure is returned.
pub(crate) fn materialize_all(ts: &[Arc<TensorInner>], reason: FlushReason) -> Result<()> {
    let mut groups: Vec<(Arc<ThreadGraph>, Vec<Arc<TensorInner>>)> = Vec::new();
    for t in ts {
        t.mark_used();
        if let TensorState::Pending { graph, .. } = &*t.state.lock() {
            match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, graph)) {
                Some((_, v)) => v.push(t.clone()),
                None => groups.push((graph.clone(), vec![t.clone()])),
            }
        }
    }
    for (g, need) in &groups {
        g.flush_for(reason, need);
    }
    let mut first = Ok(());
    for t in ts {
        if let Err(e) = t.materialize(reason) {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}
