//! Dynamic dimensions: padded values give exactly what exact shapes give,
//! on both backends, at every bucket edge, forward and backward, with zero
//! or poisoned padding; lengths beyond a declared maximum are `Err`s.
//! (Compile counts are in `tests/dynamic_compiles.rs`: metrics are
//! process-wide.)

mod common;
use common::dev;
use lazyfuse::{set_auto_dynamic, set_poison_padding, DType, Tensor};

/// Bucket edges of the default power-of-two capacities.
const EDGES: [usize; 7] = [1, 15, 16, 17, 31, 32, 33];

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = lazyfuse::ir::SplitMix64::new(seed);
    (0..n)
        .map(|_| (r.next_u64() % 2001) as f32 / 500.0 - 2.0)
        .collect()
}

/// Every op family that mixes elements along axis 1 of `x` ([3, L, 5]),
/// reduced to host vectors (logical elements only).
fn along_axis(x: &Tensor, w: &Tensor) -> Vec<(String, Vec<f32>)> {
    let d = x.device().clone();
    let l = x.dims()[1];
    let host = |name: &str, t: lazyfuse::Result<Tensor>| {
        let t = t.unwrap_or_else(|e| panic!("{name}: {e}"));
        (
            name.to_string(),
            t.to_vec::<f32>().unwrap_or_else(|e| panic!("{name}: {e}")),
        )
    };
    let xt = x.transpose(1, 2).unwrap(); // [3, 5, L]
    let targets: Vec<i64> = (0..15).map(|i| (i * 7 % l.max(1)) as i64).collect();
    let ids = Tensor::from_slice(&targets, &[3, 5], &d).unwrap();
    vec![
        host("sum", x.sum([1], false)),
        host("mean", x.mean([1], true)),
        host("max", x.max([1], false)),
        host("min", x.min([1], false)),
        host(
            "argmax",
            x.argmax(1, false).and_then(|a| a.to_dtype(DType::F32)),
        ),
        host("softmax", x.softmax(1)),
        host("logsumexp", x.logsumexp(1, false)),
        host("exp_elementwise", x.exp().and_then(|e| e.add(1.0))),
        // [3, 5, L] x [3, L, 5]: contracts over the dynamic axis.
        host("matmul_contract", xt.matmul(x)),
        // [3, L, 5] x [5, 4]: the dynamic axis is a free dim.
        host("matmul_free", x.matmul(w)),
        host("layer_norm", xt.layer_norm(None, None, 1e-5)),
        host("cross_entropy", xt.cross_entropy(&ids, None)),
        host(
            "cat",
            Tensor::cat(&[x, &x.mul(2.0).unwrap()], 1).and_then(|c| c.sum([1], false)),
        ),
        host(
            "cat_values",
            Tensor::cat(&[x, &x.narrow(1, 0, 1).unwrap()], 1),
        ),
        host("narrow_last", x.narrow(1, l - 1, 1)),
        host(
            "reshape_keep",
            x.reshape(&[3, l, 5, 1]).and_then(|r| r.sum([1], false)),
        ),
        host(
            "permute",
            x.permute(&[1, 0, 2]).and_then(|p| p.sum([0], false)),
        ),
    ]
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}[{i}]: {g} vs {w}");
    }
}

/// Padded results (a capacity of 64) against exact shapes at every edge.
fn masked_ops_match_exact_shapes() {
    let d = dev();
    let w = Tensor::from_slice(&values(20, 9), &[5, 4], &d).unwrap();
    for &l in &EDGES {
        let data = values(3 * l * 5, l as u64);
        let exact = Tensor::from_slice(&data, &[3, l, 5], &d).unwrap();
        let padded = exact.mark_dynamic(1, 64).unwrap();
        assert_eq!(padded.dims(), &[3, l, 5], "shape() is logical");
        assert_eq!(padded.dynamic_axes(), vec![(1, 64)]);
        let want = along_axis(&exact, &w);
        let got = along_axis(&padded, &w);
        for ((name, g), (_, e)) in got.iter().zip(&want) {
            assert_close(&format!("{name} at length {l}"), g, e, 2e-6);
        }
    }
}

