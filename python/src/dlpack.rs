//! DLPack export of runtime tensors (`__dlpack__`, `__dlpack_device__`):
//! `torch.from_dlpack(t)` and `numpy.from_dlpack(t)` read the value where
//! the CPU device keeps it, without a copy ([`lazyfuse::HostView`]).
//!
//! The capsule is DLPack's unversioned `dltensor` (every consumer takes
//! it). Its memory is the runtime's immutable value: consumers must only
//! read it (the README says so); the value stays allocated until the
//! consumer's tensor is freed, whatever the program does meanwhile. A
//! value the device does not keep densely in host memory (a padded
//! dynamic-shape tensor) is copied, as the protocol allows unless the
//! caller asks `copy=False`.

use crate::convert::err;
use lazyfuse::{DType, HostView, Tensor};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// `kDLCPU`: where every exported value is.
pub const DEVICE_CPU: i32 = 1;

const NAME: &CStr = c"dltensor";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a capsule owns: the bytes (lent in place or copied) and the
/// shape array the `DLTensor` points at.
struct Owner {
    _data: Data,
    _shape: Vec<i64>,
}

/// The bytes a capsule points at; held only to keep them alive.
#[allow(dead_code)]
enum Data {
    View(HostView),
    /// A copy, in 8-byte words so every dtype is aligned.
    Copy(Vec<u64>),
}

/// DLPack's type code and bit width of `d`.
fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::Bool => (6, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// Frees a managed tensor: the consumer calls it when its array dies (or
/// the capsule's destructor does, if no consumer took it).
unsafe extern "C" fn deleter(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its context were made by `Box::into_raw` in
    // `export`, and DLPack calls the deleter once.
    unsafe {
        drop(Box::from_raw((*m).manager_ctx as *mut Owner));
        drop(Box::from_raw(m));
    }
}

/// The capsule's destructor: frees the tensor unless a consumer took it
/// (renaming the capsule `used_dltensor`, and owning the deleter call).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule; `IsValid` checks the name
    // without setting an error.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) as *mut DLManagedTensor;
            deleter(m);
        }
    }
}

/// A `dltensor` capsule of `t`'s value: in place when the device keeps it
/// in host memory, else a copy (an error when `copy` is `Some(false)`);
/// always a copy when `copy` is `Some(true)`. A sync point; the GIL is
/// released while the value is computed.
pub fn export(py: Python<'_>, t: &Tensor, copy: Option<bool>) -> PyResult<Py<PyAny>> {
    let view = if copy == Some(true) {
        None
    } else {
        py.detach(|| t.host_view()).map_err(err)?
    };
    capsule(py, t, view, copy)
}

/// A capsule of `t`'s value in place when nothing else can reach it (see
/// [`HostView::sole`]), else `None`: for a value the caller is about to
/// drop its last handle to, so the capsule's consumer owns it outright
/// and may write it. A sync point.
pub fn export_sole(py: Python<'_>, t: &Tensor) -> PyResult<Option<Py<PyAny>>> {
    match py.detach(|| t.host_view()).map_err(err)? {
        Some(v) if v.sole() => capsule(py, t, Some(v), None).map(Some),
        _ => Ok(None),
    }
}

/// The capsule of `t` given its view (`None`: copy, unless `copy` forbids).
fn capsule(
    py: Python<'_>,
    t: &Tensor,
    view: Option<HostView>,
    copy: Option<bool>,
) -> PyResult<Py<PyAny>> {
    let (data, ptr) = match view {
        Some(v) => {
            let p = v.bytes().as_ptr() as *mut c_void;
            (Data::View(v), p)
        }
        None if copy == Some(false) => {
            return Err(PyBufferError::new_err(
                "lazyfuse: this tensor's value is not in host memory as dense bytes; it can only be exported as a copy",
            ));
        }
        None => {
            let len = t.numel() * t.dtype().size_in_bytes();
            let mut words = vec![0u64; len.div_ceil(8)];
            // SAFETY: u64 storage viewed as bytes, within its length.
            let dst = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, len) };
            // One copy, straight into the capsule's memory.
            py.detach(|| t.read_into(dst)).map_err(err)?;
            let p = words.as_mut_ptr() as *mut c_void;
            (Data::Copy(words), p)
        }
    };
    let mut shape: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
    let shape_ptr = shape.as_mut_ptr();
    let owner = Box::new(Owner {
        _data: data,
        _shape: shape,
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: ptr,
            device: DLDevice {
                device_type: DEVICE_CPU,
                device_id: 0,
            },
            ndim: t.dims().len() as i32,
            dtype: dl_dtype(t.dtype()),
            shape: shape_ptr,
            // Null strides: compact row-major (DLPack 0.7 and later).
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(owner) as *mut c_void,
        deleter: Some(deleter),
    });
    let m = Box::into_raw(managed);
    // SAFETY: a new capsule owning `m` under DLPack's name, with a
    // destructor that frees it unless a consumer took it.
    let capsule =
        unsafe { ffi::PyCapsule_New(m as *mut c_void, NAME.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: no capsule owns `m`.
        unsafe { deleter(m) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `capsule` is a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
