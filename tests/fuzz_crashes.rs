//! Regression tests for programs that killed the process: XLA aborted,
//! threw a C++ exception through the plugin or raised SIGFPE while
//! compiling them, so the fuzzer (`tests/fuzz_ops.rs`, `fuzz_campaign`)
//! found them as crashes. Each is now lowered so that XLA never sees the
//! pattern; the values are checked like any fuzz program. A regression here
//! takes the whole test binary down, which is why they have their own.

mod common;
mod fuzz_support;

use fuzz_support::{Program, Step};
#[allow(unused_imports)]
use lazyfuse::ir::{Axes, BinaryOp, CmpOp, DType, HostTensor, Literal, Op, Shape, UnaryOp};

/// Found at `FUZZ_SEED=11`: an integer division by zero whose operands
/// are compile-time constants (a `full` converted to u8) killed the
/// process with SIGFPE inside XLA, which folds such constants at compile
/// time. The answer is XLA's own: `x / 0` is all ones for u8.
#[test]
fn constant_integer_division_by_zero_does_not_kill_the_process() {
    let program = Program {
        steps: vec![
            Step::Full {
                value: -1e-40,
                dims: vec![],
                dtype: DType::F32,
            }, // v0
            Step::Apply {
                op: Op::Convert(DType::U8),
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Binary(BinaryOp::Div),
                args: vec![1, 1],
            }, // v2
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Compiler crash: an empty slice of a `concatenate` with empty operands
/// made StableHLO's `SliceOpConcatSimplify` build a concatenate with a
/// negative operand count, and the C++ exception it threw aborted the
/// process (a foreign exception cannot unwind through Rust). Fixed in
/// `xla/src/lower/ops.rs`: a value with no elements lowers to an empty constant
/// and `concat` leaves out empty operands, so no such pattern reaches XLA.
#[test]
fn empty_slice_of_concat_with_empty_operands_compiles() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(&[3.5], Shape::new(&[1]), DType::F32)), // v0
            Step::Apply {
                op: Op::Slice {
                    axis: 0,
                    start: 1,
                    len: 0,
                },
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Concat { axis: 0 },
                args: vec![0, 1, 1],
            }, // v2
            Step::Apply {
                op: Op::Slice {
                    axis: 0,
                    start: 1,
                    len: 0,
                },
                args: vec![2],
            }, // v3
            Step::Apply {
                op: Op::Unary(UnaryOp::Neg),
                args: vec![2],
            }, // v4
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Compiler crash: a matmul contracting over an empty axis (`[1, 0] x
/// [0, 1]`) killed the process with SIGFPE in XLA's CPU dot emitter, which
/// divides by the contraction length (found by fuzz_ops at the CI seed
/// once the generator changed). Fixed in `xla/src/lower/ops.rs`: such a matmul
/// lowers to zeros, the empty sum.
#[test]
fn matmul_over_an_empty_axis_is_zeros() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(&[], Shape::new(&[1, 0]), DType::F32)), // v0
            Step::Input(HostTensor::from_f64(&[], Shape::new(&[0, 1]), DType::F32)), // v1
            Step::Apply {
                op: Op::MatMul,
                args: vec![0, 1],
            }, // v2
            Step::Input(HostTensor::from_f64(
                &[],
                Shape::new(&[2, 3, 0]),
                DType::F64,
            )), // v3
            Step::Input(HostTensor::from_f64(&[], Shape::new(&[0, 2]), DType::F64)), // v4
            Step::Apply {
                op: Op::MatMul,
                args: vec![3, 4],
            }, // v5
            Step::Input(HostTensor::from_i64(&[], Shape::new(&[2, 0]), DType::I32)), // v6
            Step::Input(HostTensor::from_i64(&[], Shape::new(&[0, 2]), DType::I32)), // v7
            Step::Apply {
                op: Op::MatMul,
                args: vec![6, 7],
            }, // v8
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Found by `fuzz_campaign` (seed 1000, program 3463): compiling this
/// region overflowed the 2 MiB stack of the executor thread inside XLA's
/// fusion emitter, which recurses along chains of fused ops (here two
/// integer `pow` ladders through a transpose), and the overflow aborted the
/// process. XLA now compiles on a thread of its own with a 256 MiB stack
/// (`src/backend/pjrt.rs`, `COMPILE_STACK`).
#[test]
fn a_deep_fused_chain_compiles_on_a_big_stack() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_i64(
                &[11, 17, -11, -17, -1, 5, -9, -16, -6, 6, -2, -16],
                Shape::new(&[3, 4]),
                DType::I32,
            )), // v0
            Step::Apply {
                op: Op::Permute(Axes::from_slice(&[1, 0])),
                args: vec![0],
            }, // v1
            Step::Scalar {
                op: Op::Binary(BinaryOp::Maximum),
                arg: 0,
                value: 0.0,
            }, // v2
            Step::Scalar {
                op: Op::Compare(CmpOp::Lt),
                arg: 0,
                value: -2.0,
            }, // v3
            Step::Apply {
                op: Op::Compare(CmpOp::Eq),
                args: vec![1, 1],
            }, // v4
            Step::Scalar {
                op: Op::Compare(CmpOp::Eq),
                arg: 3,
                value: 1.0,
            }, // v5
            Step::Input(HostTensor::from_i64(
                &[-15, 12, -17],
                Shape::new(&[1, 3]),
                DType::I32,
            )), // v6
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![6, 1],
            }, // v7
            Step::Input(HostTensor::from_f64(
                &[
                    1.5418591499328613,
                    3.413306474685669,
                    -9.99994610111476e-41,
                    1.4676611423492432,
                    1.48016357421875,
                    2.2182116508483887,
                ],
                Shape::new(&[2, 3]),
                DType::F32,
            )), // v8
            Step::Apply {
                op: Op::Unary(UnaryOp::Sin),
                args: vec![8],
            }, // v9
            Step::Read(8),
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![7, 1],
            }, // v10
            Step::Scalar {
                op: Op::Compare(CmpOp::Eq),
                arg: 10,
                value: 7.0,
            }, // v11
            Step::Drop(11),
            Step::Apply {
                op: Op::Unary(UnaryOp::Tanh),
                args: vec![8],
            }, // v12
            Step::Apply {
                op: Op::Unary(UnaryOp::Abs),
                args: vec![7],
            }, // v13
            Step::Read(7),
            Step::Drop(5),
            Step::Input(HostTensor::from_f64(
                &[-2881.176025390625, 9524.001953125, -805.5195922851563],
                Shape::new(&[3, 1]),
                DType::F32,
            )), // v14
            Step::Apply {
                op: Op::MatMul,
                args: vec![12, 14],
            }, // v15
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}
