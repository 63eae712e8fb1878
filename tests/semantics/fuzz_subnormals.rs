//! Regression tests about subnormal numbers: minimal programs the
//! differential fuzzer (`tests/fuzz_ops.rs`, `examples/fuzz_campaign.rs`)
//! found, in the form it prints them, each with the bug it caught and where
//! it was fixed. XLA's CPU code flushes subnormals (f32, f64, bf16) in
//! arithmetic and comparisons; the interpreter defines where.

use crate::fuzz_support::{Program, Step};
use lazyfuse::ir::{BinaryOp, CmpOp, DType, HostTensor, Op, Shape, UnaryOp};
use lazyfuse::{FusionGuard, Tensor};

/// Interpreter bug: it flushed subnormal operands of float `neg`/`abs` to
/// ±0, but XLA (CPU and GPU) lowers both to a sign-bit flip/clear that keeps
/// them. Fixed in `ir/src/interp/elementwise.rs` (`sign_bit_op`).
#[test]
fn neg_and_abs_keep_subnormals() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[1e-40, -1e-40, -0.0, 2.5],
                Shape::new(&[4]),
                DType::F32,
            )), // v0
            Step::Input(HostTensor::from_f64(
                &[1e-310, -1e-310],
                Shape::new(&[2]),
                DType::F64,
            )), // v1
            Step::Apply {
                op: Op::Unary(UnaryOp::Neg),
                args: vec![0],
            }, // v2
            Step::Apply {
                op: Op::Unary(UnaryOp::Abs),
                args: vec![0],
            }, // v3
            Step::Apply {
                op: Op::Unary(UnaryOp::Neg),
                args: vec![1],
            }, // v4
            Step::Apply {
                op: Op::Unary(UnaryOp::Abs),
                args: vec![1],
            }, // v5
        ],
    };
    crate::fuzz_support::check_program(&program, &crate::common::dev()).unwrap();
}

/// Lowering bug: XLA's CPU `power` reads its operands' bits, so a subnormal
/// exponent was not treated as zero (flush-to-zero, as the interpreter and
/// every other arithmetic op do): `pow(-0.13, 1e-40)` gave NaN instead of 1,
/// and a subnormal base gave a tiny power instead of `0^y`. Fixed in
/// `xla/src/lower/ops.rs` (`flush_subnormals` on pow operands).
#[test]
fn pow_flushes_subnormal_operands() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[-0.13, 0.5, 1e-40, -1e-40, 2.0],
                Shape::new(&[5]),
                DType::F32,
            )), // v0
            Step::Input(HostTensor::from_f64(
                &[1e-40, -1e-40, 0.5, 2.0, 1e-40],
                Shape::new(&[5]),
                DType::F32,
            )), // v1
            Step::Scalar {
                op: Op::Binary(BinaryOp::Pow),
                arg: 0,
                value: 1e-40,
            }, // v2
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![0, 1],
            }, // v3
            Step::Input(HostTensor::from_f64(
                &[-0.5, 1e-310],
                Shape::new(&[2]),
                DType::F64,
            )), // v4
            Step::Scalar {
                op: Op::Binary(BinaryOp::Pow),
                arg: 4,
                value: 1e-310,
            }, // v5
            Step::Apply {
                op: Op::Convert(DType::BF16),
                args: vec![1],
            }, // v6
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![6, 6],
            }, // v7
        ],
    };
    crate::fuzz_support::check_program(&program, &crate::common::dev()).unwrap();
}

/// Lowering bug: XLA's CPU bf16 `EQ`/`NE` compare a subnormal at its true
/// value while ordered compares read it as zero (flush-to-zero), so
/// `eq(-0.0)` (a scalar operand) of -9e-41 was false although `gt`/`lt` said neither
/// (found by fuzz_ops, FUZZ_SEED=2). The lowering now flushes bf16 compare
/// operands (`xla/src/lower/ops.rs`, `compare`).
#[test]
fn bf16_compare_reads_subnormals_as_zero() {
    let sub = 9.183549615799121e-41;
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[sub, -sub, 1.0, 0.0, -0.0, f64::NAN],
                Shape::new(&[6]),
                DType::BF16,
            )), // v0
            Step::Scalar {
                op: Op::Compare(CmpOp::Eq),
                arg: 0,
                value: -0.0,
            }, // v1
            Step::Scalar {
                op: Op::Compare(CmpOp::Ne),
                arg: 0,
                value: 0.0,
            }, // v2
            Step::Apply {
                op: Op::Reshape(Shape::new(&[3, 2])),
                args: vec![0],
            }, // v3
            Step::Input(HostTensor::from_f64(
                &[0.0, sub],
                Shape::new(&[2]),
                DType::BF16,
            )), // v4
            Step::Apply {
                op: Op::Compare(CmpOp::Eq),
                args: vec![3, 4],
            }, // v5
            Step::Apply {
                op: Op::Compare(CmpOp::Le),
                args: vec![4, 3],
            }, // v6
        ],
    };
    crate::fuzz_support::check_program(&program, &crate::common::dev()).unwrap();
}

