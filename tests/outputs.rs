//! What a flush computes: the sync point's needs plus the live tensors the
//! program is predicted to use. Left-out tensors stay pending and are
//! computed correctly if read or used late; decisions are deterministic.
//! Every test takes `metrics_lock` (it asserts on process-wide deltas).

mod common;
use common::mlp::{batch, Mlp};
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::nn::Module;
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{DType, FusionGuard, Result, Tensor};

test_device!(
    layernorm_gelu_loop_writes_one_output_after_warm_up,
    transformer_block_writes_one_output_after_warm_up,
    left_out_tensor_read_late_is_correct,
    left_out_tensor_used_in_a_later_graph_is_correct,
    left_out_tensor_read_on_another_thread_is_correct,
    misprediction_settles_without_oscillating,
    ten_thousand_iterations_stay_flat,
    per_step_scalars_stay_flat,
    same_program_same_decisions_on_two_threads,
    sync_still_computes_every_live_tensor,
    gradients_stay_readable_after_a_step,
    a_training_step_writes_parameters_and_loss_only,
    backward_uses_forward_outputs_however_they_are_held,
);

fn randn(dims: &[usize], seed: u64) -> Tensor {
    let t = Tensor::randn(dims, seed, &dev()).unwrap();
    t.realize().unwrap();
    t
}

fn gelu(x: &Tensor) -> Result<Tensor> {
    let x3 = x.mul(x)?.mul(x)?;
    let inner = x.add(&x3.mul(0.044715)?)?.mul(0.7978845608028654)?;
    x.mul(0.5)?.mul(&inner.tanh()?.add(1.0)?)
}

fn layer_norm(h: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mu = h.mean([-1], true)?;
    let c = h.sub(&mu)?;
    let var = c.mul(&c)?.mean([-1], true)?;
    c.div(&var.add(1e-5)?.sqrt()?)?.mul(g)?.add(b)
}

/// Values written per iteration of `step`, for each of `iters` iterations.
fn outputs_per_iteration(iters: usize, mut step: impl FnMut()) -> Vec<u64> {
    (0..iters)
        .map(|_| {
            let before = snapshot().region_outputs;
            step();
            snapshot().region_outputs - before
        })
        .collect()
}

fn layernorm_gelu_loop_writes_one_output_after_warm_up() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let (x, g, b) = (randn(&[16, 32], 1), randn(&[32], 2), randn(&[32], 3));
    let mut last = Vec::new();
    let per = outputs_per_iteration(8, || {
        // Written as a user would: `h` and the gelu temporary are alive at
        // the sync point.
        let h = layer_norm(&x, &g, &b).unwrap();
        let y = gelu(&h).unwrap().add(&x).unwrap();
        y.realize().unwrap();
        last = y.to_vec::<f32>().unwrap();
    });
    assert!(
        per[0] > 1,
        "the first iteration computes every live tensor: {per:?}"
    );
    assert!(
        per[4..].iter().all(|&n| n == 1),
        "one output after warm-up: {per:?}"
    );
    // The value is right.
    let _g = FusionGuard::new(false);
    let expect = gelu(&layer_norm(&x, &g, &b).unwrap())
        .unwrap()
        .add(&x)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (a, e) in last.iter().zip(&expect) {
        assert!((a - e).abs() <= 1e-5 * (1.0 + e.abs()), "{a} vs {e}");
    }
}

fn transformer_block_writes_one_output_after_warm_up() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let block = lazyfuse::nn::Block::new(32, 4, 0.0, 7, &d).unwrap();
    use lazyfuse::nn::Module;
    let x = randn(&[2, 8, 32], 4);
    let compiles0 = snapshot().compiles;
    let per = outputs_per_iteration(8, || {
        lazyfuse::no_grad(|| block.forward(&x).unwrap().realize().map(|_| ())).unwrap();
    });
    assert!(
        per[4..].iter().all(|&n| n == 1),
        "one output after warm-up: {per:?}"
    );
    let compiles_late = {
        let c = snapshot().compiles;
        for _ in 0..3 {
            lazyfuse::no_grad(|| block.forward(&x).unwrap().realize().map(|_| ())).unwrap();
        }
        snapshot().compiles - c
    };
    assert!(snapshot().compiles > compiles0);
    assert_eq!(
        compiles_late, 0,
        "nothing compiles once the decisions settled"
    );
}

