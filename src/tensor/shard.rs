//! Placing tensors on a device mesh: split (`shard`), copied everywhere
//! (`replicate`), and asking where a tensor lives (`sharding`). A sharded
//! tensor is an ordinary tensor: every op records on it as usual, and the
//! regions that read it run as SPMD programs over its mesh.

use super::Tensor;
use crate::metrics::FlushReason;
use crate::spmd::{Mesh, Sharding};
use crate::{Error, Result};
use lazyfuse_ir::{Op, SplitAxes};

impl Tensor {
    /// This tensor's value split over `mesh`: dimension `d` is divided
    /// over mesh axis `spec[d]` (`None`: not split); mesh axes `spec` does
    /// not name are replicated. A sync point (the value is computed, then
    /// its shards are placed on the mesh's devices). A value already on
    /// `mesh` moves between the devices (XLA's all-gather or all-to-all),
    /// not through the host.
    ///
    /// `Err` at the call site for a spec of the wrong length, an unknown
    /// axis, an axis named twice, a dimension the axis does not divide, or
    /// a tensor of another client than the mesh's.
    #[track_caller]
    pub fn shard(&self, mesh: &Mesh, spec: &[Option<&str>]) -> Result<Tensor> {
        let at = crate::site::caller();
        let fail = |m: String| Error::op("shard", m, self.describe(), at);
        self.on_client_of(mesh).map_err(fail)?;
        let sharding = Sharding::new(mesh, self.shape(), spec).map_err(fail)?;
        if self.0.logical().is_none() {
            // Already on this mesh: moved on the devices.
            let buf = self.materialize(FlushReason::Realize)?;
            if let Some(moved) = self.device().rt.reshard(&buf, &sharding) {
                return Ok(Tensor::ready(moved?, self.device()));
            }
        }
        let host = self.to_host()?;
        let buf = self.device().rt.upload_sharded(&host, &sharding)?;
        Ok(Tensor::ready(buf, self.device()))
    }

    /// This tensor's value copied to every device of `mesh` (a sync
    /// point). Tensors of the mesh's client that were never placed on it
    /// combine with sharded ones as replicated anyway; this makes the copy
    /// explicit and up front.
    #[track_caller]
    pub fn replicate(&self, mesh: &Mesh) -> Result<Tensor> {
        let spec = vec![None; self.dims().len()];
        self.shard(mesh, &spec)
    }

    /// This tensor, kept split over `mesh` as `spec` says inside the
    /// program that computes it (XLA's sharding constraint, as
    /// `jax.lax.with_sharding_constraint`): recorded lazily like any op,
    /// no sync point, the value unchanged. Propagation gives the result
    /// this split, and XLA's partitioner keeps it there rather than
    /// choosing its own; an intermediate that would otherwise be
    /// replicated stays split. In a program on one device it does
    /// nothing.
    ///
    /// `Err` at the call site for a spec of the wrong length, an unknown
    /// axis, an axis named twice, a dimension the axis does not divide, or
    /// a tensor of another client or another mesh than `mesh` (the
    /// constraint names `mesh`'s axes by position).
    #[track_caller]
    pub fn with_sharding_constraint(&self, mesh: &Mesh, spec: &[Option<&str>]) -> Result<Tensor> {
        let at = crate::site::caller();
        let fail = |m: String| Error::op("with_sharding_constraint", m, self.describe(), at);
        self.on_client_of(mesh).map_err(fail)?;
        if let Some(other) = self.0.mesh().filter(|m| *m != mesh) {
            return Err(fail(format!(
                "the tensor is on the mesh {other}, not {mesh}: move it with Tensor::shard"
            )));
        }
        let sharding = Sharding::new(mesh, self.shape(), spec).map_err(fail)?;
        Tensor::apply(Op::ShardingConstraint(split_axes(&sharding)), &[self], at)
    }

    /// The split of this tensor's buffer when it is materialised and split
    /// over a mesh (no sync point: `None` for a pending value, a one-device
    /// or a replicated one): what a gradient accumulated into it keeps.
    pub(crate) fn placed_split(&self) -> Option<SplitAxes> {
        let buf = self.ready_buffer()?;
        let s = buf.sharding()?;
        (!s.is_replicated()).then(|| split_axes(s))
    }

    /// `Err` (a message) unless this tensor is on `mesh`'s client.
    fn on_client_of(&self, mesh: &Mesh) -> std::result::Result<(), String> {
        if self.device().client_id() == mesh.client() {
            return Ok(());
        }
        Err(format!(
            "the tensor is on {:?}, a client other than the mesh {mesh}'s",
            self.device()
        ))
    }

    /// This tensor under the sharding constraint `split` (mesh axis
    /// indices), for layers that derive it (autograd, manual regions).
    #[track_caller]
    pub(crate) fn constrain(&self, split: &SplitAxes) -> Result<Tensor> {
        Tensor::apply(
            Op::ShardingConstraint(split.clone()),
            &[self],
            crate::site::caller(),
        )
    }

    /// Where this tensor lives: its sharding when it is on a mesh, `None`
    /// when it is an ordinary one-device tensor. A sync point: a pending
    /// value's sharding is the one the computation producing it gives.
    pub fn sharding(&self) -> Result<Option<Sharding>> {
        let buf = self.materialize(FlushReason::Realize)?;
        Ok(buf.sharding().cloned())
    }
}

/// `sharding` as the IR's per-dimension mesh axis indices.
fn split_axes(sharding: &Sharding) -> SplitAxes {
    sharding.axes().iter().map(|a| a.map(|a| a as u8)).collect()
}
