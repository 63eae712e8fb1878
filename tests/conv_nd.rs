//! The convolution op over 1 to 3 spatial dims: `conv1d`/`conv3d`/`conv`
//! against a direct gather reference, `conv_transpose` against the scatter
//! definition PyTorch documents, `flip`, gradients (through the two
//! convolutions of the gradient rule, negative paddings included) against
//! central finite differences, agreement of the interpreter device, and
//! argument errors.
//!
//! Every test takes `metrics_lock` (tests elsewhere assert compile counts).

mod common;
use common::gradcheck::gradcheck;
use common::{dev, metrics_lock, random_host, Rng};
use lazyfuse::ir::{DType, HostTensor, Shape};
use lazyfuse::{pending_ops, Error, FusionGuard, Result, Tensor};

/// Row-major multi-indices of `dims`.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![vec![]];
    for &d in dims {
        all = all
            .into_iter()
            .flat_map(|p: Vec<usize>| {
                (0..d).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    all
}

/// Argument `v` for spatial dim `i` (one value stands for every dim).
fn e(v: &[usize], i: usize) -> usize {
    v[if v.len() == 1 { 0 } else { i }]
}

fn flat(dims: &[usize], idx: &[usize]) -> usize {
    dims.iter().zip(idx).fold(0, |a, (&d, &i)| a * d + i)
}

/// Arguments of one convolution: per-dim stride, padding, dilation, output
/// padding (transposed only), and the groups.
#[derive(Clone, Debug)]
struct A {
    s: Vec<usize>,
    p: Vec<usize>,
    d: Vec<usize>,
    op: Vec<usize>,
    g: usize,
}

/// PyTorch's convolution, gathered: `y[n, o, out] = b[o] + sum x[n, c, out
/// * s + t * d - p] w[o, c, t]` over the group's channels and the taps.
fn conv_ref(x: &HostTensor, w: &HostTensor, b: Option<&HostTensor>, a: &A) -> HostTensor {
    let (xd, wd) = (x.shape.dims(), w.shape.dims());
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let sp = xd.len() - 2;
    let (o, cg) = (wd[0], wd[1]);
    let og = o / a.g;
    let out: Vec<usize> = (0..sp)
        .map(|i| (xd[i + 2] + 2 * e(&a.p, i) - e(&a.d, i) * (wd[i + 2] - 1) - 1) / e(&a.s, i) + 1)
        .collect();
    let mut dims = vec![xd[0], o];
    dims.extend(&out);
    let mut v = vec![0.0; dims.iter().product()];
    for n in 0..xd[0] {
        for oc in 0..o {
            for y in indices(&out) {
                let mut acc = b.map_or(0.0, |b| b.to_f64_vec()[oc]);
                for ci in 0..cg {
                    for t in indices(&wd[2..]) {
                        let pos: Vec<i64> = (0..sp)
                            .map(|i| {
                                (y[i] * e(&a.s, i) + t[i] * e(&a.d, i)) as i64 - e(&a.p, i) as i64
                            })
                            .collect();
                        if pos
                            .iter()
                            .zip(&xd[2..])
                            .any(|(&q, &l)| q < 0 || q >= l as i64)
                        {
                            continue;
                        }
                        let mut xi = vec![n, (oc / og) * cg + ci];
                        xi.extend(pos.iter().map(|&q| q as usize));
                        let mut wi = vec![oc, ci];
                        wi.extend(&t);
                        acc += xv[flat(xd, &xi)] * wv[flat(wd, &wi)];
                    }
                }
                let mut yi = vec![n, oc];
                yi.extend(&y);
                v[flat(&dims, &yi)] = acc;
            }
        }
    }
    HostTensor::from_f64(&v, Shape::new(&dims), DType::F64)
}

/// PyTorch's transposed convolution, scattered: input element `i` adds
/// `x * w[c, o, t]` to output `i * s + t * d - p`.
fn conv_transpose_ref(x: &HostTensor, w: &HostTensor, b: Option<&HostTensor>, a: &A) -> HostTensor {
    let (xd, wd) = (x.shape.dims(), w.shape.dims());
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let sp = xd.len() - 2;
    let (c, og) = (wd[0], wd[1]);
    let cg = c / a.g;
    let out: Vec<usize> = (0..sp)
        .map(|i| {
            (xd[i + 2] - 1) * e(&a.s, i) - 2 * e(&a.p, i)
                + e(&a.d, i) * (wd[i + 2] - 1)
                + e(&a.op, i)
                + 1
        })
        .collect();
    let mut dims = vec![xd[0], og * a.g];
    dims.extend(&out);
    let mut v = vec![0.0; dims.iter().product()];
    for n in 0..xd[0] {
        for ci in 0..c {
            let grp = ci / cg;
            for i in indices(&xd[2..]) {
                let mut xi = vec![n, ci];
                xi.extend(&i);
                let xe = xv[flat(xd, &xi)];
                for oc in 0..og {
                    for t in indices(&wd[2..]) {
                        let pos: Vec<i64> = (0..sp)
                            .map(|k| {
                                (i[k] * e(&a.s, k) + t[k] * e(&a.d, k)) as i64 - e(&a.p, k) as i64
                            })
                            .collect();
                        if pos.iter().zip(&out).any(|(&q, &l)| q < 0 || q >= l as i64) {
                            continue;
                        }
                        let mut wi = vec![ci, oc];
                        wi.extend(&t);
                        let mut yi = vec![n, grp * og + oc];
                        yi.extend(pos.iter().map(|&q| q as usize));
                        v[flat(&dims, &yi)] += xe * wv[flat(wd, &wi)];
                    }
                }
            }
        }
    }
    if let Some(b) = b {
        let per: usize = out.iter().product();
        for (k, e) in v.iter_mut().enumerate() {
            *e += b.to_f64_vec()[(k / per) % dims[1]];
        }
    }
    HostTensor::from_f64(&v, Shape::new(&dims), DType::F64)
}

fn a(s: &[usize], p: &[usize], d: &[usize], op: &[usize], g: usize) -> A {
    A {
        s: s.to_vec(),
        p: p.to_vec(),
        d: d.to_vec(),
        op: op.to_vec(),
        g,
    }
}

/// `(x dims, weight dims, args)`: forward convolutions.
fn forward_cases() -> Vec<(Vec<usize>, Vec<usize>, A)> {
    vec![
        (vec![2, 3, 9], vec![4, 3, 3], a(&[1], &[0], &[1], &[0], 1)),
        (vec![2, 4, 11], vec![6, 2, 3], a(&[2], &[2], &[2], &[0], 2)),
        // depthwise 1-D, padding larger than the kernel span
        (vec![1, 3, 5], vec![3, 1, 2], a(&[1], &[3], &[1], &[0], 3)),
        (
            vec![2, 2, 6, 5],
            vec![3, 2, 3, 2],
            a(&[2, 1], &[1, 0], &[1, 2], &[0], 1),
        ),
        (
            vec![1, 2, 5, 4, 6],
            vec![2, 2, 2, 3, 2],
            a(&[1], &[1], &[1], &[0], 1),
        ),
        (
            vec![2, 4, 6, 5, 5],
            vec![4, 1, 3, 2, 3],
            a(&[2, 1, 2], &[1, 0, 2], &[1, 2, 1], &[0], 4),
        ),
    ]
}

/// Transposed convolutions.
fn transpose_cases() -> Vec<(Vec<usize>, Vec<usize>, A)> {
    vec![
        (vec![2, 3, 5], vec![3, 2, 3], a(&[2], &[1], &[1], &[1], 1)),
        (vec![1, 4, 4], vec![4, 3, 2], a(&[3], &[0], &[2], &[1], 2)),
        (
            vec![2, 2, 3, 4],
            vec![2, 3, 3, 3],
            a(&[2, 1], &[1, 1], &[1, 1], &[1, 0], 1),
        ),
        (
            vec![1, 4, 3, 3],
            vec![4, 1, 2, 2],
            a(&[2], &[0], &[1], &[0], 4),
        ),
        (
            vec![1, 2, 2, 3, 2],
            vec![2, 2, 2, 2, 3],
            a(&[2, 1, 2], &[0, 1, 1], &[1], &[1, 0, 0], 1),
        ),
    ]
}

fn run_forward(t: &[Tensor], a: &A) -> Result<Tensor> {
    t[0].conv(&t[1], t.get(2), &a.s, &a.p, &a.d, a.g)
}

fn run_transpose(t: &[Tensor], a: &A) -> Result<Tensor> {
    t[0].conv_transpose(&t[1], t.get(2), &a.s, &a.p, &a.op, &a.d, a.g)
}

/// Uploads `hs` as `dt`, runs `f` fused and unfused, and checks both
/// against `expected` (f64) within `dt`'s tolerance scaled by the sum size.
fn check(
    what: &str,
    hs: &[HostTensor],
    dt: DType,
    expected: &HostTensor,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) {
    let tol = if dt == DType::F64 { 1e-12 } else { 1e-5 };
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let ts: Vec<Tensor> = common::upload(hs)
            .into_iter()
            .map(|t| t.to_dtype(dt).unwrap())
            .collect();
        let y = f(&ts).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(y.dims(), expected.shape.dims(), "{what} fuse={fuse}: shape");
        let got = y.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        for (i, (g, e)) in got.iter().zip(expected.to_f64_vec()).enumerate() {
            assert!(
                (g - e).abs() <= tol * (1.0 + e.abs()),
                "{what} fuse={fuse} {dt}: element {i}: got {g}, expected {e}"
            );
        }
    }
}

#[test]
fn convolutions_match_direct_references() {
    let _l = metrics_lock();
    let mut r = Rng(7);
    let mut h = |d: &[usize]| random_host(&mut r, d, DType::F64, -1.0, 1.0);
    for (i, (xd, wd, args)) in forward_cases().into_iter().enumerate() {
        let (x, w, b) = (h(&xd), h(&wd), h(&[wd[0]]));
        let e = conv_ref(&x, &w, Some(&b), &args);
        for dt in [DType::F32, DType::F64] {
            check(
                &format!("conv case {i} {args:?}"),
                &[x.clone(), w.clone(), b.clone()],
                dt,
                &e,
                &|t| run_forward(t, &args),
            );
        }
    }
    for (i, (xd, wd, args)) in transpose_cases().into_iter().enumerate() {
        let (x, w, b) = (h(&xd), h(&wd), h(&[wd[1] * args.g]));
        let e = conv_transpose_ref(&x, &w, Some(&b), &args);
        for dt in [DType::F32, DType::F64] {
            check(
                &format!("conv_transpose case {i} {args:?}"),
                &[x.clone(), w.clone(), b.clone()],
                dt,
                &e,
                &|t| run_transpose(t, &args),
            );
        }
    }
    // The fixed-rank spellings are the same op.
    let (x, w) = (h(&[1, 2, 7]), h(&[3, 2, 2]));
    let e = conv_ref(&x, &w, None, &a(&[2], &[1], &[2], &[0], 1));
    check("conv1d", &[x, w], DType::F64, &e, &|t| {
        t[0].conv1d(&t[1], None, 2, 1, 2, 1)
    });
    let (x, w) = (h(&[1, 2, 3, 4, 3]), h(&[2, 1, 2, 2, 2]));
    let e = conv_ref(
        &x,
        &w,
        None,
        &a(&[1, 2, 1], &[1, 0, 1], &[1, 1, 2], &[0], 2),
    );
    check("conv3d", &[x, w], DType::F64, &e, &|t| {
        t[0].conv3d(&t[1], None, [1, 2, 1], [1, 0, 1], [1, 1, 2], 2)
    });
}

#[test]
fn flip_reverses_the_listed_axes() {
    let _l = metrics_lock();
    let x = HostTensor::from_f64(
        &(0..24).map(f64::from).collect::<Vec<_>>(),
        Shape::new(&[2, 3, 4]),
        DType::F32,
    );
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        let t = Tensor::from_host(&x, &dev()).unwrap();
        let y = t.flip(&[-1, 0]).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = indices(&[2, 3, 4])
            .iter()
            .map(|i| ((1 - i[0]) * 12 + i[1] * 4 + (3 - i[2])) as f32)
            .collect();
        assert_eq!(y, want, "fuse={fuse}");
        assert_eq!(
            t.flip(&[]).unwrap().to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );
    }
}

