//! Dynamic dimensions stop recompiles: a decode loop with a `cat`-grown
//! cache, prompts of new lengths and batches of new sizes compile nothing
//! once their buckets are warm, and `mark_dynamic` compiles each executable
//! once. Greedy tokens equal exact shapes and a full recompute at every
//! step. Alone in its binary: compile counts are process-wide metrics.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::{metrics, set_auto_dynamic, with_origin, Device, Origin, Result, Tensor};

const VOCAB: usize = 32;
const C: usize = 16;
/// Positions the decoder can embed.
const MAX_POS: usize = 256;

fn weights(dims: &[usize], seed: u64, d: &Device) -> Tensor {
    let n: usize = dims.iter().product();
    let mut r = lazyfuse::ir::SplitMix64::new(seed);
    let v: Vec<f32> = (0..n)
        .map(|_| ((r.next_u64() % 2001) as f32 / 1000.0 - 1.0) * 0.5)
        .collect();
    Tensor::from_slice(&v, dims, d).unwrap()
}

/// One attention layer over a cache grown with `cat`, written as users
/// write it: no padding, lengths read from shapes.
struct Decoder {
    wte: Tensor,
    wpe: Tensor,
    wqkv: Tensor,
    head: Tensor,
}

impl Decoder {
    fn new(d: &Device) -> Decoder {
        Decoder {
            wte: weights(&[VOCAB, C], 1, d),
            wpe: weights(&[MAX_POS, C], 2, d),
            wqkv: weights(&[C, 3 * C], 3, d),
            head: weights(&[C, VOCAB], 4, d),
        }
    }

    /// Logits of the last of `ids` (at positions `pos0..`), growing `cache`.
    fn forward(
        &self,
        ids: &[i64],
        pos0: usize,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let d = self.wte.device().clone();
        let t = ids.len();
        let idx = Tensor::from_slice(ids, &[t], &d)?;
        let x = self
            .wte
            .index_select(0, &idx)?
            .add(&self.wpe.narrow(0, pos0, t)?)?;
        let qkv = x.layer_norm(None, None, 1e-5)?.matmul(&self.wqkv)?;
        let q = qkv.narrow(1, 0, C)?;
        let (mut k, mut v) = (qkv.narrow(1, C, C)?, qkv.narrow(1, 2 * C, C)?);
        if let Some((pk, pv)) = cache.as_ref() {
            k = Tensor::cat(&[pk, &k], 0)?;
            v = Tensor::cat(&[pv, &v], 0)?;
        }
        *cache = Some((k.clone(), v.clone()));
        let s = k.dims()[0];
        let mut att = q.matmul(&k.transpose(0, 1)?)?.mul(0.25)?;
        if t > 1 {
            let rows =
                Tensor::arange(0.0, t as f64, lazyfuse::DType::I32, &d)?.add((s - t) as f64)?;
            let cols = Tensor::arange(0.0, s as f64, lazyfuse::DType::I32, &d)?;
            att = att.masked_fill(
                &rows.unsqueeze(1)?.lt(&cols.unsqueeze(0)?)?,
                f64::NEG_INFINITY,
            )?;
        }
        let y = x.add(&att.softmax(-1)?.matmul(&v)?)?;
        y.narrow(0, t - 1, 1)?.matmul(&self.head)
    }

    /// Greedy tokens after `prompt`, and the logits of every step.
    fn generate(&self, prompt: &[i64], steps: usize) -> (Vec<i64>, Vec<Vec<f32>>) {
        let mut cache = None;
        let mut logits = self.forward(prompt, 0, &mut cache).unwrap();
        let (mut toks, mut all) = (Vec::new(), Vec::new());
        for i in 0..steps {
            all.push(logits.to_vec::<f32>().unwrap());
            let tok = logits.argmax(-1, false).unwrap().to_vec::<i64>().unwrap()[0];
            toks.push(tok);
            logits = self.forward(&[tok], prompt.len() + i, &mut cache).unwrap();
        }
        (toks, all)
    }
}

fn prompt(len: usize) -> Vec<i64> {
    (0..len).map(|j| ((3 * j + len) % VOCAB) as i64).collect()
}

fn compiles() -> u64 {
    metrics::snapshot().compiles
}

