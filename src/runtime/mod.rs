//! One backend client with its compile cache: the only layer that talks to
//! the device. Shared by every thread and every tensor of a
//! [`crate::Device`]; it does not know about executors, graphs of threads
//! or tensors (those live above it).
//!
//! What it owns: device buffers ([`DeviceBuffer`], counted in the metrics),
//! the in-memory compile cache keyed by canonical region key (threads
//! missing the same key wait for one compile), and the cache of uploaded
//! lifted scalars.

use crate::backend::{Backend, Completion, HostSlice, InterpBackend, RawBuffer, RawExecutable};
#[cfg(feature = "xla")]
use crate::backend::{ClientSetup, PjrtBackend};
use crate::metrics::{self, COUNTERS as C};
use crate::spmd::{Mesh, Sharding};
use crate::{Error, Result};
use lazyfuse_fusion::{Region, RegionKey};
use lazyfuse_ir::{DType, Graph, HostTensor, Literal, Shape};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

mod packs;
mod spmd;

use packs::PackCache;

/// A device-resident array. Owned by `Arc` so tensors, pending graphs and
/// in-flight regions can share it; the backend buffer is destroyed exactly
/// once when the last holder drops.
pub struct DeviceBuffer {
    place: Placement,
    /// The array's dimensions (for a sharded array, the global ones).
    pub shape: Shape,
    /// The array's element type.
    pub dtype: DType,
    /// Bytes held on devices (every shard counted).
    bytes: usize,
    /// A one-device array's copies on every device of a mesh, made when it
    /// first joins a sharded computation as replicated (`spmd.rs`).
    replicas: Mutex<Option<(Mesh, Arc<Vec<RawBuffer>>)>>,
    /// The device ordinals holding it (one, or a mesh's), each `bytes /
    /// len` of it, for the per-device byte counts.
    devices: SmallVec<[u16; 4]>,
    /// Given to an execution that reuses its memory for a result: no
    /// longer counted as live (see [`DeviceBuffer::donated`]).
    given: std::sync::atomic::AtomicBool,
}

/// Where a [`DeviceBuffer`]'s bytes are.
enum Placement {
    /// One array on one device.
    One(RawBuffer),
    /// One shard per mesh position, laid out as the sharding says.
    Shards(Sharding, Arc<Vec<RawBuffer>>),
}

impl DeviceBuffer {
    fn new(raw: RawBuffer, shape: Shape, dtype: DType, ordinal: usize) -> Arc<Self> {
        let bytes = shape.numel() * dtype.size_in_bytes();
        let devices = SmallVec::from_slice(&[ordinal as u16]);
        Self::with_placement(Placement::One(raw), shape, dtype, bytes, devices)
    }

