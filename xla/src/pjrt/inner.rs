//! The owned `PJRT_Client` shared by every object created from a client.
//!
//! It sits below [`super::buffer`], [`super::executable`] and
//! [`super::client`]: buffers and executables hold an `Arc<ClientInner>` to
//! keep the client alive and to reach the plugin, and only the public
//! [`super::Client`] handle names buffers and executables, so the modules
//! depend on each other in one direction.

use std::ptr::NonNull;
use std::sync::Arc;

use super::api::Plugin;
use super::error::{Error, Result};
use super::kv::{KeyValueStore, KvHook};
use super::named::{raw_named_values, CreateOption};
use super::sys;
use super::PjrtStruct;

/// The owned `PJRT_Client`, shared by the [`super::Client`] handle and every
/// buffer and executable created from it, so the client is destroyed last.
pub(crate) struct ClientInner {
    /// The plugin whose entry points every call on this client goes through.
    pub(crate) plugin: Arc<Plugin>,
    /// The client handle, destroyed on drop.
    pub(crate) raw: NonNull<sys::PJRT_Client>,
    /// Addressable devices, in the plugin's order; owned by the client.
    devices: Vec<NonNull<sys::PJRT_Device>>,
    /// The global id of each addressable device (what a compiled device
    /// assignment names), in the same order.
    ids: Vec<i64>,
    /// The key-value store the plugin may call back into for as long as
    /// the client lives (dropped after the client is destroyed).
    _kv: Option<KvHook>,
}

// SAFETY: a PJRT client is thread-safe by contract (all client entry points
// may be called concurrently); device pointers are immutable handles owned by
// the client.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl ClientInner {
    /// Creates a client on `plugin` with `options` (none: the plugin's
    /// defaults) and, when given, the key-value store `kv` for the
    /// plugin's cross-process set-up, and enumerates its addressable
    /// devices.
    pub(crate) fn create(
        plugin: Arc<Plugin>,
        options: &[CreateOption],
        kv: Option<Arc<dyn KeyValueStore>>,
    ) -> Result<Arc<ClientInner>> {
        let raw_options = raw_named_values(options);
        let mut a = sys::PJRT_Client_Create_Args::new();
        a.create_options = super::api::slice_ptr(&raw_options);
        a.num_options = raw_options.len();
        let kv = kv.map(KvHook::new);
        if let Some(hook) = &kv {
            hook.install(&mut a);
        }
        pjrt_call!(&*plugin, PJRT_Client_Create, &mut a)?;
        let raw = NonNull::new(a.client).ok_or_else(|| {
            Error::binding("PJRT_Client_Create: plugin returned no client and no error")
        })?;
        // From here on `inner`'s Drop destroys the client, also on error.
        let mut inner = ClientInner {
            plugin,
            raw,
            devices: Vec::new(),
            ids: Vec::new(),
            _kv: kv,
        };

        let mut d = sys::PJRT_Client_AddressableDevices_Args::new();
        d.client = raw.as_ptr();
        pjrt_call!(&*inner.plugin, PJRT_Client_AddressableDevices, &mut d)?;
        if d.num_addressable_devices > 0 {
            // SAFETY: the plugin returns `num_addressable_devices` device
            // pointers owned by (and living as long as) the client.
            let devs = unsafe {
                std::slice::from_raw_parts(d.addressable_devices, d.num_addressable_devices)
            };
            inner.devices = devs.iter().filter_map(|&p| NonNull::new(p)).collect();
        }
        for d in &inner.devices {
            let mut g = sys::PJRT_Device_GetDescription_Args::new();
            g.device = d.as_ptr();
            pjrt_call!(&*inner.plugin, PJRT_Device_GetDescription, &mut g)?;
            let mut i = sys::PJRT_DeviceDescription_Id_Args::new();
            i.device_description = g.device_description;
            pjrt_call!(&*inner.plugin, PJRT_DeviceDescription_Id, &mut i)?;
            inner.ids.push(i64::from(i.id));
        }
        Ok(Arc::new(inner))
    }

    /// The global id of addressable device `index`.
    pub(crate) fn device_id(&self, index: usize, what: &str) -> Result<i64> {
        self.device(index, what)?;
        Ok(self.ids[index])
    }

    /// Number of addressable devices; valid device indices are `0..count`.
    pub(crate) fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// The addressable device at `index`, or an error naming the valid range.
    pub(crate) fn device(&self, index: usize, what: &str) -> Result<*mut sys::PJRT_Device> {
        self.devices.get(index).map(|d| d.as_ptr()).ok_or_else(|| {
            Error::binding(format!(
                "{what}: device index {index} out of range (the client has {} addressable devices)",
                self.devices.len()
            ))
        })
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = sys::PJRT_Client_Destroy_Args::new();
        a.client = self.raw.as_ptr();
        let r = pjrt_call!(&*self.plugin, PJRT_Client_Destroy, &mut a);
        self.plugin.log_drop_error("client", r);
    }
}
