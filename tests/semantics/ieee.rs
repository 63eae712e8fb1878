//! Fusion must never change an IEEE answer. Each test is one class of XLA
//! rewrite that spans ops, and so only fires when ops that ran as separate
//! regions land in one: it runs the same program fused, unfused
//! (`LAZYFUSE_FUSION=0`) and on the reference interpreter, and requires the
//! three to agree bit for bit (any NaN matches any NaN: IEEE leaves the
//! payload open) and to give the IEEE answer. The compile options that keep
//! these right are documented in `xla/src/pjrt/options.rs`.

use crate::common::{device_of, Backend};
use lazyfuse::{DType, FusionGuard, Result, Tensor};

/// Bits of an f32, with every NaN one value.
fn bits(v: f32) -> u32 {
    if v.is_nan() {
        0x7fc0_0000
    } else {
        v.to_bits()
    }
}

/// Runs `f` on `inputs` (f32 vectors) fused and unfused on XLA, and on the
/// interpreter; checks the three agree bit for bit and equal `want`.
fn agree(inputs: &[&[f32]], want: &[f32], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let mut runs = Vec::new();
    for (name, backend, fuse) in [
        ("fused", Backend::Xla, true),
        ("unfused", Backend::Xla, false),
        ("interpreter", Backend::Interp, true),
    ] {
        let dev = device_of(backend);
        let _f = FusionGuard::new(fuse);
        let xs: Vec<Tensor> = inputs
            .iter()
            .map(|v| Tensor::from_slice(v, &[v.len()], &dev).unwrap())
            .collect();
        for x in &xs {
            x.realize().unwrap();
        }
        let got: Vec<u32> = f(&xs)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(bits)
            .collect();
        runs.push((name, got));
    }
    let want: Vec<u32> = want.iter().map(|&v| bits(v)).collect();
    for (name, got) in &runs {
        let show = |b: &[u32]| -> Vec<f32> { b.iter().map(|&x| f32::from_bits(x)).collect() };
        assert_eq!(
            got,
            &want,
            "{name}: {:?}, IEEE: {:?}",
            show(got),
            show(&want)
        );
    }
}

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

/// The fuzzer's finding: `multiply(convert(pred), x)` was rewritten to
/// `select(pred, x, 0)`, giving 0 where IEEE gives NaN.
#[test]
fn converted_predicate_times_nan_is_nan() {
    let p = [1.0, -1.0, -2.0, 3.0];
    agree(&[&p], &[NAN; 4], |x| {
        x[0].gt(0.0)?.to_dtype(DType::F32)?.mul(f64::NAN)
    });
}

/// Same rewrite: `0 * ±Inf` is NaN, and `0 * -3` is -0, not +0.
#[test]
fn converted_predicate_times_infinity_and_negative_keeps_ieee() {
    let p = [1.0, -1.0, -2.0, 3.0];
    agree(&[&p], &[INF, NAN, NAN, INF], |x| {
        x[0].gt(0.0)?.to_dtype(DType::F32)?.mul(f64::INFINITY)
    });
    agree(&[&p], &[-3.0, -0.0, -0.0, -3.0], |x| {
        x[0].gt(0.0)?.to_dtype(DType::F32)?.mul(-3.0)
    });
    // `convert(p) / 0` went through `broadcast(1/0) * convert(p)` to the same rewrite.
    agree(&[&p], &[INF, NAN, NAN, INF], |x| {
        x[0].gt(0.0)?.to_dtype(DType::F32)?.div(0.0)
    });
}

/// `max`/`min` propagate NaN whatever the operand order (XLA's default
/// "fast min/max" dropped it in one order), elementwise and reduced.
#[test]
fn maximum_and_minimum_propagate_nan_in_either_order() {
    let a = [1.0, NAN, 2.0, NAN];
    let b = [NAN, 1.0, 3.0, NAN];
    agree(&[&a, &b], &[NAN, NAN, 3.0, NAN], |x| x[0].maximum(&x[1]));
    agree(&[&a, &b], &[NAN, NAN, 2.0, NAN], |x| x[1].minimum(&x[0]));
    let r = [1.0, NAN, 2.0, 3.0];
    agree(&[&r], &[NAN], |x| x[0].mul(2.0)?.max([0], false));
    agree(&[&r], &[NAN], |x| x[0].add(1.0)?.min([0], false));
}

