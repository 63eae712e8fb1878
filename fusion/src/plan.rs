//! Pruning and region cutting.

use crate::key::{region_key, RegionKey};
use crate::repeat::{find_repeats, RepeatOptions};
use lazyfuse_ir::{DType, Graph, NodeId, Op};
use std::fmt::Write;

/// Knobs of the planner. Deterministic inputs only.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Fuse ops into shared regions (`false`: one region per op, for debugging).
    pub fuse: bool,
    /// Upper bound on the summed [`Op::compile_cost`] of a region, so one
    /// huge flush never becomes one slow-to-compile executable.
    pub max_region_cost: usize,
    /// Cut loop bodies recorded several times in a row into one region per
    /// repetition (one cached executable), see [`crate::find_repeats`].
    pub detect_repeats: bool,
    /// Knobs of the repeated-block search.
    pub repeat: RepeatOptions,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fuse: true,
            max_region_cost: 4096,
            detect_repeats: true,
            repeat: RepeatOptions::default(),
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
    /// Buffer donation: `(param index, output index)` pairs. The parameter's
    /// buffer dies in this region (no live tensor holds it, no later region
    /// reads it), so XLA may write the output of the same type into it.
    pub aliases: Vec<(usize, usize)>,
    /// Indices into `params` of lifted host scalars, ascending. They are not
    /// passed one buffer each: a launch packs them into rank-1 buffers
    /// ([`Region::scalar_packs`]), so a region with 90 scalars (ten
    /// optimizer updates) takes ten arguments for them, not 90.
    pub lifted: Vec<usize>,
    /// The lifted scalars' packs, in argument order: one per dtype, and per
    /// copy when the region batches repeated copies. Packing per copy keeps
    /// the copies' code identical (each reads the same offsets of its own
    /// pack), so XLA still compiles one kernel for all of them.
    pub packs: Vec<ScalarPack>,
    /// Canonical compile-cache key (donation included: it changes the executable).
    pub key: RegionKey,
}

/// The lifted scalars of one dtype, passed as one rank-1 buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScalarPack {
    /// Their dtype.
    pub dtype: DType,
    /// Indices into the region's `params`, in buffer order.
    pub params: Vec<usize>,
}

/// Groups lifted parameters `lifted` (indices into `params`) into packs by
/// `(label, dtype)`, packs in order of first use.
fn pack_scalars(
    graph: &Graph,
    params: &[NodeId],
    lifted: &[usize],
    labels: &[u32],
) -> Vec<ScalarPack> {
    let mut packs: Vec<(u32, ScalarPack)> = Vec::new();
    for (&k, &label) in lifted.iter().zip(labels) {
        let dtype = graph.node(params[k]).dtype;
        match packs
            .iter_mut()
            .find(|(l, p)| *l == label && p.dtype == dtype)
        {
            Some((_, p)) => p.params.push(k),
            None => packs.push((
                label,
                ScalarPack {
                    dtype,
                    params: vec![k],
                },
            )),
        }
    }
    packs.into_iter().map(|(_, p)| p).collect()
}

impl Region {
    /// The lifted scalars' packs (computed by the planner, once per plan).
    /// A launch passes the buffer parameters (`params` minus `lifted`, in
    /// order), then one buffer per pack.
    pub fn scalar_packs(&self) -> &[ScalarPack] {
        &self.packs
    }

    /// True when parameter `k` is a lifted scalar (passed in a pack).
    pub fn is_lifted(&self, k: usize) -> bool {
        self.lifted.binary_search(&k).is_ok()
    }

    /// The argument position of buffer parameter `k` (its index among the
    /// parameters that are not lifted).
    pub fn arg_of(&self, k: usize) -> usize {
        k - self.lifted.partition_point(|&l| l < k)
    }
}

/// The planner's answer for one flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Regions in execution order.
    pub regions: Vec<Region>,
    /// Live host scalars (liftable rank-0 constants a tensor holds), in id
    /// order. No region computes them: their value would be part of its
    /// key, so a scalar made fresh each step (`Tensor::full(lr, &[])`, or
    /// the constant of a scalar `mul` that autograd saved) would compile a
    /// new executable every step. The runtime uploads each from its value,
    /// and regions that read one take it lifted, like any host scalar.
    pub constants: Vec<NodeId>,
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
                let lifted = if region.is_lifted(i) { " (lifted)" } else { "" };
                let _ = writeln!(s, "  p{i}: {}{}{lifted}", n.dtype, n.shape);
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
            for &(k, j) in &region.aliases {
                let _ = writeln!(s, "  donate p{k} -> {}", name(region.outputs[j]));
            }
        }
        for &id in &self.constants {
            let n = graph.node(id);
            let _ = writeln!(s, "constant {}{} (uploaded)", n.dtype, n.shape);
        }
        s
    }
}

