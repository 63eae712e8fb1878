//! The workloads of `../shared/WORKLOADS.md`, written as plain eager lazyfuse
//! code exactly like the peers write them (`../shared/peers/workloads.py`).

use lazyfuse::{sync, DType, Device, Result, Tensor};

/// One timed iteration of a workload.
pub type Step = Box<dyn FnMut() -> Result<()>>;

/// One workload: its name and a constructor for its per-iteration closure.
pub struct Workload {
    pub name: &'static str,
    pub build: fn(&Device) -> Result<Step>,
}

/// Every workload the runner knows, in the order of WORKLOADS.md.
pub fn all() -> Vec<Workload> {
    vec![
        Workload {
            name: "gelu_chain",
            build: gelu_chain,
        },
        Workload {
            name: "layernorm_gelu",
            build: layernorm_gelu,
        },
        Workload {
            name: "mlp_train_step",
            build: mlp_train_step,
        },
        Workload {
            name: "adam_200_small",
            build: adam_200_small,
        },
        Workload {
            name: "transformer_block_fwd",
            build: transformer_block_fwd,
        },
        Workload {
            name: "decode_kv",
            build: decode_kv,
        },
        Workload {
            name: "moe_layer_fwd",
            build: moe_layer_fwd,
        },
        Workload {
            name: "resnet18_train_step",
            build: resnet18_train_step,
        },
        Workload {
            name: "dlrm_train_step",
            build: dlrm_train_step,
        },
        Workload {
            name: "unet_fwd",
            build: unet_fwd,
        },
        Workload {
            name: "embedding_bag_10m_train_step",
            build: embedding_bag_10m_train_step,
        },
        // Not in WORKLOADS.md: mlp_train_step data parallel over 4 devices.
        Workload {
            name: "mlp_train_step_ddp4",
            build: mlp_train_step_ddp4,
        },
    ]
}

/// True for workloads whose peers are this repository's
/// (`scripts/peers/more_workloads.py`), not the shared peers script.
pub fn repo_peers(name: &str) -> bool {
    name == "moe_layer_fwd"
        || name == "resnet18_train_step"
        || name == "dlrm_train_step"
        || name == "unet_fwd"
        || name == "embedding_bag_10m_train_step"
}

/// True for workloads the peers do not define (not in WORKLOADS.md).
pub fn lazyfuse_only(name: &str) -> bool {
    name == "mlp_train_step_ddp4"
}

const GELU_C: f64 = 0.7978845608028654;

/// The tanh-approximation GELU spelled out in primitive ops (as the peers do).
fn gelu(x: &Tensor) -> Result<Tensor> {
    let x3 = x.mul(x)?.mul(x)?;
    let inner = x.add(&x3.mul(0.044715)?)?.mul(GELU_C)?;
    x.mul(0.5)?.mul(&inner.tanh()?.add(1.0)?)
}

fn materialized(t: Tensor) -> Result<Tensor> {
    t.realize()?;
    Ok(t)
}

fn gelu_chain(dev: &Device) -> Result<Step> {
    let x = Tensor::randn(&[1 << 20], 0, dev)?;
    Ok(Box::new(move || {
        gelu(&x)?.realize()?;
        Ok(())
    }))
}

fn layer_norm(h: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mu = h.mean([-1], true)?;
    let c = h.sub(&mu)?;
    let var = c.mul(&c)?.mean([-1], true)?;
    c.div(&var.add(1e-5)?.sqrt()?)?.mul(g)?.add(b)
}

fn layernorm_gelu(dev: &Device) -> Result<Step> {
    let x = Tensor::randn(&[512, 1024], 1, dev)?;
    let g = Tensor::randn(&[1024], 2, dev)?;
    let b = Tensor::randn(&[1024], 3, dev)?;
    Ok(Box::new(move || {
        let h = layer_norm(&x, &g, &b)?;
        gelu(&h)?.add(&x)?.realize()?;
        Ok(())
    }))
}

fn mlp_train_step(dev: &Device) -> Result<Step> {
    use lazyfuse::nn::{Linear, Module};
    use lazyfuse::optim::{params_of, Optimizer, Sgd};
    let dims = [784usize, 1024, 1024, 10];
    let layers: Vec<Linear> = (0..3)
        .map(|i| {
            Linear::normal(
                dims[i],
                dims[i + 1],
                1.0 / (dims[i] as f64).sqrt(),
                40 + i as u64,
                dev,
            )
        })
        .collect::<Result<_>>()?;
    let mut named = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        named.extend(
            l.parameters()
                .into_iter()
                .map(|(n, p)| (format!("{i}.{n}"), p)),
        );
    }
    let mut opt = Sgd::new(params_of(&named), 0.01, 0.0, 0.0)?;
    let x = materialized(Tensor::randn(&[256, 784], 50, dev)?)?;
    let labels: Vec<i64> = (0..256).map(|i| (i * 7 % 10) as i64).collect();
    let y = Tensor::from_slice(&labels, &[256], dev)?;
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

