//! Device buffers: the owned `PJRT_Buffer` handle, host downloads (in place
//! when the buffer is host memory), and the mapping between lazyfuse dtypes
//! and PJRT element types.

use std::ptr::NonNull;
use std::sync::Arc;

use lazyfuse_ir::DType;

use super::api::Event;
use super::error::{Error, Result};
use super::inner::ClientInner;
use super::sys;
use super::PjrtStruct;

/// The PJRT element type that stores `dtype` (same bit layout as lazyfuse's
/// dense little-endian host representation; `Bool` is one byte per element).
pub(crate) fn buffer_type(dtype: DType) -> sys::PJRT_Buffer_Type {
    match dtype {
        DType::F32 => sys::PJRT_Buffer_Type_F32,
        DType::F64 => sys::PJRT_Buffer_Type_F64,
        DType::BF16 => sys::PJRT_Buffer_Type_BF16,
        DType::F16 => sys::PJRT_Buffer_Type_F16,
        DType::I32 => sys::PJRT_Buffer_Type_S32,
        DType::I64 => sys::PJRT_Buffer_Type_S64,
        DType::U8 => sys::PJRT_Buffer_Type_U8,
        DType::Bool => sys::PJRT_Buffer_Type_PRED,
    }
}

/// The inverse of [`buffer_type`]; `None` for element types lazyfuse does not use.
pub(crate) fn dtype_of(ty: sys::PJRT_Buffer_Type) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| buffer_type(d) == ty)
}

/// Dense byte size of an array, or an error naming `what` on overflow.
pub(crate) fn dense_size(dtype: DType, dims: &[usize], what: &str) -> Result<usize> {
    dims.iter()
        .try_fold(dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::binding(format!(
                "{what}: byte size of {dtype}{dims:?} overflows usize"
            ))
        })
}

/// How [`Buffer::to_host`] copied a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCopy {
    /// Straight from the buffer's host memory (the CPU plugin).
    InPlace,
    /// Through the plugin's `PJRT_Buffer_ToHostBuffer`.
    Plugin,
}

/// An array in device memory, owned by this handle.
///
/// Created by [`super::Client::buffer_from_host`] or returned by
/// [`super::LoadedExecutable::execute`]. Holds the client alive; dropping the
/// handle frees the device memory (`PJRT_Buffer_Destroy`). Buffers are never
/// donated to executions, so a `Buffer` stays valid until dropped.
pub struct Buffer {
    /// The client the buffer lives on, kept alive while the buffer is.
    pub(crate) client: Arc<ClientInner>,
    /// The buffer handle, destroyed on drop.
    pub(crate) raw: NonNull<sys::PJRT_Buffer>,
}

// SAFETY: PJRT buffers are thread-safe handles: the C API allows concurrent
// reads (metadata queries, host copies, use as execution arguments) from any
// thread, and destruction happens once, through the unique owner.
unsafe impl Send for Buffer {}
// SAFETY: every `&self` method only performs such concurrent-safe reads.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Buffer");
        if let Ok(t) = self.dtype() {
            d.field("dtype", &t);
        }
        if let Ok(dims) = self.dims() {
            d.field("dims", &dims);
        }
        d.finish_non_exhaustive()
    }
}

impl Buffer {
    /// Takes ownership of a buffer the plugin returned.
    pub(crate) fn from_raw(client: Arc<ClientInner>, raw: NonNull<sys::PJRT_Buffer>) -> Buffer {
        Buffer { client, raw }
    }

