//! Region and compile counts on every test backend (in the manner of
//! kernel-count tests): repeated blocks share one executable, lifted scalars
//! never recompile, a changed shape compiles exactly once more. Structure
//! (regions, outputs, donations) is asserted on dry-run plans
//! (`lazyfuse::plan_of`): a plan is the same whatever runs beside it.
//! Compile and cache counts are process-wide counter deltas, so every test
//! here that runs a graph takes `metrics_lock`, not to move the counters
//! another test is reading.

mod common;
use common::{dev, metrics_lock};
use lazyfuse::metrics::snapshot;
use lazyfuse::{plan_of, sync, DType, FusionGuard, Result, Tensor};

test_device!(
    adamw_over_200_params_compiles_one_update_region,
    changing_one_input_shape_compiles_exactly_once_more,
    eight_identical_blocks_compile_one_group_of_four_once,
    two_stacked_blocks_and_their_tail_are_one_launch,
    adam_fused_equals_unfused,
    donation_never_changes_results,
    donation_never_frees_a_buffer_a_live_tensor_holds,
    a_dry_run_plans_without_running,
    a_dry_run_sees_layer_groups,
    a_dry_run_sees_donations,
);

fn a_dry_run_plans_without_running() {
    let _l = metrics_lock();
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &d).unwrap();
    let (y, plan) = plan_of(|| {
        let e = x.exp().unwrap();
        e.add(1.0).unwrap().sum(-1, false).unwrap()
    });
    assert_eq!(plan.regions.len(), 1, "{plan}");
    assert_eq!(plan.outputs, 1, "only y is live: {plan}");
    let ops = &plan.regions[0].ops;
    for op in ["exp", "add", "sum"] {
        assert!(ops.contains(&op), "{op} in {plan}");
    }
    // Nothing ran: y is still pending, and computes as usual afterwards.
    assert!(y.is_pending());
    let want: Vec<f32> = [[1.0f32, 2.0], [3.0, 4.0]]
        .iter()
        .map(|r| r.iter().map(|v| v.exp() + 1.0).sum())
        .collect();
    let got = y.to_vec::<f32>().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "{got:?} vs {want:?}");
    }
    // With fusion off every op runs when recorded: nothing is left to plan.
    let _f = FusionGuard::new(false);
    let (_, plan) = plan_of(|| x.exp().unwrap());
    assert!(plan.regions.is_empty(), "{plan}");
}

fn a_dry_run_sees_layer_groups() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    for (layers, regions) in [(2, 1), (8, 3)] {
        let ws = weights(layers);
        let x = Tensor::randn(&[2, 12, 20], 1, &d).unwrap();
        let (_, plan) = plan_of(|| {
            let mut x = x.clone();
            for (w1, w2) in &ws {
                x = block(&x, w1, w2).unwrap();
            }
            x.tanh().unwrap()
        });
        // Stacked layers run 4 to a region: 2 blocks and the tail are one
        // region; 8 are two groups of 4 and the tail.
        assert_eq!(plan.regions.len(), regions, "{layers} layers: {plan}");
        assert_eq!(plan.regions_with("matmul"), regions.min(2), "{plan}");
        sync();
    }
}

fn a_dry_run_sees_donations() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let x = Tensor::zeros(&[64], DType::F32, &d).unwrap();
    x.realize().unwrap();
    // `x` moves in and dies: its buffer only the graph holds, so the
    // region may write the result of the same type into it.
    let (y, plan) = plan_of(move || x.add(1.0).unwrap());
    assert_eq!(plan.donated(), 1, "{plan}");
    // A live input is never donated.
    let z = Tensor::zeros(&[64], DType::F32, &d).unwrap();
    z.realize().unwrap();
    let (_, plan) = plan_of(|| z.add(1.0).unwrap());
    assert_eq!(plan.donated(), 0, "{plan}");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0; 64]);
}

/// `layers` pairs of realized block weights.
fn weights(layers: usize) -> Vec<(Tensor, Tensor)> {
    let d = dev();
    (0..layers as u64)
        .map(|i| {
            let w = |dims: &[usize], seed: u64| {
                let w = Tensor::randn(dims, seed, &d).unwrap().mul(0.2).unwrap();
                w.realize().unwrap();
                w
            };
            (w(&[20, 36], 10 + i), w(&[36, 20], 20 + i))
        })
        .collect()
}

