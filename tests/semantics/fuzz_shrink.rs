//! The program-level shrinker (`fuzz_support::shrink`) on a planted failure.
//!
//! The planted bug is the rewrite of issue 14's finding, modelled on the
//! reference interpreter: `mul(convert(b), x)` of a bool `b` computed as
//! `select(b, x, 0)`, which differs from IEEE `0 * x` exactly where `b` is
//! false and `x` is NaN or infinite. A program "fails" when one of its
//! multiplications would come out different under that rewrite. The test
//! takes the first random program of the fuzzer's generator that fails,
//! shrinks it, and pins the result with a golden file
//! (`tests/golden/shrink_planted_failure.txt`, `LAZYFUSE_BLESS=1` rewrites
//! it): the minimum is a bool, its conversion and one multiplication by a
//! non-finite value, with every other step, input and element gone.

use crate::fuzz_support::oracle::run;
use crate::fuzz_support::values::{literal_for, Rng};
use crate::fuzz_support::{build, random_genes, shrink_program, Program, Step};
use lazyfuse::ir::{interp, BinaryOp, DType, HostTensor, Literal, Op, Shape};
use lazyfuse::Device;

/// Whether some multiplication in `p` changes under the planted rewrite.
fn planted_fails(p: &Program) -> bool {
    let Ok(values) = run(p, &Device::interpreter(), false) else {
        return false;
    };
    let values: Vec<HostTensor> = values.into_iter().map(Option::unwrap).collect();
    // Value id -> the bool value it converts, for float conversions of bools.
    let mut converted_bool: Vec<Option<usize>> = Vec::new();
    for step in p.steps.iter().filter(|s| s.defines_value()) {
        let v = converted_bool.len();
        converted_bool.push(None);
        let (mask, other) = match step {
            Step::Apply {
                op: Op::Convert(to),
                args,
            } if to.is_float() && values[args[0]].dtype == DType::Bool => {
                converted_bool[v] = Some(args[0]);
                continue;
            }
            Step::Apply {
                op: Op::Binary(BinaryOp::Mul),
                args,
            } => match (converted_bool[args[0]], converted_bool[args[1]]) {
                (Some(b), _) => (b, values[args[1]].clone()),
                (_, Some(b)) => (b, values[args[0]].clone()),
                _ => continue,
            },
            Step::Scalar {
                op: Op::Binary(BinaryOp::Mul),
                arg,
                value,
            } => match converted_bool[*arg] {
                Some(b) => {
                    let d = values[*arg].dtype;
                    let c = Op::Constant {
                        value: literal_for(*value, d),
                        shape: Shape::scalar(),
                        dtype: d,
                    };
                    (b, interp::eval_op(&c, &[]).unwrap())
                }
                None => continue,
            },
            _ => continue,
        };
        let zero = Op::Constant {
            value: Literal::Int(0),
            shape: Shape::scalar(),
            dtype: other.dtype,
        };
        let zero = interp::eval_op(&zero, &[]).unwrap();
        let rewritten = interp::eval_op(&Op::Select, &[&values[mask], &other, &zero]).unwrap();
        let right = values[v].to_f64_vec();
        let wrong = rewritten.to_f64_vec();
        if right
            .iter()
            .zip(&wrong)
            .any(|(a, b)| a.is_nan() != b.is_nan() || (!a.is_nan() && a != b))
        {
            return true;
        }
    }
    false
}

/// The first program of seeds `0..` (24 random genes each) that fails.
fn planted_program() -> (u64, Program) {
    for seed in 0..10_000u64 {
        let genes = random_genes(&mut Rng::new(seed), 24);
        let p = build(&genes);
        if planted_fails(&p) {
            return (seed, p);
        }
    }
    panic!("no random program of 10,000 fails the planted predicate");
}

#[test]
fn shrinker_reduces_a_planted_failure_to_its_minimum() {
    let (seed, p) = planted_program();
    let before = (p.steps.len(), p.num_values());
    let mut checks = 0;
    let small = shrink_program(&p, 5000, &mut |q| {
        checks += 1;
        planted_fails(q)
    });
    assert!(planted_fails(&small), "the shrunk program must still fail");
    eprintln!(
        "planted failure from seed {seed}: {} steps ({} values) -> {} steps in {checks} checks",
        before.0,
        before.1,
        small.steps.len()
    );
    // Three values: a bool, its conversion, the multiplication (by a
    // lifted scalar or a value), nothing else.
    assert!(
        small.num_values() <= 4 && before.0 > small.steps.len(),
        "not shrunk far enough:\n{}",
        small.to_rust_test("planted")
    );
    lazyfuse_ir::golden!(
        "shrink_planted_failure",
        small.to_rust_test("planted_failure")
    );
}

#[test]
fn shrinking_keeps_programs_well_typed() {
    // Every program the generator builds is well typed for the shrinker's
    // checker, so no edit is rejected for a reason the generator disagrees with.
    for seed in 0..200u64 {
        let genes = random_genes(&mut Rng::new(seed ^ 0x5eed), 16);
        let p = build(&genes);
        assert!(
            crate::fuzz_support::shrink::well_typed(&p),
            "seed {seed}: the shrinker's checker rejects a generated program:\n{}",
            p.to_rust_test("rejected")
        );
    }
}