#[test]
fn a_decode_loop_compiles_nothing_once_its_buckets_are_warm() {
    let _l = metrics_lock();
    let d = dev();
    let m = Decoder::new(&d);
    // Warm-up: two prompts, the second of a new length (it marks the
    // prompt and cache axes dynamic), 40 steps each.
    m.generate(&prompt(5), 40);
    m.generate(&prompt(7), 40);
    let before = compiles();
    let (toks, logits) = m.generate(&prompt(6), 40);
    let warm = compiles() - before;
    assert_eq!(
        warm, 0,
        "a third prompt and 40 decode steps compiled {warm} executables"
    );

    // The same tokens and logits on exact shapes (one compile per length).
    set_auto_dynamic(false);
    let (exact_toks, exact_logits) = m.generate(&prompt(6), 40);
    // And a full recompute of the whole sequence at every step.
    let mut seq = prompt(6);
    for (i, &tok) in toks.iter().enumerate() {
        let full = m
            .forward(&seq, 0, &mut None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (a, b) in full.iter().zip(&logits[i]) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                "step {i}: {a} vs {b}"
            );
        }
        seq.push(tok);
    }
    set_auto_dynamic(true);
    assert_eq!(toks, exact_toks, "greedy tokens equal exact shapes");
    for (a, b) in logits.iter().flatten().zip(exact_logits.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn batch_sizes_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let w1 = weights(&[8, 32], 5, &d);
    let w2 = weights(&[32, 4], 6, &d);
    let run = |b: usize| -> Vec<f32> {
        let x = weights(&[b, 8], 10 + b as u64, &d).to_vec::<f32>().unwrap();
        let x = Tensor::from_slice(&x, &[b, 8], &d).unwrap();
        let h = x.matmul(&w1).unwrap().relu().unwrap();
        let y = h.matmul(&w2).unwrap().log_softmax(-1).unwrap();
        let loss = y.mean(.., false).unwrap();
        let mut out = y.to_vec::<f32>().unwrap();
        out.push(loss.item::<f32>().unwrap());
        out
    };
    // The first size a site sees compiles exact shapes (nothing is dynamic
    // yet); from the second size on, each size runs its bucket's
    // executables. Sizes 1 and 2 are the only lengths of their capacities,
    // so they stay static (ordinary ops, one executable each either way).
    // Output prediction learns per structure: the buckets' shared graphs
    // settle within the first pass, the static sizes 1 and 2 on their third
    // run. So a second pass compiles at most a few executables, a third at
    // most the settled forms of sizes 1 and 2, and a fourth nothing.
    let c0 = compiles();
    let first: Vec<Vec<f32>> = (1..=24).map(run).collect();
    let c1 = compiles();
    assert!(
        c1 - c0 <= 7 * 3,
        "24 sizes compiled {} executables: about 3 per bucket",
        c1 - c0
    );
    let second: Vec<Vec<f32>> = (1..=24).map(run).collect();
    let c2 = compiles();
    let third: Vec<Vec<f32>> = (1..=24).map(run).collect();
    let c3 = compiles();
    assert!(
        c3 - c2 <= 2,
        "the third pass compiled {} executables",
        c3 - c2
    );
    let fourth: Vec<Vec<f32>> = (1..=24).map(run).collect();
    assert_eq!(compiles() - c3, 0, "batch sizes 1..=24 compiled again");
    assert!(
        c2 - c1 <= 3,
        "the second pass compiled {} executables",
        c2 - c1
    );
    assert_eq!(first, second);
    assert_eq!(second, third);
    assert_eq!(third, fourth);
    set_auto_dynamic(false);
    let exact: Vec<Vec<f32>> = (1..=24).map(run).collect();
    set_auto_dynamic(true);
    for (b, (e, g)) in exact.iter().zip(&second).enumerate() {
        for (x, y) in e.iter().zip(g) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                "batch {}: {x} vs {y}",
                b + 1
            );
        }
    }
}

