//! Numerics the fuzzer found wrong: half-precision rounding, integer
//! powers and division, products that overflow, NaN through `exp`, and
//! subnormals in a loop tail.

use crate::common;
use crate::fuzz_support::{self, Program, Step};
#[allow(unused_imports)]
use lazyfuse::ir::{
    Axes, BinaryOp, CmpOp, ConvSpec, DType, HostTensor, Literal, Op, ReduceOp, Shape, Spatial,
    UnaryOp,
};
#[allow(unused_imports)]
use lazyfuse::{FusionGuard, Tensor};

/// Fusion bug (XLA compile option): with XLA's default
/// `xla_allow_excess_precision`, a fused `to_dtype(f32)` of a bf16 `exp`
/// skipped the bf16 rounding (XLA removed the f32 -> bf16 -> f32 convert
/// pair), so fused and unfused results differed: 6.4197 vs 6.40625. Fixed by
/// compiling with the option off (`xla/src/pjrt/options.rs`).
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
/// over every exponent bit (`xla/src/lower/ops.rs`, `int_pow`).
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

/// Fusion bug (LLVM folding): `exp(sqrt(full(-inf)) + 0.0)` was NaN
/// unfused but a small finite number fused (1.6e-5 in f16; 0, 9.9e-32 in
/// bf16, 3.7e-6 in f32 in other runs; `sigmoid` in bf16 too), from
/// `fuzz_campaign` seed 1001, program 53468. `sqrt` of the constant is
/// folded by `xla/src/lower/fold.rs` into a NaN literal; LLVM then folds
/// `NaN + x` to NaN whatever the lifted scalar `x` is, and goes on folding
/// XLA's `exp` expansion, whose float-to-int conversion of NaN is poison
/// in LLVM, into an arbitrary value. Fixed in the lowering: `exp` and
/// `logistic` are guarded by `select(x != x, x, ..)`
/// (`xla/src/lower/emit.rs::nan_guarded`).
#[test]
fn a_nan_constant_through_arithmetic_into_exp_stays_nan() {
    let program = Program {
        steps: vec![
            Step::Full {
                value: f64::NEG_INFINITY,
                dims: vec![],
                dtype: DType::F16,
            }, // v0
            Step::Apply {
                op: Op::Unary(UnaryOp::Sqrt),
                args: vec![0],
            }, // v1
            Step::Scalar {
                op: Op::Binary(BinaryOp::Add),
                arg: 1,
                value: 0.0,
            }, // v2
            Step::Apply {
                op: Op::Unary(UnaryOp::Exp),
                args: vec![2],
            }, // v3
        ],
    };
    fuzz_support::check_program(&program, &common::dev()).unwrap();
    // A user's NaN constant meeting a run-time value, in every float dtype.
    let dev = common::dev();
    for dt in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let x = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.0], &[4], &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            x.realize().unwrap();
            let y = Tensor::full(f64::NAN, &[4], dt, &dev)
                .unwrap()
                .add(&x)
                .unwrap();
            for r in [y.exp().unwrap(), y.sigmoid().unwrap()] {
                let v = r.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                assert!(v.iter().all(|z| z.is_nan()), "{dt:?} fused {fuse}: {v:?}");
            }
        }
    }
}

/// XLA bug on the newer CPU plugin (`jax-cpu`): `log` of a negative
/// subnormal was NaN in the loop of a `[2, 3, 3]` tensor (element 16), where
/// flush to zero reads it as -0 and the answer is -inf (a `[18]` tensor was
/// right). `log` now flushes its operand first, as `pow` does
/// (`xla/src/lower/elementwise.rs`). Found by `fuzz_ops`
/// (`FUZZ_SEED=20261208`, 1,500 cases).
#[test]
fn log_of_a_negative_subnormal_in_a_loop_tail_is_minus_infinity() {
    let mut failures = Vec::new();
    for (op, v) in [
        (UnaryOp::Log, -9.99994610111476e-41),
        (UnaryOp::Log, 9.99994610111476e-41),
        (UnaryOp::Sqrt, -9.99994610111476e-41),
        (UnaryOp::Rsqrt, -9.99994610111476e-41),
        (UnaryOp::Rsqrt, 9.99994610111476e-41),
    ] {
        for (dims, fill) in [
            (&[2usize, 3, 3][..], 0.0),
            (&[18], 0.0),
            (&[2, 3, 3], 0.5),
            (&[18], 0.5),
        ] {
            let n: usize = dims.iter().product();
            let mut x = vec![fill; n];
            x[16] = v;
            let program = Program {
                steps: vec![
                    Step::Input(HostTensor::from_f64(&x, Shape::new(dims), DType::F32)), // v0
                    Step::Apply {
                        op: Op::Unary(op),
                        args: vec![0],
                    }, // v1
                ],
            };
            if let Err(e) = fuzz_support::check_program(&program, &common::dev()) {
                failures.push(format!(
                    "{op:?} of {v:e} at 16 of {dims:?} filled with {fill}: {e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
