//! Flushing a thread graph: choosing the outputs, keeping what is left out
//! pending, and handing the rest to the executor.
//!
//! Outputs are what the sync point needs (the tensor read or realized, the
//! tensors an optimizer step declares, every live tensor for `sync()`), plus
//! the live tensors [`Predictor`] expects the program to use. A live tensor
//! left out stays pending: its backward slice is copied into the graph's
//! next generation, where the values this flush computes become inputs
//! (read when the later job runs) and the graph inputs it reads stay held,
//! so nothing it needs is donated or freed. If the program reads or uses it
//! after all, it is computed then (a recompute, counted in the metrics); if
//! it dies, the next flush prunes it and it never runs.

use super::graph::{GraphState, ThreadGraph};
use super::predict::{dynamic_site_of, site_of, Site};
use super::value::{TensorInner, TensorState};
use crate::executor::notes::{self, OutputNotes};
use crate::executor::{Input, Job, Latch, Slot};
use crate::metrics::{self, FlushReason, COUNTERS as C};
use lazyfuse_ir::{Graph, NodeId};
use smallvec::SmallVec;
use std::sync::{Arc, Weak};

/// A live tensor of the flushed graph and its node.
type Live = (NodeId, Arc<TensorInner>);

/// Starts the graph's next generation and returns the flushed one: its
/// graph, the tensor of each node, its inputs and its generation. The next
/// generation starts with this one's room: a loop records graphs of one
/// size, so its recording never regrows them.
#[allow(clippy::type_complexity)]
fn take_generation(
    g: &mut GraphState,
) -> (
    Graph,
    Vec<Option<Arc<TensorInner>>>,
    Vec<(NodeId, Input)>,
    u64,
) {
    let (n, m) = (g.graph.len(), g.inputs.len());
    let graph = std::mem::replace(&mut g.graph, Graph::with_capacity(n));
    let owners = std::mem::replace(&mut g.owners, Vec::with_capacity(n));
    let inputs = std::mem::replace(&mut g.inputs, Vec::with_capacity(m));
    g.leaves.clear();
    let gen = std::mem::replace(&mut g.gen, super::graph::next_generation());
    (graph, owners, inputs, gen)
}

impl ThreadGraph {
    /// Computes everything pending in this graph (no prediction): see
    /// [`ThreadGraph::flush_for`].
    pub(crate) fn flush(&self, reason: FlushReason) -> Option<Arc<Latch>> {
        self.flush_with(reason, None)
    }

    /// Hands this graph to the executor, computing the tensors of `need`
    /// and the live tensors predicted to be used; returns the latch of the
    /// job (`None` when nothing was pending). The graph stays locked until
    /// the executor has marked the outputs in flight and queued the job, so
    /// no other thread can see them pending in a graph that no longer holds
    /// them.
    pub(crate) fn flush_for(
        &self,
        reason: FlushReason,
        need: &[Arc<TensorInner>],
    ) -> Option<Arc<Latch>> {
        self.flush_with(reason, Some(need))
    }

    fn flush_with(
        &self,
        reason: FlushReason,
        need: Option<&[Arc<TensorInner>]>,
    ) -> Option<Arc<Latch>> {
        let mut g = self.state.lock();
        if g.graph.is_empty() {
            return None;
        }
        metrics::flush(reason);
        g.count_recorded();
        if g.fuse || need.is_some() {
            // Earlier jobs release what they hold of this graph's inputs
            // and of the tensors prediction watches (each output for the
            // moment it is bound): which inputs die with this job, and which
            // watched tensors the program dropped, are the program's doing
            // alone.
            self.device.executor.wait_earlier();
        }
        if g.fuse {
            read_futures(&mut g.inputs);
        }
        let (graph, mut owners, mut inputs, old_gen) = take_generation(&mut g);
        let live: Vec<Live> = owners
            .iter_mut()
            .enumerate()
            .filter(|(_, o)| o.as_ref().is_some_and(|t| Arc::strong_count(t) > 1))
            .map(|(i, o)| (NodeId::new(i), o.take().expect("filtered")))
            .collect();
        if std::mem::take(&mut g.retained) {
            keep_inputs_read_by(&graph, live.iter().map(|(n, _)| *n), &mut inputs);
        }
        let (mut outputs, mut left_out, recomputed) = self.select(&graph, live, need);
        if !left_out.is_empty() {
            keep_what_pins_dying_inputs(&graph, &inputs, &mut outputs, &mut left_out);
        }
        let used_late = std::mem::take(&mut g.used_left_out);
        let notes =
            notes::wanted().then(|| self.output_notes(&left_out, recomputed, &used_late, old_gen));
        if !left_out.is_empty() {
            retain(&graph, &inputs, &outputs, &left_out, &mut g);
            keep_inputs_read_by(&graph, outputs.iter().map(|(n, _)| *n), &mut inputs);
        }
        let dying = g.fuse.then(|| dying_inputs(&inputs).collect());
        let job = Job {
            rt: self.device.rt.clone(),
            ordinal: self.device.ordinal,
            graph,
            outputs: outputs
                .iter()
                .map(|(n, t)| (*n, Arc::downgrade(t) as Weak<dyn Slot>))
                .collect(),
            inputs,
            dying,
            fuse: g.fuse,
            reason,
            notes,
        };
        let (latch, here) = self.device.executor.submit(job);
        drop(g);
        self.recycle(owners);
        if let Some(job) = here {
            // Run after the graph is released (other threads may record
            // into it meanwhile; what they read of it is in flight) and,
            // as on the executor thread, holding the outputs only weakly.
            drop((outputs, left_out));
            self.device.executor.run_here(job);
        }
        Some(latch)
    }

