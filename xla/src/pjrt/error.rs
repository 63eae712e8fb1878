//! The binding's error type: failures reported by the plugin (with their PJRT
//! status code) and failures detected by the binding itself (bad arguments,
//! unloadable plugins), in one type so callers need only one `?`.

use std::fmt;

/// The status code of an error reported by the plugin.
///
/// PJRT uses the abseil status codes; keeping them lets callers tell, say, a
/// rejected program (`InvalidArgument`) from an out-of-memory condition
/// (`ResourceExhausted`) without parsing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `CANCELLED`
    Cancelled,
    /// `UNKNOWN`
    Unknown,
    /// `INVALID_ARGUMENT`: e.g. a program that does not parse or verify.
    InvalidArgument,
    /// `DEADLINE_EXCEEDED`
    DeadlineExceeded,
    /// `NOT_FOUND`
    NotFound,
    /// `ALREADY_EXISTS`
    AlreadyExists,
    /// `PERMISSION_DENIED`
    PermissionDenied,
    /// `RESOURCE_EXHAUSTED`: typically out of device memory.
    ResourceExhausted,
    /// `FAILED_PRECONDITION`
    FailedPrecondition,
    /// `ABORTED`
    Aborted,
    /// `OUT_OF_RANGE`
    OutOfRange,
    /// `UNIMPLEMENTED`: the plugin does not support the request.
    Unimplemented,
    /// `INTERNAL`
    Internal,
    /// `UNAVAILABLE`
    Unavailable,
    /// `DATA_LOSS`
    DataLoss,
    /// `UNAUTHENTICATED`
    Unauthenticated,
    /// A code this binding does not know (kept verbatim).
    Other(i32),
}

impl ErrorCode {
    /// Maps the C enum value to a code.
    pub(crate) fn from_raw(code: u32) -> ErrorCode {
        use super::sys;
        match code {
            sys::PJRT_Error_Code_CANCELLED => ErrorCode::Cancelled,
            sys::PJRT_Error_Code_UNKNOWN => ErrorCode::Unknown,
            sys::PJRT_Error_Code_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            sys::PJRT_Error_Code_DEADLINE_EXCEEDED => ErrorCode::DeadlineExceeded,
            sys::PJRT_Error_Code_NOT_FOUND => ErrorCode::NotFound,
            sys::PJRT_Error_Code_ALREADY_EXISTS => ErrorCode::AlreadyExists,
            sys::PJRT_Error_Code_PERMISSION_DENIED => ErrorCode::PermissionDenied,
            sys::PJRT_Error_Code_RESOURCE_EXHAUSTED => ErrorCode::ResourceExhausted,
            sys::PJRT_Error_Code_FAILED_PRECONDITION => ErrorCode::FailedPrecondition,
            sys::PJRT_Error_Code_ABORTED => ErrorCode::Aborted,
            sys::PJRT_Error_Code_OUT_OF_RANGE => ErrorCode::OutOfRange,
            sys::PJRT_Error_Code_UNIMPLEMENTED => ErrorCode::Unimplemented,
            sys::PJRT_Error_Code_INTERNAL => ErrorCode::Internal,
            sys::PJRT_Error_Code_UNAVAILABLE => ErrorCode::Unavailable,
            sys::PJRT_Error_Code_DATA_LOSS => ErrorCode::DataLoss,
            sys::PJRT_Error_Code_UNAUTHENTICATED => ErrorCode::Unauthenticated,
            other => ErrorCode::Other(other as i32),
        }
    }

    /// The canonical upper-case name, as abseil prints it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Unknown => "UNKNOWN",
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::AlreadyExists => "ALREADY_EXISTS",
            ErrorCode::PermissionDenied => "PERMISSION_DENIED",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::Aborted => "ABORTED",
            ErrorCode::OutOfRange => "OUT_OF_RANGE",
            ErrorCode::Unimplemented => "UNIMPLEMENTED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::DataLoss => "DATA_LOSS",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Other(_) => "UNKNOWN_CODE",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Other(c) => write!(f, "code {c}"),
            c => f.write_str(c.name()),
        }
    }
}

/// An error from the PJRT binding.
///
/// `code` is `Some` exactly when the plugin reported the error (it is the
/// plugin's status code); it is `None` when the binding itself refused the
/// request (argument checks, plugin loading, version checks). `message` always
/// says which operation failed, so it is useful on its own in a log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", code_suffix(.code))]
pub struct Error {
    /// The plugin's status code, or `None` for errors raised by the binding.
    pub code: Option<ErrorCode>,
    /// Human-readable description, prefixed with the failing operation.
    pub message: String,
}

fn code_suffix(code: &Option<ErrorCode>) -> String {
    match code {
        Some(c) => format!(" [{c}]"),
        None => String::new(),
    }
}

impl Error {
    /// An error detected by the binding (no plugin status code).
    pub(crate) fn binding(message: impl Into<String>) -> Error {
        Error {
            code: None,
            message: message.into(),
        }
    }
}

/// Result of every fallible operation of the binding.
pub type Result<T> = std::result::Result<T, Error>;