    fn with_placement(
        place: Placement,
        shape: Shape,
        dtype: DType,
        bytes: usize,
        devices: SmallVec<[u16; 4]>,
    ) -> Arc<Self> {
        let each = (bytes / devices.len().max(1)) as u64;
        for &d in &devices {
            metrics::device_bytes(d as usize, each, true);
        }
        metrics::add(&C.live_buffers, 1);
        let now = C
            .live_buffer_bytes
            .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        C.peak_live_buffer_bytes
            .fetch_max(now + bytes as u64, std::sync::atomic::Ordering::Relaxed);
        Arc::new(DeviceBuffer {
            place,
            shape,
            dtype,
            bytes,
            replicas: Mutex::new(None),
            devices,
            given: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Stops counting this buffer as live: an execution was given its
    /// memory for a result, which is counted instead (held on until the
    /// job ends, the donated weights of a training step were counted twice).
    fn donated(&self) {
        if !self.given.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.uncount();
        }
    }

    /// Removes this buffer from the live counts.
    fn uncount(&self) {
        metrics::sub(&C.live_buffers, 1);
        metrics::sub(&C.live_buffer_bytes, self.bytes as u64);
        let each = (self.bytes / self.devices.len().max(1)) as u64;
        for &d in &self.devices {
            metrics::device_bytes(d as usize, each, false);
        }
    }

    /// The sharding of a sharded array (`None` for a one-device array).
    pub fn sharding(&self) -> Option<&Sharding> {
        match &self.place {
            Placement::Shards(s, _) => Some(s),
            Placement::One(_) => None,
        }
    }

    /// The one-device backend buffer (`Err` for a sharded array).
    fn one(&self) -> Result<&RawBuffer> {
        match &self.place {
            Placement::One(r) => Ok(r),
            Placement::Shards(s, _) => Err(Error::internal(format!(
                "a sharded array ({s:?}) reached a one-device computation"
            ))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some((mesh, _)) = self.replicas.get_mut().take() {
            spmd::replica_bytes(&mesh, self.bytes, false);
        }
        if !*self.given.get_mut() {
            self.uncount();
        }
    }
}

/// A compiled region, shared by every launch of its key.
pub(crate) type Executable = Arc<RawExecutable>;

type Slot = Arc<Mutex<Option<Executable>>>;

/// The in-memory executable cache: slots by key with their last-use tick.
#[derive(Default)]
struct ExeCache {
    slots: HashMap<RegionKey, (Slot, u64)>,
    tick: u64,
}

impl ExeCache {
    /// The slot of `key` (new and empty on a miss), marked as just used.
    /// Past `cap` entries the least recently used eighth goes: a region
    /// that is running holds its executable, which stays valid.
    fn slot(&mut self, key: RegionKey, cap: usize) -> Slot {
        self.tick += 1;
        let tick = self.tick;
        if let Some((slot, used)) = self.slots.get_mut(&key) {
            *used = tick;
            return slot.clone();
        }
        if self.slots.len() >= cap {
            let mut ages: Vec<u64> = self.slots.values().map(|(_, t)| *t).collect();
            let drop = (cap / 8).max(1).min(ages.len());
            ages.select_nth_unstable(drop - 1);
            let cutoff = ages[drop - 1];
            let before = self.slots.len();
            self.slots.retain(|_, (_, t)| *t > cutoff);
            metrics::add(&C.executables_evicted, (before - self.slots.len()) as u64);
        }
        let slot = Slot::default();
        self.slots.insert(key, (slot.clone(), tick));
        slot
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A backend client plus everything keyed to it.
pub struct Runtime {
    /// Process-unique id (devices compare by it).
    pub id: u32,
    backend: Box<dyn Backend>,
    /// The plugin this runtime was loaded from (`None` for the interpreter).
    plugin_path: Option<PathBuf>,
    /// Compiled executables by region key, with the tick of their last use
    /// (bounded by `config::max_executables`, least recently used out).
    cache: Mutex<ExeCache>,
    /// Uploaded scalar packs by (values, dtype, device): a loop reuses its
    /// learning rate's buffer instead of transferring it every step.
    scalars: Mutex<PackCache<Arc<DeviceBuffer>>>,
    /// Whether ops may lower to lazyfuse's built-in host kernels: an XLA
    /// CPU client, unless `LAZYFUSE_HOST_KERNELS=0` (asked once here, not
    /// per recorded op).
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    host_kernels: bool,
}

impl Runtime {
    fn new(backend: Box<dyn Backend>, plugin_path: Option<PathBuf>) -> Arc<Runtime> {
        metrics::install_exit_report();
        let host_kernels = plugin_path.is_some()
            && crate::config::host_kernels()
            && backend.platform_name().eq_ignore_ascii_case("cpu");
        Arc::new(Runtime {
            host_kernels,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            plugin_path,
            cache: Mutex::new(ExeCache::default()),
            scalars: Mutex::new(PackCache::default()),
        })
    }

    /// Loads the PJRT plugin at `path` and creates its client as `setup`
    /// says (empty for the CPU plugin; the CUDA plugin's create options and
    /// compile-option additions).
    #[cfg(feature = "xla")]
    pub(crate) fn load(path: &Path, setup: &ClientSetup) -> Result<Arc<Runtime>> {
        let backend = PjrtBackend::load(path, setup)?;
        tune_malloc();
        Ok(Runtime::new(Box::new(backend), Some(path.to_path_buf())))
    }

    /// A runtime over the reference interpreter.
    pub fn interpreter() -> Arc<Runtime> {
        Runtime::new(Box::new(InterpBackend), None)
    }

    /// The plugin file this runtime was loaded from (empty for the interpreter).
    pub fn plugin_path(&self) -> &Path {
        self.plugin_path.as_deref().unwrap_or(Path::new(""))
    }

    /// Number of addressable devices of this client.
    pub fn device_count(&self) -> usize {
        self.backend.device_count()
    }

    /// Whether ops may lower to lazyfuse's built-in host kernels here.
    #[cfg(feature = "xla")]
    pub(crate) fn runs_host_kernels(&self) -> bool {
        self.host_kernels
    }

    /// The platform name reported by the backend (`cpu`, `cuda`, `interpreter`, ...).
    pub fn platform_name(&self) -> String {
        self.backend.platform_name()
    }

    /// Copies a host array to device `ordinal`.
    pub fn upload(&self, host: &HostTensor, ordinal: usize) -> Result<Arc<DeviceBuffer>> {
        self.upload_slice(host.into(), ordinal)
    }

    /// Copies borrowed host bytes to device `ordinal` (one copy).
    pub(crate) fn upload_slice(
        &self,
        host: HostSlice<'_>,
        ordinal: usize,
    ) -> Result<Arc<DeviceBuffer>> {
        let _span = tracing::debug_span!("h2d", bytes = host.bytes.len()).entered();
        let t0 = Instant::now();
        let raw = self.backend.upload(host, ordinal)?;
        metrics::observe_since(metrics::Phase::HostToDevice, t0);
        metrics::add(&C.h2d_transfers, 1);
        metrics::add(&C.h2d_bytes, host.bytes.len() as u64);
        Ok(DeviceBuffer::new(
            raw,
            host.shape.clone(),
            host.dtype,
            ordinal,
        ))
    }

    /// A device buffer holding `values` as a rank-1 array of `dtype`: a
    /// region's lifted scalars of one dtype (cached by content, so a loop
    /// whose scalars repeat transfers nothing, and the regions of one step
    /// that share their scalars share one transfer).
    pub fn scalar_pack(
        &self,
        values: &[Literal],
        dtype: DType,
        ordinal: usize,
    ) -> Result<Arc<DeviceBuffer>> {
        let key = (SmallVec::from_slice(values), dtype, ordinal);
        if let Some(b) = self.scalars.lock().get(&key) {
            return Ok(b);
        }
        let mut bytes = Vec::with_capacity(values.len() * dtype.size_in_bytes());
        for &value in values {
            let one = lazyfuse_ir::interp::eval_op(
                &lazyfuse_ir::Op::Constant {
                    value,
                    shape: Shape::scalar(),
                    dtype,
                },
                &[],
            )
            .map_err(|e| Error::internal(format!("invalid lifted scalar: {e}")))?;
            bytes.extend_from_slice(&one.bytes);
        }
        let host = HostTensor {
            shape: Shape::new(&[values.len()]),
            dtype,
            bytes,
        };
        let b = self.upload(&host, ordinal)?;
        self.scalars.lock().insert(key, b.clone());
        Ok(b)
    }

    /// A flush begins: scalar packs no recent flush used are released
    /// (see [`packs`]).
    pub(crate) fn begin_flush(&self) {
        self.scalars.lock().next_flush();
    }

    /// Copies a device buffer back to the host.
    pub fn download(&self, buf: &DeviceBuffer) -> Result<HostTensor> {
        if let Placement::Shards(sharding, shards) = &buf.place {
            return self.assemble(buf, sharding, shards);
        }
        let mut bytes = vec![0u8; buf.bytes];
        self.download_into(buf, &mut bytes)?;
        Ok(HostTensor {
            shape: buf.shape.clone(),
            dtype: buf.dtype,
            bytes,
        })
    }

    /// `buf`'s bytes in place, when its device keeps them in host memory,
    /// dense and row-major (one device; see [`crate::HostView`]).
    pub(crate) fn host_bytes<'a>(&self, buf: &'a DeviceBuffer) -> Result<Option<&'a [u8]>> {
        let Placement::One(raw) = &buf.place else {
            return Ok(None);
        };
        Ok(self
            .backend
            .host_bytes(raw, buf.shape.rank())?
            .filter(|b| b.len() == buf.bytes))
    }

    /// Copies a device buffer into `out`, exactly its size in bytes: one
    /// copy into memory the caller owns (a Python caller's CPU tensor),
    /// none through an intermediate vector.
    pub fn download_into(&self, buf: &DeviceBuffer, out: &mut [u8]) -> Result<()> {
        if out.len() != buf.bytes {
            return Err(crate::Error::internal(format!(
                "a {}-byte buffer cannot hold a {} tensor of {} bytes",
                out.len(),
                buf.dtype,
                buf.bytes
            )));
        }
        if let Placement::Shards(sharding, shards) = &buf.place {
            out.copy_from_slice(&self.assemble(buf, sharding, shards)?.bytes);
            return Ok(());
        }
        let _span = tracing::debug_span!("d2h", bytes = buf.bytes).entered();
        let t0 = Instant::now();
        let in_place = self.backend.download(buf.one()?, out)?;
        metrics::observe_since(metrics::Phase::DeviceToHost, t0);
        metrics::add(&C.d2h_transfers, 1);
        metrics::add(&C.d2h_in_place, u64::from(in_place));
        metrics::add(&C.d2h_bytes, out.len() as u64);
        Ok(())
    }

    /// The executable for `region` (key `region.key`), compiling it on a
    /// miss. Threads missing the same key wait for one compile; a failed
    /// compile is not cached. `on_compile` runs just before real compile
    /// work (not on a hit, nor on a persistent-cache load).
    pub(crate) fn compile_or_fetch(
        &self,
        graph: &Graph,
        region: &Region,
        mut on_compile: impl FnMut(),
    ) -> Result<Executable> {
        let key = region.key;
        self.cached(key, || {
            self.backend.compile(key, graph, region, &mut on_compile)
        })
    }

    /// The executable of `key` from the in-memory cache, else made by
    /// `make` and cached (threads missing one key wait for one `make`; a
    /// failure is not cached).
    fn cached(
        &self,
        key: RegionKey,
        make: impl FnOnce() -> Result<RawExecutable>,
    ) -> Result<Executable> {
        let slot = self
            .cache
            .lock()
            .slot(key, crate::config::max_executables());
        let mut guard = slot.lock();
        if let Some(exe) = guard.as_ref() {
            metrics::add(&C.cache_hits, 1);
            return Ok(exe.clone());
        }
        let exe = Arc::new(make()?);
        *guard = Some(exe.clone());
        Ok(exe)
    }

    /// Enqueues `exe` on device `ordinal` and wraps its outputs; the
    /// returned completion must be awaited while `args` are kept alive.
    /// With `LAZYFUSE_LAUNCH_BLOCKING=1` it waits here, so a failure surfaces at
    /// the region that caused it.
    pub(crate) fn launch(
        &self,
        exe: &RawExecutable,
        args: &[&DeviceBuffer],
        donate: &[usize],
        ordinal: usize,
        outputs: &[(Shape, DType)],
    ) -> Result<(Vec<Arc<DeviceBuffer>>, Option<Completion>)> {
        let raw = args
            .iter()
            .map(|b| b.one())
            .collect::<Result<smallvec::SmallVec<[&RawBuffer; 8]>>>()?;
        let _span = tracing::debug_span!(
            "execute",
            args = args.len(),
            bytes = args.iter().map(|b| b.bytes).sum::<usize>()
        )
        .entered();
        let t0 = Instant::now();
        let (outs, done) = self.backend.execute(exe, &raw, donate, ordinal, outputs)?;
        metrics::add(&C.buffers_donated, donate.len() as u64);
        if self.backend.reuses_donated() {
            for &i in donate {
                args[i].donated();
            }
        }
        let done = self.launched(done, t0)?;
        if outs.len() != outputs.len() {
            return Err(Error::internal(format!(
                "executable returned {} outputs, expected {}",
                outs.len(),
                outputs.len()
            )));
        }
        let bufs = outs
            .into_iter()
            .zip(outputs)
            .map(|(b, (s, d))| DeviceBuffer::new(b, s.clone(), *d, ordinal))
            .collect();
        Ok((bufs, done))
    }

    /// Accounts for a launch begun at `t0`; with `LAZYFUSE_LAUNCH_BLOCKING=1`
    /// waits for it here (`None`), else hands its completion back.
    fn launched(&self, done: Completion, t0: Instant) -> Result<Option<Completion>> {
        let done = if crate::config::launch_blocking() {
            self.backend.wait(done, crate::config::wait_poll())?;
            None
        } else {
            Some(done)
        };
        metrics::add(&C.execute_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Launch, t0);
        metrics::add(&C.regions_executed, 1);
        Ok(done)
    }

    /// Waits for a launched execution (time counted as execution time).
    pub(crate) fn wait(&self, done: Completion) -> Result<()> {
        let t0 = Instant::now();
        let r = self.backend.wait(done, crate::config::wait_poll());
        metrics::add(&C.execute_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Await, t0);
        r
    }
}

/// Raises glibc's mmap and trim thresholds (unless the user set them through
/// `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`, or `LAZYFUSE_MALLOC_TUNING=0`).
/// Device buffers of a few MiB are otherwise mmapped and unmapped on every
/// step, and the page faults of re-touching fresh pages cost as much as the
/// computation (layernorm_gelu: 3.2 ms -> 1.5 ms per iteration on the CPU plugin).
#[cfg(feature = "xla")]
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if !crate::config::malloc_tuning() {
                return;
            }
            extern "C" {
                fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
            }
            const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
            const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
            // SAFETY: mallopt only changes allocator tuning parameters.
            unsafe {
                mallopt(M_MMAP_THRESHOLD, 64 << 20);
                mallopt(M_TRIM_THRESHOLD, 256 << 20);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executable_cache_drops_the_least_recently_used() {
        let mut c = ExeCache::default();
        let k = |i: u128| RegionKey(i);
        for i in 0..16 {
            c.slot(k(i), 16);
        }
        // Touch the two oldest: they are now the most recent.
        c.slot(k(0), 16);
        c.slot(k(1), 16);
        let before = metrics::snapshot().executables_evicted;
        c.slot(k(100), 16);
        // An eighth of 16 is 2: the next two oldest (2 and 3) went.
        assert_eq!(c.len(), 15);
        assert!(c.slots.contains_key(&k(0)) && c.slots.contains_key(&k(1)));
        assert!(!c.slots.contains_key(&k(2)) && !c.slots.contains_key(&k(3)));
        assert!(c.slots.contains_key(&k(100)));
        assert!(metrics::snapshot().executables_evicted >= before + 2);
    }
}
