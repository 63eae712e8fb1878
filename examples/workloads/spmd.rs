//! Workloads on a mesh of logical CPU devices (issue 12): the same
//! training step as `defs::mlp_train_step`, data parallel over 4 devices
//! at the same global batch, to measure what SPMD costs over one device.

use super::defs::Step;
use lazyfuse::{Device, Mesh, Result, Tensor};

/// `mlp_train_step` with the batch of 256 split over `dp` = 4 devices and
/// the parameters replicated (`nn::parallel::data_parallel`): XLA
/// all-reduces the gradients. On the CPU plugin the 4 devices share the
/// host's cores.
pub fn mlp_train_step_ddp4(dev: &Device) -> Result<Step> {
    use lazyfuse::nn::{parallel, Linear, Module};
    use lazyfuse::optim::{params_of, Optimizer, Sgd};
    let dev = if dev.device_count() >= 4 && !dev.is_interpreter() {
        dev.clone()
    } else {
        Device::cpu_with_devices(4)?
    };
    let mesh = Mesh::new(&dev, &[("dp", 4)])?;
    let dims = [784usize, 1024, 1024, 10];
    let layers: Vec<Linear> = (0..3)
        .map(|i| {
            Linear::normal(
                dims[i],
                dims[i + 1],
                1.0 / (dims[i] as f64).sqrt(),
                40 + i as u64,
                &dev,
            )
        })
        .collect::<Result<_>>()?;
    let mut named = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        parallel::data_parallel(l, &mesh)?;
        named.extend(
            l.parameters()
                .into_iter()
                .map(|(n, p)| (format!("{i}.{n}"), p)),
        );
    }
    let mut opt = Sgd::new(params_of(&named), 0.01, 0.0, 0.0)?;
    let x = Tensor::randn(&[256, 784], 50, &dev)?.shard(&mesh, &[Some("dp"), None])?;
    let labels: Vec<i64> = (0..256).map(|i| (i * 7 % 10) as i64).collect();
    let y = Tensor::from_slice(&labels, &[256], &dev)?.shard(&mesh, &[Some("dp")])?;
    Ok(Box::new(move || {
        let mut h = x.clone();
        for (i, l) in layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i < 2 {
                h = h.relu()?;
            }
        }
        let loss = h.cross_entropy(&y, None)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        loss.realize()?;
        Ok(())
    }))
}
