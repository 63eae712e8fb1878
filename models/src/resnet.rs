//! ResNet in torchvision's layout: basic blocks (ResNet-18/34) or
//! bottlenecks with the stride on the 3x3 convolution (ResNet-50/101/152,
//! torchvision's "v1.5"), loaded from a safetensors state dict with
//! torchvision's parameter names (`conv1.weight`, `bn1.running_mean`,
//! `layer1.0.conv1.weight`, `layer2.0.downsample.0.weight`, `fc.bias`).
//!
//! The architecture is read off the weights: the block kind from whether
//! `layer1.0.conv3` exists, the depth from the block indices, every width
//! from the kernels' shapes. So the same loader serves ResNet-18 to -152
//! and narrow test models, with no config file (torchvision has none).

use crate::weights::Checkpoint;
use crate::{ModelError, Result};
use lazyfuse::nn::{join, BatchNorm, Linear, Module, Param};
use lazyfuse::{Device, Tensor};
use std::path::Path;

fn ck(msg: impl Into<String>) -> ModelError {
    ModelError::Checkpoint(msg.into())
}

/// A bias-free convolution followed by batch norm (every convolution of a
/// torchvision ResNet).
struct ConvBn {
    weight: Param,
    stride: usize,
    padding: usize,
    bn: BatchNorm,
}

impl ConvBn {
    /// `conv` (`[o, i, k, k]`) and batch norm `bn` from the checkpoint.
    fn load(c: &Checkpoint, dev: &Device, conv: &str, bn: &str, stride: usize) -> Result<ConvBn> {
        let name = format!("{conv}.weight");
        let shape = c
            .shape(&name)
            .ok_or_else(|| ck(format!("checkpoint has no {name:?}")))?;
        if shape.len() != 4 {
            return Err(ck(format!(
                "{name:?} must be a 2-D convolution kernel, got {shape:?}"
            )));
        }
        let o = shape[0];
        let t = |n: &str, dims: &[usize]| -> Result<Tensor> {
            Ok(Tensor::from_slice(&c.f32(n, dims)?, dims, dev)?)
        };
        let v = |field: &str| t(&format!("{bn}.{field}"), &[o]);
        Ok(ConvBn {
            weight: Param::new(t(&name, &shape)?)?,
            stride,
            padding: shape[2] / 2,
            bn: BatchNorm::from_tensors(
                Some(v("weight")?),
                Some(v("bias")?),
                v("running_mean")?,
                v("running_var")?,
                1e-5,
                0.1,
            )?,
        })
    }

    /// A fresh `k x k` convolution from `cin` to `cout` channels, weights
    /// drawn as torchvision does (He normal over the fan-out), and a batch
    /// norm at scale 1, shift 0.
    fn random(
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        seed: u64,
        dev: &Device,
    ) -> Result<ConvBn> {
        let std = (2.0 / (cout * k * k) as f64).sqrt();
        let w = Tensor::randn(&[cout, cin, k, k], seed, dev)?.mul(std)?;
        Ok(ConvBn {
            weight: Param::new(w)?,
            stride,
            padding: k / 2,
            bn: BatchNorm::new(cout, dev)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (s, p) = (self.stride, self.padding);
        let y = x.conv2d(&self.weight.tensor(), None, (s, s), (p, p), (1, 1), 1)?;
        Ok(self.bn.forward(&y)?)
    }

    fn visit(&self, conv: &str, bn: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(conv, "weight"), self.weight.clone()));
        self.bn.visit_params(bn, out);
    }

    fn batch_norms<'a>(&'a self, bn: &str, out: &mut Vec<(String, &'a BatchNorm)>) {
        out.push((bn.to_string(), &self.bn));
    }
}

/// One residual block: two (basic) or three (bottleneck) convolutions and
/// an optional projection of the shortcut.
struct Block {
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, c) in self.convs.iter().enumerate() {
            h = c.forward(&h)?;
            if i + 1 < self.convs.len() {
                h = h.relu()?;
            }
        }
        let shortcut = match &self.downsample {
            Some(d) => d.forward(x)?,
            None => x.clone(),
        };
        Ok(h.add(&shortcut)?.relu()?)
    }
}

