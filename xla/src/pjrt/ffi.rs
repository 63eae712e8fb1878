//! Host kernels: Rust functions XLA calls as typed-FFI custom calls.
//!
//! lazyfuse registers one handler with the plugin, [`HOST_TARGET`], through
//! the PJRT FFI extension's `register_handler`. A region that runs a host
//! kernel calls that target with the kernel's name as an attribute; the
//! handler (a trampoline) looks the name up in the IR's host-kernel
//! registry and calls the function on the call's buffers. One target for
//! every kernel means registration never depends on which kernels a
//! program uses, and a compiled executable taken from the persistent cache
//! finds its kernels by name in the new process.
//!
//! The XLA FFI C API (`xla/ffi/api/c_api.h`) is not shipped with the
//! plugin wheel, so its few structs are written out here, `#[repr(C)]`
//! with their offsets asserted; the call frame is versioned by
//! `struct_size` and only fields every version has are read. No panic
//! crosses back into XLA: the kernel runs under `catch_unwind`, and a
//! kernel's `Err` or panic becomes an XLA FFI error, which fails the
//! execution with the message (the runtime stays usable).

use super::{sys, Error, Plugin, Result};
use crate::lower::{HOST_KERNEL_ATTR, HOST_TARGET};
use lazyfuse_ir::{host_kernels, DType, HostArg, HostOut};
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// `XLA_FFI_Extension_Base`.
#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: i32,
    next: *mut ExtensionBase,
}

/// `XLA_FFI_Extension_Metadata`: the extension type of the metadata query
/// XLA makes when a handler is registered.
const EXTENSION_METADATA: i32 = 1;

/// `XLA_FFI_Api_Version`.
#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    major: i32,
    minor: i32,
}

/// `XLA_FFI_Metadata`.
#[repr(C)]
struct Metadata {
    struct_size: usize,
    api_version: ApiVersion,
    traits: u32,
}

/// `XLA_FFI_Metadata_Extension`.
#[repr(C)]
struct MetadataExtension {
    base: ExtensionBase,
    metadata: *mut Metadata,
}

/// `XLA_FFI_Args` / `XLA_FFI_Rets` (same layout).
#[repr(C)]
struct Values {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *mut i32,
    values: *mut *mut c_void,
}

/// `XLA_FFI_Attrs`.
#[repr(C)]
struct Attrs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *mut i32,
    names: *mut *mut ByteSpan,
    attrs: *mut *mut c_void,
}

/// `XLA_FFI_ByteSpan`.
#[repr(C)]
struct ByteSpan {
    ptr: *const c_char,
    len: usize,
}

/// `XLA_FFI_CallFrame` (up to `attrs`, the last field of every version).
#[repr(C)]
struct CallFrame {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api: *const Api,
    ctx: *mut c_void,
    stage: i32,
    args: Values,
    rets: Values,
    attrs: Attrs,
}

/// `XLA_FFI_Buffer`.
#[repr(C)]
struct Buffer {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    dtype: i32,
    data: *mut c_void,
    rank: i64,
    dims: *mut i64,
}

/// `XLA_FFI_Error_Create_Args`.
#[repr(C)]
struct ErrorCreateArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    message: *const c_char,
    errc: i32,
}

/// The head of `XLA_FFI_Api`, up to `XLA_FFI_Error_Create`.
#[repr(C)]
struct Api {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api_version: ApiVersion,
    internal_api: *mut c_void,
    error_create: Option<unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut c_void>,
}

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(CallFrame, stage) == 32);
    assert!(offset_of!(CallFrame, args) == 40);
    assert!(offset_of!(CallFrame, rets) == 80);
    assert!(offset_of!(CallFrame, attrs) == 120);
    assert!(std::mem::size_of::<CallFrame>() == 168);
    assert!(offset_of!(Buffer, dims) == 40);
    assert!(offset_of!(Api, error_create) == 48);
    assert!(offset_of!(Metadata, traits) == 32);
};

/// `XLA_FFI_ExecutionStage_EXECUTE`.
const STAGE_EXECUTE: i32 = 3;
/// `XLA_FFI_ArgType_BUFFER` / `XLA_FFI_RetType_BUFFER`.
const TYPE_BUFFER: i32 = 1;
/// `XLA_FFI_AttrType_STRING`.
const ATTR_STRING: i32 = 4;
/// `XLA_FFI_Error_Code_INTERNAL` / `INVALID_ARGUMENT`.
const ERRC_INTERNAL: i32 = 13;
const ERRC_INVALID_ARGUMENT: i32 = 3;
/// The FFI API version the structs above are written against.
const FFI_API: (i32, i32) = (0, 1);

