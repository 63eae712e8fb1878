//! Per-thread recording and flushing: the heart of lazy execution.
//!
//! Each thread records into its own graph per device (a [`Ctx`]), behind a
//! mutex so that another thread touching one of its pending tensors can flush
//! it. A flush hands the graph, with the tensors still alive, to the device's
//! executor (see [`crate::executor`]) and returns at once: the live tensors
//! become in-flight, the thread keeps recording (a later graph may read an
//! in-flight tensor: jobs run in submission order), and only reading a value
//! or an explicit wait blocks. Nodes nobody holds are never materialised.

use crate::executor::{Batch, Job};
use crate::metrics::{self, FlushReason, C};
use crate::runtime::DeviceBuffer;
use crate::tensor::{Arg, TState, Tensor, TensorInner};
use crate::{Device, Result};
use lazyfuse_ir::{Graph, NodeId, Op};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::panic::Location;
use std::sync::{Arc, Weak};

/// One thread's pending graph on one device.
pub(crate) struct Ctx {
    pub device: Device,
    state: Mutex<GraphState>,
}

#[derive(Default)]
struct GraphState {
    graph: Graph,
    /// Bumped at every flush; a pending tensor records the generation of its node.
    gen: u64,
    /// The tensor created for each node, if any (indexed by node index).
    owners: Vec<Weak<TensorInner>>,
    /// Values entering the graph from outside, deduplicated by address.
    leaves: std::collections::HashMap<usize, NodeId, std::hash::BuildHasherDefault<ahash::AHasher>>,
    leaf_bufs: Vec<(NodeId, Leaf)>,
    /// Fusion mode the pending ops were recorded under.
    fuse: bool,
}

thread_local! {
    static CTXS: RefCell<Vec<Arc<Ctx>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's context for `device`, created on first use.
fn thread_ctx(device: &Device) -> Arc<Ctx> {
    CTXS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(x) = c.iter().find(|x| x.device.same_device(device)) {
            return x.clone();
        }
        let ctx = Arc::new(Ctx {
            device: device.clone(),
            state: Mutex::new(GraphState::default()),
        });
        c.push(ctx.clone());
        ctx
    })
}

/// Flushes every graph this thread has pending (without waiting).
pub(crate) fn sync_thread(reason: FlushReason) -> Vec<Arc<Batch>> {
    let ctxs: Vec<Arc<Ctx>> = CTXS.with(|c| c.borrow().clone());
    ctxs.iter().filter_map(|c| c.flush(reason)).collect()
}

/// Number of nodes pending in this thread's graph for `device` (for tests and tools).
pub fn pending_ops(device: &Device) -> usize {
    thread_ctx(device).state.lock().graph.len()
}

enum Resolved {
    Node(NodeId, u64),
    Leaf(Leaf),
    Scalar(lazyfuse_ir::Literal, lazyfuse_ir::DType),
}

/// A graph input: a materialised buffer, or a tensor an earlier (already
/// submitted) flush is computing, read when this graph's job runs.
pub(crate) enum Leaf {
    Buffer(Arc<DeviceBuffer>),
    Future(Arc<TensorInner>),
}