fn adam_200_small(dev: &Device) -> Result<Step> {
    let n = 200;
    let mut p: Vec<Tensor> = (0..n)
        .map(|i| Tensor::randn(&[64, 64], 10 + i, dev))
        .collect::<Result<_>>()?;
    let g: Vec<Tensor> = (0..n)
        .map(|i| materialized(Tensor::randn(&[64, 64], 1000 + i, dev)?.mul(0.01)?))
        .collect::<Result<_>>()?;
    let mut m: Vec<Tensor> = (0..n)
        .map(|_| materialized(Tensor::zeros(&[64, 64], DType::F32, dev)?))
        .collect::<Result<_>>()?;
    let mut v = m.clone();
    let mut t = 0i32;
    let (b1, b2, lr, eps, wd) = (0.9f64, 0.999f64, 1e-3f64, 1e-8f64, 0.01f64);
    Ok(Box::new(move || {
        t += 1;
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for i in 0..n as usize {
            m[i] = m[i].mul(b1)?.add(&g[i].mul(1.0 - b1)?)?;
            v[i] = v[i].mul(b2)?.add(&g[i].mul(&g[i])?.mul(1.0 - b2)?)?;
            let mh = m[i].div(bc1)?;
            let vh = v[i].div(bc2)?;
            let upd = mh.div(&vh.sqrt()?.add(eps)?)?.add(&p[i].mul(wd)?)?;
            p[i] = p[i].sub(&upd.mul(lr)?)?;
        }
        // Like torch_xla.sync(): materialise every parameter and moment.
        sync();
        p[n as usize - 1].realize()?;
        Ok(())
    }))
}

fn transformer_block_fwd(dev: &Device) -> Result<Step> {
    let (b, t, c, nh) = (8usize, 128usize, 256usize, 4usize);
    let hd = c / nh;
    let lin = |i: usize, o: usize, seed: u64| -> Result<Tensor> {
        materialized(Tensor::randn(&[i, o], seed, dev)?.mul(1.0 / (i as f64).sqrt())?)
    };
    let x = Tensor::randn(&[b, t, c], 20, dev)?;
    let (wqkv, wo, w1, w2) = (
        lin(c, 3 * c, 21)?,
        lin(c, c, 22)?,
        lin(c, 4 * c, 23)?,
        lin(4 * c, c, 24)?,
    );
    let zeros = |n: usize| materialized(Tensor::zeros(&[n], DType::F32, dev)?);
    let (bqkv, bo, b1, b2) = (zeros(3 * c)?, zeros(c)?, zeros(4 * c)?, zeros(c)?);
    let ln_g = materialized(Tensor::ones(&[c], DType::F32, dev)?)?;
    let ln_b = zeros(c)?;
    // Causal mask: true above the diagonal (masked out).
    let r = Tensor::arange(0.0, t as f64, DType::I32, dev)?;
    let mask = materialized(r.unsqueeze(1)?.lt(&r.unsqueeze(0)?)?)?;
    let neg_inf = materialized(Tensor::full(f64::NEG_INFINITY, &[], DType::F32, dev)?)?;
    Ok(Box::new(move || {
        let h = layer_norm(&x, &ln_g, &ln_b)?;
        let qkv = h.matmul(&wqkv)?.add(&bqkv)?;
        let heads = |k: usize| -> Result<Tensor> {
            qkv.narrow(-1, k * c, c)?
                .reshape(&[b, t, nh, hd])?
                .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let att = q
            .matmul(&k.transpose(-2, -1)?)?
            .mul(1.0 / (hd as f64).sqrt())?;
        let att = mask.where_cond(&neg_inf, &att)?;
        let e = att.sub(&att.max([-1], true)?)?.exp()?;
        let att = e.div(&e.sum([-1], true)?)?;
        let y = att
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, t, c])?;
        let x1 = x.add(&y.matmul(&wo)?.add(&bo)?)?;
        let h2 = layer_norm(&x1, &ln_g, &ln_b)?;
        let y2 = gelu(&h2.matmul(&w1)?.add(&b1)?)?.matmul(&w2)?.add(&b2)?;
        x1.add(&y2)?.realize()?;
        Ok(())
    }))
}

