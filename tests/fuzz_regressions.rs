//! Regression tests: minimal programs the differential fuzzer
//! (`tests/fuzz_ops.rs`) found, in the form it prints them, each with the
//! bug it caught and where it was fixed.

mod common;
mod fuzz_support;

use fuzz_support::{Program, Step};
#[allow(unused_imports)]
use lazyfuse::ir::{
    Axes, BinaryOp, CmpOp, DType, HostTensor, Literal, Op, ReduceOp, Shape, UnaryOp,
};
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
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Lowering bug: XLA's CPU `power` reads its operands' bits, so a subnormal
/// exponent was not treated as zero (flush-to-zero, as the interpreter and
/// every other arithmetic op do): `pow(-0.13, 1e-40)` gave NaN instead of 1,
/// and a subnormal base gave a tiny power instead of `0^y`. Fixed in
/// `src/lower/ops.rs` (`flush_subnormals` on pow operands).
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
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Fusion bug (XLA compile option): with XLA's default
/// `xla_allow_excess_precision`, a fused `to_dtype(f32)` of a bf16 `exp`
/// skipped the bf16 rounding (XLA removed the f32 -> bf16 -> f32 convert
/// pair), so fused and unfused results differed: 6.4197 vs 6.40625. Fixed by
/// compiling with the option off (`src/pjrt/options.rs`).
#[test]
fn fusion_keeps_half_precision_rounding() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[1.859375, -0.30078125, 2.109375],
                Shape::new(&[3]),
                DType::BF16,
            )), // v0
            Step::Apply {
                op: Op::Unary(UnaryOp::Exp),
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Convert(DType::F32),
                args: vec![1],
            }, // v2
            Step::Input(HostTensor::from_f64(
                &[0.1, 1e-3],
                Shape::new(&[2]),
                DType::F16,
            )), // v3
            Step::Scalar {
                op: Op::Binary(BinaryOp::Mul),
                arg: 3,
                value: 3.0,
            }, // v4
            Step::Apply {
                op: Op::Convert(DType::F64),
                args: vec![4],
            }, // v5
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Lowering bug: XLA's integer `power` only uses the low 6 bits of the
/// exponent, so with wrapping semantics `115^119` (i32) came out as `115^55`
/// and `2^64` as 1 instead of 0. The lowering now emits square-and-multiply
/// over every exponent bit (`src/lower/ops.rs`, `int_pow`).
#[test]
fn int_pow_uses_every_exponent_bit() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_i64(
                &[115, 2, -3, -1, 1, 7, 0, 5],
                Shape::new(&[8]),
                DType::I32,
            )), // v0
            Step::Input(HostTensor::from_i64(
                &[119, 64, 65, -7, -9, -2, 0, 1 << 20],
                Shape::new(&[8]),
                DType::I32,
            )), // v1
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![0, 1],
            }, // v2
            Step::Apply {
                op: Op::Convert(DType::I64),
                args: vec![0],
            }, // v3
            Step::Input(HostTensor::from_i64(
                &[119, 64, 1 << 40, -8, -9, 63, 0, i64::MAX],
                Shape::new(&[8]),
                DType::I64,
            )), // v4
            Step::Apply {
                op: Op::Binary(BinaryOp::Pow),
                args: vec![3, 4],
            }, // v5
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Lowering bug: XLA's CPU bf16 `EQ`/`NE` compare a subnormal at its true
/// value while ordered compares read it as zero (flush-to-zero), so
/// `eq_scalar(-0.0)` of -9e-41 was false although `gt`/`lt` said neither
/// (found by fuzz_ops, FUZZ_SEED=2). The lowering now flushes bf16 compare
/// operands (`src/lower/ops.rs`, `compare`).
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
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// XLA CPU flushed a bf16 constant holding a subnormal for some shapes
/// (`[3, 2]`, not `[2, 3]` or `[6]`; found by fuzz_ops, FUZZ_SEED=3), while
/// other shapes kept its bits. Subnormal constants of flushing dtypes are
/// now stored as zero of their sign on every path (`interp::scalar_constant`,
/// see `tests/ieee.rs`), so every shape reads back the same zeros.
#[test]
fn subnormal_bf16_constants_read_back_as_zeros_in_every_shape() {
    let dev = common::dev();
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
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// The guarded integer division keeps the run-time semantics: `x / 0` is
/// all ones, `MIN / -1` wraps to `MIN`, everything else truncates.
#[test]
fn integer_division_edge_cases_fused_and_unfused() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[-2147483648.0, 7.0, -7.0, 5.0, 0.0],
                Shape::new(&[5]),
                DType::I32,
            )), // v0
            Step::Input(HostTensor::from_f64(
                &[-1.0, 0.0, 2.0, -1.0, 0.0],
                Shape::new(&[5]),
                DType::I32,
            )), // v1
            Step::Apply {
                op: Op::Binary(BinaryOp::Div),
                args: vec![0, 1],
            }, // v2
            Step::Input(HostTensor::from_f64(
                &[200.0, 7.0, 0.0],
                Shape::new(&[3]),
                DType::U8,
            )), // v3
            Step::Input(HostTensor::from_f64(
                &[0.0, 2.0, 0.0],
                Shape::new(&[3]),
                DType::U8,
            )), // v4
            Step::Apply {
                op: Op::Binary(BinaryOp::Div),
                args: vec![3, 4],
            }, // v5
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Oracle gap: when the magnitudes of a matmul's products add up past
/// f32's largest value, the answer depends on XLA's summation order and on
/// whether a fused multiply-add skips a product's rounding: `inf * x +
/// 1e30 * 1e30` came out NaN (products rounded: `-inf + inf`) where the
/// interpreter, in f64, says -inf, and at another campaign seed +inf where
/// it says -inf. The oracle now accepts ±inf or NaN exactly where an
/// intermediate can overflow (`oracle.rs::overflow_possible`), for matmul,
/// sum and mean.
#[test]
fn matmul_products_overflow_in_f32() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[f64::INFINITY, 0.0, -1e30, 0.0],
                Shape::new(&[1, 4]),
                DType::F32,
            )), // v0
            Step::Input(HostTensor::from_f64(
                &[-0.098, 0.0, -1e30, 0.0],
                Shape::new(&[4, 1]),
                DType::F32,
            )), // v1
            Step::Apply {
                op: Op::MatMul,
                args: vec![0, 1],
            }, // v2
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Same gap, found by `fuzz_campaign --seed 100` (program 377): products
/// of opposite sign that each overflow f32 gave +inf on XLA (a fused
/// multiply-add keeps the second product exact: `fma(b, y, inf) = inf`)
/// where the f64 interpreter says -inf.
#[test]
fn matmul_with_overflowing_products_of_both_signs() {
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[0.0, 0.0, -6.545529e36, 1.142038e37],
                Shape::new(&[2, 2]),
                DType::F32,
            )), // v0
            Step::Input(HostTensor::from_f64(
                &[-1321.784423828125, -4292.052734375],
                Shape::new(&[2, 1]),
                DType::F32,
            )), // v1
            Step::Apply {
                op: Op::MatMul,
                args: vec![0, 1],
            }, // v2
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Oracle gap, found by `fuzz_campaign --seed 400` (program 838, below as
/// found: only its "after learning" run, with sites learned from earlier
/// programs, recomputes `erf` in another region, so it does not shrink).
/// XLA evaluates `erf` of a compile-time constant exactly (LLVM folds it:
/// `erf(-4) = -1`) and at run time by its polynomial (`-0.9999998`, 4 ulp
/// away), so a consumer that recomputes the op sees another value than the
/// one returned. The oracle now lets consumers of approximated ops (exp,
/// log, tanh, sigmoid, sin, cos, erf, gelu, pow) see them within the op's
/// own error (`oracle.rs::recompute_slack`); the README lists this freedom.
#[test]
fn recomputed_erf_of_a_constant_differs_by_ulps() {
    let dev = common::dev();
    let erf_of = |fuse: bool| -> f32 {
        let _g = FusionGuard::new(fuse);
        let x = Tensor::full(-4.0, &[1], DType::F32, &dev).unwrap();
        x.erf().unwrap().to_vec::<f32>().unwrap()[0]
    };
    let (fused, unfused) = (erf_of(true), erf_of(false));
    let ulps = (fused.to_bits() as i64 - unfused.to_bits() as i64).abs();
    assert!(
        ulps <= 4,
        "fused {fused} unfused {unfused}: {ulps} ulp apart"
    );
    let program = Program {
        steps: vec![
            Step::Input(HostTensor::from_f64(
                &[1.0546875],
                Shape::new(&[]),
                DType::BF16,
            )), // v0
            Step::Apply {
                op: Op::Unary(UnaryOp::Neg),
                args: vec![0],
            }, // v1
            Step::Apply {
                op: Op::Reduce {
                    op: ReduceOp::Max,
                    axes: Axes::from_slice(&[]),
                    keepdim: false,
                },
                args: vec![0],
            }, // v2
            Step::Input(HostTensor::from_f64(
                &[
                    -1.0000000150474662e30,
                    f64::NEG_INFINITY,
                    -7146.37841796875,
                    1.0,
                    4688.4814453125,
                    f64::NEG_INFINITY,
                    -2868.6650390625,
                    -1.0000000150474662e30,
                ],
                Shape::new(&[4, 2]),
                DType::F32,
            )), // v3
            Step::ReadOnThread(1),
            Step::Full {
                value: -1e30,
                dims: vec![1],
                dtype: DType::F32,
            }, // v4
            Step::Apply {
                op: Op::Unary(UnaryOp::Erf),
                args: vec![4],
            }, // v5
            Step::Apply {
                op: Op::Binary(BinaryOp::Add),
                args: vec![5, 5],
            }, // v6
            Step::Apply {
                op: Op::Reduce {
                    op: ReduceOp::Mean,
                    axes: Axes::from_slice(&[0]),
                    keepdim: true,
                },
                args: vec![6],
            }, // v7
            Step::Apply {
                op: Op::Binary(BinaryOp::Sub),
                args: vec![7, 6],
            }, // v8
            Step::Scalar {
                op: Op::Compare(CmpOp::Ne),
                arg: 1,
                value: -1.0,
            }, // v9
            Step::Apply {
                op: Op::Compare(CmpOp::Eq),
                args: vec![1, 2],
            }, // v10
            Step::Apply {
                op: Op::Slice {
                    axis: 0,
                    start: 1,
                    len: 0,
                },
                args: vec![8],
            }, // v11
            Step::Read(10),
            Step::Apply {
                op: Op::Select,
                args: vec![10, 6, 8],
            }, // v12
            Step::Full {
                value: -1.0,
                dims: vec![1],
                dtype: DType::F16,
            }, // v13
            Step::Apply {
                op: Op::Reduce {
                    op: ReduceOp::Max,
                    axes: Axes::from_slice(&[]),
                    keepdim: false,
                },
                args: vec![2],
            }, // v14
            Step::ReadOnThread(10),
            Step::Scalar {
                op: Op::Binary(BinaryOp::Maximum),
                arg: 13,
                value: 1.0,
            }, // v15
            Step::Apply {
                op: Op::Unary(UnaryOp::Cos),
                args: vec![4],
            }, // v16
            Step::Input(HostTensor::from_f64(
                &[f64::NEG_INFINITY],
                Shape::new(&[1, 1]),
                DType::F32,
            )), // v17
            Step::Input(HostTensor::from_i64(
                &[0, 1, 0],
                Shape::new(&[3, 1, 1]),
                DType::Bool,
            )), // v18
            Step::Apply {
                op: Op::Select,
                args: vec![18, 6, 17],
            }, // v19
            Step::Apply {
                op: Op::Reduce {
                    op: ReduceOp::Min,
                    axes: Axes::from_slice(&[]),
                    keepdim: false,
                },
                args: vec![0],
            }, // v20
            Step::Apply {
                op: Op::Reduce {
                    op: ReduceOp::Min,
                    axes: Axes::from_slice(&[]),
                    keepdim: true,
                },
                args: vec![1],
            }, // v21
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}

/// Lowering bug (found by `fuzz_campaign`, seed 1000, program 2418): a bf16
/// subnormal widened to f32 and converted to bool was `true` fused and
/// `false` unfused. XLA widens bf16 by shifting its bits, and LLVM folded
/// the compare with zero into an integer test of them; the hardware reads
/// the subnormal as zero. Fixed in `src/lower/ops.rs` (`upcast_bf16`, an
/// explicit flush); `tests/ieee.rs` checks the compares of the same class.
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
    fuzz_support::check_program(&program, &common::dev()).unwrap();
}