/// `PJRT_FFI_Extension` with `register_handler` (the plugin's FFI
/// extension is 48 bytes when it has it).
#[repr(C)]
struct PjrtFfiExtension {
    base: sys::PJRT_Extension_Base,
    type_id_register: *mut c_void,
    user_data_add: *mut c_void,
    register_handler: Option<unsafe extern "C" fn(*mut RegisterArgs) -> *mut sys::PJRT_Error>,
}

/// `PJRT_FFI_Register_Handler_Args` as PJRT 0.81 reads it (checked
/// against the plugin: at least 52 bytes; the handler at offset 24).
#[repr(C)]
struct RegisterArgs {
    struct_size: usize,
    target_name: *const c_char,
    target_name_size: usize,
    handler: *const c_void,
    platform_name: *const c_char,
    platform_name_size: usize,
    traits: u32,
}

/// Plugins (by table address) the handler is registered with.
static REGISTERED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Registers lazyfuse's host-kernel handler with `plugin` for its CPU
/// platform, once per plugin. An `Err` (naming the plugin) when the plugin
/// has no FFI extension that can register handlers.
pub fn register_host_handler(plugin: &Plugin) -> Result<()> {
    let api = plugin.api() as *const sys::PJRT_Api as usize;
    let mut done = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if done.contains(&api) {
        return Ok(());
    }
    let (major, minor) = plugin.api_version();
    let unsupported = || {
        Error::binding(format!(
            "host kernels need the PJRT FFI extension with handler registration, which this plugin (PJRT {major}.{minor}) lacks"
        ))
    };
    let mut ext = plugin.api().extension_start;
    // SAFETY: the extension chain is the plugin's static data; each entry
    // is read only within its own struct_size.
    let register = unsafe {
        loop {
            let Some(e) = ext.as_ref() else {
                return Err(unsupported());
            };
            if e.type_ == sys::PJRT_Extension_Type_FFI {
                if e.struct_size < std::mem::size_of::<PjrtFfiExtension>() {
                    return Err(unsupported());
                }
                let ffi = &*(ext as *const PjrtFfiExtension);
                break ffi.register_handler.ok_or_else(unsupported)?;
            }
            ext = e.next;
        }
    };
    let (target, platform) = (HOST_TARGET, "Host");
    let mut args = RegisterArgs {
        struct_size: std::mem::size_of::<RegisterArgs>(),
        target_name: target.as_ptr().cast(),
        target_name_size: target.len(),
        handler: trampoline as *const c_void,
        platform_name: platform.as_ptr().cast(),
        platform_name_size: platform.len(),
        traits: 0,
    };
    // SAFETY: `register` is the plugin's entry, `args` is laid out as it
    // reads it, and the strings outlive the call (XLA copies them).
    unsafe { plugin.check(register(&mut args), "PJRT_FFI_Register_Handler")? };
    done.push(api);
    Ok(())
}

/// The FFI handler XLA calls for every host-kernel custom call.
unsafe extern "C" fn trampoline(frame: *mut CallFrame) -> *mut c_void {
    let Some(frame) = frame.as_mut() else {
        return std::ptr::null_mut();
    };
    // Registration asks for the handler's metadata: its API version.
    let mut ext = frame.extension_start;
    while let Some(e) = ext.as_ref() {
        if e.kind == EXTENSION_METADATA {
            let m = &*(ext as *const MetadataExtension);
            if let Some(md) = m.metadata.as_mut() {
                md.api_version.major = FFI_API.0;
                md.api_version.minor = FFI_API.1;
                md.traits = 0;
            }
            return std::ptr::null_mut();
        }
        ext = e.next;
    }
    if frame.stage != STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    let result = catch_unwind(AssertUnwindSafe(|| execute(frame)))
        .unwrap_or_else(|_| Err((ERRC_INTERNAL, "the host kernel panicked".to_string())));
    match result {
        Ok(()) => std::ptr::null_mut(),
        Err((code, message)) => ffi_error(frame.api, code, &message),
    }
}

