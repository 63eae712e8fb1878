//! A whole forward + backward + optimizer step of a small model compiles
//! once, then only hits the compile cache, even as the learning rate and the
//! step count change, and host scalars made fresh every step compile
//! nothing new. Alone in its binary: metrics are process-wide.

mod common;
use common::mlp::{batch, Mlp};
use common::{dev, metrics_lock};
use lazyfuse::optim::{params_of, AdamW, Optimizer};
use lazyfuse::{metrics, DType, FusionGuard, Tensor};

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

/// A scalar the program holds at a flush used to be computed by a region,
/// its value part of the key: a loop making one per step compiled every
/// step. Two ways natural code holds one: a scalar tensor read in two
/// graphs, and the constant of a scalar `mul` that autograd saves for the
/// backward of a loss built from two micro-batches.
#[test]
fn a_scalar_made_fresh_each_step_compiles_nothing_new() {
    let _l = metrics_lock();
    let x = Tensor::randn(&[8], 5, &dev()).unwrap();
    let xs = x.to_vec::<f32>().unwrap();
    for fuse in [true, false] {
        let _f = FusionGuard::new(fuse);
        let m = Mlp::new(40);
        let mut opt = AdamW::new(params_of(&m.params()), 0.01, 0.0).unwrap();
        let mut step = |i: usize| {
            let v = 1.0 + i as f32 / 8.0;
            let s = Tensor::full(v as f64, &[], DType::F32, &dev()).unwrap();
            let a = x.mul(&s).unwrap().to_vec::<f32>().unwrap();
            let b = x.add(&s).unwrap().to_vec::<f32>().unwrap();
            for ((a, b), x) in a.iter().zip(&b).zip(&xs) {
                assert_eq!(
                    (a.to_bits(), b.to_bits()),
                    ((x * v).to_bits(), (x + v).to_bits())
                );
            }
            opt.zero_grad();
            for micro in 0..2 {
                let (bx, by) = batch(16, 7 + micro);
                let loss = m.loss(&bx, &by).unwrap().mul(v as f64).unwrap();
                loss.backward().unwrap();
            }
            opt.step().unwrap();
            s.item::<f32>().unwrap()
        };
        for i in 0..3 {
            step(i);
        }
        let before = metrics::snapshot();
        for i in 3..9 {
            assert_eq!(step(i), 1.0 + i as f32 / 8.0);
        }
        let after = metrics::snapshot();
        assert_eq!(after.compiles, before.compiles, "fuse {fuse}");
    }
}
