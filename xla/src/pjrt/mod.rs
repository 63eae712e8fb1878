//! A small, safe binding to the PJRT C API, the plugin interface through which
//! lazyfuse reaches XLA.
//!
//! Why this exists instead of a general-purpose crate: lazyfuse needs only a
//! handful of operations (compile StableHLO text, move dense host arrays in and
//! out, run an executable on one device, cache executables), and it needs them
//! with strict guarantees: every PJRT object is destroyed exactly once, every
//! `PJRT_Error` becomes a Rust [`Error`] (and is freed), no panic can cross the
//! FFI boundary (the only callbacks it registers, the key-value store's of
//! [`KeyValueStore`], catch them), and the plugin library is never unloaded.
//!
//! Ownership model:
//! * [`Plugin`] is the loaded library plus its `PJRT_Api` table; it lives for
//!   the rest of the process.
//! * [`Client`] owns a `PJRT_Client`. Buffers and executables keep the client
//!   alive through a shared reference count, so the client is destroyed only
//!   after the last object created from it.
//! * [`Buffer`] and [`LoadedExecutable`] own their PJRT objects and destroy them
//!   on drop.
//!
//! All blocking operations (uploads, downloads, executions) wait for their
//! completion events before returning, so the API is synchronous and a
//! returned `Ok` means the work is done.

/// Raw bindgen output for `pjrt_c_api.h` (API 0.81); see `scripts/gen-pjrt-bindings.sh`.
pub mod sys;

/// Gives a PJRT argument struct a constructor that zero-fills it and sets
/// `struct_size` from the header's `*_STRUCT_SIZE` constant (the plugin uses
/// `struct_size` to know which fields the caller is aware of).
macro_rules! pjrt_structs {
    ($($ty:ident => $size:ident),* $(,)?) => {$(
        // The header size can never exceed the Rust layout (it is the offset of
        // the last field plus its size); checked at compile time.
        const _: () = assert!(
            ($crate::pjrt::sys::$size as usize) <= ::std::mem::size_of::<$crate::pjrt::sys::$ty>()
        );
        impl $crate::pjrt::PjrtStruct for $crate::pjrt::sys::$ty {
            fn new() -> Self {
                // SAFETY: PJRT argument structs are plain C data (pointers,
                // integers, bools, C enums, nullable function pointers); all-zero
                // is a valid value for each and means "unset" in the C API.
                let mut s: Self = unsafe { ::std::mem::zeroed() };
                s.struct_size = $crate::pjrt::sys::$size as usize;
                s
            }
        }
    )*};
}

/// Calls the `PJRT_Api` entry `$func` with `&mut $args` and converts the
/// returned `PJRT_Error*` into a [`Result`].
///
/// Before reading the function pointer it checks that the plugin's
/// `PJRT_Api.struct_size` covers it (an older plugin has a shorter table), so
/// a missing entry is an `Err`, never a read past the end of the table.
macro_rules! pjrt_call {
    ($plugin:expr, $func:ident, $args:expr) => {{
        let plugin: &$crate::pjrt::Plugin = $plugin;
        match plugin.check_entry(
            stringify!($func),
            ::std::mem::offset_of!($crate::pjrt::sys::PJRT_Api, $func),
        ) {
            Err(e) => Err(e),
            // SAFETY: the entry lies within the plugin's table (checked above);
            // the caller built `$args` with the right struct_size and valid
            // pointers for the duration of the call.
            Ok(()) => unsafe { plugin.invoke(stringify!($func), plugin.api().$func, $args) },
        }
    }};
}

// Layering: each module names only modules earlier in this list, so there
// are no cycles: `error`, `options`, `api` (plugin, events), `named` (create
// options), `inner` (the
// shared `PJRT_Client`), `buffer`, `executable`, `client` (the public handle
// that creates buffers and executables).
mod api;
mod buffer;
mod client;
mod error;
mod executable;
mod ffi;
mod hlo;
mod inner;
mod kv;
mod named;
mod options;

pub use api::Plugin;
pub use buffer::{Buffer, HostCopy};
pub use client::Client;
// Part of the binding's API even where the crate does not name them.
#[allow(unused_imports)]
pub use error::{Error, ErrorCode, Result};
pub use executable::{Completion, LoadedExecutable};
pub use ffi::register_host_handler;
pub use hlo::Collective;
pub use kv::{InMemoryKeyValueStore, KeyValueStore, KvError};
pub use named::{CreateOption, NamedValue};
pub use options::{
    compile_options_bytes, compile_options_bytes_with, spmd_compile_options_bytes, CompileOverride,
};

