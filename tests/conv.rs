//! `conv2d`, `max_pool2d`, `avg_pool2d` and `nn::Conv2d`: values against a
//! direct reference computed on the host in f64 loops (fused and unfused),
//! gradients against central finite differences, a tiny convolutional model
//! that trains and compiles its step once, and argument errors.
//!
//! Every test takes `metrics_lock`: one asserts process-wide compile deltas,
//! and a compile in a concurrently running test would disturb it.

mod common;
use common::gradcheck::gradcheck;
use common::{dev, metrics_lock, random_host, Rng};
use lazyfuse::ir::{DType, HostTensor, Shape};
use lazyfuse::nn::{Conv2d, Linear, Module};
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{metrics, pending_ops, Error, FusionGuard, Result, Tensor};

/// Host data: values and NCHW-style dims.
struct H {
    v: Vec<f64>,
    d: Vec<usize>,
}

fn host(rng: &mut Rng, d: &[usize]) -> H {
    H {
        v: (0..d.iter().product::<usize>())
            .map(|_| rng.range(-1.0, 1.0))
            .collect(),
        d: d.to_vec(),
    }
}

fn out_size(size: usize, k: usize, s: usize, p: usize, dil: usize) -> usize {
    (size + 2 * p - dil * (k - 1) - 1) / s + 1
}

/// The padded input element at (possibly out of range) `(y, x)`, or `None`.
fn at(x: &H, n: usize, c: usize, y: isize, xx: isize) -> Option<f64> {
    let (ch, h, w) = (x.d[1], x.d[2] as isize, x.d[3] as isize);
    if y < 0 || xx < 0 || y >= h || xx >= w {
        return None;
    }
    Some(x.v[((n * ch + c) * h as usize + y as usize) * w as usize + xx as usize])
}

/// Direct convolution, PyTorch semantics.
fn conv_ref(
    x: &H,
    wt: &H,
    b: Option<&H>,
    s: (usize, usize),
    p: (usize, usize),
    dil: (usize, usize),
    groups: usize,
) -> H {
    let [n, c_in, h, w] = x.d[..] else { panic!() };
    let [c_out, cg, kh, kw] = wt.d[..] else {
        panic!()
    };
    assert_eq!(cg * groups, c_in);
    let og = c_out / groups;
    let (oh, ow) = (
        out_size(h, kh, s.0, p.0, dil.0),
        out_size(w, kw, s.1, p.1, dil.1),
    );
    let mut v = Vec::with_capacity(n * c_out * oh * ow);
    for ni in 0..n {
        for co in 0..c_out {
            let g = co / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b.v[co]);
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (oy * s.0 + i * dil.0) as isize - p.0 as isize;
                                let xx = (ox * s.1 + j * dil.1) as isize - p.1 as isize;
                                if let Some(e) = at(x, ni, g * cg + ci, y, xx) {
                                    acc += e * wt.v[((co * cg + ci) * kh + i) * kw + j];
                                }
                            }
                        }
                    }
                    v.push(acc);
                }
            }
        }
    }
    H {
        v,
        d: vec![n, c_out, oh, ow],
    }
}

/// Direct pooling: max with `-inf` padding, or the average with zero
/// padding counted (`count_include_pad=True`).
fn pool_ref(x: &H, k: (usize, usize), s: (usize, usize), p: (usize, usize), max: bool) -> H {
    let [n, c, h, w] = x.d[..] else { panic!() };
    let (oh, ow) = (out_size(h, k.0, s.0, p.0, 1), out_size(w, k.1, s.1, p.1, 1));
    let mut v = Vec::new();
    for ni in 0..n {
        for ci in 0..c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
                    for i in 0..k.0 {
                        for j in 0..k.1 {
                            let y = (oy * s.0 + i) as isize - p.0 as isize;
                            let xx = (ox * s.1 + j) as isize - p.1 as isize;
                            let e = at(x, ni, ci, y, xx);
                            if max {
                                acc = acc.max(e.unwrap_or(f64::NEG_INFINITY));
                            } else {
                                acc += e.unwrap_or(0.0);
                            }
                        }
                    }
                    v.push(if max { acc } else { acc / (k.0 * k.1) as f64 });
                }
            }
        }
    }
    H {
        v,
        d: vec![n, c, oh, ow],
    }
}

fn upload(h: &H, dt: DType) -> Tensor {
    let t = HostTensor::from_f64(&h.v, Shape::new(&h.d), DType::F64);
    Tensor::from_host(&t, &dev()).unwrap().to_dtype(dt).unwrap()
}

