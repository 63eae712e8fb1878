//! Every op, through the public API, against the reference interpreter, fused
//! and unfused: broadcasting, size-1 and zero-size dims, rank 0, special float
//! values, every dtype the op accepts.

use crate::common::{assert_close, check, dev, random_host, Rng};
use lazyfuse::ir::{
    interp, Axes, BinaryOp, CmpOp, DType, HostTensor, Literal, Op, ReduceOp, Shape, UnaryOp,
};
use lazyfuse::{FusionGuard, Result, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::F16];
const INTS: [DType; 3] = [DType::I32, DType::I64, DType::U8];

/// Float data with the special values mixed in at the front.
fn with_specials(mut h: HostTensor) -> HostTensor {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        1e-40,
        -1e30,
        1e30,
    ];
    let mut v = h.to_f64_vec();
    for (i, s) in specials.iter().enumerate().take(v.len()) {
        v[i] = *s;
    }
    h = HostTensor::from_f64(&v, h.shape.clone(), h.dtype);
    h
}

fn unary_api(u: UnaryOp) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |t| match u {
        UnaryOp::Neg => t[0].neg(),
        UnaryOp::Abs => t[0].abs(),
        UnaryOp::Exp => t[0].exp(),
        UnaryOp::Log => t[0].log(),
        UnaryOp::Sqrt => t[0].sqrt(),
        UnaryOp::Rsqrt => t[0].rsqrt(),
        UnaryOp::Tanh => t[0].tanh(),
        UnaryOp::Sigmoid => t[0].sigmoid(),
        UnaryOp::Relu => t[0].relu(),
        UnaryOp::Gelu => t[0].gelu(),
        UnaryOp::Sin => t[0].sin(),
        UnaryOp::Cos => t[0].cos(),
        UnaryOp::Floor => t[0].floor(),
        UnaryOp::Erf => t[0].erf(),
    }
}

#[test]
fn unary_ops() {
    let mut rng = Rng(1);
    for &u in UnaryOp::ALL {
        let positive = matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt);
        let (lo, hi) = if positive { (0.05, 5.0) } else { (-4.0, 4.0) };
        for dt in FLOATS {
            for dims in [&[][..], &[0], &[3, 4], &[2, 1, 5]] {
                let h = random_host(&mut rng, dims, dt, lo, hi);
                let what = format!("{}({dt}{dims:?})", u.name());
                // Transcendentals in XLA are polynomial approximations: a few ulps.
                check(&what, &Op::Unary(u), &[h], 4.0, &unary_api(u));
            }
            let h = with_specials(random_host(&mut rng, &[12], dt, lo, hi));
            check(
                &format!("{}({dt} specials)", u.name()),
                &Op::Unary(u),
                &[h],
                4.0,
                &unary_api(u),
            );
        }
        if matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu) {
            for dt in INTS {
                let h = random_host(&mut rng, &[4, 3], dt, -100.0, 100.0);
                check(
                    &format!("{}({dt})", u.name()),
                    &Op::Unary(u),
                    &[h],
                    1.0,
                    &unary_api(u),
                );
            }
        }
    }
}

fn binary_api(b: BinaryOp) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |t| match b {
        BinaryOp::Add => &t[0] + &t[1],
        BinaryOp::Sub => &t[0] - &t[1],
        BinaryOp::Mul => &t[0] * &t[1],
        BinaryOp::Div => &t[0] / &t[1],
        BinaryOp::Pow => t[0].pow(&t[1]),
        BinaryOp::Maximum => t[0].maximum(&t[1]),
        BinaryOp::Minimum => t[0].minimum(&t[1]),
    }
}

const PAIRS: [(&[usize], &[usize]); 6] = [
    (&[3, 4], &[3, 4]),
    (&[3, 1], &[4]),
    (&[], &[2, 3]),
    (&[0, 3], &[1, 3]),
    (&[2, 1, 4], &[3, 1]),
    (&[1], &[]),
];

