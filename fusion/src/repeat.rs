//! Repeated-block detection: finds a loop body recorded N times in a row
//! (200 identical AdamW updates, 12 identical transformer layers) so the
//! planner can cut it into N regions that share one cached executable
//! instead of one giant, slow-to-compile region whose key changes with N.
//!
//! Blocks are compared structurally and *block-relatively*: an operand inside
//! the block is named by its distance back from the user, an operand outside
//! it (a leaf, a lifted scalar, an earlier layer's output) only by its shape
//! and dtype, and an inlined constant by its value. So layer k reading layer
//! k-1's output matches layer 1 reading the model input. Deterministic: it
//! sees only the graph.

use lazyfuse_ir::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Tuning of the search.
#[derive(Clone, Debug)]
pub struct RepeatOptions {
    /// Smallest loop body (computed nodes) worth cutting out. Shorter periods
    /// (a chain of identical multiplies) stay fused.
    pub min_block: usize,
    /// Longest loop body searched for.
    pub max_block: usize,
    /// Candidate periods examined per start position (bounds the cost).
    pub max_candidates: usize,
    /// Independent copies run together in one region, up to this many (a
    /// divisor of the copy count from half of this up, else this many with
    /// the rest in one more region), so the regions of a run share at most
    /// two executables while per-execution overhead is paid count/batch
    /// times instead of count times. 64: each execution on the CPU plugin
    /// costs about 80 us of launch and thread hand-off, so 200 AdamW
    /// updates in 4 regions of 50 step 24% faster than in 20 regions of 10,
    /// for 0.2 s more one-time compile; a single region of 200 compiled for
    /// 2 s and was not faster again.
    pub max_batch: usize,
    /// Chained copies (stacked layers) run together in one region, up to
    /// this many. A run of at most this many copies is not cut at all: it
    /// is fused with the ops around it like any other ops, because one
    /// launch per layer costs more per step (about 40 us each on the CPU
    /// plugin) than the larger one-time compile. A longer run is cut into
    /// groups of equal size (see `max_batch`) that share one executable, so
    /// compile time stays bounded however deep the model is.
    pub max_chained: usize,
}

impl Default for RepeatOptions {
    fn default() -> Self {
        RepeatOptions {
            min_block: 6,
            max_block: 4096,
            max_candidates: 16,
            max_batch: 64,
            max_chained: 4,
        }
    }
}

/// A run of `count` consecutive copies of a `len`-node block starting at
/// `start` (indices into the computed-node sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repeat {
    /// Index of the first copy's first node in the sequence.
    pub start: usize,
    /// Nodes per copy.
    pub len: usize,
    /// Number of consecutive copies.
    pub count: usize,
    /// Whether each copy reads the previous copy's values (stacked layers)
    /// rather than being independent (one optimizer update per parameter).
    pub chained: bool,
}

struct Ctx<'g> {
    graph: &'g Graph,
    seq: &'g [NodeId],
    /// Position of each node in `seq` (usize::MAX for leaves and constants).
    pos: Vec<usize>,
}

impl Ctx<'_> {
    /// Are node `seq[a]` in a block starting at `sa` and node `seq[b]` in a
    /// block starting at `sb` the same block-relative computation?
    fn same(&self, a: usize, sa: usize, b: usize, sb: usize) -> bool {
        let (na, nb) = (self.graph.node(self.seq[a]), self.graph.node(self.seq[b]));
        if na.op != nb.op
            || na.shape != nb.shape
            || na.dtype != nb.dtype
            || na.inputs.len() != nb.inputs.len()
        {
            return false;
        }
        na.inputs.iter().zip(&nb.inputs).all(|(&ia, &ib)| {
            let (pa, pb) = (self.pos[ia.index()], self.pos[ib.index()]);
            let inside_a = pa != usize::MAX && pa >= sa;
            let inside_b = pb != usize::MAX && pb >= sb;
            match (inside_a, inside_b) {
                (true, true) => a - pa == b - pb,
                (false, false) => {
                    let (xa, xb) = (self.graph.node(ia), self.graph.node(ib));
                    match (&xa.op, &xb.op) {
                        // Inlined constants are part of the code: compare values.
                        (Op::Constant { .. }, Op::Constant { .. })
                            if !xa.op.is_liftable_scalar() && !xb.op.is_liftable_scalar() =>
                        {
                            xa.op == xb.op
                        }
                        _ => xa.shape == xb.shape && xa.dtype == xb.dtype,
                    }
                }
                _ => false,
            }
        })
    }

    /// Does any node of the block at `t` (length `len`) read a node at or after `from` and before `t`?
    fn reads_block(&self, t: usize, len: usize, from: usize) -> bool {
        (t..t + len).any(|i| {
            self.graph.node(self.seq[i]).inputs.iter().any(|x| {
                let p = self.pos[x.index()];
                p != usize::MAX && p >= from && p < t
            })
        })
    }

    fn blocks_equal(&self, s: usize, t: usize, len: usize) -> bool {
        (0..len).all(|k| self.same(s + k, s, t + k, t))
    }

    /// True when the block at `s` of length `len` is itself a repetition of a shorter period.
    fn periodic(&self, s: usize, len: usize) -> bool {
        (1..len)
            .filter(|&d| len.is_multiple_of(d))
            .any(|d| (1..len / d).all(|r| self.blocks_equal(s, s + r * d, d)))
    }
}

fn shape_key(graph: &Graph, id: NodeId) -> u64 {
    let n = graph.node(id);
    let mut h = lazyfuse_ir::stable_hasher();
    n.op.hash(&mut h);
    n.shape.hash(&mut h);
    n.dtype.hash(&mut h);
    h.finish()
}

/// Finds maximal runs of repeated blocks in `seq` (computed nodes in
/// topological order), left to right, non-overlapping.
pub fn find_repeats(graph: &Graph, seq: &[NodeId], opts: &RepeatOptions) -> Vec<Repeat> {
    let n = seq.len();
    let mut pos = vec![usize::MAX; graph.len()];
    for (i, id) in seq.iter().enumerate() {
        pos[id.index()] = i;
    }
    let ctx = Ctx { graph, seq, pos };
    let keys: Vec<u64> = seq.iter().map(|&id| shape_key(graph, id)).collect();
    let mut occurrences: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        occurrences.entry(*k).or_default().push(i);
    }
    let mut out = Vec::new();
    let mut s = 0;
    while s + 2 * opts.min_block <= n {
        let occ = &occurrences[&keys[s]];
        let first = occ.partition_point(|&i| i < s + opts.min_block);
        let mut best: Option<Repeat> = None;
        for &t in occ[first..].iter().take(opts.max_candidates) {
            let len = t - s;
            if len > opts.max_block || t + len > n {
                break;
            }
            if best.is_some_and(|b| len % b.len == 0) || !ctx.blocks_equal(s, t, len) {
                continue;
            }
            let mut count = 2;
            while s + (count + 1) * len <= n && ctx.blocks_equal(s, s + count * len, len) {
                count += 1;
            }
            if best.is_none_or(|b| count * len > b.count * b.len) {
                best = Some(Repeat {
                    start: s,
                    len,
                    count,
                    chained: false,
                });
            }
        }
        match best {
            Some(mut r) if !ctx.periodic(r.start, r.len) => {
                r.chained = ctx.reads_block(r.start + r.len, r.len, r.start);
                out.push(r);
                s += r.count * r.len;
            }
            // A run with a period shorter than `min_block` (a chain of
            // identical ops) stays fused; skip it whole so the search stays linear.
            Some(r) => s += r.count * r.len,
            None => s += 1,
        }
    }
    out
}
