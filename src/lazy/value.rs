//! A tensor's value and where it is: the state machine of lazy execution,
//! and its side of the executor's [`Slot`] seam.

use crate::executor::{Latch, Slot};
use crate::metrics::FlushReason;
use crate::runtime::DeviceBuffer;
use crate::{Device, Error, Result};
use lazyfuse_ir::{DType, NodeId, Shape};
use once_cell::race::OnceBox;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};

/// [`Extras::flags`]: left out of a flush and kept pending.
const RETAINED: u8 = 1;
/// [`Extras::flags`]: kept for a read the program is not expected to make
/// (a gradient a parameter keeps across an optimizer step).
const COLD: u8 = 2;

/// What a tensor handle points at: its type, its device and where its
/// value is, with everything rarer (autograd, prediction, dynamic axes,
/// meshes) behind one pointer allocated on first use. Recording makes one
/// of these per op, so it is kept small enough for the allocator's
/// cheapest size classes.
pub(crate) struct TensorInner {
    pub shape: Shape,
    pub dtype: DType,
    pub device: Device,
    pub state: Mutex<TensorState>,
    /// The graph generation and node this value is known to be in,
    /// packed in one word ([`TensorInner::node_in`]): the node it was
    /// recorded as while pending, then, once on the device, the input node
    /// it was last entered as. Generations are unique across graphs and
    /// every state change of a pending value happens under its graph's lock
    /// with a new generation, so a recorder holding that lock whose
    /// generation is still this knows the value's node without locking the
    /// value: the recording fast path (a weight used by every step of a
    /// loop included). One word, so graphs of two threads entering the same
    /// value never mix each other's halves.
    node_of: AtomicU64,
    extras: OnceBox<Extras>,
}

/// Bits of [`TensorInner::node_of`] holding the node index; the generation
/// takes the rest.
const NODE_BITS: u32 = 24;

/// The packed word of node `node` in generation `gen`, or 0 (no graph's)
/// for a pair too large to pack: such a value then takes the general path.
fn pack_node(gen: u64, node: NodeId) -> u64 {
    let n = node.index() as u64;
    if n < 1 << NODE_BITS && gen < 1 << (64 - NODE_BITS) {
        gen << NODE_BITS | n
    } else {
        0
    }
}

/// The parts of a tensor most tensors never use.
#[derive(Default)]
struct Extras {
    /// Set only for tensors that take part in differentiation.
    autograd: OnceLock<Arc<dyn Any + Send + Sync>>,
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
    logical: OnceLock<Logical>,
    /// The device mesh the value lives on, for a sharded tensor and every
    /// value recorded from one (so mixing two meshes is an `Err` at the op
    /// that does it, not at the sync point).
    mesh: OnceLock<crate::spmd::Mesh>,
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
    /// Every element past a logical length is zero (a cache declared with
    /// `mark_dynamic` or grown by `cat` into a zero-filled capacity buffer),
    /// so a contraction over it needs no mask on this operand. Never set
    /// with poisoned padding.
    pub zero_padded: bool,
}

/// What a pending value needs of the graph that recorded it: a trait, so
/// values name no graph type (the graph module, above this one, owns
/// values and implements it).
pub(crate) trait Recorder: Send + Sync + 'static {
    /// Flushes the graph so that `need` is computed (other live values are
    /// left to output prediction).
    fn flush_for(&self, reason: FlushReason, need: &[Arc<TensorInner>]) -> Option<Arc<Latch>>;

    /// The graph itself, for the graph module's own use.
    fn as_any(&self) -> &dyn Any;
}

/// A graph as the values pending in it see it: one thin pointer in each
/// value's state (a trait object there would widen every tensor by a
/// word, past the allocator's fast size class). The graph owns its handle;
/// the handle reaches the graph weakly, so the two free together. A
/// thread's graphs live as long as the thread, and its exit computes every
/// value pending in them, so a pending value always finds its graph.
pub(crate) struct GraphHandle(Weak<dyn Recorder>);

impl GraphHandle {
    /// The handle of the graph `graph` points to (made while it is built).
    pub(crate) fn new(graph: Weak<dyn Recorder>) -> Arc<GraphHandle> {
        Arc::new(GraphHandle(graph))
    }

    /// The graph, while it exists.
    pub(crate) fn graph(&self) -> Option<Arc<dyn Recorder>> {
        self.0.upgrade()
    }

