//! The IR ops added for training (`index_select`, `rand_uniform`; `erf` is
//! swept with the other unary ops in `ops.rs`), through the public API against
//! the reference interpreter, fused and unfused.

use crate::common::{check, random_host, Rng};
use lazyfuse::ir::{interp, DType, HostTensor, Op, Shape};
use lazyfuse::Tensor;

#[test]
fn index_select_every_axis_and_dtype() {
    let mut rng = Rng(11);
    for dt in [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::I64,
        DType::U8,
        DType::Bool,
    ] {
        for axis in 0..3 {
            let x = random_host(&mut rng, &[3, 4, 2], dt, -9.0, 9.0);
            let n = x.shape.dims()[axis] as i64;
            for idt in [DType::I64, DType::I32] {
                // Repeats, edges, and out-of-range on both sides (clamped).
                let idx = HostTensor::from_i64(&[0, n - 1, 1, 1, -3, n + 5], Shape::new(&[6]), idt);
                check(
                    &format!("index_select({dt}, axis {axis}, {idt})"),
                    &Op::IndexSelect { axis },
                    &[x.clone(), idx],
                    1.0,
                    &|t| t[0].index_select(axis as isize, &t[1]),
                );
            }
        }
    }
    // Empty index list, rank-1 source.
    let x = random_host(&mut rng, &[5], DType::F32, -1.0, 1.0);
    let idx = HostTensor::from_i64(&[], Shape::new(&[0]), DType::I64);
    check(
        "index_select(empty)",
        &Op::IndexSelect { axis: 0 },
        &[x, idx],
        1.0,
        &|t| t[0].index_select(-1, &t[1]),
    );
}

#[test]
fn rand_uniform_is_the_same_everywhere() {
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for seed in [0i64, 1, -1, 0x1234_5678_9abc_def0, i64::MIN] {
            for dims in [&[][..], &[0], &[7], &[3, 5, 2]] {
                let s = HostTensor::from_i64(&[seed], Shape::scalar(), DType::I64);
                let op = Op::RandomUniform {
                    shape: Shape::new(dims),
                    dtype: dt,
                };
                // Exact: integer hashing and one rounding on both sides.
                check(
                    &format!("rand_uniform({dt}, {seed}, {dims:?})"),
                    &op,
                    &[s],
                    0.0,
                    &|t| Tensor::rand_uniform(dims, dt, seed as u64, t[0].device()),
                );
            }
        }
    }
}

#[test]
fn rand_uniform_statistics() {
    let s = HostTensor::from_i64(&[42], Shape::scalar(), DType::I64);
    let op = Op::RandomUniform {
        shape: Shape::new(&[100_000]),
        dtype: DType::F64,
    };
    let v = interp::eval_op(&op, &[&s]).unwrap().to_f64_vec();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    assert!((var - 1.0 / 12.0).abs() < 0.002, "var {var}");
    assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
    // Different seeds give different streams.
    let s2 = HostTensor::from_i64(&[43], Shape::scalar(), DType::I64);
    let w = interp::eval_op(&op, &[&s2]).unwrap().to_f64_vec();
    let same = v.iter().zip(&w).filter(|(a, b)| a == b).count();
    assert!(same < 50, "{same} equal draws");
}

#[test]
fn bad_index_and_seed_operands_are_errors() {
    let d = crate::common::dev();
    let x = Tensor::zeros(&[3, 2], DType::F32, &d).unwrap();
    let f = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let i2 = Tensor::zeros(&[2, 2], DType::I64, &d).unwrap();
    assert!(x.index_select(0, &f).is_err());
    assert!(x.index_select(0, &i2).is_err());
    assert!(x
        .index_select(2, &Tensor::zeros(&[1], DType::I64, &d).unwrap())
        .is_err());
    assert!(Tensor::rand_uniform(&[2], DType::I32, 1, &d).is_err());
    // A seed of another dtype is an error of the op itself.
    let s32 = Tensor::zeros(&[], DType::I32, &d).unwrap();
    let op = Op::RandomUniform {
        shape: Shape::new(&[2]),
        dtype: DType::F32,
    };
    assert!(Tensor::apply_op(op, &[&s32]).is_err());
}
