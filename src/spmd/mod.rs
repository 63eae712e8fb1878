//! Many devices through XLA's SPMD partitioner: device meshes, shardings,
//! and the propagation that gives every value a region computes its
//! sharding. XLA's Shardy partitioner inserts the collectives; lazyfuse
//! writes no distributed engine of its own.
//!
//! A sharded tensor is an ordinary tensor whose buffer is a set of per-
//! device shards (the runtime's device buffers). A region with a
//! sharded parameter is lowered with `#sdy.sharding`s on its parameters and
//! results and compiled as one SPMD program over the mesh; an unsharded
//! parameter of the mesh's client takes part as replicated.

mod mesh;
mod propagate;

pub use mesh::{Mesh, MeshDevices, Sharding};
#[cfg(feature = "xla")]
pub(crate) use propagate::constraint_axes;
pub(crate) use propagate::output_shardings;

use lazyfuse_fusion::Region;
use lazyfuse_ir::Graph;

/// How one SPMD region is laid out: its mesh, and the sharding of each of
/// its parameters (`region.params` order; lifted scalars replicated) and
/// results. Part of its compile key.
#[derive(Clone, Debug)]
pub(crate) struct SpmdLayout {
    pub mesh: Mesh,
    pub params: Vec<Sharding>,
    pub outputs: Vec<Sharding>,
    /// `(parameter, output)` pairs whose shards XLA writes in place (see
    /// [`SpmdLayout::donate`]).
    pub aliases: Vec<(usize, usize)>,
}

impl SpmdLayout {
    /// The layout of `region` with parameter shardings `params`, its
    /// results' shardings propagated.
    pub(crate) fn new(graph: &Graph, region: &Region, mesh: &Mesh, params: Vec<Sharding>) -> Self {
        let outputs = output_shardings(graph, region, mesh, &params);
        SpmdLayout {
            mesh: mesh.clone(),
            params,
            outputs,
            aliases: Vec::new(),
        }
    }

    /// Lets XLA write output `j` into the shards of parameter `k` for the
    /// region's aliases (a dying input paired with an output of its shape
    /// by the planner) where `own(k)` says the argument's shards belong to
    /// its buffer alone (split or replicated over this mesh, not copies
    /// of a one-device array kept for reuse) and both are laid out alike,
    /// so every device's shard has the output shard's shape: an optimizer
    /// step then updates sharded or replicated parameters in place.
    pub(crate) fn donate(&mut self, region: &Region, own: impl Fn(usize) -> bool) {
        self.aliases = region
            .aliases
            .iter()
            .copied()
            .filter(|&(k, j)| own(k) && self.params[k] == self.outputs[j])
            .collect();
    }

    /// The compile key of `region` laid out this way.
    pub(crate) fn key(&self, region: &Region) -> lazyfuse_fusion::RegionKey {
        use std::hash::{Hash, Hasher};
        let mut h = lazyfuse_ir::stable_hasher();
        region.key.0.hash(&mut h);
        self.mesh.key().hash(&mut h);
        for s in self.params.iter().chain(&self.outputs) {
            s.key().hash(&mut h);
        }
        self.aliases.hash(&mut h);
        let lo = h.finish();
        0x5350_4d44u64.hash(&mut h);
        lazyfuse_fusion::RegionKey((u128::from(h.finish()) << 64) | u128::from(lo))
    }
}
