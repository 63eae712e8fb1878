//! The PJRT client: device enumeration, compilation, host-to-device uploads
//! and executable deserialization.
//!
//! The top of the binding's module stack: it creates [`Buffer`]s and
//! [`LoadedExecutable`]s, which reach the client only through the shared
//! [`ClientInner`] and never name this module.

use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Instant;

use lazyfuse_ir::DType;

use super::api::{plugin_string, Event, Plugin};
use super::buffer::{buffer_type, dense_size, Buffer};
use super::error::{Error, Result};
use super::executable::LoadedExecutable;
use super::inner::ClientInner;
use super::named::CreateOption;
use super::options::{
    compile_options_bytes_with, platform_overrides, spmd_compile_options_bytes, CompileOverride,
};
use super::sys;
use super::PjrtStruct;

/// A PJRT client: the entry point for compiling programs and moving data to
/// the plugin's devices.
///
/// Cheap to share across threads (`Send + Sync`; PJRT clients are
/// thread-safe). Buffers and executables created from it keep the underlying
/// `PJRT_Client` alive, so dropping the `Client` handle early is fine.
pub struct Client {
    inner: Arc<ClientInner>,
    /// The serialized `CompileOptionsProto` every compile sends.
    compile_options: Vec<u8>,
    /// The debug options added to every SPMD compile (whose options are
    /// built per device set): the platform's for SPMD programs
    /// ([`platform_overrides`]), then the caller's.
    spmd_extra: Vec<CompileOverride>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin)
            .field("devices", &self.inner.device_count())
            .finish()
    }
}

impl Client {
    /// Creates a client on `plugin` with default options and enumerates its
    /// addressable devices.
    pub fn new(plugin: Arc<Plugin>) -> Result<Client> {
        Client::with_options(plugin, &[], &[])
    }

    /// Creates a client on `plugin` with the create options `options`
    /// (names and types as the plugin reads them) and compiles with
    /// lazyfuse's compile options, those of its platform
    /// ([`platform_overrides`]), and `compile` (see
    /// [`super::compile_options_bytes_with`]).
    pub fn with_options(
        plugin: Arc<Plugin>,
        options: &[CreateOption],
        compile: &[CompileOverride],
    ) -> Result<Client> {
        Client::with_store(plugin, options, compile, None)
    }

    /// [`Client::with_options`] with a key-value store for the plugin's
    /// multi-process set-up (see [`super::KeyValueStore`]): the plugin's
    /// clients in the other processes of the run (`node_id` / `num_nodes`
    /// on XLA's GPU plugin) exchange their topology through it. Plugins
    /// without cross-process collectives never call it.
    pub fn with_store(
        plugin: Arc<Plugin>,
        options: &[CreateOption],
        compile: &[CompileOverride],
        kv: Option<Arc<dyn super::KeyValueStore>>,
    ) -> Result<Client> {
        let api = plugin.api_version();
        let mut client = Client {
            inner: ClientInner::create(plugin, options, kv)?,
            compile_options: Vec::new(),
            spmd_extra: Vec::new(),
        };
        // The platform's own additions first, so the caller's win.
        let platform = client.platform_name()?;
        let with_caller = |mut extra: Vec<CompileOverride>| {
            extra.extend_from_slice(compile);
            extra
        };
        client.compile_options =
            compile_options_bytes_with(&with_caller(platform_overrides(&platform, api, false)));
        client.spmd_extra = with_caller(platform_overrides(&platform, api, true));
        Ok(client)
    }

    /// The serialized compile options this client compiles with, so caches
    /// of serialized executables can key on them.
    pub fn compile_options(&self) -> &[u8] {
        &self.compile_options
    }

    /// Registers lazyfuse's host-kernel handler with this client's plugin
    /// (once per plugin). Host kernels run on the CPU only: another
    /// platform is an `Err` naming it.
    pub fn enable_host_kernels(&self) -> Result<()> {
        let platform = self.platform_name()?;
        if !platform.eq_ignore_ascii_case("cpu") && !platform.eq_ignore_ascii_case("host") {
            return Err(super::Error::binding(format!(
                "host kernels run on the CPU plugin, not on {platform}"
            )));
        }
        crate::kernels::register_builtins().map_err(super::Error::binding)?;
        super::register_host_handler(&self.inner.plugin)
    }

