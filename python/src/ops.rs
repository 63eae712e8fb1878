//! `lazyfuse._C.Tensor`: a handle to a runtime tensor, and the ops the
//! Python package records on it. Each op is one call into the `lazyfuse`
//! crate, located at the caller's [`Site`]; ops are named by strings so
//! the package's tables stay data, not one binding per op.

use crate::convert::{at, dtype, dtype_name, err};
use lazyfuse::Tensor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyTuple};

/// A runtime tensor. Cheap to clone (a reference-counted handle); the
/// package's `torch.Tensor` wrapper holds one and swaps it for in-place
/// ops, the runtime's tensors being immutable values.
#[pyclass(name = "Tensor", module = "lazyfuse._C", frozen)]
pub struct PyTensor {
    pub t: Tensor,
}

impl PyTensor {
    pub fn new(t: Tensor) -> Self {
        PyTensor { t }
    }
}

/// The right-hand operand of a binary op: a tensor or a Python scalar.
pub enum Rhs<'py> {
    T(Bound<'py, PyTensor>),
    B(bool),
    I(i64),
    F(f64),
}

impl<'py> Rhs<'py> {
    /// Sorted by exact type first: a failed extraction builds a Python
    /// exception, which would cost more than the op itself on this path.
    fn of(v: &Bound<'py, PyAny>) -> PyResult<Rhs<'py>> {
        if let Ok(t) = v.cast::<PyTensor>() {
            return Ok(Rhs::T(t.clone()));
        }
        if v.is_exact_instance_of::<PyFloat>() {
            return Ok(Rhs::F(v.cast::<PyFloat>()?.value()));
        }
        if v.is_exact_instance_of::<PyBool>() {
            return Ok(Rhs::B(v.is_truthy()?));
        }
        if v.is_exact_instance_of::<PyInt>() {
            if let Ok(i) = v.extract::<i64>() {
                return Ok(Rhs::I(i));
            }
        }
        if let Ok(b) = v.cast::<PyBool>() {
            return Ok(Rhs::B(b.is_true()));
        }
        match v.extract::<i64>() {
            Ok(i) => Ok(Rhs::I(i)),
            Err(_) => Ok(Rhs::F(v.extract::<f64>()?)),
        }
    }
}

fn bad(op: &str, what: &str) -> PyErr {
    PyValueError::new_err(format!("lazyfuse: unknown {what} op {op}"))
}

#[pymethods]
impl PyTensor {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.t.dims())
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.t.dtype())
    }

    #[getter]
    fn requires_grad(&self) -> bool {
        self.t.requires_grad()
    }

    #[getter]
    fn is_leaf(&self) -> bool {
        self.t.is_leaf()
    }

    /// DLPack export (`torch.from_dlpack`, `numpy.from_dlpack`): the value
    /// in place where the device keeps it in host memory, else a copy (see
    /// `dlpack.rs`). A sync point. Consumers must only read it.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version);
        if let Some(d) = dl_device {
            if d != (crate::dlpack::DEVICE_CPU, 0) {
                return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                    "lazyfuse: tensors export to the CPU (DLPack device (1, 0)), not {d:?}"
                )));
            }
        }
        crate::dlpack::export(py, &self.t, copy)
    }

    /// Where `__dlpack__` puts the value: the CPU (`kDLCPU`, device 0).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (crate::dlpack::DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> String {
        format!(
            "lazyfuse._C.Tensor({}{:?})",
            dtype_name(self.t.dtype()),
            self.t.dims()
        )
    }

    /// `neg abs exp log sqrt rsqrt tanh sigmoid relu gelu gelu_exact sin cos
    /// floor erf`.
    fn unary(&self, op: &str) -> PyResult<PyTensor> {
        let f = unary_op(op).ok_or_else(|| bad(op, "unary"))?;
        at(|| f(&self.t)).map(PyTensor::new)
    }
    /// `add sub mul div pow maximum minimum eq ne lt le gt ge` with a tensor
    /// or a scalar on the right.
    fn binary(&self, op: &str, rhs: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let rhs = Rhs::of(rhs)?;
        const OPS: [&str; 13] = [
            "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
            "ge",
        ];
        if !OPS.contains(&op) {
            return Err(bad(op, "binary"));
        }
        macro_rules! go {
            ($r:expr) => {{
                let (t, r) = (&self.t, $r);
                at(|| match op {
                    "add" => t.add(r),
                    "sub" => t.sub(r),
                    "mul" => t.mul(r),
                    "div" => t.div(r),
                    "pow" => t.pow(r),
                    "maximum" => t.maximum(r),
                    "minimum" => t.minimum(r),
                    "eq" => t.eq(r),
                    "ne" => t.ne(r),
                    "lt" => t.lt(r),
                    "le" => t.le(r),
                    "gt" => t.gt(r),
                    _ => t.ge(r),
                })
            }};
        }
        let r = match rhs {
            Rhs::T(r) => go!(&r.get().t),
            Rhs::B(b) => go!(b),
            Rhs::I(i) => go!(i),
            Rhs::F(f) => go!(f),
        };
        r.map(PyTensor::new)
    }

    /// `sum mean max min` over `dims` (`None`: all).
    fn reduce(&self, op: &str, dims: Option<Vec<isize>>, keepdim: bool) -> PyResult<PyTensor> {
        if !["sum", "mean", "max", "min"].contains(&op) {
            return Err(bad(op, "reduce"));
        }
        let t = &self.t;
        let dims: lazyfuse::Dims = match dims {
            Some(d) => d.into(),
            None => lazyfuse::Dims::All,
        };
        at(|| match op {
            "sum" => t.sum(dims, keepdim),
            "mean" => t.mean(dims, keepdim),
            "max" => t.max(dims, keepdim),
            _ => t.min(dims, keepdim),
        })
        .map(PyTensor::new)
    }

    fn argmax(&self, axis: isize, keepdim: bool) -> PyResult<PyTensor> {
        at(|| self.t.argmax(axis, keepdim)).map(PyTensor::new)
    }

    fn reshape(&self, dims: Vec<usize>) -> PyResult<PyTensor> {
        at(|| self.t.reshape(&dims)).map(PyTensor::new)
    }

    fn permute(&self, perm: Vec<isize>) -> PyResult<PyTensor> {
        at(|| self.t.permute(&perm)).map(PyTensor::new)
    }

    fn transpose(&self, a: isize, b: isize) -> PyResult<PyTensor> {
        at(|| self.t.transpose(a, b)).map(PyTensor::new)
    }

    fn expand(&self, dims: Vec<usize>) -> PyResult<PyTensor> {
        at(|| self.t.broadcast_to(&dims)).map(PyTensor::new)
    }

    fn narrow(&self, axis: isize, start: usize, len: usize) -> PyResult<PyTensor> {
        at(|| self.t.narrow(axis, start, len)).map(PyTensor::new)
    }

    fn squeeze(&self, axis: isize) -> PyResult<PyTensor> {
        at(|| self.t.squeeze(axis)).map(PyTensor::new)
    }

    fn unsqueeze(&self, axis: isize) -> PyResult<PyTensor> {
        at(|| self.t.unsqueeze(axis)).map(PyTensor::new)
    }

    fn matmul(&self, rhs: &Bound<'_, PyTensor>) -> PyResult<PyTensor> {
        at(|| self.t.matmul(&rhs.get().t)).map(PyTensor::new)
    }

    /// `self ? a : b` (self is the bool condition).
    fn where_(&self, a: &Bound<'_, PyTensor>, b: &Bound<'_, PyTensor>) -> PyResult<PyTensor> {
        at(|| self.t.where_cond(&a.get().t, &b.get().t)).map(PyTensor::new)
    }

    fn to_dtype(&self, dt: &str) -> PyResult<PyTensor> {
        let d = dtype(dt)?;
        at(|| self.t.to_dtype(d)).map(PyTensor::new)
    }

    fn softmax(&self, axis: isize, log: bool) -> PyResult<PyTensor> {
        at(|| {
            if log {
                self.t.log_softmax(axis)
            } else {
                self.t.softmax(axis)
            }
        })
        .map(PyTensor::new)
    }

    fn logsumexp(&self, axis: isize, keepdim: bool) -> PyResult<PyTensor> {
        at(|| self.t.logsumexp(axis, keepdim)).map(PyTensor::new)
    }

    fn index_select(&self, axis: isize, idx: &Bound<'_, PyTensor>) -> PyResult<PyTensor> {
        at(|| self.t.index_select(axis, &idx.get().t)).map(PyTensor::new)
    }

    fn index_add(
        &self,
        axis: isize,
        idx: &Bound<'_, PyTensor>,
        src: &Bound<'_, PyTensor>,
    ) -> PyResult<PyTensor> {
        at(|| self.t.index_add(axis, &idx.get().t, &src.get().t)).map(PyTensor::new)
    }

    /// `Tensor::embedding_bag`: sum (or mean) of the rows `ids` picks, per
    /// bag starting at `offsets`, each row scaled by `psw` when given.
    #[pyo3(signature = (ids, offsets, psw, mean))]
    fn embedding_bag(
        &self,
        ids: &Bound<'_, PyTensor>,
        offsets: &Bound<'_, PyTensor>,
        psw: Option<Bound<'_, PyTensor>>,
        mean: bool,
    ) -> PyResult<PyTensor> {
        let psw = psw.map(|w| w.get().t.clone());
        at(|| {
            self.t
                .embedding_bag(&ids.get().t, &offsets.get().t, psw.as_ref(), mean)
        })
        .map(PyTensor::new)
    }

    /// `Tensor::cumsum`: inclusive prefix sums along `axis` (a log-depth
    /// scan).
    fn cumsum(&self, axis: isize) -> PyResult<PyTensor> {
        at(|| self.t.cumsum(axis)).map(PyTensor::new)
    }

    /// `Tensor::bags`: rows already looked up (`[n, dim]`) reduced per bag.
    #[pyo3(signature = (offsets, psw, mean))]
    fn bags(
        &self,
        offsets: &Bound<'_, PyTensor>,
        psw: Option<Bound<'_, PyTensor>>,
        mean: bool,
    ) -> PyResult<PyTensor> {
        let psw = psw.map(|w| w.get().t.clone());
        at(|| self.t.bags(&offsets.get().t, psw.as_ref(), mean)).map(PyTensor::new)
    }

    fn gather(&self, axis: isize, idx: &Bound<'_, PyTensor>) -> PyResult<PyTensor> {
        at(|| self.t.gather(axis, &idx.get().t)).map(PyTensor::new)
    }

    #[pyo3(signature = (weight, bias, eps))]
    fn layer_norm(
        &self,
        weight: Option<&Bound<'_, PyTensor>>,
        bias: Option<&Bound<'_, PyTensor>>,
        eps: f64,
    ) -> PyResult<PyTensor> {
        let (w, b) = (weight.map(|w| &w.get().t), bias.map(|b| &b.get().t));
        at(|| self.t.layer_norm(w, b, eps)).map(PyTensor::new)
    }

    #[allow(clippy::too_many_arguments)]
    fn conv2d(
        &self,
        weight: &Bound<'_, PyTensor>,
        bias: Option<&Bound<'_, PyTensor>>,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> PyResult<PyTensor> {
        let (w, b) = (&weight.get().t, bias.map(|b| &b.get().t));
        at(|| self.t.conv2d(w, b, stride, padding, dilation, groups)).map(PyTensor::new)
    }

    /// 2-D pooling of an NCHW input: `max` or `avg` (padding counted).
    fn pool2d(
        &self,
        kind: &str,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> PyResult<PyTensor> {
        match kind {
            "max" => at(|| self.t.max_pool2d(kernel, stride, padding)).map(PyTensor::new),
            "avg" => at(|| self.t.avg_pool2d(kernel, stride, padding)).map(PyTensor::new),
            _ => Err(bad(kind, "pooling")),
        }
    }

    fn dynamic_update_slice(
        &self,
        update: &Bound<'_, PyTensor>,
        axis: isize,
        start: &Bound<'_, PyTensor>,
    ) -> PyResult<PyTensor> {
        at(|| {
            self.t
                .dynamic_update_slice(&update.get().t, axis, &start.get().t)
        })
        .map(PyTensor::new)
    }

    /// The one element as a Python bool, int or float: a sync point.
    fn item(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = self.t.clone();
        let host = py.detach(move || t.to_host()).map_err(err)?;
        if host.numel() != 1 {
            return Err(PyValueError::new_err(format!(
                "a tensor with {} elements cannot be converted to a Python scalar",
                host.numel()
            )));
        }
        let d = host.dtype;
        Ok(if d == lazyfuse::DType::Bool {
            (host.bytes[0] != 0)
                .into_pyobject(py)?
                .to_owned()
                .into_any()
                .unbind()
        } else if d.is_int() || d == lazyfuse::DType::U8 {
            host.to_i64_vec()[0].into_pyobject(py)?.into_any().unbind()
        } else {
            host.to_f64_vec()[0].into_pyobject(py)?.into_any().unbind()
        })
    }

    // --- autograd: the runtime's own, recorded with the forward ops ---

    fn set_requires_grad(&self, on: bool) -> PyResult<()> {
        at(|| self.t.set_requires_grad(on))
    }

    fn grad(&self) -> Option<PyTensor> {
        self.t.grad().map(PyTensor::new)
    }

    fn set_grad(&self, g: Option<&Bound<'_, PyTensor>>) {
        self.t.set_grad(g.map(|g| g.get().t.clone()))
    }

    #[pyo3(signature = (retain_graph=false))]
    fn backward(&self, retain_graph: bool) -> PyResult<()> {
        at(|| {
            if retain_graph {
                self.t.backward_retain_graph()
            } else {
                self.t.backward()
            }
        })
    }

    /// `new` as this leaf's next value (an in-place update of a parameter):
    /// it becomes a leaf that requires grad as this one did and keeps its
    /// accumulated gradient, as a PyTorch tensor updated in place would.
    fn carry_leaf(&self, new: &Bound<'_, PyTensor>) -> PyResult<PyTensor> {
        let new = new.get().t.clone();
        if self.t.is_leaf() && self.t.requires_grad() {
            let fresh = new.detach().map_err(err)?;
            fresh.set_requires_grad(true).map_err(err)?;
            fresh.set_grad(self.t.grad());
            return Ok(PyTensor::new(fresh));
        }
        Ok(PyTensor::new(new))
    }
}

