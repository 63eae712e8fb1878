//! Gradient clipping by global norm: the scaled gradients and the norm
//! match a host computation, clipping records no sync and fuses into the
//! optimizer step (which still compiles once, then never), fused and
//! unfused agree, and bad bounds are errors at the call site. Every test
//! takes `metrics_lock`: one counts compiles, which are process-wide.

mod common;
use common::metrics_lock;
use common::mlp::{batch, Mlp};
use lazyfuse::metrics::snapshot;
use lazyfuse::nn::Param;
use lazyfuse::optim::{clip_grad_norm, params_of, Optimizer, Sgd};
use lazyfuse::FusionGuard;

test_device!(
    clipping_scales_gradients_like_the_host,
    gradients_within_the_bound_are_unchanged,
    clipping_records_no_sync_and_a_clipped_step_compiles_once,
    fused_and_unfused_clipped_training_agree,
    a_bad_bound_is_an_error_and_no_gradients_give_none,
);

/// The model's gradients after one backward pass on a fixed batch.
fn model_with_grads(seed: u64) -> (Mlp, Vec<Param>) {
    let m = Mlp::new(seed);
    let (x, y) = batch(32, seed + 100);
    m.loss(&x, &y).unwrap().backward().unwrap();
    let params = params_of(&m.params());
    (m, params)
}

fn host_grads(params: &[Param]) -> Vec<Vec<f32>> {
    params
        .iter()
        .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

fn host_norm(grads: &[Vec<f32>]) -> f64 {
    grads
        .iter()
        .flatten()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

fn clipping_scales_gradients_like_the_host() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let (_m, params) = model_with_grads(1);
    let before = host_grads(&params);
    let norm = host_norm(&before);
    assert!(norm > 0.0);
    let max_norm = norm / 4.0;
    let got = clip_grad_norm(&params, max_norm).unwrap().unwrap();
    let got = f64::from(got.item::<f32>().unwrap());
    assert!((got - norm).abs() <= 1e-5 * norm, "norm {got} vs {norm}");
    let scale = (max_norm / (norm + 1e-6)).min(1.0);
    let after = host_grads(&params);
    for (a, b) in after.iter().flatten().zip(before.iter().flatten()) {
        let want = f64::from(*b) * scale;
        assert!(
            (f64::from(*a) - want).abs() <= 1e-5 * (want.abs() + 1e-6),
            "{a} vs {want}"
        );
    }
    assert!((host_norm(&after) - max_norm).abs() <= 1e-4 * max_norm);
}

fn gradients_within_the_bound_are_unchanged() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let (_m, params) = model_with_grads(2);
    let before = host_grads(&params);
    clip_grad_norm(&params, 1e30).unwrap().unwrap();
    let after = host_grads(&params);
    let bits = |g: &[Vec<f32>]| -> Vec<u32> { g.iter().flatten().map(|v| v.to_bits()).collect() };
    assert_eq!(bits(&after), bits(&before), "a scale of exactly 1");
}

fn clipping_records_no_sync_and_a_clipped_step_compiles_once() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let m = Mlp::new(3);
    let mut opt = Sgd::new(params_of(&m.params()), 0.1, 0.9, 0.0).unwrap();
    let mut step = |seed: u64| {
        let (x, y) = batch(16, seed);
        let loss = m.loss(&x, &y).unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        let flushes = snapshot().flushes();
        let norm = clip_grad_norm(opt.params(), 0.5).unwrap().unwrap();
        assert_eq!(
            snapshot().flushes(),
            flushes,
            "clipping is recorded, not run"
        );
        opt.step().unwrap();
        (loss.item::<f32>().unwrap(), norm.item::<f32>().unwrap())
    };
    for s in 0..4 {
        step(s);
    }
    let before = snapshot();
    for s in 4..10 {
        let (loss, norm) = step(s);
        assert!(loss.is_finite() && norm.is_finite() && norm > 0.0);
    }
    assert_eq!(
        snapshot().compiles,
        before.compiles,
        "steady state never compiles"
    );
}

/// Parameters after a few clipped SGD steps, as host vectors.
fn clipped_training(fuse: bool) -> Vec<Vec<f32>> {
    let _f = FusionGuard::new(fuse);
    let m = Mlp::new(4);
    let mut opt = Sgd::new(params_of(&m.params()), 0.2, 0.0, 0.0).unwrap();
    for s in 0..5 {
        let (x, y) = batch(16, 40 + s);
        opt.zero_grad();
        m.loss(&x, &y).unwrap().backward().unwrap();
        clip_grad_norm(opt.params(), 0.05).unwrap();
        opt.step().unwrap();
    }
    opt.params()
        .iter()
        .map(|p| p.tensor().to_vec::<f32>().unwrap())
        .collect()
}

fn fused_and_unfused_clipped_training_agree() {
    let _l = metrics_lock();
    let (a, b) = (clipped_training(true), clipped_training(false));
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

fn a_bad_bound_is_an_error_and_no_gradients_give_none() {
    let _l = metrics_lock();
    let m = Mlp::new(5);
    let params = params_of(&m.params());
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = clip_grad_norm(&params, bad).unwrap_err().to_string();
        assert!(
            e.contains("clip_grad_norm") && e.contains("max_norm"),
            "{e}"
        );
        assert!(e.contains("tests/clip.rs"), "names the caller's line: {e}");
    }
    assert!(clip_grad_norm(&params, 1.0).unwrap().is_none());
}