#[test]
fn binary_ops() {
    let mut rng = Rng(2);
    for &b in BinaryOp::ALL {
        for dt in [
            DType::F32,
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::I32,
            DType::I64,
            DType::U8,
        ] {
            if b == BinaryOp::Pow && dt == DType::U8 {
                continue;
            }
            for (sa, sb) in PAIRS {
                let (la, ha, lb, hb) = match (b, dt.is_float()) {
                    (BinaryOp::Pow, true) => (0.1, 3.0, -2.0, 2.0),
                    (BinaryOp::Pow, false) => (-4.0, 4.0, -2.0, 6.0),
                    (BinaryOp::Div, false) => (-50.0, 50.0, -3.0, 3.0),
                    _ => (-20.0, 20.0, -20.0, 20.0),
                };
                let a = random_host(&mut rng, sa, dt, la, ha);
                let c = random_host(&mut rng, sb, dt, lb, hb);
                let what = format!("{}({dt}{sa:?}, {dt}{sb:?})", b.name());
                check(&what, &Op::Binary(b), &[a, c], 2.0, &binary_api(b));
            }
        }
        // NaN and infinities on both sides.
        let a = with_specials(random_host(&mut rng, &[8], DType::F32, -3.0, 3.0));
        let mut c = random_host(&mut rng, &[8], DType::F32, 0.5, 3.0);
        if b != BinaryOp::Pow {
            c = with_specials(c).clone();
            let v: Vec<f64> = c.to_f64_vec().into_iter().rev().collect();
            c = HostTensor::from_f64(&v, c.shape.clone(), c.dtype);
        }
        check(
            &format!("{}(specials)", b.name()),
            &Op::Binary(b),
            &[a, c],
            2.0,
            &binary_api(b),
        );
    }
}

#[test]
fn scalar_operands_and_overloads() {
    let mut rng = Rng(3);
    let h = random_host(&mut rng, &[2, 3], DType::F32, 0.5, 3.0);
    let s = |_op: BinaryOp, v: f64, lhs: bool| {
        let c = HostTensor::from_f64(&[v], Shape::scalar(), DType::F32);
        if lhs {
            vec![c, h.clone()]
        } else {
            vec![h.clone(), c]
        }
    };
    check(
        "t.add(1.5)",
        &Op::Binary(BinaryOp::Add),
        &s(BinaryOp::Add, 1.5, false),
        1.0,
        &|t| t[0].add(1.5),
    );
    check(
        "t - 2",
        &Op::Binary(BinaryOp::Sub),
        &s(BinaryOp::Sub, 2.0, false),
        1.0,
        &|t| &t[0] - 2.0,
    );
    check(
        "3 - t",
        &Op::Binary(BinaryOp::Sub),
        &s(BinaryOp::Sub, 3.0, true),
        1.0,
        &|t| 3.0 - &t[1],
    );
    check(
        "t * 0.25",
        &Op::Binary(BinaryOp::Mul),
        &s(BinaryOp::Mul, 0.25, false),
        1.0,
        &|t| &t[0] * 0.25,
    );
    check(
        "1 / t",
        &Op::Binary(BinaryOp::Div),
        &s(BinaryOp::Div, 1.0, true),
        1.0,
        &|t| 1.0 / &t[1],
    );
    check(
        "t.pow(3.0)",
        &Op::Binary(BinaryOp::Pow),
        &s(BinaryOp::Pow, 3.0, false),
        2.0,
        &|t| t[0].pow(3.0),
    );
    check(
        "t.maximum(1.0)",
        &Op::Binary(BinaryOp::Maximum),
        &s(BinaryOp::Maximum, 1.0, false),
        1.0,
        &|t| t[0].maximum(1.0),
    );
    check(
        "t.minimum(1.0)",
        &Op::Binary(BinaryOp::Minimum),
        &s(BinaryOp::Minimum, 1.0, false),
        1.0,
        &|t| t[0].minimum(1.0),
    );
    check(
        "t.ge(1.0)",
        &Op::Compare(CmpOp::Ge),
        &s(BinaryOp::Add, 1.0, false),
        1.0,
        &|t| t[0].ge(1.0),
    );
    check(
        "-t",
        &Op::Unary(UnaryOp::Neg),
        std::slice::from_ref(&h),
        1.0,
        &|t| -&t[0],
    );
    let i = random_host(&mut rng, &[5], DType::I64, -9.0, 9.0);
    let c = HostTensor::from_i64(&[3], Shape::scalar(), DType::I64);
    check("i64 * 3", &Op::Binary(BinaryOp::Mul), &[i, c], 1.0, &|t| {
        &t[0] * 3.0
    });
}