/// Float `max`/`min` reductions are lowered with a plain body, which XLA's
/// CPU backend vectorises (a NaN-selecting body ran as a scalar loop, 30
/// times slower), and over leading axes as a tree of elementwise extrema.
/// Both must propagate NaN, whatever the dtype, the axis, the row length
/// against the vector width, the NaN's place in the row (first, inside a
/// vector, in the tail) and the row count (padded to a power of two in
/// the tree, above its limit a reduce); fused with a producer and alone.
#[test]
fn max_and_min_reductions_propagate_nan_at_every_position() {
    let dev = device_of(Backend::Xla);
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (r, c) in [(5usize, 17usize), (9, 64), (3, 1000), (2, 4099), (1100, 64)] {
                for pos in [0usize, 1, 8, 15, 16, 63, 999, 4098, 70_000, r * c - 1] {
                    if pos >= r * c {
                        continue;
                    }
                    let mut v: Vec<f32> =
                        (0..r * c).map(|i| (i * 37 % 101) as f32 - 50.0).collect();
                    v[pos] = NAN;
                    let x = Tensor::from_slice(&v, &[r, c], &dev)
                        .unwrap()
                        .to_dtype(dt)
                        .unwrap();
                    for axis in [None, Some(0usize), Some(1)] {
                        let reduce = |max: bool| -> Vec<f32> {
                            let y = x.mul(2.0).unwrap();
                            let y = match (axis, max) {
                                (None, true) => y.max(.., false),
                                (None, false) => y.min(.., false),
                                (Some(a), true) => y.max([a as isize], false),
                                (Some(a), false) => y.min([a as isize], false),
                            };
                            y.unwrap().to_dtype(DType::F32).unwrap().to_vec().unwrap()
                        };
                        // The output that reduces the NaN, and the host's answer.
                        let (nan_at, outs) = match axis {
                            None => (0, 1),
                            Some(0) => (pos % c, c),
                            _ => (pos / c, r),
                        };
                        let lane = |o: usize| -> Vec<f32> {
                            match axis {
                                None => v.clone(),
                                Some(0) => (0..r).map(|i| v[i * c + o]).collect(),
                                _ => v[o * c..(o + 1) * c].to_vec(),
                            }
                        };
                        for (max, got) in [(true, reduce(true)), (false, reduce(false))] {
                            assert_eq!(got.len(), outs);
                            for (o, g) in got.iter().enumerate() {
                                let l = lane(o);
                                let want = if o == nan_at {
                                    NAN
                                } else if max {
                                    2.0 * l.iter().cloned().fold(f32::MIN, f32::max)
                                } else {
                                    2.0 * l.iter().cloned().fold(f32::MAX, f32::min)
                                };
                                assert_eq!(
                                    bits(*g),
                                    bits(want),
                                    "{dt:?} [{r}, {c}] NaN at {pos}, axis {axis:?}, max {max}, \
                                     fused {fuse}, output {o}: {g} (want {want})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `argmax` is a maximum and then the first index equal to it or NaN (two
/// vectorised reductions): it must still pick what the interpreter picks,
/// the first NaN, the first of tied maxima, `-0` tied with `+0`, a row of
/// `-inf`, and bf16 subnormals read as zero; fused and unfused.
#[test]
fn argmax_picks_the_first_maximum_or_nan_like_the_interpreter() {
    let (xla, interp) = (device_of(Backend::Xla), device_of(Backend::Interp));
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        for dt in [
            DType::F32,
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::I32,
            DType::U8,
        ] {
            for (r, c) in [(4usize, 5usize), (7, 64), (2, 1030)] {
                for variant in 0..5 {
                    let shift = if dt == DType::U8 { 0.0 } else { 6.0 };
                    let mut v: Vec<f32> = (0..r * c)
                        .map(|i| ((i * 37 + variant * 11) % 13) as f32 - shift)
                        .collect();
                    if dt.is_float() {
                        match variant {
                            1 => v[r * c / 2] = NAN,
                            2 => v[..c].fill(f32::NEG_INFINITY),
                            3 => (v[0], v[1], v[r * c - 1]) = (NAN, f32::INFINITY, NAN),
                            4 => {
                                v.iter_mut().filter(|x| **x == 0.0).for_each(|x| *x = -0.0);
                                (v[1], v[2]) = (-1e-40, 1e-40);
                            }
                            _ => {}
                        }
                    }
                    for (axis, keep) in [(0isize, false), (1, true)] {
                        let run = |d: &lazyfuse::Device| -> Vec<i64> {
                            let x = Tensor::from_slice(&v, &[r, c], d).unwrap();
                            let x = x.to_dtype(dt).unwrap().mul(1.0).unwrap();
                            x.argmax(axis, keep).unwrap().to_vec().unwrap()
                        };
                        assert_eq!(
                            run(&xla),
                            run(&interp),
                            "{dt:?} [{r}, {c}] variant {variant} axis {axis} fused {fuse}"
                        );
                    }
                }
            }
        }
    }
}

/// `abs(x) >= 0` was folded to true, which is false for NaN.
#[test]
fn abs_of_nan_is_not_non_negative() {
    let a = [NAN, -1.0, 0.0, -0.0];
    agree(&[&a], &[0.0, 1.0, 1.0, 1.0], |x| {
        x[0].abs()?.ge(0.0)?.to_dtype(DType::F32)
    });
}

/// `(a / b) / c` was reassociated into `a / (b * c)`, which overflows.
#[test]
fn chained_division_is_not_reassociated() {
    let a = [1e30, 1.0, -1e30, 6.0];
    let b = [1e30, 1e30, 1e30, 2.0];
    let c = [1e30, 1e30, 1e30, 3.0];
    agree(&[&a, &b, &c], &[1e-30, 0.0, -1e-30, 1.0], |x| {
        x[0].div(&x[1])?.div(&x[2])
    });
}

/// `sqrt(a * a)` was rewritten to `|a|`: IEEE overflows to Inf and
/// underflows to 0 (flushed), and keeps NaN.
#[test]
fn square_root_of_a_square_keeps_overflow_and_underflow() {
    let a = [1e30, -1e-30, 3.0, NAN];
    agree(&[&a], &[INF, 0.0, 3.0, NAN], |x| x[0].mul(&x[0])?.sqrt());
}

/// `a / sqrt(b)` was rewritten to `a * rsqrt(b)`, an approximation.
#[test]
fn division_by_a_square_root_is_correctly_rounded() {
    let a: Vec<f32> = (1..=16).map(|i| i as f32 * 0.37).collect();
    let b: Vec<f32> = (1..=16).map(|i| 1.0 + i as f32 * 1.93).collect();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x / y.sqrt()).collect();
    agree(&[&a, &b], &want, |x| x[0].div(&x[1].sqrt()?));
}

/// `x + 0` and `x - 0` against a literal zero were folded to `x`: IEEE
/// gives `-0 + 0 = +0` and `-0 - (-0) = +0`.
#[test]
fn adding_zero_to_negative_zero_gives_positive_zero() {
    let z = [-0.0, 1.0, -0.0, NAN];
    agree(&[&z], &[0.0, 1.0, 0.0, NAN], |x| x[0].mul(1.0)?.add(0.0));
    agree(&[&z], &[0.0, 1.0, 0.0, NAN], |x| x[0].mul(1.0)?.sub(-0.0));
}

/// Constants are not reassociated: `(x + 1e30) - 1e30` is 0 for small `x`,
/// not `x`.
#[test]
fn additions_of_constants_are_not_reassociated() {
    let a = [1.0, -2.0, 1e30, 0.5];
    agree(&[&a], &[0.0, 0.0, 1e30, 0.0], |x| x[0].add(1e30)?.sub(1e30));
}

/// A subnormal float constant is stored as zero of its sign, as arithmetic
/// reads it at run time: the compiler folded `log` of a negative subnormal
/// constant with IEEE host arithmetic to NaN (`log(-0) = -inf` at run time)
/// and `rsqrt` of a positive one to 1e20 (`rsqrt(0) = inf`). The values
/// themselves read back as zeros on every path.
#[test]
fn subnormal_constants_are_zeros_for_the_compiler_too() {
    let one = [1.0f32, 2.0];
    let full = |v: f64, x: &Tensor| Tensor::full(v, &[2], DType::F32, x.device());
    agree(&[&one], &[f32::NEG_INFINITY; 2], |x| {
        full(-1e-40, &x[0])?.log()
    });
    agree(&[&one], &[f32::INFINITY; 2], |x| {
        full(1e-40, &x[0])?.rsqrt()
    });
    agree(&[&one], &[-0.0, -0.0], |x| full(-1e-40, &x[0]));
    agree(&[&one], &[f32::NEG_INFINITY; 2], |x| {
        x[0].mul(0.0)?.add(-1e-40)?.log()
    });
}

/// `a*b + c` in one region may be one fused multiply-add (docs/semantics.md's
/// semantics); with `LAZYFUSE_STRICT_FP=1` it never is, and fused equals
/// unfused bit for bit. The strict half runs in a child process (the
/// option is read once per process: it is part of every compile).
#[test]
fn strict_fp_turns_multiply_add_contraction_off() {
    let x0 = 1.0f32 + 2f32.powi(-12);
    let c = -(1.0 + 2f64.powi(-11));
    let run = |fuse: bool| -> f32 {
        let dev = device_of(Backend::Xla);
        let _f = FusionGuard::new(fuse);
        let x = Tensor::from_slice(&[x0; 8], &[8], &dev).unwrap();
        x.realize().unwrap();
        x.mul(&x).unwrap().add(c).unwrap().to_vec::<f32>().unwrap()[0]
    };
    // Two roundings: x*x rounds to 1 + 2^-11 exactly, so the sum is 0.
    assert_eq!(run(false).to_bits(), 0.0f32.to_bits());
    if std::env::var_os("LAZYFUSE_STRICT_FP").is_some() {
        assert_eq!(run(true).to_bits(), run(false).to_bits(), "strict: no FMA");
        return;
    }
    let fused = run(true);
    assert!(
        fused == 0.0 || fused == 2f32.powi(-24),
        "one rounding at most: {fused}"
    );
    // This test's name as the harness knows it: its module path without
    // the crate's name.
    let name = module_path!()
        .split_once("::")
        .map_or(String::new(), |(_, m)| format!("{m}::"))
        + "strict_fp_turns_multiply_add_contraction_off";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name])
        .env("LAZYFUSE_STRICT_FP", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strict child failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A bf16 subnormal widened to f32 or f64 is zero of its sign, in every
/// region shape. XLA widens bf16 by shifting bits, and LLVM folded a
/// compare of the widened value with a constant zero into an integer test
/// that saw the subnormal as non-zero, while unfused the hardware read it as
/// zero: `bf16 -> f32 -> bool` of a subnormal was `true` fused (found by
/// `fuzz_campaign`, seed 1000, program 2418; `fuzz_subnormals.rs` holds the
/// program). The widening flushes explicitly, as the interpreter does.
#[test]
fn widened_bf16_subnormals_compare_as_zero_fused_and_unfused() {
    use lazyfuse::ir::HostTensor;
    let vals = [9.183549615799121e-41, -9.18e-41, 0.0, 1.0, -2.5e-39, 3e-38];
    let mut runs = Vec::new();
    for (name, backend, fuse) in [
        ("fused", Backend::Xla, true),
        ("unfused", Backend::Xla, false),
        ("interpreter", Backend::Interp, true),
    ] {
        let dev = device_of(backend);
        let _f = FusionGuard::new(fuse);
        let h = HostTensor::from_f64(&vals, lazyfuse::ir::Shape::new(&[6]), DType::BF16);
        let x = Tensor::from_host(&h, &dev).unwrap();
        x.realize().unwrap();
        let zeros = |dt| Tensor::zeros(&[6], dt, &dev).unwrap();
        let bools = |t: Tensor| -> Vec<u8> {
            let v = t.to_vec::<bool>().unwrap();
            v.into_iter().map(u8::from).collect()
        };
        let w = x.to_dtype(DType::F32).unwrap();
        let d = x.to_dtype(DType::F64).unwrap();
        let outs: Vec<Vec<u8>> = vec![
            bools(w.to_dtype(DType::Bool).unwrap()),
            bools(w.ne(zeros(DType::F32)).unwrap()),
            bools(w.eq(zeros(DType::F32)).unwrap()),
            bools(d.to_dtype(DType::Bool).unwrap()),
            bools(d.eq(zeros(DType::F64)).unwrap()),
            bools(x.to_dtype(DType::Bool).unwrap()),
            w.to_vec::<f32>()
                .unwrap()
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect(),
        ];
        runs.push((name, outs));
    }
    let truthy = vec![0u8, 0, 0, 1, 0, 1];
    let zero = vec![1u8, 1, 1, 0, 1, 0];
    for (name, outs) in &runs {
        for (i, want) in [&truthy, &truthy, &zero, &truthy, &zero, &truthy]
            .iter()
            .enumerate()
        {
            assert_eq!(&&outs[i], want, "{name}: check {i}");
        }
        assert_eq!(outs[6], runs[0].1[6], "{name}: widened bits");
    }
    let widened: Vec<f32> = runs[0].1[6]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(widened[0].to_bits(), 0, "a subnormal widens to +0");
    assert_eq!(widened[1].to_bits(), 0x8000_0000, "and keeps its sign");
}

/// `log` of -0 and of a negative subnormal input (read as -0) is -inf at
/// every position of a long vector, in vectorised loops and their tails.
#[test]
fn log_of_negative_zero_and_subnormal_inputs_is_minus_infinity() {
    for n in [16usize, 17, 33, 40] {
        for (k, v) in [(0usize, -0.0f32), (n - 1, -1e-40), (n / 2, -0.0)] {
            let mut x = vec![1.0f32; n];
            x[k] = v;
            let want: Vec<f32> = x
                .iter()
                .map(|&v| {
                    if v == 0.0 || v.abs() < f32::MIN_POSITIVE {
                        f32::NEG_INFINITY
                    } else {
                        v.ln()
                    }
                })
                .collect();
            agree(&[&x], &want, |t| t[0].log());
        }
    }
}
