//! Per-thread recording and flushing: the heart of lazy execution.
//!
//! Each thread records into its own graph per device (a [`ThreadGraph`]),
//! behind a mutex so that another thread touching one of its pending
//! tensors can flush it. A flush hands the graph, with the tensors still
//! alive, to the device's executor and returns at once: the live tensors
//! become in-flight, the thread keeps recording (a later graph may read an
//! in-flight tensor: jobs run in submission order), and only reading a
//! value or an explicit wait blocks.

use super::predict::Predictor;
use super::value::{GraphHandle, Recorder, TensorInner, TensorState};
use crate::executor::{Input, Latch, Slot};
use crate::metrics::{self, FlushReason, COUNTERS as C};
use crate::runtime::DeviceBuffer;
use crate::{Device, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{DType, Graph, Literal, NodeId, Op, Shape};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::sync::Arc;

/// One thread's pending graph on one device.
pub(crate) struct ThreadGraph {
    pub(super) device: Device,
    /// What the values pending here hold of this graph.
    pub(super) handle: Arc<GraphHandle>,
    /// The device mesh whose values are recorded here, with one-device
    /// values. The device's first graph takes the first mesh used on this
    /// thread (so a program on one mesh keeps one graph: its steps fuse as
    /// they do on one device); any other mesh gets a graph of its own, so
    /// no region mixes two meshes.
    pub(super) mesh: Mutex<Option<crate::spmd::Mesh>>,
    pub(super) state: Mutex<GraphState>,
    /// What this graph's flushes compute beyond their sync points' needs.
    pub(super) predictor: Mutex<Predictor>,
}

pub(super) struct GraphState {
    pub graph: Graph,
    /// Renewed at every flush (from [`next_generation`], so no two graphs
    /// ever share one); a pending tensor records the generation of its node.
    pub gen: u64,
    /// The tensor created for each node, if any (indexed by node index).
    pub owners: Vec<Option<Arc<TensorInner>>>,
    /// Dead values of earlier generations that nothing else holds, reused
    /// by recording in place of new allocations (at most [`MAX_SPARE`]):
    /// a loop's values die in batches at its flushes, and freeing them
    /// there sent the allocator down its slow paths on every step.
    pub spare: Vec<Arc<TensorInner>>,
    /// Values entering the graph from outside, deduplicated by address.
    pub leaves:
        std::collections::HashMap<usize, NodeId, std::hash::BuildHasherDefault<ahash::AHasher>>,
    pub inputs: Vec<(NodeId, Input)>,
    /// Fusion mode the pending ops were recorded under.
    pub fuse: bool,
    /// Ops recorded since the count was last added to the metrics (counted
    /// here, under the lock recording holds anyway, instead of in a shared
    /// atomic per op).
    pub recorded: u64,
    /// Whether a flush copied the slices of left-out tensors into this
    /// generation (see `flush::retain`): the next flush then drops the
    /// inputs of those that died before it observes what the program used.
    pub retained: bool,
    /// Left-out tensors of this generation that ops used, with the
    /// generation (gathered only for `executor::notes`).
    pub used_left_out: Vec<(NodeId, u64)>,
}

/// The most dead values a graph keeps for reuse (see `GraphState::spare`):
/// about 2 MB, more than a training step of the workloads lets die.
const MAX_SPARE: usize = 1 << 14;

/// A generation number no graph has had: see `TensorInner::node_of`.
pub(super) fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl GraphState {
    fn new() -> Self {
        GraphState {
            graph: Graph::default(),
            gen: next_generation(),
            owners: Vec::new(),
            spare: Vec::new(),
            leaves: Default::default(),
            inputs: Vec::new(),
            fuse: false,
            recorded: 0,
            retained: false,
            used_left_out: Vec::new(),
        }
    }

    /// Adds the ops recorded since the last call to the metrics.
    pub(super) fn count_recorded(&mut self) {
        metrics::add(&C.ops_recorded, std::mem::take(&mut self.recorded));
    }
}

impl Drop for GraphState {
    fn drop(&mut self) {
        self.count_recorded();
    }
}

/// This thread's graphs, one per device (and mesh) it records for.
struct Graphs(RefCell<Vec<Arc<ThreadGraph>>>);

impl Drop for Graphs {
    /// A graph holds its pending values and they hold it (see
    /// [`GraphState::owners`]): when its thread exits, the graph is flushed,
    /// which computes the values other threads still hold and frees the
    /// rest, rather than leaving both to a graph no thread records into.
    ///
    /// The thread then waits until its devices' executors are idle: work it
    /// queued (this flush, or an earlier one nothing waited for) finishes
    /// before the thread does. On the main thread this runs as the process
    /// exits, before the `atexit` handlers, among them the plugin's static
    /// destructors, some registered by its first compiles, after the
    /// runtime's own exit drain: a compile still running then crashed in
    /// the plugin's torn-down state.
    fn drop(&mut self) {
        let graphs: Vec<Arc<ThreadGraph>> = self.0.get_mut().drain(..).collect();
        for g in &graphs {
            g.flush(FlushReason::ThreadExit);
            let spare = std::mem::take(&mut g.state.lock().spare);
            drop(spare);
        }
        for g in &graphs {
            g.device.executor.drain(EXIT_DRAIN);
        }
    }
}

/// The longest an exiting thread waits for its devices' executors.
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

thread_local! {
    static GRAPHS: Graphs = const { Graphs(RefCell::new(Vec::new())) };
}

/// Runs `f` on this thread's graph for `device`, created on first use.
/// Borrowed from the thread's list rather than cloned: recording pays no
/// reference count for finding its graph. (Nothing `f` may call creates a
/// graph: creating one is the only mutable use of the list.)
fn with_thread_graph<R>(
    device: &Device,
    mesh: Option<&crate::spmd::Mesh>,
    f: impl FnOnce(&Arc<ThreadGraph>) -> R,
) -> R {
    GRAPHS.with(|Graphs(c)| {
        {
            let list = c.borrow();
            for x in list.iter().filter(|x| x.device.same_device(device)) {
                // An op with no mesh value records into the device's first
                // graph, whatever mesh it holds: no lock on the hot path.
                let Some(m) = mesh else {
                    return f(x);
                };
                let mut claimed = x.mesh.lock();
                match &*claimed {
                    Some(c) if c == m => {
                        drop(claimed);
                        return f(x);
                    }
                    None => {
                        *claimed = Some(m.clone());
                        drop(claimed);
                        return f(x);
                    }
                    Some(_) => {}
                }
            }
        }
        let g = Arc::new_cyclic(|me: &std::sync::Weak<ThreadGraph>| ThreadGraph {
            device: device.clone(),
            handle: GraphHandle::new(me.clone()),
            mesh: Mutex::new(mesh.cloned()),
            state: Mutex::new(GraphState::new()),
            predictor: Mutex::new(Predictor::default()),
        });
        c.borrow_mut().push(g.clone());
        f(&g)
    })
}

/// Flushes every graph this thread has pending (without waiting) and
/// returns the latches of the jobs it queued.
pub(crate) fn sync_thread(reason: FlushReason) -> Vec<Arc<Latch>> {
    if matches!(reason, FlushReason::Sync) {
        super::clock::count_sync_point();
    }
    let graphs: Vec<Arc<ThreadGraph>> = GRAPHS.with(|c| c.0.borrow().clone());
    graphs.iter().filter_map(|g| g.flush(reason)).collect()
}

/// Waits for every job queued before this call on the executors of the
/// devices this thread records for, those `flush()` handed over included:
/// what makes `sync()` a barrier for the thread's earlier work, not only
/// for what it still had pending. Jobs other threads queue meanwhile are
/// not waited for.
pub(crate) fn wait_thread_jobs() {
    let graphs: Vec<Arc<ThreadGraph>> = GRAPHS.with(|c| c.0.borrow().clone());
    for g in &graphs {
        g.device.executor.wait_earlier();
    }
}

/// The calling thread's graphs (a snapshot of its list).
pub(super) fn thread_graphs() -> Vec<Arc<ThreadGraph>> {
    GRAPHS.with(|c| c.0.borrow().clone())
}

/// Number of nodes pending in this thread's graph for `device` (for tests and tools).
pub fn pending_ops(device: &Device) -> usize {
    with_thread_graph(device, None, |g| g.state.lock().graph.len())
}

/// An operand as the lazy layer records it: a tensor's value, or a host
/// scalar of a dtype (recorded as a rank-0 constant). Implemented by the
/// layer above for its own operand type, so recording converts nothing.
pub(crate) trait LazyArg {
    /// The operand: a value, or `Err` with a scalar.
    fn operand(&self) -> std::result::Result<&Arc<TensorInner>, (Literal, DType)>;
}

impl LazyArg for &Arc<TensorInner> {
    fn operand(&self) -> std::result::Result<&Arc<TensorInner>, (Literal, DType)> {
        Ok(self)
    }
}

/// What an operand is from one graph's point of view.
enum Resolved {
    Node(NodeId, u64),
    /// A constant or `arange` pending in another thread graph (of another
    /// mesh), recorded again here rather than flushed there.
    Leaf(Op, Shape, DType),
    Buffer(Arc<DeviceBuffer>),
    Future(Arc<TensorInner>),
    Scalar(Literal, DType),
}

/// Records `op` on `inputs` (already validated: `shape`/`dtype` are its
/// inferred result) into this thread's graph for `device`.
pub(crate) fn record(
    device: &Device,
    mut op: Op,
    inputs: &[impl LazyArg],
    shape: &Shape,
    dtype: DType,
    origin: Origin,
) -> Result<Arc<TensorInner>> {
    let t_record = metrics::record_start();
    let _span = tracing::trace_span!("record", op = op.name()).entered();
    let fuse = crate::config::fusion_enabled();
    let eager_flush = !fuse && !matches!(op, Op::Constant { .. });
    let mesh = inputs
        .iter()
        .find_map(|a| a.operand().ok().and_then(|t| t.mesh()));
    // The op is borrowed into the closure (an `FnOnce`) and moved out inside
    // it: captured by value it made the closure too large to move without a
    // `memcpy` call. Moved out by `mem::replace`, a whole aligned copy:
    // `Option::take` copied it around its tag byte in unaligned pieces, and
    // the graph's wide reads of that copy could not be forwarded from them.
    // The new value and what to flush, written by the closure here rather
    // than returned through the thread-local's `Result` wrappers, which
    // moved them with wide loads of narrower stores (a stall per op).
    let mut out: Option<(Arc<TensorInner>, AfterRecord)> = None;
    with_thread_graph(device, mesh, |tg| -> Result<()> {
        // Filled in place: moving the ids through the fast path's return
        // values cost store-forwarding stalls on every op.
        let mut ids: SmallVec<[NodeId; 3]> = SmallVec::new();
        let g = operand_ids(tg, inputs, origin, &mut ids)?;
        let op = std::mem::replace(&mut op, Op::MatMul);
        out = Some(append(
            tg,
            g,
            op,
            &ids,
            (shape, dtype, origin),
            fuse,
            eager_flush,
        ));
        Ok(())
    })?;
    let (inner, flush) = out.expect("the closure recorded the op");
    metrics::record_end(t_record);
    if let Some((reason, tg)) = flush {
        tg.flush(reason);
    }
    Ok(inner)
}

/// The graph of `tg`, locked, with the nodes of `inputs` in it written to
/// `ids` (empty on entry): by the fast path when it applies
/// ([`quick_ids`]), else by resolving each operand (which may flush
/// another graph that holds one) and retrying if this graph was flushed
/// meanwhile.
#[inline(always)]
fn operand_ids<'g>(
    tg: &'g Arc<ThreadGraph>,
    inputs: &[impl LazyArg],
    origin: Origin,
    ids: &mut SmallVec<[NodeId; 3]>,
) -> Result<parking_lot::MutexGuard<'g, GraphState>> {
    {
        let mut g = tg.state.lock();
        if quick_ids(&mut g, inputs, origin, ids) {
            return Ok(g);
        }
    }
    loop {
        let mut resolved: SmallVec<[Resolved; 3]> = SmallVec::new();
        for a in inputs {
            resolved.push(match a.operand() {
                Ok(t) => resolve(t, tg)?,
                Err((l, d)) => Resolved::Scalar(l, d),
            });
        }
        let mut g = tg.state.lock();
        if resolved
            .iter()
            .any(|r| matches!(r, Resolved::Node(_, gen) if *gen != g.gen))
        {
            continue; // our graph was flushed meanwhile: inputs are materialised now
        }
        for r in resolved {
            ids.push(g.node_for(r, origin));
        }
        return Ok(g);
    }
}

