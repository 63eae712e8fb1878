//! Gradients of every differentiable op (primitives and composites) against
//! central finite differences in f64, including broadcasting, reductions,
//! layout ops and scalar operands. Each case checks `d/dx sum(w * f(x))` for
//! fixed random weights `w`, so every output element contributes.

use crate::common::{dev, random_host, Rng};
use lazyfuse::ir::{DType, HostTensor, Shape};
use lazyfuse::{no_grad, Result, Tensor};

test_device!(
    unary_ops,
    binary_ops_with_broadcasting_and_scalars,
    select_convert_and_reductions,
    layout_ops_and_matmul,
    composites,
);

type F<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;

/// `sum(w * f(xs))` as an f64 scalar tensor.
fn weighted(f: &F<'_>, xs: &[Tensor], seed: u64) -> Result<Tensor> {
    let y = f(xs)?;
    let y = y.to_dtype(DType::F64)?;
    let w = random_host(&mut Rng(seed), y.dims(), DType::F64, -1.0, 1.0);
    y.mul(&Tensor::from_host(&w, &dev())?)?.sum(.., false)
}

/// Checks the analytic gradient of every f64 input of `f` at `inputs`.
fn gradcheck_eps(what: &str, inputs: &[HostTensor], f: &F<'_>, eps: f64, tol: f64) {
    let xs = crate::common::upload(inputs);
    for x in &xs {
        if x.dtype() == DType::F64 {
            x.set_requires_grad(true).unwrap();
        }
    }
    let loss = weighted(f, &xs, 99).unwrap_or_else(|e| panic!("{what}: {e}"));
    loss.backward()
        .unwrap_or_else(|e| panic!("{what}: backward: {e}"));
    for (i, h) in inputs.iter().enumerate() {
        if h.dtype != DType::F64 {
            continue;
        }
        let analytic = match xs[i].grad() {
            Some(g) => g.to_vec::<f64>().unwrap(),
            None => vec![0.0; h.numel()],
        };
        let base = h.to_f64_vec();
        for j in 0..base.len() {
            let eval = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                let mut hs = inputs.to_vec();
                hs[i] = HostTensor::from_f64(&v, h.shape.clone(), DType::F64);
                let ts = crate::common::upload(&hs);
                no_grad(|| weighted(f, &ts, 99))
                    .unwrap()
                    .item::<f64>()
                    .unwrap()
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let a = analytic[j];
            assert!(
                (a - numeric).abs() <= tol * (1.0 + numeric.abs()),
                "{what}: d/dx{i}[{j}]: analytic {a}, numeric {numeric}\n analytic {analytic:?}"
            );
        }
    }
}

fn gradcheck(what: &str, inputs: &[HostTensor], f: &F<'_>) {
    gradcheck_eps(what, inputs, f, 1e-6, 1e-6);
}

fn h(rng: &mut Rng, dims: &[usize], lo: f64, hi: f64) -> HostTensor {
    random_host(rng, dims, DType::F64, lo, hi)
}

/// Values in `[lo, hi]` at least `gap` away from every multiple of `step`
/// (kinks of relu/abs/floor, ties of max/min).
fn away(rng: &mut Rng, dims: &[usize], lo: f64, hi: f64) -> HostTensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let x = rng.range(lo, hi);
            if (x - x.round()).abs() < 0.1 {
                x.round() + 0.3
            } else {
                x
            }
        })
        .collect();
    HostTensor::from_f64(&v, Shape::new(dims), DType::F64)
}

