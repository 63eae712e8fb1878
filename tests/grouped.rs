//! `cumsum`, `topk`, `group_by` and `ragged_dot` (the mixture-of-experts
//! ops): values against host references, fused and unfused, on every test
//! backend; `ragged_dot`'s gradients against the masked dense form; one
//! compile for any group sizes; argument errors.

mod common;
use common::{dev, metrics_lock, Rng};
use lazyfuse::{metrics, DType, FusionGuard, Tensor};

/// Runs `f` fused and unfused. Every test holds `metrics_lock`: one counts
/// process-wide compiles.
fn both(f: impl Fn()) {
    let _m = metrics_lock();
    for fuse in [true, false] {
        let _g = FusionGuard::new(fuse);
        f();
    }
}

fn floats(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.range(-1.0, 1.0) as f32).collect()
}

fn cumsum() {
    both(|| {
        let d = dev();
        let v: Vec<i64> = (0..23).map(|i| (i * 7 % 5) - 2).collect();
        let t = Tensor::from_slice(&v, &[23], &d).unwrap();
        let want: Vec<i64> = v
            .iter()
            .scan(0, |s, &x| {
                *s += x;
                Some(*s)
            })
            .collect();
        assert_eq!(t.cumsum(0).unwrap().to_vec::<i64>().unwrap(), want);
        // Along the last axis of a matrix, in f32.
        let m: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_slice(&m, &[3, 4], &d).unwrap();
        let got = t.cumsum(-1).unwrap().to_vec::<f32>().unwrap();
        let mut want = m.clone();
        for r in 0..3 {
            for c in 1..4 {
                want[r * 4 + c] += want[r * 4 + c - 1];
            }
        }
        assert_eq!(got, want);
        // One element, and an empty axis.
        let one = Tensor::from_slice(&[5i64], &[1], &d).unwrap();
        assert_eq!(one.cumsum(0).unwrap().to_vec::<i64>().unwrap(), vec![5]);
        let none = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
        assert_eq!(none.cumsum(0).unwrap().dims(), &[0, 3]);
    });
}

fn topk() {
    both(|| {
        let d = dev();
        let inf = f32::INFINITY;
        #[rustfmt::skip]
        let rows: Vec<f32> = vec![
            0.3, 0.9, -1.0, 0.9, 0.1,        // a tie: the lower index first
            f32::NAN, 1.0, 2.0, 0.0, -3.0,   // NaN is the largest
            -inf, -inf, 4.0, -inf, -inf,     // all but one -inf: no index twice
            1.0, 1.0, 1.0, 1.0, 1.0,
        ];
        let t = Tensor::from_slice(&rows, &[4, 5], &d).unwrap();
        let (v, i) = t.topk(3).unwrap();
        assert_eq!(i.dims(), &[4, 3]);
        assert_eq!(
            i.to_vec::<i64>().unwrap(),
            vec![1, 3, 0, 0, 2, 1, 2, 0, 1, 0, 1, 2]
        );
        let v = v.to_vec::<f32>().unwrap();
        assert!(v[3].is_nan());
        assert_eq!(&v[..3], &[0.9, 0.9, 0.3]);
        assert_eq!(&v[4..9], &[2.0, 1.0, 4.0, -inf, -inf]);
        // Against a host sort on random rows.
        let mut rng = Rng::new(7);
        let x = floats(&mut rng, 6 * 11);
        let t = Tensor::from_slice(&x, &[2, 3, 11], &d).unwrap();
        let (v, i) = t.topk(4).unwrap();
        let (v, i) = (v.to_vec::<f32>().unwrap(), i.to_vec::<i64>().unwrap());
        for r in 0..6 {
            let mut idx: Vec<usize> = (0..11).collect();
            idx.sort_by(|&a, &b| x[r * 11 + b].total_cmp(&x[r * 11 + a]));
            for j in 0..4 {
                assert_eq!(i[r * 4 + j], idx[j] as i64);
                assert_eq!(v[r * 4 + j], x[r * 11 + idx[j]]);
            }
        }
    });
}