/// What the caller of [`record`] flushes after it: the graph and why.
type AfterRecord = Option<(FlushReason, Arc<ThreadGraph>)>;

/// Appends `op` on nodes `ids` to the locked graph `g` of `tg` and makes
/// its tensor (the shared tail of both recording paths). Inlined, and the
/// shape borrowed until its two copies are made: moving these values
/// through calls cost store-forwarding stalls on every op.
///
/// The node's id is known before it is appended, so the value is taken
/// first. A locked instruction waits for every earlier store to drain:
/// taken after the append, `Arc::get_mut` and the owner's clone waited for
/// the node's stores (about 12 % of a scalar-operand op's recording time;
/// the lock is held throughout, so nothing sees the value before its node).
#[inline(always)]
fn append(
    tg: &Arc<ThreadGraph>,
    mut g: parking_lot::MutexGuard<'_, GraphState>,
    op: Op,
    ids: &[NodeId],
    (shape, dtype, origin): (&Shape, DType, Origin),
    fuse: bool,
    eager_flush: bool,
) -> (Arc<TensorInner>, AfterRecord) {
    let id = NodeId::new(g.graph.len());
    let gen = g.gen;
    // A recycled value when there is one (nothing else can hold it).
    let spare = g.spare.pop().and_then(|mut t| {
        Arc::get_mut(&mut t)?.reuse((shape, dtype), (&tg.handle, &tg.device), id, gen);
        Some(t)
    });
    let inner = spare.unwrap_or_else(|| {
        let state = TensorState::Pending {
            graph: tg.handle.clone(),
            node: id,
            gen,
        };
        Arc::new(TensorInner::new(shape.clone(), dtype, &tg.device, state))
    });
    let (idx, owner) = (id.index(), Some(inner.clone()));
    let pushed = g.graph.push_inferred(op, ids, shape, dtype, origin);
    debug_assert_eq!(pushed, id);
    // Nodes without a tensor (inputs, scalars) leave gaps, usually of one
    // (a scalar operand): filled by pushes, not `resize`'s out-of-line loop.
    while g.owners.len() < idx {
        g.owners.push(None);
    }
    if g.owners.len() == idx {
        g.owners.push(owner);
    } else {
        g.owners[idx] = owner;
    }
    g.fuse = fuse;
    g.recorded += 1;
    let cap = g.graph.len() >= crate::config::max_pending_ops();
    drop(g);
    let flush = if eager_flush {
        Some((FlushReason::Eager, tg.clone()))
    } else if cap {
        Some((FlushReason::GraphCap, tg.clone()))
    } else {
        None
    };
    (inner, flush)
}

