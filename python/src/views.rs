//! Marking the device's views: a view (`x[0]`, `x.view(...)`, `x.t()`,
//! `x.detach()`) records its root (the tensor whose memory it shares) and
//! its chain of steps from the root, and the root keeps weak references to
//! its live views, so the package's `_views` module can write a view's
//! in-place update back into its root and re-derive the root's other
//! views, as PyTorch's shared memory would show them.
//!
//! Marking runs on every view op, so it is here rather than in Python:
//! a tuple, an attribute and a weak reference. A step is `(lowering, args,
//! kwargs, i)`: the view's value is `lowering(parent, *args, **kwargs)`
//! (its `i`-th result when `i` is not `None`); what a step means, and its
//! inverse, is `_views`' business, read only when a view is written.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyWeakrefReference};

/// Marks `out` as a view of `src` through `step` (a tuple).
pub fn mark<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    step: Bound<'py, PyTuple>,
) -> PyResult<()> {
    let v = src.getattr(intern!(py, "_view"))?;
    let (root, chain) = if v.is_none() {
        (src.clone(), PyTuple::new(py, [step])?)
    } else {
        let v = v.cast::<PyTuple>()?;
        let chain = v.get_item(1)?;
        let chain = chain.cast::<PyTuple>()?;
        let mut steps: Vec<Bound<'py, PyAny>> = chain.iter().collect();
        steps.push(step.into_any());
        (v.get_item(0)?, PyTuple::new(py, steps)?)
    };
    out.setattr(intern!(py, "_view"), (&root, chain))?;
    let refs = root.getattr(intern!(py, "_views"))?;
    let refs = if refs.is_none() {
        let l = PyList::empty(py);
        root.setattr(intern!(py, "_views"), &l)?;
        l
    } else {
        refs.cast_into::<PyList>()?
    };
    refs.append(PyWeakrefReference::new(out)?)?;
    // Dead references are dropped when the list reaches a power of two
    // (amortised: a long-lived root with short-lived views stays small).
    let n = refs.len();
    if n >= 16 && n.is_power_of_two() {
        let mut live = Vec::with_capacity(n);
        for r in refs.iter() {
            let w = r.cast::<PyWeakrefReference>()?;
            if w.upgrade().is_some() {
                live.push(r.clone());
            }
        }
        root.setattr(intern!(py, "_views"), PyList::new(py, live)?)?;
    }
    Ok(())
}

/// `mark_view(out, src, step)`: `out` is a view of `src` through `step`
/// (`(lowering, args, kwargs, i)`), for the package's Python paths (ATen's
/// view ops, `detach`).
#[pyfunction]
fn mark_view<'py>(
    py: Python<'py>,
    out: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    step: Bound<'py, PyTuple>,
) -> PyResult<()> {
    mark(py, src, out, step)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mark_view, m)?)?;
    Ok(())
}
