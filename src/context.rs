//! Per-thread recording and flushing: the heart of lazy execution.
//!
//! Each thread records into its own graph per device (a [`Ctx`]), behind a
//! mutex so that another thread touching one of its pending tensors can flush
//! it. A flush plans the graph (fusion crate), compiles or fetches each region
//! (runtime cache), runs it, and binds results to the tensors still alive:
//! nodes nobody holds are never materialised. The flush keeps the graph's lock
//! while it runs, so anyone waiting on one of its tensors sees it finished.

use crate::metrics::{self, FlushReason, C};
use crate::runtime::DeviceBuffer;
use crate::tensor::{Arg, TState, Tensor, TensorInner};
use crate::{Device, Error, Result};
use lazyfuse_fusion::{plan_with_donation, PlanOptions, Region};
use lazyfuse_ir::{Graph, NodeId, Op};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::HashMap;
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
    /// Materialised buffers entering the graph, deduplicated by address.
    leaves: HashMap<usize, NodeId>,
    leaf_bufs: Vec<(NodeId, Arc<DeviceBuffer>)>,
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

/// Flushes every graph this thread has pending.
pub(crate) fn sync_thread(reason: FlushReason) {
    let ctxs: Vec<Arc<Ctx>> = CTXS.with(|c| c.borrow().clone());
    for c in ctxs {
        c.flush(reason);
    }
}

/// Number of nodes pending in this thread's graph for `device` (for tests and tools).
pub fn pending_ops(device: &Device) -> usize {
    thread_ctx(device).state.lock().graph.len()
}

enum Resolved {
    Node(NodeId, u64),
    Leaf(Arc<DeviceBuffer>),
    Scalar(lazyfuse_ir::Literal, lazyfuse_ir::DType),
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
        let ids: SmallVec<[NodeId; 3]> = resolved.iter().map(|r| g.node_for(r, origin)).collect();
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
            TState::Ready(b) => return Ok(Resolved::Leaf(b.clone())),
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
            Resolved::Leaf(b) => {
                let key = Arc::as_ptr(b) as usize;
                if let Some(&n) = self.leaves.get(&key) {
                    return n;
                }
                let op = Op::Input {
                    shape: b.shape.clone(),
                    dtype: b.dtype,
                };
                let n = self
                    .graph
                    .push_inferred(op, &[], b.shape.clone(), b.dtype, origin);
                self.leaves.insert(key, n);
                self.leaf_bufs.push((n, b.clone()));
                n
            }
        }
    }
}

impl Ctx {
    /// Runs everything pending in this graph and binds live tensors.
    pub(crate) fn flush(&self, reason: FlushReason) {
        let mut g = self.state.lock();
        if g.graph.is_empty() {
            return;
        }
        metrics::flush(reason);
        let graph = std::mem::take(&mut g.graph);
        let owners = std::mem::take(&mut g.owners);
        let leaf_bufs = std::mem::take(&mut g.leaf_bufs);
        g.leaves.clear();
        g.gen += 1;
        let fuse = g.fuse;
        let _span =
            tracing::debug_span!("flush", reason = reason.name(), nodes = graph.len()).entered();
        execute_graph(&self.device, &graph, owners, leaf_bufs, fuse);
        // `g` stays locked until results are bound.
        drop(g);
    }
}

fn execute_graph(
    device: &Device,
    graph: &Graph,
    owners: Vec<Weak<TensorInner>>,
    leaf_bufs: Vec<(NodeId, Arc<DeviceBuffer>)>,
    fuse: bool,
) {
    let live: Vec<(NodeId, Arc<TensorInner>)> = owners
        .iter()
        .enumerate()
        .filter_map(|(i, w)| w.upgrade().map(|t| (NodeId::new(i), t)))
        .collect();
    let live_ids: Vec<NodeId> = live.iter().map(|(n, _)| *n).collect();
    let opts = PlanOptions {
        fuse,
        ..PlanOptions::default()
    };
    // A leaf whose buffer only this flush holds dies here: donate it.
    let dying: Vec<NodeId> = leaf_bufs
        .iter()
        .filter(|(_, b)| Arc::strong_count(b) == 1)
        .map(|(n, _)| *n)
        .collect();
    let t_plan = std::time::Instant::now();
    let plan = tracing::debug_span!("plan", nodes = graph.len())
        .in_scope(|| plan_with_donation(graph, &live_ids, &dying, &opts));
    metrics::observe_since(metrics::Phase::Plan, t_plan);
    metrics::observe(metrics::Phase::RegionsPerFlush, plan.regions.len() as u64);
    crate::dump::flush_log(graph, &plan);
    let mut values: Vec<Option<Arc<DeviceBuffer>>> = vec![None; graph.len()];
    let mut failed: Vec<Option<Error>> = vec![None; graph.len()];
    for (n, b) in leaf_bufs {
        values[n.index()] = Some(b);
    }
    // Launch every region without waiting (the device orders them through
    // their buffers), then wait once per region while `values` keeps every
    // argument alive.
    let mut launched = Vec::with_capacity(plan.regions.len());
    for region in &plan.regions {
        match run_region(device, graph, region, &values, &failed) {
            Ok((outs, done)) => {
                for (o, b) in region.outputs.iter().zip(outs) {
                    values[o.index()] = Some(b);
                }
                if let Some(done) = done {
                    launched.push((region, done));
                }
            }
            Err(e) => fail_region(region, e, &mut failed),
        }
    }
    for (region, done) in launched {
        if let Err(m) = device.rt.wait(done) {
            let e = region_error(graph, region, "execution", m);
            for o in &region.outputs {
                values[o.index()] = None;
            }
            fail_region(region, e, &mut failed);
        }
    }
    for (id, t) in live {
        let new = match (&values[id.index()], &failed[id.index()]) {
            (Some(b), _) => TState::Ready(b.clone()),
            (None, Some(e)) => TState::Failed(e.clone()),
            (None, None) => TState::Failed(Error::Pjrt(format!(
                "internal: node {} was not computed by the plan",
                id.index()
            ))),
        };
        *t.state.lock() = new;
    }
}