#[test]
fn gradients_match_finite_differences() {
    let _l = metrics_lock();
    let mut r = Rng(5);
    let mut h = |d: &[usize]| random_host(&mut r, d, DType::F64, -1.0, 1.0);
    for (i, (xd, wd, args)) in forward_cases()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 5)
    {
        gradcheck(
            &format!("conv case {i} {args:?}"),
            &[h(&xd), h(&wd), h(&[wd[0]])],
            &|t| run_forward(t, &args),
        );
    }
    for (i, (xd, wd, args)) in transpose_cases()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 4)
    {
        let b = h(&[wd[1] * args.g]);
        gradcheck(
            &format!("conv_transpose case {i} {args:?}"),
            &[h(&xd), h(&wd), b],
            &|t| run_transpose(t, &args),
        );
    }
    // A stride that skips the input's last element (the weight gradient's
    // padding is negative) and a 1-tap kernel with padding beyond it.
    gradcheck(
        "conv1d s3 skips the tail",
        &[h(&[1, 2, 8]), h(&[2, 2, 2])],
        &|t| t[0].conv1d(&t[1], None, 3, 0, 1, 1),
    );
    gradcheck("conv1d k1 p2", &[h(&[2, 1, 3]), h(&[2, 1, 1])], &|t| {
        t[0].conv1d(&t[1], None, 1, 2, 1, 1)
    });
    gradcheck("flip", &[h(&[2, 3, 2])], &|t| t[0].flip(&[0, 2]));
}

