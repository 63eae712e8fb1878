//! `lazyfuse._C.CustomOp`: a custom StableHLO kernel (`lazyfuse::custom`)
//! seen from Python, with an optional gradient written in Python.

use crate::convert::{at, dtype};
use crate::ops::PyTensor;
use crate::runtime::device;
use lazyfuse::custom::{self, CustomOp};
use lazyfuse::Tensor;
use pyo3::prelude::*;

/// A custom kernel, applied with `op([t0, t1, ...])`.
#[pyclass(name = "CustomOp", module = "lazyfuse._C", frozen)]
pub struct PyCustomOp(CustomOp);

#[pymethods]
impl PyCustomOp {
    fn __call__(&self, args: Vec<Bound<'_, PyTensor>>) -> PyResult<PyTensor> {
        let refs: Vec<&Tensor> = args.iter().map(|t| &t.get().t).collect();
        at(|| self.0.apply(&refs)).map(PyTensor::new)
    }
}

/// Makes a custom op from StableHLO `text` (entry `@main`) with operands
/// `params` and a result `result`, each `(shape, dtype name)`. `grad`,
/// when given, is called as `grad(operands, result, result_grad)` with
/// runtime tensors and returns each operand's gradient (or `None`).
#[pyfunction]
#[pyo3(signature = (name, text, params, result, grad=None))]
fn custom_op(
    name: &str,
    text: &str,
    params: Vec<(Vec<usize>, String)>,
    result: (Vec<usize>, String),
    grad: Option<Py<PyAny>>,
) -> PyResult<PyCustomOp> {
    let types = params
        .iter()
        .map(|(_, d)| dtype(d))
        .collect::<PyResult<Vec<_>>>()?;
    let specs: Vec<(&[usize], lazyfuse::DType)> = params
        .iter()
        .zip(types)
        .map(|((s, _), d)| (s.as_slice(), d))
        .collect();
    let out = (result.0.as_slice(), dtype(&result.1)?);
    let dev = device()?;
    let op = at(|| custom::stablehlo(name, text, &specs, out, dev))?;
    Ok(PyCustomOp(match grad {
        None => op,
        Some(f) => op.with_grad(move |x, y, g| {
            Python::attach(|py| {
                let xs: Vec<PyTensor> = x.iter().map(|t| PyTensor::new(t.clone())).collect();
                let r = f
                    .call1(py, (xs, PyTensor::new(y.clone()), PyTensor::new(g.clone())))
                    .and_then(|r| r.extract::<Vec<Option<PyRef<'_, PyTensor>>>>(py));
                match r {
                    Ok(v) => Ok(v.into_iter().map(|o| o.map(|t| t.t.clone())).collect()),
                    Err(e) => Err(lazyfuse::Error::Internal(format!(
                        "the Python gradient of custom op raised: {e}"
                    ))),
                }
            })
        }),
    }))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCustomOp>()?;
    m.add_function(wrap_pyfunction!(custom_op, m)?)?;
    Ok(())
}