/// Zero and poisoned padding give bit-identical results.
fn poisoned_padding_changes_nothing() {
    let d = dev();
    let w = Tensor::from_slice(&values(20, 9), &[5, 4], &d).unwrap();
    for &l in &EDGES {
        let data = values(3 * l * 5, 100 + l as u64);
        let run = |poison: bool| {
            set_poison_padding(poison);
            let x = Tensor::from_slice(&data, &[3, l, 5], &d)
                .unwrap()
                .mark_dynamic(1, 64)
                .unwrap();
            let r = along_axis(&x, &w);
            set_poison_padding(false);
            r
        };
        let (zero, poison) = (run(false), run(true));
        for ((name, a), (_, b)) in zero.iter().zip(&poison) {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{name} at length {l}: poisoned padding changed the result"
            );
        }
    }
}

/// Gradients through padded values equal the exact-shape gradients, and
/// the padding of a gradient is never visible.
fn gradients_match_exact_shapes() {
    let d = dev();
    let w = Tensor::from_slice(&values(20, 9), &[5, 4], &d).unwrap();
    for &l in &[1, 16, 17, 33] {
        let data = values(3 * l * 5, 7 + l as u64);
        let grads = |dynamic: bool| {
            let x = Tensor::from_slice(&data, &[3, l, 5], &d).unwrap();
            let x = if dynamic {
                x.mark_dynamic(1, 64).unwrap()
            } else {
                x
            };
            x.set_requires_grad(true).unwrap();
            let y = x.softmax(1).unwrap().matmul(&w).unwrap();
            let z = x.transpose(1, 2).unwrap().matmul(&x).unwrap();
            let loss = y
                .mul(&y)
                .unwrap()
                .mean(.., false)
                .unwrap()
                .add(z.sum(.., false).unwrap().mul(1e-3).unwrap())
                .unwrap()
                .add(x.max([1], false).unwrap().sum(.., false).unwrap())
                .unwrap();
            loss.backward().unwrap();
            let g = x.grad().expect("x has a gradient");
            assert_eq!(g.dims(), &[3, l, 5]);
            (loss.item::<f32>().unwrap(), g.to_vec::<f32>().unwrap())
        };
        let (le, ge) = grads(false);
        let (ld, gd) = grads(true);
        assert_close(&format!("loss at {l}"), &[ld], &[le], 2e-6);
        assert_close(&format!("grad at {l}"), &gd, &ge, 2e-6);
    }
}

