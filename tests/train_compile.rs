//! A whole forward + backward + optimizer step of a small model compiles
//! once, then only hits the compile cache, even as the learning rate and the
//! step count change. Alone in its binary: metrics are process-wide.

mod common;
use common::metrics_lock;
use common::mlp::{batch, Mlp};
use lazyfuse::optim::{params_of, AdamW, Optimizer};
use lazyfuse::{metrics, FusionGuard};

#[test]
fn a_training_step_compiles_once_then_hits_the_cache() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let m = Mlp::new(30);
    let mut opt = AdamW::new(params_of(&m.params()), 0.01, 0.01).unwrap();
    let step = |opt: &mut AdamW, seed: u64| {
        let (x, y) = batch(16, seed);
        let loss = m.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        loss.item::<f32>().unwrap()
    };
    // Warm up: the batch helper itself reads values (its own small graph).
    batch(16, 99);
    let before = metrics::snapshot();
    step(&mut opt, 1);
    let first = metrics::snapshot();
    let compiled = first.compiles - before.compiles;
    eprintln!("first step: {compiled} compiles");
    assert_eq!(
        compiled, 1,
        "forward, backward and update fuse into one region"
    );
    for s in 2..6 {
        opt.set_lr(0.01 / s as f64); // a new learning rate and step count: no recompile
        step(&mut opt, s);
    }
    let after = metrics::snapshot();
    assert_eq!(
        after.compiles, first.compiles,
        "steady state never compiles"
    );
    assert!(after.cache_hits - first.cache_hits >= 4 * compiled);
}
