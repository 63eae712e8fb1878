//! The fused eager device's per-op path, in Rust: what each PyTorch call
//! on a `LazyTensor` costs before the runtime records it.
//!
//! The device's `TorchFunctionMode` sees every PyTorch function call; for
//! the hot functions (arithmetic, activations, views, `F.linear`, ...) it
//! hands the call to [`fast`], which finds the user's line, mirrors grad
//! mode, unwraps the operands, records the op (directly for float
//! elementwise ops, else through the package's Python lowering) and wraps
//! the result, without running the package's Python per op. Anything it
//! does not take (a CPU tensor operand, a list of tensors, an unusual
//! spelling) it declines with `None` and the mode's Python path handles
//! it, so the two paths give the same answers by construction: the fast
//! one only skips interpretation, never changes a lowering's semantics.
//!
//! The user's line comes from `site.rs`, as it does for the Python path.

use crate::convert::at;
use crate::ops::PyTensor;
use lazyfuse::{DType, Tensor};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use std::collections::HashMap;

/// An op the fast path records without Python, for float operands.
#[derive(Clone, Copy)]
enum Native {
    Unary(fn(&Tensor) -> lazyfuse::Result<Tensor>),
    Binary(Bin),
}

#[derive(Clone, Copy)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

/// How the fast path runs a function.
#[derive(Clone, Copy)]
enum Kind {
    /// The package's lowering, with tensors as runtime handles.
    Lower,
    /// Recorded directly for float operands, else as `Lower`.
    Native(Native),
    /// The package's function with the call's own arguments (in-place
    /// methods, which swap the `LazyTensor`'s handle); it returns
    /// `NotImplemented` to decline.
    Raw,
    /// Metadata PyTorch answers from the wrapper itself (`x.shape`,
    /// `x.dim()`): the function is called as it is, nothing recorded.
    Pass,
    /// Always the Python path's (moving, reading, autograd entry points).
    Python,
    /// As `Lower`, for a view function: the result is marked as a view of
    /// the first operand (`views.rs`) when the rule says it is one.
    View(ViewRule),
}

/// When a view function's result shares its operand's memory.
#[derive(Clone, Copy)]
enum ViewRule {
    Always,
    /// `x[idx]`: for basic indices (ints, slices, `None`, `...`) only.
    Index,
    /// `reshape`, `flatten`: when the operand is laid out contiguously.
    Contiguous,
}

/// One PyTorch function the fast path takes.
struct Entry {
    /// The site label (the function's name), as the Python path names it.
    op: String,
    lowering: Py<PyAny>,
    kind: Kind,
}

/// What the package hands over once at import.
struct Hooks {
    /// `LazyTensor`, and `torch.Tensor._make_wrapper_subclass`.
    cls: Py<PyType>,
    make: Py<PyAny>,
    /// PyTorch's dtype per runtime dtype (by `DType` index), the strided
    /// layout and the meta device: `_make_wrapper_subclass`'s positional
    /// arguments (parsed faster than keywords).
    dtypes: Vec<Py<PyAny>>,
    layout: Py<PyAny>,
    device: Py<PyAny>,
    torch_tensor: Py<PyType>,
    /// The type of a property's bound `__get__`/`__set__`.
    method_wrapper: Py<PyType>,
    is_grad_enabled: Py<PyAny>,
}

/// The functions the fast path takes, installed by the device's mode.
struct Table {
    /// The package's wrapper for tuple and list results.
    wrap_out: Py<PyAny>,
    /// `_views.contiguous(x)`, asked of a view before a `reshape`.
    contiguous: Py<PyAny>,
    /// By the function object's address (the table keeps a reference to
    /// each function, so the address stays its own).
    map: HashMap<usize, (Py<PyAny>, Entry)>,
}

static HOOKS: PyOnceLock<Hooks> = PyOnceLock::new();
static TABLE: PyOnceLock<Table> = PyOnceLock::new();

fn dtype_index(d: DType) -> usize {
    DType::ALL.iter().position(|x| *x == d).unwrap_or(0)
}

fn hooks(py: Python<'_>) -> PyResult<&Hooks> {
    HOOKS
        .get(py)
        .ok_or_else(|| PyTypeError::new_err("lazyfuse: the device's fast path is not installed"))
}

