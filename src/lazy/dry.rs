//! Dry-run plans: what a flush of the calling thread's pending work would
//! compute (its regions, outputs and buffer donations) without running it,
//! in the spirit of tinygrad's `check_schedule`. Structural tests assert on
//! a plan instead of counting global metrics, so they need no lock and run
//! in parallel; a user sees how a block of code fuses.

use super::graph::{thread_graphs, ThreadGraph};
use crate::executor::{plan_options, Input};
use lazyfuse_fusion::plan_with_donation;
use lazyfuse_ir::NodeId;
use std::fmt;
use std::sync::Arc;

/// The plan of one flush (see [`plan_of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushPlan {
    /// The compiled regions, in execution order (one per op with fusion off).
    pub regions: Vec<RegionPlan>,
    /// Values the flush would write out: those live tensors hold.
    pub outputs: usize,
    /// Live host scalars uploaded from their value rather than computed.
    pub constants: usize,
}

/// One region of a [`FlushPlan`]: one executable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionPlan {
    /// The ops it computes, by name, in order (`"add"`, `"matmul"`, ...).
    pub ops: Vec<&'static str>,
    /// Values it reads from outside (inputs, lifted scalars, earlier regions).
    pub params: usize,
    /// Values it returns.
    pub outputs: usize,
    /// Parameters whose buffer it may write its result into (donations).
    pub donated: usize,
}

impl FlushPlan {
    /// How many regions compute an op named `op`.
    pub fn regions_with(&self, op: &str) -> usize {
        self.regions.iter().filter(|r| r.ops.contains(&op)).count()
    }

    /// Donations over every region.
    pub fn donated(&self) -> usize {
        self.regions.iter().map(|r| r.donated).sum()
    }
}

impl fmt::Display for FlushPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} region(s), {} output(s), {} constant(s)",
            self.regions.len(),
            self.outputs,
            self.constants
        )?;
        for (i, r) in self.regions.iter().enumerate() {
            writeln!(
                f,
                "  region {i}: {} param(s) -> {} output(s), {} donated: {}",
                r.params,
                r.outputs,
                r.donated,
                r.ops.join(" ")
            )?;
        }
        Ok(())
    }
}

/// Runs `f` and returns its result with the plan of the flush that would
/// compute what it recorded, without running that flush: the values stay
/// pending, and the next sync point computes them as usual. Work pending
/// before the call is flushed first, so the plan covers `f` alone.
///
/// The plan is that of a sync point (`sync()`): every value a live tensor
/// holds is an output. A read (`to_vec`, `item`) may write fewer, leaving
/// out what the program is predicted not to use (docs/execution.md).
/// Values recorded on several devices or meshes give one plan with the
/// regions of each graph in turn.
///
/// ```no_run
/// # use lazyfuse::{Device, Tensor, DType};
/// # fn main() -> lazyfuse::Result<()> {
/// # let dev = Device::cpu()?;
/// let x = Tensor::ones(&[4], DType::F32, &dev)?;
/// let (y, plan) = lazyfuse::plan_of(|| x.exp()?.add(1.0));
/// assert_eq!(plan.regions.len(), 1); // exp and add fuse
/// # Ok(()) }
/// ```
pub fn plan_of<R>(f: impl FnOnce() -> R) -> (R, FlushPlan) {
    crate::flush();
    let r = f();
    let mut plan = FlushPlan::default();
    for g in thread_graphs() {
        peek(&g, &mut plan);
    }
    (r, plan)
}

/// Adds the plan of `g`'s pending graph to `plan`, touching nothing.
fn peek(g: &Arc<ThreadGraph>, plan: &mut FlushPlan) {
    let st = g.state.lock();
    if st.graph.is_empty() {
        return;
    }
    let live: Vec<NodeId> = st
        .owners
        .iter()
        .enumerate()
        .filter(|(_, o)| o.as_ref().is_some_and(|t| Arc::strong_count(t) > 1))
        .map(|(i, _)| NodeId::new(i))
        .collect();
    // With fusion on, an input whose buffer only the graph holds dies with
    // the flush and may be donated (as `flush` decides it).
    let dying: Vec<NodeId> = if st.fuse {
        st.inputs
            .iter()
            .filter_map(|(id, input)| match input {
                Input::Buffer(b) if Arc::strong_count(b) == 1 => Some(*id),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let p = plan_with_donation(&st.graph, &live, &dying, &plan_options(st.fuse));
    plan.outputs += live.len();
    plan.constants += p.constants.len();
    plan.regions.extend(p.regions.iter().map(|r| {
        RegionPlan {
            ops: r
                .nodes
                .iter()
                .map(|&n| st.graph.node(n).op.name())
                .collect(),
            params: r.params.len(),
            outputs: r.outputs.len(),
            donated: r.aliases.len(),
        }
    }));
}