#[track_caller]
fn assert_op_err(r: Result<Tensor>, op: &str, pending: usize) {
    let line = std::panic::Location::caller().line();
    match r {
        Err(Error::Op {
            op: o, location, ..
        }) => {
            assert_eq!(o, op);
            // The call may span a few lines once formatted.
            let at = location.line();
            assert!(
                (line..line + 4).contains(&at),
                "{op}: error at line {at}, call at {line}"
            );
        }
        other => panic!("{op}: expected an op error, got {other:?}"),
    }
    assert_eq!(pending_ops(&dev()), pending, "{op}: nothing recorded");
}

#[test]
fn bad_arguments_are_errors_at_the_call_site() {
    let _l = metrics_lock();
    let d = dev();
    let z = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &d).unwrap();
    let (x1, w1, x3, w3) = (
        z(&[2, 4, 9]),
        z(&[6, 2, 3]),
        z(&[1, 2, 4, 4, 4]),
        z(&[2, 2, 3, 3, 3]),
    );
    let (w3_wide, wt, wt3, b4) = (z(&[2, 2, 3, 3, 5]), z(&[4, 3, 3]), z(&[3, 3, 3]), z(&[4]));
    let p = pending_ops(&d);
    assert_op_err(x1.conv(&w1, None, &[1, 1], &[0], &[1], 2), "conv", p); // two strides, one dim
    assert_op_err(x1.conv(&w1, None, &[1], &[0], &[1], 3), "conv", p); // groups
    assert_op_err(x3.conv(&w1, None, &[1], &[0], &[1], 1), "conv", p); // ranks
    assert_op_err(x1.conv1d(&w1, None, 1, 0, 5, 2), "conv1d", p); // dilated kernel too big
    assert_op_err(
        x3.conv3d(&w3, None, [1, 0, 1], [0; 3], [1; 3], 1),
        "conv3d",
        p,
    ); // zero stride
    assert_op_err(
        x3.conv3d(&w3_wide, None, [1; 3], [0; 3], [1; 3], 1),
        "conv3d",
        p,
    );
    assert_op_err(
        x1.conv_transpose(&wt, None, &[2], &[0], &[2], &[1], 1),
        "conv_transpose",
        p,
    ); // output_padding
    assert_op_err(
        x1.conv_transpose(&wt3, None, &[2], &[0], &[0], &[1], 1),
        "conv_transpose",
        p,
    ); // c_in
    assert_op_err(
        x1.conv_transpose(&wt, Some(&b4), &[2], &[0], &[0], &[1], 1),
        "conv_transpose",
        p,
    ); // bias
    assert_op_err(
        x1.conv_transpose(&wt, None, &[1], &[6], &[0], &[1], 1),
        "conv_transpose",
        p,
    ); // empty output
    assert_op_err(x1.flip(&[3]), "flip", p);
}

