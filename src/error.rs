//! The one error type of the public API.

use lazyfuse_ir::Origin;
use std::fmt;

/// Everything that can go wrong, as a value: lazyfuse never panics on bad input.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// An op was called with invalid operands; returned by the op itself,
    /// before anything is recorded.
    #[error("{op}: {detail} (operands: {operands}) at {location}")]
    Op {
        /// The op the user called.
        op: &'static str,
        /// What is wrong with the operands.
        detail: String,
        /// The operands' dtypes and shapes, e.g. `f32[2, 3], f32[4]`.
        operands: String,
        /// The caller's source location.
        location: Origin,
    },
    /// XLA failed to compile or run a region; surfaces at the sync point,
    /// naming the ops of the region and the user lines that recorded them.
    #[error("XLA {stage} failed for region {region} [{ops}]: {message}")]
    Xla {
        /// `compile` or `execution`.
        stage: &'static str,
        /// The region's key.
        region: String,
        /// The region's ops with the lines that recorded them.
        ops: String,
        /// XLA's own message.
        message: String,
    },
    /// The PJRT plugin could not be found, provisioned or loaded.
    #[error("PJRT plugin: {0}")]
    Plugin(String),
    /// Any other PJRT failure (transfers, device queries).
    #[error("PJRT: {0}")]
    Pjrt(String),
    /// A broken internal invariant of lazyfuse (a bug, reported as a value
    /// so the runtime stays usable).
    #[error("lazyfuse internal error: {0}")]
    Internal(String),
}

impl Error {
    /// An argument error for `op` at the caller's location.
    pub(crate) fn op(
        op: &'static str,
        detail: impl fmt::Display,
        operands: String,
        location: Origin,
    ) -> Self {
        Error::Op {
            op,
            detail: detail.to_string(),
            operands,
            location,
        }
    }
}

impl Error {
    /// An internal-invariant error.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }

    /// The message without the variant's prefix (what a region error quotes).
    pub(crate) fn message(&self) -> String {
        match self {
            Error::Pjrt(m) | Error::Internal(m) | Error::Plugin(m) => m.clone(),
            Error::Xla { message, .. } => message.clone(),
            e => e.to_string(),
        }
    }
}

/// Result alias used throughout the API.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(feature = "xla")]
impl From<lazyfuse_xla::pjrt::Error> for Error {
    fn from(e: lazyfuse_xla::pjrt::Error) -> Self {
        Error::Pjrt(e.to_string())
    }
}