fn unary_ops() {
    let mut r = Rng(1);
    type U = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, U, f64, f64); 14] = [
        ("neg", |t| t.neg(), -3.0, 3.0),
        ("abs", |t| t.abs(), -3.0, 3.0),
        ("exp", |t| t.exp(), -2.0, 2.0),
        ("log", |t| t.log(), 0.2, 3.0),
        ("sqrt", |t| t.sqrt(), 0.2, 3.0),
        ("rsqrt", |t| t.rsqrt(), 0.2, 3.0),
        ("tanh", |t| t.tanh(), -2.0, 2.0),
        ("sigmoid", |t| t.sigmoid(), -3.0, 3.0),
        ("relu", |t| t.relu(), -3.0, 3.0),
        ("gelu", |t| t.gelu(), -3.0, 3.0),
        ("sin", |t| t.sin(), -3.0, 3.0),
        ("cos", |t| t.cos(), -3.0, 3.0),
        ("floor", |t| t.floor(), -3.0, 3.0),
        ("erf", |t| t.erf(), -2.5, 2.5),
    ];
    for (name, f, lo, hi) in ops {
        let x = away(&mut r, &[2, 3], lo, hi);
        gradcheck(name, &[x], &|t| f(&t[0]));
    }
}

fn binary_ops_with_broadcasting_and_scalars() {
    let mut r = Rng(2);
    type B = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, B); 7] = [
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / b),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
    ];
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[2, 1], &[1, 3]),
        (&[], &[2, 2]),
    ];
    for (name, f) in ops {
        for (sa, sb) in shapes {
            let a = h(&mut r, sa, 0.5, 2.0);
            let b = h(&mut r, sb, 0.5, 2.0);
            gradcheck(&format!("{name}({sa:?}, {sb:?})"), &[a, b], &|t| {
                f(&t[0], &t[1])
            });
        }
    }
    let a = h(&mut r, &[2, 3], 0.5, 2.0);
    gradcheck("x * 2.5", std::slice::from_ref(&a), &|t| &t[0] * 2.5);
    gradcheck("3 - x", std::slice::from_ref(&a), &|t| 3.0 - &t[0]);
    gradcheck("1 / x", std::slice::from_ref(&a), &|t| 1.0 / &t[0]);
    gradcheck("x ^ 3", std::slice::from_ref(&a), &|t| t[0].pow(3.0));
    gradcheck("x + x (accumulation)", std::slice::from_ref(&a), &|t| {
        &t[0] + &t[0]
    });
    gradcheck("x * exp(x) (shared)", &[a], &|t| t[0].mul(&t[0].exp()?));
}

fn select_convert_and_reductions() {
    let mut r = Rng(3);
    let c = random_host(&mut r, &[2, 3], DType::Bool, 0.0, 1.0);
    let a = h(&mut r, &[2, 3], -2.0, 2.0);
    let b = h(&mut r, &[3], -2.0, 2.0);
    gradcheck("where_cond", &[c, a.clone(), b], &|t| {
        t[0].where_cond(&t[1], &t[2])
    });
    // Through f32 and back: linear, so a coarse step is exact up to f32 rounding.
    gradcheck_eps(
        "to_dtype",
        std::slice::from_ref(&a),
        &|t| t[0].to_dtype(DType::F32)?.mul(3.0),
        1e-2,
        1e-5,
    );
    let x = h(&mut r, &[2, 3, 4], -2.0, 2.0);
    for axes in [&[0][..], &[-1], &[0, 2], &[0, 1, 2]] {
        for keep in [false, true] {
            gradcheck(
                &format!("sum({axes:?}, {keep})"),
                std::slice::from_ref(&x),
                &|t| t[0].sum(axes, keep),
            );
            gradcheck(
                &format!("mean({axes:?}, {keep})"),
                std::slice::from_ref(&x),
                &|t| t[0].mean(axes, keep),
            );
            gradcheck(
                &format!("max({axes:?}, {keep})"),
                std::slice::from_ref(&x),
                &|t| t[0].max(axes, keep),
            );
            gradcheck(
                &format!("min({axes:?}, {keep})"),
                std::slice::from_ref(&x),
                &|t| t[0].min(axes, keep),
            );
        }
    }
    gradcheck("sum_all", std::slice::from_ref(&x), &|t| {
        t[0].sum(.., false)
    });
    gradcheck("mean_all", &[x], &|t| t[0].mean(.., false));
}

