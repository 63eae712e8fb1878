//! Parallelism strategies for a [`Module`] on a device mesh: where its
//! parameters live decides how XLA's SPMD partitioner runs the model. The
//! model's code stays the same; only the placement of parameters (and of
//! the batch, which the caller shards) changes.
//!
//! - [`data_parallel`] (DDP): every parameter replicated; shard the batch
//!   over the data axis, and XLA all-reduces the gradients.
//! - [`fully_sharded`] (FSDP): every parameter split along dimension 0
//!   over the data axis (replicated where that does not divide); XLA
//!   all-gathers it where it is used and reduce-scatters its gradient, and
//!   the optimizer's update and state keep the split, so each device holds
//!   1/N of them.
//! - [`column_parallel`] and [`row_parallel`] (Megatron tensor
//!   parallelism of a [`Linear`] pair): the first layer's output features
//!   split over the model axis, the second's input features, so the
//!   activation between them stays split and one all-reduce joins the
//!   second layer's partial products.

use super::{Linear, Module, Param};
use crate::spmd::Mesh;
use crate::Result;

/// Places `p`'s value over `mesh` as `spec` says (a fresh leaf).
#[track_caller]
fn place(p: &Param, mesh: &Mesh, spec: &[Option<&str>]) -> Result<()> {
    p.set(p.tensor().shard(mesh, spec)?)
}

/// DDP: replicates every parameter of `module` on `mesh`.
#[track_caller]
pub fn data_parallel(module: &dyn Module, mesh: &Mesh) -> Result<()> {
    for (_, p) in module.parameters() {
        let t = p.tensor();
        p.set(t.replicate(mesh)?)?;
    }
    Ok(())
}

/// FSDP: splits dimension 0 of every parameter of `module` over mesh axis
/// `axis` (a parameter whose dimension 0 the axis does not divide, or a
/// scalar, is replicated). Optimizer state created afterwards follows.
#[track_caller]
pub fn fully_sharded(module: &dyn Module, mesh: &Mesh, axis: &str) -> Result<()> {
    let size = mesh
        .axes()
        .find(|&(a, _)| a == axis)
        .map(|(_, s)| s)
        .unwrap_or(0);
    for (_, p) in module.parameters() {
        let dims = p.tensor().dims().to_vec();
        let mut spec: Vec<Option<&str>> = vec![None; dims.len()];
        // An unknown axis reaches `shard`, which names the mesh's axes.
        if !dims.is_empty() && (size == 0 || dims[0] % size == 0) {
            spec[0] = Some(axis);
        }
        place(&p, mesh, &spec)?;
    }
    Ok(())
}

/// Megatron column parallelism: `layer`'s output features (weight
/// dimension 1, the bias) split over mesh axis `axis`.
#[track_caller]
pub fn column_parallel(layer: &Linear, mesh: &Mesh, axis: &str) -> Result<()> {
    place(&layer.weight, mesh, &[None, Some(axis)])?;
    if let Some(b) = &layer.bias {
        place(b, mesh, &[Some(axis)])?;
    }
    Ok(())
}

/// Megatron row parallelism: `layer`'s input features (weight dimension 0)
/// split over mesh axis `axis`, the bias replicated.
#[track_caller]
pub fn row_parallel(layer: &Linear, mesh: &Mesh, axis: &str) -> Result<()> {
    place(&layer.weight, mesh, &[Some(axis), None])?;
    if let Some(b) = &layer.bias {
        place(b, mesh, &[None])?;
    }
    Ok(())
}