    /// Flushes the graph for `need`; `false` if the graph is gone.
    fn flush_for(&self, reason: FlushReason, need: &[Arc<TensorInner>]) -> bool {
        match self.graph() {
            Some(g) => {
                g.flush_for(reason, need);
                true
            }
            None => false,
        }
    }
}

/// Where a tensor's value is.
pub(crate) enum TensorState {
    /// Recorded in `graph` (of generation `gen`) as `node`.
    Pending {
        graph: Arc<GraphHandle>,
        node: NodeId,
        gen: u64,
    },
    /// Flushed: a queued or running job computes it; wait on the latch.
    InFlight(Arc<Latch>),
    /// Materialised on the device.
    Ready(Arc<DeviceBuffer>),
    /// Its computation failed; reading it returns this error.
    Failed(Box<Error>),
}

impl TensorInner {
    /// A tensor in `state`.
    pub(crate) fn new(shape: Shape, dtype: DType, device: &Device, state: TensorState) -> Self {
        let node_of = match &state {
            TensorState::Pending { node, gen, .. } => pack_node(*gen, *node),
            _ => 0,
        };
        TensorInner {
            shape,
            dtype,
            device: device.clone(),
            state: Mutex::new(state),
            node_of: AtomicU64::new(node_of),
            extras: OnceBox::new(),
        }
    }

    fn extras(&self) -> &Extras {
        self.extras.get_or_init(Default::default)
    }

    /// False for the common value with no autograd state, dynamic axes,
    /// mesh or prediction bookkeeping (one load: lets an op skip looking
    /// for each).
    #[inline]
    pub(crate) fn has_extras(&self) -> bool {
        self.extras.get().is_some()
    }

