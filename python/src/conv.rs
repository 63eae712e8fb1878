//! Convolutions from Python: `aten.convolution` (forward and transposed,
//! 1 to 3 spatial dims), its explicit backward (`aten.convolution_backward`,
//! which AOT-autograd graphs contain) through the runtime's own gradient
//! rules ([`lazyfuse::autograd::vjp`]), max pooling with window indices
//! and its backward the same way, bilinear resizing, and `flip`.

use crate::convert::at;
use crate::ops::PyTensor;
use lazyfuse::ir::ConvSpec;
use lazyfuse::{Result, Tensor};
use pyo3::prelude::*;

/// PyTorch's convolution arguments as a tuple `(stride, padding, dilation,
/// transposed, output_padding, groups)`, each list per spatial dim (or one
/// value for all).
#[derive(FromPyObject)]
struct Args(Vec<usize>, Vec<usize>, Vec<usize>, bool, Vec<usize>, usize);

impl Args {
    fn run(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        let Args(stride, padding, dilation, transposed, output_padding, groups) = self;
        if *transposed {
            let op = if output_padding.is_empty() {
                &[0][..]
            } else {
                output_padding
            };
            x.conv_transpose(w, b, stride, padding, op, dilation, *groups)
        } else {
            x.conv(w, b, stride, padding, dilation, *groups)
        }
    }
}

/// `aten.convolution(x, w, b, stride, padding, dilation, transposed,
/// output_padding, groups)`; `args` is the tuple of the last six.
#[pyfunction]
#[pyo3(signature = (x, w, b, args))]
fn convolution(
    x: &Bound<'_, PyTensor>,
    w: &Bound<'_, PyTensor>,
    b: Option<&Bound<'_, PyTensor>>,
    args: Args,
) -> PyResult<PyTensor> {
    let b = b.map(|b| b.get().t.clone());
    at(|| args.run(&x.get().t, &w.get().t, b.as_ref())).map(PyTensor::new)
}

/// The raw convolution op (asymmetric or negative padding, input dilation,
/// batch groups): `(stride, [(lo, hi)], lhs_dilation, rhs_dilation,
/// feature_groups, batch_groups)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn convolution_general(
    x: &Bound<'_, PyTensor>,
    w: &Bound<'_, PyTensor>,
    spec: (
        Vec<usize>,
        Vec<(i64, i64)>,
        Vec<usize>,
        Vec<usize>,
        usize,
        usize,
    ),
) -> PyResult<PyTensor> {
    let (stride, padding, lhs_dilation, rhs_dilation, feature_groups, batch_groups) = spec;
    let spec = ConvSpec {
        stride: stride.into(),
        padding: padding.into(),
        lhs_dilation: lhs_dilation.into(),
        rhs_dilation: rhs_dilation.into(),
        feature_groups,
        batch_groups,
    };
    at(|| x.get().t.convolution(&w.get().t, &spec)).map(PyTensor::new)
}

/// `aten.convolution_backward(gy, x, w, bias_sizes, stride, padding,
/// dilation, transposed, output_padding, groups, output_mask)`: the
/// gradients `mask` asks for (input, weight, bias), each `None` otherwise.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn convolution_backward(
    gy: &Bound<'_, PyTensor>,
    x: &Bound<'_, PyTensor>,
    w: &Bound<'_, PyTensor>,
    args: Args,
    mask: (bool, bool, bool),
) -> PyResult<(Option<PyTensor>, Option<PyTensor>, Option<PyTensor>)> {
    let (gy, x, w) = (&gy.get().t, &x.get().t, &w.get().t);
    at(|| {
        let (mut gx, mut gw, mut gb) = (None, None, None);
        if mask.0 || mask.1 {
            let g = lazyfuse::autograd::vjp(&[x, w], gy, |t| args.run(&t[0], &t[1], None))?;
            let [a, b]: [Tensor; 2] = g.try_into().expect("two inputs, two gradients");
            gx = mask.0.then_some(a);
            gw = mask.1.then_some(b);
        }
        if mask.2 {
            let axes: Vec<isize> = (0..gy.rank() as isize).filter(|&a| a != 1).collect();
            gb = Some(gy.sum(&axes[..], false)?);
        }
        Ok((gx, gw, gb))
    })
    .map(|(a, b, c)| {
        (
            a.map(PyTensor::new),
            b.map(PyTensor::new),
            c.map(PyTensor::new),
        )
    })
}

/// `aten.max_pool2d_with_indices` (no dilation, floor mode): the values
/// and each window's argmax as a flat index into its input plane.
#[pyfunction]
fn max_pool2d_with_indices(
    x: &Bound<'_, PyTensor>,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> PyResult<(PyTensor, PyTensor)> {
    at(|| x.get().t.max_pool2d_with_indices(kernel, stride, padding))
        .map(|(v, i)| (PyTensor::new(v), PyTensor::new(i)))
}

/// `aten.max_pool2d_with_indices_backward`: the gradient reaching each
/// window's first maximum, by the runtime's gradient of the same pooling.
#[pyfunction]
fn max_pool2d_backward(
    gy: &Bound<'_, PyTensor>,
    x: &Bound<'_, PyTensor>,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> PyResult<PyTensor> {
    let (gy, x) = (&gy.get().t, &x.get().t);
    at(|| {
        let g = lazyfuse::autograd::vjp(&[x], gy, |t| {
            Ok(t[0].max_pool2d_with_indices(kernel, stride, padding)?.0)
        })?;
        Ok(g.into_iter().next().expect("one input, one gradient"))
    })
    .map(PyTensor::new)
}

/// `aten.upsample_bilinear2d`: NCHW resized to `size`.
#[pyfunction]
fn upsample_bilinear(
    x: &Bound<'_, PyTensor>,
    size: (usize, usize),
    align_corners: bool,
) -> PyResult<PyTensor> {
    at(|| x.get().t.upsample_bilinear(size, align_corners)).map(PyTensor::new)
}

/// `torch.flip(x, dims)`.
#[pyfunction]
fn flip(x: &Bound<'_, PyTensor>, dims: Vec<isize>) -> PyResult<PyTensor> {
    at(|| x.get().t.flip(&dims)).map(PyTensor::new)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(convolution, m)?)?;
    m.add_function(wrap_pyfunction!(convolution_general, m)?)?;
    m.add_function(wrap_pyfunction!(convolution_backward, m)?)?;
    m.add_function(wrap_pyfunction!(flip, m)?)?;
    m.add_function(wrap_pyfunction!(upsample_bilinear, m)?)?;
    m.add_function(wrap_pyfunction!(max_pool2d_with_indices, m)?)?;
    m.add_function(wrap_pyfunction!(max_pool2d_backward, m)?)?;
    Ok(())
}