/// A cache grown by `cat` one row at a time, read through every step, with
/// automatic dynamic axes equals the same loop on exact shapes.
fn cat_grown_cache_matches_exact_shapes() {
    let d = dev();
    let run = |auto: bool| {
        set_auto_dynamic(auto);
        let mut cache: Option<Tensor> = None;
        let mut out = Vec::new();
        for step in 0..40usize {
            let row = Tensor::from_slice(&values(8, step as u64), &[1, 8], &d).unwrap();
            let k = match &cache {
                Some(c) => Tensor::cat(&[c, &row], 0).unwrap(),
                None => row,
            };
            let q = Tensor::from_slice(&values(8, 1000 + step as u64), &[8, 1], &d).unwrap();
            let att = k.matmul(&q).unwrap().softmax(0).unwrap(); // [s, 1]
            let y = att.transpose(0, 1).unwrap().matmul(&k).unwrap(); // [1, 8]
            out.extend(y.to_vec::<f32>().unwrap());
            assert_eq!(k.dims(), &[step + 1, 8]);
            cache = Some(k);
        }
        set_auto_dynamic(true);
        (out, cache.unwrap())
    };
    let (exact, exact_cache) = run(false);
    let (dynamic, cache) = run(true);
    assert_eq!(cache.dims(), &[40, 8]);
    // A reshape that merges the axis that became dynamic by itself falls
    // back to exact shapes instead of failing.
    let flat = cache.reshape(&[320]).unwrap();
    assert!(flat.dynamic_axes().is_empty());
    assert_eq!(
        flat.to_vec::<f32>().unwrap(),
        exact_cache
            .reshape(&[320])
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    assert_eq!(
        cache.dynamic_axes(),
        vec![(0, 64)],
        "the cache axis became dynamic"
    );
    assert_close("attention over the grown cache", &dynamic, &exact, 2e-6);
}

/// Two caches grown by `cat`, cut back by `narrow` and grown again, so
/// that their padding holds the stale rows of the longer lengths: a product
/// contracting over them equals the exact-shape one at every step (their
/// padding must be masked; a grown cache's zero padding need not be).
fn contraction_over_stale_padding_matches_exact_shapes() {
    let d = dev();
    let run = |auto: bool| {
        set_auto_dynamic(auto);
        let (mut a, mut b): (Option<Tensor>, Option<Tensor>) = (None, None);
        let mut out = Vec::new();
        for step in 0..30usize {
            let ra = Tensor::from_slice(&values(4, step as u64), &[4, 1], &d).unwrap();
            let rb = Tensor::from_slice(&values(3, 500 + step as u64), &[1, 3], &d).unwrap();
            let (ga, gb) = match (&a, &b) {
                (Some(a), Some(b)) => (
                    Tensor::cat(&[a, &ra], 1).unwrap(),
                    Tensor::cat(&[b, &rb], 0).unwrap(),
                ),
                _ => (ra, rb),
            };
            // [4, s] x [s, 3]: the contraction runs over the grown axis.
            out.extend(ga.matmul(&gb).unwrap().to_vec::<f32>().unwrap());
            // Every tenth step the caches lose their newest half, and are
            // read at once, with the cut rows still in their buffers.
            let (ga, gb) = if step % 10 == 9 {
                let keep = ga.dims()[1] / 2;
                let (ga, gb) = (
                    ga.narrow(1, 0, keep).unwrap(),
                    gb.narrow(0, 0, keep).unwrap(),
                );
                out.extend(ga.matmul(&gb).unwrap().to_vec::<f32>().unwrap());
                (ga, gb)
            } else {
                (ga, gb)
            };
            a = Some(ga);
            b = Some(gb);
        }
        set_auto_dynamic(true);
        out
    };
    let exact = run(false);
    let dynamic = run(true);
    assert_close("products over stale padding", &dynamic, &exact, 2e-6);
}

/// `nn::Block::forward_cached`, fed one position at a time after a prefill,
/// gives what the full causal forward gives at every position.
fn cached_block_decoding_matches_the_full_forward() {
    use lazyfuse::nn::{Block, LayerCache, Module};
    let d = dev();
    let block = Block::new(16, 4, 0.0, 5, &d).unwrap();
    let (b, total, prefill) = (2, 21, 5);
    let data = values(b * total * 16, 3);
    let x = Tensor::from_slice(&data, &[b, total, 16], &d).unwrap();
    let full = block.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let mut cache = LayerCache::new();
    let mut at = 0;
    while at < total {
        let n = if at == 0 { prefill } else { 1 };
        let y = block
            .forward_cached(&x.narrow(1, at, n).unwrap(), &mut cache)
            .unwrap();
        let got = y.to_vec::<f32>().unwrap();
        for bi in 0..b {
            for t in 0..n {
                for c in 0..16 {
                    let want = full[(bi * total + at + t) * 16 + c];
                    let g = got[(bi * n + t) * 16 + c];
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "position {}: {g} vs {want}",
                        at + t
                    );
                }
            }
        }
        at += n;
        assert_eq!(cache.len(), at);
    }
}