    /// The platform name (e.g. `"cpu"`), for logs and for keying caches of
    /// serialized executables.
    pub fn platform_name(&self) -> Result<String> {
        let mut a = sys::PJRT_Client_PlatformName_Args::new();
        a.client = self.inner.raw.as_ptr();
        pjrt_call!(&*self.inner.plugin, PJRT_Client_PlatformName, &mut a)?;
        // SAFETY: owned by the client, valid for `platform_name_size` bytes.
        Ok(unsafe { plugin_string(a.platform_name, a.platform_name_size) })
    }

    /// The platform version string, for logs and for keying caches of
    /// serialized executables (which are only valid for the same version).
    pub fn platform_version(&self) -> Result<String> {
        let mut a = sys::PJRT_Client_PlatformVersion_Args::new();
        a.client = self.inner.raw.as_ptr();
        pjrt_call!(&*self.inner.plugin, PJRT_Client_PlatformVersion, &mut a)?;
        // SAFETY: owned by the client, valid for `platform_version_size` bytes.
        Ok(unsafe { plugin_string(a.platform_version, a.platform_version_size) })
    }

    /// Number of addressable devices; valid device indices are `0..count`.
    pub fn addressable_device_count(&self) -> usize {
        self.inner.device_count()
    }

    /// Compiles a StableHLO module given as MLIR text (generic or pretty
    /// syntax, entry function `@main`).
    ///
    /// The executable is single-replica, single-partition and portable, so
    /// [`LoadedExecutable::execute`] can run it on any addressable device. A
    /// module that does not parse or verify is an `Err` carrying the
    /// compiler's diagnostic; the client stays usable.
    pub fn compile(&self, stablehlo_text: &str) -> Result<LoadedExecutable> {
        self.compile_with(stablehlo_text, &self.compile_options)
    }

    /// The serialized options [`Client::compile_spmd`] sends for the
    /// addressable devices `devices` (for cache keys).
    pub fn spmd_compile_options(&self, devices: &[usize]) -> Result<Vec<u8>> {
        let ids = devices
            .iter()
            .map(|&d| self.inner.device_id(d, "PJRT_Client_Compile"))
            .collect::<Result<Vec<i64>>>()?;
        Ok(spmd_compile_options_bytes(&ids, &self.spmd_extra))
    }

    /// Compiles a StableHLO module with Shardy sharding attributes (an
    /// `sdy.mesh` and `#sdy.sharding`s on arguments and results) as one SPMD
    /// program over the addressable devices `devices`: XLA partitions it and
    /// inserts the collectives; partition `i` runs on `devices[i]`. Launch
    /// it with [`LoadedExecutable::launch_spmd`], one argument list (of
    /// per-device shards) per device.
    pub fn compile_spmd(
        &self,
        stablehlo_text: &str,
        devices: &[usize],
    ) -> Result<LoadedExecutable> {
        let options = self.spmd_compile_options(devices)?;
        let mut exe = self.compile_with(stablehlo_text, &options)?;
        exe.set_devices(devices.to_vec());
        Ok(exe)
    }

    /// Compiles `stablehlo_text` with the serialized compile options `options`.
    fn compile_with(&self, stablehlo_text: &str, options: &[u8]) -> Result<LoadedExecutable> {
        let start = Instant::now();
        let format = "mlir";
        let mut program = sys::PJRT_Program::new();
        // The C API declares `code` mutable for other uses; Compile only reads it.
        program.code = stablehlo_text.as_ptr().cast_mut().cast();
        program.code_size = stablehlo_text.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();

        let mut a = sys::PJRT_Client_Compile_Args::new();
        a.client = self.inner.raw.as_ptr();
        a.program = &program;
        a.compile_options = options.as_ptr().cast();
        a.compile_options_size = options.len();
        pjrt_call!(&*self.inner.plugin, PJRT_Client_Compile, &mut a)?;
        let exe = LoadedExecutable::from_raw(
            Arc::clone(&self.inner),
            a.executable,
            "PJRT_Client_Compile",
        )?;
        tracing::debug!(
            elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
            bytes = stablehlo_text.len(),
            "PJRT: compiled StableHLO module"
        );
        Ok(exe)
    }