/// Installs what wrapping and finding the user's line need: the
/// `LazyTensor` class, `torch.Tensor._make_wrapper_subclass`, PyTorch's
/// dtype per dtype name, `torch.strided`, the meta device, `torch.Tensor`,
/// `torch.is_grad_enabled` and the file-name prefixes that are not user
/// code.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // one call, at import
fn install(
    py: Python<'_>,
    cls: Bound<'_, PyType>,
    make: Bound<'_, PyAny>,
    dtypes: Bound<'_, PyDict>,
    layout: Bound<'_, PyAny>,
    device: Bound<'_, PyAny>,
    torch_tensor: Bound<'_, PyType>,
    is_grad_enabled: Bound<'_, PyAny>,
    skip: Vec<String>,
) -> PyResult<()> {
    let mut torch_dtypes = Vec::new();
    for d in DType::ALL {
        let t = dtypes
            .get_item(crate::convert::dtype_name(d))?
            .ok_or_else(|| PyTypeError::new_err("lazyfuse: a dtype is missing"))?;
        torch_dtypes.push(t.unbind());
    }
    let hooks = Hooks {
        cls: cls.unbind(),
        make: make.unbind(),
        dtypes: torch_dtypes,
        layout: layout.unbind(),
        device: device.unbind(),
        method_wrapper: torch_tensor
            .getattr("shape")?
            .getattr("__get__")?
            .get_type()
            .unbind(),
        torch_tensor: torch_tensor.unbind(),
        is_grad_enabled: is_grad_enabled.unbind(),
    };
    crate::site::set_skip(py, skip)?;
    HOOKS
        .set(py, hooks)
        .map_err(|_| PyTypeError::new_err("lazyfuse: the device is installed once"))
}

/// `(function, label, lowering, kind)` as the package registers them.
type FastEntry<'py> = (
    Bound<'py, PyAny>,
    String,
    Bound<'py, PyAny>,
    Option<(String, String)>,
);

/// Installs the functions the fast path takes: `entries` are `(function,
/// label, lowering, kind)` with `kind` `None` (the lowering, on handles),
/// `("unary", op)` or `("binary", op)` (native for floats), `("raw", "")`
/// (the lowering, on the call's own arguments), `("pass", "")` (the
/// function itself) or `("view", rule)` (the lowering, its result a view
/// when `rule` — `""`, `"index"` or `"contiguous"` — says so); `wrap_out`
/// wraps tuple and list results, `contiguous` says whether a view is laid
/// out contiguously.
#[pyfunction]
fn install_fast_path(
    py: Python<'_>,
    wrap_out: Bound<'_, PyAny>,
    contiguous: Bound<'_, PyAny>,
    entries: Vec<FastEntry<'_>>,
) -> PyResult<()> {
    let mut map = HashMap::new();
    for (func, op, lowering, kind) in entries {
        let kind = match kind {
            None => Kind::Lower,
            Some((k, _)) if k == "raw" => Kind::Raw,
            Some((k, _)) if k == "pass" => Kind::Pass,
            Some((k, _)) if k == "python" => Kind::Python,
            Some((k, r)) if k == "view" => Kind::View(match r.as_str() {
                "index" => ViewRule::Index,
                "contiguous" => ViewRule::Contiguous,
                _ => ViewRule::Always,
            }),
            Some((k, name)) => Kind::Native(native_op(&k, &name)?),
        };
        let entry = Entry {
            op,
            lowering: lowering.unbind(),
            kind,
        };
        map.insert(func.as_ptr() as usize, (func.unbind(), entry));
    }
    let table = Table {
        wrap_out: wrap_out.unbind(),
        contiguous: contiguous.unbind(),
        map,
    };
    TABLE
        .set(py, table)
        .map_err(|_| PyTypeError::new_err("lazyfuse: the fast path is installed once"))
}