/// Runs `f` fused and unfused in `dt` and compares both with `expected`.
fn check(what: &str, expected: &H, dt: DType, f: &dyn Fn() -> Result<Tensor>) {
    let tol = if dt == DType::F64 { 1e-12 } else { 1e-5 };
    let mut outs = Vec::new();
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let y = f().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(y.dims(), &expected.d[..], "{what} fuse={fuse}: shape");
        assert_eq!(y.dtype(), dt, "{what}: dtype");
        let got = y.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        for (i, (a, e)) in got.iter().zip(&expected.v).enumerate() {
            assert!(
                (a - e).abs() <= tol * (1.0 + e.abs()),
                "{what} fuse={fuse} ({dt}): element {i}: got {a}, expected {e}"
            );
        }
        outs.push(got);
    }
    for (a, b) in outs[0].iter().zip(&outs[1]) {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: fused {a} vs unfused {b}"
        );
    }
}

/// `(x dims, weight dims, stride, padding, dilation, groups, bias)`.
type ConvCase = (
    [usize; 4],
    [usize; 4],
    (usize, usize),
    (usize, usize),
    (usize, usize),
    usize,
    bool,
);

const CONV_CASES: [ConvCase; 8] = [
    ([2, 3, 7, 6], [4, 3, 3, 3], (1, 1), (0, 0), (1, 1), 1, true),
    // stride 2, padding 1
    ([2, 2, 7, 8], [3, 2, 3, 3], (2, 2), (1, 1), (1, 1), 1, true),
    // dilation 2, asymmetric padding, non-square kernel
    ([1, 2, 8, 7], [2, 2, 3, 2], (1, 1), (2, 1), (2, 2), 1, false),
    // groups 2 with mixed strides
    ([2, 4, 5, 5], [6, 2, 3, 3], (1, 2), (1, 0), (1, 1), 2, true),
    // depthwise (groups = c_in) with a channel multiplier of 2
    ([2, 3, 6, 6], [6, 1, 3, 3], (1, 1), (1, 1), (1, 1), 3, true),
    // non-square kernel, stride 3 x 2, dilation 1 x 2
    ([1, 2, 9, 7], [2, 2, 2, 4], (3, 2), (0, 1), (1, 2), 1, false),
    // 1 x 1 kernel
    ([3, 4, 3, 2], [5, 4, 1, 1], (1, 1), (0, 0), (1, 1), 1, true),
    // kernel as large as the padded input: 1 x 1 output
    ([2, 2, 3, 3], [2, 1, 5, 4], (2, 1), (1, 1), (1, 1), 2, true),
];

#[test]
fn conv2d_matches_a_direct_reference() {
    let _l = metrics_lock();
    let mut rng = Rng(1);
    for (i, &(xd, wd, s, p, dil, g, bias)) in CONV_CASES.iter().enumerate() {
        let x = host(&mut rng, &xd);
        let w = host(&mut rng, &wd);
        let b = host(&mut rng, &[wd[0]]);
        let b = bias.then_some(&b);
        let expected = conv_ref(&x, &w, b, s, p, dil, g);
        let dts: &[DType] = if i < 2 {
            &[DType::F64, DType::F32]
        } else {
            &[DType::F64]
        };
        for &dt in dts {
            check(
                &format!("conv2d case {i} {xd:?} * {wd:?} s{s:?} p{p:?} d{dil:?} g{g}"),
                &expected,
                dt,
                &|| {
                    let bt = b.map(|b| upload(b, dt));
                    upload(&x, dt).conv2d(&upload(&w, dt), bt.as_ref(), s, p, dil, g)
                },
            );
        }
    }
}

type Pair = (usize, usize);