struct Adam {
    p: Vec<Tensor>,
    g: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    t: i32,
}

impl Adam {
    fn new(n: usize, dims: &[usize]) -> Adam {
        let d = dev();
        let mk = |seed: u64, scale: f64| -> Tensor {
            let t = Tensor::randn(dims, seed, &d).unwrap().mul(scale).unwrap();
            t.realize().unwrap();
            t
        };
        Adam {
            p: (0..n as u64).map(|i| mk(i, 1.0)).collect(),
            g: (0..n as u64).map(|i| mk(500 + i, 0.01)).collect(),
            m: (0..n as u64).map(|i| mk(900 + i, 0.0)).collect(),
            v: (0..n as u64).map(|i| mk(1300 + i, 0.0)).collect(),
            t: 0,
        }
    }

    fn step(&mut self, lr: f64) -> Result<()> {
        self.t += 1;
        let (b1, b2, eps, wd) = (0.9f64, 0.999f64, 1e-8, 0.01);
        let (bc1, bc2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for i in 0..self.p.len() {
            self.m[i] = self.m[i].mul(b1)?.add(&self.g[i].mul(1.0 - b1)?)?;
            self.v[i] = self.v[i]
                .mul(b2)?
                .add(&self.g[i].mul(&self.g[i])?.mul(1.0 - b2)?)?;
            let mh = self.m[i].div(bc1)?;
            let vh = self.v[i].div(bc2)?;
            let upd = mh.div(&vh.sqrt()?.add(eps)?)?.add(&self.p[i].mul(wd)?)?;
            self.p[i] = self.p[i].sub(&upd.mul(lr)?)?;
        }
        sync();
        Ok(())
    }
}

fn adamw_over_200_params_compiles_one_update_region() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let mut opt = Adam::new(200, &[24, 24]);
    let s0 = snapshot();
    opt.step(1e-3).unwrap();
    let s1 = snapshot();
    assert_eq!(
        s1.compiles - s0.compiles,
        1,
        "one update region for 200 parameters"
    );
    // Independent updates run 50 per region (the largest divisor of 200 up to 64).
    assert_eq!(s1.regions_executed - s0.regions_executed, 4);
    // A new learning rate and new bias corrections every step: nothing compiles.
    for k in 0..3 {
        opt.step(1e-3 * (k as f64 + 2.0)).unwrap();
    }
    let s2 = snapshot();
    assert_eq!(s2.compiles, s1.compiles, "lifted scalars never recompile");
    assert_eq!(s2.cache_hits - s1.cache_hits, 12);
}

fn changing_one_input_shape_compiles_exactly_once_more() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let run = |n: usize| {
        let x = Tensor::randn(&[3, n], 7, &d).unwrap();
        let y = x.tanh().unwrap().mul(3.0).unwrap().sum([1], false).unwrap();
        y.to_vec::<f32>().unwrap()
    };
    run(29);
    let s0 = snapshot();
    run(29);
    let s1 = snapshot();
    assert_eq!(s1.compiles, s0.compiles);
    run(31);
    let s2 = snapshot();
    assert_eq!(s2.compiles - s1.compiles, 1, "a new shape compiles once");
    run(31);
    run(29);
    assert_eq!(
        snapshot().compiles,
        s2.compiles,
        "both shapes now hit the cache"
    );
}

fn layer_norm(x: &Tensor) -> Result<Tensor> {
    let mu = x.mean([-1], true)?;
    let c = x.sub(&mu)?;
    let var = c.mul(&c)?.mean([-1], true)?;
    c.div(&var.add(1e-5)?.sqrt()?)
}

fn block(x: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Tensor> {
    let h = layer_norm(x)?.matmul(w1)?.gelu()?.matmul(w2)?;
    x.add(&h)
}

fn stack(layers: usize, fuse: bool) -> (Vec<f32>, u64, u64) {
    let _f = FusionGuard::new(fuse);
    let d = dev();
    let mut x = Tensor::randn(&[2, 12, 20], 1, &d).unwrap();
    let ws = weights(layers);
    let s0 = snapshot();
    for (w1, w2) in &ws {
        x = block(&x, w1, w2).unwrap();
    }
    let out = x.tanh().unwrap().to_vec::<f32>().unwrap();
    let s1 = snapshot();
    (
        out,
        s1.compiles - s0.compiles,
        s1.regions_executed - s0.regions_executed,
    )
}

/// Fused and unfused results of [`stack`] agree to 1e-5 relative.
fn assert_close(fused: &[f32], unfused: &[f32]) {
    for (a, b) in fused.iter().zip(unfused) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "fused {a} vs unfused {b}"
        );
    }
}