fn native_op(kind: &str, name: &str) -> PyResult<Native> {
    let bad = || PyTypeError::new_err(format!("lazyfuse: no native {kind} op {name}"));
    Ok(match kind {
        "unary" => Native::Unary(crate::ops::unary_op(name).ok_or_else(bad)?),
        "binary" => Native::Binary(match name {
            "add" => Bin::Add,
            "sub" => Bin::Sub,
            "mul" => Bin::Mul,
            "div" => Bin::Div,
            "maximum" => Bin::Maximum,
            "minimum" => Bin::Minimum,
            _ => return Err(bad()),
        }),
        _ => return Err(bad()),
    })
}

/// A `LazyTensor` around runtime tensor `t` (a `torch.Tensor` wrapper
/// subclass whose metadata is the runtime tensor's shape and dtype).
pub fn wrap_tensor<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let h = hooks(py)?;
    let shape = PyTuple::new(py, t.dims())?;
    let dtype = h.dtypes[dtype_index(t.dtype())].bind(py);
    let none = py.None();
    let args = (
        h.cls.bind(py),
        shape,
        &none,
        &none,
        &none,
        dtype,
        h.layout.bind(py),
        h.device.bind(py),
    );
    let obj = h.make.bind(py).call1(args)?;
    obj.setattr(intern!(py, "_t"), Bound::new(py, PyTensor::new(t))?)?;
    Ok(obj)
}

/// `wrap(h)`: the `LazyTensor` around handle `h`.
#[pyfunction]
fn wrap<'py>(py: Python<'py>, h: &Bound<'py, PyTensor>) -> PyResult<Bound<'py, PyAny>> {
    wrap_tensor(py, h.get().t.clone())
}

/// An operand unwrapped for a lowering, or `None` where the Python path
/// must take the call (a CPU tensor, tensors inside a list).
fn unwrap<'py>(
    py: Python<'py>,
    h: &Hooks,
    x: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if x.is_exact_instance(h.cls.bind(py)) {
        return Ok(Some(x.getattr(intern!(py, "_t"))?));
    }
    if x.is_exact_instance_of::<PyFloat>()
        || x.is_exact_instance_of::<PyInt>()
        || x.is_exact_instance_of::<PyBool>()
        || x.is_none()
        || x.is_exact_instance_of::<PyString>()
    {
        return Ok(Some(x.clone()));
    }
    let tuple = x.is_exact_instance_of::<PyTuple>();
    if tuple || x.is_exact_instance_of::<PyList>() {
        // Plain values pass as they are; a list of `LazyTensor`s (`cat`'s
        // operands) becomes a list of handles; any other tensor declines.
        let (mut plain, mut handles) = (true, Vec::new());
        for v in x.try_iter()? {
            let v = v?;
            if v.is_exact_instance(h.cls.bind(py)) {
                plain = false;
                handles.push(v.getattr(intern!(py, "_t"))?);
            } else if v.is_instance(h.torch_tensor.bind(py))? || holds_tensor(py, h, &v)? {
                return Ok(None);
            } else {
                handles.push(v);
            }
        }
        if plain {
            return Ok(Some(x.clone()));
        }
        if handles.iter().any(|v| !v.is_instance_of::<PyTensor>()) {
            return Ok(None);
        }
        return Ok(Some(if tuple {
            PyTuple::new(py, handles)?.into_any()
        } else {
            PyList::new(py, handles)?.into_any()
        }));
    }
    if x.is_instance(h.torch_tensor.bind(py))? {
        return Ok(None);
    }
    Ok(Some(x.clone()))
}

