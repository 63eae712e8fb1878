//! Op-level differential fuzzing (issue #5): fusion must never change an answer.
//!
//! `differential` generates random well-typed op programs (see
//! `fuzz_support::gen`), runs each fused (with mid-program reads, early
//! drops and reads from other threads) and unfused, and checks every value
//! against the reference interpreter with the dtype-aware tolerances
//! documented in `fuzz_support::oracle`. A failure is shrunk by proptest
//! (genes), then by `fuzz_support::shrink` (steps, shapes, values) to a
//! minimal program and printed as a ready-to-paste `#[test]`; the bugs it
//! found are kept as regression tests in `tests/fuzz_regressions/` (wrong
//! values) and `tests/fuzz_crashes.rs` (programs that killed the process).
//!
//! Knobs: `FUZZ_SEED` (u64, default fixed so CI is reproducible),
//! `FUZZ_SEEDS=a..b` (a seed range, `a..=b` inclusive, each seed running
//! `FUZZ_CASES` programs),
//! `FUZZ_CASES` (programs; default 200 in release, 30 in debug builds) and
//! `FUZZ_TRACE=PATH` (each program is written there, as a test, before it
//! runs: when a program kills the process, the file holds it).
//! Run as `cargo test --release --test fuzz_ops -- --nocapture` to see the
//! statistics line.
//!
//! `bad_inputs` throws random ill-typed calls at the API: each must return
//! `Err` (exactly when shape/dtype inference rejects it, for `apply_op`),
//! never panic, and never leave a node in the graph.

mod common;
mod fuzz_support;

use fuzz_support::values::{random_data, random_dims, random_dtype, Rng, FLOAT_SPECIALS};
use fuzz_support::{build, check_program, shrink_program, Gene, Program, Step};
#[allow(unused_imports)]
use lazyfuse::ir::{
    infer, Axes, BinaryOp, CmpOp, DType, HostTensor, Literal, Op, ReduceOp, Shape, UnaryOp,
};
use lazyfuse::{pending_ops, FusionGuard, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

const DEFAULT_SEED: u64 = 0x00C0_FFEE_5EED;

fn gene() -> impl Strategy<Value = Gene> {
    (
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(|(kind, a, b, c, seed)| Gene {
            kind,
            a,
            b,
            c,
            seed,
        })
}

/// The seeds to run: `FUZZ_SEEDS=a..b` (or `a..=b`) is a range, else
/// `FUZZ_SEED` alone, else the fixed CI seed.
fn seeds() -> Vec<u64> {
    let Ok(range) = std::env::var("FUZZ_SEEDS") else {
        return vec![common::env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED)];
    };
    let parse = |v: &str| -> u64 {
        common::parse_u64(v).unwrap_or_else(|| panic!("FUZZ_SEEDS={range}: {v} is not a u64"))
    };
    let (a, b, inclusive) = match (range.split_once("..="), range.split_once("..")) {
        (Some((a, b)), _) => (a, b, true),
        (None, Some((a, b))) => (a, b, false),
        _ => panic!("FUZZ_SEEDS={range} is not a range a..b or a..=b"),
    };
    let (a, b) = (parse(a), parse(b));
    if inclusive {
        (a..=b).collect()
    } else {
        (a..b).collect()
    }
}

#[test]
fn differential() {
    let default_cases = if cfg!(debug_assertions) { 30 } else { 200 };
    let cases = common::env_u64("FUZZ_CASES").unwrap_or(default_cases) as u32;
    for seed in seeds() {
        differential_seed(seed, cases);
    }
}

/// `cases` random programs from `seed`; a failure is shrunk by proptest
/// (genes), then by [`fuzz_support::shrink_program`] (steps, shapes and
/// values), and printed as a test.
fn differential_seed(seed: u64, cases: u32) {
    let dev = common::dev();
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    };
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let start = Instant::now();
    let m0 = lazyfuse::metrics::snapshot();
    let (programs, ops, events) = (Cell::new(0usize), Cell::new(0usize), Cell::new(0usize));
    let trace = std::env::var_os("FUZZ_TRACE");
    let result = runner.run(&prop::collection::vec(gene(), 1..=24), |genes| {
        let p = build(&genes);
        if let Some(path) = &trace {
            std::fs::write(path, p.to_rust_test("fuzz_crash_name_me")).expect("writing FUZZ_TRACE");
        }
        programs.set(programs.get() + 1);
        ops.set(ops.get() + p.num_ops());
        let sync_events = p.steps.iter().filter(|s| {
            matches!(
                s,
                Step::Read(_) | Step::Drop(_) | Step::ReadOnThread(_) | Step::Sync
            )
        });
        events.set(events.get() + sync_events.count());
        check_program(&p, &dev).map_err(TestCaseError::fail)
    });
    let m1 = lazyfuse::metrics::snapshot();
    eprintln!(
        "fuzz_ops: seed {seed:#x}: {} programs run ({cases} cases + shrinking), {} ops, {} sync events, {} values left out, {} recomputes, {} compiles ({:.1} s), {:.1} s",
        programs.get(),
        ops.get(),
        events.get(),
        m1.left_out - m0.left_out,
        m1.recomputes - m0.recomputes,
        m1.compiles - m0.compiles,
        (m1.compile_ns - m0.compile_ns) as f64 * 1e-9,
        start.elapsed().as_secs_f64()
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, genes)) => {
            let p: Program = build(&genes);
            let small = shrink_program(&p, 3000, &mut |q| check_program(q, &dev).is_err());
            let why = check_program(&small, &dev).err().unwrap_or(why.to_string());
            panic!(
                "fuzz_ops (FUZZ_SEED={seed:#x}) found a mismatch:\n{why}\n\nminimal program as a test:\n\n{}",
                small.to_rust_test("fuzz_regression_name_me")
            );
        }
        Err(TestError::Abort(why)) => panic!("fuzz_ops aborted: {why}"),
    }
}

