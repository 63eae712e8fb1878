//! Plan reuse: a flush whose graph has the structure of an earlier one
//! replays that flush's plan. The replayed plan must read this flush's
//! scalar values, and a change of shape, wiring or wanted values must plan
//! afresh. Every test takes `metrics_lock` (it asserts on process-wide deltas).

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::{FusionGuard, Tensor};

test_device!(
    a_loop_replays_its_plan_with_new_scalars,
    other_shapes_and_wiring_plan_afresh,
);

fn host(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// An Adam-like update whose scalars change every step (as bias
/// corrections do): after the first step, every flush is replayed, and
/// the values follow the host's arithmetic.
fn a_loop_replays_its_plan_with_new_scalars() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x0: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    let g: Vec<f32> = (0..64).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let gt = Tensor::from_slice(&g, &[8, 8], &d).unwrap();
    let mut p = Tensor::from_slice(&x0, &[8, 8], &d).unwrap();
    let mut expect = x0.clone();
    let before = snapshot().plans_reused;
    let steps = 6;
    for t in 1..=steps {
        let bc = 1.0 - 0.9f64.powi(t);
        let lr = 0.01 * t as f64;
        p = p
            .sub(&gt.div_scalar(bc).unwrap().mul_scalar(lr).unwrap())
            .unwrap();
        p.realize().unwrap();
        for (e, gi) in expect.iter_mut().zip(&g) {
            *e -= (*gi / bc as f32) * lr as f32;
        }
        let got = host(&p);
        for (a, b) in got.iter().zip(&expect) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "step {t}: {a} vs {b}"
            );
        }
    }
    let reused = snapshot().plans_reused - before;
    assert!(
        reused >= (steps - 1) as u64,
        "{reused} of {steps} flushes replayed a plan"
    );
}

/// Flushes that differ in shape or wiring must not share a plan: each gets
/// its own, and every answer is right.
fn other_shapes_and_wiring_plan_afresh() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    for round in 0..3 {
        for n in [4usize, 6] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 10.0 * (i as f32 + 1.0)).collect();
            let x = Tensor::from_slice(&a, &[n], &d).unwrap();
            let y = Tensor::from_slice(&b, &[n], &d).unwrap();
            x.realize().unwrap();
            y.realize().unwrap();
            // Same ops, other wiring: x*y + x, then x*y + y.
            let xy = x.mul(&y).unwrap();
            let r1 = host(&xy.add(&x).unwrap());
            let xy = x.mul(&y).unwrap();
            let r2 = host(&xy.add(&y).unwrap());
            for i in 0..n {
                assert_eq!(r1[i], a[i] * b[i] + a[i], "round {round}, n {n}");
                assert_eq!(r2[i], a[i] * b[i] + b[i], "round {round}, n {n}");
            }
        }
    }
}
