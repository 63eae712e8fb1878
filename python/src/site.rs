//! The user's line: the innermost Python frame outside the package and
//! PyTorch, found with the frame API (`PyEval_GetFrame`, abi3) for every
//! recorded op, on the Rust path (`fast.rs`) and the Python one
//! (`set_site_here`, `user_line`). Sites are interned per code object,
//! line and op label, so errors, learned output selection and
//! dynamic-shape buckets key on the user's Python line.

use lazyfuse::Origin;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;
use std::collections::HashMap;
use std::sync::Mutex;

/// File-name prefixes that are not the user's code (the package, PyTorch,
/// frozen and `exec`'d code), set once at import.
static SKIP: PyOnceLock<Vec<String>> = PyOnceLock::new();

/// Sets the prefixes of files that are not the user's code.
pub(crate) fn set_skip(py: Python<'_>, skip: Vec<String>) -> PyResult<()> {
    SKIP.set(py, skip)
        .map_err(|_| PyTypeError::new_err("lazyfuse: the device is installed once"))
}

fn skip_prefixes(py: Python<'_>) -> PyResult<&[String]> {
    SKIP.get(py)
        .map(Vec::as_slice)
        .ok_or_else(|| PyTypeError::new_err("lazyfuse: the device is not installed"))
}

/// Per code object: whether it is skipped, keeping the code alive so its
/// address is never reused for another.
type CodeCache = HashMap<usize, (Py<PyAny>, bool)>;
static CODES: Mutex<Option<CodeCache>> = Mutex::new(None);
/// Interned sites by (code address, line, label).
type SiteCache = HashMap<(usize, i32), Vec<(Box<str>, Origin)>>;
static SITES: Mutex<Option<SiteCache>> = Mutex::new(None);

/// The innermost frame outside the package and PyTorch: its code object
/// and line.
fn user_frame<'py>(py: Python<'py>, skip: &[String]) -> PyResult<Option<(Bound<'py, PyAny>, i32)>> {
    // SAFETY: with the GIL held, `PyEval_GetFrame` returns the running
    // thread's current frame, borrowed (or null at the top level).
    let mut frame = unsafe {
        Bound::from_borrowed_ptr_or_opt(py, ffi::PyEval_GetFrame() as *mut ffi::PyObject)
    };
    while let Some(f) = frame {
        // SAFETY: `f` is a live frame object; `PyFrame_GetCode` returns a
        // new reference to its code object.
        let code = unsafe {
            Bound::from_owned_ptr(
                py,
                ffi::PyFrame_GetCode(f.as_ptr() as *mut ffi::PyFrameObject) as *mut ffi::PyObject,
            )
        };
        if !skipped(py, skip, &code)? {
            // SAFETY: as above.
            let line = unsafe { ffi::PyFrame_GetLineNumber(f.as_ptr() as *mut ffi::PyFrameObject) };
            return Ok(Some((code, line)));
        }
        let back = f.getattr(intern!(py, "f_back"))?;
        frame = if back.is_none() { None } else { Some(back) };
    }
    Ok(None)
}

fn skipped(py: Python<'_>, skip: &[String], code: &Bound<'_, PyAny>) -> PyResult<bool> {
    let key = code.as_ptr() as usize;
    {
        let codes = CODES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = codes.as_ref().and_then(|c| c.get(&key)) {
            return Ok(*s);
        }
    }
    let file = code.getattr(intern!(py, "co_filename"))?;
    let file = file.cast::<PyString>()?.to_cow()?;
    let s = skip.iter().any(|p| file.starts_with(p.as_str()));
    let mut codes = CODES.lock().unwrap_or_else(|e| e.into_inner());
    codes
        .get_or_insert_with(HashMap::new)
        .insert(key, (code.clone().unbind(), s));
    Ok(s)
}

/// The site of op `label` at the user's line (interned per code, line and
/// label), or `None` outside any user frame.
pub(crate) fn site_here(py: Python<'_>, label: &str) -> PyResult<Option<Origin>> {
    let skip = skip_prefixes(py)?;
    let Some((code, line)) = user_frame(py, skip)? else {
        return Ok(None);
    };
    let key = (code.as_ptr() as usize, line);
    {
        let sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = sites.as_ref().and_then(|s| s.get(&key)) {
            if let Some((_, o)) = v.iter().find(|(l, _)| &**l == label) {
                return Ok(Some(*o));
            }
        }
    }
    let file = code.getattr(intern!(py, "co_filename"))?;
    let o = Origin::site(
        &file.cast::<PyString>()?.to_cow()?,
        line.max(0) as u32,
        0,
        label,
    );
    let mut sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    sites
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_default()
        .push((label.into(), o));
    Ok(Some(o))
}

/// Declares the user's line as the site of the ops recorded next for
/// PyTorch op `op`.
#[pyfunction]
fn set_site_here(py: Python<'_>, op: &str) -> PyResult<()> {
    let o = site_here(py, op)?;
    crate::convert::set_origin(o);
    Ok(())
}

/// `(file, line)` of the user's line, for error messages.
#[pyfunction]
fn user_line(py: Python<'_>) -> PyResult<Option<(String, i32)>> {
    let Some((code, line)) = user_frame(py, skip_prefixes(py)?)? else {
        return Ok(None);
    };
    let file: String = code.getattr(intern!(py, "co_filename"))?.extract()?;
    Ok(Some((file, line)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_site_here, m)?)?;
    m.add_function(wrap_pyfunction!(user_line, m)?)?;
    Ok(())
}
