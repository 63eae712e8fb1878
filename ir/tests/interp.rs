//! Reference interpreter tests with hand-computed expected values.

use half::{bf16, f16};
use lazyfuse_ir::interp::{eval_graph, eval_op};
use lazyfuse_ir::{
    Axes, BinaryOp, CmpOp, DType, Element, Graph, HostTensor, Literal, NodeId, Op, ReduceOp, Shape,
    UnaryOp,
};
use std::collections::HashMap;
use std::panic::Location;

const NAN: f64 = f64::NAN;

fn t<T: Element>(data: &[T], dims: &[usize]) -> HostTensor {
    HostTensor::from_slice(data, Shape::new(dims))
}

fn ev(op: Op, inputs: &[&HostTensor]) -> HostTensor {
    eval_op(&op, inputs).unwrap_or_else(|e| panic!("{}: {e}", op.name()))
}

fn axes(a: &[usize]) -> Axes {
    Axes::from_slice(a)
}

/// Asserts shape and values, treating NaN as equal to NaN and -0.0 as distinct from 0.0.
fn assert_f64(t: &HostTensor, dims: &[usize], want: &[f64]) {
    assert_eq!(t.shape.dims(), dims, "shape");
    let got = t.to_f64_vec();
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "element {i}: got {g:?}, want {w:?} (all: {got:?})");
    }
}

fn assert_vals<T: Element + PartialEq>(t: &HostTensor, dims: &[usize], want: &[T]) {
    assert_eq!(t.shape.dims(), dims, "shape");
    assert_eq!(t.to_vec::<T>().expect("dtype"), want);
}

#[test]
fn binary_broadcasts_3x1_with_4() {
    let a = t(&[1f32, 2., 3.], &[3, 1]);
    let b = t(&[10f32, 20., 30., 40.], &[4]);
    let out = ev(Op::Binary(BinaryOp::Add), &[&a, &b]);
    assert_vals(
        &out,
        &[3, 4],
        &[11f32, 21., 31., 41., 12., 22., 32., 42., 13., 23., 33., 43.],
    );
    let out = ev(Op::Binary(BinaryOp::Sub), &[&b, &a]);
    assert_vals(
        &out,
        &[3, 4],
        &[9f32, 19., 29., 39., 8., 18., 28., 38., 7., 17., 27., 37.],
    );
    let out = ev(Op::Binary(BinaryOp::Pow), &[&a, &t(&[2f32], &[1])]);
    assert_vals(&out, &[3, 1], &[1f32, 4., 9.]);
}

#[test]
fn float_results_round_once_to_the_dtype() {
    let one = t(&[bf16::from_f32(1.0)], &[]);
    let three = t(&[bf16::from_f32(3.0)], &[]);
    // 1/3 = 1.0101010|101...b * 2^-2 rounds up to 1.0101011b * 2^-2.
    assert_f64(
        &ev(Op::Binary(BinaryOp::Div), &[&one, &three]),
        &[],
        &[0.333984375],
    );
    let e = ev(Op::Unary(UnaryOp::Exp), &[&t(&[1f32], &[1])]);
    assert_vals(&e, &[1], &[std::f32::consts::E]);
}

