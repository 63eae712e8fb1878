//! `index_add` (IR op `ScatterAdd`): values against a host reference with
//! repeated and out-of-range indices on several axes and dtypes, fused,
//! unfused and on the interpreter device; gradients of `index_add` and of
//! `index_select` (now one scatter) against finite differences; an
//! embedding-table gradient that touches only its rows; and argument errors.
//!
//! Every test takes `metrics_lock` (tests elsewhere assert compile counts).

mod common;
use common::gradcheck::gradcheck;
use common::{check, metrics_lock, random_host, Rng};
use lazyfuse::ir::{DType, HostTensor, Op, Shape};
use lazyfuse::{pending_ops, Error, Tensor};

fn ids(v: &[i64], dt: DType) -> HostTensor {
    HostTensor::from_i64(v, Shape::new(&[v.len()]), dt)
}

#[test]
fn index_add_matches_the_interpreter_and_a_host_reference() {
    let _l = metrics_lock();
    let mut r = Rng(11);
    for (dims, axis, idx) in [
        (vec![5, 3], 0usize, vec![0i64, 4, 4, 2, 4, -3, 9]),
        (vec![2, 6, 3], 1, vec![5, 5, 0, 1]),
        (vec![4], 0, vec![]),
        (vec![3, 4], 1, vec![3, 3, 3, 3, 3, 3, 3, 3]),
    ] {
        for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64] {
            let x = random_host(&mut r, &dims, dt, -4.0, 4.0);
            let mut sd = dims.clone();
            sd[axis] = idx.len();
            let s = random_host(&mut r, &sd, dt, -4.0, 4.0);
            let i = ids(&idx, DType::I64);
            let what = format!("index_add {dims:?} axis {axis} {idx:?} {dt}");
            check(
                &what,
                &Op::ScatterAdd { axis },
                &[x.clone(), i, s.clone()],
                2.0,
                &|t| t[0].index_add(axis as isize, &t[1], &t[2]),
            );
            // The definition, spelled out: row `clamp(i)` gets each source row.
            if dt == DType::F64 {
                let (xv, sv) = (x.to_f64_vec(), s.to_f64_vec());
                let (n, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
                let outer: usize = dims[..axis].iter().product();
                let mut want = xv.clone();
                for o in 0..outer {
                    for (j, &id) in idx.iter().enumerate() {
                        let p = id.clamp(0, n as i64 - 1) as usize;
                        for e in 0..inner {
                            want[(o * n + p) * inner + e] += sv[(o * idx.len() + j) * inner + e];
                        }
                    }
                }
                let up = common::upload(&[x, ids(&idx, DType::I32), s]);
                let got = up[0].index_add(axis as isize, &up[1], &up[2]).unwrap();
                let got = got.to_vec::<f64>().unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                        "{what}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let _l = metrics_lock();
    let mut r = Rng(12);
    let mut h = |d: &[usize]| random_host(&mut r, d, DType::F64, -1.0, 1.0);
    let (x, s) = (h(&[4, 3]), h(&[5, 3]));
    let i = ids(&[3, 0, 3, 7, -1], DType::I64);
    gradcheck("index_add axis 0", &[x, s, i], &|t| {
        t[0].index_add(0, &t[2], &t[1])?.tanh()
    });
    let (x, s) = (h(&[2, 4, 2]), h(&[2, 3, 2]));
    let i = ids(&[1, 1, 2], DType::I32);
    gradcheck("index_add axis 1", &[x, s, i], &|t| {
        t[0].index_add(1, &t[2], &t[1])
    });
    // index_select's gradient is an index_add of the output gradient.
    let x = h(&[5, 2, 3]);
    let i = ids(&[4, 0, 4, 9, 2, 2], DType::I64);
    gradcheck("index_select axis 0", &[x.clone(), i.clone()], &|t| {
        t[0].index_select(0, &t[1])
    });
    gradcheck(
        "index_select axis 2",
        &[x, ids(&[2, 2, 0], DType::I64)],
        &|t| t[0].index_select(2, &t[1])?.exp(),
    );
}

#[test]
fn an_embedding_gradient_has_rows_only_where_ids_were_read() {
    let _l = metrics_lock();
    let d = common::dev();
    let table = Tensor::randn(&[1000, 8], 3, &d).unwrap();
    table.set_requires_grad(true).unwrap();
    let idv = [7i64, 999, 7, 0, 512];
    let idt = Tensor::from_slice(&idv, &[5], &d).unwrap();
    let rows = table.index_select(0, &idt).unwrap();
    rows.mul(&rows)
        .unwrap()
        .sum(.., false)
        .unwrap()
        .backward()
        .unwrap();
    let g = table.grad().unwrap().to_vec::<f32>().unwrap();
    let t = table.to_vec::<f32>().unwrap();
    for row in 0..1000 {
        let reads = idv.iter().filter(|&&i| i == row as i64).count() as f32;
        for c in 0..8 {
            let want = 2.0 * reads * t[row * 8 + c];
            assert!(
                (g[row * 8 + c] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "row {row}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_errors_at_the_call_site() {
    let _l = metrics_lock();
    let d = common::dev();
    let x = Tensor::zeros(&[4, 3], DType::F32, &d).unwrap();
    let (i2, i_f) = (
        Tensor::from_slice(&[0i64, 1], &[2], &d).unwrap(),
        Tensor::zeros(&[2], DType::F32, &d).unwrap(),
    );
    let (s_ok, s_bad, s_f64) = (
        Tensor::zeros(&[2, 3], DType::F32, &d).unwrap(),
        Tensor::zeros(&[3, 3], DType::F32, &d).unwrap(),
        Tensor::zeros(&[2, 3], DType::F64, &d).unwrap(),
    );
    let b = Tensor::zeros(&[4, 3], DType::Bool, &d).unwrap();
    let sb = Tensor::zeros(&[2, 3], DType::Bool, &d).unwrap();
    let p = pending_ops(&d);
    for (r, line) in [
        (x.index_add(0, &i2, &s_bad), line!()),
        (x.index_add(0, &i_f, &s_ok), line!()),
        (x.index_add(0, &i2, &s_f64), line!()),
        (x.index_add(2, &i2, &s_ok), line!()),
        (b.index_add(0, &i2, &sb), line!()),
    ] {
        match r {
            Err(Error::Op { op, location, .. }) => {
                assert_eq!(op, "index_add");
                assert_eq!(location.line(), line);
            }
            other => panic!("expected an index_add error, got {other:?}"),
        }
    }
    assert_eq!(pending_ops(&d), p, "nothing recorded");
}
