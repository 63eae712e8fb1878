//! The NVIDIA driver, probed before a CUDA client is made.
//!
//! Why probe: the CUDA plugin and its runtime libraries are over a gigabyte
//! to provision, and without a driver the plugin can only say "No visible GPU
//! devices". Asking the driver first (`libcuda.so.1`: `cuInit`,
//! `cuDriverGetVersion`, `cuDeviceGetCount`, as `nvidia-smi` and JAX's own
//! version check do) gives one clear error naming what is missing, before
//! anything is downloaded, and the device's name for logs when it works.
//! The driver library is loaded once and never unloaded.

use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::OnceLock;

/// The driver's shared library, by its versioned soname (what the driver
/// package installs; the unversioned name is a development symlink).
pub(crate) const DRIVER_SONAME: &str = "libcuda.so.1";

/// What the driver reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// The CUDA version the driver supports, as `1000 * major + 10 * minor`.
    pub version: i32,
    /// Visible devices (after `CUDA_VISIBLE_DEVICES`).
    pub devices: usize,
    /// Name and compute capability of each visible device.
    pub names: Vec<(String, i32, i32)>,
}

/// Why there is no usable driver; [`DriverProblem::message`] says it to a user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DriverProblem {
    /// `libcuda.so.1` could not be loaded (the loader's message).
    NoLibrary(String),
    /// The library lacks a driver entry point.
    NoSymbol(&'static str, String),
    /// `cuInit` failed: its code and name.
    InitFailed(i32, String),
    /// The driver sees no device.
    NoDevice,
}

impl DriverProblem {
    /// One sentence naming what is missing and what to do.
    pub(crate) fn message(&self) -> String {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES")
            .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"))
            .unwrap_or_default();
        match self {
            DriverProblem::NoLibrary(e) => format!(
                "no NVIDIA driver: {DRIVER_SONAME} cannot be loaded ({e}); Device::cuda needs an \
                 NVIDIA GPU with its driver installed (driver 580 or newer for the provisioned \
                 CUDA 13 plugin); use Device::cpu() on this machine"
            ),
            DriverProblem::NoSymbol(sym, e) => format!(
                "the NVIDIA driver library {DRIVER_SONAME} has no {sym} ({e}); it is not a \
                 working CUDA driver"
            ),
            DriverProblem::InitFailed(code, name) => format!(
                "the NVIDIA driver is installed but cuInit failed with {name} ({code}){visible}: \
                 no usable GPU (is one present, and is the kernel module loaded?)"
            ),
            DriverProblem::NoDevice => {
                format!("the NVIDIA driver is installed but sees no CUDA device{visible}")
            }
        }
    }
}

/// The driver's answer, probed once per process.
pub(crate) fn probe() -> Result<DriverInfo, DriverProblem> {
    static P: OnceLock<Result<DriverInfo, DriverProblem>> = OnceLock::new();
    P.get_or_init(probe_now).clone()
}

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuErrorName = unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR` (cuda.h).
const CC_MAJOR: c_int = 75;
const CC_MINOR: c_int = 76;

fn probe_now() -> Result<DriverInfo, DriverProblem> {
    // SAFETY: loading the system's CUDA driver runs its initialisers, which
    // have no preconditions; the handle is leaked so symbols stay valid.
    let lib = unsafe { Library::new(DRIVER_SONAME) }
        .map_err(|e| DriverProblem::NoLibrary(e.to_string()))?;
    let lib: &'static Library = Box::leak(Box::new(lib));
    fn sym<T>(
        lib: &'static Library,
        name: &'static str,
    ) -> Result<Symbol<'static, T>, DriverProblem> {
        // SAFETY: each name is looked up with its prototype from cuda.h.
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map_err(|e| DriverProblem::NoSymbol(name, e.to_string()))
    }
    let init = sym::<CuInit>(lib, "cuInit")?;
    let version = sym::<CuIntOut>(lib, "cuDriverGetVersion")?;
    let count = sym::<CuIntOut>(lib, "cuDeviceGetCount")?;
    let error_name = sym::<CuErrorName>(lib, "cuGetErrorName")?;
    let device_get = sym::<CuDeviceGet>(lib, "cuDeviceGet")?;
    let device_name = sym::<CuDeviceGetName>(lib, "cuDeviceGetName")?;
    let attribute = sym::<CuDeviceGetAttribute>(lib, "cuDeviceGetAttribute")?;

    let name_of = |code: c_int| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string, or
        // fails and leaves it null.
        if unsafe { error_name(code, &mut p) } == 0 && !p.is_null() {
            // SAFETY: non-null and NUL-terminated (static driver string).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "an unknown CUDA error".to_string()
        }
    };
    // SAFETY: flags must be 0; cuInit may be called any number of times.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(DriverProblem::InitFailed(rc, name_of(rc)));
    }
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    unsafe { version(&mut v) };
    let mut n: c_int = 0;
    // SAFETY: writes one int; cuInit succeeded.
    let rc = unsafe { count(&mut n) };
    if rc != 0 {
        return Err(DriverProblem::InitFailed(rc, name_of(rc)));
    }
    if n <= 0 {
        return Err(DriverProblem::NoDevice);
    }
    let mut names = Vec::new();
    for i in 0..n {
        let mut dev: c_int = 0;
        let mut buf = [0 as c_char; 256];
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `i` is below the device count; the name buffer is 256 bytes
        // and the driver NUL-terminates within the length it is given.
        let name = unsafe {
            if device_get(&mut dev, i) != 0 || device_name(buf.as_mut_ptr(), 255, dev) != 0 {
                format!("CUDA device {i}")
            } else {
                attribute(&mut major, CC_MAJOR, dev);
                attribute(&mut minor, CC_MINOR, dev);
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
            }
        };
        names.push((name, major, minor));
    }
    Ok(DriverInfo {
        version: v,
        devices: n as usize,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_is_missing() {
        let m = DriverProblem::NoLibrary("libcuda.so.1: cannot open shared object file".into())
            .message();
        assert!(
            m.contains("no NVIDIA driver") && m.contains(DRIVER_SONAME),
            "{m}"
        );
        assert!(m.contains("Device::cpu()"), "{m}");
        let m = DriverProblem::InitFailed(100, "CUDA_ERROR_NO_DEVICE".into()).message();
        assert!(
            m.contains("cuInit failed with CUDA_ERROR_NO_DEVICE (100)"),
            "{m}"
        );
        let m = DriverProblem::NoDevice.message();
        assert!(m.contains("sees no CUDA device"), "{m}");
        let m = DriverProblem::NoSymbol("cuInit", "undefined symbol".into()).message();
        assert!(m.contains("has no cuInit"), "{m}");
    }
}
