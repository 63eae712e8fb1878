//! What a flush left out and what it computed late, placed in the regions
//! of its plan: the flush log's per-region lines (`LAZYFUSE_DUMP_DIR`) and the
//! report's `output:` lines (`explain`). Only the plan says whether a
//! left-out tensor was computed anyway (inside a region that writes
//! something it feeds) or not at all, so this runs where the plan is made.

use crate::metrics;
use lazyfuse_fusion::Plan;
use lazyfuse_ir::{Graph, NodeId};

/// A flush's output decisions, carried by its job only while the flush log
/// or `explain` wants them ([`wanted`]), so a plain run gathers nothing.
#[derive(Default)]
pub(crate) struct OutputNotes {
    /// Live tensors the flush left out (kept pending), and why.
    pub left_out: Vec<(NodeId, String)>,
    /// Tensors an earlier flush left out that this one computes because
    /// the program read them or used them in this graph (recomputes).
    pub recomputed: Vec<NodeId>,
}

/// Whether flushes gather [`OutputNotes`].
pub(crate) fn wanted() -> bool {
    metrics::explaining() || crate::dump::enabled()
}

/// The region computing `n`, if any.
fn region_of(plan: &Plan, n: NodeId) -> Option<usize> {
    plan.regions.iter().position(|r| r.nodes.contains(&n))
}

/// Where `plan` computes node `n`, in words.
fn placement(plan: &Plan, n: NodeId) -> String {
    match region_of(plan, n) {
        Some(i) => {
            let r = &plan.regions[i];
            if r.outputs.contains(&n) {
                format!("written by region {i} (key {})", r.key)
            } else {
                format!("computed inside region {i} (key {}), not written", r.key)
            }
        }
        None => "not computed".to_string(),
    }
}

/// Records the decisions of one flush: `explain` events, and the flush
/// log with each decision under the region that computes the tensor (or
/// under the flush, for a tensor left out and not computed at all).
pub(crate) fn log(graph: &Graph, plan: &Plan, notes: Option<&OutputNotes>) {
    let Some(notes) = notes else {
        crate::dump::flush_log(graph, plan, &[], &[]);
        return;
    };
    let mut per_region = vec![Vec::new(); plan.regions.len()];
    let mut per_flush = Vec::new();
    let explaining = metrics::explaining();
    for (n, why) in &notes.left_out {
        let what = describe(graph, *n);
        if explaining {
            metrics::left_out(format!("{what}, {} ({why})", placement(plan, *n)));
        }
        match region_of(plan, *n) {
            Some(r) => per_region[r].push(format!("left out, not written: {what} ({why})")),
            None => per_flush.push(format!("left out, not computed: {what} ({why})")),
        }
    }
    for &n in &notes.recomputed {
        let what = describe(graph, n);
        if explaining {
            metrics::recomputed(format!("{what}, {}", placement(plan, n)));
        }
        let line = format!("recomputed (left out before, now read or used): {what}");
        match region_of(plan, n) {
            Some(r) => per_region[r].push(line),
            None => per_flush.push(line),
        }
    }
    crate::dump::flush_log(graph, plan, &per_region, &per_flush);
}

/// `op dtype[shape] @ file:line` of node `n`.
fn describe(graph: &Graph, n: NodeId) -> String {
    let node = graph.node(n);
    format!(
        "{} {}{} @ {}:{}",
        node.op.name(),
        node.dtype,
        node.shape,
        node.origin.file(),
        node.origin.line()
    )
}
