//! Loading a PJRT plugin and calling into its `PJRT_Api` table.
//!
//! Everything that touches a raw function pointer goes through
//! [`Plugin::invoke`], which turns the returned `PJRT_Error*` into a Rust
//! [`Error`] and frees it, so no other module has to remember to.

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::{Error, ErrorCode, Result};
use super::sys;
use super::PjrtStruct;

/// The oldest plugin API minor version this binding accepts.
///
/// 0.57 rearranged the `PJRT_Api` table into its current order, so older
/// plugins have an incompatible layout. Every entry and struct field the
/// binding relies on existed by then; fields added later (e.g. in
/// `PJRT_ExecuteOptions` and `PJRT_Executable_DeserializeAndLoad_Args`) are
/// left zero/null, which is also how an older plugin that does not know them
/// behaves.
pub(crate) const MIN_API_MINOR: i32 = 57;

/// Size a plugin's `PJRT_Api` must have to contain `$func` (and every entry before it).
macro_rules! api_size_covering {
    ($($func:ident),* $(,)?) => {{
        let mut max = 0;
        $(
            let end = offset_of!(sys::PJRT_Api, $func) + size_of::<sys::PJRT_Error_Destroy>();
            if end > max {
                max = end;
            }
        )*
        max
    }};
}

/// The part of `PJRT_Api` the binding calls; checked once at load time so an
/// incompatible plugin fails in [`Plugin::load`] rather than mid-computation.
const REQUIRED_API_SIZE: usize = api_size_covering!(
    PJRT_Error_Destroy,
    PJRT_Error_Message,
    PJRT_Error_GetCode,
    PJRT_Plugin_Initialize,
    PJRT_Event_Destroy,
    PJRT_Event_Await,
    PJRT_Client_Create,
    PJRT_Client_Destroy,
    PJRT_Client_PlatformName,
    PJRT_Client_PlatformVersion,
    PJRT_Client_AddressableDevices,
    PJRT_Client_Compile,
    PJRT_Client_BufferFromHostBuffer,
    PJRT_Executable_Destroy,
    PJRT_Executable_NumOutputs,
    PJRT_Executable_Serialize,
    PJRT_Executable_DeserializeAndLoad,
    PJRT_LoadedExecutable_Destroy,
    PJRT_LoadedExecutable_GetExecutable,
    PJRT_LoadedExecutable_Execute,
    PJRT_Buffer_Destroy,
    PJRT_Buffer_ElementType,
    PJRT_Buffer_Dimensions,
    PJRT_Buffer_ToHostBuffer,
    PJRT_Buffer_OnDeviceSizeInBytes,
);

/// Every plugin loaded so far, keyed by its `PJRT_Api` table. Loading the same
/// library twice must not run `PJRT_Plugin_Initialize` twice, and plugins are
/// never unloaded, so the registry only grows.
static LOADED: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

/// A loaded PJRT plugin: the shared library plus its `PJRT_Api` table.
///
/// Obtained from [`Plugin::load`] and shared (`Arc`) by every [`super::Client`]
/// created from it. The library is never unloaded (XLA plugins register global
/// state that does not survive `dlclose`), so a `Plugin` is valid for the rest
/// of the process.
pub struct Plugin {
    api: NonNull<sys::PJRT_Api>,
    version: (i32, i32),
    path: PathBuf,
}

// SAFETY: the `PJRT_Api` table is immutable after `GetPjrtApi` returns and
// lives for the whole process (the library is leaked); PJRT entry points are
// required to be callable from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as above; `Plugin` has no interior mutability.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.version)
            .finish()
    }
}

impl Plugin {
    /// Loads the PJRT plugin at `path`, checks that it speaks a compatible
    /// API version, and initializes it.
    ///
    /// Loading the same library again returns the already-loaded plugin, so
    /// `PJRT_Plugin_Initialize` runs once per process. Errors (with the path in
    /// the message) for: a missing file, a file the dynamic loader rejects, a
    /// library without `GetPjrtApi` (not a PJRT plugin), an incompatible API
    /// version or a too-short API table, and a failing plugin initialization.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        check_regular_file(path)?;