#[test]
fn comparisons_and_select() {
    let mut rng = Rng(4);
    for &c in CmpOp::ALL {
        for dt in [DType::F32, DType::BF16, DType::I32, DType::U8, DType::Bool] {
            for (sa, sb) in &PAIRS[..5] {
                let a = random_host(&mut rng, sa, dt, -3.0, 3.0);
                let b = random_host(&mut rng, sb, dt, -3.0, 3.0);
                let api = move |t: &[Tensor]| match c {
                    CmpOp::Eq => t[0].eq(&t[1]),
                    CmpOp::Ne => t[0].ne(&t[1]),
                    CmpOp::Lt => t[0].lt(&t[1]),
                    CmpOp::Le => t[0].le(&t[1]),
                    CmpOp::Gt => t[0].gt(&t[1]),
                    CmpOp::Ge => t[0].ge(&t[1]),
                };
                check(
                    &format!("{}({dt}{sa:?},{sb:?})", c.name()),
                    &Op::Compare(c),
                    &[a, b],
                    1.0,
                    &api,
                );
            }
        }
        let a = with_specials(random_host(&mut rng, &[8], DType::F32, -3.0, 3.0));
        let b = HostTensor::from_f64(
            &[f64::NAN, 1.0, f64::INFINITY, 0.0, -0.0, 0.0, 5.0, 1e30],
            Shape::new(&[8]),
            DType::F32,
        );
        let api = move |t: &[Tensor]| Tensor::apply_op(Op::Compare(c), &[&t[0], &t[1]]);
        check(
            &format!("{}(specials)", c.name()),
            &Op::Compare(c),
            &[a, b],
            1.0,
            &api,
        );
    }
    for dt in [DType::F32, DType::I64, DType::Bool, DType::F16] {
        for (sc, sa, sb) in [
            (&[2, 3][..], &[2, 3][..], &[2, 3][..]),
            (&[3, 1], &[4], &[]),
            (&[], &[0, 2], &[1, 2]),
        ] {
            let c = random_host(&mut rng, sc, DType::Bool, 0.0, 1.0);
            let a = random_host(&mut rng, sa, dt, -9.0, 9.0);
            let b = random_host(&mut rng, sb, dt, -9.0, 9.0);
            check(
                &format!("where({sc:?},{dt}{sa:?},{sb:?})"),
                &Op::Select,
                &[c, a, b],
                1.0,
                &|t| t[0].where_cond(&t[1], &t[2]),
            );
        }
    }
}

#[test]
fn conversions() {
    let mut rng = Rng(5);
    for from in DType::ALL {
        for to in DType::ALL {
            let mut h = random_host(&mut rng, &[3, 5], from, -300.0, 300.0);
            if from.is_float() {
                // Fractions, negatives and out-of-range values (saturation), plus NaN.
                let mut v = h.to_f64_vec();
                v[0] = -0.75;
                v[1] = 2.5;
                v[2] = 1e10;
                v[3] = -1e10;
                v[4] = f64::NAN;
                v[5] = f64::INFINITY;
                h = HostTensor::from_f64(&v, h.shape.clone(), from);
            }
            check(
                &format!("{from}->{to}"),
                &Op::Convert(to),
                &[h],
                1.0,
                &|t| t[0].to_dtype(to),
            );
        }
    }
}