/// The same program makes the same dynamic decisions on two threads (the
/// marks are per thread and depend only on its own calls).
fn two_threads_make_the_same_decisions() {
    let d = dev();
    let program = move |d: lazyfuse::Device| {
        let mut cache: Option<Tensor> = None;
        let mut axes = Vec::new();
        let mut out = Vec::new();
        for step in 0..24usize {
            let row = Tensor::from_slice(&values(6, step as u64), &[1, 6], &d).unwrap();
            let k = match &cache {
                Some(c) => Tensor::cat(&[c, &row], 0).unwrap(),
                None => row,
            };
            let ids: Vec<i64> = (0..(step % 5 + 1) as i64).collect();
            let picked = k
                .index_select(0, &Tensor::from_slice(&ids, &[ids.len()], &d).unwrap())
                .unwrap();
            out.extend(picked.sum([0], false).unwrap().to_vec::<f32>().unwrap());
            axes.push((k.dynamic_axes(), picked.dynamic_axes()));
            cache = Some(k);
        }
        (axes, out)
    };
    let (a, b) = (d.clone(), d.clone());
    let ta = std::thread::spawn(move || program(a));
    let tb = std::thread::spawn(move || program(b));
    let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
    assert_eq!(ra.0, rb.0, "dynamic axes differ between threads");
    assert_eq!(ra.1, rb.1);
    assert!(ra.0.last().unwrap().0 == vec![(0, 32)], "{:?}", ra.0.last());
}

/// A `cat` whose result length stays the same at its site (a fixed-size
/// cache written after prompts of changing lengths) is exact, although
/// its operands are dynamic, and holds what exact shapes give.
fn a_cat_of_steady_length_stays_exact() {
    let d = dev();
    let cap = 8;
    let cache = Tensor::from_slice(&values(cap * 3, 99), &[cap, 3], &d).unwrap();
    let old = cache.to_vec::<f32>().unwrap();
    for (step, len) in [3usize, 5, 6, 7, 2].into_iter().enumerate() {
        let data = values(len * 3, step as u64);
        let p = Tensor::from_slice(&data, &[len, 3], &d).unwrap();
        let rest = cache.narrow(0, len, cap - len).unwrap();
        let c = Tensor::cat(&[&p, &rest], 0).unwrap();
        assert_eq!(c.dims(), &[cap, 3]);
        assert!(
            c.dynamic_axes().is_empty(),
            "step {step}: {:?}",
            c.dynamic_axes()
        );
        let mut want = data.clone();
        want.extend_from_slice(&old[len * 3..]);
        assert_eq!(c.to_vec::<f32>().unwrap(), want, "prompt of {len}");
        if step > 1 && len > 2 {
            assert!(
                !p.dynamic_axes().is_empty(),
                "the prompt axis became dynamic"
            );
        }
    }
}

/// A length whose capacity holds no other (1, and 2 with power-of-two
/// buckets) stays static at a site whose axis is dynamic: no padding to
/// drop, no other length to share its executables. Lengths around it are
/// padded, and every length gives what exact shapes give.
fn a_sole_length_stays_static() {
    let d = dev();
    let w = Tensor::from_slice(&values(20, 9), &[5, 4], &d).unwrap();
    for (step, len) in [5usize, 3, 1, 2, 6, 1, 3].into_iter().enumerate() {
        let data = values(3 * len * 5, 40 + step as u64);
        // One upload site: its length changes from step to step.
        let x = Tensor::from_slice(&data, &[3, len, 5], &d).unwrap();
        let want_axes = match (step, len) {
            (0, _) | (_, 1) | (_, 2) => vec![],
            (_, l) => vec![(1, l.next_power_of_two())],
        };
        assert_eq!(x.dynamic_axes(), want_axes, "step {step}, length {len}");
        let exact = set_auto_dynamic_off(|| Tensor::from_slice(&data, &[3, len, 5], &d).unwrap());
        assert!(exact.dynamic_axes().is_empty());
        for ((name, g), (_, e)) in along_axis(&x, &w).iter().zip(&along_axis(&exact, &w)) {
            assert_close(&format!("{name} at length {len}"), g, e, 2e-6);
        }
        lazyfuse::sync();
    }
}

