//! Pruning and region cutting.

use crate::key::{region_key, RegionKey};
use lazyfuse_ir::{Graph, NodeId, Op};
use std::fmt::Write;

/// Knobs of the planner. Deterministic inputs only.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Fuse ops into shared regions (`false`: one region per op, for debugging).
    pub fuse: bool,
    /// Upper bound on computed (non-constant) nodes per region, so one huge
    /// flush never becomes one slow-to-compile executable.
    pub max_region_nodes: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fuse: true,
            max_region_nodes: 4096,
        }
    }
}

/// One unit of compilation and execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Values read from outside, in order of first use: graph inputs or
    /// outputs of earlier regions.
    pub params: Vec<NodeId>,
    /// Nodes computed here, in topological order (inlined constants included).
    pub nodes: Vec<NodeId>,
    /// Values returned: those live tensors hold and those later regions read.
    pub outputs: Vec<NodeId>,
    /// Canonical compile-cache key.
    pub key: RegionKey,
}

/// The planner's answer for one flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Regions in execution order.
    pub regions: Vec<Region>,
}

impl Plan {
    /// A readable, stable text form for golden tests and dumps.
    pub fn dump(&self, graph: &Graph) -> String {
        let mut s = String::new();
        for (r, region) in self.regions.iter().enumerate() {
            let name = |id: NodeId| -> String {
                match region.params.iter().position(|&p| p == id) {
                    Some(i) => format!("p{i}"),
                    None => format!(
                        "n{}",
                        region
                            .nodes
                            .iter()
                            .position(|&n| n == id)
                            .unwrap_or(usize::MAX)
                    ),
                }
            };
            let _ = writeln!(
                s,
                "region {r} ({} params, {} nodes, {} outputs)",
                region.params.len(),
                region.nodes.len(),
                region.outputs.len()
            );
            for (i, &p) in region.params.iter().enumerate() {
                let n = graph.node(p);
                let _ = writeln!(s, "  p{i}: {}{}", n.dtype, n.shape);
            }
            for (i, &id) in region.nodes.iter().enumerate() {
                let n = graph.node(id);
                let args: Vec<String> = n.inputs.iter().map(|&x| name(x)).collect();
                let _ = writeln!(
                    s,
                    "  n{i} = {}({}) : {}{}",
                    n.op.name(),
                    args.join(", "),
                    n.dtype,
                    n.shape
                );
            }
            let outs: Vec<String> = region.outputs.iter().map(|&x| name(x)).collect();
            let _ = writeln!(s, "  return {}", outs.join(", "));
        }
        s
    }
}

const UNASSIGNED: u32 = u32::MAX;
const INLINE: u32 = u32::MAX - 1;

/// Plans a flush: computes what `live` needs and cuts it into regions.
pub fn plan(graph: &Graph, live: &[NodeId], opts: &PlanOptions) -> Plan {
    let n = graph.len();
    let mut is_live = vec![false; n];
    for &l in live {
        is_live[l.index()] = true;
    }
    // 1. Prune: walk backwards from live nodes.
    let mut needed = is_live.clone();
    for id in graph.ids().rev() {
        if needed[id.index()] {
            for &i in &graph.node(id).inputs {
                needed[i.index()] = true;
            }
        }
    }
    // 2. Assign computed nodes to groups in topological order.
    let mut group = vec![UNASSIGNED; n];
    let mut groups: Vec<Vec<NodeId>> = Vec::new();
    let mut current_size = usize::MAX;
    for id in graph.ids() {
        let node = graph.node(id);
        if !needed[id.index()] || node.op.is_input() {
            continue;
        }
        if matches!(node.op, Op::Constant { .. }) && !is_live[id.index()] {
            group[id.index()] = INLINE;
            continue;
        }
        if !opts.fuse || current_size >= opts.max_region_nodes.max(1) {
            groups.push(Vec::new());
            current_size = 0;
        }
        group[id.index()] = (groups.len() - 1) as u32;
        groups.last_mut().expect("group pushed above").push(id);
        current_size += 1;
    }
    // 3. Values read across groups become outputs of their producer.
    let mut crosses = vec![false; n];
    for (g, members) in groups.iter().enumerate() {
        for &id in members {
            for &i in &graph.node(id).inputs {
                let gi = group[i.index()];
                if gi != g as u32 && gi != INLINE {
                    crosses[i.index()] = true;
                }
            }
        }
    }
    // 4. Build regions.
    let mut regions = Vec::with_capacity(groups.len());
    let mut local = vec![usize::MAX; n];
    // Per-group membership stamps (group index + 1) keep building O(nodes).
    let mut in_region = vec![0u32; n];
    let mut is_param = vec![0u32; n];
    for (g, members) in groups.iter().enumerate() {
        let stamp = g as u32 + 1;
        let mut nodes: Vec<NodeId> = Vec::with_capacity(members.len());
        let mut params: Vec<NodeId> = Vec::new();
        // Inlined constants used here join the region's nodes (kept in id order).
        for &id in members {
            for &i in &graph.node(id).inputs {
                if group[i.index()] == INLINE && in_region[i.index()] != stamp {
                    in_region[i.index()] = stamp;
                    nodes.push(i);
                }
            }
            in_region[id.index()] = stamp;
            nodes.push(id);
        }
        nodes.sort_unstable();
        // Params numbered by first use.
        for &id in &nodes {
            for &i in &graph.node(id).inputs {
                if in_region[i.index()] != stamp && is_param[i.index()] != stamp {
                    is_param[i.index()] = stamp;
                    params.push(i);
                }
            }
        }
        let outputs: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|id| is_live[id.index()] || crosses[id.index()])
            .collect();
        for (k, &p) in params.iter().chain(nodes.iter()).enumerate() {
            local[p.index()] = k;
        }
        let key = region_key(graph, &params, &nodes, &outputs, |id| local[id.index()]);
        regions.push(Region {
            params,
            nodes,
            outputs,
            key,
        });
    }
    Plan { regions }
}