/// XLA CPU flushed a bf16 constant holding a subnormal for some shapes
/// (`[3, 2]`, not `[2, 3]` or `[6]`; found by fuzz_ops, FUZZ_SEED=3), while
/// other shapes kept its bits. Subnormal constants of flushing dtypes are
/// now stored as zero of their sign on every path (`interp::scalar_constant`,
/// see `tests/semantics/ieee.rs`), so every shape reads back the same zeros.
#[test]
fn subnormal_bf16_constants_read_back_as_zeros_in_every_shape() {
    let dev = crate::common::dev();
    for dims in [[3, 2], [2, 3], [6, 1]] {
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            for v in [1e-40, -1e-40] {
                let t = Tensor::full(v, &dims, DType::BF16, &dev).unwrap();
                let zero = 0.0f64.copysign(v);
                let want = HostTensor::from_f64(&[zero; 6], Shape::new(&dims), DType::BF16);
                assert_eq!(
                    t.to_host().unwrap().bytes,
                    want.bytes,
                    "{v} {dims:?} fuse={fuse}"
                );
            }
        }
    }
}

/// Found at `FUZZ_SEED=11` (with XLA's algebraic simplifier on or off): a
/// subnormal f32 converted to bf16 and then
/// to bool was `true` fused (the fused conversions work on bits, no
/// denormal flush) and `false` unfused and on the interpreter (the f32
/// subnormal reads as zero).
#[test]
fn subnormal_through_bf16_to_bool_is_false_fused_too() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[3.000000106112566e-6, 0.0, 9.99994610111476e-41, -1.5],
                Shape::new(&[4]),
                DType::F32,
            )), // v0
            Step::Apply {
                op: Op::Convert(DType::BF16),
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Convert(DType::Bool),
                args: vec![1],
            }, // v2
        ],
    };
    crate::fuzz_support::check_program(&program, &crate::common::dev()).unwrap();
}

/// Lowering bug (found by `fuzz_campaign`, seed 1000, program 2418): a bf16
/// subnormal widened to f32 and converted to bool was `true` fused and
/// `false` unfused. XLA widens bf16 by shifting its bits, and LLVM folded
/// the compare with zero into an integer test of them; the hardware reads
/// the subnormal as zero. Fixed in `xla/src/lower/ops.rs` (`upcast_bf16`, an
/// explicit flush); `tests/semantics/ieee.rs` checks the compares of the same class.
#[test]
fn widened_bf16_subnormal_converts_to_false() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[9.183549615799121e-41],
                Shape::new(&[]),
                DType::BF16,
            )), // v0
            Step::Apply {
                op: Op::Convert(DType::F32),
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Convert(DType::Bool),
                args: vec![1],
            }, // v2
        ],
    };
    crate::fuzz_support::check_program(&program, &crate::common::dev()).unwrap();
}

/// Fusion bug (`fuzz_campaign` seed 1001, program 5287, shrunk): LLVM folds
/// an expression of constants alone in IEEE arithmetic, keeping a subnormal
/// result that run-time code flushes, so `x / x` of `full(1e-40, f64)`
/// converted to bf16 was `1` fused and NaN unfused; `full(1e-30) *
/// full(1e-10)` the same in f32 (and f64 at its own scale). Fixed in
/// `xla/src/lower/fold.rs`: such expressions are evaluated by the interpreter
/// when lowering.
#[test]
fn subnormals_folded_from_constants_are_flushed() {
    let div_self = |v: usize| Step::Apply {
        op: Op::Binary(BinaryOp::Div),
        args: vec![v, v],
    };
    let converted = |from: DType, to: DType| Program {
        steps: vec![
            Step::Full {
                value: 1e-40,
                dims: vec![2, 1, 2],
                dtype: from,
            }, // v0
            Step::Apply {
                op: Op::Convert(to),
                args: vec![0],
            }, // v1
            div_self(1), // v2
        ],
    };
    let product = |a: f64, b: f64, dtype: DType| Program {
        steps: vec![
            Step::Full {
                value: a,
                dims: vec![3],
                dtype,
            }, // v0
            Step::Full {
                value: b,
                dims: vec![3],
                dtype,
            }, // v1
            Step::Apply {
                op: Op::Binary(BinaryOp::Mul),
                args: vec![0, 1],
            }, // v2
            div_self(2), // v3
        ],
    };
    let programs = [
        converted(DType::F64, DType::BF16),
        converted(DType::F64, DType::F32),
        product(1e-30, 1e-10, DType::F32),
        product(1e-300, 1e-10, DType::F64),
    ];
    for program in &programs {
        crate::fuzz_support::check_program(program, &crate::common::dev()).unwrap();
    }
}
