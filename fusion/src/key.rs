//! Canonical region keys: the compile-cache identity of a region.

use lazyfuse_ir::{Graph, NodeId, Op};
use std::hash::{BuildHasher, Hash, Hasher};

/// A 128-bit canonical key. It depends only on the region's ops, attributes,
/// shapes and dtypes, with parameters numbered by first use, never on tensor
/// ids, node ids, the thread or creation order. Two regions that compute the
/// same thing on different tensors share one key, hence one executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey(pub u128);

impl std::fmt::Display for RegionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Two independent fixed-key hashers so the key is 128 bits wide.
fn hashers() -> (ahash::AHasher, ahash::AHasher) {
    let a = ahash::RandomState::with_seeds(1, 2, 3, 4).build_hasher();
    let b = ahash::RandomState::with_seeds(
        0x9e37_79b9_7f4a_7c15,
        0xbf58_476d_1ce4_e5b9,
        0x94d0_49bb_1331_11eb,
        0x2545_f491_4f6c_dd1d,
    )
    .build_hasher();
    (a, b)
}

/// Computes the key of a region described by its parameters, computed nodes
/// (topological order) and outputs. `local` maps a node to its position in
/// `params ++ nodes`.
pub(crate) fn region_key(
    graph: &Graph,
    params: &[NodeId],
    nodes: &[NodeId],
    outputs: &[NodeId],
    aliases: &[(usize, usize)],
    lifted: (&[usize], &[crate::ScalarPack]),
    local: impl Fn(NodeId) -> usize,
) -> RegionKey {
    let (mut a, mut b) = hashers();
    let mut feed = |h: &mut dyn FnMut(&mut ahash::AHasher)| {
        h(&mut a);
        h(&mut b);
    };
    feed(&mut |h| params.len().hash(h));
    for &p in params {
        let n = graph.node(p);
        feed(&mut |h| {
            n.shape.hash(h);
            n.dtype.hash(h);
        });
    }
    feed(&mut |h| nodes.len().hash(h));
    for &id in nodes {
        let n = graph.node(id);
        feed(&mut |h| {
            match &n.op {
                // A computed node that is a region parameter elsewhere never
                // appears here as Input; params are hashed by type above.
                Op::Input { .. } => unreachable_input(h),
                op => op.hash(h),
            }
            n.inputs.len().hash(h);
            for &i in &n.inputs {
                local(i).hash(h);
            }
            n.shape.hash(h);
            n.dtype.hash(h);
        });
    }
    feed(&mut |h| outputs.len().hash(h));
    for &o in outputs {
        feed(&mut |h| local(o).hash(h));
    }
    feed(&mut |h| aliases.hash(h));
    feed(&mut |h| lifted.hash(h));
    RegionKey(((a.finish() as u128) << 64) | b.finish() as u128)
}

fn unreachable_input(h: &mut ahash::AHasher) {
    u64::MAX.hash(h);
}
