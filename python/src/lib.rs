#![allow(non_snake_case)] // the extension module is `lazyfuse._C`, as PyTorch names its own
//! `lazyfuse._C`: the Rust runtime seen from Python.
//!
//! A thin layer: every function here calls one method of the `lazyfuse`
//! crate and converts its arguments. Recording, planning, fusion, autograd
//! and execution all stay in Rust; the Python package (`lazyfuse/`) maps
//! PyTorch's functions and ATen ops onto these calls. Each op takes the
//! [`Site`] of the user's Python line, so errors, learned output selection
//! and dynamic-shape buckets key on Python source lines, as they key on
//! Rust call sites for Rust programs.

mod conv;
mod convert;
mod custom;
mod dlpack;
mod fast;
mod grad;
mod ops;
mod runtime;
mod site;
mod views;

use pyo3::prelude::*;

pyo3::create_exception!(
    _C,
    LazyfuseError,
    pyo3::exceptions::PyRuntimeError,
    "An error the lazyfuse runtime returned: bad operands (naming the user's line), or a device or XLA failure."
);

/// The extension module.
#[pymodule]
#[pyo3(name = "_C")]
fn init_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("LazyfuseError", m.py().get_type::<LazyfuseError>())?;
    m.add_class::<ops::PyTensor>()?;
    m.add_class::<convert::Site>()?;
    runtime::register(m)?;
    ops::register(m)?;
    custom::register(m)?;
    conv::register(m)?;
    grad::register(m)?;
    fast::register(m)?;
    site::register(m)?;
    views::register(m)?;
    Ok(())
}
