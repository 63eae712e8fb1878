//! Process-wide pieces: the device, host transfers, factories, the random
//! generator, grad mode, sync, metrics and recompile explanations.

use crate::convert::{at, dtype, err, set_site};
use crate::ops::PyTensor;
use lazyfuse::{Device, NoGradGuard, Shape, Tensor};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::RefCell;
use std::sync::OnceLock;

static DEVICE: OnceLock<Device> = OnceLock::new();

/// The one device Python tensors live on: XLA's CPU plugin (provisioned on
/// first use, or the plugin `LAZYFUSE_PJRT_PLUGIN` names), or the reference
/// interpreter when `LAZYFUSE_DEVICE=interpreter`.
pub fn device() -> PyResult<&'static Device> {
    if let Some(d) = DEVICE.get() {
        return Ok(d);
    }
    let d = match std::env::var("LAZYFUSE_DEVICE").as_deref() {
        Ok("interpreter") | Ok("interp") => Device::interpreter(),
        _ => Device::cpu().map_err(err)?,
    };
    Ok(DEVICE.get_or_init(|| d))
}

/// Uploads `nbytes` of host memory at address `ptr` (a contiguous CPU
/// tensor's data, row-major, little-endian) as a tensor of `shape`, an
/// upload site at the declared Python line: sizes that vary there bucket.
///
/// # Safety contract
/// The caller (the package) passes the data pointer of a live contiguous
/// tensor it holds for the duration of the call, with `nbytes` equal to
/// its size; the bytes are copied before returning.
#[pyfunction]
fn from_buffer(ptr: usize, nbytes: usize, shape: Vec<usize>, dt: &str) -> PyResult<PyTensor> {
    let dtype = dtype(dt)?;
    if Shape::new(&shape).numel() * dtype.size_in_bytes() != nbytes {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{nbytes} bytes do not hold {dt}{shape:?}"
        )));
    }
    // SAFETY: see the contract above; an empty tensor reads nothing. The
    // bytes are copied once, into the device buffer.
    let bytes: &[u8] = if nbytes == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) }
    };
    let dev = device()?;
    at(|| Tensor::upload_bytes(bytes, &shape, dtype, dev)).map(PyTensor::new)
}

/// Copies the tensor's bytes (row-major, little-endian) into `nbytes` of
/// host memory at address `ptr`: a sync point, and one copy into the CPU
/// tensor the caller made for it, not three through `bytes`. The GIL is
/// released while the device computes.
///
/// # Safety contract
/// The caller (the package) passes the data pointer of a live contiguous
/// CPU tensor it holds for the duration of the call and nothing else
/// reads or writes during it, with `nbytes` equal to its size.
#[pyfunction]
fn read_into(py: Python<'_>, t: &Bound<'_, PyTensor>, ptr: usize, nbytes: usize) -> PyResult<()> {
    let t = t.get().t.clone();
    let out: &mut [u8] = if nbytes == 0 {
        &mut []
    } else {
        // SAFETY: see the contract above.
        unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, nbytes) }
    };
    py.detach(move || t.read_into(out)).map_err(err)
}

/// `_C.dlpack_if_sole(t)`: a DLPack capsule of `t`'s value in place when
/// nothing else in the runtime can reach it, else `None` (see
/// `dlpack::export_sole`). The package gives a compiled function's
/// results to PyTorch through it, dropping its own handle right after.
#[pyfunction]
fn dlpack_if_sole(py: Python<'_>, t: &Bound<'_, PyTensor>) -> PyResult<Option<Py<PyAny>>> {
    crate::dlpack::export_sole(py, &t.get().t)
}

/// A tensor of `shape` filled with `value`.
#[pyfunction]
#[pyo3(signature = (value, shape, dt))]
fn full(value: f64, shape: Vec<usize>, dt: &str) -> PyResult<PyTensor> {
    let (d, dev) = (dtype(dt)?, device()?);
    at(|| Tensor::full(value, &shape, d, dev)).map(PyTensor::new)
}

