//! Plan reuse and packed scalars: a flush whose graph has the structure of
//! an earlier one replays that flush's plan, and a launch passes a region's
//! lifted scalars packed per dtype. The replayed plan must read this
//! flush's scalar values, a change of shape, wiring or wanted values must
//! plan afresh, and packing must keep donation and mixed dtypes right.
//! Every test takes `metrics_lock` (it asserts on process-wide deltas).

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::{DType, FusionGuard, Tensor};

test_device!(
    a_loop_replays_its_plan_with_new_scalars,
    scalars_reaching_one_zero_or_minus_one_compile_nothing_new,
    a_moving_arange_start_compiles_nothing_new,
    a_full_tensor_of_a_moving_value_compiles_nothing_new,
    other_shapes_and_wiring_plan_afresh,
    scalars_of_two_dtypes_and_a_donated_buffer,
);

fn host(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Runs `step` on each of `inputs` and asserts that nothing compiles from
/// step `warm` on (the steps before it may compile, and may leave out a
/// value the loop never reads).
fn assert_warm_after<T: Copy + std::fmt::Debug>(
    warm: usize,
    inputs: &[T],
    mut step: impl FnMut(T),
) {
    let compiles: Vec<u64> = inputs
        .iter()
        .map(|&x| {
            let before = snapshot().compiles;
            step(x);
            snapshot().compiles - before
        })
        .collect();
    assert!(
        compiles[warm..].iter().all(|&c| c == 0),
        "compiles per step {compiles:?} for {inputs:?}"
    );
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
        p = p.sub(gt.div(bc).unwrap().mul(lr).unwrap()).unwrap();
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

/// Host scalars that come to equal 1, -1 or 0 (Adam's bias correction
/// `1 - 0.9^t` is exactly 1 from step 356 on, a warm-up factor reaches 1,
/// a position offset starts at 0) are lifted like any other value: after
/// the first step nothing compiles again, and every step reads its own
/// values, float and integer.
fn scalars_reaching_one_zero_or_minus_one_compile_nothing_new() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 4.0).collect();
    let x = Tensor::from_slice(&xs, &[16], &d).unwrap();
    let is: Vec<i32> = (0..16).map(|i| i * 3 - 20).collect();
    let xi = Tensor::from_slice(&is, &[16], &d).unwrap();
    let steps = [
        (0.75, 2),
        (1.0, 1),
        (-1.0, -1),
        (0.0, 0),
        (-0.0, 1),
        (3.0, -1),
        (1.0, 0),
    ];
    assert_warm_after(1, &steps, |(c, k)| {
        let y = x.mul(c).unwrap().add(c).unwrap();
        let z = xi.add(k as f64).unwrap().mul(k as f64).unwrap();
        let (got_y, got_z) = (host(&y), z.to_vec::<i32>().unwrap());
        for (g, x) in got_y.iter().zip(&xs) {
            let want = x * c as f32 + c as f32;
            assert!(
                (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{c}: {g} vs {want}"
            );
        }
        let want_z: Vec<i32> = is.iter().map(|i| (i + k) * k).collect();
        assert_eq!(got_z, want_z, "{k}");
    });
}

/// `arange`'s start and step are host scalars, not code: the position ids
/// `arange(pos, pos + 1)` of a decoding loop, and a float range with a
/// moving fractional start, compile nothing after warm-up; the values are
/// `start + i * step` computed in f64 and rounded once.
fn a_moving_arange_start_compiles_nothing_new() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let rows: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let table = Tensor::from_slice(&rows, &[16, 4], &d).unwrap();
    // Warm-up: `ids`, alive but never read, is left out of the outputs
    // from the third step on (one more compile).
    let positions: Vec<usize> = (0..10).collect();
    assert_warm_after(3, &positions, |pos| {
        let ids = Tensor::arange(pos as f64, (pos + 2) as f64, DType::I64, &d).unwrap();
        let picked = host(&table.index_select(0, &ids).unwrap());
        let (start, step) = (0.1 * pos as f64 - 0.35, 0.3 + 0.05 * pos as f64);
        let xs = Tensor::arange_step(start, start + 5.0 * step, step, DType::F32, &d).unwrap();
        let got = host(&xs);
        assert_eq!(picked, rows[4 * pos..4 * pos + 8].to_vec(), "rows at {pos}");
        let want: Vec<f32> = (0..got.len())
            .map(|i| (start + i as f64 * step) as f32)
            .collect();
        assert_eq!(got.len(), 5, "length at {pos}");
        assert_eq!(got, want, "values at {pos}");
    });
}

/// `full(v, dims)` is a lifted scalar broadcast to `dims`: a fill value
/// that changes every step (zeros and ones among them) compiles nothing
/// new after warm-up.
fn a_full_tensor_of_a_moving_value_compiles_nothing_new() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let xs: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
    let x = Tensor::from_slice(&xs, &[3, 4], &d).unwrap();
    // Warm-up: `fill`, alive but never read, is left out of the outputs
    // from the third step on (one more compile).
    let values = [0.5, 0.0, 1.0, -2.25, 1.0, 7.0, 0.0, -1.0];
    assert_warm_after(3, &values, |v| {
        let fill = Tensor::full(v, &[3, 4], DType::F32, &d).unwrap();
        let got = host(&x.mul(&fill).unwrap());
        let want: Vec<f32> = xs.iter().map(|x| x * v as f32).collect();
        assert_eq!(got, want, "fill {v}");
    });
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

/// A region reading f32 and i32 scalars interleaved with buffer
/// parameters, one of them donated (the step's old value dies): the packs
/// and the donated argument's position must line up, step after step.
fn scalars_of_two_dtypes_and_a_donated_buffer() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let a0: Vec<f32> = (0..12).map(|i| i as f32 - 6.0).collect();
    let k: Vec<i32> = (0..12).map(|i| i * 3 - 7).collect();
    let kt = Tensor::from_slice(&k, &[3, 4], &d).unwrap();
    let mut a = Tensor::from_slice(&a0, &[3, 4], &d).unwrap();
    let mut ea = a0.clone();
    let donated = snapshot().buffers_donated;
    for step in 1..=4 {
        let s = 0.5 + step as f64;
        let j = 2 + step as i64;
        // f32 scalar, i32 scalar, f32 scalar, with the old `a` dying.
        let ki = kt.mul(j as f64).unwrap().add(3.0).unwrap();
        a = a
            .mul(s)
            .unwrap()
            .add(ki.to_dtype(lazyfuse::DType::F32).unwrap())
            .unwrap()
            .sub(0.25 * s)
            .unwrap();
        a.realize().unwrap();
        for (e, &ki) in ea.iter_mut().zip(&k) {
            *e = *e * s as f32 + (ki * j as i32 + 3) as f32 - (0.25 * s) as f32;
        }
        assert_eq!(host(&a), ea, "step {step}");
    }
    assert!(
        snapshot().buffers_donated > donated,
        "the old value was donated"
    );
}