/// Runs a loop long enough that `h` (never read) is left out, and returns
/// the last iteration's `h` and `y` with `h` still pending.
fn left_out_h(x: &Tensor) -> (Tensor, Tensor) {
    let mut out = None;
    for _ in 0..6 {
        let h = x.exp().unwrap().add(1.0).unwrap();
        let y = h.log().unwrap().sum(.., false).unwrap();
        y.realize().unwrap();
        out = Some((h, y));
    }
    out.unwrap()
}

fn expected_h(x: &Tensor) -> Vec<f32> {
    x.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.exp() + 1.0)
        .collect()
}

fn assert_close(a: &[f32], e: &[f32]) {
    assert_eq!(a.len(), e.len());
    for (a, e) in a.iter().zip(e) {
        assert!((a - e).abs() <= 1e-5 * (1.0 + e.abs()), "{a} vs {e}");
    }
}

fn left_out_tensor_read_late_is_correct() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[40], 5);
    let before = snapshot();
    let (h, _y) = left_out_h(&x);
    assert!(h.is_pending(), "h was left out of the last flush");
    assert!(snapshot().left_out > before.left_out);
    let r0 = snapshot().recomputes;
    assert_close(&h.to_vec::<f32>().unwrap(), &expected_h(&x));
    assert_eq!(snapshot().recomputes - r0, 1, "reading it is one recompute");
}

fn left_out_tensor_used_in_a_later_graph_is_correct() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[40], 6);
    let (h, _y) = left_out_h(&x);
    assert!(h.is_pending());
    let r0 = snapshot().recomputes;
    let z = h.mul(2.0).unwrap();
    let want: Vec<f32> = expected_h(&x).iter().map(|v| v * 2.0).collect();
    assert_close(&z.to_vec::<f32>().unwrap(), &want);
    assert_eq!(snapshot().recomputes - r0, 1);
    assert_close(&h.to_vec::<f32>().unwrap(), &expected_h(&x));
}

fn left_out_tensor_read_on_another_thread_is_correct() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[40], 7);
    let (h, _y) = left_out_h(&x);
    assert!(h.is_pending());
    let h2 = h.clone();
    let got = std::thread::spawn(move || h2.add(0.5).unwrap().to_vec::<f32>().unwrap())
        .join()
        .unwrap();
    let want: Vec<f32> = expected_h(&x).iter().map(|v| v + 0.5).collect();
    assert_close(&got, &want);
}

fn misprediction_settles_without_oscillating() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[40], 8);
    // `h` is read every fourth iteration: a site learned as unread is
    // corrected by each late read, and the threshold doubling stops the
    // flip-flopping, so recomputes stop.
    let mut recomputes = Vec::new();
    for i in 0..64 {
        let r0 = snapshot().recomputes;
        let h = x.exp().unwrap().add(1.0).unwrap();
        let y = h.log().unwrap().sum(.., false).unwrap();
        y.realize().unwrap();
        if i % 4 == 3 {
            assert_close(&h.to_vec::<f32>().unwrap(), &expected_h(&x));
        }
        recomputes.push(snapshot().recomputes - r0);
    }
    let late: u64 = recomputes[32..].iter().sum();
    assert_eq!(late, 0, "recomputes per iteration {recomputes:?}");
}

/// Iterations of the flatness tests (`LAZYFUSE_FLAT_ITERS`, default 10,000).
fn flat_iters() -> usize {
    std::env::var("LAZYFUSE_FLAT_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Live buffers, their bytes and pending nodes, sampled ten times over
/// `iters` iterations of `step` (past the first tenth, i.e. warm-up).
fn flat_samples(iters: usize, mut step: impl FnMut(usize)) -> Vec<(u64, u64, usize)> {
    let mut samples = Vec::new();
    for i in 0..iters {
        step(i);
        if i % (iters / 10).max(1) == 0 && i > 10 {
            let s = snapshot();
            samples.push((
                s.live_buffers,
                s.live_buffer_bytes,
                lazyfuse::pending_ops(&dev()),
            ));
        }
    }
    samples
}

fn ten_thousand_iterations_stay_flat() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[8], 9);
    let mut p = Tensor::zeros(&[8], DType::F32, &dev()).unwrap();
    let samples = flat_samples(flat_iters(), |_| {
        let h = x.mul(0.5).unwrap(); // never read: left out
        let t = h.tanh().unwrap();
        p = p.add(&t).unwrap().mul(0.5).unwrap();
        p.realize().unwrap();
    });
    assert_flat(&samples);
}