/// Writes the operand nodes to `ids` when every tensor operand is pending
/// in this very generation of the graph or already on the device: the
/// common case. A value recorded in this generation, or on the device and
/// entered in it before, is known without locking it
/// (`TensorInner::node_in`). `false` (nothing written, nothing added)
/// sends the caller down the general path.
#[inline(always)]
fn quick_ids(
    g: &mut GraphState,
    inputs: &[impl LazyArg],
    origin: Origin,
    ids: &mut SmallVec<[NodeId; 3]>,
) -> bool {
    // Checked before anything is added, so the general path starts from
    // an untouched graph. A value on the device stays there (Ready is final).
    let quick = inputs.iter().all(|a| match a.operand() {
        Err(_) => true,
        Ok(t) => t.node_in(g.gen).is_some() || matches!(*t.state.lock(), TensorState::Ready(_)),
    });
    if !quick {
        return false;
    }
    for a in inputs {
        ids.push(match a.operand() {
            Err((l, d)) => g.scalar_node(l, d, origin),
            Ok(t) => {
                t.mark_used();
                // Recorded in this generation, or a value on the device
                // entered in it already (a weight every step uses).
                if let Some(n) = t.node_in(g.gen) {
                    n
                } else {
                    let st = t.state.lock();
                    let TensorState::Ready(b) = &*st else {
                        unreachable!("checked above");
                    };
                    let key = Arc::as_ptr(b) as usize;
                    let n = match g.leaves.get(&key) {
                        Some(&n) => n,
                        None => {
                            let (b, shape, dtype) = (b.clone(), b.shape.clone(), b.dtype);
                            drop(st);
                            g.leaf(key, shape, dtype, Input::Buffer(b), origin)
                        }
                    };
                    t.set_leaf(g.gen, n);
                    n
                }
            }
        });
    }
    true
}