/// A torchvision ResNet: the stem (7x7 convolution, batch norm, ReLU, 3x3
/// max pool), four stages of residual blocks, global average pooling and
/// the classifier. Training mode (batch statistics, running-statistic
/// updates) is on after loading, as in PyTorch; [`Module::set_train`]
/// switches it.
pub struct ResNet {
    stem: ConvBn,
    stages: Vec<Vec<Block>>,
    fc: Linear,
}

impl ResNet {
    /// torchvision's `resnet18()`: basic blocks 2-2-2-2, freshly
    /// initialised from `seed` as torchvision initialises it.
    pub fn resnet18(classes: usize, seed: u64, dev: &Device) -> Result<ResNet> {
        ResNet::random(false, [2, 2, 2, 2], classes, seed, dev)
    }

    /// torchvision's `resnet50()`: bottlenecks 3-4-6-3.
    pub fn resnet50(classes: usize, seed: u64, dev: &Device) -> Result<ResNet> {
        ResNet::random(true, [3, 4, 6, 3], classes, seed, dev)
    }

    /// A fresh ResNet of basic blocks or bottlenecks, `blocks` per stage,
    /// with torchvision's widths (64, 128, 256, 512 planes).
    pub fn random(
        bottleneck: bool,
        blocks: [usize; 4],
        classes: usize,
        seed: u64,
        dev: &Device,
    ) -> Result<ResNet> {
        ResNet::random_with_width(bottleneck, blocks, 64, classes, seed, dev)
    }

    /// [`ResNet::random`] with `width` planes in the first stage (doubling
    /// per stage) instead of 64: the same architecture, narrower.
    pub fn random_with_width(
        bottleneck: bool,
        blocks: [usize; 4],
        width: usize,
        classes: usize,
        seed: u64,
        dev: &Device,
    ) -> Result<ResNet> {
        let mut next = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut seed = || {
            next = lazyfuse::ir::splitmix64(next);
            next
        };
        let stem = ConvBn::random(3, width, 7, 2, seed(), dev)?;
        let expansion = if bottleneck { 4 } else { 1 };
        let mut cin = width;
        let mut stages = Vec::new();
        for (s, &n) in blocks.iter().enumerate() {
            let planes = width << s;
            let out = planes * expansion;
            let mut stage = Vec::new();
            for b in 0..n {
                let stride = if s > 0 && b == 0 { 2 } else { 1 };
                let convs = if bottleneck {
                    vec![
                        ConvBn::random(cin, planes, 1, 1, seed(), dev)?,
                        ConvBn::random(planes, planes, 3, stride, seed(), dev)?,
                        ConvBn::random(planes, out, 1, 1, seed(), dev)?,
                    ]
                } else {
                    vec![
                        ConvBn::random(cin, planes, 3, stride, seed(), dev)?,
                        ConvBn::random(planes, planes, 3, 1, seed(), dev)?,
                    ]
                };
                let downsample = if stride != 1 || cin != out {
                    Some(ConvBn::random(cin, out, 1, stride, seed(), dev)?)
                } else {
                    None
                };
                stage.push(Block { convs, downsample });
                cin = out;
            }
            stages.push(stage);
        }
        let fc = Linear::new(cin, classes, true, seed(), dev)?;
        Ok(ResNet { stem, stages, fc })
    }

