//! Devices: a handle to one addressable device of a backend client (a loaded
//! PJRT plugin, or the reference interpreter), together with the executor
//! that runs that client's flushed graphs. The device layer is what ties a
//! runtime and an executor together; neither owns the other.

use crate::backend::ClientSetup;
use crate::executor::Executor;
use crate::plugin::cuda::CudaOptions;
use crate::runtime::Runtime;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where tensors live and run. Free to clone (a pointer copy, no reference
/// count: every recorded tensor holds its device, and an atomic count per
/// op was a measurable part of recording); devices from the same plugin
/// share one client and one compile cache.
#[derive(Clone)]
pub struct Device(&'static DeviceParts);

/// What a [`Device`] handle names (crate-private fields: reached through
/// the handle's `Deref` inside lazyfuse only).
#[doc(hidden)]
pub struct DeviceParts {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) executor: Arc<Executor>,
    pub(crate) ordinal: usize,
    /// The client's per-device executors, for [`Device::with_ordinal`].
    client: Arc<ClientEntry>,
}

impl std::ops::Deref for Device {
    type Target = DeviceParts;
    fn deref(&self) -> &DeviceParts {
        self.0
    }
}

impl Device {
    /// Device `ordinal` of `client`. Its parts are made once per client
    /// and ordinal and kept for the rest of the process, as the client is
    /// (a plugin is never unloaded), so there are at most as many as the
    /// clients' addressable devices.
    fn new(client: &Arc<ClientEntry>, ordinal: usize) -> Device {
        let mut devices = client.devices.lock();
        let parts = *devices.entry(ordinal).or_insert_with(|| {
            Box::leak(Box::new(DeviceParts {
                rt: client.rt.clone(),
                executor: client.executor(ordinal),
                ordinal,
                client: client.clone(),
            }))
        });
        Device(parts)
    }
}

/// A client and the workers running its graphs: one per device, so that
/// work queued for one device never waits behind another's (each device
/// has its own streams in the plugin; one worker would serialise them).
struct ClientEntry {
    rt: Arc<Runtime>,
    /// What the client was created with (a later request must match).
    setup: ClientSetup,
    executors: Mutex<HashMap<usize, Arc<Executor>>>,
    /// The parts of each device handed out (see [`Device::new`]).
    devices: Mutex<HashMap<usize, &'static DeviceParts>>,
}

impl ClientEntry {
    fn new(rt: Arc<Runtime>, setup: ClientSetup) -> Arc<ClientEntry> {
        Arc::new(ClientEntry {
            rt,
            setup,
            executors: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        })
    }

    /// Device `ordinal`'s executor, started on first use.
    fn executor(&self, ordinal: usize) -> Arc<Executor> {
        // Not `or_default()`: `Executor::new` also registers the executor to
        // be drained at exit, which `Arc::default()` would skip.
        #[allow(clippy::unwrap_or_default)]
        let e = self
            .executors
            .lock()
            .entry(ordinal)
            .or_insert_with(Executor::new)
            .clone();
        e
    }
}

/// One client per plugin file: a PJRT plugin must be initialised once per process.
fn clients() -> &'static Mutex<HashMap<PathBuf, Arc<ClientEntry>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Arc<ClientEntry>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The client of the plugin at `path`, loading it on first use made as
/// `setup` says. With `exact`, an existing client made otherwise is an
/// `Err`; without, any existing client of the plugin is the answer.
fn client(path: &Path, setup: ClientSetup, exact: bool) -> Result<Arc<ClientEntry>> {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut map = clients().lock();
    if let Some(c) = map.get(&canon) {
        if exact && c.setup != setup {
            return Err(Error::Plugin(format!(
                "the client of {} was already created with other options ({:?}); a plugin has \
                 one client per process, so ask for it with the same options",
                path.display(),
                c.setup.create
            )));
        }
        return Ok(c.clone());
    }
    let c = ClientEntry::new(Runtime::load(path, &setup)?, setup);
    map.insert(canon, c.clone());
    Ok(c)
}

impl Device {
    /// The default device: XLA's CPU plugin (provisioned on first use), or the
    /// plugin named by `TPU_PJRT_PLUGIN`.
    pub fn cpu() -> Result<Device> {
        let path =
            crate::plugin::default_plugin_path().map_err(|e| Error::Plugin(e.to_string()))?;
        Device::from_plugin(path)
    }

    /// Device 0 of a CPU client with `n` logical devices (XLA's CPU plugin
    /// makes 4 by default), for meshes ([`crate::Mesh`]): the devices
    /// share the host's cores, so this tests sharded programs' correctness
    /// and communication, not their speed. Each distinct `n` is a client
    /// of its own, made once per process; `n` must be at least 1.
    pub fn cpu_with_devices(n: usize) -> Result<Device> {
        if n == 0 {
            return Err(Error::Plugin(
                "a CPU client needs at least one device".into(),
            ));
        }
        let path =
            crate::plugin::default_plugin_path().map_err(|e| Error::Plugin(e.to_string()))?;
        let setup = ClientSetup {
            create: vec![crate::pjrt::CreateOption::new(
                "cpu_device_count",
                crate::pjrt::NamedValue::Int(n as i64),
            )],
            ..ClientSetup::default()
        };
        static SIZED: OnceLock<Mutex<HashMap<usize, Arc<ClientEntry>>>> = OnceLock::new();
        let mut sized = SIZED.get_or_init(Default::default).lock();
        if let Some(c) = sized.get(&n) {
            return Ok(Device::new(c, 0));
        }
        let c = ClientEntry::new(Runtime::load(&path, &setup)?, setup);
        sized.insert(n, c.clone());
        Ok(Device::new(&c, 0))
    }

    /// Device 0 of a CPU client made as `options` says: its number of
    /// logical devices, and its place in a multi-process run. XLA's CPU
    /// plugin has no cross-process collectives, so a run of more than one
    /// process is an `Err` here, naming the plugins that have them (GPU:
    /// [`CudaOptions::distributed`]); a run of one process is the plain
    /// [`Device::cpu_with_devices`] client.
    pub fn cpu_with(options: &crate::CpuOptions) -> Result<Device> {
        if let Some(d) = &options.distributed {
            d.cpu_refusal().map_err(Error::Plugin)?;
        }
        Device::cpu_with_devices(options.devices)
    }

    /// Device 0 of the PJRT plugin at `path` (loaded once per process).
    pub fn from_plugin(path: impl AsRef<Path>) -> Result<Device> {
        Ok(Device::new(
            &client(path.as_ref(), ClientSetup::default(), false)?,
            0,
        ))
    }

    /// NVIDIA GPU `ordinal` through XLA's CUDA plugin, with the options of
    /// `LAZYFUSE_GPU_MEMORY_FRACTION`, `LAZYFUSE_GPU_PREALLOCATE` and
    /// `LAZYFUSE_GPU_ALLOCATOR` (see [`Device::cuda_with`]).
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let options = CudaOptions::from_env().map_err(Error::Plugin)?;
        Device::cuda_with(ordinal, &options)
    }

    /// NVIDIA GPU `ordinal` with client options `options`.
    ///
    /// The driver is asked first (`libcuda.so.1`), so a machine without a
    /// GPU or driver gets one `Err` naming what is missing and nothing is
    /// downloaded. Then the plugin is `TPU_PJRT_PLUGIN` if set, else the
    /// provisioned `jax-cuda13-pjrt` with NVIDIA's CUDA 13 libraries
    /// ([`crate::plugin::cuda::provision`], about 1.1 GB once). All GPUs
    /// share one client (created on the first call, with its options) and
    /// one compile cache; each has its own executor.
    pub fn cuda_with(ordinal: usize, options: &CudaOptions) -> Result<Device> {
        let create = options.create_options().map_err(Error::Plugin)?;
        let info = crate::plugin::cuda::driver_info().map_err(Error::Plugin)?;
        if ordinal >= info.devices {
            return Err(Error::Plugin(format!(
                "CUDA device {ordinal} does not exist: the driver sees {} ({})",
                info.devices,
                info.names
                    .iter()
                    .map(|(n, ..)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let (path, install) = match crate::config::plugin_override() {
            Some(p) if p.is_file() => (p, None),
            Some(p) => {
                return Err(Error::Plugin(format!(
                    "{} is set to {}, but no file exists there",
                    crate::config::PJRT_PLUGIN,
                    p.display()
                )))
            }
            None => {
                let i =
                    crate::plugin::cuda::provision().map_err(|e| Error::Plugin(e.to_string()))?;
                (i.plugin(), Some(i))
            }
        };
        let setup = ClientSetup {
            create,
            compile: crate::plugin::cuda::compile_overrides(install.as_ref()),
            distributed: options.distributed.clone(),
        };
        let dev = Device::new(&client(&path, setup, true)?, 0);
        let platform = dev.rt.platform_name();
        if platform != "cuda" {
            return Err(Error::Plugin(format!(
                "{} is a {platform} plugin, not a CUDA one; Device::cuda needs a CUDA PJRT plugin",
                path.display()
            )));
        }
        dev.with_ordinal(ordinal)
    }

    /// The reference-interpreter device: every op runs on `lazyfuse-ir`'s
    /// interpreter (the executable definition of the ops' semantics) on host
    /// memory, through the same recording, planning and caching as any
    /// other device. Slow, needs no plugin: compare a program's numerics
    /// against it, as PyTorch users compare against CPU, or run tests on a
    /// machine without XLA.
    pub fn interpreter() -> Device {
        static I: OnceLock<Arc<ClientEntry>> = OnceLock::new();
        let client =
            I.get_or_init(|| ClientEntry::new(Runtime::interpreter(), ClientSetup::default()));
        Device::new(client, 0)
    }

    /// True for [`Device::interpreter`].
    pub fn is_interpreter(&self) -> bool {
        self.rt.plugin_path().as_os_str().is_empty()
    }

    /// Process-unique id of this device's client.
    pub(crate) fn client_id(&self) -> u32 {
        self.rt.id
    }

    /// The same plugin's addressable device number `ordinal`.
    pub fn with_ordinal(&self, ordinal: usize) -> Result<Device> {
        let n = self.rt.device_count();
        if ordinal >= n {
            return Err(Error::Pjrt(format!(
                "device ordinal {ordinal} out of range: the plugin has {n} addressable devices"
            )));
        }
        Ok(Device::new(&self.client, ordinal))
    }

    /// Number of addressable devices of this device's plugin.
    pub fn device_count(&self) -> usize {
        self.rt.device_count()
    }

    /// The plugin file this device's client was loaded from (empty for the
    /// interpreter).
    pub fn plugin_path(&self) -> &Path {
        self.rt.plugin_path()
    }

    /// This process's index in its multi-process run (0 for a run of one
    /// process), as its client was created.
    pub fn process_index(&self) -> usize {
        self.client
            .setup
            .distributed
            .as_ref()
            .map_or(0, |d| d.process_index)
    }

    /// Number of processes in this client's run (1 unless it was created
    /// with [`crate::Distributed`] options).
    pub fn process_count(&self) -> usize {
        self.client
            .setup
            .distributed
            .as_ref()
            .map_or(1, |d| d.process_count)
    }

    /// This device's ordinal among its plugin's addressable devices.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// True when both handles name the same device of the same client.
    pub fn same_device(&self, other: &Device) -> bool {
        self.rt.id == other.rt.id && self.ordinal == other.ordinal
    }
}

impl crate::spmd::Mesh {
    /// A mesh with named axes over the devices of `device`'s client, in
    /// order: `&[("dp", 4)]`, or `&[("dp", 2), ("tp", 2)]` (row-major, the
    /// last axis fastest). `Err` for a mesh larger than the client (see
    /// [`Device::cpu_with_devices`]), an axis named twice or of size 0, or
    /// the interpreter device (it has no SPMD programs).
    #[track_caller]
    pub fn new(device: &Device, axes: &[(&str, usize)]) -> Result<crate::spmd::Mesh> {
        let at = std::panic::Location::caller();
        let fail = |m: String| Error::op("Mesh::new", m, format!("{device:?}"), at);
        if device.is_interpreter() {
            return Err(fail(
                "the interpreter device runs no SPMD programs; use a PJRT device".into(),
            ));
        }
        crate::spmd::Mesh::build(device.client_id(), device.device_count(), axes).map_err(fail)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.same_device(other)
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.rt.platform_name(), self.ordinal)
    }
}