/// A length whose own bucket is cold at its site runs in the next bucket
/// up when that one is warm (8 after 9: capacity 16, no new executable),
/// and in its own bucket otherwise (3, with 4 and 8 cold). Every length
/// gives what exact shapes give.
fn a_shorter_length_shares_the_warm_bucket_above() {
    let d = dev();
    let w = Tensor::from_slice(&values(20, 9), &[5, 4], &d).unwrap();
    for (step, (len, cap)) in [(20, 0), (9, 16), (8, 16), (3, 4), (4, 4), (12, 16)]
        .into_iter()
        .enumerate()
    {
        let data = values(3 * len * 5, 60 + step as u64);
        let x = Tensor::from_slice(&data, &[3, len, 5], &d).unwrap();
        let want = if cap == 0 { vec![] } else { vec![(1, cap)] };
        assert_eq!(x.dynamic_axes(), want, "step {step}, length {len}");
        assert_eq!(x.dims(), vec![3, len, 5]);
        let exact = set_auto_dynamic_off(|| Tensor::from_slice(&data, &[3, len, 5], &d).unwrap());
        for ((name, g), (_, e)) in along_axis(&x, &w).iter().zip(&along_axis(&exact, &w)) {
            assert_close(&format!("{name} at length {len}"), g, e, 2e-6);
        }
        lazyfuse::sync();
    }
}

/// Device random draws whose size changes at their line (a dropout mask
/// per prompt, noise per batch) are drawn padded, and every logical
/// element is the one an exact draw gives, bit for bit, with zero or
/// poisoned padding: with the varying axis first, after a batch axis, and
/// in the middle.
fn random_draws_match_exact_shapes() {
    let d = dev();
    for poison in [false, true] {
        set_poison_padding(poison);
        for (step, &len) in EDGES.iter().chain(&[9, 40]).enumerate() {
            let key = 500 + step as u64;
            let draws = || {
                [&[len, 3][..], &[2, len], &[2, len, 3]]
                    .map(|dims| Tensor::rand_uniform(dims, DType::F32, key, &d).unwrap())
            };
            let got = draws();
            let want = set_auto_dynamic_off(draws);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.dims(), w.dims());
                let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
                assert_eq!(g, w, "length {len}, poison {poison}");
            }
            if step >= 2 && len > 2 {
                assert!(!got[1].dynamic_axes().is_empty(), "length {len}");
            }
        }
    }
    set_poison_padding(false);
}

/// Every op that takes a shape, called at one line with a length that
/// changes (`zeros`, `ones`, `full`, `arange`, `eye`, `randn`, `rand`,
/// `rand_uniform`, `*_like`), gives what exact shapes give at every bucket
/// edge, combined with a value that has the length too; after the first
/// lengths they run padded.
fn creation_ops_match_exact_shapes() {
    let d = dev();
    let f32 = DType::F32;
    for (step, &len) in [3usize, 5].iter().chain(&EDGES).enumerate() {
        let key = 900 + step as u64;
        let ops = || -> Vec<Tensor> {
            let x = Tensor::from_slice(&values(len * 4, key), &[len, 4], &d).unwrap();
            let mut made = vec![
                Tensor::zeros(&[len, 4], f32, &d).unwrap(),
                Tensor::ones(&[2, len], f32, &d).unwrap(),
                Tensor::full(1.5, &[len, 4], f32, &d).unwrap(),
                Tensor::arange(0.0, len as f64, f32, &d).unwrap(),
                Tensor::eye(len, f32, &d).unwrap(),
                Tensor::randn(&[len, 4], key, &d).unwrap(),
                Tensor::rand(&[2, len], key, &d).unwrap(),
                Tensor::rand_uniform(&[2, len, 3], f32, key, &d).unwrap(),
                x.zeros_like().unwrap(),
                x.full_like(-2.0).unwrap(),
            ];
            // Mixed with the operand, so padding meets padding.
            let mixed = made[0].add(&x).unwrap().mul(&made[2]).unwrap();
            let summed = made[4].matmul(&x).unwrap().sum(0, false).unwrap();
            made.extend([mixed, summed]);
            made
        };
        let got = ops();
        let want = set_auto_dynamic_off(ops);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.dims(), w.dims(), "op {i} at length {len}");
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            assert_close(&format!("op {i} at length {len}"), &g, &w, 1e-6);
        }
        if step >= 3 && len > 2 {
            let dynamic = got.iter().filter(|t| !t.dynamic_axes().is_empty()).count();
            assert!(
                dynamic >= 10,
                "{dynamic} of {} padded at length {len}",
                got.len()
            );
        }
        lazyfuse::sync();
    }
}