#[test]
fn unary_float_ops() {
    let x = t(&[0f64, 1., 4.], &[3]);
    let un = |op| ev(Op::Unary(op), &[&x]);
    assert_f64(&un(UnaryOp::Neg), &[3], &[-0.0, -1., -4.]);
    assert_f64(
        &un(UnaryOp::Exp),
        &[3],
        &[1., std::f64::consts::E, 4f64.exp()],
    );
    assert_f64(&un(UnaryOp::Log), &[3], &[f64::NEG_INFINITY, 0., 4f64.ln()]);
    assert_f64(&un(UnaryOp::Sqrt), &[3], &[0., 1., 2.]);
    assert_f64(&un(UnaryOp::Rsqrt), &[3], &[f64::INFINITY, 1., 0.5]);
    assert_f64(
        &un(UnaryOp::Sigmoid),
        &[3],
        &[0.5, 1. / (1. + (-1f64).exp()), 1. / (1. + (-4f64).exp())],
    );
    assert_f64(&un(UnaryOp::Sin), &[3], &[0., 1f64.sin(), 4f64.sin()]);
    assert_f64(&un(UnaryOp::Cos), &[3], &[1., 1f64.cos(), 4f64.cos()]);
    assert_f64(&un(UnaryOp::Tanh), &[3], &[0., 1f64.tanh(), 4f64.tanh()]);
    let g1 = 0.5 * (1. + (0.7978845608028654f64 * 1.044715).tanh());
    assert_f64(
        &un(UnaryOp::Gelu),
        &[3],
        &[
            0.,
            g1,
            2. * (1. + (0.7978845608028654f64 * (4. + 0.044715 * 64.)).tanh()),
        ],
    );
    let y = t(&[-1.5f32, -0.0, f32::NAN, 2.5], &[4]);
    assert_f64(
        &ev(Op::Unary(UnaryOp::Floor), &[&y]),
        &[4],
        &[-2., -0.0, NAN, 2.],
    );
    assert_f64(
        &ev(Op::Unary(UnaryOp::Abs), &[&y]),
        &[4],
        &[1.5, 0.0, NAN, 2.5],
    );
    // relu(x) = maximum(x, 0): NaN stays NaN, -0.0 becomes +0.0.
    assert_f64(
        &ev(Op::Unary(UnaryOp::Relu), &[&y]),
        &[4],
        &[0.0, 0.0, NAN, 2.5],
    );
}

#[test]
fn unary_integer_ops_wrap() {
    let u = t(&[0u8, 1, 255], &[3]);
    assert_vals(&ev(Op::Unary(UnaryOp::Neg), &[&u]), &[3], &[0u8, 255, 1]);
    assert_vals(&ev(Op::Unary(UnaryOp::Abs), &[&u]), &[3], &[0u8, 1, 255]);
    assert_vals(&ev(Op::Unary(UnaryOp::Relu), &[&u]), &[3], &[0u8, 1, 255]);
    let i = t(&[i32::MIN, -5, 7], &[3]);
    assert_vals(
        &ev(Op::Unary(UnaryOp::Neg), &[&i]),
        &[3],
        &[i32::MIN, 5, -7],
    );
    assert_vals(&ev(Op::Unary(UnaryOp::Abs), &[&i]), &[3], &[i32::MIN, 5, 7]);
    assert_vals(&ev(Op::Unary(UnaryOp::Relu), &[&i]), &[3], &[0i32, 0, 7]);
    assert!(eval_op(&Op::Unary(UnaryOp::Exp), &[&i]).is_err());
}

#[test]
fn integer_arithmetic_wraps_and_divides_like_xla() {
    let a = t(&[7i32, -7, 7, -7, 5, i32::MIN, i32::MAX], &[7]);
    let b = t(&[2i32, 2, -2, -2, 0, -1, 0], &[7]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Div), &[&a, &b]),
        &[7],
        &[3i32, -3, -3, 3, -1, i32::MIN, -1],
    );
    let one = t(&[1i32], &[]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Add), &[&t(&[i32::MAX], &[]), &one]),
        &[],
        &[i32::MIN],
    );
    let l = t(&[i64::MIN, 9], &[2]);
    let r = t(&[-1i64, 0], &[2]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Div), &[&l, &r]),
        &[2],
        &[i64::MIN, -1],
    );
    assert_vals(
        &ev(Op::Binary(BinaryOp::Mul), &[&l, &r]),
        &[2],
        &[i64::MIN, 0],
    );
    let u = t(&[7u8, 200, 3, 16], &[4]);
    let v = t(&[0u8, 3, 5, 16], &[4]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Div), &[&u, &v]),
        &[4],
        &[255u8, 66, 0, 1],
    );
    assert_vals(
        &ev(Op::Binary(BinaryOp::Sub), &[&u, &v]),
        &[4],
        &[7u8, 197, 254, 0],
    );
    assert_vals(
        &ev(Op::Binary(BinaryOp::Mul), &[&u, &v]),
        &[4],
        &[0u8, 88, 15, 0],
    );
    assert_vals(
        &ev(Op::Binary(BinaryOp::Maximum), &[&u, &v]),
        &[4],
        &[7u8, 200, 5, 16],
    );
    let base = t(&[2i32, 3, 1, -1, -1, 0, -3], &[7]);
    let exp = t(&[31i32, -1, -5, -3, -4, 0, 3], &[7]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Pow), &[&base, &exp]),
        &[7],
        &[i32::MIN, 0, 1, -1, 1, 1, -27],
    );
    assert!(eval_op(&Op::Binary(BinaryOp::Pow), &[&u, &v]).is_err());
}