/// Records `op` on `inputs` (already validated: `shape`/`dtype` are its
/// inferred result) into this thread's graph for `device`.
pub(crate) fn record(
    device: &Device,
    op: Op,
    inputs: &[Arg<'_>],
    shape: lazyfuse_ir::Shape,
    dtype: lazyfuse_ir::DType,
    origin: &'static Location<'static>,
) -> Result<Tensor> {
    let t_record = metrics::record_start();
    let _span = tracing::trace_span!("record", op = op.name()).entered();
    let ctx = thread_ctx(device);
    let fuse = crate::config::fusion_enabled();
    let eager_flush = !fuse && !matches!(op, Op::Constant { .. });
    loop {
        let mut resolved: SmallVec<[Resolved; 3]> = SmallVec::new();
        for a in inputs {
            resolved.push(match a {
                Arg::T(t) => resolve(t, &ctx)?,
                Arg::Scalar(l, d) => Resolved::Scalar(*l, *d),
            });
        }
        let mut g = ctx.state.lock();
        if resolved
            .iter()
            .any(|r| matches!(r, Resolved::Node(_, gen) if *gen != g.gen))
        {
            continue; // our graph was flushed meanwhile: inputs are materialised now
        }
        let mut ids: SmallVec<[NodeId; 3]> = SmallVec::new();
        for r in &resolved {
            ids.push(g.node_for(r, origin));
        }
        let id = g
            .graph
            .push_inferred(op, &ids, shape.clone(), dtype, origin);
        let inner = Arc::new(TensorInner {
            shape,
            dtype,
            device: device.clone(),
            state: Mutex::new(TState::Pending {
                ctx: ctx.clone(),
                node: id,
                gen: g.gen,
            }),
            autograd: Default::default(),
        });
        let idx = id.index();
        if g.owners.len() <= idx {
            g.owners.resize(idx + 1, Weak::new());
        }
        g.owners[idx] = Arc::downgrade(&inner);
        g.fuse = fuse;
        let cap = g.graph.len() >= crate::config::max_pending_ops();
        drop(g);
        metrics::add(&C.ops_recorded, 1);
        metrics::record_end(t_record);
        if eager_flush {
            ctx.flush(FlushReason::Eager);
        } else if cap {
            ctx.flush(FlushReason::GraphCap);
        }
        return Ok(Tensor(inner));
    }
}

/// What an input tensor is from `ctx`'s point of view, flushing other
/// threads' graphs that hold it.
fn resolve(t: &Tensor, ctx: &Arc<Ctx>) -> Result<Resolved> {
    loop {
        let st = t.0.state.lock();
        match &*st {
            TState::Ready(b) => return Ok(Resolved::Leaf(Leaf::Buffer(b.clone()))),
            TState::InFlight(_) => return Ok(Resolved::Leaf(Leaf::Future(t.0.clone()))),
            TState::Failed(e) => return Err(e.clone()),
            TState::Pending { ctx: c, node, gen } => {
                if Arc::ptr_eq(c, ctx) {
                    return Ok(Resolved::Node(*node, *gen));
                }
                let other = c.clone();
                drop(st);
                other.flush(FlushReason::CrossThread);
            }
        }
    }
}

impl GraphState {
    fn node_for(&mut self, r: &Resolved, origin: &'static Location<'static>) -> NodeId {
        match r {
            Resolved::Node(n, _) => *n,
            Resolved::Scalar(value, dtype) => {
                let shape = lazyfuse_ir::Shape::scalar();
                let op = Op::Constant {
                    value: *value,
                    shape: shape.clone(),
                    dtype: *dtype,
                };
                metrics::add(&C.ops_recorded, 1);
                self.graph.push_inferred(op, &[], shape, *dtype, origin)
            }
            Resolved::Leaf(leaf) => {
                let (key, shape, dtype) = match leaf {
                    Leaf::Buffer(b) => (Arc::as_ptr(b) as usize, &b.shape, b.dtype),
                    Leaf::Future(t) => (Arc::as_ptr(t) as usize, &t.shape, t.dtype),
                };
                if let Some(&n) = self.leaves.get(&key) {
                    return n;
                }
                let op = Op::Input {
                    shape: shape.clone(),
                    dtype,
                };
                let n = self
                    .graph
                    .push_inferred(op, &[], shape.clone(), dtype, origin);
                self.leaves.insert(key, n);
                self.leaf_bufs.push((
                    n,
                    match leaf {
                        Leaf::Buffer(b) => Leaf::Buffer(b.clone()),
                        Leaf::Future(t) => Leaf::Future(t.clone()),
                    },
                ));
                n
            }
        }
    }
}

impl Ctx {
    /// Hands everything pending in this graph to the executor and returns the
    /// batch that computes it (`None` when nothing was pending). Live tensors
    /// become in-flight before the graph's lock is released.
    pub(crate) fn flush(&self, reason: FlushReason) -> Option<Arc<Batch>> {
        let mut g = self.state.lock();
        if g.graph.is_empty() {
            return None;
        }
        metrics::flush(reason);
        let graph = std::mem::take(&mut g.graph);
        let owners = std::mem::take(&mut g.owners);
        let leaves = std::mem::take(&mut g.leaf_bufs);
        g.leaves.clear();
        g.gen += 1;
        let live: Vec<(NodeId, Arc<TensorInner>)> = owners
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.upgrade().map(|t| (NodeId::new(i), t)))
            .collect();
        let batch = Arc::new(Batch::default());
        let job = Job {
            device: self.device.clone(),
            graph,
            live,
            leaves,
            fuse: g.fuse,
            batch: batch.clone(),
            reason,
        };
        self.device.rt.executor().submit(job);
        // `g` stays locked until the live tensors are marked in-flight.
        drop(g);
        Some(batch)
    }
}
