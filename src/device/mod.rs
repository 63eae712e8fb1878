//! Devices: a handle to one addressable device of a backend client (a loaded
//! PJRT plugin, or the reference interpreter), together with the executor
//! that runs that client's flushed graphs. The device layer is what ties a
//! runtime and an executor together; neither owns the other.

#[cfg(feature = "xla")]
mod xla;

#[cfg(feature = "xla")]
use crate::backend::ClientSetup;
use crate::executor::Executor;
use crate::random::{Generator, Key};
use crate::runtime::Runtime;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
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
    /// The seeded generator of [`Device::next_key`].
    rng: Generator,
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
                rng: Generator::new(),
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
    #[cfg(feature = "xla")]
    setup: ClientSetup,
    /// This process's index in its run, and the number of processes.
    processes: (usize, usize),
    executors: Mutex<HashMap<usize, Arc<Executor>>>,
    /// The parts of each device handed out (see [`Device::new`]).
    devices: Mutex<HashMap<usize, &'static DeviceParts>>,
}

impl ClientEntry {
    /// The entry of the interpreter's client (one process, no options).
    fn interpreter(rt: Arc<Runtime>) -> Arc<ClientEntry> {
        Arc::new(ClientEntry {
            rt,
            #[cfg(feature = "xla")]
            setup: ClientSetup::default(),
            processes: (0, 1),
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

impl Device {
    /// The reference-interpreter device: every op runs on `lazyfuse-ir`'s
    /// interpreter (the executable definition of the ops' semantics) on host
    /// memory, through the same recording, planning and caching as any
    /// other device. Slow, needs no plugin: compare a program's numerics
    /// against it, as PyTorch users compare against CPU, or run tests on a
    /// machine without XLA.
    pub fn interpreter() -> Device {
        static I: OnceLock<Arc<ClientEntry>> = OnceLock::new();
        let client = I.get_or_init(|| ClientEntry::interpreter(Runtime::interpreter()));
        Device::new(client, 0)
    }

    /// True for [`Device::interpreter`].
    pub fn is_interpreter(&self) -> bool {
        self.rt.plugin_path().as_os_str().is_empty()
    }

    /// True when ops may lower to lazyfuse's built-in host kernels here: an
    /// XLA CPU client, unless `LAZYFUSE_HOST_KERNELS=0`.
    #[cfg(feature = "xla")]
    pub(crate) fn runs_host_kernels(&self) -> bool {
        self.rt.runs_host_kernels()
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
        self.client.processes.0
    }

    /// Number of processes in this client's run (1 unless it was created
    /// with [`crate::Distributed`] options).
    pub fn process_count(&self) -> usize {
        self.client.processes.1
    }

    /// This device's ordinal among its plugin's addressable devices.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// True when both handles name the same device of the same client.
    pub fn same_device(&self, other: &Device) -> bool {
        self.rt.id == other.rt.id && self.ordinal == other.ordinal
    }

    /// Seeds this device's generator (PyTorch's `manual_seed`): the keys
    /// [`Device::next_key`] draws after it are a function of `seed` alone.
    pub fn manual_seed(&self, seed: u64) {
        self.rng.manual_seed(seed);
    }

    /// The next key of this device's generator, for any random function
    /// (`Tensor::rand(dims, dev.next_key(), &dev)`). Seeded with 0 until
    /// [`Device::manual_seed`] is called.
    pub fn next_key(&self) -> Key {
        self.rng.next_key()
    }
}

impl crate::spmd::MeshDevices for Device {
    fn mesh_devices(&self) -> std::result::Result<(u32, usize), String> {
        if self.is_interpreter() {
            return Err("the interpreter device runs no SPMD programs; use a PJRT device".into());
        }
        Ok((self.client_id(), self.device_count()))
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