#[test]
fn maximum_minimum_propagate_nan() {
    let a = t(&[NAN, 1., 2., -0.0], &[4]);
    let b = t(&[0., NAN, 3., 0.0], &[4]);
    assert_f64(
        &ev(Op::Binary(BinaryOp::Maximum), &[&a, &b]),
        &[4],
        &[NAN, NAN, 3., 0.0],
    );
    assert_f64(
        &ev(Op::Binary(BinaryOp::Minimum), &[&a, &b]),
        &[4],
        &[NAN, NAN, 2., -0.0],
    );
}

#[test]
fn comparisons() {
    let a = t(&[1f32, f32::NAN, 3.], &[3]);
    let b = t(&[1f32, f32::NAN, 2.], &[3]);
    let cmp = |op, x: &HostTensor, y: &HostTensor| ev(Op::Compare(op), &[x, y]);
    assert_vals(&cmp(CmpOp::Eq, &a, &b), &[3], &[true, false, false]);
    assert_vals(&cmp(CmpOp::Ne, &a, &b), &[3], &[false, true, true]);
    assert_vals(&cmp(CmpOp::Lt, &a, &b), &[3], &[false, false, false]);
    assert_vals(&cmp(CmpOp::Le, &a, &b), &[3], &[true, false, false]);
    assert_vals(&cmp(CmpOp::Gt, &a, &b), &[3], &[false, false, true]);
    assert_vals(&cmp(CmpOp::Ge, &a, &b), &[3], &[true, false, true]);
    // Integers broadcast [2,1] with [3]; u8 compares as unsigned.
    let x = t(&[0u8, 200], &[2, 1]);
    let y = t(&[0u8, 100, 255], &[3]);
    assert_vals(
        &cmp(CmpOp::Lt, &x, &y),
        &[2, 3],
        &[false, true, true, false, false, true],
    );
    let p = t(&[true, false], &[2]);
    assert_vals(&cmp(CmpOp::Gt, &p, &t(&[false], &[])), &[2], &[true, false]);
}

#[test]
fn select_broadcasts_and_copies_bits() {
    let cond = t(&[true, false], &[2, 1]);
    let nan = f32::from_bits(0x7fc0_1234);
    let on_true = t(&[nan, -0.0f32, 1.], &[3]);
    let on_false = t(&[9f32], &[]);
    let out = ev(Op::Select, &[&cond, &on_true, &on_false]);
    assert_eq!(out.shape.dims(), &[2, 3]);
    let bits: Vec<u32> = out
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(
        bits,
        [
            0x7fc0_1234,
            0x8000_0000,
            1f32.to_bits(),
            9f32.to_bits(),
            9f32.to_bits(),
            9f32.to_bits()
        ]
    );
    assert!(eval_op(&Op::Select, &[&on_true, &on_true, &on_false]).is_err());
}

