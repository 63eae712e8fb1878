//! The convolutions of ResNet-18 and the `unet_fwd` UNet one at a time:
//! forward, and forward with both gradients (a training step's three
//! convolutions), the 10th percentile of 20 timed runs each (ms). Run it
//! with `LAZYFUSE_HOST_KERNELS=0` and without to compare XLA's CPU
//! convolution with lazyfuse's host convolution (`lower/conv.rs` chooses
//! between them):
//!
//! ```text
//! cargo run --release --example conv_timings
//! LAZYFUSE_HOST_KERNELS=0 cargo run --release --example conv_timings
//! ```

use lazyfuse::{Device, FusionGuard, Result, Tensor};
use std::time::Instant;

const RUNS: usize = 20;

/// The 10th percentile of `RUNS` timed calls of `f` (after 3 untimed), ms.
fn p10(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let mut ts = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t0 = Instant::now();
        f()?;
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[RUNS / 10])
}

/// `(name, [n, c, h, w], [o, k], stride, padding)`.
type Case = (&'static str, [usize; 4], [usize; 2], usize, usize);

const CASES: &[Case] = &[
    ("resnet stem 7x7/2", [16, 3, 64, 64], [64, 7], 2, 3),
    ("resnet 64ch 16x16", [16, 64, 16, 16], [64, 3], 1, 1),
    ("resnet 128ch 8x8 /2", [16, 64, 16, 16], [128, 3], 2, 1),
    ("resnet 128ch 8x8", [16, 128, 8, 8], [128, 3], 1, 1),
    ("resnet 256ch 4x4", [16, 256, 4, 4], [256, 3], 1, 1),
    ("resnet 512ch 2x2", [16, 512, 2, 2], [512, 3], 1, 1),
    ("resnet 1x1/2 shortcut", [16, 64, 16, 16], [128, 1], 2, 0),
    ("unet 64ch 32x32", [4, 64, 32, 32], [64, 3], 1, 1),
    ("unet 128ch 16x16", [4, 128, 16, 16], [128, 3], 1, 1),
    ("unet 256->128 32x32", [4, 256, 32, 32], [128, 3], 1, 1),
    ("unet 1x1 192->128", [4, 192, 16, 16], [128, 1], 1, 0),
];

fn main() -> Result<()> {
    let dev = Device::cpu()?;
    let _fused = FusionGuard::new(true);
    println!("{:<24} {:>9} {:>11}", "convolution", "forward", "fwd+grads");
    for (i, &(name, [n, c, h, w], [o, k], s, p)) in CASES.iter().enumerate() {
        let seed = 10 * i as u64;
        let x = Tensor::randn(&[n, c, h, w], seed, &dev)?;
        let wt = Tensor::randn(&[o, c, k, k], seed + 1, &dev)?.mul(0.05)?;
        x.realize()?;
        wt.realize()?;
        let fwd = p10(|| {
            x.conv2d(&wt, None, (s, s), (p, p), (1, 1), 1)?.realize()?;
            Ok(())
        })?;
        // A random output gradient (a sum's all-ones gradient would let
        // XLA simplify the gradient convolutions).
        let out = x.conv2d(&wt, None, (s, s), (p, p), (1, 1), 1)?;
        let dy = Tensor::rand(out.dims(), seed + 2, &dev)?;
        dy.realize()?;
        let xg = x.detach()?.with_grad()?;
        let wg = wt.detach()?.with_grad()?;
        let both = p10(|| {
            let y = xg.conv2d(&wg, None, (s, s), (p, p), (1, 1), 1)?;
            y.mul(&dy)?.sum([0, 1, 2, 3], false)?.backward()?;
            let (gx, gw) = (xg.grad().expect("x grad"), wg.grad().expect("w grad"));
            gx.realize()?;
            gw.realize()?;
            xg.zero_grad();
            wg.zero_grad();
            Ok(())
        })?;
        println!("{name:<24} {fwd:>9.3} {both:>11.3}");
    }
    Ok(())
}