/// A host stable sort by id: (order, positions, sizes).
fn group_ref(ids: &[i64], groups: usize) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| ids[i]);
    let mut positions = vec![0i64; ids.len()];
    for (p, &i) in order.iter().enumerate() {
        positions[i] = p as i64;
    }
    let mut sizes = vec![0i64; groups];
    for &g in ids {
        sizes[g as usize] += 1;
    }
    (order.iter().map(|&i| i as i64).collect(), positions, sizes)
}

fn group_by() {
    both(|| {
        let d = dev();
        let mut rng = Rng::new(3);
        for (m, groups) in [(1, 1), (5, 8), (37, 5), (130, 3)] {
            // Group 1 is always empty when there are more than two.
            let ids: Vec<i64> = (0..m)
                .map(|_| {
                    let g = (rng.next_u64() % groups as u64) as i64;
                    if g == 1 && groups > 2 {
                        0
                    } else {
                        g
                    }
                })
                .collect();
            let t = Tensor::from_slice(&ids, &[m], &d).unwrap();
            let (o, p, s) = t.group_by(groups).unwrap();
            let (wo, wp, ws) = group_ref(&ids, groups);
            assert_eq!(o.to_vec::<i64>().unwrap(), wo, "order m={m}");
            assert_eq!(p.to_vec::<i64>().unwrap(), wp, "positions m={m}");
            assert_eq!(s.to_vec::<i64>().unwrap(), ws, "sizes m={m}");
        }
    });
}

/// `[m, n]` rows of `lhs` times their group's matrix, in f64; rows past the
/// sizes' sum are zero.
fn ragged_ref(
    lhs: &[f32],
    rhs: &[f32],
    sizes: &[i64],
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    let mut row = 0;
    for (g, &s) in sizes.iter().enumerate() {
        for _ in 0..s {
            if row >= m {
                break;
            }
            for j in 0..n {
                let acc: f64 = (0..k)
                    .map(|i| lhs[row * k + i] as f64 * rhs[(g * k + i) * n + j] as f64)
                    .sum();
                out[row * n + j] = acc as f32;
            }
            row += 1;
        }
    }
    out
}

fn ragged_dot() {
    both(|| {
        let d = dev();
        let mut rng = Rng::new(11);
        // (rows, k, n, sizes): one row per group, tiles split by
        // boundaries, empty groups, rows past the sizes' sum, one group.
        let cases: &[(usize, usize, usize, &[i64])] = &[
            (1, 3, 2, &[0, 1, 0]),
            (2, 4, 3, &[1, 0, 1, 0]),
            (7, 5, 3, &[2, 0, 3, 1]),
            (37, 6, 4, &[5, 9, 0, 13, 10]),
            (300, 8, 5, &[41, 0, 97, 2, 150]),
            (9, 2, 2, &[4]),
        ];
        for &(m, k, n, sizes) in cases {
            let g = sizes.len();
            let lhs = floats(&mut rng, m * k);
            let rhs = floats(&mut rng, g * k * n);
            let lt = Tensor::from_slice(&lhs, &[m, k], &d).unwrap();
            let rt = Tensor::from_slice(&rhs, &[g, k, n], &d).unwrap();
            let st = Tensor::from_slice(sizes, &[g], &d).unwrap();
            let got = lt.ragged_dot(&rt, &st).unwrap().to_vec::<f32>().unwrap();
            let want = ragged_ref(&lhs, &rhs, sizes, (m, k, n));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "m={m} sizes={sizes:?} [{i}]: {a} vs {b}"
                );
            }
        }
    });
}

/// `ragged_dot` as every row times every group's matrix, masked to its
/// group: the obvious form, for the gradient check.
fn masked_dense(lhs: &Tensor, rhs: &Tensor, group_of_row: &[i64]) -> Tensor {
    let d = lhs.device().clone();
    let g = rhs.dims()[0];
    let m = lhs.dims()[0];
    let gid = Tensor::from_slice(group_of_row, &[1, m, 1], &d).unwrap();
    let classes = Tensor::arange(0.0, g as f64, DType::I64, &d)
        .unwrap()
        .reshape(&[g, 1, 1])
        .unwrap();
    let mask = gid.eq(&classes).unwrap().to_dtype(DType::F32).unwrap();
    lhs.matmul(rhs)
        .unwrap()
        .mul(&mask)
        .unwrap()
        .sum([0], false)
        .unwrap()
}