#[test]
fn convert_saturates_wraps_and_rounds() {
    let f = t(
        &[f32::NAN, 1e10, -1e10, 2.7, -2.7, 300., -1., f32::INFINITY],
        &[8],
    );
    let dims = &[8];
    assert_vals(
        &ev(Op::Convert(DType::I32), &[&f]),
        dims,
        &[0, i32::MAX, i32::MIN, 2, -2, 300, -1, i32::MAX],
    );
    assert_vals(
        &ev(Op::Convert(DType::U8), &[&f]),
        dims,
        &[0u8, 255, 0, 2, 0, 255, 0, 255],
    );
    assert_vals(
        &ev(Op::Convert(DType::I64), &[&f]),
        dims,
        &[
            0i64,
            10_000_000_000,
            -10_000_000_000,
            2,
            -2,
            300,
            -1,
            i64::MAX,
        ],
    );
    assert_vals(&ev(Op::Convert(DType::Bool), &[&f]), dims, &[true; 8]);
    assert_vals(
        &ev(Op::Convert(DType::Bool), &[&t(&[0.0f64, -0.0], &[2])]),
        &[2],
        &[false, false],
    );
    // Integer → integer keeps the low bits.
    let i = t(&[(1i64 << 32) + 5, -1, 300], &[3]);
    assert_vals(&ev(Op::Convert(DType::I32), &[&i]), &[3], &[5i32, -1, 300]);
    assert_vals(&ev(Op::Convert(DType::U8), &[&i]), &[3], &[5u8, 255, 44]);
    assert_vals(
        &ev(Op::Convert(DType::Bool), &[&i]),
        &[3],
        &[true, true, true],
    );
    assert_vals(
        &ev(Op::Convert(DType::I64), &[&t(&[255u8], &[])]),
        &[],
        &[255i64],
    );
    // Integer → float rounds once to nearest-even.
    assert_vals(
        &ev(Op::Convert(DType::BF16), &[&t(&[257i32, 259], &[2])]),
        &[2],
        &[bf16::from_f32(256.), bf16::from_f32(260.)],
    );
    assert_vals(
        &ev(Op::Convert(DType::F32), &[&t(&[16_777_217i64], &[])]),
        &[],
        &[16_777_216f32],
    );
    assert_vals(
        &ev(Op::Convert(DType::F16), &[&t(&[70_000i32], &[])]),
        &[],
        &[f16::INFINITY],
    );
    // Bool → anything is 0/1; float → float rounds to nearest.
    assert_vals(
        &ev(Op::Convert(DType::F32), &[&t(&[true, false], &[2])]),
        &[2],
        &[1f32, 0.],
    );
    assert_vals(
        &ev(Op::Convert(DType::U8), &[&t(&[true, false], &[2])]),
        &[2],
        &[1u8, 0],
    );
    assert_vals(
        &ev(
            Op::Convert(DType::F16),
            &[&t(&[65520f64, 1.0 + 2f64.powi(-11)], &[2])],
        ),
        &[2],
        &[f16::INFINITY, f16::ONE],
    );
    // Same dtype is an exact copy (NaN payload kept).
    let payload = t(&[f64::from_bits(0x7ff8_0000_0000_beef)], &[1]);
    assert_eq!(ev(Op::Convert(DType::F64), &[&payload]), payload);
}

#[test]
fn constants_and_aranges() {
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Float(2.5),
                shape: Shape::new(&[2, 2]),
                dtype: DType::F32,
            },
            &[],
        ),
        &[2, 2],
        &[2.5f32; 4],
    );
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Int(3),
                shape: Shape::scalar(),
                dtype: DType::F16,
            },
            &[],
        ),
        &[],
        &[f16::from_f32(3.)],
    );
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Bool(true),
                shape: Shape::new(&[2]),
                dtype: DType::I32,
            },
            &[],
        ),
        &[2],
        &[1i32, 1],
    );
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Float(NAN),
                shape: Shape::new(&[1]),
                dtype: DType::Bool,
            },
            &[],
        ),
        &[1],
        &[true],
    );
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Float(-4.0),
                shape: Shape::new(&[1]),
                dtype: DType::I64,
            },
            &[],
        ),
        &[1],
        &[-4i64],
    );
    assert_vals(
        &ev(
            Op::Constant {
                value: Literal::Int(255),
                shape: Shape::new(&[0, 3]),
                dtype: DType::U8,
            },
            &[],
        ),
        &[0, 3],
        &[] as &[u8],
    );
    assert!(eval_op(
        &Op::Constant {
            value: Literal::Int(256),
            shape: Shape::scalar(),
            dtype: DType::U8
        },
        &[]
    )
    .is_err());

    let ar = |start, step, len, dtype| {
        ev(
            Op::Arange {
                start,
                step,
                len,
                dtype,
            },
            &[],
        )
    };
    assert_vals(
        &ar(Literal::Float(0.5), Literal::Float(0.25), 4, DType::F32),
        &[4],
        &[0.5f32, 0.75, 1., 1.25],
    );
    assert_vals(
        &ar(Literal::Int(10), Literal::Int(-3), 4, DType::I32),
        &[4],
        &[10i32, 7, 4, 1],
    );
    assert_vals(
        &ar(Literal::Int(250), Literal::Int(3), 3, DType::U8),
        &[3],
        &[250u8, 253, 0],
    );
    assert_vals(
        &ar(Literal::Int(1), Literal::Int(1), 0, DType::I64),
        &[0],
        &[] as &[i64],
    );
    assert_vals(
        &ar(Literal::Int(0), Literal::Int(1), 3, DType::F64),
        &[3],
        &[0f64, 1., 2.],
    );
}