    /// Why each left-out value was left out, and which values were
    /// recomputed (`recomputed`, plus those of generation `gen` the program
    /// used late: see `ThreadGraph::recomputed`), for the flush log.
    fn output_notes(
        &self,
        left_out: &[(Live, Site)],
        mut recomputed: Vec<NodeId>,
        used_late: &[(NodeId, u64)],
        gen: u64,
    ) -> Box<OutputNotes> {
        let p = self.predictor.lock();
        recomputed.extend(used_late.iter().filter(|(_, g)| *g == gen).map(|(n, _)| *n));
        Box::new(OutputNotes {
            left_out: left_out
                .iter()
                .map(|((n, _), site)| (*n, p.why(*site)))
                .collect(),
            recomputed,
        })
    }

    /// Splits the live tensors into outputs and those left out (with their
    /// sites), settling what earlier flushes watched.
    fn select(
        &self,
        graph: &Graph,
        live: Vec<Live>,
        need: Option<&[Arc<TensorInner>]>,
    ) -> (Vec<Live>, Vec<(Live, Site)>, Vec<NodeId>) {
        let mut p = self.predictor.lock();
        let mut recomputed = Vec::new();
        let Some(need) = need else {
            for (n, t) in &live {
                if t.take_retained().is_some() {
                    metrics::add(&C.recomputes, 1);
                    recomputed.push(*n);
                }
            }
            return (live, Vec::new(), recomputed);
        };
        p.observe();
        let needed: ahash::AHashSet<usize> = need.iter().map(|t| Arc::as_ptr(t) as usize).collect();
        let mut outputs = Vec::with_capacity(live.len());
        let mut left_out = Vec::new();
        for (n, t) in live {
            if needed.contains(&(Arc::as_ptr(&t) as usize)) {
                if let Some(site) = t.take_retained() {
                    metrics::add(&C.recomputes, 1);
                    p.mispredicted(site);
                    recomputed.push(n);
                }
                outputs.push((n, t));
                continue;
            }
            let site = match t.logical() {
                Some(l) => dynamic_site_of(graph.node(n), l.mask),
                None => site_of(graph.node(n)),
            };
            if p.leave_out(site, t.is_cold()) {
                left_out.push(((n, t), site));
            } else {
                // A retained tensor carried into this graph and still unused
                // stays retained: only the program's own use changes a site.
                let _ = t.take_retained();
                p.watch(&t, site);
                outputs.push((n, t));
            }
        }
        metrics::add(&C.left_out, left_out.len() as u64);
        (outputs, left_out, recomputed)
    }

    /// A tensor left out earlier, now node `node` of generation `gen`, is
    /// being computed because the program used it (in this thread's next
    /// graph). The caller holds no lock of this graph.
    pub(super) fn recomputed(&self, site: Site, node: NodeId, gen: u64) {
        metrics::add(&C.recomputes, 1);
        self.predictor.lock().mispredicted(site);
        if notes::wanted() {
            self.state.lock().used_left_out.push((node, gen));
        }
    }
}

/// Replaces each input an earlier job computed with its value, which that
/// job has bound (the flush waited for it): the graph then holds the
/// buffer, not the tensor, so a tensor the program has dropped is dead now
/// and its buffer is seen to die with this job. An input that failed stays
/// as it is, for the job to report.
fn read_futures(inputs: &mut [(NodeId, Input)]) {
    for (_, input) in inputs.iter_mut() {
        if let Input::Future(s) = input {
            if let Ok(b) = s.read() {
                *input = Input::Buffer(b);
            }
        }
    }
}

