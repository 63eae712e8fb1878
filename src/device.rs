//! Devices: a handle to one addressable device of a loaded PJRT plugin.

use crate::runtime::Runtime;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where tensors live and run. Cheap to clone; devices from the same plugin
/// share one client and one compile cache.
#[derive(Clone)]
pub struct Device {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) ordinal: usize,
}

/// One runtime per plugin file: a PJRT plugin must be initialised once per process.
fn runtimes() -> &'static Mutex<HashMap<PathBuf, Arc<Runtime>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Arc<Runtime>>>> = OnceLock::new();
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
        let mut map = runtimes().lock();
        let rt = match map.get(&canon) {
            Some(rt) => rt.clone(),
            None => {
                let rt = Runtime::load(path)?;
                map.insert(canon, rt.clone());
                rt
            }
        };
        Ok(Device { rt, ordinal: 0 })
    }

    /// The same plugin's addressable device number `ordinal`.
    pub fn with_ordinal(&self, ordinal: usize) -> Result<Device> {
        let n = self.rt.device_count();
        if ordinal >= n {
            return Err(Error::Pjrt(format!(
                "device ordinal {ordinal} out of range: the plugin has {n} addressable devices"
            )));
        }
        Ok(Device {
            rt: self.rt.clone(),
            ordinal,
        })
    }

    /// Number of addressable devices of this device's plugin.
    pub fn device_count(&self) -> usize {
        self.rt.device_count()
    }

    /// The plugin file this device's client was loaded from.
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