/// A prefill loop whose inputs are random (`Tensor::randn` of each
/// prompt's length) buckets like one whose inputs are uploaded: at most 6
/// compiles for 10 lengths between 5 and 63, and the values of exact
/// shapes (the random values of the logical elements do not depend on the
/// capacity).
#[test]
fn random_inputs_of_varying_length_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let w = weights(&[C, C], 9, &d);
    let lens = [5usize, 9, 17, 23, 31, 40, 47, 55, 60, 63];
    let run = |len: usize| -> Vec<f32> {
        let x = Tensor::randn(&[len, C], 100 + len as u64, &d).unwrap();
        let y = x.matmul(&w).unwrap().gelu().unwrap();
        y.sum(-1, false).unwrap().to_vec::<f32>().unwrap()
    };
    bucketed_like_exact(&lens, run, 6, 1e-5);
}

/// Ops recorded at registered sites (what a binding declares for a Python
/// frame: file, line and op) bucket exactly as ops at Rust call sites do:
/// the same loop over batch sizes compiles about 3 executables per bucket,
/// not per size, and computes the same values.
#[test]
fn registered_sites_bucket_like_rust_call_sites() {
    let _l = metrics_lock();
    let d = dev();
    let w1 = weights(&[8, 32], 7, &d);
    let w2 = weights(&[32, 4], 8, &d);
    let at = |line: u32, op: &str| Origin::site("train.py", line, 0, op);
    let run = |b: usize, registered: bool| -> Vec<f32> {
        let x = weights(&[b, 8], 40 + b as u64, &d).to_vec::<f32>().unwrap();
        let step = |x: &Tensor| -> Result<Tensor> {
            if !registered {
                let h = x.matmul(&w1)?.relu()?;
                return h.matmul(&w2)?.log_softmax(-1);
            }
            let h = with_origin(at(3, "aten::mm"), || x.matmul(&w1))?;
            let h = with_origin(at(3, "aten::relu"), || h.relu())?;
            let y = with_origin(at(4, "aten::mm"), || h.matmul(&w2))?;
            with_origin(at(5, "aten::_log_softmax"), || y.log_softmax(-1))
        };
        let x = Tensor::from_slice(&x, &[b, 8], &d).unwrap();
        step(&x).unwrap().to_vec::<f32>().unwrap()
    };
    let c0 = compiles();
    let registered: Vec<Vec<f32>> = (1..=24).map(|b| run(b, true)).collect();
    let c1 = compiles();
    assert!(
        c1 - c0 <= 7 * 3,
        "24 sizes at registered sites compiled {} executables: about 3 per bucket",
        c1 - c0
    );
    let again: Vec<Vec<f32>> = (1..=24).map(|b| run(b, true)).collect();
    assert!(
        compiles() - c1 <= 3,
        "the second pass compiled {}",
        compiles() - c1
    );
    let rust: Vec<Vec<f32>> = (1..=24).map(|b| run(b, false)).collect();
    assert_eq!(registered, again);
    for (b, (r, g)) in rust.iter().zip(&registered).enumerate() {
        for (x, y) in r.iter().zip(g) {
            assert!(
                (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                "batch {}: {x} vs {y}",
                b + 1
            );
        }
    }
}

/// Prompts that come down from longer ones (8 tokens after 9..=32) run in
/// the warm bucket above their own: the generation compiles nothing, and
/// its greedy tokens and logits equal exact shapes.
#[test]
fn a_shorter_prompt_compiles_nothing_in_the_warm_bucket_above() {
    let _m = metrics_lock();
    let d = dev();
    let dec = Decoder::new(&d);
    let lens = [9usize, 12, 17, 24, 32, 10];
    for _ in 0..3 {
        for &l in &lens {
            dec.generate(&prompt(l), 4);
        }
    }
    let before = compiles();
    let (toks, logits) = dec.generate(&prompt(8), 4);
    assert_eq!(
        compiles() - before,
        0,
        "a prompt of 8 after 9..=32 compiled"
    );
    set_auto_dynamic(false);
    let (exact_toks, exact_logits) = dec.generate(&prompt(8), 4);
    set_auto_dynamic(true);
    assert_eq!(toks, exact_toks, "greedy tokens equal exact shapes");
    for (a, b) in logits.iter().flatten().zip(exact_logits.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn mark_dynamic_compiles_each_executable_once() {
    let _l = metrics_lock();
    let d = dev();
    let q = weights(&[8, 1], 7, &d);
    let empty = Tensor::zeros(&[0, 8], lazyfuse::DType::F32, &d).unwrap();
    let mut cache = empty.mark_dynamic(0, 64).unwrap();
    cache.realize().unwrap(); // the padded empty cache, computed on its own
    let before = metrics::snapshot();
    let mut after_first = 0;
    for step in 0..64u64 {
        let row = weights(&[1, 8], 100 + step, &d);
        cache = Tensor::cat(&[&cache, &row], 0).unwrap();
        let y = cache
            .matmul(&q)
            .unwrap()
            .softmax(0)
            .unwrap()
            .sum(.., false)
            .unwrap();
        assert!((y.item::<f32>().unwrap() - 1.0).abs() < 1e-5);
        if step == 0 {
            after_first = compiles();
        }
    }
    let after = metrics::snapshot();
    assert!(after_first > before.compiles, "the first step compiles");
    assert_eq!(after.compiles, after_first, "steps 2..64 compile nothing");
    assert_eq!(
        after.recompiles(),
        before.recompiles(),
        "no executable compiled twice"
    );
    assert_eq!(cache.dynamic_axes(), vec![(0, 64)]);
    let row = weights(&[1, 8], 1, &d);
    assert!(
        Tensor::cat(&[&cache, &row], 0).is_err(),
        "a 65th row is beyond the maximum"
    );
}

/// A fixed-capacity cache written after prompts of changing lengths: the
/// written cache stays exact (its length never changes), so what reads it
/// compiles once, and a new prompt length inside a warm bucket compiles
/// nothing.
#[test]
fn a_fixed_cache_after_changing_prompts_compiles_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let cap = 16;
    let q = weights(&[4, 1], 3, &d);
    let cache = weights(&[cap, 4], 5, &d);
    let step = |len: usize, seed: u64| {
        let p = weights(&[len, 4], seed, &d);
        let rest = cache.narrow(0, len, cap - len).unwrap();
        let c = Tensor::cat(&[&p, &rest], 0).unwrap();
        assert!(c.dynamic_axes().is_empty(), "{:?}", c.dynamic_axes());
        let y = c
            .matmul(&q)
            .unwrap()
            .softmax(0)
            .unwrap()
            .sum(.., false)
            .unwrap();
        assert!((y.item::<f32>().unwrap() - 1.0).abs() < 1e-5);
    };
    // Warm-up: lengths 5 and 6 (the second marks the prompt axis; output
    // selection learns to leave out the values dropped unread within a few
    // more steps), then 7 and 5 run the executables of the bucket of 8.
    for seed in 0..8 {
        step(5 + seed as usize % 2, seed);
    }
    let before = compiles();
    step(7, 8);
    step(5, 9);
    assert_eq!(compiles(), before, "prompts of 7 and 5 compiled");
}

/// `zeros`, `full` and `arange` of a length that grows every step: `full`
/// is a scalar broadcast (the broadcast's site makes its axis dynamic) and
/// `arange` an iota whose site does, so the lengths compile about one
/// executable per bucket and, once output selection has settled, a pass
/// over lengths already seen compiles nothing. Every sum is exact.
#[test]
fn creation_ops_of_a_growing_length_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let f32 = lazyfuse::DType::F32;
    let step = |n: usize| {
        let z = Tensor::zeros(&[n, 4], f32, &d).unwrap();
        let f = Tensor::full(2.5, &[n, 4], f32, &d).unwrap();
        let r = Tensor::arange(0.0, n as f64, f32, &d).unwrap();
        let s = z.add(&f).unwrap().sum([1], false).unwrap().add(&r).unwrap();
        assert_eq!(s.dims(), vec![n], "the logical length");
        let got = s.sum(.., false).unwrap().item::<f32>().unwrap();
        let want = 10.0 * n as f32 + (n * (n - 1) / 2) as f32;
        assert_eq!(got, want, "length {n}");
    };
    let pass = |lengths: &mut dyn Iterator<Item = usize>| {
        let before = compiles();
        lengths.for_each(step);
        compiles() - before
    };
    // Lengths 1 and 2 exact (a length alone in its bucket stays static),
    // then buckets 4 to 64: the buckets are what compiles.
    let first = pass(&mut (1..=40));
    assert!(first <= 8, "40 lengths compiled {first} executables");
    // Output selection leaves out the locals z, f, r and s (live at the
    // read, never read) once a site has seen them dropped twice: the
    // executables compiled before that (bucket 4 and the exact lengths 1
    // and 2, each the site of its own shape) compile once more.
    let settle = pass(&mut (1..=40).rev()) + pass(&mut (1..=40));
    assert!(settle <= 3, "output selection's warm-up compiled {settle}");
    let after = pass(&mut (1..=40).rev());
    assert_eq!(after, 0, "a pass over warm lengths compiled");
}

/// A bucketed upload that requires grad keeps its logical shape through
/// the ops that cut it from autograd (softmax's stabilising shift): inputs
/// of varying length at one site train like exact ones.
#[test]
fn bucketed_uploads_that_require_grad_keep_their_shape() {
    let _l = metrics_lock();
    let d = dev();
    for len in [3usize, 5, 7, 9] {
        let v: Vec<f32> = (0..len * 4).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::upload(
            lazyfuse::HostTensor::from_slice(&v, [len, 4][..].into()),
            &d,
        )
        .unwrap()
        .with_grad()
        .unwrap();
        let y = x.softmax(-1).unwrap();
        assert_eq!(y.dims(), &[len, 4]);
        y.mul(&y)
            .unwrap()
            .sum(.., false)
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(x.grad().unwrap().dims(), &[len, 4]);
        let sums = y.sum(-1, false).unwrap().to_vec::<f32>().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
    }
}

/// A square causal mask made at one line for prompts of new lengths
/// (`ones([t, t])`, as PyTorch programs write it) buckets both of its
/// axes: the loop compiles per bucket, not per length, and the values
/// equal exact shapes.
#[test]
fn square_masks_of_new_lengths_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let run = |t: usize| -> Vec<f32> {
        let x = Tensor::randn(&[t, C], 7 + t as u64, &d).unwrap();
        let ones = Tensor::ones(&[t, t], lazyfuse::DType::F32, &d).unwrap();
        let r = Tensor::arange(0.0, t as f64, lazyfuse::DType::I64, &d).unwrap();
        let keep = r.unsqueeze(1).unwrap().ge(r.unsqueeze(0).unwrap()).unwrap();
        let zero = Tensor::zeros(&[], lazyfuse::DType::F32, &d).unwrap();
        let mask = keep.where_cond(&ones, &zero).unwrap();
        let att = x
            .matmul(&x.transpose(0, 1).unwrap())
            .unwrap()
            .mul(&mask)
            .unwrap();
        att.matmul(&x)
            .unwrap()
            .sum(-1, false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    let lens = [5usize, 9, 12, 17, 23, 28, 31, 37, 45, 60];
    bucketed_like_exact(&lens, run, 6, 1e-4);
}

/// Runs `run` over `lens` with automatic dynamic shapes: at most
/// `max_compiles` executables, and values within `tol` of exact shapes.
fn bucketed_like_exact(
    lens: &[usize],
    run: impl Fn(usize) -> Vec<f32>,
    max_compiles: u64,
    tol: f32,
) {
    let c0 = compiles();
    let got: Vec<Vec<f32>> = lens.iter().map(|&l| run(l)).collect();
    let used = compiles() - c0;
    assert!(
        used <= max_compiles,
        "{} lengths compiled {used} executables",
        lens.len()
    );
    set_auto_dynamic(false);
    let exact: Vec<Vec<f32>> = lens.iter().map(|&l| run(l)).collect();
    set_auto_dynamic(true);
    for (l, (e, g)) in lens.iter().zip(exact.iter().zip(&got)) {
        assert_eq!(e.len(), g.len(), "length {l}");
        for (a, b) in e.iter().zip(g) {
            assert!(
                (a - b).abs() <= tol * (1.0 + a.abs()),
                "length {l}: {a} vs {b}"
            );
        }
    }
}

/// A 160-step decode loop over a `cat`-grown cache: a bucket boundary
/// costs one compile, not two (the step that crosses it runs the new
/// bucket's executable), so after step 16 the loop compiles at most once
/// per bucket it enters; the logits equal a full recompute.
#[test]
fn a_long_decode_compiles_once_per_bucket_boundary() {
    let _l = metrics_lock();
    let d = dev();
    let m = Decoder::new(&d);
    let p = prompt(5);
    let mut cache = None;
    let mut logits = m.forward(&p, 0, &mut cache).unwrap();
    let mut seq = p.clone();
    let mut per_step = Vec::new();
    let mut all = Vec::new();
    for i in 0..160 {
        let c0 = compiles();
        let l = logits.to_vec::<f32>().unwrap();
        let tok = logits.argmax(-1, false).unwrap().to_vec::<i64>().unwrap()[0];
        all.push(l);
        seq.push(tok);
        logits = m.forward(&[tok], p.len() + i, &mut cache).unwrap();
        per_step.push(compiles() - c0);
    }
    let late: u64 = per_step[16..].iter().sum();
    assert!(late <= 4, "after step 16: {late} compiles {per_step:?}");
    // Every step's logits equal a full forward over the sequence so far,
    // on exact shapes.
    set_auto_dynamic(false);
    for (i, logits) in all.iter().enumerate() {
        let full = m.forward(&seq[..p.len() + i], 0, &mut None).unwrap();
        for (a, b) in full.to_vec::<f32>().unwrap().iter().zip(logits) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                "step {i}: {a} vs {b}"
            );
        }
    }
    set_auto_dynamic(true);
}