fn fail_region(region: &Region, e: Error, failed: &mut [Option<Error>]) {
    metrics::add(&C.region_failures, 1);
    tracing::error!(region = %region.key, "{e}");
    for o in &region.outputs {
        failed[o.index()] = Some(e.clone());
    }
}

fn region_error(graph: &Graph, region: &Region, stage: &'static str, message: String) -> Error {
    Error::Xla {
        stage,
        region: region.key.to_string(),
        ops: describe_ops(graph, region),
        message,
    }
}

/// Compiles (or fetches) and launches one region.
fn run_region(
    device: &Device,
    graph: &Graph,
    region: &Region,
    values: &[Option<Arc<DeviceBuffer>>],
    failed: &[Option<Error>],
) -> Result<(Vec<Arc<DeviceBuffer>>, Option<crate::pjrt::Completion>)> {
    let rt = &device.rt;
    let _span =
        tracing::debug_span!("region", key = %region.key, nodes = region.nodes.len()).entered();
    let mut lifted: SmallVec<[Arc<DeviceBuffer>; 4]> = SmallVec::new();
    for p in &region.params {
        if values[p.index()].is_none() && failed[p.index()].is_none() {
            // A lifted host scalar: a parameter, so its value is not in the key.
            if let Op::Constant { value, dtype, .. } = graph.node(*p).op {
                lifted.push(rt.scalar(value, dtype, device.ordinal)?);
            }
        }
    }
    let mut lifted_iter = lifted.iter();
    let mut args: SmallVec<[&DeviceBuffer; 8]> = SmallVec::new();
    for p in &region.params {
        match (&values[p.index()], &failed[p.index()]) {
            (Some(b), _) => args.push(b),
            (None, Some(e)) => return Err(e.clone()),
            (None, None) => match lifted_iter.next() {
                Some(b) => args.push(b),
                None => {
                    return Err(Error::Pjrt(format!(
                        "internal: parameter {} has no value",
                        p.index()
                    )))
                }
            },
        }
    }
    let describe =
        |stage: &'static str, message: String| region_error(graph, region, stage, message);
    let exe = rt
        .executable(
            region.key,
            || crate::lower::lower_region(graph, region),
            || crate::explain::on_compile(graph, region),
        )
        .map_err(|m| describe("compile", m))?;
    crate::testing::execution_fault(graph, region).map_err(|m| describe("execution", m))?;
    let outs: Vec<_> = region
        .outputs
        .iter()
        .map(|&o| {
            let n = graph.node(o);
            (n.shape.clone(), n.dtype)
        })
        .collect();
    let donate: SmallVec<[usize; 4]> = region.aliases.iter().map(|&(k, _)| k).collect();
    rt.launch(&exe, &args, &donate, device.ordinal, &outs)
        .map_err(|m| describe("execution", m))
}

/// `op @ file:line` for the region's ops (at most 8, then a count).
fn describe_ops(graph: &Graph, region: &Region) -> String {
    let mut parts: Vec<String> = region
        .nodes
        .iter()
        .filter(|&&n| !matches!(graph.node(n).op, Op::Constant { .. }))
        .take(8)
        .map(|&n| {
            let node = graph.node(n);
            format!(
                "{} @ {}:{}",
                node.op.name(),
                node.origin.file(),
                node.origin.line()
            )
        })
        .collect();
    if region.nodes.len() > 8 {
        parts.push(format!("... {} ops in all", region.nodes.len()));
    }
    parts.join(", ")
}
