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
use pyo3::types::{PyDict, PyInt, PyList, PySlice, PyTuple, PyWeakrefReference};

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

/// An index of ints, slices, `None` and `...` only (a view, not a copy).
pub fn basic_index(i: &Bound<'_, PyAny>) -> PyResult<bool> {
    let one = |c: &Bound<'_, PyAny>| {
        c.is_exact_instance_of::<PyInt>()
            || c.is_exact_instance_of::<PySlice>()
            || c.is_none()
            || c.is(c.py().Ellipsis().bind(c.py()))
    };
    if let Ok(t) = i.cast::<PyTuple>() {
        return Ok(t.iter().all(|c| one(&c)));
    }
    Ok(one(i))
}

/// `outs` (one wrapped result, or a tuple/list of them when `many`),
/// each marked as a view of `src` through `(lowering, args, kwargs, i)`
/// with `i` the result's index (`None` for a single result).
pub fn wrap_marked<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    (low, args, kw): (
        &Bound<'py, PyAny>,
        Bound<'py, PyTuple>,
        Option<Bound<'py, PyDict>>,
    ),
    outs: Bound<'py, PyAny>,
    many: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let kw = match kw {
        Some(k) => k.into_any(),
        None => py.None().into_bound(py),
    };
    let step = |i: Bound<'py, PyAny>| {
        PyTuple::new(py, [low.clone(), args.clone().into_any(), kw.clone(), i])
    };
    if !many {
        mark(py, src, &outs, step(py.None().into_bound(py))?)?;
        return Ok(outs);
    }
    let mut each = Vec::new();
    for (i, o) in outs.try_iter()?.enumerate() {
        let o = o?;
        mark(py, src, &o, step(i.into_pyobject(py)?.into_any())?)?;
        each.push(o);
    }
    Ok(PyTuple::new(py, each)?.into_any())
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