fn ragged_dot_gradients() {
    let _m = metrics_lock();
    let d = dev();
    let mut rng = Rng::new(5);
    let (m, k, n) = (19, 4, 3);
    let sizes = [6i64, 0, 8, 5];
    let gid: Vec<i64> = sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &s)| std::iter::repeat_n(g as i64, s as usize))
        .collect();
    let lhs = floats(&mut rng, m * k);
    let rhs = floats(&mut rng, 4 * k * n);
    let up = floats(&mut rng, m * n);
    let grads = |ragged: bool| {
        let l = Tensor::from_slice(&lhs, &[m, k], &d)
            .unwrap()
            .with_grad()
            .unwrap();
        let r = Tensor::from_slice(&rhs, &[4, k, n], &d)
            .unwrap()
            .with_grad()
            .unwrap();
        let u = Tensor::from_slice(&up, &[m, n], &d).unwrap();
        let y = if ragged {
            let s = Tensor::from_slice(&sizes, &[4], &d).unwrap();
            l.ragged_dot(&r, &s).unwrap()
        } else {
            masked_dense(&l, &r, &gid)
        };
        y.mul(&u)
            .unwrap()
            .sum([0, 1], false)
            .unwrap()
            .backward()
            .unwrap();
        (
            l.grad().unwrap().to_vec::<f32>().unwrap(),
            r.grad().unwrap().to_vec::<f32>().unwrap(),
        )
    };
    let (a, b) = (grads(true), grads(false));
    for (x, y) in a.0.iter().zip(&b.0).chain(a.1.iter().zip(&b.1)) {
        assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
    }
}

fn ragged_dot_compiles_once_for_any_sizes() {
    let _m = metrics_lock();
    let d = dev();
    let lhs = Tensor::from_slice(&[1f32; 40 * 3], &[40, 3], &d).unwrap();
    let rhs = Tensor::from_slice(&[0.5f32; 4 * 3 * 2], &[4, 3, 2], &d).unwrap();
    let run = |sizes: &[i64]| {
        let s = Tensor::from_slice(sizes, &[4], &d).unwrap();
        lhs.ragged_dot(&rhs, &s).unwrap().to_vec::<f32>().unwrap()
    };
    run(&[10, 10, 10, 10]);
    let before = metrics::snapshot().compiles;
    for sizes in [[40, 0, 0, 0], [0, 3, 30, 7], [1, 1, 1, 1]] {
        let got = run(&sizes);
        let total: i64 = sizes.iter().sum();
        assert!(got[..total as usize * 2].iter().all(|&v| v == 1.5));
        assert!(got[total as usize * 2..].iter().all(|&v| v == 0.0));
    }
    assert_eq!(
        metrics::snapshot().compiles,
        before,
        "new group sizes recompiled"
    );
}

fn errors() {
    let _m = metrics_lock();
    let d = dev();
    let l = Tensor::zeros(&[4, 3], DType::F32, &d).unwrap();
    let r = Tensor::zeros(&[2, 3, 5], DType::F32, &d).unwrap();
    let s = Tensor::from_slice(&[2i64, 2], &[2], &d).unwrap();
    let bad_k = Tensor::zeros(&[2, 4, 5], DType::F32, &d).unwrap();
    let e = l.ragged_dot(&bad_k, &s).unwrap_err().to_string();
    assert!(e.contains("ragged_dot") && e.contains("grouped.rs"), "{e}");
    let fsizes = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    assert!(l.ragged_dot(&r, &fsizes).is_err());
    let three = Tensor::from_slice(&[1i64, 1, 2], &[3], &d).unwrap();
    assert!(l.ragged_dot(&r, &three).is_err());
    assert!(l.topk(4).is_err() && l.topk(0).is_err());
    assert!(s.topk(1).is_err());
    assert!(l.group_by(2).is_err() && s.group_by(0).is_err());
    assert!(Tensor::from_slice(&[true], &[1], &d)
        .unwrap()
        .cumsum(0)
        .is_err());
}

test_device!(
    cumsum,
    topk,
    group_by,
    ragged_dot,
    ragged_dot_gradients,
    ragged_dot_compiles_once_for_any_sizes,
    errors
);
