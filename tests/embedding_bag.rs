//! Embedding bags: `Tensor::embedding_bag` against a host reference (sum,
//! mean, per-sample weights, empty bags), gradients against finite
//! differences, `nn::EmbeddingBag` in sparse mode trained by `SparseSgd`
//! exactly as the dense table trained by `Sgd`, and a sparse update of a
//! large table that never holds a table-sized gradient (peak memory).
//!
//! Every test takes `metrics_lock` (tests elsewhere assert compile counts).

mod common;
use common::{dev, metrics_lock, random_host, Rng};
use lazyfuse::ir::{DType, HostTensor};
use lazyfuse::nn::EmbeddingBag;
use lazyfuse::optim::{Optimizer, Sgd, SparseSgd};
use lazyfuse::{no_grad, FusionGuard, Tensor};

/// `[bags, dim]` by the definition: bag `b` holds ids `offsets[b]..offsets[b+1]`.
fn reference(
    table: &[f64],
    dim: usize,
    ids: &[i64],
    offsets: &[i64],
    w: Option<&[f64]>,
    mean: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; offsets.len() * dim];
    for (b, &start) in offsets.iter().enumerate() {
        let end = offsets.get(b + 1).copied().unwrap_or(ids.len() as i64);
        let count = (end - start) as f64;
        for j in start..end {
            let row = ids[j as usize] as usize;
            let scale = w.map_or(1.0, |w| w[j as usize]);
            for c in 0..dim {
                out[b * dim + c] += scale * table[row * dim + c] / if mean { count } else { 1.0 };
            }
        }
    }
    out
}

#[test]
fn bags_match_the_definition() {
    let _l = metrics_lock();
    let mut r = Rng(21);
    let (rows, dim) = (10, 3);
    let t = random_host(&mut r, &[rows, dim], DType::F64, -1.0, 1.0);
    let ids = [3i64, 3, 9, 0, 1, 7, 7, 7, 2];
    // An empty bag in the middle (4, 4) and at the end (9).
    let offsets = [0i64, 2, 4, 4, 7, 9];
    let w: Vec<f64> = (0..ids.len()).map(|i| 0.5 + i as f64 * 0.25).collect();
    for (weights, mean) in [(false, false), (false, true), (true, false)] {
        let want = reference(
            &t.to_f64_vec(),
            dim,
            &ids,
            &offsets,
            weights.then_some(&w[..]),
            mean,
        );
        for fuse in [true, false] {
            let _g = FusionGuard::new(fuse);
            let d = dev();
            let table = Tensor::from_host(&t, &d).unwrap();
            let it = Tensor::from_slice(&ids, &[ids.len()], &d).unwrap();
            let ot = Tensor::from_slice(&offsets, &[offsets.len()], &d).unwrap();
            let wt = Tensor::from_slice(&w, &[w.len()], &d).unwrap();
            let y = table
                .embedding_bag(&it, &ot, weights.then_some(&wt), mean)
                .unwrap();
            assert_eq!(y.dims(), &[offsets.len(), dim]);
            let got = y.to_vec::<f64>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() < 1e-12,
                    "weights {weights} mean {mean} fuse {fuse}: {i}: {g} vs {e}"
                );
            }
        }
    }
}

#[test]
fn gradients_reach_the_table_and_the_weights() {
    let _l = metrics_lock();
    let mut r = Rng(22);
    let t = random_host(&mut r, &[6, 2], DType::F64, -1.0, 1.0);
    let (ids, offsets) = ([5i64, 0, 5, 2, 2], [0i64, 1, 3]);
    let w = random_host(&mut r, &[5], DType::F64, 0.5, 1.5);
    let d = dev();
    let f = |table: &Tensor, w: &Tensor| {
        let it = Tensor::from_slice(&ids, &[5], &d)?;
        let ot = Tensor::from_slice(&offsets, &[3], &d)?;
        table
            .embedding_bag(&it, &ot, Some(w), false)?
            .tanh()?
            .sum(.., false)
    };
    let (tt, wt) = (
        Tensor::from_host(&t, &d).unwrap(),
        Tensor::from_host(&w, &d).unwrap(),
    );
    tt.set_requires_grad(true).unwrap();
    wt.set_requires_grad(true).unwrap();
    f(&tt, &wt).unwrap().backward().unwrap();
    for (which, h, grad) in [(0, &t, tt.grad().unwrap()), (1, &w, wt.grad().unwrap())] {
        let analytic = grad.to_vec::<f64>().unwrap();
        for j in 0..h.numel() {
            let eval = |e: f64| {
                let mut v = h.to_f64_vec();
                v[j] += e;
                let p =
                    Tensor::from_host(&HostTensor::from_f64(&v, h.shape.clone(), DType::F64), &d)
                        .unwrap();
                let (a, b) = if which == 0 {
                    (p, Tensor::from_host(&w, &d).unwrap())
                } else {
                    (Tensor::from_host(&t, &d).unwrap(), p)
                };
                no_grad(|| f(&a, &b)).unwrap().item::<f64>().unwrap()
            };
            let numeric = (eval(1e-6) - eval(-1e-6)) / 2e-6;
            assert!(
                (analytic[j] - numeric).abs() < 1e-6,
                "input {which} [{j}]: {} vs {numeric}",
                analytic[j]
            );
        }
    }
}