#[test]
fn reductions() {
    let x = t(&(0..12).collect::<Vec<i32>>(), &[2, 3, 2]);
    let red = |op, a: &[usize], keepdim, x: &HostTensor| {
        ev(
            Op::Reduce {
                op,
                axes: axes(a),
                keepdim,
            },
            &[x],
        )
    };
    // sum over axes 0 and 2: j=0 → 0+1+6+7, j=1 → 2+3+8+9, j=2 → 4+5+10+11.
    assert_vals(
        &red(ReduceOp::Sum, &[0, 2], false, &x),
        &[3],
        &[14i32, 22, 30],
    );
    assert_vals(
        &red(ReduceOp::Sum, &[0, 2], true, &x),
        &[1, 3, 1],
        &[14i32, 22, 30],
    );
    assert_vals(
        &red(ReduceOp::Max, &[1], false, &x),
        &[2, 2],
        &[4i32, 5, 10, 11],
    );
    assert_vals(&red(ReduceOp::Min, &[0, 1, 2], false, &x), &[], &[0i32]);
    assert_vals(
        &red(ReduceOp::Sum, &[0], false, &t(&[200u8, 100], &[2])),
        &[],
        &[44u8],
    );
    let f = t(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]);
    assert_vals(&red(ReduceOp::Mean, &[1], false, &f), &[2], &[2f32, 5.]);
    assert_vals(
        &red(ReduceOp::Mean, &[0], true, &f),
        &[1, 3],
        &[2.5f32, 3.5, 4.5],
    );
    // Empty axes list is the identity, bit for bit.
    let p = t(&[f32::from_bits(0x7fc0_0001), -0.0], &[2]);
    assert_eq!(red(ReduceOp::Sum, &[], false, &p), p);
    assert!(eval_op(
        &Op::Reduce {
            op: ReduceOp::Mean,
            axes: axes(&[0]),
            keepdim: false
        },
        &[&x]
    )
    .is_err());
    assert!(eval_op(
        &Op::Reduce {
            op: ReduceOp::Sum,
            axes: axes(&[1, 0]),
            keepdim: false
        },
        &[&x]
    )
    .is_err());
}

#[test]
fn float_sum_accumulates_in_f64_and_rounds_once() {
    // In bf16 each partial 1 + 2^-8 would round back to 1; in f64 the total
    // 1 + 3 * 2^-8 = 129.5 ulps rounds to even: 130 ulps = 1.015625.
    let v: Vec<bf16> = [1.0, 2f32.powi(-8), 2f32.powi(-8), 2f32.powi(-8)]
        .map(bf16::from_f32)
        .to_vec();
    let s = ev(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: axes(&[0]),
            keepdim: false,
        },
        &[&t(&v, &[4])],
    );
    assert_f64(&s, &[], &[1.015625]);
}

#[test]
fn max_reduce_and_argmax_with_nan() {
    let x = t(&[1., NAN, 5., 4., 2., 3.], &[2, 3]);
    let red = |op| {
        ev(
            Op::Reduce {
                op,
                axes: axes(&[1]),
                keepdim: false,
            },
            &[&x],
        )
    };
    assert_f64(&red(ReduceOp::Max), &[2], &[NAN, 4.]);
    assert_f64(&red(ReduceOp::Min), &[2], &[NAN, 2.]);
    let am = |x: &HostTensor, axis, keepdim| ev(Op::ArgMax { axis, keepdim }, &[x]);
    assert_vals(&am(&x, 1, false), &[2], &[1i64, 0]);
    assert_vals(&am(&x, 0, true), &[1, 3], &[1i64, 0, 0]);
    assert_vals(&am(&t(&[1., NAN, 9., NAN], &[4]), 0, false), &[], &[1i64]);
    // The first of equal maxima wins (-0.0 == 0.0).
    assert_vals(&am(&t(&[3i32, 7, 7, -1], &[4]), 0, false), &[], &[1i64]);
    assert_vals(&am(&t(&[-0.0f32, 0.0], &[2]), 0, false), &[], &[0i64]);
    assert_vals(&am(&t(&[5u8], &[1, 1]), 1, true), &[1, 1], &[0i64]);
    let empty = t(&[] as &[f32], &[2, 0]);
    assert!(eval_op(
        &Op::ArgMax {
            axis: 1,
            keepdim: false
        },
        &[&empty]
    )
    .is_err());
    assert!(eval_op(
        &Op::Reduce {
            op: ReduceOp::Max,
            axes: axes(&[1]),
            keepdim: false
        },
        &[&empty]
    )
    .is_err());
    assert_vals(&am(&empty, 0, false), &[0], &[] as &[i64]);
}