/// PyTorch's source position of output `j` along an axis of `n` -> `out`.
fn source(j: usize, n: usize, out: usize, corners: bool) -> f64 {
    if corners {
        if out > 1 {
            j as f64 * (n - 1) as f64 / (out - 1) as f64
        } else {
            0.0
        }
    } else {
        ((j as f64 + 0.5) * n as f64 / out as f64 - 0.5).max(0.0)
    }
}

#[test]
fn resizing_matches_pytorchs_definitions() {
    let _l = metrics_lock();
    let mut r = Rng(31);
    let x = random_host(&mut r, &[2, 3, 4, 5], DType::F64, -1.0, 1.0);
    let xv = x.to_f64_vec();
    let at = |n: usize, c: usize, y: usize, xx: usize| xv[((n * 3 + c) * 4 + y) * 5 + xx];
    for (oh, ow, corners) in [
        (7, 9, false),
        (7, 9, true),
        (2, 3, false),
        (4, 5, true),
        (1, 1, false),
    ] {
        let mut want = Vec::new();
        for n in 0..2 {
            for c in 0..3 {
                for i in 0..oh {
                    for j in 0..ow {
                        let (sy, sx) = (source(i, 4, oh, corners), source(j, 5, ow, corners));
                        let (y0, x0) = ((sy as usize).min(3), (sx as usize).min(4));
                        let (y1, x1) = ((y0 + 1).min(3), (x0 + 1).min(4));
                        let (ly, lx) = (sy - y0 as f64, sx - x0 as f64);
                        want.push(
                            (1.0 - ly) * ((1.0 - lx) * at(n, c, y0, x0) + lx * at(n, c, y0, x1))
                                + ly * ((1.0 - lx) * at(n, c, y1, x0) + lx * at(n, c, y1, x1)),
                        );
                    }
                }
            }
        }
        let t = Tensor::from_host(&x, &dev()).unwrap();
        let got = t
            .upsample_bilinear((oh, ow), corners)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 1e-12,
                "bilinear {oh}x{ow} corners {corners}: {k}: {g} vs {w}"
            );
        }
    }
    let t = Tensor::from_host(&x, &dev()).unwrap();
    let got = t
        .upsample_nearest(&[8, 3])
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let mut k = 0;
    for n in 0..2 {
        for c in 0..3 {
            for i in 0..8 {
                for j in 0..3 {
                    assert_eq!(got[k], at(n, c, i * 4 / 8, j * 5 / 3), "nearest {k}");
                    k += 1;
                }
            }
        }
    }
    gradcheck(
        "bilinear",
        &[random_host(&mut r, &[1, 2, 3, 4], DType::F64, -1.0, 1.0)],
        &|t| t[0].upsample_bilinear((5, 7), false),
    );
}
