//! Reference interpreter tests for elementwise ops, conversions and generated
//! tensors, with hand-computed expected values.

mod common;

use common::*;
use half::{bf16, f16};
use lazyfuse_ir::interp::eval_op;
use lazyfuse_ir::{BinaryOp, CmpOp, DType, HostTensor, Literal, Op, Shape, UnaryOp};

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