#[test]
fn rank_zero_scalars() {
    let a = t(&[1.5f64], &[]);
    let b = t(&[2.0f64], &[]);
    assert_f64(&ev(Op::Binary(BinaryOp::Mul), &[&a, &b]), &[], &[3.0]);
    assert_f64(
        &ev(Op::Binary(BinaryOp::Add), &[&a, &t(&[1.0, 2.0], &[2])]),
        &[2],
        &[2.5, 3.5],
    );
    assert_f64(&ev(Op::Unary(UnaryOp::Neg), &[&a]), &[], &[-1.5]);
    assert_f64(
        &ev(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: axes(&[]),
                keepdim: true,
            },
            &[&a],
        ),
        &[],
        &[1.5],
    );
    assert_f64(
        &ev(Op::Reshape(Shape::new(&[1, 1])), &[&a]),
        &[1, 1],
        &[1.5],
    );
    assert_f64(&ev(Op::Permute(axes(&[])), &[&a]), &[], &[1.5]);
    assert_f64(
        &ev(Op::BroadcastTo(Shape::new(&[2])), &[&a]),
        &[2],
        &[1.5, 1.5],
    );
    assert_vals(&ev(Op::Convert(DType::I32), &[&a]), &[], &[1i32]);
    assert_vals(&ev(Op::Compare(CmpOp::Lt), &[&a, &b]), &[], &[true]);
    let c = t(&[false], &[]);
    assert_f64(&ev(Op::Select, &[&c, &a, &b]), &[], &[2.0]);
}

#[test]
fn zero_size_tensors() {
    let e = t(&[] as &[f32], &[0, 3]);
    let row = t(&[1f32, 2., 3.], &[3]);
    assert_vals(
        &ev(Op::Binary(BinaryOp::Add), &[&e, &row]),
        &[0, 3],
        &[] as &[f32],
    );
    assert_vals(&ev(Op::Unary(UnaryOp::Exp), &[&e]), &[0, 3], &[] as &[f32]);
    let red = |op, a: &[usize]| {
        ev(
            Op::Reduce {
                op,
                axes: axes(a),
                keepdim: false,
            },
            &[&e],
        )
    };
    assert_vals(&red(ReduceOp::Sum, &[0]), &[3], &[0f32; 3]);
    assert_f64(&red(ReduceOp::Mean, &[0]), &[3], &[NAN; 3]);
    assert_vals(&red(ReduceOp::Max, &[1]), &[0], &[] as &[f32]);
    assert_vals(
        &ev(Op::Permute(axes(&[1, 0])), &[&e]),
        &[3, 0],
        &[] as &[f32],
    );
    assert_vals(
        &ev(
            Op::Slice {
                axis: 1,
                start: 1,
                len: 2,
            },
            &[&e],
        ),
        &[0, 2],
        &[] as &[f32],
    );
    assert_vals(
        &ev(
            Op::Slice {
                axis: 0,
                start: 3,
                len: 0,
            },
            &[&row],
        ),
        &[0],
        &[] as &[f32],
    );
    assert_vals(
        &ev(Op::BroadcastTo(Shape::new(&[2, 0, 3])), &[&e]),
        &[2, 0, 3],
        &[] as &[f32],
    );
    let m = t(&[1f32, 2., 3.], &[1, 3]);
    assert_vals(
        &ev(Op::Concat { axis: 0 }, &[&e, &m, &e]),
        &[1, 3],
        &[1f32, 2., 3.],
    );
    // k = 0 gives zeros; m = 0 gives an empty product.
    let a = t(&[] as &[i32], &[2, 0]);
    let b = t(&[] as &[i32], &[0, 3]);
    assert_vals(&ev(Op::MatMul, &[&a, &b]), &[2, 3], &[0i32; 6]);
    assert_vals(
        &ev(Op::MatMul, &[&b, &t(&[1i32, 2, 3], &[3, 1])]),
        &[0, 1],
        &[] as &[i32],
    );
}