const UNASSIGNED: u32 = u32::MAX;
const INLINE: u32 = u32::MAX - 1;
const LIFTED: u32 = u32::MAX - 2;

/// Plans a flush: computes what `live` needs and cuts it into regions.
pub fn plan(graph: &Graph, live: &[NodeId], opts: &PlanOptions) -> Plan {
    plan_with_donation(graph, live, &[], opts)
}

/// Like [`plan`], where `dying` lists input nodes whose buffers nothing
/// outside this flush holds. With fusion on, each dying leaf, and each value
/// passed between regions that no live tensor holds, is donated to the last
/// region that reads it when that region returns a value of the same shape
/// and dtype. (Unfused mode never donates: it is the plain reference path.)
///
/// The steps, each a function of its own:
/// 1. `prune`: keep only what the live nodes need;
/// 2. `classify`: leaves become params, scalars are lifted (live ones are
///    [`Plan::constants`]), other non-live constants are inlined,
///    everything else is computed, in order;
/// 3. `cut`: cut the computed sequence into groups (`assign_groups`
///    records each node's group);
/// 4. `crossing_values`: values read across groups become outputs of
///    their producer;
/// 5. `build_regions`: one region per group, with params, inlined
///    constants, outputs and key;
/// 6. `donate`: with fusion on, dying params donate their buffers.
pub fn plan_with_donation(
    graph: &Graph,
    live: &[NodeId],
    dying: &[NodeId],
    opts: &PlanOptions,
) -> Plan {
    let mut is_live = vec![false; graph.len()];
    for &l in live {
        is_live[l.index()] = true;
    }
    let needed = prune(graph, &is_live);
    let (mut group, seq) = classify(graph, &is_live, &needed);
    let constants = graph
        .ids()
        .filter(|id| is_live[id.index()] && group[id.index()] == LIFTED)
        .collect();
    let mut copy = vec![0u32; graph.len()];
    let groups = cut(graph, &seq, opts, &mut copy);
    assign_groups(&mut group, &groups);
    let crosses = crossing_values(graph, &groups, &group);
    let mut local = vec![usize::MAX; graph.len()];
    let cx = RegionCx {
        graph,
        group: &group,
        copy: &copy,
        is_live: &is_live,
        crosses: &crosses,
    };
    let mut regions = build_regions(&cx, &groups, &mut local);
    if opts.fuse {
        donate(graph, &mut regions, dying, &is_live, &mut local);
    }
    Plan { regions, constants }
}

/// Step 1, prune: the nodes live ones need, by a backward walk (index order
/// is topological).
fn prune(graph: &Graph, is_live: &[bool]) -> Vec<bool> {
    let mut needed = is_live.to_vec();
    for id in graph.ids().rev() {
        if needed[id.index()] {
            for &i in &graph.node(id).inputs {
                needed[i.index()] = true;
            }
        }
    }
    needed
}

/// Step 2, classify: leaves are params (left [`UNASSIGNED`]), liftable
/// scalars become params ([`LIFTED`], live ones too: see
/// [`Plan::constants`]), other non-live constants are inlined into each
/// region that uses them ([`INLINE`]), and everything else is computed:
/// returned in order as the sequence to cut.
fn classify(graph: &Graph, is_live: &[bool], needed: &[bool]) -> (Vec<u32>, Vec<NodeId>) {
    let mut group = vec![UNASSIGNED; graph.len()];
    let mut seq: Vec<NodeId> = Vec::new();
    for id in graph.ids() {
        let node = graph.node(id);
        if !needed[id.index()] || node.op.is_input() {
            continue;
        }
        if node.op.is_liftable_scalar() {
            group[id.index()] = LIFTED;
            continue;
        }
        if matches!(node.op, Op::Constant { .. }) && !is_live[id.index()] {
            group[id.index()] = INLINE;
            continue;
        }
        seq.push(id);
    }
    (group, seq)
}

