//! Gradients of a Python function of runtime tensors through the runtime's
//! own rules ([`lazyfuse::autograd::vjp`]): how the package lowers an
//! ATen op's explicit backward (an AOT-autograd graph's
//! `_scaled_dot_product_flash_attention_for_cpu_backward`) from the same
//! lowering as its forward, without a second copy of the gradient math.

use crate::convert::at;
use crate::ops::PyTensor;
use lazyfuse::Tensor;
use pyo3::prelude::*;

/// `vjp(f, inputs, cotangent)`: the gradients of `<f(inputs), cotangent>`
/// with respect to each input, `f` called once with a list of fresh
/// tensors holding the inputs' values. An exception `f` raises propagates.
#[pyfunction]
fn vjp(
    f: &Bound<'_, PyAny>,
    inputs: Vec<Bound<'_, PyTensor>>,
    cotangent: &Bound<'_, PyTensor>,
) -> PyResult<Vec<PyTensor>> {
    let ins: Vec<Tensor> = inputs.iter().map(|t| t.get().t.clone()).collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let mut raised = None;
    let r = at(|| {
        lazyfuse::autograd::vjp(&refs, &cotangent.get().t, |leaves| {
            let args: Vec<PyTensor> = leaves.iter().cloned().map(PyTensor::new).collect();
            let y = f
                .call1((args,))
                .and_then(|y| y.cast_into::<PyTensor>().map_err(PyErr::from));
            match y {
                Ok(y) => Ok(y.get().t.clone()),
                Err(e) => {
                    let msg = format!("the function given to vjp raised: {e}");
                    raised = Some(e);
                    Err(lazyfuse::Error::Internal(msg))
                }
            }
        })
    });
    if let Some(e) = raised {
        return Err(e);
    }
    Ok(r?.into_iter().map(PyTensor::new).collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(vjp, m)?)?;
    Ok(())
}