#[test]
fn pools_match_a_direct_reference() {
    let _l = metrics_lock();
    let mut rng = Rng(2);
    let cases: [([usize; 4], Pair, Pair, Pair); 5] = [
        ([2, 3, 6, 6], (2, 2), (2, 2), (0, 0)),
        ([1, 2, 7, 5], (3, 3), (2, 2), (1, 1)),
        ([2, 2, 5, 8], (2, 3), (1, 2), (1, 1)),
        ([1, 3, 4, 4], (3, 1), (1, 1), (1, 0)),
        ([2, 1, 5, 5], (5, 5), (1, 1), (2, 2)),
    ];
    for (xd, k, s, p) in cases {
        let x = host(&mut rng, &xd);
        for dt in [DType::F64, DType::F32] {
            let what = format!("{xd:?} k{k:?} s{s:?} p{p:?}");
            check(
                &format!("max_pool2d {what}"),
                &pool_ref(&x, k, s, p, true),
                dt,
                &|| upload(&x, dt).max_pool2d(k, s, p),
            );
            check(
                &format!("avg_pool2d {what}"),
                &pool_ref(&x, k, s, p, false),
                dt,
                &|| upload(&x, dt).avg_pool2d(k, s, p),
            );
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let _l = metrics_lock();
    let mut r = Rng(3);
    let mut h = |d: &[usize]| random_host(&mut r, d, DType::F64, -1.0, 1.0);
    // stride 2, padding 1, bias
    let (x, w, b) = (h(&[1, 2, 4, 5]), h(&[2, 2, 2, 3]), h(&[2]));
    gradcheck("conv2d s2 p1", &[x, w, b], &|t| {
        t[0].conv2d(&t[1], Some(&t[2]), (2, 2), (1, 1), (1, 1), 1)
    });
    // dilation 2, groups 2, batch 2
    let (x, w) = (h(&[2, 2, 5, 4]), h(&[4, 1, 2, 2]));
    gradcheck("conv2d d2 g2", &[x, w], &|t| {
        t[0].conv2d(&t[1], None, (1, 1), (0, 1), (2, 2), 2)
    });
    // Pools: distinct random values, so no ties move under the perturbation.
    let x = h(&[2, 2, 5, 4]);
    gradcheck("max_pool2d", std::slice::from_ref(&x), &|t| {
        t[0].max_pool2d((3, 2), (2, 1), (1, 1))
    });
    gradcheck("avg_pool2d", &[x], &|t| {
        t[0].avg_pool2d((3, 2), (2, 1), (1, 1))
    });
}

/// `Conv2d(1 -> 4, 3x3, pad 1) -> relu -> max_pool 2 -> Conv2d(4 -> 4,
/// depthwise) -> avg_pool 3 -> Linear(4 -> 2)`, cross-entropy.
struct Net {
    c1: Conv2d,
    c2: Conv2d,
    head: Linear,
}

impl Net {
    fn new() -> Net {
        let d = dev();
        Net {
            c1: Conv2d::new(1, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, true, 1, &d).unwrap(),
            c2: Conv2d::new(4, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, false, 2, &d).unwrap(),
            head: Linear::new(4, 2, true, 3, &d).unwrap(),
        }
    }
    fn loss(&self, x: &Tensor, y: &[i64]) -> Result<Tensor> {
        let h = self
            .c1
            .forward(x)?
            .relu()?
            .max_pool2d((2, 2), (2, 2), (0, 0))?;
        let h = self
            .c2
            .forward(&h)?
            .relu()?
            .avg_pool2d((3, 3), (1, 1), (0, 0))?;
        let h = h.reshape(&[x.dims()[0], 4])?;
        self.head.forward(&h)?.cross_entropy_ids(y, None)
    }
    fn params(&self) -> Vec<(String, lazyfuse::nn::Param)> {
        let mut v = Vec::new();
        self.c1.visit_params("c1", &mut v);
        self.c2.visit_params("c2", &mut v);
        self.head.visit_params("head", &mut v);
        v
    }
}

#[test]
fn a_conv_net_trains_and_its_step_compiles_once() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let net = Net::new();
    let names: Vec<String> = net.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "c1.weight",
            "c1.bias",
            "c2.weight",
            "head.weight",
            "head.bias"
        ]
    );
    assert_eq!(net.c2.weight.tensor().dims(), &[4, 1, 3, 3]);
    // 8 images 6x6: class 1 when the top half is brighter than the bottom.
    let x = Tensor::randn(&[8, 1, 6, 6], 7, &d).unwrap();
    let v = x.to_vec::<f32>().unwrap();
    let y: Vec<i64> = v
        .chunks(36)
        .map(|im| (im[..18].iter().sum::<f32>() > im[18..].iter().sum::<f32>()) as i64)
        .collect();
    let mut opt = Sgd::new(params_of(&net.params()), 0.5, 0.0, 0.0).unwrap();
    let mut step = || {
        let loss = net.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        loss.item::<f32>().unwrap()
    };
    let before = metrics::snapshot();
    let mut losses = vec![step()];
    let first = metrics::snapshot();
    for _ in 0..5 {
        losses.push(step());
    }
    let after = metrics::snapshot();
    eprintln!(
        "losses {losses:?}; first step {} compiles",
        first.compiles - before.compiles
    );
    assert_eq!(
        first.compiles - before.compiles,
        1,
        "forward, backward and update fuse into one region"
    );
    assert_eq!(after.compiles, first.compiles, "later steps never compile");
    assert!(after.cache_hits > first.cache_hits);
    for w in losses.windows(2) {
        assert!(w[1] < w[0], "loss must fall: {losses:?}");
    }
    assert!(losses[5] < losses[0] - 0.01, "{losses:?}");
}