        // Held for the whole load so that concurrent loads of one plugin
        // initialize it exactly once.
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.is_empty() {
            add_strict_fp_xla_flags();
        }

        let api = open_api_table(path)?;
        if let Some(p) = loaded.iter().find(|p| p.api == api) {
            return Ok(Arc::clone(p));
        }
        let version = check_api_table(api, path)?;

        let plugin = Plugin {
            api,
            version,
            path: path.to_path_buf(),
        };
        let mut args = sys::PJRT_Plugin_Initialize_Args::new();
        pjrt_call!(&plugin, PJRT_Plugin_Initialize, &mut args)?;
        tracing::debug!(
            path = %path.display(),
            major = version.0,
            minor = version.1,
            "loaded PJRT plugin"
        );

        let plugin = Arc::new(plugin);
        loaded.push(Arc::clone(&plugin));
        Ok(plugin)
    }

    /// The plugin's PJRT C API version as `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// The function table.
    pub(crate) fn api(&self) -> &sys::PJRT_Api {
        // SAFETY: points to the plugin's static table, valid for the process;
        // only entries within `struct_size` are read (see `check_entry`).
        unsafe { self.api.as_ref() }
    }

    /// Errors unless the entry at `offset` of `PJRT_Api` lies within the
    /// plugin's table.
    pub(crate) fn check_entry(&self, name: &str, offset: usize) -> Result<()> {
        if offset + size_of::<sys::PJRT_Error_Destroy>() <= self.api().struct_size {
            Ok(())
        } else {
            Err(Error::binding(format!(
                "{name}: not provided by PJRT plugin {} (API {}.{})",
                self.path.display(),
                self.version.0,
                self.version.1
            )))
        }
    }

    /// Calls `func(args)` and converts the returned error. Use `pjrt_call!`.
    ///
    /// # Safety
    /// `func` must be an entry of this plugin's table lying within its
    /// `struct_size`, and `args` must be valid for that entry.
    pub(crate) unsafe fn invoke<A>(
        &self,
        name: &str,
        func: Option<unsafe extern "C" fn(*mut A) -> *mut sys::PJRT_Error>,
        args: &mut A,
    ) -> Result<()> {
        let func = func.ok_or_else(|| {
            Error::binding(format!(
                "{name}: the PJRT plugin {} leaves this entry null",
                self.path.display()
            ))
        })?;
        let err = func(args);
        self.check(err, name)
    }

    /// Converts a `PJRT_Error*` (null = success) into a `Result`, freeing it.
    ///
    /// # Safety
    /// `err` must be null or an error returned by this plugin and not yet freed.
    pub(crate) unsafe fn check(&self, err: *mut sys::PJRT_Error, context: &str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let api = self.api();
        let mut message = String::from("(no message)");
        if let Some(f) = api.PJRT_Error_Message {
            let mut a = sys::PJRT_Error_Message_Args::new();
            a.error = err;
            f(&mut a);
            if !a.message.is_null() {
                let bytes = std::slice::from_raw_parts(a.message.cast::<u8>(), a.message_size);
                message = String::from_utf8_lossy(bytes).into_owned();
            }
        }
        let mut code = None;
        if let Some(f) = api.PJRT_Error_GetCode {
            let mut a = sys::PJRT_Error_GetCode_Args::new();
            a.error = err;
            let e2 = f(&mut a);
            if e2.is_null() {
                code = Some(ErrorCode::from_raw(a.code));
            } else {
                self.destroy_error(e2);
            }
        }
        self.destroy_error(err);
        Err(Error {
            code,
            message: format!("{context}: {message}"),
        })
    }

    /// Frees a `PJRT_Error`.
    unsafe fn destroy_error(&self, err: *mut sys::PJRT_Error) {
        if let Some(f) = self.api().PJRT_Error_Destroy {
            let mut a = sys::PJRT_Error_Destroy_Args::new();
            a.error = err;
            f(&mut a);
        }
    }

    /// Runs a destroy-style call from a `Drop` impl: an error cannot be
    /// returned there, so it is logged.
    pub(crate) fn log_drop_error(&self, what: &str, r: Result<()>) {
        if let Err(e) = r {
            tracing::warn!(error = %e, "PJRT: failed to destroy {what}");
        }
    }
}