/// A random op with random (mostly wrong) attributes.
fn random_op(rng: &mut Rng) -> Op {
    let axes = |rng: &mut Rng| -> Axes { (0..rng.below(4)).map(|_| rng.below(6)).collect() };
    let lit = |rng: &mut Rng| match rng.below(3) {
        0 => Literal::Float(rng.pick(&FLOAT_SPECIALS)),
        1 => Literal::Int(rng.pick(&[-1, 0, 300, i64::MAX, 7])),
        _ => Literal::Bool(true),
    };
    match rng.below(16) {
        0 => Op::Unary(rng.pick(UnaryOp::ALL)),
        1 => Op::Binary(rng.pick(BinaryOp::ALL)),
        2 => Op::Compare(rng.pick(CmpOp::ALL)),
        3 => Op::Select,
        4 => Op::Convert(random_dtype(rng)),
        5 => Op::Reduce {
            op: rng.pick(ReduceOp::ALL),
            axes: axes(rng),
            keepdim: rng.one_in(2),
        },
        6 => Op::ArgMax {
            axis: rng.below(5),
            keepdim: rng.one_in(2),
        },
        7 => Op::Reshape(Shape::new(&random_dims(rng))),
        8 => Op::Permute(axes(rng)),
        9 => Op::BroadcastTo(Shape::new(&random_dims(rng))),
        10 => Op::Slice {
            axis: rng.below(5),
            start: rng.pick(&[0, 1, 2, 5, usize::MAX]),
            len: rng.pick(&[0, 1, 3, usize::MAX]),
        },
        11 => Op::Concat { axis: rng.below(5) },
        12 => Op::MatMul,
        13 => Op::Constant {
            value: lit(rng),
            shape: Shape::new(&random_dims(rng)),
            dtype: random_dtype(rng),
        },
        14 => Op::Input {
            shape: Shape::new(&random_dims(rng)),
            dtype: random_dtype(rng),
        },
        _ => Op::Arange {
            start: lit(rng),
            step: lit(rng),
            len: rng.below(4),
            dtype: random_dtype(rng),
        },
    }
}

