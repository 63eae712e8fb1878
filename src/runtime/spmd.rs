//! The runtime's side of SPMD: sharded buffers (split on upload, assembled
//! on download), replicated copies of one-device buffers for sharded
//! computations, and compiling and launching a region as one program over
//! a mesh.

use super::{DeviceBuffer, Executable, Placement, Runtime};
use crate::backend::{Completion, RawBuffer};
use crate::metrics::{self, COUNTERS as C};
use crate::spmd::{Mesh, Sharding, SpmdLayout};
use crate::{Error, Result};
use lazyfuse_fusion::Region;
use lazyfuse_ir::{DType, Graph, HostTensor, Shape};
use std::sync::Arc;
use std::time::Instant;

/// Calls `copy(global_byte_offset, local_byte_offset, run_bytes)` for each
/// contiguous run (along the last dimension) of the shard of shape `local`
/// at `offset` in an array of shape `global` with elements of `elem` bytes.
fn for_each_run(
    global: &Shape,
    local: &Shape,
    offset: &[usize],
    elem: usize,
    mut copy: impl FnMut(usize, usize, usize),
) {
    let r = global.rank();
    if local.numel() == 0 {
        return;
    }
    if r == 0 {
        return copy(0, 0, elem);
    }
    let (g, l) = (global.dims(), local.dims());
    let run = l[r - 1] * elem;
    let rows = local.numel() / l[r - 1];
    let mut idx = vec![0usize; r - 1];
    for row in 0..rows {
        let mut flat = 0;
        for d in 0..r - 1 {
            flat = flat * g[d] + offset[d] + idx[d];
        }
        flat = flat * g[r - 1] + offset[r - 1];
        copy(flat * elem, row * run, run);
        for d in (0..r - 1).rev() {
            idx[d] += 1;
            if idx[d] < l[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Runtime {
    /// Splits `host` as `sharding` says and uploads shard `p` to mesh
    /// device `p`.
    pub(crate) fn upload_sharded(
        &self,
        host: &HostTensor,
        sharding: &Sharding,
    ) -> Result<Arc<DeviceBuffer>> {
        let local = sharding.shard_shape(&host.shape);
        let elem = host.dtype.size_in_bytes();
        let mut shards = Vec::with_capacity(sharding.mesh().size());
        for (p, &device) in sharding.mesh().devices().iter().enumerate() {
            let offset = sharding.shard_offset(&host.shape, p);
            let mut bytes = vec![0u8; local.numel() * elem];
            for_each_run(&host.shape, &local, &offset, elem, |g, l, n| {
                bytes[l..l + n].copy_from_slice(&host.bytes[g..g + n]);
            });
            let shard = HostTensor {
                shape: local.clone(),
                dtype: host.dtype,
                bytes,
            };
            let t0 = Instant::now();
            shards.push(self.backend.upload((&shard).into(), device)?);
            metrics::observe_since(metrics::Phase::HostToDevice, t0);
            metrics::add(&C.h2d_transfers, 1);
            metrics::add(&C.h2d_bytes, shard.bytes.len() as u64);
        }
        Ok(self.sharded(shards, host.shape.clone(), host.dtype, sharding))
    }

    /// A sharded buffer of `shards` (one per mesh position).
    fn sharded(
        &self,
        shards: Vec<RawBuffer>,
        shape: Shape,
        dtype: DType,
        sharding: &Sharding,
    ) -> Arc<DeviceBuffer> {
        let bytes = sharding.shard_shape(&shape).numel() * dtype.size_in_bytes() * shards.len();
        let devices = sharding
            .mesh()
            .devices()
            .iter()
            .map(|&d| d as u16)
            .collect();
        let place = Placement::Shards(sharding.clone(), Arc::new(shards));
        DeviceBuffer::with_placement(place, shape, dtype, bytes, devices)
    }

    /// Downloads every distinct shard of `buf` and assembles the global array.
    pub(super) fn assemble(
        &self,
        buf: &DeviceBuffer,
        sharding: &Sharding,
        shards: &[RawBuffer],
    ) -> Result<HostTensor> {
        let elem = buf.dtype.size_in_bytes();
        let local = sharding.shard_shape(&buf.shape);
        let mut out = vec![0u8; buf.shape.numel() * elem];
        let mut done: Vec<Vec<usize>> = Vec::new();
        for (p, shard) in shards.iter().enumerate() {
            let offset = sharding.shard_offset(&buf.shape, p);
            if done.contains(&offset) {
                continue;
            }
            let t0 = Instant::now();
            let mut bytes = vec![0u8; local.numel() * elem];
            let in_place = self.backend.download(shard, &mut bytes)?;
            metrics::observe_since(metrics::Phase::DeviceToHost, t0);
            metrics::add(&C.d2h_transfers, 1);
            metrics::add(&C.d2h_in_place, u64::from(in_place));
            metrics::add(&C.d2h_bytes, bytes.len() as u64);
            for_each_run(&buf.shape, &local, &offset, elem, |g, l, n| {
                out[g..g + n].copy_from_slice(&bytes[l..l + n]);
            });
            done.push(offset);
        }
        Ok(HostTensor {
            shape: buf.shape.clone(),
            dtype: buf.dtype,
            bytes: out,
        })
    }

    /// `buf`'s shards on the devices of `mesh`: its own when it is sharded
    /// over `mesh`, else (a one-device array, or one replicated over
    /// another mesh) a copy on every device, made once and kept with the
    /// buffer. `Err` for an array split over another mesh.
    fn shards_on(&self, buf: &DeviceBuffer, mesh: &Mesh) -> Result<Arc<Vec<RawBuffer>>> {
        match &buf.place {
            Placement::Shards(s, shards) if s.mesh() == mesh => Ok(shards.clone()),
            Placement::Shards(s, _) if !s.is_replicated() => Err(Error::Pjrt(format!(
                "a computation mixes tensors of two meshes, {} and {mesh}: move one with \
                 Tensor::shard or Tensor::replicate onto the other's mesh",
                s.mesh()
            ))),
            // A one-device array, or one replicated over another mesh
            // (any of its copies is the whole value).
            _ => {
                let mut replicas = buf.replicas.lock();
                if let Some((m, r)) = &*replicas {
                    if m == mesh {
                        return Ok(r.clone());
                    }
                }
                let host = self.download(buf)?;
                let copies = mesh
                    .devices()
                    .iter()
                    .map(|&d| self.backend.upload((&host).into(), d))
                    .collect::<Result<Vec<RawBuffer>>>()?;
                metrics::add(&C.h2d_transfers, copies.len() as u64);
                metrics::add(&C.h2d_bytes, (host.bytes.len() * copies.len()) as u64);
                let copies = Arc::new(copies);
                // The copies count on their devices while the buffer keeps
                // them (see `DeviceBuffer`'s drop), replacing any of another mesh.
                replica_bytes(mesh, buf.bytes, true);
                if let Some((old, _)) = replicas.replace((mesh.clone(), copies.clone())) {
                    replica_bytes(&old, buf.bytes, false);
                }
                Ok(copies)
            }
        }
    }

    /// The SPMD executable for `region` laid out as `layout`, compiling it
    /// on a miss (one compile per key, as [`Runtime::compile_or_fetch`]).
    pub(crate) fn compile_or_fetch_spmd(
        &self,
        graph: &Graph,
        region: &Region,
        layout: &SpmdLayout,
        mut on_compile: impl FnMut(),
    ) -> Result<Executable> {
        let key = layout.key(region);
        self.cached(key, || {
            self.backend
                .compile_spmd(key, graph, region, layout, &mut on_compile)
        })
    }

    /// `buf` (sharded over `to`'s mesh) laid out as `to`, moved on the
    /// devices by an SPMD identity program (compiled once per shape, dtype
    /// and pair of shardings): no host round trip. `None` for a buffer not
    /// on that mesh.
    pub(crate) fn reshard(
        &self,
        buf: &Arc<DeviceBuffer>,
        to: &Sharding,
    ) -> Option<Result<Arc<DeviceBuffer>>> {
        let Placement::Shards(from, shards) = &buf.place else {
            return None;
        };
        if from.mesh() != to.mesh() {
            return None;
        }
        if from == to {
            return Some(Ok(buf.clone()));
        }
        Some(self.reshard_on_devices(buf, from, shards, to))
    }

    fn reshard_on_devices(
        &self,
        buf: &DeviceBuffer,
        from: &Sharding,
        shards: &[RawBuffer],
        to: &Sharding,
    ) -> Result<Arc<DeviceBuffer>> {
        use std::hash::{Hash, Hasher};
        let mut h = lazyfuse_ir::stable_hasher();
        ("reshard", &buf.shape, buf.dtype, from.key(), to.key()).hash(&mut h);
        let lo = h.finish();
        0x7265_7368u64.hash(&mut h);
        let key = lazyfuse_fusion::RegionKey((u128::from(h.finish()) << 64) | u128::from(lo));
        let exe = self.cached(key, || {
            self.backend
                .compile_reshard(key, &buf.shape, buf.dtype, from, to)
        })?;
        let lists: Vec<Vec<&RawBuffer>> = shards.iter().map(|s| vec![s]).collect();
        let t0 = Instant::now();
        let (per_device, done) = self.backend.execute_spmd(&exe, &lists, &[])?;
        if let Some(done) = self.launched(done, t0)? {
            self.wait(done)?;
        }
        let shards = per_device
            .into_iter()
            .map(|mut o| {
                o.pop()
                    .ok_or_else(|| Error::internal("a reshard returned no result"))
            })
            .collect::<Result<Vec<RawBuffer>>>()?;
        Ok(self.sharded(shards, buf.shape.clone(), buf.dtype, to))
    }

    /// Launches an SPMD executable on every device of `layout`'s mesh;
    /// `args` are the region's arguments in launch order, each sharded over
    /// the mesh or a one-device array (replicated); the arguments at the
    /// positions `donate` die here and their shards are given to XLA (see
    /// [`SpmdLayout::donations`]). Returns the results, sharded as
    /// `layout.outputs` says.
    pub(crate) fn launch_spmd(
        &self,
        exe: &crate::backend::RawExecutable,
        args: &[&DeviceBuffer],
        layout: &SpmdLayout,
        donate: &[usize],
        outputs: &[(Shape, DType)],
    ) -> Result<(Vec<Arc<DeviceBuffer>>, Option<Completion>)> {
        let mesh = &layout.mesh;
        let held = args
            .iter()
            .map(|b| self.shards_on(b, mesh))
            .collect::<Result<Vec<_>>>()?;
        let lists: Vec<Vec<&RawBuffer>> = (0..mesh.size())
            .map(|p| held.iter().map(|s| &s[p]).collect())
            .collect();
        let t0 = Instant::now();
        let (per_device, done) = self.backend.execute_spmd(exe, &lists, donate)?;
        metrics::add(&C.buffers_donated, donate.len() as u64);
        let done = self.launched(done, t0)?;
        if per_device.iter().any(|o| o.len() != outputs.len()) {
            return Err(Error::internal(format!(
                "an SPMD executable returned other than {} outputs per device",
                outputs.len()
            )));
        }
        // Transpose: per output, its shard on each device.
        let mut columns: Vec<Vec<RawBuffer>> = (0..outputs.len()).map(|_| Vec::new()).collect();
        for device_outs in per_device {
            for (j, b) in device_outs.into_iter().enumerate() {
                columns[j].push(b);
            }
        }
        let bufs = columns
            .into_iter()
            .zip(outputs)
            .zip(&layout.outputs)
            .map(|((shards, (s, d)), sharding)| self.sharded(shards, s.clone(), *d, sharding))
            .collect();
        Ok((bufs, done))
    }
}

/// Counts (or, with `add` false, uncounts) one `bytes`-byte copy on every
/// device of `mesh` in the per-device live bytes.
pub(super) fn replica_bytes(mesh: &Mesh, bytes: usize, add: bool) {
    for &d in mesh.devices() {
        metrics::device_bytes(d, bytes as u64, add);
    }
}

#[cfg(test)]
mod tests {
    use super::for_each_run;
    use lazyfuse_ir::Shape;

    #[test]
    fn runs_cover_a_two_dimensional_shard() {
        // The [2, 2] shard at (2, 1) of a [4, 3] array of 1-byte elements.
        let mut runs = Vec::new();
        for_each_run(
            &Shape::new(&[4, 3]),
            &Shape::new(&[2, 2]),
            &[2, 1],
            1,
            |g, l, n| runs.push((g, l, n)),
        );
        assert_eq!(runs, [(7, 0, 2), (10, 2, 2)]);
    }
}