/// Device random draws of a varying size (dropout masks, noise) bucket
/// like uploads, and each logical element gets the value an exact draw
/// gives it: the bucketed loop draws the exact loop's numbers, bit for
/// bit, whether the varying axis comes first (`[len, C]`) or after a batch
/// axis (`[3, len]`, drawn flat and picked by logical index). A product
/// after the draw agrees to rounding: XLA's CPU dot may block a padded
/// row count differently from the exact one (seen on an AVX2 host).
#[test]
fn random_draws_of_varying_size_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let f32 = lazyfuse::DType::F32;
    let w = weights(&[C, C], 11, &d);
    let lens = [5usize, 9, 17, 23, 31, 40, 47, 55, 60, 63];
    let masked = |len: usize| -> Tensor {
        let x = Tensor::ones(&[len, C], f32, &d).unwrap();
        let keep = Tensor::rand_uniform(&[len, C], f32, 40 + len as u64, &d)
            .unwrap()
            .ge(0.3)
            .unwrap();
        x.mul(keep.to_dtype(f32).unwrap()).unwrap()
    };
    bucketed_like_exact(&lens, |len| masked(len).to_vec::<f32>().unwrap(), 6, 0.0);
    let rows = |len: usize| -> Vec<f32> {
        let y = masked(len).matmul(&w).unwrap();
        y.sum(-1, false).unwrap().to_vec::<f32>().unwrap()
    };
    bucketed_like_exact(&lens, rows, 6, 1e-6);
    let batched = |len: usize| -> Vec<f32> {
        let noise = Tensor::rand_uniform(&[3, len], f32, 70 + len as u64, &d).unwrap();
        noise.to_vec::<f32>().unwrap()
    };
    bucketed_like_exact(&lens, batched, 6, 0.0);
}