/// Asserts `r` is an op error for `op` at `line` of this file, with nothing recorded.
#[track_caller]
fn assert_op_err<T: std::fmt::Debug>(r: Result<T>, op: &str, line: u32, pending: usize) {
    let e = r.expect_err("expected an error");
    match &e {
        Error::Op {
            op: got, location, ..
        } => {
            assert_eq!(*got, op, "{e}");
            assert!(location.file().ends_with("conv.rs"), "{e}");
            assert_eq!(location.line(), line, "{e}");
        }
        other => panic!("expected Error::Op, got {other}"),
    }
    assert_eq!(pending_ops(&dev()), pending, "nothing recorded: {e}");
}

#[test]
fn bad_arguments_are_errors_at_the_call_site() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let z = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &d).unwrap();
    let (x, w) = (z(&[2, 4, 5, 5]), z(&[6, 2, 3, 3]));
    let (x3, xi) = (
        z(&[4, 5, 5]),
        Tensor::zeros(&[2, 4, 5, 5], DType::I32, &d).unwrap(),
    );
    let (b_bad, w_big) = (z(&[5]), z(&[6, 4, 8, 3]));
    let w64 = Tensor::zeros(&[6, 4, 3, 3], DType::F64, &d).unwrap();
    let p = pending_ops(&d);
    macro_rules! check {
        ($e:expr, $op:expr) => {{
            let line = line!();
            assert_op_err($e, $op, line, p);
        }};
    }
    let one = (1, 1);
    check!(x3.conv2d(&w, None, one, one, one, 2), "conv2d"); // rank
    check!(x.conv2d(&x3, None, one, one, one, 2), "conv2d"); // weight rank
    check!(xi.conv2d(&w, None, one, one, one, 2), "conv2d"); // dtype
    check!(x.conv2d(&w64, None, one, one, one, 1), "conv2d"); // dtype mismatch
    check!(x.conv2d(&w, None, one, one, one, 1), "conv2d"); // channel mismatch
    check!(x.conv2d(&w, None, one, one, one, 3), "conv2d"); // groups do not divide
    check!(x.conv2d(&w, None, one, one, one, 0), "conv2d"); // zero groups
    check!(x.conv2d(&w, None, (0, 1), one, one, 2), "conv2d"); // zero stride
    check!(x.conv2d(&w, None, one, one, (1, 0), 2), "conv2d"); // zero dilation
    check!(x.conv2d(&w, Some(&b_bad), one, one, one, 2), "conv2d"); // bias shape
    check!(x.conv2d(&w_big, None, one, one, one, 1), "conv2d"); // kernel > padded
    check!(x.conv2d(&w, None, one, (0, 0), (3, 1), 2), "conv2d"); // dilated kernel too big
    check!(x.max_pool2d((2, 2), (0, 2), (0, 0)), "max_pool2d"); // zero stride
    check!(x.max_pool2d((2, 2), (2, 2), (2, 0)), "max_pool2d"); // padding > kernel / 2
    check!(x.max_pool2d((6, 2), (1, 1), (0, 0)), "max_pool2d"); // kernel > input
    check!(x3.avg_pool2d((2, 2), (2, 2), (0, 0)), "avg_pool2d"); // rank
    check!(xi.avg_pool2d((2, 2), (2, 2), (0, 0)), "avg_pool2d"); // dtype
    check!(x.avg_pool2d((0, 2), (1, 1), (0, 0)), "avg_pool2d"); // empty kernel
    let r = Conv2d::new(4, 6, (3, 3), one, one, one, 4, true, 0, &d).map(|_| ());
    assert_op_err(r, "Conv2d::new", line!() - 1, p);
    let msg = x
        .conv2d(&w, None, one, one, one, 3)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("groups (3)"), "{msg}");
    // The valid call records and runs.
    assert_eq!(
        x.conv2d(&w, None, (2, 2), one, one, 2).unwrap().dims(),
        &[2, 6, 3, 3]
    );
}
