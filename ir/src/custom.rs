//! User-supplied kernels: a StableHLO function recorded as one op.
//!
//! The IR treats the function as opaque text with a declared signature:
//! inference checks operands against it, the planner fuses the op like any
//! other, and a backend that compiles StableHLO inlines it into the region
//! (`lazyfuse-xla` calls it from `@main`). The reference interpreter cannot
//! run it and says so.

use crate::{DType, Shape};

/// A StableHLO function with its signature, as one op.
///
/// Equal kernels (same text and signature) are the same op: they share
/// compiled regions and cache keys across runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomKernel {
    /// A name for errors, dumps and `explain`.
    pub name: String,
    /// The function body as `func.func` text whose entry is `@main` (with
    /// any private helpers it calls).
    pub text: String,
    /// Operand shapes and dtypes, in order.
    pub params: Vec<(Shape, DType)>,
    /// The result's shape and dtype.
    pub result: (Shape, DType),
}

impl CustomKernel {
    /// The symbol the function gets inside a region module: unique per
    /// kernel, stable across runs (a hash of the text and signature).
    pub fn symbol(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = crate::stable_hasher();
        self.hash(&mut h);
        format!("lazyfuse_custom_{:016x}", h.finish())
    }
}
