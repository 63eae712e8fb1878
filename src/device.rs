//! Devices: a handle to one addressable device of a backend client (a loaded
//! PJRT plugin, or the reference interpreter), together with the executor
//! that runs that client's flushed graphs. The device layer is what ties a
//! runtime and an executor together; neither owns the other.

use crate::executor::Executor;
use crate::runtime::Runtime;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where tensors live and run. Cheap to clone (one reference count: every
/// recorded tensor holds its device); devices from the same plugin share
/// one client and one compile cache.
#[derive(Clone)]
pub struct Device(Arc<DeviceParts>);

/// What a [`Device`] handle names (crate-private fields: reached through
/// the handle's `Deref` inside lazyfuse only).
#[doc(hidden)]
pub struct DeviceParts {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) executor: Arc<Executor>,
    pub(crate) ordinal: usize,
}

impl std::ops::Deref for Device {
    type Target = DeviceParts;
    fn deref(&self) -> &DeviceParts {
        &self.0
    }
}

impl Device {
    fn new(rt: Arc<Runtime>, executor: Arc<Executor>, ordinal: usize) -> Device {
        Device(Arc::new(DeviceParts {
            rt,
            executor,
            ordinal,
        }))
    }
}

/// A client and the worker running its graphs.
type Client = (Arc<Runtime>, Arc<Executor>);

/// One client per plugin file: a PJRT plugin must be initialised once per process.
fn clients() -> &'static Mutex<HashMap<PathBuf, Client>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Client>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl Device {
    /// The default device: XLA's CPU plugin (provisioned on first use), or the
    /// plugin named by `TPU_PJRT_PLUGIN`.
    pub fn cpu() -> Result<Device> {
        let path =
            crate::plugin::default_plugin_path().map_err(|e| Error::Plugin(e.to_string()))?;
        Device::from_plugin(path)
    }

    /// Device 0 of the PJRT plugin at `path` (loaded once per process).
    pub fn from_plugin(path: impl AsRef<Path>) -> Result<Device> {
        let path = path.as_ref();
        let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let mut map = clients().lock();
        let (rt, executor) = match map.get(&canon) {
            Some(c) => c.clone(),
            None => {
                let c = (Runtime::load(path)?, Executor::new());
                map.insert(canon, c.clone());
                c
            }
        };
        Ok(Device::new(rt, executor, 0))
    }

    /// The reference-interpreter device: every op runs on `lazyfuse-ir`'s
    /// interpreter (the executable definition of the ops' semantics) on host
    /// memory, through the same recording, planning and caching as any
    /// other device. Slow, needs no plugin: compare a program's numerics
    /// against it, as PyTorch users compare against CPU, or run tests on a
    /// machine without XLA.
    pub fn interpreter() -> Device {
        static I: OnceLock<Client> = OnceLock::new();
        let (rt, executor) = I
            .get_or_init(|| (Runtime::interpreter(), Executor::new()))
            .clone();
        Device::new(rt, executor, 0)
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
        Ok(Device::new(self.rt.clone(), self.executor.clone(), ordinal))
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

    /// This device's ordinal among its plugin's addressable devices.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// True when both handles name the same device of the same client.
    pub fn same_device(&self, other: &Device) -> bool {
        self.rt.id == other.rt.id && self.ordinal == other.ordinal
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
