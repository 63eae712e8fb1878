//! The public [`Tensor`]: a cheap, clonable, thread-safe handle to a value
//! that is either pending in some thread's graph, materialised on a device,
//! or failed. Every op validates its operands first (an `Err` at the call
//! site, naming the caller's line), then records; nothing runs until a sync
//! point needs a value.

mod bag;
mod composite;
mod conv;
mod create;
mod display;
pub(crate) mod dynamic;
mod grouped;
#[cfg(feature = "xla")]
mod grouped_host;
mod host_view;
mod index;
mod manual;
mod operand;
mod ops;
mod overload;
mod pool;
mod resize;
mod shard;

pub use host_view::HostView;
pub use manual::{Local, Reduction};
pub use operand::{Dims, Operand};

use crate::lazy::{LazyArg, TensorInner};
use crate::metrics::FlushReason;
use crate::runtime::DeviceBuffer;
use crate::{Device, Error, Result};
use lazyfuse_ir::Origin;
use lazyfuse_ir::{DType, Element, HostTensor, Op, Shape};
use smallvec::SmallVec;
use std::sync::{Arc, OnceLock};

/// An n-dimensional array on a [`Device`] with eager semantics and lazy execution.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

/// An operand as recorded: a tensor, or a host scalar of a dtype.
pub(crate) enum Arg<'a> {
    T(&'a Tensor),
    Scalar(lazyfuse_ir::Literal, DType),
}

impl LazyArg for Arg<'_> {
    fn operand(&self) -> std::result::Result<&Arc<TensorInner>, (lazyfuse_ir::Literal, DType)> {
        match self {
            Arg::T(t) => Ok(&t.0),
            Arg::Scalar(l, d) => Err((*l, *d)),
        }
    }
}

