//! User-supplied kernels recorded as one op: a StableHLO function, or a
//! Rust function on host buffers.
//!
//! The IR treats a kernel as opaque with a declared signature: inference
//! checks operands against it and the planner fuses the op like any other.
//! A backend that compiles StableHLO inlines a StableHLO kernel into the
//! region (`lazyfuse-xla` calls it from `@main`) and calls a host kernel
//! as a CPU custom call. The reference interpreter runs host kernels
//! (they are Rust) and refuses StableHLO ones.

use crate::{DType, Element, Shape};
use std::sync::Arc;

/// A kernel with its signature, as one op.
///
/// Equal kernels (same name, body and signature) are the same op: they
/// share compiled regions and cache keys across runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomKernel {
    /// A name for errors, dumps and `explain`; a host kernel is found by
    /// it at run time, so host kernel names are unique in a process.
    pub name: String,
    /// What the kernel runs.
    pub body: KernelBody,
    /// Operand shapes and dtypes, in order.
    pub params: Vec<(Shape, DType)>,
    /// The result's shape and dtype.
    pub result: (Shape, DType),
}

/// What a [`CustomKernel`] runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelBody {
    /// A StableHLO `func.func` text whose entry is `@main` (with any
    /// private helpers it calls).
    StableHlo(String),
    /// A Rust function called on the operands' host buffers.
    Host(HostFn),
}

/// A host kernel: reads the operands, writes the result (whose buffer
/// holds unspecified bytes on entry). An `Err` fails the execution that
/// called it, with the message.
pub type HostKernelFn =
    dyn Fn(&[HostArg<'_>], &mut HostOut<'_>) -> Result<(), String> + Send + Sync;

/// A host kernel's function. Kernels are told apart by name (unique per
/// process); two `HostFn`s are the same kernel when they are the same Rust
/// function or closure type (a closure made again by the same code is the
/// same kernel), and hashing ignores the function (its address is not
/// stable across runs, and the name already separates kernels).
#[derive(Clone)]
pub struct HostFn {
    f: Arc<HostKernelFn>,
    id: std::any::TypeId,
}

impl HostFn {
    /// Wraps a kernel function.
    pub fn new<F>(f: F) -> HostFn
    where
        F: Fn(&[HostArg<'_>], &mut HostOut<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        HostFn {
            f: Arc::new(f),
            id: std::any::TypeId::of::<F>(),
        }
    }

    /// Calls the kernel.
    pub fn call(&self, args: &[HostArg<'_>], out: &mut HostOut<'_>) -> Result<(), String> {
        (self.f)(args, out)
    }
}

impl PartialEq for HostFn {
    fn eq(&self, other: &HostFn) -> bool {
        self.id == other.id
    }
}

impl Eq for HostFn {}

// A kernel is only ever called under `catch_unwind` by its callers, which
// turn a panic into an `Err`; graphs holding one stay unwind-safe.
impl std::panic::UnwindSafe for HostFn {}
impl std::panic::RefUnwindSafe for HostFn {}

impl std::hash::Hash for HostFn {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "host".hash(state);
    }
}

impl std::fmt::Debug for HostFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostFn")
    }
}

/// One operand of a host kernel: a dense row-major array.
#[derive(Clone, Copy, Debug)]
pub struct HostArg<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub dims: &'a [usize],
    /// `numel * dtype.size_in_bytes()` little-endian bytes.
    pub bytes: &'a [u8],
}

/// The result buffer of a host kernel.
#[derive(Debug)]
pub struct HostOut<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub dims: &'a [usize],
    /// `numel * dtype.size_in_bytes()` bytes to fill.
    pub bytes: &'a mut [u8],
}

/// Element types a host kernel can view in place: every bit pattern of
/// their size is a value (not `bool`).
pub trait HostElement: Element + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! host_element {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl HostElement for $t {}
    )*};
}
host_element!(f32, f64, i32, i64, u8, half::bf16, half::f16);

/// `bytes` as a `T` slice, when the dtype is `T`'s and the bytes are
/// aligned for it (XLA's buffers and the interpreter's always are).
fn view<T: HostElement>(dtype: DType, bytes: &[u8]) -> Option<&[T]> {
    if dtype != T::DTYPE {
        return None;
    }
    // SAFETY: T is a plain numeric type for which every bit pattern is a
    // value (HostElement is sealed to such types); align_to only hands out
    // the aligned middle, and we accept it only when it covers every byte.
    let (head, mid, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

impl<'a> HostArg<'a> {
    /// The elements as `T`; `None` when `T` is not the operand's dtype.
    pub fn as_slice<T: HostElement>(&self) -> Option<&'a [T]> {
        view(self.dtype, self.bytes)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

impl HostOut<'_> {
    /// The result's elements as `T`, to write; `None` when `T` is not the
    /// result's dtype.
    pub fn as_mut_slice<T: HostElement>(&mut self) -> Option<&mut [T]> {
        view::<T>(self.dtype, self.bytes)?;
        // SAFETY: as in `view`; the check above proved the dtype and the
        // alignment, and `self.bytes` is borrowed mutably for the result.
        let (_, mid, _) = unsafe { self.bytes.align_to_mut::<T>() };
        Some(mid)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

impl CustomKernel {
    /// The symbol the kernel gets inside a region module: unique per
    /// kernel, stable across runs (a hash of the name, body and
    /// signature).
    pub fn symbol(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = crate::stable_hasher();
        self.hash(&mut h);
        format!("lazyfuse_custom_{:016x}", h.finish())
    }

    /// The host function, for a host kernel.
    pub fn host(&self) -> Option<&HostFn> {
        match &self.body {
            KernelBody::Host(f) => Some(f),
            KernelBody::StableHlo(_) => None,
        }
    }
}

/// The process's host kernels by name: a compiled program names the
/// kernel it calls, and the backend's trampoline finds the function here.
pub mod registry {
    use super::HostFn;
    use std::collections::HashMap;
    use std::sync::{OnceLock, RwLock};

    fn table() -> &'static RwLock<HashMap<String, HostFn>> {
        static TABLE: OnceLock<RwLock<HashMap<String, HostFn>>> = OnceLock::new();
        TABLE.get_or_init(Default::default)
    }

    /// Registers `f` as `name`. The same function (or closure type) again
    /// replaces the old one (so a kernel made again with new captured
    /// values runs them); another function under a taken name is an `Err`
    /// (programs compiled for the first would call the second).
    pub fn register(name: &str, f: &HostFn) -> Result<(), String> {
        let mut t = table().write().unwrap_or_else(|p| p.into_inner());
        match t.get(name) {
            Some(old) if old == f => {
                t.insert(name.to_string(), f.clone());
                Ok(())
            }
            Some(_) => Err(format!(
                "a different host kernel is already registered as {name:?}: host kernel names are unique in a process"
            )),
            None => {
                t.insert(name.to_string(), f.clone());
                Ok(())
            }
        }
    }

    /// The function registered as `name`.
    pub fn lookup(name: &str) -> Option<HostFn> {
        table()
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}