/// The inputs whose buffer nothing but the graph holds: no tensor and no
/// other graph can reach them any more, so they die with its job.
fn dying_inputs(inputs: &[(NodeId, Input)]) -> impl Iterator<Item = NodeId> + '_ {
    inputs.iter().filter_map(|(id, input)| match input {
        Input::Buffer(b) if Arc::strong_count(b) == 1 => Some(*id),
        _ => None,
    })
}

/// Keeps only the graph inputs that the slices of `roots` read, so that
/// nothing holds a value longer than the program's own handles and the
/// slices that need it. Used twice per flush that involves retained slices:
/// - before observing drops, with the live tensors as roots: the slices an
///   earlier flush retained for tensors that have died since (a step's
///   gradients, dropped by `zero_grad`) release their inputs now, so an
///   activation such a gradient read is seen dead at this flush, not one
///   later;
/// - after retaining, with the outputs as roots: the job holds only what
///   it computes from (the left-out slices hold their inputs in the next
///   generation), so when a value dies never depends on when the executor
///   runs the job.
fn keep_inputs_read_by(
    graph: &Graph,
    roots: impl Iterator<Item = NodeId>,
    inputs: &mut Vec<(NodeId, Input)>,
) {
    let mut reached = vec![false; graph.len()];
    let mut stack: Vec<NodeId> = roots.collect();
    while let Some(id) = stack.pop() {
        if !std::mem::replace(&mut reached[id.index()], true) {
            stack.extend(graph.node(id).inputs.iter().copied());
        }
    }
    inputs.retain(|(id, _)| reached[id.index()]);
}

/// Moves back to the outputs every left-out tensor whose slice reads a
/// graph input that only this flush holds (no tensor does): retaining it
/// would keep a buffer alive that the flush frees or donates (an optimizer
/// step's old parameters, say), costing more memory and an in-place update
/// for what computing the tensor costs (logits the loop drops pin every
/// weight for a few kilobytes).
///
/// The exception is gradients an optimizer step keeps readable (cold
/// tensors): they read the old weights and are as large, so when they pin
/// at most twice the bytes writing them would take (the weights and a
/// batch uploaded for the step, no larger than the weights) they stay pending,
/// a late `p.grad()` recomputes them from the held weights, and what they
/// hold pins nothing more for the other left-out tensors. A step then
/// writes its parameters and what the program reads, not its gradients.
/// Deterministic: a buffer only the graph holds cannot gain a holder
/// before the job runs, and sizes are shapes.
fn keep_what_pins_dying_inputs(
    graph: &Graph,
    inputs: &[(NodeId, Input)],
    outputs: &mut Vec<Live>,
    left_out: &mut Vec<(Live, Site)>,
) {
    let n = graph.len();
    let mut dying = vec![false; n];
    let mut any = false;
    for id in dying_inputs(inputs) {
        dying[id.index()] = true;
        any = true;
    }
    if !any {
        return;
    }
    let mut stop = vec![false; n];
    for (id, _) in outputs.iter() {
        stop[id.index()] = true;
    }
    let mut walks = Walks::new(n);
    spare_what_cold_values_pin(graph, left_out, &stop, &mut dying, &mut walks);
    // Computed in order: a tensor moved to the outputs becomes an input of
    // the retained slices, so a later one reading a dying input only
    // through it stays left out.
    let mut i = 0;
    while i < left_out.len() {
        let root = left_out[i].0 .0;
        let pins = walks.walk(graph, root, &stop, &dying, |_| true);
        if pins {
            let ((id, t), _) = left_out.swap_remove(i);
            stop[id.index()] = true;
            outputs.push((id, t));
        } else {
            i += 1;
        }
    }
}

/// Gradients kept across an optimizer step (cold) read the old weights and
/// are as large, plus a batch uploaded for the step (its labels, say): if
/// they pin at most twice the bytes writing them would take, they stay
/// pending, and what they pin is no longer counted as dying (held anyway).
fn spare_what_cold_values_pin(
    graph: &Graph,
    left_out: &[(Live, Site)],
    stop: &[bool],
    dying: &mut [bool],
    walks: &mut Walks,
) {
    let mut pinned = vec![false; graph.len()];
    let (mut pinned_bytes, mut cold_bytes) = (0usize, 0usize);
    for ((root, t), _) in left_out.iter() {
        if !t.is_cold() {
            continue;
        }
        walks.walk(graph, *root, stop, dying, |id| {
            if !std::mem::replace(&mut pinned[id.index()], true) {
                pinned_bytes += bytes(graph, id);
            }
            false
        });
        cold_bytes += bytes(graph, *root);
    }
    if pinned_bytes > 0 && pinned_bytes <= 2 * cold_bytes {
        for (d, p) in dying.iter_mut().zip(&pinned) {
            *d &= !p;
        }
    }
}