/// What an input value is from `tg`'s point of view, flushing other
/// threads' graphs that hold it.
#[inline(always)]
fn resolve(t: &Arc<TensorInner>, tg: &Arc<ThreadGraph>) -> Result<Resolved> {
    t.mark_used();
    loop {
        let st = t.state.lock();
        match &*st {
            TensorState::Ready(b) => return Ok(Resolved::Buffer(b.clone())),
            TensorState::InFlight(_) => return Ok(Resolved::Future(t.clone())),
            TensorState::Failed(e) => return Err((**e).clone()),
            TensorState::Pending { graph, node, gen } => {
                if Arc::ptr_eq(graph, &tg.handle) {
                    let (node, gen) = (*node, *gen);
                    let r = Resolved::Node(node, gen);
                    drop(st);
                    if let Some(site) = t.take_retained() {
                        // Left out of an earlier flush, used after all: it is
                        // computed with this graph (a recompute).
                        tg.recomputed(site, node, gen);
                    }
                    return Ok(r);
                }
                let other = graph.graph();
                let (node, gen) = (*node, *gen);
                drop(st);
                let Some(other) = other else {
                    return Err(crate::Error::internal(
                        "an operand's graph no longer exists",
                    ));
                };
                let leaf = other
                    .as_any()
                    .downcast_ref::<ThreadGraph>()
                    .and_then(|g| g.creation_op(node, gen));
                if let Some(leaf) = leaf {
                    return Ok(leaf);
                }
                other.flush_for(FlushReason::CrossThread, std::slice::from_ref(t));
            }
        }
    }
}

