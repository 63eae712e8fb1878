//! Gradients against central finite differences, in f64: the check the
//! op test files share.

use super::{dev, random_host, upload, Rng};
use lazyfuse::ir::{DType, HostTensor};
use lazyfuse::{no_grad, Result, Tensor};

/// A function of uploaded tensors.
pub type F<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;

/// `sum(w * f(xs))` as an f64 scalar, for fixed random weights `w`: a
/// scalar that depends on every output element.
fn weighted(f: &F<'_>, xs: &[Tensor]) -> Result<Tensor> {
    let y = f(xs)?;
    let w = random_host(&mut Rng(99), y.dims(), DType::F64, -1.0, 1.0);
    y.mul(&Tensor::from_host(&w, &dev())?)?.sum(.., false)
}

/// Checks the analytic gradient of `f` with respect to every float input
/// (f64 host tensors; integer inputs such as indices are passed through)
/// against central differences with step 1e-6, to 1e-6 relative.
pub fn gradcheck(what: &str, inputs: &[HostTensor], f: &F<'_>) {
    let eps = 1e-6;
    let xs = upload(inputs);
    let float: Vec<bool> = inputs.iter().map(|h| h.dtype.is_float()).collect();
    for (x, _) in xs.iter().zip(&float).filter(|(_, f)| **f) {
        x.set_requires_grad(true).unwrap();
    }
    weighted(f, &xs).unwrap().backward().unwrap();
    for (i, h) in inputs.iter().enumerate().filter(|(i, _)| float[*i]) {
        let analytic = xs[i].grad().unwrap().to_vec::<f64>().unwrap();
        let base = h.to_f64_vec();
        for j in 0..base.len() {
            let eval = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                let mut hs = inputs.to_vec();
                hs[i] = HostTensor::from_f64(&v, h.shape.clone(), DType::F64);
                no_grad(|| weighted(f, &upload(&hs)))
                    .unwrap()
                    .item::<f64>()
                    .unwrap()
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let a = analytic[j];
            assert!(
                (a - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{what}: d/dx{i}[{j}]: analytic {a}, numeric {numeric}"
            );
        }
    }
}