/// Step 3 (after [`cut`]): records the group of every computed node.
fn assign_groups(group: &mut [u32], groups: &[Vec<NodeId>]) {
    for (g, members) in groups.iter().enumerate() {
        for &id in members {
            group[id.index()] = g as u32;
        }
    }
}

/// Step 4, outputs: the values read by a group other than their producer's
/// (leaves, inlined and lifted constants excluded) must be returned by it.
fn crossing_values(graph: &Graph, groups: &[Vec<NodeId>], group: &[u32]) -> Vec<bool> {
    let mut crosses = vec![false; graph.len()];
    for (g, members) in groups.iter().enumerate() {
        for &id in members {
            for &i in &graph.node(id).inputs {
                let gi = group[i.index()];
                if gi != g as u32 && gi != INLINE && gi != LIFTED {
                    crosses[i.index()] = true;
                }
            }
        }
    }
    crosses
}

/// Step 5, build regions: per group, its nodes (inlined constants it uses
/// joined in, in id order), params numbered by first use, outputs (live or
/// crossing values) and key. `local` is scratch for region-local numbering.
/// What building regions reads about every node.
struct RegionCx<'a> {
    graph: &'a Graph,
    /// Group of each node ([`UNASSIGNED`], [`INLINE`], [`LIFTED`] or a group).
    group: &'a [u32],
    /// Copy of each node within a batch of repeated copies (1-based; 0
    /// outside batches): lifted scalars are packed per copy.
    copy: &'a [u32],
    is_live: &'a [bool],
    crosses: &'a [bool],
}

