//! The executor: one worker thread per device client that runs flushed
//! graphs in submission order. For each job it plans the graph (fusion
//! crate), compiles or fetches each region (runtime cache), launches every
//! region, waits for them, and binds the results. Submission order is what
//! lets a later graph read a value an earlier job computes.
//!
//! The executor never names a tensor. It defines the seam it needs:
//! - [`Slot`]: a value a job computes: marked in flight when the job is
//!   queued, bound to a buffer (or an error) when it finishes, and read by
//!   later jobs;
//! - [`Latch`]: the completion of one job, which readers wait on.
//!
//! The lazy layer implements [`Slot`] for its tensor state.
//!
//! With `LAZYFUSE_LAUNCH_BLOCKING=1` a job runs on the flushing thread instead,
//! so errors surface at the op that caused them.

use crate::metrics::{self, FlushReason, COUNTERS as C};
use crate::runtime::{DeviceBuffer, Runtime};
use crate::{Error, Result};
use lazyfuse_fusion::{Plan, PlanCache, PlanOptions, Region};
use lazyfuse_ir::{Graph, NodeId, Op};
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub(crate) mod notes;
mod seam;
mod values;
pub(crate) use seam::{Input, Latch, Slot};
use values::Values;

/// A flushed graph with everything needed to run it.
pub(crate) struct Job {
    /// The client the graph runs on.
    pub rt: Arc<Runtime>,
    /// The device of that client.
    pub ordinal: usize,
    /// The recorded graph.
    pub graph: Graph,
    /// Nodes whose values are wanted, with where to bind them. Weak: a job
    /// never keeps a value alive (when a tensor dies is the program's
    /// business, and output prediction relies on it); a value nobody holds
    /// any more by the time its job ends is computed and dropped. The
    /// executor holds each one strongly only for the moment it binds it,
    /// before the job finishes ([`Executor::wait_earlier`] waits that out).
    pub outputs: Vec<(NodeId, Weak<dyn Slot>)>,
    /// Values entering the graph from outside.
    pub inputs: Vec<(NodeId, Input)>,
    /// The inputs whose buffers die with this job (donated, or freed before
    /// its regions run when none reads them), when the flush decided it:
    /// only this job held them then (see [`Executor::wait_earlier`]). With
    /// `None`, those the job alone holds when it reads them (graphs without
    /// fusion, which donate nothing).
    pub dying: Option<Vec<NodeId>>,
    /// Fusion mode the graph was recorded under.
    pub fuse: bool,
    /// Why it was flushed (for the trace).
    pub reason: FlushReason,
    /// What the flush left out and recomputes, when the flush log or
    /// `explain` wants it ([`notes::wanted`]).
    pub notes: Option<Box<notes::OutputNotes>>,
}

/// The per-client job queue and its worker.
#[derive(Default)]
pub(crate) struct Executor {
    queue: Mutex<Queue>,
    cv: Condvar,
    /// Plans of recent flushes, replayed when a graph's structure repeats
    /// (only the worker, or a blocking launch, plans: never contended).
    plans: Mutex<PlanCache>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Queued>,
    /// Sequence numbers of the jobs submitted and not yet finished (queued
    /// or running), in submission order. A job run on its submitter's
    /// thread may finish after a later one the worker ran.
    unfinished: VecDeque<u64>,
    /// The sequence number of the next job submitted.
    next: u64,
    worker_started: bool,
}

/// A submitted job, its latch and its place in submission order.
pub(crate) struct Queued {
    job: Job,
    latch: Arc<Latch>,
    seq: u64,
}

/// Executors that must drain before the process exits.
static LIVE: Mutex<Vec<Weak<Executor>>> = Mutex::new(Vec::new());

fn drain_all() {
    let live: Vec<Arc<Executor>> = LIVE.lock().iter().filter_map(Weak::upgrade).collect();
    for e in live {
        e.drain(Duration::from_secs(30));
    }
}

impl Executor {
    /// A new executor, drained at process exit (work still in flight would
    /// race the plugin's own teardown).
    pub(crate) fn new() -> Arc<Executor> {
        let e = Arc::new(Executor::default());
        LIVE.lock().push(Arc::downgrade(&e));
        crate::exit::on_exit(crate::exit::Stage::Drain, drain_all);
        e
    }

