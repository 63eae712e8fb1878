//! The backend seam: what the runtime needs from a device, and nothing
//! more: transfer (upload, download), compile a fused region, execute it,
//! await the execution.
//!
//! Two implementations:
//! - [`PjrtBackend`]: XLA through a PJRT plugin (lowering to StableHLO, the
//!   persistent compile cache, the plugin's client);
//! - [`InterpBackend`]: `lazyfuse-ir`'s reference interpreter on host
//!   memory, so any program can run on the reference semantics
//!   (`Device::interpreter()`) and the lazy, planner and autograd tests run
//!   on a machine with no plugin at all.
//!
//! Buffers, executables and completions are closed enums over the two
//! representations rather than trait objects: the runtime holds them by
//! value on the launch path, and a backend handed the other backend's value
//! answers with an internal error instead of undefined behaviour.

mod interp;
#[cfg(feature = "xla")]
mod pjrt;

pub(crate) use interp::InterpBackend;
#[cfg(feature = "xla")]
pub(crate) use pjrt::{ClientSetup, PjrtBackend};

use crate::spmd::{Sharding, SpmdLayout};
use crate::Result;
use lazyfuse_fusion::{Region, RegionKey};
use lazyfuse_ir::{DType, Graph, HostTensor, Shape};

/// A device-resident array in its backend's representation.
pub(crate) enum RawBuffer {
    /// A PJRT buffer.
    #[cfg(feature = "xla")]
    Pjrt(lazyfuse_xla::pjrt::Buffer),
    /// A host array owned by the interpreter device.
    Host(HostTensor),
}

/// A compiled region in its backend's representation.
pub(crate) enum RawExecutable {
    /// A loaded PJRT executable.
    #[cfg(feature = "xla")]
    Pjrt(lazyfuse_xla::pjrt::LoadedExecutable),
    /// A region extracted into a standalone graph for the interpreter.
    Interp(interp::Program),
}

/// An execution that may still be running.
pub(crate) enum Completion {
    /// A PJRT execution's completion event.
    #[cfg(feature = "xla")]
    Pjrt(lazyfuse_xla::pjrt::Completion),
    /// The completions of one SPMD execution, one per device.
    #[cfg(feature = "xla")]
    PjrtAll(Vec<lazyfuse_xla::pjrt::Completion>),
    /// Finished when launched (the interpreter runs synchronously).
    Done,
}

/// A host array borrowed for an upload: the bytes stay the caller's (a
/// Python binding's tensor memory), so uploading copies them once, into
/// the device buffer, not first into a [`HostTensor`].
#[derive(Clone, Copy)]
pub(crate) struct HostSlice<'a> {
    /// Little-endian, row-major, exactly `shape`'s dense size.
    pub bytes: &'a [u8],
    pub shape: &'a Shape,
    pub dtype: DType,
}

impl<'a> From<&'a HostTensor> for HostSlice<'a> {
    fn from(h: &'a HostTensor) -> Self {
        HostSlice {
            bytes: &h.bytes,
            shape: &h.shape,
            dtype: h.dtype,
        }
    }
}

/// What the runtime asks of a device.
pub(crate) trait Backend: Send + Sync {
    /// Platform name, as the plugin reports it (`cpu`, `cuda`, `interpreter`).
    fn platform_name(&self) -> String;
    /// Number of addressable devices.
    fn device_count(&self) -> usize;
    /// Copies `host` to device `ordinal`.
    fn upload(&self, host: HostSlice<'_>, ordinal: usize) -> Result<RawBuffer>;
    /// Copies `buf` into `out` (exactly its byte size); `true` when it was
    /// read straight from host memory, without a device transfer.
    fn download(&self, buf: &RawBuffer, out: &mut [u8]) -> Result<bool>;
    /// `buf`'s bytes in place, when they are in host memory, dense and
    /// row-major (`rank` dims), and stay unchanged while `buf` lives;
    /// `None` otherwise. Waits for the value.
    fn host_bytes<'a>(&self, buf: &'a RawBuffer, rank: usize) -> Result<Option<&'a [u8]>>;
    /// Compiles `region` of `graph` (key `key`), calling `on_compile` just
    /// before real compilation work (not for a persistent-cache load).
    fn compile(
        &self,
        key: RegionKey,
        graph: &Graph,
        region: &Region,
        on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable>;
    /// Whether an execution writes results into the memory of the donated
    /// arguments (the interpreter ignores donation).
    fn reuses_donated(&self) -> bool {
        true
    }
    /// Enqueues `exe` on device `ordinal`; `donate` lists argument indices
    /// whose buffers the execution may reuse; `outputs` are the expected
    /// result types. Arguments must stay alive until the completion is awaited.
    fn execute(
        &self,
        exe: &RawExecutable,
        args: &[&RawBuffer],
        donate: &[usize],
        ordinal: usize,
        outputs: &[(Shape, DType)],
    ) -> Result<(Vec<RawBuffer>, Completion)>;
    /// Waits for an execution launched by [`Backend::execute`], polling
    /// rather than sleeping until `poll` after its launch.
    fn wait(&self, done: Completion, poll: std::time::Duration) -> Result<()>;
    /// Compiles `region` as one SPMD program over `layout`'s mesh, its
    /// parameters and results sharded as `layout` says.
    fn compile_spmd(
        &self,
        _key: RegionKey,
        _graph: &Graph,
        _region: &Region,
        _layout: &SpmdLayout,
        _on_compile: &mut dyn FnMut(),
    ) -> Result<RawExecutable> {
        Err(no_spmd(&self.platform_name()))
    }
    /// Compiles the SPMD program that moves an array of `shape` and
    /// `dtype` from sharding `from` to `to` (one mesh): an identity whose
    /// parameter and result shardings differ.
    fn compile_reshard(
        &self,
        _key: RegionKey,
        _shape: &Shape,
        _dtype: DType,
        _from: &Sharding,
        _to: &Sharding,
    ) -> Result<RawExecutable> {
        Err(no_spmd(&self.platform_name()))
    }
    /// Launches an SPMD executable: `args[p]` are the shards of partition
    /// `p`; `donate` lists argument positions whose shards die here (as in
    /// [`Backend::execute`]). Returns each partition's results.
    fn execute_spmd(
        &self,
        _exe: &RawExecutable,
        _args: &[Vec<&RawBuffer>],
        _donate: &[usize],
    ) -> Result<(Vec<Vec<RawBuffer>>, Completion)> {
        Err(no_spmd(&self.platform_name()))
    }
}

/// The error of a backend without SPMD programs.
fn no_spmd(platform: &str) -> crate::Error {
    crate::Error::Pjrt(format!(
        "sharded tensors need a PJRT client with several devices; the {platform} device has none"
    ))
}

/// The error a backend returns when handed the other backend's value.
fn foreign(what: &str) -> crate::Error {
    crate::Error::internal(format!("{what} belongs to another backend"))
}
