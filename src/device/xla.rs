//! Devices of PJRT clients: the CPU plugin (provisioned on first use), any
//! plugin file, and NVIDIA GPUs through XLA's CUDA plugin. One client per
//! plugin file, made once per process (a PJRT plugin is initialised once).

use super::{ClientEntry, Device};
use crate::backend::ClientSetup;
use crate::runtime::Runtime;
use crate::{Error, Result};
use lazyfuse_xla::plugin::cuda::CudaOptions;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

impl ClientEntry {
    /// The entry of a PJRT client made as `setup` says.
    fn with_setup(rt: Arc<Runtime>, setup: ClientSetup) -> Arc<ClientEntry> {
        let processes = setup
            .distributed
            .as_ref()
            .map_or((0, 1), |d| (d.process_index, d.process_count));
        Arc::new(ClientEntry {
            rt,
            setup,
            processes,
            executors: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        })
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
    let c = ClientEntry::with_setup(Runtime::load(path, &setup)?, setup);
    map.insert(canon, c.clone());
    Ok(c)
}

impl Device {
    /// The default device: XLA's CPU plugin (provisioned on first use), or the
    /// plugin named by `LAZYFUSE_PJRT_PLUGIN`.
    pub fn cpu() -> Result<Device> {
        let path = lazyfuse_xla::plugin::default_plugin_path()
            .map_err(|e| Error::Plugin(e.to_string()))?;
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
        let path = lazyfuse_xla::plugin::default_plugin_path()
            .map_err(|e| Error::Plugin(e.to_string()))?;
        let setup = ClientSetup {
            create: vec![lazyfuse_xla::pjrt::CreateOption::new(
                "cpu_device_count",
                lazyfuse_xla::pjrt::NamedValue::Int(n as i64),
            )],
            ..ClientSetup::default()
        };
        static SIZED: OnceLock<Mutex<HashMap<usize, Arc<ClientEntry>>>> = OnceLock::new();
        let mut sized = SIZED.get_or_init(Default::default).lock();
        if let Some(c) = sized.get(&n) {
            return Ok(Device::new(c, 0));
        }
        let c = ClientEntry::with_setup(Runtime::load(&path, &setup)?, setup);
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
    /// downloaded. Then the plugin is `LAZYFUSE_PJRT_PLUGIN` if set, else the
    /// provisioned `jax-cuda13-pjrt` with NVIDIA's CUDA 13 libraries
    /// ([`lazyfuse_xla::plugin::cuda::provision`], about 1.1 GB once). All GPUs
    /// share one client (created on the first call, with its options) and
    /// one compile cache; each has its own executor.
    pub fn cuda_with(ordinal: usize, options: &CudaOptions) -> Result<Device> {
        let create = options.create_options().map_err(Error::Plugin)?;
        let info = lazyfuse_xla::plugin::cuda::driver_info().map_err(Error::Plugin)?;
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
        let (path, install) = match lazyfuse_xla::env::plugin_override() {
            Some(p) if p.is_file() => (p, None),
            Some(p) => {
                return Err(Error::Plugin(format!(
                    "{} is set to {}, but no file exists there",
                    lazyfuse_xla::env::PJRT_PLUGIN,
                    p.display()
                )))
            }
            None => {
                let i = lazyfuse_xla::plugin::cuda::provision()
                    .map_err(|e| Error::Plugin(e.to_string()))?;
                (i.plugin(), Some(i))
            }
        };
        let setup = ClientSetup {
            create,
            compile: lazyfuse_xla::plugin::cuda::compile_overrides(install.as_ref()),
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
}