/// Depth-first walks up a graph's inputs from a root, not past a `stop`
/// node (other than the root) nor a dying input. Visit marks are stamped
/// per walk, so no walk clears the whole graph's.
struct Walks {
    seen: Vec<u32>,
    stack: Vec<NodeId>,
    walk: u32,
}

impl Walks {
    fn new(n: usize) -> Walks {
        Walks {
            seen: vec![0; n],
            stack: Vec::new(),
            walk: 0,
        }
    }

    /// Walks from `root`, calling `at_dying` on each dying input reached;
    /// it returns whether to end the walk there. Returns whether it did.
    fn walk(
        &mut self,
        graph: &Graph,
        root: NodeId,
        stop: &[bool],
        dying: &[bool],
        mut at_dying: impl FnMut(NodeId) -> bool,
    ) -> bool {
        self.walk += 1;
        self.stack.clear();
        self.stack.push(root);
        while let Some(id) = self.stack.pop() {
            if std::mem::replace(&mut self.seen[id.index()], self.walk) == self.walk {
                continue;
            }
            if dying[id.index()] {
                if at_dying(id) {
                    return true;
                }
                continue;
            }
            if id != root && stop[id.index()] {
                continue;
            }
            self.stack.extend(graph.node(id).inputs.iter().copied());
        }
        false
    }
}

/// The size of node `id`'s value.
fn bytes(graph: &Graph, id: NodeId) -> usize {
    let node = graph.node(id);
    node.shape.numel() * node.dtype.size_in_bytes()
}

/// Copies the backward slice of every left-out tensor into `g` (the graph's
/// next generation) and points the tensors at their new nodes. Values this
/// flush computes become future inputs; graph inputs stay held.
fn retain(
    old: &Graph,
    inputs: &[(NodeId, Input)],
    outputs: &[Live],
    left_out: &[(Live, Site)],
    g: &mut GraphState,
) {
    let n = old.len();
    let mut input_at: Vec<Option<usize>> = vec![None; n];
    for (i, (id, _)) in inputs.iter().enumerate() {
        input_at[id.index()] = Some(i);
    }
    let mut output_at: Vec<Option<usize>> = vec![None; n];
    for (i, (id, _)) in outputs.iter().enumerate() {
        output_at[id.index()] = Some(i);
    }
    g.retained = true;
    let mut map: Vec<Option<NodeId>> = vec![None; n];
    let mut stack: Vec<(NodeId, bool)> = Vec::new();
    for ((root, _), _) in left_out {
        stack.push((*root, false));
        while let Some((id, expanded)) = stack.pop() {
            if map[id.index()].is_some() {
                continue;
            }
            let node = old.node(id);
            let is_leaf = output_at[id.index()].is_some() || input_at[id.index()].is_some();
            if !expanded && !is_leaf {
                stack.push((id, true));
                for &i in node.inputs.iter().rev() {
                    if map[i.index()].is_none() {
                        stack.push((i, false));
                    }
                }
                continue;
            }
            let new = if let Some(k) = output_at[id.index()] {
                let t = &outputs[k].1;
                let input = Input::Future(t.clone() as Arc<dyn Slot>);
                let key = Arc::as_ptr(t) as usize;
                g.leaf(key, node.shape.clone(), node.dtype, input, node.origin)
            } else if let Some(k) = input_at[id.index()] {
                let (key, input) = match &inputs[k].1 {
                    Input::Buffer(b) => (Arc::as_ptr(b) as usize, Input::Buffer(b.clone())),
                    Input::Future(s) => (
                        Arc::as_ptr(s) as *const () as usize,
                        Input::Future(s.clone()),
                    ),
                };
                g.leaf(key, node.shape.clone(), node.dtype, input, node.origin)
            } else {
                let ins: SmallVec<[NodeId; 3]> = node
                    .inputs
                    .iter()
                    .map(|i| map[i.index()].expect("inputs are copied first"))
                    .collect();
                g.graph
                    .push_inferred(node.op.clone(), &ins, &node.shape, node.dtype, node.origin)
            };
            map[id.index()] = Some(new);
        }
    }
    let gen = g.gen;
    for ((root, t), site) in left_out {
        let new = map[root.index()].expect("every left-out node is copied");
        if g.owners.len() <= new.index() {
            g.owners.resize(new.index() + 1, None);
        }
        g.owners[new.index()] = Some(t.clone());
        if let TensorState::Pending { node, gen: tg, .. } = &mut *t.state.lock() {
            *node = new;
            *tg = gen;
        }
        t.set_retained(*site);
    }
}