fn layout_ops_and_matmul() {
    let mut r = Rng(4);
    let x = h(&mut r, &[2, 3, 4], -2.0, 2.0);
    let one = |name: &str, f: &F| gradcheck(name, std::slice::from_ref(&x), f);
    one("reshape", &|t| t[0].reshape(&[6, 4]));
    one("permute", &|t| t[0].permute(&[2, 0, 1]));
    one("transpose", &|t| t[0].transpose(0, -1));
    one("narrow", &|t| t[0].narrow(1, 1, 2));
    one("narrow(start)", &|t| t[0].narrow(2, 0, 1));
    one("unsqueeze", &|t| t[0].unsqueeze(1));
    let s = h(&mut r, &[3, 1], -2.0, 2.0);
    gradcheck("broadcast_to", std::slice::from_ref(&s), &|t| {
        t[0].broadcast_to(&[2, 3, 4])
    });
    gradcheck("squeeze", &[s], &|t| t[0].squeeze(1));
    let a = h(&mut r, &[2, 1, 4], -2.0, 2.0);
    gradcheck("cat", &[x.clone(), a], &|t| Tensor::cat(&[&t[0], &t[1]], 1));
    for (sa, sb) in [
        (&[2, 3][..], &[3, 4][..]),
        (&[2, 2, 3], &[3, 2]),
        (&[2, 1, 2, 3], &[3, 3, 2]),
    ] {
        let a = h(&mut r, sa, -2.0, 2.0);
        let b = h(&mut r, sb, -2.0, 2.0);
        gradcheck(&format!("matmul({sa:?}, {sb:?})"), &[a, b], &|t| {
            t[0].matmul(&t[1])
        });
    }
    let w = h(&mut r, &[4, 3], -2.0, 2.0);
    let idx = HostTensor::from_i64(&[2, 0, 2, 3, 9], Shape::new(&[5]), DType::I64);
    gradcheck("index_select(0)", &[w.clone(), idx.clone()], &|t| {
        t[0].index_select(0, &t[1])
    });
    let idx = HostTensor::from_i64(&[1, 1, 0, 2], Shape::new(&[4]), DType::I32);
    gradcheck("index_select(1)", &[w, idx], &|t| {
        t[0].index_select(1, &t[1])
    });
}

fn composites() {
    let mut r = Rng(5);
    let x = h(&mut r, &[3, 4], -2.0, 2.0);
    let one = |name: &str, f: &F| gradcheck(name, std::slice::from_ref(&x), f);
    one("softmax", &|t| t[0].softmax(-1));
    one("softmax(0)", &|t| t[0].softmax(0));
    one("log_softmax", &|t| t[0].log_softmax(-1));
    one("logsumexp", &|t| t[0].logsumexp(-1, false));
    one("gelu_exact", &|t| t[0].gelu_exact());
    one("clamp", &|t| t[0].clamp(-0.77, 0.93));
    one("layer_norm", &|t| t[0].layer_norm(None, None, 1e-5));
    one("dropout", &|t| t[0].dropout(0.3, 7, true));
    let targets = [1i64, 3, 0];
    one("cross_entropy", &|t| t[0].cross_entropy_ids(&targets, None));
    one("cross_entropy(ignore)", &|t| {
        t[0].cross_entropy_ids(&[1, -100, 2], Some(-100))
    });
    let mask = random_host(&mut r, &[1, 4], DType::Bool, 0.0, 1.0);
    gradcheck("masked_fill", &[x.clone(), mask], &|t| {
        t[0].masked_fill(&t[1], 0.5)
    });
    let idx = HostTensor::from_i64(&[0, 3, 3, 1, 2, 0], Shape::new(&[3, 2]), DType::I64);
    gradcheck("gather", &[x.clone(), idx], &|t| t[0].gather(1, &t[1]));
    let w = h(&mut r, &[4], 0.5, 1.5);
    let b = h(&mut r, &[4], -0.5, 0.5);
    gradcheck("layer_norm(w, b)", &[x, w, b], &|t| {
        t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)
    });
}