/// Under `LAZYFUSE_STRICT_FP=1`, adds the ISA limit to `XLA_FLAGS` before
/// the first plugin is loaded: newer CPU plugins read it from there when a
/// client is made, and ignore it in compile options (see
/// [`super::options::strict_fp_xla_flags`]). XLA parses `XLA_FLAGS` once
/// per process, so only the first load can do this; a limit the user put
/// there already is kept.
fn add_strict_fp_xla_flags() {
    let Some(flag) = super::options::strict_fp_xla_flags() else {
        return;
    };
    let mut flags = std::env::var("XLA_FLAGS").unwrap_or_default();
    if flags.contains("--xla_cpu_max_isa") {
        return;
    }
    if !flags.is_empty() {
        flags.push(' ');
    }
    flags.push_str(flag);
    // Set while holding the load lock, before any plugin code has run in
    // this process (no plugin thread can be reading the environment).
    std::env::set_var("XLA_FLAGS", flags);
}

/// Errors unless `path` is an existing regular file: checked before the
/// dynamic loader sees it, so a missing file or a directory gets its own
/// message (with the path) rather than the loader's.
fn check_regular_file(path: &Path) -> Result<()> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(Error::binding(format!(
            "cannot load PJRT plugin {shown}: not a regular file"
        ))),
        Err(e) => Err(Error::binding(format!(
            "cannot load PJRT plugin {shown}: {e}"
        ))),
    }
}

/// Loads the library at `path` for good and returns the `PJRT_Api` table
/// its `GetPjrtApi` hands out: the step that tells a PJRT plugin from any
/// other shared library.
fn open_api_table(path: &Path) -> Result<NonNull<sys::PJRT_Api>> {
    let shown = path.display();
    // SAFETY: loading a library runs its initializers; that is inherent to
    // a plugin system and the reason the path is configurable.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
        Error::binding(format!(
            "cannot load PJRT plugin {shown}: the dynamic loader rejected it: {e}"
        ))
    })?;
    // Never dlclose: plugins keep global state (threads, registrations)
    // that must outlive every object they handed out.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));

    type GetPjrtApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;
    // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
    let get_api = unsafe { lib.get::<GetPjrtApi>(b"GetPjrtApi\0") }.map_err(|e| {
        Error::binding(format!(
            "{shown} is not a PJRT plugin (no GetPjrtApi symbol): {e}"
        ))
    })?;
    // SAFETY: the plugin contract: returns a pointer to a static table (or null).
    NonNull::new(unsafe { get_api() } as *mut sys::PJRT_Api).ok_or_else(|| {
        Error::binding(format!(
            "{shown} is not a usable PJRT plugin: GetPjrtApi returned null"
        ))
    })
}