fn eight_identical_blocks_compile_one_group_of_four_once() {
    let _l = metrics_lock();
    // Stacked layers run 4 to a region (`LAZYFUSE_LAYERS_PER_REGION`), and
    // both groups of 4 share one executable.
    let (fused, compiles, regions) = stack(8, true);
    assert_eq!(regions, 3, "2 groups of 4 blocks and the tail");
    assert_eq!(compiles, 2, "the group once, the tail once");
    let (again, compiles, _) = stack(8, true);
    assert_eq!(compiles, 0);
    assert_eq!(fused, again);
    let (unfused, _, _) = stack(8, false);
    assert_close(&fused, &unfused);
}

fn two_stacked_blocks_and_their_tail_are_one_launch() {
    let _l = metrics_lock();
    // A small model's step is not cut per layer: one region, one launch.
    let (fused, compiles, regions) = stack(2, true);
    assert_eq!(regions, 1, "2 blocks with the tail");
    assert_eq!(compiles, 1);
    let (unfused, _, _) = stack(2, false);
    assert_close(&fused, &unfused);
}

fn adam_fused_equals_unfused() {
    let _l = metrics_lock();
    let run = |fuse: bool| {
        let _f = FusionGuard::new(fuse);
        let mut opt = Adam::new(5, &[7, 3]);
        for k in 0..3 {
            opt.step(0.01 * (k + 1) as f64).unwrap();
        }
        opt.p
            .iter()
            .flat_map(|p| p.to_vec::<f32>().unwrap())
            .collect::<Vec<f32>>()
    };
    let (a, b) = (run(true), run(false));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
            "fused {x} vs unfused {y}"
        );
    }
}

fn donation_never_changes_results() {
    let _l = metrics_lock();
    let n = 53;
    let host_g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
    let run = |fuse: bool| -> (Vec<f32>, u64) {
        let _f = FusionGuard::new(fuse);
        let d = dev();
        let g = Tensor::from_slice(&host_g, &[n], &d).unwrap();
        let mut p = Tensor::from_slice(&vec![1.0f32; n], &[n], &d).unwrap();
        let s0 = snapshot();
        for step in 0..5 {
            // In-place style update: the old `p` is dropped by the assignment.
            p = p
                .sub(g.mul(0.1 * (step + 1) as f64).unwrap())
                .unwrap()
                .tanh()
                .unwrap();
            p.realize().unwrap();
        }
        (
            p.to_vec::<f32>().unwrap(),
            snapshot().buffers_donated - s0.buffers_donated,
        )
    };
    let (fused, donated) = run(true);
    let (unfused, donated_unfused) = run(false);
    assert!(
        donated >= 5,
        "every step donates the old parameter, got {donated}"
    );
    assert_eq!(
        donated_unfused, 0,
        "unfused mode is the plain reference path"
    );
    let mut expect = vec![1.0f32; n];
    for step in 0..5 {
        for (e, g) in expect.iter_mut().zip(&host_g) {
            *e = (*e - g * (0.1 * (step + 1) as f32)).tanh();
        }
    }
    for ((a, b), e) in fused.iter().zip(&unfused).zip(&expect) {
        assert!(
            (a - b).abs() <= 1e-6 && (a - e).abs() <= 1e-5,
            "fused {a} unfused {b} reference {e}"
        );
    }
}

fn donation_never_frees_a_buffer_a_live_tensor_holds() {
    let _l = metrics_lock();
    let _f = FusionGuard::new(true);
    let d = dev();
    let mut p = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d).unwrap();
    let kept = p.clone(); // a live handle to the same buffer
    let s0 = snapshot();
    p = p.mul(10.0).unwrap();
    p.realize().unwrap();
    assert_eq!(
        snapshot().buffers_donated,
        s0.buffers_donated,
        "a held buffer is never donated"
    );
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![10.0, 20.0, 30.0]);
    // Once the last handle is gone, the next update may donate it.
    drop(kept);
    let s1 = snapshot();
    p = p.add(1.0).unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![11.0, 21.0, 31.0]);
    assert_eq!(snapshot().buffers_donated - s1.buffers_donated, 1);
}
