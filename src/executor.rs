//! The executor: one worker thread per device runtime that runs flushed
//! graphs in submission order. For each job it plans the graph (fusion crate),
//! compiles or fetches each region (runtime cache), launches every region,
//! waits for them, and binds results to the tensors still alive. Submission
//! order is what lets a later graph read a tensor an earlier job computes.
//!
//! With `TPU_LAUNCH_BLOCKING=1` a job runs on the flushing thread instead,
//! so errors surface at the op that caused them.

use crate::context::Leaf;
use crate::metrics::{self, FlushReason, C};
use crate::runtime::DeviceBuffer;
use crate::tensor::{TState, TensorInner};
use crate::{Device, Error, Result};
use lazyfuse_fusion::{plan_with_donation, PlanOptions, Region};
use lazyfuse_ir::{Graph, NodeId, Op};
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Completion of one flushed graph: readers of its tensors wait on it.
#[derive(Default)]
pub(crate) struct Batch {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Batch {
    /// Blocks until the job has bound its tensors.
    pub(crate) fn wait(&self) {
        let mut d = self.done.lock();
        while !*d {
            self.cv.wait(&mut d);
        }
    }

    fn finish(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }
}

/// A flushed graph with everything needed to run it.
pub(crate) struct Job {
    pub device: Device,
    pub graph: Graph,
    /// Nodes that live tensors hold, with those tensors.
    pub live: Vec<(NodeId, Arc<TensorInner>)>,
    pub leaves: Vec<(NodeId, Leaf)>,
    pub fuse: bool,
    pub batch: Arc<Batch>,
    pub reason: FlushReason,
}

/// The per-runtime job queue and its worker.
#[derive(Default)]
pub(crate) struct Executor {
    queue: Mutex<Queue>,
    cv: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs submitted and not yet finished (queued or running).
    outstanding: usize,
    worker_started: bool,
}

impl Executor {
    /// Marks the job's live tensors in-flight and queues it (or runs it here
    /// with launch blocking). Both happen under the queue lock, so a graph
    /// that observes one of these tensors in flight is queued after it.
    pub(crate) fn submit(self: &Arc<Self>, job: Job) {
        for (_, t) in &job.live {
            *t.state.lock() = TState::InFlight(job.batch.clone());
        }
        if crate::config::launch_blocking() {
            run_job(job);
            return;
        }
        let mut q = self.queue.lock();
        q.jobs.push_back(job);
        q.outstanding += 1;
        if !q.worker_started {
            q.worker_started = true;
            let me = self.clone();
            std::thread::Builder::new()
                .name("lazyfuse-executor".into())
                .spawn(move || me.work())
                .expect("spawning the lazyfuse executor thread");
        }
        self.cv.notify_all();
    }

    fn work(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    self.cv.wait(&mut q);
                }
            };
            run_job(job);
            let mut q = self.queue.lock();
            q.outstanding -= 1;
            self.cv.notify_all();
        }
    }

    /// Waits (at most `timeout`) until every submitted job has finished.
    pub(crate) fn drain(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = self.queue.lock();
        while q.outstanding > 0 {
            if self.cv.wait_until(&mut q, deadline).timed_out() {
                return;
            }
        }
    }
}

/// Runs one job and always finishes its batch, even if running it panics
/// (a bug): its tensors then fail instead of hanging their readers.
fn run_job(job: Job) {
    let Job {
        device,
        graph,
        live,
        leaves,
        fuse,
        batch,
        reason,
    } = job;
    let _span =
        tracing::debug_span!("flush", reason = reason.name(), nodes = graph.len()).entered();
    // Weak: the job must not keep its results alive past binding them.
    let live_for_panic: Vec<std::sync::Weak<TensorInner>> =
        live.iter().map(|(_, t)| Arc::downgrade(t)).collect();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        execute_graph(&device, &graph, live, leaves, fuse)
    }));
    if r.is_err() {
        for t in live_for_panic.iter().filter_map(|w| w.upgrade()) {
            let mut st = t.state.lock();
            if matches!(*st, TState::InFlight(_)) {
                *st = TState::Failed(Error::Pjrt(
                    "internal error while running a flushed graph".into(),
                ));
            }
        }
    }
    // Everything the job held is released before its readers wake up, so
    // they observe the final buffer accounting.
    drop(graph);
    drop(_span);
    batch.finish();
}

fn execute_graph(
    device: &Device,
    graph: &Graph,
    live: Vec<(NodeId, Arc<TensorInner>)>,
    leaves: Vec<(NodeId, Leaf)>,
    fuse: bool,
) {
    // Futures were computed by earlier jobs (submission order): read them.
    let mut leaf_bufs: Vec<(NodeId, Arc<DeviceBuffer>)> = Vec::with_capacity(leaves.len());
    let mut leaf_failures: Vec<(NodeId, Error)> = Vec::new();
    for (n, leaf) in leaves {
        match leaf {
            Leaf::Buffer(b) => leaf_bufs.push((n, b)),
            Leaf::Future(t) => loop {
                let st = t.state.lock();
                match &*st {
                    TState::Ready(b) => leaf_bufs.push((n, b.clone())),
                    TState::Failed(e) => leaf_failures.push((n, e.clone())),
                    // Only with launch blocking, where jobs run on their
                    // flushing threads: the producer started earlier on
                    // another thread and never waits for us.
                    TState::InFlight(batch) => {
                        let batch = batch.clone();
                        drop(st);
                        batch.wait();
                        continue;
                    }
                    TState::Pending { .. } => leaf_failures.push((
                        n,
                        Error::Pjrt("internal: input computed out of order".into()),
                    )),
                }
                break;
            },
        }
    }
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
    for (n, e) in leaf_failures {
        failed[n.index()] = Some(e);
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