/// Whether `v` is a list holding a tensor at any depth (an index list of
/// plain ints passes as it is; one of tensors is the Python path's).
fn holds_tensor(py: Python<'_>, h: &Hooks, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !v.is_exact_instance_of::<PyList>() {
        return Ok(false);
    }
    for e in v.try_iter()? {
        let e = e?;
        if e.is_instance(h.torch_tensor.bind(py))? || holds_tensor(py, h, &e)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The float elementwise op, recorded directly, or `None` where the
/// operands need the lowering's type promotion.
fn native(n: Native, args: &[Bound<'_, PyAny>]) -> PyResult<Option<Tensor>> {
    let Ok(a) = args[0].cast::<PyTensor>() else {
        return Ok(None);
    };
    let a = &a.get().t;
    if !a.dtype().is_float() {
        return Ok(None);
    }
    match (n, args.len()) {
        (Native::Unary(f), 1) => at(|| f(a)).map(Some),
        (Native::Binary(op), 2) => {
            let b = &args[1];
            macro_rules! go {
                ($r:expr) => {{
                    let r = $r;
                    at(|| match op {
                        Bin::Add => a.add(r),
                        Bin::Sub => a.sub(r),
                        Bin::Mul => a.mul(r),
                        Bin::Div => a.div(r),
                        Bin::Maximum => a.maximum(r),
                        Bin::Minimum => a.minimum(r),
                    })
                    .map(Some)
                }};
            }
            if let Ok(t) = b.cast::<PyTensor>() {
                let t = &t.get().t;
                if t.dtype() == a.dtype() {
                    return go!(t);
                }
            } else if b.is_exact_instance_of::<PyFloat>() {
                return go!(b.cast::<PyFloat>()?.value());
            } else if b.is_exact_instance_of::<PyInt>() {
                if let Ok(i) = b.extract::<i64>() {
                    return go!(i);
                }
            }
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The device's hot path for PyTorch function `func` called with `args`
/// and `kwargs`: the result, or `NotImplemented` when the Python path must
/// take the call. A call that touches nothing on the device (and is not
/// one the Python path treats specially) is PyTorch's own function, run
/// here as the Python path would run it.
#[pyfunction]
#[pyo3(signature = (func, args, kwargs=None))]
fn fast<'py>(
    py: Python<'py>,
    func: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let declined = || Ok(py.NotImplemented().into_bound(py));
    let (Some(h), Some(table)) = (HOOKS.get(py), TABLE.get(py)) else {
        return declined();
    };
    if let Some(k) = kwargs {
        // `device=`: a factory that may create on the device.
        if k.contains(intern!(py, "device"))? {
            return declined();
        }
    }
    let cls = h.cls.bind(py);
    let first = if args.is_empty() {
        None
    } else {
        Some(args.get_item(0)?)
    };
    let on_device = first.as_ref().is_some_and(|f| f.is_exact_instance(cls));
    // `torch.cat([x, y])`: a list whose first element is on the device.
    let listed = match &first {
        Some(f) if f.is_exact_instance_of::<PyList>() || f.is_exact_instance_of::<PyTuple>() => {
            f.len()? > 0 && f.get_item(0)?.is_exact_instance(cls)
        }
        _ => false,
    };
    let e = match table.map.get(&(func.as_ptr() as usize)) {
        Some((_, e)) => Some(e),
        // A property getter or setter arrives as a fresh `method-wrapper`
        // each call: getters are registered by their descriptor (the
        // wrapper's `__self__`); on the device, the rest are the Python
        // path's (off it, PyTorch's own, as for any function).
        None if func.is_exact_instance(h.method_wrapper.bind(py)) => {
            let getter = func
                .getattr(intern!(py, "__name__"))?
                .eq(intern!(py, "__get__"))?;
            let d = func.getattr(intern!(py, "__self__"))?;
            match table.map.get(&(d.as_ptr() as usize)) {
                Some((_, e)) if getter => Some(e),
                _ if on_device || listed => return declined(),
                _ => None,
            }
        }
        None => None,
    };
    if let Some(Entry {
        kind: Kind::Python, ..
    }) = e
    {
        return declined();
    }
    if let Some(e) = e {
        let lowered = matches!(e.kind, Kind::Lower | Kind::Native(_) | Kind::View(_));
        if on_device || (listed && lowered) {
            return match take(py, h, table, e, func, args, kwargs)? {
                Some(r) => Ok(r),
                None => declined(),
            };
        }
    }
    if listed {
        return declined();
    }
    func.call(args, kwargs)
}

/// `func` (entry `e`) on a call whose first operand is on the device:
/// the result, or `None` to decline.
fn take<'py>(
    py: Python<'py>,
    h: &Hooks,
    table: &Table,
    e: &Entry,
    func: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match e.kind {
        Kind::Pass => return func.call(args, kwargs).map(Some),
        Kind::Raw => {
            crate::convert::set_origin(crate::site::site_here(py, &e.op)?);
            let on = h.is_grad_enabled.bind(py).call0()?.is_truthy()?;
            crate::runtime::mirror_grad_mode(on);
            return match e.lowering.bind(py).call(args, kwargs) {
                Ok(r) if r.is(py.NotImplemented().bind(py)) => Ok(None),
                Ok(r) => Ok(Some(r)),
                Err(err) if err.is_instance_of::<PyTypeError>(py) => Ok(None),
                Err(err) => Err(err),
            };
        }
        Kind::Python => return Ok(None),
        Kind::Lower | Kind::Native(_) | Kind::View(_) => {}
    }
    let mut a = Vec::with_capacity(args.len());
    for x in args.iter() {
        match unwrap(py, h, &x)? {
            Some(v) => a.push(v),
            None => return Ok(None),
        }
    }
    let kw = match kwargs {
        Some(k) if !k.is_empty() => {
            let d = PyDict::new(py);
            for (key, v) in k.iter() {
                match unwrap(py, h, &v)? {
                    Some(v) => d.set_item(key, v)?,
                    None => return Ok(None),
                }
            }
            Some(d)
        }
        _ => None,
    };
    crate::convert::set_origin(crate::site::site_here(py, &e.op)?);
    let on = h.is_grad_enabled.bind(py).call0()?.is_truthy()?;
    crate::runtime::mirror_grad_mode(on);
    if kw.is_none() {
        if let Kind::Native(n) = e.kind {
            if let Some(t) = native(n, &a)? {
                return wrap_tensor(py, t).map(Some);
            }
        }
    }
    let r = match e.lowering.bind(py).call(PyTuple::new(py, &a)?, kw.as_ref()) {
        Ok(r) => r,
        // A spelling the fast lowering does not take (a keyword it names
        // otherwise): ATen's path handles every one.
        Err(err) if err.is_instance_of::<PyTypeError>(py) => return Ok(None),
        Err(err) => return Err(err),
    };
    if let Kind::View(rule) = e.kind {
        if !r.is_none() && is_view(py, table, rule, args)? {
            return wrap_view(py, table, e, args, &a, kw, r).map(Some);
        }
    }
    if let Ok(t) = r.cast::<PyTensor>() {
        return wrap_tensor(py, t.get().t.clone()).map(Some);
    }
    if r.is_none() {
        return Ok(None);
    }
    table.wrap_out.bind(py).call1((r,)).map(Some)
}

/// Whether a view function's result shares its operand's memory.
fn is_view(
    py: Python<'_>,
    table: &Table,
    rule: ViewRule,
    args: &Bound<'_, PyTuple>,
) -> PyResult<bool> {
    Ok(match rule {
        ViewRule::Always => true,
        ViewRule::Index => args.len() == 2 && crate::views::basic_index(&args.get_item(1)?)?,
        ViewRule::Contiguous => {
            let x = args.get_item(0)?;
            x.getattr(intern!(py, "_view"))?.is_none()
                || table.contiguous.bind(py).call1((x,))?.is_truthy()?
        }
    })
}

/// The wrapped result(s) `r` of view entry `e`, each marked as a view of
/// the call's first operand (`views::wrap_marked`).
fn wrap_view<'py>(
    py: Python<'py>,
    table: &Table,
    e: &Entry,
    args: &Bound<'py, PyTuple>,
    a: &[Bound<'py, PyAny>],
    kw: Option<Bound<'py, PyDict>>,
    r: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let single = match r.cast::<PyTensor>() {
        Ok(t) => Some(wrap_tensor(py, t.get().t.clone())?),
        Err(_) => None,
    };
    let many = single.is_none();
    let outs = match single {
        Some(o) => o,
        None => table.wrap_out.bind(py).call1((r,))?,
    };
    let src = args.get_item(0)?;
    let step = (e.lowering.bind(py), PyTuple::new(py, &a[1..])?, kw);
    crate::views::wrap_marked(py, &src, step, outs, many)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(install, m)?)?;
    m.add_function(wrap_pyfunction!(install_fast_path, m)?)?;
    m.add_function(wrap_pyfunction!(fast, m)?)?;
    m.add_function(wrap_pyfunction!(wrap, m)?)?;
    Ok(())
}
