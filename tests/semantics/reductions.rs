//! Long float sums keep their accuracy. XLA's CPU backend runs without its
//! tree reduction rewriter (a row reduction is then one loop that computes
//! its operand in place), so lowering sums more than 65,536 elements in
//! stages of 1,024 itself: these sums stay within a few units in the last
//! place of the exact (f64) sum, fused and unfused give the same bits, and
//! zero padding of a length that is not a multiple of a stage changes
//! nothing.

use crate::common::{device_of, xla_dev, Backend};
use lazyfuse::{DType, FusionGuard, Tensor};

/// `n` values in [0.5, 1.5), all of one sign, so that a relative error
/// measures the summation alone.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = lazyfuse::ir::SplitMix64::new(seed);
    (0..n)
        .map(|_| (r.next_u64() % 1_000_000) as f32 / 1e6 + 0.5)
        .collect()
}

fn rel(got: f32, exact: f64) -> f64 {
    ((got as f64 - exact) / exact).abs()
}

/// A sum of 2^24 values is within 2e-7 of the exact sum (one loop was off
/// by 3.4e-6), in one region with other ops and alone, with the same bits.
#[test]
fn a_sum_of_sixteen_million_values_stays_accurate() {
    let n = 1 << 24;
    let v = values(n, 1);
    let exact: f64 = v.iter().map(|&x| x as f64).sum();
    let mut bits = Vec::new();
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        let x = Tensor::from_slice(&v, &[1 << 12, 1 << 12], &xla_dev()).unwrap();
        let s = x.sum([0, 1], false).unwrap().item::<f32>().unwrap();
        assert!(rel(s, exact) < 2e-7, "fuse {fuse}: {s} vs {exact}");
        let m = x.mul(2.0).unwrap().mean(.., false).unwrap();
        let m = m.item::<f32>().unwrap();
        assert!(rel(m, 2.0 * exact / n as f64) < 2e-7, "mean: {m}");
        bits.push((s.to_bits(), m.to_bits()));
    }
    assert_eq!(bits[0], bits[1], "fused and unfused sums differ");
}

/// Staged sums over one middle axis whose length is no multiple of a
/// stage (zero padding), in f32 and bf16, keep the other axes apart and
/// equal the interpreter's within a few ulps.
#[test]
fn staged_sums_over_a_middle_axis_pad_exactly() {
    let (a, n, b) = (3, 70_001, 2);
    let v = values(a * n * b, 2);
    for dtype in [DType::F32, DType::BF16] {
        let mut got = Vec::new();
        for backend in [Backend::Xla, Backend::Interp] {
            let x = Tensor::from_slice(&v, &[a, n, b], &device_of(backend))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let s = x.sum([1], true).unwrap();
            assert_eq!(s.dims(), vec![a, 1, b]);
            let m = x.mean([1], false).unwrap();
            let s = s.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let m = m.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            got.push((s, m));
        }
        let (xla, interp) = (&got[0], &got[1]);
        let tol = if dtype == DType::F32 { 5e-7 } else { 8e-3 };
        for (g, w) in xla
            .0
            .iter()
            .chain(&xla.1)
            .zip(interp.0.iter().chain(&interp.1))
        {
            assert!(rel(*g, *w as f64) <= tol, "{dtype:?}: {g} vs {w}");
        }
    }
}

/// A long sum over axes that are not contiguous runs as one reduce, and
/// is still right.
#[test]
fn a_long_sum_over_separate_axes_is_right() {
    let (a, m, b) = (300, 3, 300);
    let v = values(a * m * b, 3);
    let x = Tensor::from_slice(&v, &[a, m, b], &xla_dev()).unwrap();
    let s = x.sum([0, 2], false).unwrap().to_vec::<f32>().unwrap();
    for (j, got) in s.iter().enumerate() {
        let exact: f64 = (0..a)
            .flat_map(|i| (0..b).map(move |k| (i * m + j) * b + k))
            .map(|idx| v[idx] as f64)
            .sum();
        assert!(rel(*got, exact) < 1e-5, "column {j}: {got} vs {exact}");
    }
}

/// Float sums and means over leading axes (lowered as a product with a
/// vector of ones, see `xla/src/lower/contract.rs`) equal the interpreter's:
/// exactly for integer-valued data, and with IEEE specials in their columns
/// (an infinity, both infinities, a NaN, only negative zeros); fused and
/// unfused give the same bits, in f32, bf16 and f64.
#[test]
fn sums_over_leading_axes_match_the_interpreter() {
    let (a, b, c) = (3, 37, 70);
    let mut v: Vec<f32> = (0..a * b * c)
        .map(|i| ((i * 7919) % 41) as f32 - 20.0)
        .collect();
    let col = |v: &mut Vec<f32>, j: usize, f: &dyn Fn(usize) -> f32| {
        for r in 0..a * b {
            v[r * c + j] = f(r);
        }
    };
    col(&mut v, 0, &|r| if r == 5 { f32::INFINITY } else { 1.0 });
    col(&mut v, 1, &|r| match r {
        3 => f32::INFINITY,
        60 => f32::NEG_INFINITY,
        _ => 2.0,
    });
    col(&mut v, 2, &|r| if r == 100 { f32::NAN } else { 0.5 });
    col(&mut v, 3, &|_| -0.0);
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let mut results = Vec::new();
        for (backend, fuse) in [
            (Backend::Interp, true),
            (Backend::Xla, true),
            (Backend::Xla, false),
        ] {
            let _f = FusionGuard::new(fuse);
            let x = Tensor::from_slice(&v, &[a, b, c], &device_of(backend))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let read = |t: Tensor| -> Vec<u64> {
                t.to_dtype(DType::F64)
                    .unwrap()
                    .to_vec::<f64>()
                    .unwrap()
                    .iter()
                    .map(|f| f.to_bits())
                    .collect()
            };
            let s1 = read(x.sum([0], false).unwrap());
            let s2 = read(x.sum([0, 1], false).unwrap());
            let m = read(x.mul(2.0).unwrap().mean([0, 1], true).unwrap());
            results.push((s1, s2, m));
        }
        let (want, fused, unfused) = (&results[0], &results[1], &results[2]);
        assert_eq!(fused, unfused, "{dtype:?}: fused and unfused sums differ");
        for (what, w, g) in [
            ("sum [0]", &want.0, &fused.0),
            ("sum [0, 1]", &want.1, &fused.1),
            ("mean", &want.2, &fused.2),
        ] {
            for (j, (w, g)) in w.iter().zip(g).enumerate() {
                let (w, g) = (f64::from_bits(*w), f64::from_bits(*g));
                let same = (w.is_nan() && g.is_nan()) || w.to_bits() == g.to_bits();
                assert!(
                    same,
                    "{dtype:?} {what} element {j}: interpreter {w:?}, XLA {g:?}"
                );
            }
        }
    }
}