fn assert_flat(samples: &[(u64, u64, usize)]) {
    let first = samples[0];
    assert!(
        samples.iter().all(|s| *s == first),
        "live buffers, bytes and pending nodes must stay flat: {samples:?}"
    );
}

/// A scalar with a new value every step (an inverse-square-root learning
/// rate; Adam's bias correction) is uploaded each step in its region's
/// scalar pack: the packs of past steps must not pile up.
fn per_step_scalars_stay_flat() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let g = randn(&[8], 11);
    let mut p = Tensor::zeros(&[8], DType::F32, &dev()).unwrap();
    let samples = flat_samples(flat_iters(), |i| {
        let lr = 1e-3 / ((i + 1) as f64).sqrt();
        p = p.sub(g.mul(lr).unwrap()).unwrap();
        p.realize().unwrap();
    });
    assert_flat(&samples);
}

/// Values written by each of a small program's flushes, in order (the
/// region keys themselves: `tests/region_keys.rs`).
fn program_trace() -> Vec<u64> {
    let _f = FusionGuard::new(true);
    let x = randn(&[24], 10);
    let mut trace = Vec::new();
    for _ in 0..6 {
        let before = snapshot().region_outputs;
        let a = x.sin().unwrap();
        let b = a.mul(&x).unwrap();
        let c = b.add(1.0).unwrap().sum(.., false).unwrap();
        c.realize().unwrap();
        trace.push(snapshot().region_outputs - before);
    }
    trace
}

fn same_program_same_decisions_on_two_threads() {
    let _l = metrics_lock();
    let d = dev();
    let a = program_trace();
    let b = std::thread::spawn(move || common::with_backend(backend_of(&d), program_trace))
        .join()
        .unwrap();
    assert_eq!(a, b, "outputs per flush on two threads");
    assert_eq!(*a.last().unwrap(), 1);
}

fn backend_of(d: &lazyfuse::Device) -> common::Backend {
    if d.is_interpreter() {
        common::Backend::Interp
    } else {
        common::Backend::Xla
    }
}

fn sync_still_computes_every_live_tensor() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let x = randn(&[40], 11);
    let (h, y) = left_out_h(&x);
    assert!(h.is_pending());
    let _ = y;
    let h2 = x.cos().unwrap();
    lazyfuse::sync();
    assert!(
        !h.is_pending() && !h2.is_pending(),
        "sync() computes every live tensor"
    );
    assert_close(&h.to_vec::<f32>().unwrap(), &expected_h(&x));
}

/// An optimizer step keeps each parameter's gradient readable (`p.grad()`
/// after `step()`, as in PyTorch), with the right values, and a loop that
/// drops them unread still compiles its step once.
fn gradients_stay_readable_after_a_step() {
    let _l = metrics_lock();
    const READ_AT: usize = 8;
    let run = |fuse: bool| -> (Vec<Vec<f32>>, Vec<u64>) {
        let _f = FusionGuard::new(fuse);
        let m = Mlp::new(60);
        let named = m.params();
        let mut opt = Sgd::new(params_of(&named), 0.1, 0.9, 0.0).unwrap();
        let (x, y) = batch(32, 61);
        let mut compiles = Vec::new();
        let mut grads = Vec::new();
        for i in 0..=READ_AT {
            let before = snapshot().compiles;
            opt.zero_grad();
            let loss = m.loss(&x, &y).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            loss.realize().unwrap();
            compiles.push(snapshot().compiles - before);
            if i == READ_AT {
                grads = named
                    .iter()
                    .map(|(n, p)| {
                        let g = p.grad().unwrap_or_else(|| panic!("{n} has no gradient"));
                        g.to_vec::<f32>().unwrap()
                    })
                    .collect();
            }
        }
        (grads, compiles)
    };
    let (want, _) = run(false);
    let (got, compiles) = run(true);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.len(), w.len());
        for (a, e) in g.iter().zip(w) {
            assert!((a - e).abs() <= 1e-4 * (1.0 + e.abs()), "{a} vs {e}");
        }
    }
    assert!(
        compiles[1..].iter().all(|&c| c == 0),
        "only the first step compiles: compiles per step {compiles:?}"
    );
}