/// One random, probably ill-typed, API call on `pool`. Returns a description,
/// the outcome, and whether inference accepts it (`None`: not an `apply_op`).
fn random_call(rng: &mut Rng, pool: &[Tensor]) -> (String, lazyfuse::Result<Tensor>, Option<bool>) {
    let dev = common::dev();
    let t = pool[rng.below(pool.len())].clone();
    let u = pool[rng.below(pool.len())].clone();
    let ax = |rng: &mut Rng| rng.below(13) as isize - 6;
    match rng.below(18) {
        0 => {
            let op = random_op(rng);
            let n = rng.below(4);
            let args: Vec<Tensor> = (0..n)
                .map(|_| pool[rng.below(pool.len())].clone())
                .collect();
            let refs: Vec<&Tensor> = args.iter().collect();
            let operands: Vec<(&Shape, DType)> =
                args.iter().map(|a| (a.shape(), a.dtype())).collect();
            let ok = !args.is_empty() && infer(&op, &operands).is_ok();
            (
                format!("apply_op({op:?}, {operands:?})"),
                Tensor::apply_op(op, &refs),
                Some(ok),
            )
        }
        1 => {
            let (a, s, l) = (ax(rng), rng.below(6), rng.pick(&[0, 1, 4, usize::MAX]));
            (
                format!("narrow({a}, {s}, {l}) of {:?}", t.dims()),
                t.narrow(a, s, l),
                None,
            )
        }
        2 => {
            let d = random_dims(rng);
            (
                format!("reshape({d:?}) of {:?}", t.dims()),
                t.reshape(&d),
                None,
            )
        }
        3 => {
            let p: Vec<isize> = (0..rng.below(5))
                .map(|_| rng.below(10) as isize - 5)
                .collect();
            (
                format!("permute({p:?}) of {:?}", t.dims()),
                t.permute(&p),
                None,
            )
        }
        4 => {
            let a = ax(rng);
            (
                format!("cat({:?}, {:?}, {a})", t.dims(), u.dims()),
                Tensor::cat(&[&t, &u], a),
                None,
            )
        }
        5 => (
            format!("matmul({:?}, {:?})", t.dims(), u.dims()),
            t.matmul(&u),
            None,
        ),
        6 => {
            let axes: Vec<isize> = (0..rng.below(4)).map(|_| ax(rng)).collect();
            let k = rng.one_in(2);
            let r = match rng.below(4) {
                0 => t.sum(&axes, k),
                1 => t.mean(&axes, k),
                2 => t.max(&axes, k),
                _ => t.min(&axes, k),
            };
            (
                format!("reduce({axes:?}) of {}{:?}", t.dtype(), t.dims()),
                r,
                None,
            )
        }
        7 => {
            let (a, b) = (ax(rng), ax(rng));
            let r = match rng.below(3) {
                0 => t.squeeze(a),
                1 => t.unsqueeze(a),
                _ => t.transpose(a, b),
            };
            (
                format!("squeeze/unsqueeze/transpose({a}, {b}) of {:?}", t.dims()),
                r,
                None,
            )
        }
        8 => {
            let (v, d, dt) = (
                rng.pick(&FLOAT_SPECIALS),
                random_dims(rng),
                random_dtype(rng),
            );
            let v = if rng.one_in(2) {
                rng.pick(&[0.5, 256.0, -1.0, 3e9, 1e19])
            } else {
                v
            };
            (
                format!("full({v}, {d:?}, {dt})"),
                Tensor::full(v, &d, dt, &dev),
                None,
            )
        }
        9 => {
            let s = rng.pick(&[0.0, f64::NAN, 1.0, -1.0, 0.5, f64::INFINITY]);
            let a = rng.pick(&[0.0, f64::NEG_INFINITY, -2.5, 300.0]);
            let dt = random_dtype(rng);
            (
                format!("arange_step({a}, 5, {s}, {dt})"),
                Tensor::arange_step(a, 5.0, s, dt, &dev),
                None,
            )
        }
        10 => {
            let d = random_dims(rng);
            let n = d.iter().product::<usize>() + 1 + rng.below(3);
            (
                format!("from_slice({n} values, {d:?})"),
                Tensor::from_slice(&vec![1.0f32; n], &d, &dev),
                None,
            )
        }
        11 => {
            let r = if rng.one_in(2) {
                t.to_vec::<i64>().map(|_| t.clone())
            } else {
                t.item::<f32>().map(|_| t.clone())
            };
            (
                format!("to_vec/item of {}{:?}", t.dtype(), t.dims()),
                r,
                None,
            )
        }
        12 => {
            let v = rng.pick(&[0.5, -1.0, 256.0, 1e10, f64::NAN, 1e19, 2.0]);
            let r = match rng.below(3) {
                0 => t.add(v),
                1 => t.pow(v),
                _ => t.lt(v),
            };
            (
                format!("scalar op {v} on {}{:?}", t.dtype(), t.dims()),
                r,
                None,
            )
        }
        13 => {
            let b = rng.pick(BinaryOp::ALL);
            let r = Tensor::apply_op(Op::Binary(b), &[&t, &u]);
            (
                format!(
                    "{}({}{:?}, {}{:?})",
                    b.name(),
                    t.dtype(),
                    t.dims(),
                    u.dtype(),
                    u.dims()
                ),
                r,
                None,
            )
        }
        14 => {
            let w = pool[rng.below(pool.len())].clone();
            (
                format!("where_cond({}, {}, {})", t.dtype(), u.dtype(), w.dtype()),
                t.where_cond(&u, &w),
                None,
            )
        }
        15 => {
            let (a, k) = (ax(rng), rng.one_in(2));
            (
                format!("argmax({a}) of {}{:?}", t.dtype(), t.dims()),
                t.argmax(a, k),
                None,
            )
        }
        16 => {
            let d = random_dims(rng);
            (
                format!("broadcast_to({d:?}) of {:?}", t.dims()),
                t.broadcast_to(&d),
                None,
            )
        }
        _ => {
            let dt = random_dtype(rng);
            (format!("to_dtype({dt})"), t.to_dtype(dt), None)
        }
    }
}