/// `f` with automatic dynamic axes off on this thread.
fn set_auto_dynamic_off<R>(f: impl FnOnce() -> R) -> R {
    set_auto_dynamic(false);
    let r = f();
    set_auto_dynamic(true);
    r
}

test_device!(
    creation_ops_match_exact_shapes,
    random_draws_match_exact_shapes,
    a_sole_length_stays_static,
    a_shorter_length_shares_the_warm_bucket_above,
    a_cat_of_steady_length_stays_exact,
    two_threads_make_the_same_decisions,
    cached_block_decoding_matches_the_full_forward,
    masked_ops_match_exact_shapes,
    poisoned_padding_changes_nothing,
    gradients_match_exact_shapes,
    cat_grown_cache_matches_exact_shapes,
    contraction_over_stale_padding_matches_exact_shapes,
);

#[test]
fn beyond_the_declared_maximum_is_an_err() {
    let d = dev();
    let x = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let e = x.mark_dynamic(1, 2).unwrap_err().to_string();
    assert!(e.contains("more than the maximum 2"), "{e}");
    let c = x.mark_dynamic(1, 4).unwrap();
    let row = Tensor::zeros(&[2, 1], DType::F32, &d).unwrap();
    let c = Tensor::cat(&[&c, &row], 1).unwrap();
    assert_eq!(c.dims(), &[2, 4]);
    let e = Tensor::cat(&[&c, &row], 1).unwrap_err().to_string();
    assert!(e.contains("beyond its declared maximum 4"), "{e}");
    assert!(
        e.contains("tests/dynamic.rs"),
        "the error names the caller: {e}"
    );
}

#[test]
fn merging_a_dynamic_axis_in_a_reshape_is_an_err() {
    let d = dev();
    let x = Tensor::zeros(&[3, 5, 4], DType::F32, &d)
        .unwrap()
        .mark_dynamic(1, 8)
        .unwrap();
    let e = x.reshape(&[15, 4]).unwrap_err().to_string();
    assert!(e.contains("merging dynamic axis 1"), "{e}");
    // Splitting or merging the static axes around it is exact.
    let ok = x.reshape(&[3, 5, 2, 2]).unwrap();
    assert_eq!(ok.dims(), &[3, 5, 2, 2]);
    assert_eq!(ok.dynamic_axes(), vec![(1, 8)]);
}

#[test]
fn host_reads_return_logical_elements() {
    let d = dev();
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let x = Tensor::from_slice(&data, &[2, 3], &d)
        .unwrap()
        .mark_dynamic(1, 16)
        .unwrap();
    assert_eq!(x.shape().dims(), &[2, 3]);
    assert_eq!(x.numel(), 6);
    assert_eq!(x.to_vec::<f32>().unwrap(), data);
    let y = x.add(1.0).unwrap();
    assert_eq!(y.to_host().unwrap().shape.dims(), &[2, 3]);
    assert_eq!(x.sum(.., false).unwrap().item::<f32>().unwrap(), 15.0);
}