#[test]
fn permute_rank3() {
    // x[i, j, k] = 12i + 4j + k, shape [2, 3, 4]; perm [2, 0, 1] gives
    // out[k, i, j] = x[i, j, k], shape [4, 2, 3].
    let x = t(&(0..24).collect::<Vec<i64>>(), &[2, 3, 4]);
    let out = ev(Op::Permute(axes(&[2, 0, 1])), &[&x]);
    #[rustfmt::skip]
    let want = [
        0i64, 4, 8, 12, 16, 20,
        1, 5, 9, 13, 17, 21,
        2, 6, 10, 14, 18, 22,
        3, 7, 11, 15, 19, 23,
    ];
    assert_vals(&out, &[4, 2, 3], &want);
    // f16 NaN payloads and -0.0 survive layout ops bit for bit.
    let h = t(
        &[
            f16::from_bits(0x7e01),
            f16::NEG_ZERO,
            f16::ONE,
            f16::from_bits(0xfc01),
        ],
        &[2, 2],
    );
    let p = ev(Op::Permute(axes(&[1, 0])), &[&h]);
    let bits: Vec<u16> = p
        .to_vec::<f16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(bits, [0x7e01, 0x3c00, 0x8000, 0xfc01]);
    assert!(eval_op(&Op::Permute(axes(&[0, 0, 1])), &[&x]).is_err());
}

#[test]
fn reshape_broadcast_slice_concat() {
    let x = t(&[1u8, 2, 3, 4, 5, 6], &[2, 3]);
    assert_vals(
        &ev(Op::Reshape(Shape::new(&[3, 2])), &[&x]),
        &[3, 2],
        &[1u8, 2, 3, 4, 5, 6],
    );
    assert!(eval_op(&Op::Reshape(Shape::new(&[4])), &[&x]).is_err());
    let c = t(&[1i32, 2, 3], &[3, 1]);
    let b = ev(Op::BroadcastTo(Shape::new(&[2, 3, 2])), &[&c]);
    assert_vals(&b, &[2, 3, 2], &[1i32, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3]);
    let y = t(&[0i64, 1, 2, 3, 4, 5, 6, 7], &[2, 4]);
    assert_vals(
        &ev(
            Op::Slice {
                axis: 1,
                start: 1,
                len: 2,
            },
            &[&y],
        ),
        &[2, 2],
        &[1i64, 2, 5, 6],
    );
    assert_vals(
        &ev(
            Op::Slice {
                axis: 0,
                start: 1,
                len: 1,
            },
            &[&y],
        ),
        &[1, 4],
        &[4i64, 5, 6, 7],
    );
    assert!(eval_op(
        &Op::Slice {
            axis: 1,
            start: 3,
            len: 2
        },
        &[&y]
    )
    .is_err());
    let a = t(&[1i64, 2], &[2, 1]);
    let cat = ev(Op::Concat { axis: 1 }, &[&a, &y, &a]);
    assert_vals(&cat, &[2, 6], &[1i64, 0, 1, 2, 3, 1, 2, 4, 5, 6, 7, 2]);
    let bools = [t(&[true], &[1]), t(&[false, true], &[2])];
    assert_vals(
        &ev(Op::Concat { axis: 0 }, &[&bools[0], &bools[1]]),
        &[3],
        &[true, false, true],
    );
    assert!(eval_op(&Op::Concat { axis: 0 }, &[&a, &y]).is_err());
}