/// The runtime's unary op named `op` (the names `PyTensor::unary` takes).
pub fn unary_op(op: &str) -> Option<fn(&Tensor) -> lazyfuse::Result<Tensor>> {
    Some(match op {
        "neg" => Tensor::neg,
        "abs" => Tensor::abs,
        "exp" => Tensor::exp,
        "log" => Tensor::log,
        "sqrt" => Tensor::sqrt,
        "rsqrt" => Tensor::rsqrt,
        "tanh" => Tensor::tanh,
        "sigmoid" => Tensor::sigmoid,
        "relu" => Tensor::relu,
        "gelu" => Tensor::gelu,
        "gelu_exact" => Tensor::gelu_exact,
        "sin" => Tensor::sin,
        "cos" => Tensor::cos,
        "floor" => Tensor::floor,
        "erf" => Tensor::erf,
        "detach" => Tensor::detach,
        _ => return None,
    })
}

/// Concatenation along `axis`.
#[pyfunction]
fn cat(ts: Vec<Bound<'_, PyTensor>>, axis: isize) -> PyResult<PyTensor> {
    let refs: Vec<&Tensor> = ts.iter().map(|t| &t.get().t).collect();
    at(|| Tensor::cat(&refs, axis)).map(PyTensor::new)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cat, m)?)?;
    Ok(())
}