/// `*_like` of a value with dynamic axes has its axes and capacities from
/// the first call, and `eye` of a varying size buckets like `arange`: a
/// prefill loop using them compiles per bucket and computes the exact
/// loop's values.
#[test]
fn like_and_eye_of_varying_size_compile_once_per_bucket() {
    let _l = metrics_lock();
    let d = dev();
    let f32 = lazyfuse::DType::F32;
    let lens = [5usize, 9, 17, 23, 31, 40, 47, 55, 60, 63];
    let run = |len: usize| -> Vec<f32> {
        let x = Tensor::randn(&[len, C], 300 + len as u64, &d).unwrap();
        let (z, o) = (x.zeros_like().unwrap(), x.ones_like().unwrap());
        let h = x.full_like(0.5).unwrap();
        assert_eq!(
            z.dynamic_axes(),
            x.dynamic_axes(),
            "zeros_like keeps the axes"
        );
        assert_eq!(h.dims(), x.dims());
        let e = Tensor::eye(len, f32, &d).unwrap();
        let y = e.matmul(&x).unwrap().add(&o).unwrap().sub(&z).unwrap();
        y.mul(&h)
            .unwrap()
            .sum(-1, false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    bucketed_like_exact(&lens, run, 6, 0.0);
    let eye = Tensor::eye(3, f32, &d).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(eye, [1., 0., 0., 0., 1., 0., 0., 0., 1.]);
}

/// `explain` says which sizes stayed static and why (lengths that moved
/// to different lengths at one line; a reshape that merges a dynamic
/// axis), which became dynamic, and where a cache was grown outside the
/// program at a bucket boundary.
#[test]
fn explain_says_which_sizes_stayed_static_and_why() {
    let _l = metrics_lock();
    let d = dev();
    metrics::set_timing(true);
    let mut lines = Vec::new();
    for dims in [[3usize, 5], [4, 6]] {
        let v = vec![1f32; dims[0] * dims[1]];
        let (x, line) = (Tensor::from_slice(&v, &dims, &d).unwrap(), line!());
        lines.push(line);
        x.sum(.., false).unwrap().item::<f32>().unwrap();
    }
    let mut cache: Option<Tensor> = None;
    for step in 0..20 {
        let row = Tensor::from_slice(&[step as f32; 4], &[1, 4], &d).unwrap();
        let k = match &cache {
            Some(c) => Tensor::cat(&[c, &row], 0).unwrap(),
            None => row,
        };
        let (flat, merge) = (k.reshape(&[k.dims()[0] * 4]).unwrap(), line!());
        lines.push(merge);
        flat.sum(.., false).unwrap().item::<f32>().unwrap();
        cache = Some(k);
    }
    metrics::set_timing(false);
    let said = metrics::recent_output_decisions();
    let has = |start: &str, line: u32, rest: &str| {
        let at = format!("{}:{line}", file!());
        said.iter()
            .any(|s| s.starts_with(start) && s.contains(&at) && s.contains(rest))
    };
    assert!(
        has("static: Upload", lines[0], "moved to different lengths"),
        "{said:#?}"
    );
    assert!(
        has("static: reshape", lines[2], "cut to exact shapes"),
        "{said:#?}"
    );
    assert!(
        said.iter().any(|s| s.starts_with("dynamic: axis 0 of Cat")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|s| s.contains("grown 16 -> 32 outside the program")),
        "{said:#?}"
    );
}

/// Two `nn::Block`s decoding 160 positions with growing `LayerCache`s (a
/// `cat` along axis 2 of `[B, heads, S, head_dim]`): after step 16 at most
/// one compile per bucket boundary, and every position equals the full
/// causal forward on exact shapes.
#[test]
fn cached_blocks_compile_once_per_bucket_boundary() {
    use lazyfuse::nn::{Block, LayerCache, Module};
    let _l = metrics_lock();
    let d = dev();
    let blocks = [
        Block::new(C, 4, 0.0, 5, &d).unwrap(),
        Block::new(C, 4, 0.0, 6, &d).unwrap(),
    ];
    let (b, prefill, steps) = (2, 5, 160);
    let total = prefill + steps;
    let x = weights(&[b, total, C], 21, &d);
    let mut caches = [LayerCache::new(), LayerCache::new()];
    let (mut per_step, mut got) = (Vec::new(), Vec::new());
    let mut at = 0;
    while at < total {
        let n = if at == 0 { prefill } else { 1 };
        let c0 = compiles();
        // Inference, as decoding is run: without `no_grad` every step's
        // activations stay reachable from the caches' autograd history.
        let h = lazyfuse::no_grad(|| {
            let mut h = x.narrow(1, at, n).unwrap();
            for (blk, cache) in blocks.iter().zip(&mut caches) {
                h = blk.forward_cached(&h, cache).unwrap();
            }
            h
        });
        got.push(h.to_vec::<f32>().unwrap());
        per_step.push(compiles() - c0);
        at += n;
    }
    let late: u64 = per_step[17..].iter().sum();
    assert!(late <= 4, "after step 16: {late} compiles {per_step:?}");
    set_auto_dynamic(false);
    let mut full = x.clone();
    for blk in &blocks {
        full = blk.forward(&full).unwrap();
    }
    let full = full.to_vec::<f32>().unwrap();
    set_auto_dynamic(true);
    let mut at = 0;
    for g in &got {
        let n = g.len() / (b * C);
        for bi in 0..b {
            for t in 0..n {
                for c in 0..C {
                    let want = full[(bi * total + at + t) * C + c];
                    let v = g[(bi * n + t) * C + c];
                    assert!(
                        (v - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "position {}: {v} vs {want}",
                        at + t
                    );
                }
            }
        }
        at += n;
    }
}
