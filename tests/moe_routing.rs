//! `nn::moe`: top-k routing with capacity and the load-balancing loss,
//! against host references on both backends (values, dropped choices, the
//! loss and its gradient), and one compile for any routing.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::nn::moe::{capacity_mask, load_balancing_loss, route, RouteOptions};
use lazyfuse::{metrics, Tensor};

/// Deterministic pseudo-random logits in [-2, 2).
fn logits(t: usize, e: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..t * e)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn softmax_rows(x: &[f32], e: usize) -> Vec<f64> {
    x.chunks(e)
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let ex: Vec<f64> = r.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = ex.iter().sum();
            ex.into_iter().map(move |v| v / s)
        })
        .collect()
}

/// Top-k of each row (ties to the lower index).
fn topk_rows(p: &[f64], e: usize, k: usize) -> Vec<usize> {
    p.chunks(e)
        .flat_map(|r| {
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| r[b].partial_cmp(&r[a]).unwrap().then(a.cmp(&b)));
            idx.truncate(k);
            idx
        })
        .collect()
}

/// Kept choices: first choices in token order, then second, ...
fn capacity_ref(chosen: &[usize], t: usize, k: usize, e: usize, cap: usize) -> Vec<bool> {
    let mut load = vec![0usize; e];
    let mut kept = vec![false; t * k];
    for j in 0..k {
        for i in 0..t {
            let x = chosen[i * k + j];
            kept[i * k + j] = load[x] < cap;
            load[x] += 1;
        }
    }
    kept
}

/// The loss and its gradient with respect to the logits.
fn balance_ref(p: &[f64], chosen: &[usize], t: usize, k: usize, e: usize) -> (f64, Vec<f64>) {
    let mut f = vec![0f64; e]; // Σ_k fraction of tokens choosing e at rank k
    for &x in chosen {
        f[x] += 1.0 / t as f64;
    }
    let mean_p: Vec<f64> = (0..e)
        .map(|j| (0..t).map(|i| p[i * e + j]).sum::<f64>() / t as f64)
        .collect();
    let loss = e as f64 * (0..e).map(|j| f[j] * mean_p[j]).sum::<f64>();
    let _ = k;
    // dL/dp[t, j] = e * f[j] / t; through the softmax.
    let g: Vec<f64> = f.iter().map(|fj| e as f64 * fj / t as f64).collect();
    let mut grad = vec![0f64; t * e];
    for i in 0..t {
        let row = &p[i * e..(i + 1) * e];
        let dot: f64 = (0..e).map(|j| g[j] * row[j]).sum();
        for j in 0..e {
            grad[i * e + j] = row[j] * (g[j] - dot);
        }
    }
    (loss, grad)
}

fn routing_capacity_and_loss_match_the_reference() {
    {
        let _m = metrics_lock();
        let d = dev();
        for &(t, e, k, cap) in &[
            (16usize, 4usize, 2usize, 5usize),
            (33, 8, 2, 6),
            (7, 3, 1, 1),
        ] {
            let x = logits(t, e, t as u64);
            let p = softmax_rows(&x, e);
            let chosen = topk_rows(&p, e, k);
            let lt = Tensor::from_slice(&x, &[t, e], &d).unwrap();
            let r = route(
                &lt,
                RouteOptions {
                    top_k: k,
                    normalize: true,
                    capacity: Some(cap),
                },
            )
            .unwrap();
            let got: Vec<usize> = r
                .experts
                .to_vec::<i64>()
                .unwrap()
                .iter()
                .map(|&v| v as usize)
                .collect();
            assert_eq!(got, chosen, "t={t}");
            let kept = capacity_ref(&chosen, t, k, e, cap);
            let got_kept = r.kept.to_vec::<f32>().unwrap();
            assert_eq!(
                got_kept,
                kept.iter().map(|&b| b as u8 as f32).collect::<Vec<_>>(),
                "t={t}"
            );
            let w = r.weights.to_vec::<f32>().unwrap();
            for i in 0..t {
                let s: f64 = (0..k).map(|j| p[i * e + chosen[i * k + j]]).sum();
                for j in 0..k {
                    let want = if kept[i * k + j] {
                        p[i * e + chosen[i * k + j]] / s
                    } else {
                        0.0
                    };
                    assert!(
                        (w[i * k + j] as f64 - want).abs() < 1e-6,
                        "t={t} w {} vs {want}",
                        w[i * k + j]
                    );
                }
            }
            let (loss, _) = balance_ref(&p, &chosen, t, k, e);
            let got = r.aux_loss.to_vec::<f32>().unwrap()[0] as f64;
            assert!((got - loss).abs() < 1e-5, "loss {got} vs {loss}");
            // capacity_mask alone, on ids as i32.
            let ids: Vec<i32> = chosen.iter().map(|&v| v as i32).collect();
            let m = capacity_mask(&Tensor::from_slice(&ids, &[t, k], &d).unwrap(), e, cap)
                .unwrap()
                .to_vec::<bool>()
                .unwrap();
            assert_eq!(m, kept);
        }
    }
}

fn the_loss_gradient_reaches_the_logits() {
    {
        let _m = metrics_lock();
        let d = dev();
        let (t, e, k) = (12, 5, 2);
        let x = logits(t, e, 3);
        let p = softmax_rows(&x, e);
        let chosen = topk_rows(&p, e, k);
        let lt = Tensor::from_slice(&x, &[t, e], &d)
            .unwrap()
            .with_grad()
            .unwrap();
        load_balancing_loss(&lt, k).unwrap().backward().unwrap();
        let got = lt.grad().unwrap().to_vec::<f32>().unwrap();
        let (_, want) = balance_ref(&p, &chosen, t, k, e);
        for (g, w) in got.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}

fn new_routings_never_recompile_and_bad_input_is_an_err() {
    let _m = metrics_lock();
    let d = dev();
    let step = |seed: u64| {
        let lt = Tensor::from_slice(&logits(20, 4, seed), &[20, 4], &d).unwrap();
        let opts = RouteOptions {
            top_k: 2,
            normalize: false,
            capacity: Some(7),
        };
        route(&lt, opts).unwrap().weights.to_vec::<f32>().unwrap()
    };
    // Three steps to warm up (output selection learns which values the
    // step reads by the third).
    for s in 1..4 {
        step(s);
    }
    let before = metrics::snapshot().compiles;
    for s in 4..8 {
        step(s);
    }
    assert_eq!(metrics::snapshot().compiles, before);
    let lt = Tensor::from_slice(&logits(4, 3, 1), &[4, 3], &d).unwrap();
    let e = load_balancing_loss(&lt, 4).unwrap_err().to_string();
    assert!(
        e.contains("top_k") && e.contains("tests/moe_routing.rs"),
        "{e}"
    );
}

test_device!(
    routing_capacity_and_loss_match_the_reference,
    the_loss_gradient_reaches_the_logits,
    new_routings_never_recompile_and_bad_input_is_an_err
);