/// `start, start + step, ...` below `end`.
#[pyfunction]
#[pyo3(signature = (start, end, step, dt))]
fn arange(start: f64, end: f64, step: f64, dt: &str) -> PyResult<PyTensor> {
    let (d, dev) = (dtype(dt)?, device()?);
    at(|| Tensor::arange_step(start, end, step, d, dev)).map(PyTensor::new)
}

/// Uniform values in `[0, 1)` drawn on the device with the next key of its
/// seeded generator (`manual_seed`): a new draw never recompiles.
#[pyfunction]
#[pyo3(signature = (shape, dt))]
fn rand(shape: Vec<usize>, dt: &str) -> PyResult<PyTensor> {
    let (d, dev) = (dtype(dt)?, device()?);
    at(|| Tensor::rand_uniform(&shape, d, dev.next_key(), dev)).map(PyTensor::new)
}

/// Seeds the device's generator (what `torch.manual_seed` reaches).
#[pyfunction]
fn manual_seed(seed: u64) -> PyResult<()> {
    device()?.manual_seed(seed);
    Ok(())
}

thread_local! {
    static NO_GRAD: RefCell<Option<NoGradGuard>> = const { RefCell::new(None) };
}

/// Mirrors PyTorch's grad mode into the runtime's (per thread): the
/// package calls it when `torch.is_grad_enabled()` changes.
#[pyfunction]
fn set_grad_enabled(on: bool) {
    mirror_grad_mode(on)
}

/// Turns the runtime's grad mode on this thread on or off (cheap when it
/// already is).
pub fn mirror_grad_mode(on: bool) {
    NO_GRAD.with(|g| {
        let mut g = g.borrow_mut();
        match (on, g.is_some()) {
            (true, true) => *g = None,
            (false, false) => *g = Some(NoGradGuard::new()),
            _ => {}
        }
    })
}

/// Flushes this thread's pending graph and waits for the device.
#[pyfunction]
fn sync(py: Python<'_>) {
    py.detach(lazyfuse::sync)
}

/// Hands this thread's pending graph to the executor and returns at once
/// (a step boundary: the next step records while this one runs).
#[pyfunction]
fn flush() {
    lazyfuse::flush()
}

/// Every runtime counter (compiles, cache hits, flushes, recompiles, ...).
#[pyfunction]
fn counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in lazyfuse::metrics::snapshot().entries() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// The runtime's metrics report, as `lazyfuse::metrics::report()` prints it.
#[pyfunction]
fn report() -> String {
    lazyfuse::metrics::report()
}

/// The recent recompiles, each explained (cause, recording line, what
/// changed).
#[pyfunction]
fn recompiles() -> Vec<String> {
    lazyfuse::explain::recent()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Whether fusion is on (`LAZYFUSE_FUSION=0` or `TPU_FUSION=0` turn it off).
#[pyfunction]
fn fusion_enabled() -> bool {
    lazyfuse::fusion_enabled()
}

/// The number of ops recorded and not yet flushed on this thread.
#[pyfunction]
fn pending_ops() -> PyResult<usize> {
    Ok(lazyfuse::pending_ops(device()?))
}

/// The name of the device tensors live on.
#[pyfunction]
fn device_name() -> PyResult<String> {
    let d = device()?;
    Ok(if d.is_interpreter() {
        "interpreter".into()
    } else {
        d.plugin_path().display().to_string()
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_site, m)?)?;
    m.add_function(wrap_pyfunction!(from_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(read_into, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_if_sole, m)?)?;
    m.add_function(wrap_pyfunction!(full, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(rand, m)?)?;
    m.add_function(wrap_pyfunction!(manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(set_grad_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(sync, m)?)?;
    m.add_function(wrap_pyfunction!(flush, m)?)?;
    m.add_function(wrap_pyfunction!(counters, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(recompiles, m)?)?;
    m.add_function(wrap_pyfunction!(fusion_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(pending_ops, m)?)?;
    m.add_function(wrap_pyfunction!(device_name, m)?)?;
    Ok(())
}
