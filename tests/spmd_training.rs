//! Training on a mesh of logical CPU devices (issue 12): data-parallel,
//! fully sharded and tensor-parallel training give the single-device
//! losses, FSDP keeps every parameter split, and a sharded step compiles
//! once, and resharding stays on the devices. One test per binary: the
//! compile and transfer counters are process-wide.

use lazyfuse::metrics;
use lazyfuse::nn::{parallel, Linear, Module};
use lazyfuse::optim::{params_of, AdamW, Optimizer, Sgd};
use lazyfuse::{Device, Mesh, Tensor};
use spmd_support::{close, data};

mod spmd_support;

#[test]
fn data_parallel_sgd_equals_single_device_and_compiles_once() {
    let d = Device::cpu_with_devices(8).unwrap();
    let mesh = Mesh::new(&d, &[("dp", 4)]).unwrap();
    let (xs, ys) = (data(16 * 5, 6), data(16 * 3, 7));
    let train = |sharded: bool| -> Vec<f32> {
        let model = Linear::new(5, 3, true, 11, &d).unwrap();
        let mut opt = Sgd::new(params_of(&model.parameters()), 0.1, 0.0, 0.0).unwrap();
        let mut losses = Vec::new();
        let mut compiles = Vec::new();
        let mut comms = Vec::new();
        for _ in 0..6 {
            let m0 = metrics::snapshot();
            let before = m0.compiles;
            let mut x = Tensor::from_slice(&xs, &[16, 5], &d).unwrap();
            let mut y = Tensor::from_slice(&ys, &[16, 3], &d).unwrap();
            if sharded {
                x = x.shard(&mesh, &[Some("dp"), None]).unwrap();
                y = y.shard(&mesh, &[Some("dp"), None]).unwrap();
            }
            let diff = model.forward(&x).unwrap().sub(&y).unwrap();
            let loss = diff.mul(&diff).unwrap().mean(.., false).unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
            losses.push(loss.item::<f32>().unwrap());
            let m1 = metrics::snapshot();
            compiles.push(m1.compiles - before);
            comms.push((
                m1.collectives - m0.collectives,
                m1.collective_bytes - m0.collective_bytes,
                m1.buffers_donated - m0.buffers_donated,
            ));
        }
        if sharded {
            assert_eq!(compiles[4..], [0, 0], "compiles per step: {compiles:?}");
            // One bucketed all-reduce per step carries every gradient (18
            // floats) and the loss: XLA's combiner joins them.
            let grads = (5 * 3 + 3) * 4;
            assert_eq!(comms[5].0, 1, "collectives per step: {comms:?}");
            assert!(comms[5].1 >= grads && comms[5].1 <= grads + 64, "{comms:?}");
            // The step's gradients stay pending until `zero_grad` (readable,
            // not written), so they hold the old weight and bias: nothing is
            // donated, as on one device.
            assert_eq!(comms[5].2, 0, "donations per step: {comms:?}");
        }
        losses
    };
    let single = train(false);
    let dp = train(true);
    close(&dp, &single, "losses");
    assert!(single[5] < single[0], "{single:?}");
    every_strategy_trains_like_one_device(&d);
    resharding_moves_values_between_devices_not_through_the_host(&d);
    replicated_copies_count_on_their_devices(&d);
}

/// A one-device tensor that joins an SPMD program is copied to every
/// device of the mesh once; the copies count in the per-device bytes for
/// as long as the tensor keeps them.
fn replicated_copies_count_on_their_devices(d: &Device) {
    let mesh = Mesh::new(d, &[("dp", 4)]).unwrap();
    let live = || metrics::device_live_bytes().get(1).copied().unwrap_or(0);
    let x = Tensor::from_slice(&data(8 * 64, 31), &[8, 64], d)
        .unwrap()
        .shard(&mesh, &[Some("dp"), None])
        .unwrap();
    let w = Tensor::from_slice(&data(64 * 64, 32), &[64, 64], d).unwrap();
    w.realize().unwrap();
    let y = x.matmul(&w).unwrap();
    y.to_vec::<f32>().unwrap();
    drop(y);
    let with_copies = live();
    drop(w);
    assert_eq!(with_copies - live(), 64 * 64 * 4, "w's copy on device 1");
}

/// How a two-layer MLP is placed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    One,
    Ddp,
    Fsdp,
    TensorParallel,
}