#[test]
fn sparse_sgd_trains_like_dense_sgd() {
    let _l = metrics_lock();
    let d = dev();
    let sparse = EmbeddingBag::new(50, 4, false, true, 7, &d).unwrap();
    let copy = sparse.weight.tensor().mul(1.0).unwrap();
    let dense = EmbeddingBag::from_tensor(copy, false, false).unwrap();
    let mut dense_opt = Sgd::new(vec![dense.weight.clone()], 0.1, 0.0, 0.0).unwrap();
    let sparse_opt = SparseSgd::new(0.1);
    let target = Tensor::randn(&[3, 4], 8, &d).unwrap();
    for step in 0..4i64 {
        let ids: Vec<i64> = (0..7).map(|i| (i * 13 + step * 5) % 50).collect();
        let it = Tensor::from_slice(&ids, &[7], &d).unwrap();
        let ot = Tensor::from_slice(&[0i64, 2, 5], &[3], &d).unwrap();
        for (m, sparse_mode) in [(&sparse, true), (&dense, false)] {
            let y = m.forward_bags(&it, &ot, None).unwrap();
            let e = y.sub(&target).unwrap();
            let loss = e.mul(&e).unwrap().sum(.., false).unwrap();
            loss.backward().unwrap();
            if sparse_mode {
                sparse_opt.step(&[m]).unwrap();
            } else {
                dense_opt.step().unwrap();
                dense_opt.zero_grad();
            }
        }
        assert!(
            sparse.weight.grad().is_none(),
            "sparse mode makes no table gradient"
        );
    }
    let (a, b) = (
        sparse.weight.tensor().to_vec::<f32>().unwrap(),
        dense.weight.tensor().to_vec::<f32>().unwrap(),
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6,
            "row element {i}: sparse {x}, dense {y}"
        );
    }
}

/// Resident set size and its peak (kB), from /proc.
fn rss_kb() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn a_sparse_update_of_a_large_table_makes_no_table_sized_buffer() {
    let _l = metrics_lock();
    let d = dev();
    // 2M rows x 16 f32: 128 MB. A dense gradient or an out-of-place update
    // would add another 128 MB at the peak.
    let table = EmbeddingBag::new(2_000_000, 16, false, true, 9, &d).unwrap();
    let opt = SparseSgd::new(0.05);
    let ot = Tensor::from_slice(&[0i64, 100, 300], &[3], &d).unwrap();
    let mut peaks = Vec::new();
    for step in 0..4i64 {
        let ids: Vec<i64> = (0..512)
            .map(|i| (i * 7919 + step * 104_729) % 2_000_000)
            .collect();
        let it = Tensor::from_slice(&ids, &[512], &d).unwrap();
        let y = table.forward_bags(&it, &ot, None).unwrap();
        let loss = y.mul(&y).unwrap().sum(.., false).unwrap();
        loss.backward().unwrap();
        opt.step(&[&table]).unwrap();
        table.weight.tensor().realize().unwrap();
        if step == 1 {
            // Reset the peak once the step's executables exist.
            std::fs::write("/proc/self/clear_refs", "5").unwrap();
        }
        peaks.push(rss_kb());
    }
    let (before, _) = peaks[1];
    let (_, peak) = peaks[3];
    assert!(
        peak < before + 64 * 1024,
        "steps 2-3 peaked at {peak} kB from {before} kB resident: a table-sized buffer was made ({peaks:?})"
    );
}