/// What the layer above (autograd) does after an op on tracked operands is
/// recorded: the tape seam. Installed once, by the first tensor that
/// requires grad, so this layer never names autograd and untracked
/// programs pay one atomic load per op.
pub(crate) type TapeHook = fn(Op, &[Arg<'_>], &Tensor, Origin);

static TAPE: OnceLock<TapeHook> = OnceLock::new();

/// Installs the tape hook (first call wins; later calls are no-ops).
pub(crate) fn install_tape(hook: TapeHook) {
    let _ = TAPE.set(hook);
}

impl Tensor {
    /// The dimensions (for a tensor with dynamic axes, their lengths: the
    /// logical shape, never the padded capacity).
    pub fn shape(&self) -> &Shape {
        match self.0.logical() {
            Some(l) => &l.shape,
            None => &self.0.shape,
        }
    }

    /// The dimensions as a slice.
    pub fn dims(&self) -> &[usize] {
        self.shape().dims()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().numel()
    }

    /// The device holding this tensor.
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// True while the value is only recorded in its thread's graph (not yet
    /// flushed to the executor).
    pub fn is_pending(&self) -> bool {
        self.0.is_pending()
    }

    /// True once the value is computed and resident on the device (or its
    /// computation failed). Never blocks.
    pub fn is_ready(&self) -> bool {
        self.0.is_ready()
    }

    /// Flushes whatever graph holds this tensor and returns its device buffer.
    fn materialize(&self, reason: FlushReason) -> Result<Arc<DeviceBuffer>> {
        self.0.materialize(reason)
    }

    /// Computes the tensor on its device without copying it to the host
    /// (a sync point). Later graphs read the device buffer directly.
    pub fn realize(&self) -> Result<&Self> {
        self.materialize(FlushReason::Realize)?;
        Ok(self)
    }

    /// Copies the value to the host as a [`HostTensor`] (a sync point).
    pub fn to_host(&self) -> Result<HostTensor> {
        let b = self.materialize(FlushReason::Read)?;
        let h = self.0.device.rt.download(&b)?;
        Ok(match self.logical() {
            Some(l) => dynamic::unpad_host(h, &l.shape),
            None => h,
        })
    }

    /// Copies the value into `out`, row-major little-endian bytes, exactly
    /// `numel * dtype size` of them (a sync point): memory the caller
    /// already owns, such as a PyTorch CPU tensor, filled with one copy.
    #[track_caller]
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        let loc = crate::site::caller();
        let want = self.numel() * self.dtype().size_in_bytes();
        if out.len() != want {
            return Err(Error::op(
                "read_into",
                format!("{} bytes given for {want}", out.len()),
                self.describe(),
                loc,
            ));
        }
        if self.logical().is_some() {
            out.copy_from_slice(&self.to_host()?.bytes);
            return Ok(());
        }
        let b = self.materialize(FlushReason::Read)?;
        self.0.device.rt.download_into(&b, out)
    }

    /// Copies the value to the host as a flat row-major `Vec<T>` (a sync point).
    /// `T` must match the dtype exactly.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let loc = crate::site::caller();
        if T::DTYPE != self.dtype() {
            return Err(Error::op(
                "to_vec",
                format!(
                    "requested {} elements from a {} tensor",
                    T::DTYPE,
                    self.dtype()
                ),
                self.describe(),
                loc,
            ));
        }
        let h = self.to_host()?;
        Ok(h.to_vec::<T>().expect("dtype checked above"))
    }

    /// The single value of a one-element tensor (a sync point).
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let loc = crate::site::caller();
        if self.numel() != 1 {
            return Err(Error::op(
                "item",
                format!("needs exactly one element, the tensor has {}", self.numel()),
                self.describe(),
                loc,
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// `f32[2, 3]` style description for error messages.
    pub(crate) fn describe(&self) -> String {
        format!("{}{}", self.dtype(), self.shape())
    }

    /// Applies any IR op to `inputs`: the typed methods are thin wrappers over
    /// this. Useful for tools and fuzzers that generate op programs; the same
    /// validation applies (an `Err` naming the caller, nothing recorded).
    #[track_caller]
    pub fn apply_op(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        if inputs.is_empty() {
            return Err(Error::op(
                op.name(),
                "apply_op needs at least one tensor operand (use the creation functions for leaves)",
                String::new(),
                crate::site::caller(),
            ));
        }
        Tensor::apply(op, inputs, crate::site::caller())
    }

    /// Validates and records `op` on `inputs` (the shared path of every op).
    pub(crate) fn apply(op: Op, inputs: &[&Tensor], loc: Origin) -> Result<Tensor> {
        let mut args: SmallVec<[Arg<'_>; 3]> = SmallVec::new();
        for t in inputs {
            args.push(Arg::T(t));
        }
        Tensor::apply_args(op, &args, loc)
    }

    /// [`Tensor::apply`] where some operands are host scalars, recorded as
    /// rank-0 constants in the same step (so fusion-off mode never runs them
    /// on their own).
    pub(crate) fn apply_args(op: Op, args: &[Arg<'_>], loc: Origin) -> Result<Tensor> {
        let scalar = Shape::scalar();
        // One pass over the operands; `plain` (no operand has dynamic
        // axes, a mesh or autograd state) skips the checks below.
        let mut operands: SmallVec<[(&Shape, DType); 3]> = SmallVec::new();
        let (mut plain, mut dynamic) = (true, false);
        for a in args {
            operands.push(match a {
                Arg::T(t) if t.0.has_extras() => {
                    plain = false;
                    dynamic |= t.0.logical().is_some();
                    (t.shape(), t.0.dtype)
                }
                Arg::T(t) => (&t.0.shape, t.0.dtype),
                Arg::Scalar(_, d) => (&scalar, *d),
            });
        }
        let describe = || {
            args.iter()
                .map(|a| match a {
                    Arg::T(t) => t.describe(),
                    Arg::Scalar(l, _) => format!("{}", l.as_f64()),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let name = op.name();
        // The inferred type is used where `infer` wrote it: moved out of the
        // `Result`, it was read back whole from narrower stores, a
        // store-forwarding stall on every op.
        let inferred = lazyfuse_ir::infer(&op, &operands);
        let (shape, dtype) = match &inferred {
            Ok((s, d)) => (s, *d),
            Err(e) => return Err(Error::op(name, e.clone(), describe(), loc)),
        };
        drop(operands);
        let site = dynamic::sites::for_op(&op, shape, loc);
        let mut tensors = args.iter().filter_map(|a| match a {
            Arg::T(t) => Some(*t),
            Arg::Scalar(..) => None,
        });
        let device = &tensors
            .next()
            .expect("every op with operands has a tensor operand")
            .0
            .device;
        if let Some(other) = tensors.find(|t| !t.0.device.same_device(device)) {
            return Err(Error::op(
                name,
                format!(
                    "operands are on different devices ({device:?} and {:?})",
                    other.0.device
                ),
                describe(),
                loc,
            ));
        }
        let mut mesh: Option<&crate::spmd::Mesh> = None;
        let meshes = args.iter().filter(|_| !plain);
        for t in meshes.filter_map(|a| match a {
            Arg::T(t) => t.0.mesh(),
            Arg::Scalar(..) => None,
        }) {
            match mesh {
                Some(m) if m != t => {
                    return Err(Error::op(
                        name,
                        format!(
                            "operands are on two device meshes ({m} and {t}); move one onto \
                             the other's mesh with Tensor::shard or Tensor::replicate"
                        ),
                        describe(),
                        loc,
                    ))
                }
                _ => mesh = Some(t),
            }
        }
        let mesh = mesh.cloned();
        let tape = TAPE.get().filter(|_| {
            !plain
                && args
                    .iter()
                    .any(|a| matches!(a, Arg::T(t) if t.0.autograd().is_some()))
        });
        let track = tape.map(|h| (*h, op.clone()));
        let out = if dynamic || site != (0, false) {
            dynamic::apply(&op, args, shape.clone(), site, loc)?
        } else {
            Tensor(crate::lazy::record(device, op, args, shape, dtype, loc)?)
        };
        if let Some(m) = mesh {
            out.0.set_mesh(m);
        }
        if let Some((hook, op)) = track {
            hook(op, args, &out, loc);
        }
        Ok(out)
    }

    /// The same value without autograd state: a fresh handle no gradient
    /// flows through. A materialised tensor shares its buffer; a pending one
    /// is an identity node recorded past the tape, which costs nothing once
    /// fused. (`detach` is this, for users.)
    pub(crate) fn stop_gradient(&self, loc: Origin) -> Result<Tensor> {
        if self.0.autograd().is_none() {
            return Ok(self.clone());
        }
        if let Some(buf) = self.ready_buffer() {
            // A padded (bucketed) upload keeps its logical shape.
            let t = Tensor::ready(buf, self.device());
            if let Some(l) = self.0.logical() {
                t.0.set_logical(l.clone());
            }
            return Ok(t);
        }
        let op = Op::Reshape(self.0.shape.clone());
        let inner = crate::lazy::record(
            self.device(),
            op,
            &[&self.0],
            &self.0.shape,
            self.dtype(),
            loc,
        )?;
        if let Some(l) = self.0.logical() {
            inner.set_logical(l.clone());
        }
        if let Some(m) = self.0.mesh() {
            inner.set_mesh(m.clone());
        }
        Ok(Tensor(inner))
    }

    /// Records a leaf-producing op (constants, arange) on `device`.
    pub(crate) fn apply_nullary(
        name: &'static str,
        op: Op,
        device: &Device,
        loc: Origin,
    ) -> Result<Tensor> {
        let (shape, dtype) =
            lazyfuse_ir::infer(&op, &[]).map_err(|e| Error::op(name, e, String::new(), loc))?;
        let (mask, _) = dynamic::sites::for_op(&op, &shape, loc);
        if mask != 0 {
            return dynamic::nullary(op, shape, dtype, mask, device, loc);
        }
        let none: [&Arc<TensorInner>; 0] = [];
        Ok(Tensor(crate::lazy::record(
            device, op, &none, &shape, dtype, loc,
        )?))
    }

    /// The device buffer if the value is already materialised (no flush).
    pub(crate) fn ready_buffer(&self) -> Option<Arc<DeviceBuffer>> {
        self.0.ready_buffer()
    }

    /// Wraps an already materialised buffer.
    pub(crate) fn ready(buf: Arc<DeviceBuffer>, device: &Device) -> Tensor {
        Tensor(TensorInner::ready(buf, device))
    }
}

/// Hands every graph the calling thread has pending to the executor and
/// returns at once: compilation and execution overlap with whatever the
/// thread records next (later graphs may use the in-flight results).
pub fn flush() {
    let _ = crate::lazy::sync_thread(FlushReason::Sync);
}

/// Computes `tensors` on their devices and waits for them (a sync point for
/// exactly these): one flush per graph that holds some of them. Other live
/// pending tensors are computed only if the program is predicted to use
/// them (see docs/execution.md); an optimizer step uses
/// this for its parameters and state, so gradients are not written out just
/// because parameters hold them.
pub fn realize_all(tensors: &[&Tensor]) -> Result<()> {
    let inner: Vec<Arc<TensorInner>> = tensors.iter().map(|t| t.0.clone()).collect();
    crate::lazy::materialize_all(&inner, FlushReason::Realize)
}

/// Flushes every graph the calling thread has pending and waits until they
/// are computed, and until every job queued before on the thread's devices
/// has run, those [`flush`] handed over included (a sync point, like
/// `torch_xla.sync()` + `wait_device_ops()`).
pub fn sync() {
    // Jobs run inline are done when this returns; the queued ones, this
    // flush's among them, are what `wait_thread_jobs` waits for.
    let _ = crate::lazy::sync_thread(FlushReason::Sync);
    crate::lazy::wait_thread_jobs();
}