    /// The autograd layer's state, if the value takes part in differentiation.
    pub(crate) fn autograd(&self) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.extras.get()?.autograd.get()
    }

    /// Where the autograd layer keeps its state for this value.
    pub(crate) fn autograd_slot(&self) -> &OnceLock<Arc<dyn Any + Send + Sync>> {
        &self.extras().autograd
    }

    /// The logical view, for a value with dynamic axes.
    pub(crate) fn logical(&self) -> Option<&Logical> {
        self.extras.get()?.logical.get()
    }

    /// Gives the value dynamic axes (once; later calls are ignored).
    pub(crate) fn set_logical(&self, l: Logical) {
        let _ = self.extras().logical.set(l);
    }

    /// The device mesh the value lives on, if any.
    pub(crate) fn mesh(&self) -> Option<&crate::spmd::Mesh> {
        self.extras.get()?.mesh.get()
    }

    /// Places the value on a mesh (once; later calls are ignored).
    pub(crate) fn set_mesh(&self, m: crate::spmd::Mesh) {
        let _ = self.extras().mesh.set(m);
    }

    /// A tensor whose value is already on `device`.
    pub(crate) fn ready(buf: Arc<DeviceBuffer>, device: &Device) -> Arc<TensorInner> {
        let (shape, dtype) = (buf.shape.clone(), buf.dtype);
        let mesh = buf.sharding().map(|s| s.mesh().clone());
        let t = TensorInner::new(shape, dtype, device, TensorState::Ready(buf));
        if let Some(m) = mesh {
            t.set_mesh(m);
        }
        Arc::new(t)
    }

    /// Notes that the program read or used this value.
    #[inline]
    pub(crate) fn mark_used(&self) {
        if let Some(u) = self.extras.get().and_then(|e| e.used.get()) {
            u.store(true, Relaxed);
        }
    }

    /// A fresh "used" cell for watching this value: false until the program
    /// reads or uses it.
    pub(crate) fn watch_cell(&self) -> Arc<AtomicBool> {
        let u = self.extras().used.get_or_init(Default::default).clone();
        u.store(false, Relaxed);
        u
    }

    /// Marks the value as left out of a flush (kept pending), from `site`.
    pub(crate) fn set_retained(&self, site: u64) {
        let e = self.extras();
        e.site.store(site, Relaxed);
        e.flags.fetch_or(RETAINED, Relaxed);
    }

    /// Marks the value as kept only in case the program reads it: a flush
    /// leaves a new site of such values out from the start instead of
    /// computing them until it has seen them dropped (which compiled a
    /// second program in a training loop's first steps).
    pub(crate) fn set_cold(&self) {
        self.extras().flags.fetch_or(COLD, Relaxed);
    }

    /// See [`TensorInner::set_cold`].
    pub(crate) fn is_cold(&self) -> bool {
        self.extras
            .get()
            .is_some_and(|e| e.flags.load(Relaxed) & COLD != 0)
    }

    /// If the value was left out, clears that and returns its site: it is
    /// being computed after all (a recompute).
    #[inline]
    pub(crate) fn take_retained(&self) -> Option<u64> {
        let e = self.extras.get()?;
        if e.flags.load(Relaxed) & RETAINED == 0 {
            return None;
        }
        let was = e.flags.fetch_and(!RETAINED, Relaxed);
        (was & RETAINED != 0).then(|| e.site.load(Relaxed))
    }

    /// Readies a dead value nobody else holds (a flush found it unused)
    /// for reuse: what it carried beyond its place is dropped now, so its
    /// autograd state and the values that holds are freed with it.
    pub(crate) fn clear_extras(&mut self) {
        self.extras = OnceBox::new();
    }

    /// Makes a recycled value (see [`TensorInner::clear_extras`]) the value
    /// of `node`, just recorded in `graph`'s generation `gen`, in place:
    /// recording allocates nothing, and a value already pending in `graph`
    /// (every recycled one is) keeps its handle on it rather than taking a
    /// new one.
    pub(crate) fn reuse(
        &mut self,
        (shape, dtype): (&Shape, DType),
        (graph, device): (&Arc<GraphHandle>, &Device),
        node: NodeId,
        gen: u64,
    ) {
        self.shape.clone_from(shape);
        self.dtype = dtype;
        self.device = device.clone();
        *self.node_of.get_mut() = pack_node(gen, node);
        match self.state.get_mut() {
            TensorState::Pending {
                graph: g,
                node: n,
                gen: e,
            } if Arc::ptr_eq(g, graph) => (*n, *e) = (node, gen),
            st => {
                *st = TensorState::Pending {
                    graph: graph.clone(),
                    node,
                    gen,
                }
            }
        }
    }

    /// This value's node in the graph of generation `gen`, if known
    /// without a lock (see [`TensorInner::node_of`]). A match is that node
    /// for the rest of the generation. (Generation 0, the word of a value
    /// in no graph, is no graph's.)
    #[inline(always)]
    pub(crate) fn node_in(&self, gen: u64) -> Option<NodeId> {
        let v = self.node_of.load(Relaxed);
        (v >> NODE_BITS == gen).then(|| NodeId::new((v & ((1 << NODE_BITS) - 1)) as usize))
    }

    /// Notes that this value, materialised on the device, is input node
    /// `node` of the graph of generation `gen` (by that graph, under its
    /// lock).
    #[inline]
    pub(crate) fn set_leaf(&self, gen: u64, node: NodeId) {
        self.node_of.store(pack_node(gen, node), Relaxed);
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
            super::clock::count_sync_point();
        }
        loop {
            let st = self.state.lock();
            match &*st {
                TensorState::Ready(b) => return Ok(b.clone()),
                TensorState::Failed(e) => return Err((**e).clone()),
                TensorState::Pending { graph, .. } => {
                    let graph = graph.clone();
                    drop(st);
                    if !graph.flush_for(reason, std::slice::from_ref(self)) {
                        return Err(orphaned());
                    }
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
                Err(e) => TensorState::Failed(Box::new(e)),
            };
        }
    }

    fn read(&self) -> Result<Arc<DeviceBuffer>> {
        loop {
            let st = self.state.lock();
            match &*st {
                TensorState::Ready(b) => return Ok(b.clone()),
                TensorState::Failed(e) => return Err((**e).clone()),
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
    let mut groups: Vec<(Arc<GraphHandle>, Vec<Arc<TensorInner>>)> = Vec::new();
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
        // A graph that is gone leaves its values to fail in `materialize`.
        let _ = g.flush_for(reason, need);
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

/// The error of a value whose graph no longer exists (never expected: a
/// thread's exit computes what it has pending).
#[cold]
fn orphaned() -> Error {
    Error::internal("a pending value's graph no longer exists")
}

#[cfg(test)]
mod tests {
    /// Recording allocates and moves one `TensorInner` per op (in an `Arc`,
    /// 16 bytes more): keep the pair within a 128-byte allocator chunk, as
    /// small as the value's hot fields allow (rare ones live in `Extras`).
    #[test]
    fn a_tensor_fits_the_allocators_fast_size_class() {
        assert!(std::mem::size_of::<super::TensorInner>() + 16 <= 120);
    }
}
