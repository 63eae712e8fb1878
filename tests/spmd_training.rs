//! Training on sharded batches (issue 12): data-parallel SGD over a mesh
//! of logical CPU devices gives the single-device losses, and its step
//! compiles once. One test per binary: the compile counter is process-wide.

use lazyfuse::metrics;
use lazyfuse::nn::{Linear, Module};
use lazyfuse::optim::{params_of, Optimizer, Sgd};
use lazyfuse::{Device, Mesh, Tensor};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

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
        for _ in 0..6 {
            let before = metrics::snapshot().compiles;
            let mut x = Tensor::from_slice(&xs, &[16, 5], &d).unwrap();
            let mut y = Tensor::from_slice(&ys, &[16, 3], &d).unwrap();
            if sharded {
                x = x.shard(&mesh, &[Some("dp"), None]).unwrap();
                y = y.shard(&mesh, &[Some("dp"), None]).unwrap();
            }
            let diff = model.forward(&x).unwrap().sub(&y).unwrap();
            let loss = diff.mul(&diff).unwrap().mean_all().unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
            losses.push(loss.item::<f32>().unwrap());
            compiles.push(metrics::snapshot().compiles - before);
        }
        if sharded {
            assert_eq!(compiles[4..], [0, 0], "compiles per step: {compiles:?}");
        }
        losses
    };
    let single = train(false);
    let dp = train(true);
    close(&dp, &single, "losses");
    assert!(single[5] < single[0], "{single:?}");
}