/// One decoder block's weights (`decode_kv`).
struct Layer {
    ln1_g: Tensor,
    ln1_b: Tensor,
    wqkv: Tensor,
    bqkv: Tensor,
    wo: Tensor,
    bo: Tensor,
    ln2_g: Tensor,
    ln2_b: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

/// Greedy generation with a KV cache grown by `cat`, the way Hugging Face's
/// dynamic cache does it: no padding, the next token read on the host.
// The body counts positions by hand, as generation loops are written.
#[allow(clippy::explicit_counter_loop)]
fn decode_kv(dev: &Device) -> Result<Step> {
    let (vocab, c, nh, n_layer, ctx, new_tokens) = (512usize, 256, 4, 2, 128, 96);
    let hd = c / nh;
    let dev = dev.clone();
    let mut seed = 30;
    let mut w = |dims: &[usize]| -> Result<Tensor> {
        seed += 1;
        materialized(Tensor::randn(dims, seed, &dev)?.mul(0.02)?)
    };
    let ones = |n: usize| materialized(Tensor::ones(&[n], DType::F32, &dev)?);
    let zeros = |n: usize| materialized(Tensor::zeros(&[n], DType::F32, &dev)?);
    let (wte, wpe, head) = (w(&[vocab, c])?, w(&[ctx, c])?, w(&[c, vocab])?);
    let (lnf_g, lnf_b) = (ones(c)?, zeros(c)?);
    let mut layers = Vec::new();
    for _ in 0..n_layer {
        layers.push(Layer {
            ln1_g: ones(c)?,
            ln1_b: zeros(c)?,
            wqkv: w(&[c, 3 * c])?,
            bqkv: zeros(3 * c)?,
            wo: w(&[c, c])?,
            bo: zeros(c)?,
            ln2_g: ones(c)?,
            ln2_b: zeros(c)?,
            w1: w(&[c, 4 * c])?,
            b1: zeros(4 * c)?,
            w2: w(&[4 * c, c])?,
            b2: zeros(c)?,
        });
    }
    let forward = move |ids: &[i64],
                        pos0: usize,
                        cache: &mut Vec<Option<(Tensor, Tensor)>>|
          -> Result<Tensor> {
        let t = ids.len();
        let idx = Tensor::from_slice(ids, &[t], &dev)?;
        let mut x = wte.index_select(0, &idx)?.add(&wpe.narrow(0, pos0, t)?)?;
        for (li, lp) in layers.iter().enumerate() {
            let h = layer_norm(&x, &lp.ln1_g, &lp.ln1_b)?;
            let qkv = h.matmul(&lp.wqkv)?.add(&lp.bqkv)?;
            let heads = |k: usize| -> Result<Tensor> {
                qkv.narrow(-1, k * c, c)?
                    .reshape(&[t, nh, hd])?
                    .transpose(0, 1)
            };
            let (q, mut k, mut v) = (heads(0)?, heads(1)?, heads(2)?);
            if let Some((past_k, past_v)) = &cache[li] {
                k = Tensor::cat(&[past_k, &k], 1)?;
                v = Tensor::cat(&[past_v, &v], 1)?;
            }
            cache[li] = Some((k.clone(), v.clone()));
            let s = k.dims()[1];
            let mut att = q
                .matmul(&k.transpose(-2, -1)?)?
                .mul(1.0 / (hd as f64).sqrt())?;
            if t > 1 {
                // Query i sees keys up to i + (s - t).
                let rows = Tensor::arange(0.0, t as f64, DType::I32, &dev)?.add((s - t) as f64)?;
                let cols = Tensor::arange(0.0, s as f64, DType::I32, &dev)?;
                let mask = rows.unsqueeze(1)?.lt(&cols.unsqueeze(0)?)?;
                att = att.masked_fill(&mask, f64::NEG_INFINITY)?;
            }
            let y = att
                .softmax(-1)?
                .matmul(&v)?
                .transpose(0, 1)?
                .reshape(&[t, c])?;
            x = x.add(&y.matmul(&lp.wo)?.add(&lp.bo)?)?;
            let m = gelu(
                &layer_norm(&x, &lp.ln2_g, &lp.ln2_b)?
                    .matmul(&lp.w1)?
                    .add(&lp.b1)?,
            )?;
            x = x.add(&m.matmul(&lp.w2)?.add(&lp.b2)?)?;
        }
        layer_norm(&x.narrow(0, t - 1, 1)?, &lnf_g, &lnf_b)?.matmul(&head)
    };
    let mut iteration = 0;
    Ok(Box::new(move || {
        let p = 8 + (7 * iteration) % 24;
        let prompt: Vec<i64> = (0..p)
            .map(|j| ((3 * j + iteration) % vocab) as i64)
            .collect();
        iteration += 1;
        let mut cache = vec![None; n_layer];
        let mut logits = forward(&prompt, 0, &mut cache)?;
        let mut pos = p;
        let mut out = Vec::with_capacity(new_tokens);
        for _ in 0..new_tokens {
            let tok = logits.argmax(-1, false)?.to_vec::<i64>()?[0];
            out.push(tok);
            logits = forward(&[tok], pos, &mut cache)?;
            pos += 1;
        }
        Ok(())
    }))
}

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
    let mesh = lazyfuse::Mesh::new(&dev, &[("dp", 4)])?;
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

/// A Mixtral-style mixture-of-experts layer: 512 tokens, hidden 512, 8
/// SwiGLU experts of 1024, top-2 softmax routing renormalised; the
/// token-expert pairs grouped by expert and run through two ragged products.
fn moe_layer_fwd(dev: &Device) -> Result<Step> {
    let (tokens, hidden, experts, inter, top_k) = (512usize, 512usize, 8usize, 1024usize, 2usize);
    let x = Tensor::randn(&[tokens, hidden], 40, dev)?;
    let scaled = |dims: &[usize], fan_in: usize, seed: u64| -> Result<Tensor> {
        materialized(Tensor::randn(dims, seed, dev)?.mul(1.0 / (fan_in as f64).sqrt())?)
    };
    let router = scaled(&[hidden, experts], hidden, 41)?;
    let w_gate_up = scaled(&[experts, hidden, 2 * inter], hidden, 42)?;
    let w_down = scaled(&[experts, inter, hidden], inter, 43)?;
    Ok(Box::new(move || {
        let probs = x.matmul(&router)?.softmax(-1)?;
        let (weights, chosen) = probs.topk(top_k)?;
        let weights = weights.div(&weights.sum([-1], true)?)?;
        let (order, positions, sizes) = chosen.reshape(&[tokens * top_k])?.group_by(experts)?;
        let token_of_row = order.div(top_k as f64)?;
        let xs = x.index_select(0, &token_of_row)?;
        let gate_up = xs.ragged_dot(&w_gate_up, &sizes)?;
        let gate = gate_up.narrow(-1, 0, inter)?;
        let up = gate_up.narrow(-1, inter, inter)?;
        let act = gate.mul(&gate.sigmoid()?)?.mul(&up)?;
        let ys = act.ragged_dot(&w_down, &sizes)?;
        let out = ys
            .index_select(0, &positions)?
            .reshape(&[tokens, top_k, hidden])?
            .mul(&weights.unsqueeze(-1)?)?
            .sum([1], false)?;
        out.realize()?;
        Ok(())
    }))
}

/// One SGD step (momentum 0.9, weight decay 1e-4) of torchvision's
/// ResNet-18 in training mode on a batch of 16 64x64 images, 10 classes.
fn resnet18_train_step(dev: &Device) -> Result<Step> {
    use lazyfuse::nn::Module;
    use lazyfuse::optim::{params_of, Optimizer, Sgd};
    let model = lazyfuse_models::ResNet::resnet18(10, 50, dev)
        .map_err(|e| lazyfuse::Error::Internal(e.to_string()))?;
    let mut opt = Sgd::new(params_of(&model.parameters()), 0.01, 0.9, 1e-4)?;
    let x = Tensor::randn(&[16, 3, 64, 64], 51, dev)?;
    let labels: Vec<i64> = (0..16).map(|i| (i * 7 % 10) as i64).collect();
    let y = Tensor::from_slice(&labels, &[16], dev)?;
    Ok(Box::new(move || {
        opt.zero_grad();
        let loss = model.forward(&x)?.cross_entropy(&y, None)?;
        loss.backward()?;
        opt.step()?;
        loss.realize()?;
        Ok(())
    }))
}

/// One training step of a DLRM with eight tables (the largest of 1M rows,
/// dim 16), batch 128 of one id per table: binary cross-entropy, SGD on the
/// MLPs and sparse SGD on the rows read.
fn dlrm_train_step(dev: &Device) -> Result<Step> {
    use lazyfuse::optim::{params_of, Optimizer, Sgd, SparseSgd};
    use lazyfuse_models::{Dlrm, DlrmConfig};
    let err = |e: lazyfuse_models::ModelError| lazyfuse::Error::Internal(e.to_string());
    let tables = vec![1_000_000, 100_000, 10_000, 1000, 100, 100, 10, 10];
    let cfg = DlrmConfig {
        bottom: vec![13, 64, 16],
        tables: tables.clone(),
        top_hidden: vec![64, 1],
    };
    let model = Dlrm::new(&cfg, 60, dev).map_err(err)?;
    let mut opt = Sgd::new(params_of(&model.dense_parameters()), 0.1, 0.0, 0.0)?;
    let sparse_opt = SparseSgd::new(0.1);
    let batch = 128;
    let dense = Tensor::randn(&[batch, 13], 61, dev)?;
    let offsets = Tensor::arange(0.0, batch as f64, DType::I64, dev)?;
    let sparse: Vec<(Tensor, Tensor)> = tables
        .iter()
        .enumerate()
        .map(|(k, &rows)| {
            let ids: Vec<i64> = (0..batch)
                .map(|i| ((i * 7919 + k * 104_729) % rows) as i64)
                .collect();
            Ok((Tensor::from_slice(&ids, &[batch], dev)?, offsets.clone()))
        })
        .collect::<Result<_>>()?;
    let clicks: Vec<f32> = (0..batch).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let y = Tensor::from_slice(&clicks, &[batch], dev)?;
    Ok(Box::new(move || {
        opt.zero_grad();
        let p = model.forward(&dense, &sparse).map_err(err)?;
        let loss = p.binary_cross_entropy(&y)?;
        loss.backward()?;
        opt.step()?;
        let tables: Vec<_> = model.tables.iter().collect();
        sparse_opt.step(&tables)?;
        loss.realize()?;
        Ok(())
    }))
}

/// A small diffusers UNet2DModel (DDPM-CIFAR's block layout at half width:
/// 64-128-128 channels, two residual blocks per level, attention at 16x16
/// and in the mid block), one denoiser call on 4 samples of 3x32x32 at
/// timestep 500, without gradients.
pub const UNET_FWD_CONFIG: &str = r#"{
    "sample_size": 32, "in_channels": 3, "out_channels": 3,
    "block_out_channels": [64, 128, 128], "layers_per_block": 2,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "AttnUpBlock2D", "UpBlock2D"],
    "norm_num_groups": 32, "attention_head_dim": 8
}"#;