/// Checks that the table `api` of the plugin at `path` has a compatible
/// API version and holds every entry the binding calls
/// ([`REQUIRED_API_SIZE`]), so an incompatible plugin fails at load time;
/// returns the version as `(major, minor)`.
fn check_api_table(api: NonNull<sys::PJRT_Api>, path: &Path) -> Result<(i32, i32)> {
    let shown = path.display();
    // SAFETY: every PJRT_Api starts with `struct_size`.
    let size = unsafe { api.as_ref().struct_size };
    let version_end =
        offset_of!(sys::PJRT_Api, pjrt_api_version) + size_of::<sys::PJRT_Api_Version>();
    if size < version_end {
        return Err(Error::binding(format!(
            "{shown} is not a usable PJRT plugin: its PJRT_Api table is {size} bytes, \
             too small to hold a version"
        )));
    }
    // SAFETY: within the table (checked above).
    let v = unsafe { api.as_ref().pjrt_api_version };
    let version = (v.major_version, v.minor_version);
    if version.0 != sys::PJRT_API_MAJOR as i32 || version.1 < MIN_API_MINOR {
        return Err(Error::binding(format!(
            "PJRT plugin {shown} has API version {}.{}, but lazyfuse needs {}.x with x >= {} \
             (built against {}.{}); use a matching plugin",
            version.0,
            version.1,
            sys::PJRT_API_MAJOR,
            MIN_API_MINOR,
            sys::PJRT_API_MAJOR,
            sys::PJRT_API_MINOR,
        )));
    }
    if size < REQUIRED_API_SIZE {
        return Err(Error::binding(format!(
            "PJRT plugin {shown} (API {}.{}) has a {size}-byte PJRT_Api table; \
             lazyfuse needs at least {REQUIRED_API_SIZE} bytes",
            version.0, version.1,
        )));
    }
    Ok(version)
}

/// An owned `PJRT_Event`, destroyed on drop.
///
/// Every event the plugin hands out must be destroyed exactly once, whether
/// or not it was awaited; this guard makes that automatic on every path.
pub(crate) struct Event<'a> {
    plugin: &'a Plugin,
    raw: *mut sys::PJRT_Event,
}

impl<'a> Event<'a> {
    /// Takes ownership of `raw` (may be null: then there is nothing to wait for).
    pub(crate) fn new(plugin: &'a Plugin, raw: *mut sys::PJRT_Event) -> Event<'a> {
        Event { plugin, raw }
    }

    /// Blocks until the event is ready and returns its error status.
    pub(crate) fn wait(self, context: &str) -> Result<()> {
        self.wait_polling(None, context)
    }

    /// [`Event::wait`], first polling the event (yielding the core between
    /// polls) until `poll_until`: a wait that ends by then never sleeps, so
    /// neither side pays a futex wake-up and a reschedule (tens of
    /// microseconds on a loaded host, as long as a small execution itself).
    pub(crate) fn wait_polling(self, poll_until: Option<Instant>, context: &str) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        if let Some(until) = poll_until {
            while Instant::now() < until {
                let mut r = sys::PJRT_Event_IsReady_Args::new();
                r.event = self.raw;
                match pjrt_call!(self.plugin, PJRT_Event_IsReady, &mut r) {
                    Ok(()) if !r.is_ready => std::thread::yield_now(),
                    // Ready, or the plugin cannot tell: Await says which.
                    _ => break,
                }
            }
        }
        let mut a = sys::PJRT_Event_Await_Args::new();
        a.event = self.raw;
        pjrt_call!(self.plugin, PJRT_Event_Await, &mut a).map_err(|e| prefix(e, context))
        // `self` drops here and destroys the event.
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut a = sys::PJRT_Event_Destroy_Args::new();
        a.event = self.raw;
        let r = pjrt_call!(self.plugin, PJRT_Event_Destroy, &mut a);
        self.plugin.log_drop_error("event", r);
    }
}

/// Adds which operation an event belonged to.
fn prefix(mut e: Error, context: &str) -> Error {
    e.message = format!("{context}: {}", e.message);
    e
}

/// Reads a `(pointer, length)` string the plugin returned.
///
/// # Safety
/// `ptr` must be null or valid for `len` bytes.
pub(crate) unsafe fn plugin_string(ptr: *const std::ffi::c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    String::from_utf8_lossy(std::slice::from_raw_parts(ptr.cast::<u8>(), len)).into_owned()
}

/// A pointer for a possibly-empty slice that C code may safely receive
/// (never dangling-but-suspicious: empty slices get null).
pub(crate) fn slice_ptr<T>(s: &[T]) -> *const T {
    if s.is_empty() {
        ptr::null()
    } else {
        s.as_ptr()
    }
}