    /// Marks the job's outputs in flight and queues it, both under the queue
    /// lock (or, with launch blocking, marks and runs it here). Returns the
    /// latch its readers wait on, and the job when the submitter is to run
    /// it itself: a flush its caller waits for at once, with nothing queued
    /// or running (see [`crate::config::inline_waits`]). The submitter then
    /// releases its graph and calls [`Executor::run_here`]; the job counts
    /// as outstanding until then, so a job queued meanwhile by another
    /// thread that reads its outputs waits for their latch.
    pub(crate) fn submit(self: &Arc<Self>, job: Job) -> (Arc<Latch>, Option<Queued>) {
        let latch = Arc::new(Latch::default());
        let start = |job: &Job| {
            for s in job.outputs.iter().filter_map(|(_, s)| s.upgrade()) {
                s.start(&latch);
            }
        };
        if crate::config::launch_blocking() {
            start(&job);
            run_job(job, &latch, &self.plans);
            return (latch, None);
        }
        let mut q = self.queue.lock();
        start(&job);
        let seq = q.next;
        q.next += 1;
        q.unfinished.push_back(seq);
        let waited = matches!(job.reason, FlushReason::Read | FlushReason::Realize);
        let queued = Queued {
            job,
            latch: latch.clone(),
            seq,
        };
        if waited && q.unfinished.len() == 1 && crate::config::inline_waits() {
            metrics::add(&C.flushes_inline, 1);
            return (latch, Some(queued));
        }
        q.jobs.push_back(queued);
        if !q.worker_started {
            q.worker_started = true;
            let me = self.clone();
            std::thread::Builder::new()
                .name("lazyfuse-executor".into())
                .spawn(move || me.work())
                .expect("spawning the lazyfuse executor thread");
        }
        self.cv.notify_all();
        (latch, None)
    }

    /// Runs a job that [`Executor::submit`] handed back, on this thread.
    pub(crate) fn run_here(&self, queued: Queued) {
        run_job(queued.job, &queued.latch, &self.plans);
        self.finished(queued.seq);
    }

    /// Counts job `seq` as done and wakes whoever waits for it.
    fn finished(&self, seq: u64) {
        let mut q = self.queue.lock();
        if let Some(i) = q.unfinished.iter().position(|&s| s == seq) {
            q.unfinished.remove(i);
        }
        self.cv.notify_all();
    }

    fn work(&self) {
        loop {
            let queued = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    self.cv.wait(&mut q);
                }
            };
            run_job(queued.job, &queued.latch, &self.plans);
            self.finished(queued.seq);
        }
    }

    /// Waits until every job submitted before this call has finished (jobs
    /// other threads submit meanwhile are not waited for). A flush of a
    /// fused graph, or one that predicts outputs, calls this before
    /// deciding which of its inputs die with it and which watched tensors
    /// the program dropped: a finished job holds none of them (not even
    /// the output it was binding), so the counts are the program's alone,
    /// and the decisions (which change what the regions donate and write,
    /// and so their keys) are the same however far the worker had got. The
    /// flush's own job still runs asynchronously: recording overlaps one
    /// job at a time.
    pub(crate) fn wait_earlier(&self) {
        let mut q = self.queue.lock();
        let before = q.next;
        while q.unfinished.front().is_some_and(|&s| s < before) {
            self.cv.wait(&mut q);
        }
    }

    /// Waits (at most `timeout`) until every submitted job has finished.
    pub(crate) fn drain(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = self.queue.lock();
        while !q.unfinished.is_empty() {
            if self.cv.wait_until(&mut q, deadline).timed_out() {
                return;
            }
        }
    }
}

/// Runs one job and always opens its latch, even if running it panics
/// (a bug): its values then fail instead of hanging their readers.
fn run_job(mut job: Job, latch: &Latch, plans: &Mutex<PlanCache>) {
    let _span = tracing::debug_span!("flush", reason = job.reason.name(), nodes = job.graph.len())
        .entered();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let values = execute_graph(&mut job, plans);
        bind_outputs(&job.outputs, &values);
    }));
    if r.is_err() {
        for s in job.outputs.iter().filter_map(|(_, s)| s.upgrade()) {
            s.bind(Err(Error::internal("panic while running a flushed graph")));
        }
    }
    // Everything the job held is released before its readers wake up, so
    // they observe the final buffer accounting.
    drop(job);
    drop(_span);
    latch.open();
}