#[test]
fn reductions() {
    let mut rng = Rng(6);
    let axes_sets: [&[isize]; 6] = [&[], &[0], &[1], &[-1], &[0, 2], &[0, 1, 2]];
    for &r in ReduceOp::ALL {
        for dt in [
            DType::F32,
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::I32,
            DType::I64,
            DType::U8,
        ] {
            if r == ReduceOp::Mean && !dt.is_float() {
                continue;
            }
            for (k, axes) in axes_sets.iter().enumerate() {
                let keepdim = k % 2 == 1;
                let h = random_host(&mut rng, &[3, 4, 5], dt, -10.0, 10.0);
                let norm: Axes = lazyfuse::ir::normalize_axes(axes, 3).unwrap();
                let op = Op::Reduce {
                    op: r,
                    axes: norm,
                    keepdim,
                };
                let api = move |t: &[Tensor]| match r {
                    ReduceOp::Sum => t[0].sum(*axes, keepdim),
                    ReduceOp::Mean => t[0].mean(*axes, keepdim),
                    ReduceOp::Max => t[0].max(*axes, keepdim),
                    ReduceOp::Min => t[0].min(*axes, keepdim),
                };
                // Sums of 60 terms: allow the accumulation-order difference.
                check(
                    &format!("{}({dt}, {axes:?}, keepdim={keepdim})", r.name()),
                    &op,
                    &[h],
                    8.0,
                    &api,
                );
            }
        }
        // Zero-size non-reduced dims, rank 0, and NaN propagation.
        let h = random_host(&mut rng, &[0, 3], DType::F32, -1.0, 1.0);
        let op = Op::Reduce {
            op: r,
            axes: Axes::from_slice(&[1]),
            keepdim: false,
        };
        check(&format!("{}(zero-size)", r.name()), &op, &[h], 1.0, &|t| {
            Tensor::apply_op(op.clone(), &[&t[0]])
        });
        let h = random_host(&mut rng, &[], DType::F32, -1.0, 1.0);
        check(
            &format!("{}_all(rank 0)", r.name()),
            &Op::Reduce {
                op: r,
                axes: Axes::new(),
                keepdim: false,
            },
            &[h],
            1.0,
            &|t| match r {
                ReduceOp::Sum => t[0].sum(.., false),
                ReduceOp::Mean => t[0].mean(.., false),
                ReduceOp::Max => t[0].max(.., false),
                ReduceOp::Min => t[0].min(.., false),
            },
        );
        let h = with_specials(random_host(&mut rng, &[2, 8], DType::F32, -1.0, 1.0));
        let op = Op::Reduce {
            op: r,
            axes: Axes::from_slice(&[1]),
            keepdim: true,
        };
        check(&format!("{}(specials)", r.name()), &op, &[h], 1.0, &|t| {
            Tensor::apply_op(op.clone(), &[&t[0]])
        });
    }
    // Sum over a zero-size axis is the identity element.
    let h = random_host(&mut rng, &[2, 0], DType::F32, -1.0, 1.0);
    let op = Op::Reduce {
        op: ReduceOp::Sum,
        axes: Axes::from_slice(&[1]),
        keepdim: false,
    };
    check("sum(zero-size axis)", &op, &[h], 1.0, &|t| {
        t[0].sum([1], false)
    });
}

#[test]
fn argmax() {
    let mut rng = Rng(7);
    for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::U8] {
        for axis in 0..3 {
            for keepdim in [false, true] {
                // Few distinct values so ties are common.
                let h = random_host(&mut rng, &[3, 4, 5], dt, -2.0, 2.0);
                let h = if dt.is_float() {
                    let v: Vec<f64> = h.to_f64_vec().iter().map(|x| x.round()).collect();
                    HostTensor::from_f64(&v, h.shape.clone(), dt)
                } else {
                    h
                };
                let op = Op::ArgMax { axis, keepdim };
                check(
                    &format!("argmax({dt}, {axis}, {keepdim})"),
                    &op,
                    &[h],
                    1.0,
                    &|t| t[0].argmax(axis as isize, keepdim),
                );
            }
        }
    }
    let h = HostTensor::from_f64(
        &[
            1.0,
            f64::NAN,
            3.0,
            f64::NAN,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            2.0,
            2.0,
        ],
        Shape::new(&[4, 2]),
        DType::F32,
    );
    check(
        "argmax(NaN first wins)",
        &Op::ArgMax {
            axis: 0,
            keepdim: false,
        },
        std::slice::from_ref(&h),
        1.0,
        &|t| t[0].argmax(0, false),
    );
    check(
        "argmax(rows)",
        &Op::ArgMax {
            axis: 1,
            keepdim: true,
        },
        &[h],
        1.0,
        &|t| t[0].argmax(-1, true),
    );
}