#[test]
fn matmul_batches_broadcast() {
    // a: batch [2, 1], each [1, 2]; b: batch [3], each [2, 1] → [2, 3, 1, 1].
    let a = t(&[1f32, 2., 3., 4.], &[2, 1, 1, 2]);
    let b = t(&[1f32, 0., 0., 1., 1., 1.], &[3, 2, 1]);
    let out = ev(Op::MatMul, &[&a, &b]);
    assert_vals(&out, &[2, 3, 1, 1], &[1f32, 2., 3., 3., 4., 7.]);
    // Plain 2-D product, integers wrap.
    let x = t(&[1i32, 2, 3, 4, 5, 6], &[2, 3]);
    let y = t(&[7i32, 8, 9, 10, 11, 12], &[3, 2]);
    assert_vals(&ev(Op::MatMul, &[&x, &y]), &[2, 2], &[58i32, 64, 139, 154]);
    let big = t(&[i32::MAX, i32::MAX], &[1, 2]);
    let ones = t(&[1i32, 1], &[2, 1]);
    assert_vals(&ev(Op::MatMul, &[&big, &ones]), &[1, 1], &[-2i32]);
    // A rank-2 operand against a batched one.
    let e = t(&[1f64, 0., 0., 1., 2., 0., 0., 2.], &[2, 2, 2]);
    let m = t(&[1f64, 2., 3., 4.], &[2, 2]);
    assert_f64(
        &ev(Op::MatMul, &[&m, &e]),
        &[2, 2, 2],
        &[1., 2., 3., 4., 2., 4., 6., 8.],
    );
    assert!(eval_op(&Op::MatMul, &[&x, &x]).is_err());
}

#[test]
fn eval_op_rejects_invalid_calls() {
    let a = t(&[1f32, 2., 3.], &[3]);
    let b = t(&[1f32, 2., 3., 4.], &[4]);
    assert!(eval_op(&Op::Binary(BinaryOp::Add), &[&a, &b]).is_err());
    assert!(eval_op(&Op::Binary(BinaryOp::Add), &[&a]).is_err());
    assert!(eval_op(
        &Op::Input {
            shape: Shape::new(&[3]),
            dtype: DType::F32
        },
        &[]
    )
    .is_err());
    let bad = HostTensor {
        shape: Shape::new(&[3]),
        dtype: DType::F32,
        bytes: vec![0; 8],
    };
    assert!(eval_op(&Op::Unary(UnaryOp::Neg), &[&bad]).is_err());
}

#[test]
fn eval_graph_computes_only_what_outputs_need() {
    let mut g = Graph::new();
    let f32x3 = || Op::Input {
        shape: Shape::new(&[3]),
        dtype: DType::F32,
    };
    let x = g.push(f32x3(), &[], Location::caller()).unwrap();
    let y = g.push(f32x3(), &[], Location::caller()).unwrap();
    // `z` has no value: anything depending on it fails when evaluated.
    let z = g.push(f32x3(), &[], Location::caller()).unwrap();
    let sum = g
        .push(Op::Binary(BinaryOp::Add), &[x, y], Location::caller())
        .unwrap();
    let unused = g
        .push(Op::Unary(UnaryOp::Neg), &[z], Location::caller())
        .unwrap();
    let sq = g
        .push(Op::Binary(BinaryOp::Mul), &[sum, sum], Location::caller())
        .unwrap();
    let total = g
        .push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: axes(&[0]),
                keepdim: false,
            },
            &[sq],
            Location::caller(),
        )
        .unwrap();

    let mut inputs: HashMap<NodeId, HostTensor> = HashMap::new();
    inputs.insert(x, t(&[1f32, 2., 3.], &[3]));
    inputs.insert(y, t(&[1f32, 1., 1.], &[3]));
    let out = eval_graph(&g, &inputs, &[total, sum, total]).unwrap();
    assert_eq!(out.len(), 3);
    assert_vals(&out[0], &[], &[29f32]);
    assert_vals(&out[1], &[3], &[2f32, 3., 4.]);
    assert_eq!(out[2], out[0]);
    // Inputs are outputs too, returned as given.
    assert_eq!(
        eval_graph(&g, &inputs, &[y]).unwrap(),
        vec![inputs[&y].clone()]
    );
    assert!(eval_graph(&g, &inputs, &[]).unwrap().is_empty());

    // Needing `z` without a value, a mistyped input, or an unknown node is an error.
    assert!(eval_graph(&g, &inputs, &[unused]).is_err());
    let mut wrong = inputs.clone();
    wrong.insert(y, t(&[1f64, 1., 1.], &[3]));
    assert!(eval_graph(&g, &wrong, &[sum]).is_err());
    let mut other = Graph::new();
    for _ in 0..10 {
        other.push(f32x3(), &[], Location::caller()).unwrap();
    }
    let far = other.ids().last().unwrap();
    assert!(eval_graph(&g, &inputs, &[far]).is_err());
}