/// 20 AdamW steps of `relu(x @ w1 + b1) @ w2 + b2` against `y`, placed as
/// `strategy` says; the losses.
fn mlp_losses(d: &Device, strategy: Strategy) -> Vec<f32> {
    let dp = Mesh::new(d, &[("dp", 4)]).unwrap();
    let grid = Mesh::new(d, &[("dp", 2), ("tp", 2)]).unwrap();
    let l1 = Linear::new(8, 16, true, 21, d).unwrap();
    let l2 = Linear::new(16, 4, true, 22, d).unwrap();
    let live = || {
        lazyfuse::metrics::device_live_bytes()
            .get(1)
            .copied()
            .unwrap_or(0)
    };
    let before = live();
    match strategy {
        Strategy::Ddp => {
            parallel::data_parallel(&l1, &dp).unwrap();
            parallel::data_parallel(&l2, &dp).unwrap();
        }
        Strategy::Fsdp => {
            parallel::fully_sharded(&l1, &dp, "dp").unwrap();
            parallel::fully_sharded(&l2, &dp, "dp").unwrap();
        }
        Strategy::TensorParallel => {
            parallel::column_parallel(&l1, &grid, "tp").unwrap();
            parallel::row_parallel(&l2, &grid, "tp").unwrap();
        }
        Strategy::One => {}
    }
    // Parameter bytes on device 1: all of them with DDP, a quarter with
    // FSDP (8x16 + 16 + 16x4 + 4 floats).
    let all = ((8 * 16 + 16 + 16 * 4 + 4) * 4) as u64;
    match strategy {
        Strategy::Ddp => assert_eq!(live() - before, all),
        Strategy::Fsdp => assert_eq!(live() - before, all / 4),
        _ => {}
    }
    let mut params = params_of(&l1.parameters());
    params.extend(params_of(&l2.parameters()));
    let mut opt = AdamW::new(params.clone(), 0.01, 0.01).unwrap();
    let (xs, ys) = (data(16 * 8, 8), data(16 * 4, 9));
    let mut losses = Vec::new();
    for _ in 0..20 {
        let mut x = Tensor::from_slice(&xs, &[16, 8], d).unwrap();
        let mut y = Tensor::from_slice(&ys, &[16, 4], d).unwrap();
        match strategy {
            Strategy::Ddp | Strategy::Fsdp => {
                x = x.shard(&dp, &[Some("dp"), None]).unwrap();
                y = y.shard(&dp, &[Some("dp"), None]).unwrap();
            }
            Strategy::TensorParallel => {
                x = x.shard(&grid, &[Some("dp"), None]).unwrap();
                y = y.shard(&grid, &[Some("dp"), None]).unwrap();
            }
            Strategy::One => {}
        }
        let h = l1.forward(&x).unwrap().relu().unwrap();
        let diff = l2.forward(&h).unwrap().sub(&y).unwrap();
        let loss = diff.mul(&diff).unwrap().mean(.., false).unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
        losses.push(loss.item::<f32>().unwrap());
    }
    if strategy == Strategy::Fsdp {
        // Every parameter (dimension 0 of 8, 16, 16 and 4 elements) stays
        // split over the 4 devices through 20 updates: 1/4 on each.
        for p in &params {
            let t = p.tensor();
            let s = t.sharding().unwrap().expect("on the mesh");
            assert_eq!(s.spec()[0], Some("dp"), "{:?}", t.dims());
            assert_eq!(s.shard_shape(t.shape()).dims()[0] * 4, t.dims()[0]);
        }
    }
    losses
}

fn every_strategy_trains_like_one_device(d: &Device) {
    let one = mlp_losses(d, Strategy::One);
    assert!(one[19] < one[0] * 0.9, "{one:?}");
    for s in [Strategy::Ddp, Strategy::Fsdp, Strategy::TensorParallel] {
        close(&mlp_losses(d, s), &one, &format!("{s:?} losses"));
    }
}

/// Resharding a value already on a mesh moves it between the devices
/// (here: the process-wide transfer counter sees no upload).
fn resharding_moves_values_between_devices_not_through_the_host(d: &Device) {
    let grid = Mesh::new(d, &[("dp", 2), ("tp", 2)]).unwrap();
    let xs = data(8 * 4, 11);
    let rows = Tensor::from_slice(&xs, &[8, 4], d)
        .unwrap()
        .shard(&grid, &[Some("dp"), None])
        .unwrap();
    let before = lazyfuse::metrics::snapshot();
    let specs: [[Option<&str>; 2]; 4] = [
        [None, Some("tp")],       // an all-to-all
        [Some("tp"), Some("dp")], // both axes
        [None, None],             // an all-gather
        [Some("dp"), None],       // back
    ];
    let mut t = rows.clone();
    for spec in specs {
        t = t.shard(&grid, &spec).unwrap();
        assert_eq!(t.sharding().unwrap().unwrap().spec(), spec);
    }
    let moved = lazyfuse::metrics::snapshot();
    assert_eq!(
        moved.h2d_transfers, before.h2d_transfers,
        "nothing uploaded"
    );
    // A computed value on the mesh reshards too (what it uploads is the
    // lifted scalar 2.0 and its copies, not the array).
    let y = rows
        .mul(2.0)
        .unwrap()
        .shard(&grid, &[None, Some("dp")])
        .unwrap();
    let after = lazyfuse::metrics::snapshot();
    assert!(
        after.h2d_bytes - moved.h2d_bytes < 8 * 4 * 4,
        "the array went through the host"
    );
    assert_eq!(t.to_vec::<f32>().unwrap(), xs);
    let twice: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), twice);
}