    /// Loads `dir/model.safetensors` (or a sharded checkpoint with its
    /// index) holding a torchvision ResNet state dict. A missing or
    /// misshapen tensor is an `Err` naming it.
    pub fn load(dir: &Path, dev: &Device) -> Result<ResNet> {
        let c = Checkpoint::open(dir)?;
        let bottleneck = c.contains("layer1.0.conv3.weight");
        let n_convs = if bottleneck { 3 } else { 2 };
        let stem = ConvBn::load(&c, dev, "conv1", "bn1", 2)?;
        let mut stages = Vec::new();
        for s in 1..=4 {
            let mut blocks = Vec::new();
            while c.contains(&format!("layer{s}.{}.conv1.weight", blocks.len())) {
                let b = blocks.len();
                let stride = if s > 1 && b == 0 { 2 } else { 1 };
                let p = format!("layer{s}.{b}");
                // The stride sits on conv1 of a basic block, conv2 of a bottleneck.
                let on = if bottleneck { 2 } else { 1 };
                let convs = (1..=n_convs)
                    .map(|i| {
                        let st = if i == on { stride } else { 1 };
                        ConvBn::load(&c, dev, &format!("{p}.conv{i}"), &format!("{p}.bn{i}"), st)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let downsample = if c.contains(&format!("{p}.downsample.0.weight")) {
                    Some(ConvBn::load(
                        &c,
                        dev,
                        &format!("{p}.downsample.0"),
                        &format!("{p}.downsample.1"),
                        stride,
                    )?)
                } else {
                    None
                };
                blocks.push(Block { convs, downsample });
            }
            if blocks.is_empty() {
                return Err(ck(format!(
                    "checkpoint has no layer{s}.0 (a ResNet has four stages)"
                )));
            }
            stages.push(blocks);
        }
        let fc_shape = c
            .shape("fc.weight")
            .ok_or_else(|| ck("checkpoint has no \"fc.weight\""))?;
        let [classes, width] = fc_shape[..] else {
            return Err(ck(format!(
                "\"fc.weight\" must be [classes, c], got {fc_shape:?}"
            )));
        };
        // Trainable, unlike the loader's frozen inference weights.
        let frozen = crate::weights::Loader { ck: &c, dev }.linear("fc", width, classes, true)?;
        let fc = Linear {
            weight: Param::new(frozen.weight.tensor())?,
            bias: frozen.bias.map(|b| Param::new(b.tensor())).transpose()?,
        };
        Ok(ResNet { stem, stages, fc })
    }

    /// Logits `[n, classes]` of images `[n, 3, h, w]`.
    pub fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.stem.forward(x)?.relu()?;
        let mut h = h.max_pool2d_with_indices((3, 3), (2, 2), (1, 1))?.0;
        for stage in &self.stages {
            for b in stage {
                h = b.forward(&h)?;
            }
        }
        Ok(self.fc.forward(&h.mean([2, 3], false)?)?)
    }

    /// Every batch norm with its state-dict prefix (`layer1.0.bn1`), for
    /// reading running statistics.
    pub fn batch_norms(&self) -> Vec<(String, &BatchNorm)> {
        let mut out = Vec::new();
        self.stem.batch_norms("bn1", &mut out);
        for (s, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                let p = format!("layer{}.{b}", s + 1);
                for (i, c) in block.convs.iter().enumerate() {
                    c.batch_norms(&format!("{p}.bn{}", i + 1), &mut out);
                }
                if let Some(d) = &block.downsample {
                    d.batch_norms(&format!("{p}.downsample.1"), &mut out);
                }
            }
        }
        out
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> lazyfuse::Result<Tensor> {
        self.logits(x).map_err(|e| match e {
            ModelError::Tensor(t) => t,
            other => lazyfuse::Error::Internal(other.to_string()),
        })
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        self.stem
            .visit(&join(prefix, "conv1"), &join(prefix, "bn1"), out);
        for (s, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                let p = join(prefix, &format!("layer{}.{b}", s + 1));
                for (i, c) in block.convs.iter().enumerate() {
                    c.visit(
                        &format!("{p}.conv{}", i + 1),
                        &format!("{p}.bn{}", i + 1),
                        out,
                    );
                }
                if let Some(d) = &block.downsample {
                    d.visit(
                        &format!("{p}.downsample.0"),
                        &format!("{p}.downsample.1"),
                        out,
                    );
                }
            }
        }
        self.fc.visit_params(&join(prefix, "fc"), out);
    }

    fn set_train(&self, train: bool) {
        for (_, bn) in self.batch_norms() {
            bn.set_train(train);
        }
    }
}