impl Recorder for ThreadGraph {
    fn flush_for(&self, reason: FlushReason, need: &[Arc<TensorInner>]) -> Option<Arc<Latch>> {
        ThreadGraph::flush_for(self, reason, need)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl ThreadGraph {
    /// Keeps the values of a flushed generation that died unused and that
    /// nothing else holds (`dead`: its owner slots once the live values
    /// were taken) for recording to reuse; the others are dropped.
    pub(super) fn recycle(&self, dead: Vec<Option<Arc<TensorInner>>>) {
        let mut spare: Vec<Arc<TensorInner>> = dead
            .into_iter()
            .flatten()
            .filter_map(|mut t| {
                Arc::get_mut(&mut t)?.clear_extras();
                Some(t)
            })
            .collect();
        let mut g = self.state.lock();
        let room = MAX_SPARE.saturating_sub(g.spare.len());
        let extra = spare.split_off(room.min(spare.len()));
        g.spare.append(&mut spare);
        drop(g);
        drop(extra);
    }

    /// Node `node` (of generation `gen`) when it is a constant or an
    /// `arange`, which a graph of another mesh records again instead of
    /// flushing this one (`zeros_like` of a sharded parameter is recorded
    /// for the parameter's device, then used on its mesh).
    fn creation_op(&self, node: NodeId, gen: u64) -> Option<Resolved> {
        let g = self.state.lock();
        if g.gen != gen {
            return None;
        }
        let n = g.graph.node(node);
        matches!(n.op, Op::Constant { .. } | Op::Arange { .. })
            .then(|| Resolved::Leaf(n.op.clone(), n.shape.clone(), n.dtype))
    }
}

impl GraphState {
    #[inline(always)]
    fn node_for(&mut self, r: Resolved, origin: Origin) -> NodeId {
        let (key, (shape, dtype), input) = match r {
            Resolved::Node(n, _) => return n,
            Resolved::Leaf(op, shape, dtype) => {
                self.recorded += 1;
                return self.graph.push_inferred(op, &[], &shape, dtype, origin);
            }
            Resolved::Scalar(value, dtype) => return self.scalar_node(value, dtype, origin),
            Resolved::Buffer(b) => (
                Arc::as_ptr(&b) as usize,
                (b.shape.clone(), b.dtype),
                Input::Buffer(b),
            ),
            Resolved::Future(t) => (
                Arc::as_ptr(&t) as usize,
                (t.shape.clone(), t.dtype),
                Input::Future(t as Arc<dyn Slot>),
            ),
        };
        self.leaf(key, shape, dtype, input, origin)
    }

    /// A host scalar recorded as a rank-0 constant (inlined: the literal
    /// stays in registers instead of being reloaded from where the caller
    /// wrote it in parts).
    #[inline(always)]
    fn scalar_node(&mut self, value: Literal, dtype: DType, origin: Origin) -> NodeId {
        self.recorded += 1;
        self.graph.push_scalar(value, dtype, origin)
    }

    /// The input node of the outside value `input` (address `key`), added
    /// on first use.
    pub(super) fn leaf(
        &mut self,
        key: usize,
        shape: Shape,
        dtype: DType,
        input: Input,
        origin: Origin,
    ) -> NodeId {
        if let Some(&n) = self.leaves.get(&key) {
            return n;
        }
        let op = Op::Input {
            shape: shape.clone(),
            dtype,
        };
        let n = self.graph.push_inferred(op, &[], &shape, dtype, origin);
        self.leaves.insert(key, n);
        self.inputs.push((n, input));
        n
    }
}

#[cfg(test)]
#[path = "graph_tests.rs"]
mod tests;
