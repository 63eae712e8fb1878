//! One loaded PJRT client with its compile cache: the only place that talks to
//! the device. Shared by every thread and every tensor of a [`crate::Device`].

use crate::executor::Executor;
use crate::metrics::{self, C};
use crate::pjrt;
use crate::{Error, Result};
use lazyfuse_fusion::RegionKey;
use lazyfuse_ir::{DType, HostTensor, Literal, Shape};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A device-resident array. Owned by `Arc` so tensors, pending graphs and
/// in-flight regions can share it; the PJRT buffer is destroyed exactly once
/// when the last holder drops.
pub struct DeviceBuffer {
    buf: pjrt::Buffer,
    pub shape: Shape,
    pub dtype: DType,
    bytes: usize,
}

impl DeviceBuffer {
    fn new(buf: pjrt::Buffer, shape: Shape, dtype: DType) -> Arc<Self> {
        let bytes = shape.numel() * dtype.size_in_bytes();
        metrics::add(&C.live_buffers, 1);
        metrics::add(&C.live_buffer_bytes, bytes as u64);
        Arc::new(DeviceBuffer {
            buf,
            shape,
            dtype,
            bytes,
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        metrics::sub(&C.live_buffers, 1);
        metrics::sub(&C.live_buffer_bytes, self.bytes as u64);
    }
}

type Slot = Arc<Mutex<Option<Arc<pjrt::LoadedExecutable>>>>;

/// A PJRT client plus everything keyed to it.
pub struct Runtime {
    /// Process-unique id (devices compare by it).
    pub id: u32,
    /// The plugin this runtime was loaded from.
    plugin_path: PathBuf,
    client: pjrt::Client,
    cache: Mutex<HashMap<RegionKey, Slot>>,
    /// Uploaded lifted scalars by (bits, dtype, device): a loop reuses its
    /// learning rate's buffer instead of transferring it every step.
    scalars: Mutex<ScalarCache>,
    executor: Arc<Executor>,
}

type ScalarCache =
    HashMap<(Literal, DType, usize), Arc<DeviceBuffer>, BuildHasherDefault<ahash::AHasher>>;

/// Bound on cached scalar buffers (cleared when exceeded: values like a
/// per-step bias correction would otherwise accumulate forever).
const MAX_CACHED_SCALARS: usize = 4096;

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

impl Runtime {
    /// Loads the plugin at `path` and creates its client.
    pub fn load(path: &Path) -> Result<Arc<Runtime>> {
        let plugin = pjrt::Plugin::load(path).map_err(|e| {
            Error::Plugin(format!(
                "cannot load {}: {e}. Set TPU_PJRT_PLUGIN=/path/to/a/pjrt_plugin.so, or unset it to use the provisioned CPU plugin",
                path.display()
            ))
        })?;
        let client = pjrt::Client::new(plugin).map_err(|e| {
            Error::Plugin(format!(
                "cannot create a client from {}: {e}",
                path.display()
            ))
        })?;
        metrics::install_exit_report();
        tune_malloc();
        let rt = Arc::new(Runtime {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            plugin_path: path.to_path_buf(),
            client,
            cache: Mutex::new(HashMap::new()),
            scalars: Mutex::new(ScalarCache::default()),
            executor: Arc::new(Executor::default()),
        });
        drain_at_exit(&rt);
        Ok(rt)
    }

    /// The plugin file this runtime was loaded from.
    pub fn plugin_path(&self) -> &Path {
        &self.plugin_path
    }

    /// The worker that runs this runtime's flushed graphs in order.
    pub(crate) fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }

    /// Number of addressable devices of this client.
    pub fn device_count(&self) -> usize {
        self.client.addressable_device_count()
    }

    /// The platform name reported by the plugin (`cpu`, `cuda`, ...).
    pub fn platform_name(&self) -> String {
        self.client
            .platform_name()
            .unwrap_or_else(|_| "unknown".into())
    }

    /// Copies a host array to device `ordinal`.
    pub fn upload(&self, host: &HostTensor, ordinal: usize) -> Result<Arc<DeviceBuffer>> {
        let _span = tracing::debug_span!("h2d", bytes = host.bytes.len()).entered();
        let t0 = Instant::now();
        let buf =
            self.client
                .buffer_from_host(&host.bytes, host.dtype, host.shape.dims(), ordinal)?;
        metrics::observe_since(metrics::Phase::HostToDevice, t0);
        metrics::add(&C.h2d_transfers, 1);
        metrics::add(&C.h2d_bytes, host.bytes.len() as u64);
        Ok(DeviceBuffer::new(buf, host.shape.clone(), host.dtype))
    }

    /// A device buffer holding the rank-0 `value` of `dtype` (cached).
    pub fn scalar(
        &self,
        value: Literal,
        dtype: DType,
        ordinal: usize,
    ) -> Result<Arc<DeviceBuffer>> {
        let key = (value, dtype, ordinal);
        if let Some(b) = self.scalars.lock().get(&key) {
            return Ok(b.clone());
        }
        let host = lazyfuse_ir::interp::eval_op(
            &lazyfuse_ir::Op::Constant {
                value,
                shape: Shape::scalar(),
                dtype,
            },
            &[],
        )
        .map_err(|e| Error::Pjrt(format!("invalid scalar: {e}")))?;
        let b = self.upload(&host, ordinal)?;
        let mut map = self.scalars.lock();
        if map.len() >= MAX_CACHED_SCALARS {
            map.clear();
        }
        map.insert(key, b.clone());
        Ok(b)
    }

    /// Copies a device buffer back to the host.
    pub fn download(&self, buf: &DeviceBuffer) -> Result<HostTensor> {
        let _span = tracing::debug_span!("d2h", bytes = buf.bytes).entered();
        let t0 = Instant::now();
        let mut bytes = vec![0u8; buf.bytes];
        buf.buf.to_host(&mut bytes)?;
        metrics::observe_since(metrics::Phase::DeviceToHost, t0);
        metrics::add(&C.d2h_transfers, 1);
        metrics::add(&C.d2h_bytes, bytes.len() as u64);
        Ok(HostTensor {
            shape: buf.shape.clone(),
            dtype: buf.dtype,
            bytes,
        })
    }

    /// The executable for `key`, compiling `lower()` on a miss. Threads missing
    /// the same key wait for one compile; a failed compile is not cached.
    /// On a miss the persistent cache (`TPU_CACHE_DIR`) is tried first;
    /// `on_compile` runs just before an actual XLA compile.
    pub fn executable(
        &self,
        key: RegionKey,
        lower: impl FnOnce() -> String,
        on_compile: impl FnOnce(),
    ) -> std::result::Result<Arc<pjrt::LoadedExecutable>, String> {
        let slot = self.cache.lock().entry(key).or_default().clone();
        let mut guard = slot.lock();
        if let Some(exe) = guard.as_ref() {
            metrics::add(&C.cache_hits, 1);
            return Ok(exe.clone());
        }
        let text = lower();
        crate::dump::region_text(key, &text);
        // Hook: persistent cache lookup.
        let t0 = Instant::now();
        if let Some(exe) = crate::persist::load(&self.client, &self.plugin_path, key, &text) {
            metrics::observe_since(metrics::Phase::DiskCacheLoad, t0);
            let exe = Arc::new(exe);
            *guard = Some(exe.clone());
            return Ok(exe);
        }
        on_compile();
        let _span = tracing::debug_span!("compile", region = %key, bytes = text.len()).entered();
        let t0 = Instant::now();
        let result = self.client.compile(&text);
        metrics::add(&C.compile_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Compile, t0);
        let exe = Arc::new(result.map_err(|e| e.to_string())?);
        metrics::add(&C.compiles, 1);
        // Hook: persistent cache store.
        crate::persist::store(&self.client, &self.plugin_path, key, &text, &exe);
        *guard = Some(exe.clone());
        Ok(exe)
    }

    /// Enqueues `exe` on device `ordinal` and wraps its outputs; the
    /// returned completion must be awaited while `args` are kept alive.
    /// With `TPU_LAUNCH_BLOCKING=1` it waits here, so a failure surfaces at
    /// the region that caused it.
    pub fn launch(
        &self,
        exe: &pjrt::LoadedExecutable,
        args: &[&DeviceBuffer],
        donate: &[usize],
        ordinal: usize,
        outputs: &[(Shape, DType)],
    ) -> std::result::Result<(Vec<Arc<DeviceBuffer>>, Option<pjrt::Completion>), String> {
        let raw: Vec<&pjrt::Buffer> = args.iter().map(|b| &b.buf).collect();
        let _span = tracing::debug_span!(
            "execute",
            args = args.len(),
            bytes = args.iter().map(|b| b.bytes).sum::<usize>()
        )
        .entered();
        let t0 = Instant::now();
        let (outs, done) = exe
            .launch(&raw, ordinal, donate)
            .map_err(|e| e.to_string())?;
        metrics::add(&C.buffers_donated, donate.len() as u64);
        let done = if crate::config::launch_blocking() {
            done.wait().map_err(|e| e.to_string())?;
            None
        } else {
            Some(done)
        };
        metrics::add(&C.execute_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Launch, t0);
        metrics::add(&C.regions_executed, 1);
        if outs.len() != outputs.len() {
            return Err(format!(
                "executable returned {} outputs, expected {}",
                outs.len(),
                outputs.len()
            ));
        }
        let bufs = outs
            .into_iter()
            .zip(outputs)
            .map(|(b, (s, d))| DeviceBuffer::new(b, s.clone(), *d))
            .collect();
        Ok((bufs, done))
    }

    /// Waits for a launched execution (time counted as execution time).
    pub fn wait(&self, done: pjrt::Completion) -> std::result::Result<(), String> {
        let t0 = Instant::now();
        let r = done.wait().map_err(|e| e.to_string());
        metrics::add(&C.execute_ns, t0.elapsed().as_nanos() as u64);
        metrics::observe_since(metrics::Phase::Await, t0);
        r
    }
}

/// Runtimes whose executors must drain before the process exits.
static DRAIN: Mutex<Vec<Arc<Executor>>> = Mutex::new(Vec::new());

extern "C" {
    fn atexit(cb: extern "C" fn()) -> i32;
}

extern "C" fn drain_executors() {
    // Work still in flight at exit would race the plugin's own teardown.
    let _ = std::panic::catch_unwind(|| {
        for e in DRAIN.lock().iter() {
            e.drain(std::time::Duration::from_secs(30));
        }
    });
}

fn drain_at_exit(rt: &Arc<Runtime>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    DRAIN.lock().push(rt.executor.clone());
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn` without captured state.
        unsafe {
            atexit(drain_executors);
        }
    });
}

/// Raises glibc's mmap and trim thresholds (unless the user set them through
/// `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`, or `LAZYFUSE_MALLOC_TUNING=0`).
/// Device buffers of a few MiB are otherwise mmapped and unmapped on every
/// step, and the page faults of re-touching fresh pages cost as much as the
/// computation (layernorm_gelu: 3.2 ms -> 1.5 ms per iteration on the CPU plugin).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let user_set = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
                .iter()
                .any(|k| std::env::var_os(k).is_some());
            let off = std::env::var("LAZYFUSE_MALLOC_TUNING").is_ok_and(|v| v.trim() == "0");
            if user_set || off {
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