#[test]
fn layout_ops() {
    let mut rng = Rng(8);
    for dt in DType::ALL {
        let h = random_host(&mut rng, &[2, 3, 4], dt, -50.0, 50.0);
        let one = |op: Op, f: &dyn Fn(&Tensor) -> Result<Tensor>, what: &str| {
            check(
                &format!("{what}({dt})"),
                &op,
                std::slice::from_ref(&h),
                1.0,
                &|t| f(&t[0]),
            );
        };
        one(
            Op::Reshape(Shape::new(&[4, 6])),
            &|t| t.reshape(&[4, 6]),
            "reshape",
        );
        one(
            Op::Reshape(Shape::new(&[24])),
            &|t| t.reshape(&[24]),
            "reshape",
        );
        one(
            Op::Permute(Axes::from_slice(&[2, 0, 1])),
            &|t| t.permute(&[2, 0, 1]),
            "permute",
        );
        one(
            Op::Permute(Axes::from_slice(&[1, 2, 0])),
            &|t| t.permute(&[1, 2, 0]),
            "permute",
        );
        one(
            Op::Permute(Axes::from_slice(&[0, 2, 1])),
            &|t| t.transpose(-1, 1),
            "transpose",
        );
        one(
            Op::Slice {
                axis: 1,
                start: 1,
                len: 2,
            },
            &|t| t.narrow(1, 1, 2),
            "narrow",
        );
        one(
            Op::Slice {
                axis: 2,
                start: 4,
                len: 0,
            },
            &|t| t.narrow(-1, 4, 0),
            "narrow(empty)",
        );
        one(
            Op::Reshape(Shape::new(&[2, 1, 3, 4])),
            &|t| t.unsqueeze(1),
            "unsqueeze",
        );
        one(
            Op::Reshape(Shape::new(&[2, 3, 4, 1])),
            &|t| t.unsqueeze(-1),
            "unsqueeze(-1)",
        );
        let s = random_host(&mut rng, &[3, 1], dt, -5.0, 5.0);
        check(
            &format!("broadcast_to({dt})"),
            &Op::BroadcastTo(Shape::new(&[2, 3, 4])),
            std::slice::from_ref(&s),
            1.0,
            &|t| t[0].broadcast_to(&[2, 3, 4]),
        );
        check(
            &format!("squeeze({dt})"),
            &Op::Reshape(Shape::new(&[3])),
            &[s],
            1.0,
            &|t| t[0].squeeze(1),
        );
        let a = random_host(&mut rng, &[2, 1, 4], dt, -5.0, 5.0);
        let b = random_host(&mut rng, &[2, 0, 4], dt, -5.0, 5.0);
        check(
            &format!("cat({dt})"),
            &Op::Concat { axis: 1 },
            &[h.clone(), a, b],
            1.0,
            &|t| Tensor::cat(&[&t[0], &t[1], &t[2]], 1),
        );
        let r0 = random_host(&mut rng, &[], dt, -5.0, 5.0);
        check(
            &format!("reshape(rank0 {dt})"),
            &Op::Reshape(Shape::new(&[1, 1])),
            &[r0],
            1.0,
            &|t| t[0].reshape(&[1, 1]),
        );
    }
}

#[test]
fn matmul() {
    let mut rng = Rng(9);
    let cases: [(&[usize], &[usize]); 6] = [
        (&[2, 3], &[3, 4]),
        (&[5, 2, 3], &[3, 4]),
        (&[2, 1, 2, 3], &[3, 3, 2]),
        (&[1, 1], &[1, 1]),
        (&[2, 0], &[0, 3]),
        (&[0, 4], &[4, 2]),
    ];
    for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64] {
        for (sa, sb) in cases {
            let a = random_host(&mut rng, sa, dt, -3.0, 3.0);
            let b = random_host(&mut rng, sb, dt, -3.0, 3.0);
            check(
                &format!("matmul({dt}{sa:?}, {sb:?})"),
                &Op::MatMul,
                &[a, b],
                4.0,
                &|t| t[0].matmul(&t[1]),
            );
        }
    }
}

#[test]
fn creation_ops() {
    for dt in DType::ALL {
        let v = if dt == DType::Bool { 1.0 } else { 3.0 };
        let op = Op::Constant {
            value: if dt.is_float() {
                Literal::Float(v)
            } else if dt == DType::Bool {
                Literal::Bool(true)
            } else {
                Literal::Int(v as i64)
            },
            shape: Shape::new(&[2, 2]),
            dtype: dt,
        };
        let expected = interp::eval_op(&op, &[]).unwrap();
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let got = Tensor::full(v, &[2, 2], dt, &dev())
                .unwrap()
                .to_host()
                .unwrap();
            assert_close(&format!("full({dt})"), &got, &expected, 1.0);
        }
        if dt.is_numeric() {
            let op = Op::Arange {
                start: Literal::Int(2),
                step: Literal::Int(3),
                len: 5,
                dtype: dt,
            };
            let expected = interp::eval_op(&op, &[]).unwrap();
            let got = Tensor::arange_step(2.0, 15.0, 3.0, dt, &dev())
                .unwrap()
                .to_host()
                .unwrap();
            assert_close(&format!("arange({dt})"), &got, &expected, 1.0);
        }
    }
    let op = Op::Arange {
        start: Literal::Float(0.5),
        step: Literal::Float(0.1),
        len: 10,
        dtype: DType::F32,
    };
    let expected = interp::eval_op(&op, &[]).unwrap();
    let got = Tensor::arange_step(0.5, 1.45, 0.1, DType::F32, &dev())
        .unwrap()
        .to_host()
        .unwrap();
    assert_close("arange(f32 fractional)", &got, &expected, 1.0);
}