    /// Copies a dense host array to addressable device `device` and waits
    /// until the plugin no longer reads `bytes`, so the caller may free or
    /// reuse them as soon as this returns.
    ///
    /// `bytes` is little-endian, row-major, with `dims` in elements (empty
    /// `dims` = scalar); its length must equal the dense size, otherwise
    /// `Err`. Zero-element arrays are supported.
    pub fn buffer_from_host(
        &self,
        bytes: &[u8],
        dtype: DType,
        dims: &[usize],
        device: usize,
    ) -> Result<Buffer> {
        const WHAT: &str = "PJRT_Client_BufferFromHostBuffer";
        let dev = self.inner.device(device, WHAT)?;
        let need = dense_size(dtype, dims, WHAT)?;
        if bytes.len() != need {
            return Err(Error::binding(format!(
                "{WHAT}: {} bytes given for a {dtype}{dims:?} array, which needs exactly {need}",
                bytes.len()
            )));
        }
        let dims_i64 = dims
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<std::result::Result<Vec<i64>, _>>()
            .map_err(|_| Error::binding(format!("{WHAT}: dimension in {dims:?} exceeds i64")))?;

        let plugin = &*self.inner.plugin;
        let mut a = sys::PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = self.inner.raw.as_ptr();
        a.data = bytes.as_ptr().cast();
        a.type_ = buffer_type(dtype);
        a.dims = super::api::slice_ptr(&dims_i64);
        a.num_dims = dims_i64.len();
        // Dense major-to-minor: no strides, default device layout.
        a.byte_strides = ptr::null();
        a.num_byte_strides = 0;
        // The plugin copies (or finishes with) `bytes` before the
        // done-event fires; we wait for it below.
        a.host_buffer_semantics = sys::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        a.device = dev;
        let r = pjrt_call!(plugin, PJRT_Client_BufferFromHostBuffer, &mut a);
        // Take ownership of whatever came back before inspecting `r`.
        let done = Event::new(plugin, a.done_with_host_buffer);
        let buffer = NonNull::new(a.buffer).map(|b| Buffer::from_raw(Arc::clone(&self.inner), b));
        r?;
        done.wait(WHAT)?;
        buffer.ok_or_else(|| {
            Error::binding(format!("{WHAT}: plugin returned no buffer and no error"))
        })
    }

    /// Loads an executable produced by [`LoadedExecutable::serialize`] (same
    /// plugin build and host CPU; malformed bytes are an `Err`), skipping
    /// compilation. It keeps the options it was compiled with, so it is also
    /// portable across devices. The returned executable keeps a copy of
    /// `bytes` (see [`LoadedExecutable::serialize`] for why).
    pub fn deserialize_executable(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        let mut a = sys::PJRT_Executable_DeserializeAndLoad_Args::new();
        a.client = self.inner.raw.as_ptr();
        a.serialized_executable = bytes.as_ptr().cast();
        a.serialized_executable_size = bytes.len();
        // Null options: use the ones stored in the serialized executable.
        a.overridden_serialized_compile_options = ptr::null();
        a.overridden_serialized_compile_options_size = 0;
        pjrt_call!(
            &*self.inner.plugin,
            PJRT_Executable_DeserializeAndLoad,
            &mut a
        )?;
        let mut exe = LoadedExecutable::from_raw(
            Arc::clone(&self.inner),
            a.loaded_executable,
            "PJRT_Executable_DeserializeAndLoad",
        )?;
        exe.set_source(bytes);
        Ok(exe)
    }
}
