//! Conversions between Python values and the runtime's: dtypes by name,
//! errors as `LazyfuseError`, and recording sites.

use crate::LazyfuseError;
use lazyfuse::{DType, Origin};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::cell::Cell;

/// A recording site: one Python source line and the op recorded there
/// (`Origin::site`, interned once). The package caches one per
/// `(code, line, op)`, so making it is off the per-op path.
#[pyclass(name = "Site", module = "lazyfuse._C", frozen)]
pub struct Site(pub Origin);

#[pymethods]
impl Site {
    #[new]
    fn new(file: &str, line: u32, op: &str) -> Self {
        Site(Origin::site(file, line, 0, op))
    }

    fn __repr__(&self) -> String {
        format!("Site({})", self.0)
    }
}

thread_local! {
    /// The site of the PyTorch op being lowered on this thread.
    static SITE: Cell<Option<Origin>> = const { Cell::new(None) };
}

/// Declares the user's line for the ops recorded next on this thread (the
/// package calls it once per PyTorch op, before the op's runtime calls).
#[pyfunction]
#[pyo3(signature = (site=None))]
pub fn set_site(site: Option<&Bound<'_, Site>>) {
    set_origin(site.map(|s| s.get().0));
}

/// Declares `o` as the site of the ops recorded next on this thread.
pub fn set_origin(o: Option<Origin>) {
    SITE.with(|s| s.set(o));
}

/// Runs `f` with its ops and errors located at the declared site (the
/// user's Python line) and turns a runtime error into `LazyfuseError`.
pub fn at<R>(f: impl FnOnce() -> lazyfuse::Result<R>) -> PyResult<R> {
    let r = match SITE.with(Cell::get) {
        Some(o) => lazyfuse::with_origin(o, f),
        None => f(),
    };
    r.map_err(err)
}

/// A runtime error as a Python exception.
pub fn err(e: lazyfuse::Error) -> PyErr {
    LazyfuseError::new_err(e.to_string())
}

/// The dtype named as PyTorch names it (`float32`, `int64`, `bool`, ...).
pub fn dtype(name: &str) -> PyResult<DType> {
    Ok(match name {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "bfloat16" => DType::BF16,
        "float16" => DType::F16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "bool" => DType::Bool,
        _ => {
            return Err(PyValueError::new_err(format!(
                "lazyfuse has no dtype {name} (it has float32, float64, bfloat16, float16, int32, int64, uint8, bool)"
            )))
        }
    })
}

/// PyTorch's name of a dtype.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}