/// A training step written naturally (every layer's output a live local,
/// the logits alive at `step()`) writes the updated parameters and the
/// loss it reads, once the predictor has seen the logits and gradients
/// go unread: not the gradients the parameters keep, not the activations.
/// Its losses match `LAZYFUSE_FUSION=0`, and it compiles nothing after warm-up.
fn a_training_step_writes_parameters_and_loss_only() {
    let _l = metrics_lock();
    let run = |fuse: bool| -> (Vec<f32>, Vec<u64>, Vec<u64>) {
        let _f = FusionGuard::new(fuse);
        let m = Mlp::new(70);
        let mut opt = Sgd::new(params_of(&m.params()), 0.1, 0.0, 0.0).unwrap();
        let (x, y) = batch(32, 71);
        let (mut losses, mut compiles) = (Vec::new(), Vec::new());
        let outputs = outputs_per_iteration(10, || {
            let before = snapshot().compiles;
            let h = m.l1.forward(&x).unwrap();
            let h = h.relu().unwrap();
            let logits = m.l2.forward(&h).unwrap();
            let loss = logits.cross_entropy_ids(&y, None).unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
            losses.push(loss.item::<f32>().unwrap());
            compiles.push(snapshot().compiles - before);
        });
        (losses, outputs, compiles)
    };
    let (want, _, _) = run(false);
    let (got, outputs, compiles) = run(true);
    assert_close(&got, &want);
    // Four parameters and the loss.
    assert!(
        outputs[3..].iter().all(|&n| n == 5),
        "values written per step: {outputs:?}"
    );
    assert!(
        compiles[3..].iter().all(|&c| c == 0),
        "compiles per step: {compiles:?}"
    );
}

/// Backward applies each op's rule to that op's own output, however the
/// program held it: the natural chain of temporaries and the same chain
/// with every intermediate bound to a local record and run the same ops,
/// with the same gradients, fused and unfused. (Backward used to record an
/// op again when nothing but an executor job still held its output, so an
/// unfused step ran a varying number of regions and a fused backward after
/// a read recorded the forward ops twice.)
fn backward_uses_forward_outputs_however_they_are_held() {
    let _l = metrics_lock();
    let x = randn(&[4, 8], 80);
    let run = |fuse: bool, hold: bool| -> (u64, u64, Vec<f32>) {
        let _f = FusionGuard::new(fuse);
        let w1 = randn(&[8, 6], 81).with_grad().unwrap();
        let w2 = randn(&[6, 3], 82).with_grad().unwrap();
        lazyfuse::sync();
        let before = snapshot();
        let (loss, held) = if hold {
            let a = x.matmul(&w1).unwrap();
            let h = a.tanh().unwrap();
            let z = h.matmul(&w2).unwrap();
            let e = z.exp().unwrap();
            (e.mean(.., false).unwrap(), vec![a, h, z, e])
        } else {
            let e = x.matmul(&w1).unwrap().tanh().unwrap();
            let e = e.matmul(&w2).unwrap().exp().unwrap();
            (e.mean(.., false).unwrap(), Vec::new())
        };
        // A read before backward: the forward runs, and nothing but the
        // grad nodes (and `held`) keeps its intermediates.
        let _ = loss.item::<f32>().unwrap();
        loss.backward().unwrap();
        let mut grads = w1.grad().unwrap().to_vec::<f32>().unwrap();
        grads.extend(w2.grad().unwrap().to_vec::<f32>().unwrap());
        drop(held);
        let after = snapshot();
        (
            after.regions_executed - before.regions_executed,
            after.ops_recorded - before.ops_recorded,
            grads,
        )
    };
    for fuse in [false, true] {
        let natural = run(fuse, false);
        let held = run(fuse, true);
        assert_eq!(
            (natural.0, natural.1),
            (held.0, held.1),
            "regions run and ops recorded (fused: {fuse}), natural vs held"
        );
        assert_eq!(natural.2, held.2, "gradients (fused: {fuse})");
    }
}