/// Runs the kernel the frame names on its buffers.
unsafe fn execute(frame: &CallFrame) -> std::result::Result<(), (i32, String)> {
    let bad = |m: String| (ERRC_INVALID_ARGUMENT, m);
    let name = kernel_name(&frame.attrs).ok_or_else(|| {
        bad(format!(
            "a {HOST_TARGET} call without its {HOST_KERNEL_ATTR} attribute"
        ))
    })?;
    let f = host_kernels::lookup(&name).ok_or_else(|| {
        bad(format!(
            "no host kernel {name:?} is registered in this process"
        ))
    })?;
    let args = buffers(&frame.args).map_err(bad)?;
    let rets = buffers(&frame.rets).map_err(bad)?;
    let [ret] = rets.as_slice() else {
        return Err(bad(format!(
            "host kernel {name:?} has {} results, expected 1",
            rets.len()
        )));
    };
    let views: Vec<HostArg<'_>> = args
        .iter()
        .map(|b| HostArg {
            dtype: b.dtype,
            dims: &b.dims,
            bytes: std::slice::from_raw_parts(b.data, b.len),
        })
        .collect();
    let mut out = HostOut {
        dtype: ret.dtype,
        dims: &ret.dims,
        bytes: std::slice::from_raw_parts_mut(ret.data, ret.len),
    };
    f.call(&views, &mut out)
        .map_err(|e| (ERRC_INTERNAL, format!("host kernel {name}: {e}")))
}

/// A buffer of the call, in host memory.
struct Raw {
    dtype: DType,
    dims: Vec<usize>,
    data: *mut u8,
    len: usize,
}

/// The buffers of `values` (arguments or results).
unsafe fn buffers(values: &Values) -> std::result::Result<Vec<Raw>, String> {
    let n = usize::try_from(values.size).map_err(|_| "a negative buffer count".to_string())?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if *values.types.add(i) != TYPE_BUFFER {
            return Err(format!("operand {i} is not a buffer"));
        }
        let b = &*(*values.values.add(i) as *const Buffer);
        let dtype =
            dtype(b.dtype).ok_or_else(|| format!("operand {i} has XLA type {}", b.dtype))?;
        let rank = usize::try_from(b.rank).map_err(|_| "a negative rank".to_string())?;
        let dims: Vec<usize> = (0..rank).map(|d| *b.dims.add(d) as usize).collect();
        let len = dims.iter().product::<usize>() * dtype.size_in_bytes();
        let data = if len == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            b.data.cast()
        };
        out.push(Raw {
            dtype,
            dims,
            data,
            len,
        });
    }
    Ok(out)
}

/// The kernel name attribute of the call.
unsafe fn kernel_name(attrs: &Attrs) -> Option<String> {
    for i in 0..usize::try_from(attrs.size).ok()? {
        let name = &**attrs.names.add(i);
        let name = std::slice::from_raw_parts(name.ptr.cast::<u8>(), name.len);
        if name == HOST_KERNEL_ATTR.as_bytes() && *attrs.types.add(i) == ATTR_STRING {
            let s = &*(*attrs.attrs.add(i) as *const ByteSpan);
            let s = std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len);
            return Some(String::from_utf8_lossy(s).into_owned());
        }
    }
    None
}

/// The IR dtype of an `XLA_FFI_DataType` (xla::PrimitiveType numbering).
fn dtype(t: i32) -> Option<DType> {
    Some(match t {
        1 => DType::Bool,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::U8,
        10 => DType::F16,
        11 => DType::F32,
        12 => DType::F64,
        16 => DType::BF16,
        _ => return None,
    })
}

/// An XLA FFI error carrying `message` (XLA takes ownership).
unsafe fn ffi_error(api: *const Api, code: i32, message: &str) -> *mut c_void {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    match api.as_ref().and_then(|a| a.error_create) {
        Some(create) => {
            let mut args = ErrorCreateArgs {
                struct_size: std::mem::size_of::<ErrorCreateArgs>(),
                extension_start: std::ptr::null_mut(),
                message: message.as_ptr(),
                errc: code,
            };
            create(&mut args)
        }
        // No way to report: XLA would read a null error as success, so
        // abort rather than hand back an unwritten result.
        None => std::process::abort(),
    }
}