/// Steps 1 to 4 of a job: its inputs read, its plan, its regions launched
/// and awaited. Returns the values computed.
fn execute_graph(job: &mut Job, plans: &Mutex<PlanCache>) -> Values {
    let (rt, ordinal, graph, fuse) = (&*job.rt, job.ordinal, &job.graph, job.fuse);
    rt.begin_flush();
    let mut values = Values::new(graph.len());
    let dying_now = values.read_inputs(std::mem::take(&mut job.inputs));
    let dying = job.dying.take().unwrap_or(dying_now);
    let wanted: Vec<NodeId> = job.outputs.iter().map(|(n, _)| *n).collect();
    let plan = plan_graph(graph, &wanted, &dying, fuse, plans);
    notes::log(graph, &plan, job.notes.as_deref());
    values.release_unread(&plan, &wanted, &dying);
    values.upload_constants(rt, ordinal, graph, &plan);
    let launched = launch_regions(rt, ordinal, graph, &plan, &mut values);
    await_regions(rt, graph, launched, &mut values);
    values
}

/// The planner's options for a flush recorded with fusion `fuse` (also
/// what a dry run plans with: `lazyfuse::plan_of`).
pub(crate) fn plan_options(fuse: bool) -> PlanOptions {
    let defaults = PlanOptions::default();
    PlanOptions {
        fuse,
        repeat: lazyfuse_fusion::RepeatOptions {
            max_chained: crate::config::layers_per_region(),
            ..defaults.repeat.clone()
        },
        ..defaults
    }
}

/// Step 2: cuts the graph into regions, or replays the plan of an earlier
/// flush with the same structure, wanted values and dying inputs.
fn plan_graph(
    graph: &Graph,
    wanted: &[NodeId],
    dying: &[NodeId],
    fuse: bool,
    plans: &Mutex<PlanCache>,
) -> Arc<Plan> {
    let opts = plan_options(fuse);
    let t_plan = std::time::Instant::now();
    let (plan, reused) = tracing::debug_span!("plan", nodes = graph.len())
        .in_scope(|| plans.lock().plan(graph, wanted, dying, &opts));
    if reused {
        metrics::add(&C.plans_reused, 1);
    }
    metrics::observe_since(metrics::Phase::Plan, t_plan);
    metrics::observe(metrics::Phase::RegionsPerFlush, plan.regions.len() as u64);
    plan
}

/// Step 3: launches every region without waiting (the device orders them
/// through their buffers); returns the launches still to be awaited.
fn launch_regions<'p>(
    rt: &Runtime,
    ordinal: usize,
    graph: &Graph,
    plan: &'p Plan,
    values: &mut Values,
) -> Vec<(&'p Region, crate::backend::Completion)> {
    let mut launched = Vec::with_capacity(plan.regions.len());
    for region in &plan.regions {
        match run_region(rt, ordinal, graph, region, values) {
            Ok((outs, done)) => {
                metrics::add(&C.region_outputs, region.outputs.len() as u64);
                for (o, b) in region.outputs.iter().zip(outs) {
                    values.bufs[o.index()] = Some(b);
                }
                if let Some(done) = done {
                    launched.push((region, done));
                }
            }
            Err(e) => values.fail_region(region, e),
        }
    }
    launched
}

/// Step 4: waits once per launched region while `values` keeps every
/// argument alive; a failed execution poisons that region's outputs.
fn await_regions(
    rt: &Runtime,
    graph: &Graph,
    launched: Vec<(&Region, crate::backend::Completion)>,
    values: &mut Values,
) {
    for (region, done) in launched {
        if let Err(e) = rt.wait(done) {
            let e = region_error(graph, region, "execution", e.message());
            values.fail_region(region, e);
        }
    }
}