fn unet_fwd(dev: &Device) -> Result<Step> {
    use lazyfuse_models::{UNet2DConfig, UNet2DModel};
    let err = |e: lazyfuse_models::ModelError| lazyfuse::Error::Internal(e.to_string());
    let config = UNet2DConfig::from_json(UNET_FWD_CONFIG).map_err(err)?;
    let model = UNet2DModel::random(config, 70, dev).map_err(err)?;
    let x = Tensor::randn(&[4, 3, 32, 32], 71, dev)?;
    let t = Tensor::from_slice(&[500i64], &[1], dev)?;
    Ok(Box::new(move || {
        let _no_grad = lazyfuse::NoGradGuard::new();
        let y = model.forward(&x, &t).map_err(err)?;
        y.realize()?;
        Ok(())
    }))
}

/// One training step of a 10M-row, 16-wide embedding table (640 MB) with
/// sparse gradients: 2048 bags of 8 ids, summed, a linear head and binary
/// cross-entropy; SGD on the head, sparse SGD on the 16K rows read. The
/// report's step peak shows no table-sized gradient is made.
fn embedding_bag_10m_train_step(dev: &Device) -> Result<Step> {
    use lazyfuse::nn::{EmbeddingBag, Linear, Module};
    use lazyfuse::optim::{params_of, Optimizer, Sgd, SparseSgd};
    let (rows, bags, per) = (10_000_000, 2048, 8);
    let table = EmbeddingBag::new(rows, 16, false, true, 80, dev)?;
    let head = Linear::new(16, 1, true, 81, dev)?;
    let mut opt = Sgd::new(params_of(&head.parameters()), 0.1, 0.0, 0.0)?;
    let sparse_opt = SparseSgd::new(0.1);
    let ids: Vec<i64> = (0..bags * per)
        .map(|i| ((i * 7_919_993) % rows) as i64)
        .collect();
    let ids = Tensor::from_slice(&ids, &[bags * per], dev)?;
    let offsets = Tensor::arange_step(0.0, (bags * per) as f64, per as f64, DType::I64, dev)?;
    let labels: Vec<f32> = (0..bags).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let y = Tensor::from_slice(&labels, &[bags], dev)?;
    Ok(Box::new(move || {
        opt.zero_grad();
        let x = table.forward_bags(&ids, &offsets, None)?;
        let p = head.forward(&x)?.sigmoid()?.reshape(&[bags])?;
        let loss = p.binary_cross_entropy(&y)?;
        loss.backward()?;
        opt.step()?;
        sparse_opt.step(&[&table])?;
        loss.realize()?;
        Ok(())
    }))
}