    /// Copies the array to host memory as dense little-endian row-major bytes
    /// and waits for the copy to finish.
    ///
    /// `out.len()` must equal the dense size (product of [`Buffer::dims`] times
    /// the dtype's size); anything else is an `Err`, so a caller with a stale
    /// idea of the shape learns it instead of reading partial data.
    ///
    /// A buffer in host memory (the CPU plugin's) that is dense and
    /// row-major is copied from its address once ready, without the
    /// plugin's asynchronous copy ([`HostCopy::InPlace`]).
    pub fn to_host(&self, out: &mut [u8]) -> Result<HostCopy> {
        let dtype = self.dtype()?;
        let dims = self.dims()?;
        let need = dense_size(dtype, &dims, "PJRT_Buffer_ToHostBuffer")?;
        if out.len() != need {
            return Err(Error::binding(format!(
                "PJRT_Buffer_ToHostBuffer: output slice has {} bytes, but a {dtype}{dims:?} \
                 buffer needs exactly {need}",
                out.len()
            )));
        }

        if self.read_in_place(out, dims.len())? {
            return Ok(HostCopy::InPlace);
        }

        // Ask for a dense major-to-minor host layout explicitly, whatever the
        // device layout is: this is the layout `out` is documented to have.
        let minor_to_major: Vec<i64> = (0..dims.len() as i64).rev().collect();
        let mut layout = sys::PJRT_Buffer_MemoryLayout::new();
        layout.type_ = sys::PJRT_Buffer_MemoryLayout_Type_Tiled;
        // SAFETY: writing the `tiled` member of the union (selected by `type_`).
        unsafe {
            let tiled = &mut layout.__bindgen_anon_1.tiled;
            *tiled = sys::PJRT_Buffer_MemoryLayout_Tiled::new();
            tiled.minor_to_major = super::api::slice_ptr(&minor_to_major);
            tiled.minor_to_major_size = minor_to_major.len();
        }

        let plugin = &*self.client.plugin;
        let mut a = sys::PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw.as_ptr();
        a.host_layout = &mut layout;
        a.dst = out.as_mut_ptr().cast();
        a.dst_size = out.len();
        let r = pjrt_call!(plugin, PJRT_Buffer_ToHostBuffer, &mut a);
        // Own the event before looking at `r`, so it is destroyed on every path.
        let event = Event::new(plugin, a.event);
        r?;
        // `out`, `layout` and `minor_to_major` outlive the wait below.
        event.wait("PJRT_Buffer_ToHostBuffer")?;
        Ok(HostCopy::Plugin)
    }

    /// Bytes the buffer occupies on the device (may exceed the dense size
    /// because of padding or tiling; useful for memory accounting).
    pub fn on_device_size(&self) -> Result<usize> {
        let mut a = sys::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        a.buffer = self.raw.as_ptr();
        pjrt_call!(
            &*self.client.plugin,
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut a
        )?;
        Ok(a.on_device_size_in_bytes)
    }

    /// The array's dimensions, major to minor (empty for a scalar).
    pub fn dims(&self) -> Result<Vec<usize>> {
        let mut a = sys::PJRT_Buffer_Dimensions_Args::new();
        a.buffer = self.raw.as_ptr();
        pjrt_call!(&*self.client.plugin, PJRT_Buffer_Dimensions, &mut a)?;
        if a.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returns `num_dims` values that live as long as the buffer.
        let dims = unsafe { std::slice::from_raw_parts(a.dims, a.num_dims) };
        dims.iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    Error::binding(format!(
                        "PJRT_Buffer_Dimensions: plugin reported a negative dimension {d}"
                    ))
                })
            })
            .collect()
    }

    /// The element type, as a lazyfuse dtype (an `Err` for element types
    /// lazyfuse has no dtype for, e.g. complex numbers).
    pub fn dtype(&self) -> Result<DType> {
        let mut a = sys::PJRT_Buffer_ElementType_Args::new();
        a.buffer = self.raw.as_ptr();
        pjrt_call!(&*self.client.plugin, PJRT_Buffer_ElementType, &mut a)?;
        dtype_of(a.type_).ok_or_else(|| {
            Error::binding(format!(
                "PJRT_Buffer_ElementType: element type {} has no lazyfuse dtype",
                a.type_
            ))
        })
    }
}