/// A PJRT argument struct that can be created with the right `struct_size`.
pub(crate) trait PjrtStruct: Sized {
    /// A zeroed struct whose `struct_size` is the header's `*_STRUCT_SIZE`.
    fn new() -> Self;
}

pjrt_structs! {
    PJRT_Error_Destroy_Args => PJRT_Error_Destroy_Args_STRUCT_SIZE,
    PJRT_Error_Message_Args => PJRT_Error_Message_Args_STRUCT_SIZE,
    PJRT_Error_GetCode_Args => PJRT_Error_GetCode_Args_STRUCT_SIZE,
    PJRT_Plugin_Initialize_Args => PJRT_Plugin_Initialize_Args_STRUCT_SIZE,
    PJRT_Event_Destroy_Args => PJRT_Event_Destroy_Args_STRUCT_SIZE,
    PJRT_Event_Await_Args => PJRT_Event_Await_Args_STRUCT_SIZE,
    PJRT_Event_IsReady_Args => PJRT_Event_IsReady_Args_STRUCT_SIZE,
    PJRT_NamedValue => PJRT_NamedValue_STRUCT_SIZE,
    PJRT_Client_Create_Args => PJRT_Client_Create_Args_STRUCT_SIZE,
    PJRT_KeyValueGetCallback_Args => PJRT_KeyValueGetCallback_Args_STRUCT_SIZE,
    PJRT_KeyValueTryGetCallback_Args => PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE,
    PJRT_KeyValuePutCallback_Args => PJRT_KeyValuePutCallback_Args_STRUCT_SIZE,
    PJRT_Client_Destroy_Args => PJRT_Client_Destroy_Args_STRUCT_SIZE,
    PJRT_Client_PlatformName_Args => PJRT_Client_PlatformName_Args_STRUCT_SIZE,
    PJRT_Client_PlatformVersion_Args => PJRT_Client_PlatformVersion_Args_STRUCT_SIZE,
    PJRT_Client_AddressableDevices_Args => PJRT_Client_AddressableDevices_Args_STRUCT_SIZE,
    PJRT_Device_GetDescription_Args => PJRT_Device_GetDescription_Args_STRUCT_SIZE,
    PJRT_DeviceDescription_Id_Args => PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
    PJRT_Client_Compile_Args => PJRT_Client_Compile_Args_STRUCT_SIZE,
    PJRT_Client_BufferFromHostBuffer_Args => PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
    PJRT_Program => PJRT_Program_STRUCT_SIZE,
    PJRT_Executable_Destroy_Args => PJRT_Executable_Destroy_Args_STRUCT_SIZE,
    PJRT_Executable_NumOutputs_Args => PJRT_Executable_NumOutputs_Args_STRUCT_SIZE,
    PJRT_Executable_OptimizedProgram_Args => PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE,
    PJRT_Executable_Serialize_Args => PJRT_Executable_Serialize_Args_STRUCT_SIZE,
    PJRT_Executable_DeserializeAndLoad_Args => PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_Destroy_Args => PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_GetExecutable_Args => PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
    PJRT_LoadedExecutable_Execute_Args => PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
    PJRT_ExecuteOptions => PJRT_ExecuteOptions_STRUCT_SIZE,
    PJRT_Buffer_Destroy_Args => PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
    PJRT_Buffer_ElementType_Args => PJRT_Buffer_ElementType_Args_STRUCT_SIZE,
    PJRT_Buffer_Dimensions_Args => PJRT_Buffer_Dimensions_Args_STRUCT_SIZE,
    PJRT_Buffer_ToHostBuffer_Args => PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
    PJRT_Buffer_OnDeviceSizeInBytes_Args => PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE,
    PJRT_Buffer_IsOnCpu_Args => PJRT_Buffer_IsOnCpu_Args_STRUCT_SIZE,
    PJRT_Buffer_ReadyEvent_Args => PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE,
    PJRT_Buffer_UnsafePointer_Args => PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE,
    PJRT_Buffer_GetMemoryLayout_Args => PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE,
    PJRT_Buffer_MemoryLayout => PJRT_Buffer_MemoryLayout_STRUCT_SIZE,
    PJRT_Buffer_MemoryLayout_Tiled => PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE,
}