/// Step 5: hands each output still held by the program its value. The only
/// strong handles the executor takes to them, one at a time.
fn bind_outputs(outputs: &[(NodeId, Weak<dyn Slot>)], values: &Values) {
    for (id, slot) in outputs {
        let Some(slot) = slot.upgrade() else { continue };
        slot.bind(match values.get(*id) {
            Some(r) => r.cloned(),
            None => Err(Error::internal(format!(
                "node {} was not computed by the plan",
                id.index()
            ))),
        });
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
    rt: &Runtime,
    ordinal: usize,
    graph: &Graph,
    region: &Region,
    values: &Values,
) -> Result<(Vec<Arc<DeviceBuffer>>, Option<crate::backend::Completion>)> {
    let _span =
        tracing::debug_span!("region", key = %region.key, nodes = region.nodes.len()).entered();
    // Buffer parameters in order, then one buffer per scalar pack (the
    // lifted scalars' values are read from this graph: a replayed plan and
    // a cached executable serve every value).
    let packs = region.scalar_packs();
    let mut packed: SmallVec<[Arc<DeviceBuffer>; 2]> = SmallVec::new();
    for pack in packs {
        let mut values: SmallVec<[lazyfuse_ir::Literal; 8]> = SmallVec::new();
        for &k in &pack.params {
            match graph.node(region.params[k]).op {
                Op::Constant { value, .. } => values.push(value),
                _ => return Err(Error::internal("a lifted parameter is not a constant")),
            }
        }
        packed.push(rt.scalar_pack(&values, pack.dtype, ordinal)?);
    }
    let mut args: SmallVec<[&DeviceBuffer; 8]> = SmallVec::new();
    for (k, &p) in region.params.iter().enumerate() {
        if region.is_lifted(k) {
            continue;
        }
        match values.get(p) {
            Some(r) => args.push(r?),
            None => {
                return Err(Error::internal(format!(
                    "parameter {} has no value",
                    p.index()
                )))
            }
        }
    }
    args.extend(packed.iter().map(|b| &**b));
    let describe = |stage: &'static str, e: Error| region_error(graph, region, stage, e.message());
    if let Some(mesh) = args
        .iter()
        .find_map(|b| b.sharding())
        .map(|s| s.mesh().clone())
    {
        return run_spmd_region(rt, graph, region, &args, &mesh);
    }
    let exe = rt
        .compile_or_fetch(graph, region, || crate::explain::on_compile(graph, region))
        .map_err(|e| describe("compile", e))?;
    crate::testing::execution_fault(graph, region)
        .map_err(|m| describe("execution", Error::Pjrt(m)))?;
    let outs = output_types(graph, region);
    let donate: SmallVec<[usize; 4]> = region
        .aliases
        .iter()
        .map(|&(k, _)| region.arg_of(k))
        .collect();
    rt.launch(&exe, &args, &donate, ordinal, &outs)
        .map_err(|e| describe("execution", e))
}

/// Compiles (or fetches) and launches a region with a sharded argument as
/// one SPMD program over `mesh` (`args` in launch order: buffer
/// parameters, then scalar packs). One-device arguments take part as
/// replicated; results are sharded as propagation says.
fn run_spmd_region(
    rt: &Runtime,
    graph: &Graph,
    region: &Region,
    args: &[&DeviceBuffer],
    mesh: &crate::spmd::Mesh,
) -> Result<(Vec<Arc<DeviceBuffer>>, Option<crate::backend::Completion>)> {
    use crate::spmd::{Sharding, SpmdLayout};
    let mut buffers = args.iter();
    let params: Vec<Sharding> = region
        .params
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let rank = graph.node(p).shape.rank();
            if region.is_lifted(k) {
                return Sharding::replicated(mesh, rank);
            }
            match buffers.next().and_then(|b| b.sharding()) {
                Some(s) => s.clone(),
                None => Sharding::replicated(mesh, rank),
            }
        })
        .collect();
    let mut layout = SpmdLayout::new(graph, region, mesh, params);
    // Buffer parameter `k`'s argument, when it is one (lifted scalars
    // are packed after the buffers).
    let arg = |k: usize| (!region.is_lifted(k)).then(|| args[region.arg_of(k)]);
    layout.donate(region, |k| {
        arg(k).is_some_and(|b| b.sharding().is_some_and(|s| s.mesh() == mesh))
    });
    let donate: Vec<usize> = layout
        .aliases
        .iter()
        .map(|&(k, _)| region.arg_of(k))
        .collect();
    let describe = |stage: &'static str, e: Error| region_error(graph, region, stage, e.message());
    let exe = rt
        .compile_or_fetch_spmd(graph, region, &layout, || {
            crate::explain::on_compile(graph, region)
        })
        .map_err(|e| describe("compile", e))?;
    let outs = output_types(graph, region);
    rt.launch_spmd(&exe, args, &layout, &donate, &outs)
        .map_err(|e| match e {
            e @ Error::Pjrt(_) => e,
            e => describe("execution", e),
        })
}

/// The shape and dtype of each of `region`'s results.
fn output_types(graph: &Graph, region: &Region) -> Vec<(lazyfuse_ir::Shape, lazyfuse_ir::DType)> {
    region
        .outputs
        .iter()
        .map(|&o| {
            let n = graph.node(o);
            (n.shape.clone(), n.dtype)
        })
        .collect()
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
