//! Reference interpreter tests for reductions, layout ops, matmul, rank-0 and
//! zero-size tensors and graph evaluation, with hand-computed expected values.

mod common;

use common::*;
use half::{bf16, f16};
use lazyfuse_ir::interp::{eval_graph, eval_op};
use lazyfuse_ir::testutil::GraphBuilder;
use lazyfuse_ir::{BinaryOp, CmpOp, DType, HostTensor, NodeId, Op, ReduceOp, Shape, UnaryOp};
use std::collections::HashMap;

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
    let mut b = GraphBuilder::new();
    let x = b.input(&[3], DType::F32);
    let y = b.input(&[3], DType::F32);
    // `z` has no value: anything depending on it fails when evaluated.
    let z = b.input(&[3], DType::F32);
    let sum = b.binary(BinaryOp::Add, x, y);
    let unused = b.unary(UnaryOp::Neg, z);
    let sq = b.binary(BinaryOp::Mul, sum, sum);
    let total = b.reduce(ReduceOp::Sum, sq, &[0], false);
    let g = b.into_graph();

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
    let mut other = GraphBuilder::new();
    for _ in 0..10 {
        other.input(&[3], DType::F32);
    }
    let far = other.graph().ids().last().unwrap();
    assert!(eval_graph(&g, &inputs, &[far]).is_err());
}
