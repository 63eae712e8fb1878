//! A tensor's value read in place: its bytes where the device keeps them,
//! lent out without a copy (what the Python package's DLPack export hands
//! to PyTorch and NumPy).

use super::Tensor;
use crate::metrics::FlushReason;
use crate::runtime::DeviceBuffer;
use crate::Result;
use lazyfuse_ir::{DType, Shape};
use std::sync::Arc;

/// A tensor's value in host memory, dense and row-major, borrowed in place
/// from its device buffer: on the XLA CPU plugin and the interpreter the
/// buffer is host memory, so reading it needs no copy. The view holds the
/// buffer, so the bytes stay allocated and unchanged while it lives: a
/// buffer something else still holds is never donated to a computation,
/// and values are immutable.
pub struct HostView {
    /// Keeps the bytes alive; they are read through `ptr`.
    _buffer: Arc<DeviceBuffer>,
    ptr: *const u8,
    len: usize,
    shape: Shape,
    dtype: DType,
    sole: bool,
}

// SAFETY: the bytes behind `ptr` are immutable and owned by `_buffer`,
// which is itself `Send + Sync`; the view only reads them.
unsafe impl Send for HostView {}
// SAFETY: as above.
unsafe impl Sync for HostView {}

impl HostView {
    /// The value's bytes: row-major, little-endian, `numel * dtype size`.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` and `len` describe the buffer's host memory, which
        // `_buffer` keeps alive and nothing writes (see the type's doc).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The value's dimensions.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The value's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether, when the view was made, nothing but its tensor could reach
    /// the bytes: one handle to the tensor, and no other tensor or pending
    /// computation holding its buffer. A caller that then drops that handle
    /// owns the value outright and may hand the memory out as writable (a
    /// compiled function's result given to PyTorch without a copy).
    pub fn sole(&self) -> bool {
        self.sole
    }
}

impl Tensor {
    /// The value in host memory without a copy (a sync point), or `None`
    /// where the device does not keep it there densely in row-major order
    /// (a GPU; a sharded or padded dynamic-shape tensor): read those with
    /// [`Tensor::read_into`] or [`Tensor::to_host`]. A computation that
    /// failed is an `Err`, as for any read.
    pub fn host_view(&self) -> Result<Option<HostView>> {
        if self.logical().is_some() {
            return Ok(None);
        }
        let buffer = self.materialize(FlushReason::Read)?;
        let Some(bytes) = self.0.device.rt.host_bytes(&buffer)? else {
            return Ok(None);
        };
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        // The tensor's state holds the buffer once, this view once.
        let sole = Arc::strong_count(&self.0) == 1 && Arc::strong_count(&buffer) == 2;
        Ok(Some(HostView {
            sole,
            shape: buffer.shape.clone(),
            dtype: buffer.dtype,
            _buffer: buffer,
            ptr,
            len,
        }))
    }
}