// In-place host reads.
//
// On the CPU plugin a `PJRT_Buffer_ToHostBuffer` of a finished buffer is
// still an asynchronous copy: the plugin queues it on its own thread pool
// and the caller waits on an event, about 20 to 40 us per read of a few
// hundred bytes on a 2-core machine, more than a small decode step
// computes. A buffer the plugin reports as on the CPU (`PJRT_Buffer_IsOnCpu`),
// dense and row-major (`PJRT_Buffer_GetMemoryLayout`), is instead copied
// straight from its address (`PJRT_Buffer_UnsafePointer`) once its ready
// event has fired. Any other buffer, or a plugin without those entries,
// takes the plugin's copy.
impl Buffer {
    /// Copies the buffer into `out` (its dense size, checked by the
    /// caller) straight from host memory when the plugin stores it there
    /// densely in row-major order; `Ok(false)` when it does not, or cannot
    /// say, so the caller copies through the plugin instead. A buffer whose
    /// computation failed gives that error.
    fn read_in_place(&self, out: &mut [u8], rank: usize) -> Result<bool> {
        match self.host_bytes(rank)? {
            Some(bytes) if bytes.len() == out.len() => {
                out.copy_from_slice(bytes);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The buffer's bytes where the plugin keeps them, when that is host
    /// memory holding them densely in row-major order (`rank` dims); `None`
    /// when it is not, or the plugin cannot say. Waits for the value first:
    /// a buffer whose computation failed gives that error. The bytes stay
    /// valid and unchanged while `self` lives (a buffer is freed only by
    /// its owner's drop, and never donated while a reference to it
    /// exists), which is what lets a caller lend them out without a copy
    /// (DLPack).
    pub fn host_bytes(&self, rank: usize) -> Result<Option<&[u8]>> {
        let plugin = &*self.client.plugin;
        let raw = self.raw.as_ptr();
        let mut on_cpu = sys::PJRT_Buffer_IsOnCpu_Args::new();
        on_cpu.buffer = raw;
        if pjrt_call!(plugin, PJRT_Buffer_IsOnCpu, &mut on_cpu).is_err() || !on_cpu.is_on_cpu {
            return Ok(None);
        }
        if !self.dense_row_major(rank) {
            return Ok(None);
        }
        // Wait for the value (a finished buffer's event is ready at once);
        // its error is the buffer's.
        let mut ready = sys::PJRT_Buffer_ReadyEvent_Args::new();
        ready.buffer = raw;
        if pjrt_call!(plugin, PJRT_Buffer_ReadyEvent, &mut ready).is_err() {
            return Ok(None);
        }
        Event::new(plugin, ready.event).wait("PJRT_Buffer_ReadyEvent")?;
        let Ok(len) = self.on_device_size() else {
            return Ok(None);
        };
        if len == 0 {
            return Ok(Some(&[]));
        }
        let mut ptr = sys::PJRT_Buffer_UnsafePointer_Args::new();
        ptr.buffer = raw;
        if pjrt_call!(plugin, PJRT_Buffer_UnsafePointer, &mut ptr).is_err()
            || ptr.buffer_pointer == 0
        {
            return Ok(None);
        }
        // SAFETY: the plugin reports the buffer as host memory of exactly
        // `len` bytes at `buffer_pointer`, and its ready event has fired,
        // so nothing writes it any more; `self` keeps it alive for the
        // borrow.
        Ok(Some(unsafe {
            std::slice::from_raw_parts(ptr.buffer_pointer as *const u8, len)
        }))
    }

    /// Whether the buffer's layout is dense row-major: untiled, minor to
    /// major `rank - 1, ..., 0` (false when the plugin cannot say).
    fn dense_row_major(&self, rank: usize) -> bool {
        let plugin = &*self.client.plugin;
        let mut a = sys::PJRT_Buffer_GetMemoryLayout_Args::new();
        a.buffer = self.raw.as_ptr();
        if pjrt_call!(plugin, PJRT_Buffer_GetMemoryLayout, &mut a).is_err()
            || a.layout.type_ != sys::PJRT_Buffer_MemoryLayout_Type_Tiled
        {
            return false;
        }
        // SAFETY: `type_` selects the `tiled` member; its arrays live as
        // long as the buffer.
        let tiled = unsafe { &a.layout.__bindgen_anon_1.tiled };
        if tiled.num_tiles != 0 || tiled.minor_to_major_size != rank {
            return false;
        }
        if rank == 0 {
            return true;
        }
        // SAFETY: as above, `minor_to_major_size` entries.
        let m2m = unsafe { std::slice::from_raw_parts(tiled.minor_to_major, rank) };
        m2m.iter()
            .enumerate()
            .all(|(i, &d)| d == (rank - 1 - i) as i64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = sys::PJRT_Buffer_Destroy_Args::new();
        a.buffer = self.raw.as_ptr();
        let plugin = &*self.client.plugin;
        let r = pjrt_call!(plugin, PJRT_Buffer_Destroy, &mut a);
        plugin.log_drop_error("buffer", r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_mapping_round_trips() {
        for d in DType::ALL {
            assert_eq!(dtype_of(buffer_type(d)), Some(d));
        }
        assert_eq!(buffer_type(DType::U8), sys::PJRT_Buffer_Type_U8);
        assert_eq!(buffer_type(DType::Bool), sys::PJRT_Buffer_Type_PRED);
        assert_eq!(dtype_of(sys::PJRT_Buffer_Type_C64), None);
    }

    #[test]
    fn dense_size_checks_overflow() {
        assert_eq!(dense_size(DType::F32, &[2, 3], "t").unwrap(), 24);
        assert_eq!(dense_size(DType::F32, &[], "t").unwrap(), 4);
        assert_eq!(dense_size(DType::F32, &[0, 5], "t").unwrap(), 0);
        assert!(dense_size(DType::F64, &[usize::MAX, 2], "t").is_err());
    }
}