fn build_regions(cx: &RegionCx<'_>, groups: &[Vec<NodeId>], local: &mut [usize]) -> Vec<Region> {
    let RegionCx {
        graph,
        group,
        copy,
        is_live,
        crosses,
    } = *cx;
    let n = graph.len();
    let mut regions = Vec::with_capacity(groups.len());
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
        // Params numbered by first use; a lifted scalar goes to the pack of
        // the copy that first uses it.
        let mut lifted = Vec::new();
        let mut lifted_pack = Vec::new();
        for &id in &nodes {
            for &i in &graph.node(id).inputs {
                if in_region[i.index()] != stamp && is_param[i.index()] != stamp {
                    is_param[i.index()] = stamp;
                    if group[i.index()] == LIFTED {
                        lifted.push(params.len());
                        lifted_pack.push(copy[id.index()]);
                    }
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
        let packs = pack_scalars(graph, &params, &lifted, &lifted_pack);
        let key = region_key(
            graph,
            &params,
            &nodes,
            &outputs,
            &[],
            (&lifted, &packs),
            |id| local[id.index()],
        );
        regions.push(Region {
            params,
            nodes,
            outputs,
            aliases: Vec::new(),
            lifted,
            packs,
            key,
        });
    }
    regions
}

/// Step 6, donate: assigns donations and re-keys the regions that received one.
fn donate(
    graph: &Graph,
    regions: &mut [Region],
    dying: &[NodeId],
    is_live: &[bool],
    local: &mut [usize],
) {
    let mut last_use = vec![usize::MAX; graph.len()];
    for (r, region) in regions.iter().enumerate() {
        for p in &region.params {
            last_use[p.index()] = r;
        }
    }
    // Dying: the given leaves, and values computed by an earlier region of
    // this flush that no live tensor holds (only the flush has them).
    let mut is_dying: Vec<bool> = graph
        .ids()
        .map(|id| {
            let n = graph.node(id);
            !is_live[id.index()] && !n.op.is_input() && !matches!(n.op, Op::Constant { .. })
        })
        .collect();
    for d in dying {
        is_dying[d.index()] = true;
    }
    for (r, region) in regions.iter_mut().enumerate() {
        let mut taken = vec![false; region.outputs.len()];
        for (k, p) in region.params.iter().enumerate() {
            if !is_dying[p.index()] || last_use[p.index()] != r {
                continue;
            }
            let pn = graph.node(*p);
            let fit = region.outputs.iter().enumerate().position(|(j, o)| {
                let on = graph.node(*o);
                !taken[j] && on.shape == pn.shape && on.dtype == pn.dtype
            });
            if let Some(j) = fit {
                taken[j] = true;
                region.aliases.push((k, j));
            }
        }
        if !region.aliases.is_empty() {
            for (k, &p) in region.params.iter().chain(region.nodes.iter()).enumerate() {
                local[p.index()] = k;
            }
            region.key = region_key(
                graph,
                &region.params,
                &region.nodes,
                &region.outputs,
                &region.aliases,
                (&region.lifted, &region.packs),
                |id| local[id.index()],
            );
        }
    }
}

/// How many of `count` independent copies share a region: the largest
/// divisor of `count` from `max/2` to `max` (every region then shares one
/// executable), else `max`, the last region taking what is left over (two
/// executables, whatever the count: a prime count of parameters is not one
/// region each).
fn batch_size(count: usize, max: usize) -> usize {
    let max = max.clamp(1, count.max(1));
    (max.div_ceil(2)..=max)
        .rev()
        .find(|b| count.is_multiple_of(*b))
        .unwrap_or(max)
}

/// Step 3, cut: cuts the computed sequence into groups: one node each without fusion;
/// otherwise runs of repeated blocks become groups of equal numbers of
/// copies (a short run of chained copies stays uncut) and the rest is
/// packed up to the cost cap, with stand-alone ops alone.
fn cut(graph: &Graph, seq: &[NodeId], opts: &PlanOptions, copy: &mut [u32]) -> Vec<Vec<NodeId>> {
    if !opts.fuse {
        return seq.iter().map(|&id| vec![id]).collect();
    }
    let repeats = if opts.detect_repeats {
        find_repeats(graph, seq, &opts.repeat)
    } else {
        Vec::new()
    };
    let mut groups: Vec<Vec<NodeId>> = Vec::new();
    let pack = |nodes: &[NodeId], groups: &mut Vec<Vec<NodeId>>| {
        let mut cost = usize::MAX;
        for &id in nodes {
            let op = &graph.node(id).op;
            let c = op.compile_cost();
            if op.must_stand_alone() {
                groups.push(vec![id]);
                cost = usize::MAX;
                continue;
            }
            if cost == usize::MAX || cost + c > opts.max_region_cost.max(1) {
                groups.push(Vec::new());
                cost = 0;
            }
            groups.last_mut().expect("pushed above").push(id);
            cost += c;
        }
    };
    let mut at = 0;
    for r in repeats {
        if r.chained && r.count <= opts.repeat.max_chained {
            // A few stacked layers: fused with what surrounds them.
            continue;
        }
        pack(&seq[at..r.start], &mut groups);
        let max = if r.chained {
            opts.repeat.max_chained
        } else {
            opts.repeat.max_batch
        };
        let batch = batch_size(r.count, max);
        let mut k = 0;
        while k < r.count {
            let take = batch.min(r.count - k);
            let s = r.start + k * r.len;
            for c in 0..take {
                for &id in &seq[s + c * r.len..s + (c + 1) * r.len] {
                    copy[id.index()] = c as u32 + 1;
                }
            }
            pack(&seq[s..s + take * r.len], &mut groups);
            k += take;
        }
        at = r.start + r.count * r.len;
    }
    pack(&seq[at..], &mut groups);
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazyfuse_ir::{Literal, Shape};

    fn region(params: usize, lifted: &[usize]) -> Region {
        Region {
            params: (0..params).map(NodeId::new).collect(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            aliases: Vec::new(),
            lifted: lifted.to_vec(),
            packs: Vec::new(),
            key: RegionKey(0),
        }
    }

    #[test]
    fn buffer_parameters_keep_their_order_around_lifted_ones() {
        let r = region(6, &[1, 2, 4]);
        let args: Vec<usize> = [0, 3, 5].iter().map(|&k| r.arg_of(k)).collect();
        assert_eq!(args, [0, 1, 2]);
        assert!(r.is_lifted(4) && !r.is_lifted(3));
    }

    #[test]
    fn packs_group_scalars_by_dtype_in_order_of_first_use() {
        let here = lazyfuse_ir::Origin::caller();
        let mut g = Graph::new();
        for (v, d) in [(0.5, DType::F32), (3.0, DType::I32), (2.5, DType::F32)] {
            let op = Op::Constant {
                value: Literal::Float(v),
                shape: Shape::scalar(),
                dtype: d,
            };
            g.push(op, &[], here).unwrap();
        }
        let params: Vec<NodeId> = (0..3).map(NodeId::new).collect();
        let packs = pack_scalars(&g, &params, &[0, 1, 2], &[0, 0, 0]);
        assert_eq!(
            packs,
            [
                ScalarPack {
                    dtype: DType::F32,
                    params: vec![0, 2]
                },
                ScalarPack {
                    dtype: DType::I32,
                    params: vec![1]
                }
            ]
        );
    }
}