#[test]
fn bad_inputs() {
    let seed = common::env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = if cfg!(debug_assertions) { 1500 } else { 4000 };
    let dev = common::dev();
    let _f = FusionGuard::new(true);
    let mut rng = Rng::new(seed ^ 0xbad);
    let (mut errs, mut oks) = (0, 0);
    for case in 0..cases {
        // Materialised leaves plus one pending tensor.
        let mut pool: Vec<Tensor> = (0..4)
            .map(|_| {
                let (d, t) = (random_dims(&mut rng), random_dtype(&mut rng));
                Tensor::from_host(&random_data(&mut rng, &d, t), &dev).unwrap()
            })
            .collect();
        pool.push(Tensor::full(1.0, &random_dims(&mut rng), random_dtype(&mut rng), &dev).unwrap());
        let before = pending_ops(&dev);
        let outcome = catch_unwind(AssertUnwindSafe(|| random_call(&mut rng, &pool)));
        let (what, result, well_typed) = match outcome {
            Ok(x) => x,
            Err(_) => panic!("case {case}: an API call panicked (seed {seed:#x})"),
        };
        match result {
            Ok(_) => {
                oks += 1;
                assert_ne!(
                    well_typed,
                    Some(false),
                    "case {case}: {what} was accepted but inference rejects it"
                );
            }
            Err(e) => {
                errs += 1;
                assert_ne!(
                    well_typed,
                    Some(true),
                    "case {case}: {what} was rejected but inference accepts it: {e}"
                );
                assert_eq!(
                    pending_ops(&dev),
                    before,
                    "case {case}: {what} returned Err ({e}) but left a node in the graph"
                );
            }
        }
        drop(pool);
        lazyfuse::sync();
    }
    eprintln!("bad_inputs: {cases} calls, {errs} rejected, {oks} accepted");
}
