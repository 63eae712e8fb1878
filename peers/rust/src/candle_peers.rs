//! The workloads in candle, after `../shared/peers/workloads.py`'s torch
//! versions (same shapes, same math, the same decode loop growing its KV
//! cache with `cat`).

use candle_core::{DType, Device, Module, Result, Tensor, Var, D};
use candle_nn::{ops, Linear};

/// The workloads this file defines (all of WORKLOADS.md's base six).
pub const NAMES: [&str; 6] = [
    "gelu_chain",
    "layernorm_gelu",
    "mlp_train_step",
    "adam_200_small",
    "transformer_block_fwd",
    "decode_kv",
];

const GELU_C: f64 = 0.7978845608028654;

/// One iteration, with candle's errors.
type Step = Box<dyn FnMut() -> Result<()>>;

/// The step of workload `name`, or `None` for one this file lacks.
pub fn build(name: &str) -> std::result::Result<Option<crate::Step>, String> {
    let step = steps(name).map_err(|e| e.to_string())?;
    Ok(step.map(|mut f| -> crate::Step { Box::new(move || f().map_err(|e| e.to_string())) }))
}

fn steps(name: &str) -> Result<Option<Step>> {
    let dev = Device::Cpu;
    Ok(Some(match name {
        "gelu_chain" => gelu_chain(&dev)?,
        "layernorm_gelu" => layernorm_gelu(&dev)?,
        "mlp_train_step" => mlp_train_step(&dev)?,
        "adam_200_small" => adam_200_small(&dev)?,
        "transformer_block_fwd" => transformer_block_fwd(&dev)?,
        "decode_kv" => decode_kv(&dev)?,
        _ => return Ok(None),
    }))
}

fn gelu(x: &Tensor) -> Result<Tensor> {
    let x3 = ((x * x)? * x)?;
    let inner = ((x + (x3 * 0.044715)?)? * GELU_C)?;
    (x * 0.5)? * (inner.tanh()? + 1.0)?
}

fn layer_norm(h: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mu = h.mean_keepdim(D::Minus1)?;
    let c = h.broadcast_sub(&mu)?;
    let var = c.sqr()?.mean_keepdim(D::Minus1)?;
    c.broadcast_div(&(var + 1e-5)?.sqrt()?)?
        .broadcast_mul(g)?
        .broadcast_add(b)
}

fn randn(dims: &[usize], dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, 1f32, dims, dev)
}

fn gelu_chain(dev: &Device) -> Result<Step> {
    let x = randn(&[1 << 20], dev)?;
    Ok(Box::new(move || gelu(&x).map(drop)))
}

fn layernorm_gelu(dev: &Device) -> Result<Step> {
    let (x, g, b) = (
        randn(&[512, 1024], dev)?,
        randn(&[1024], dev)?,
        randn(&[1024], dev)?,
    );
    Ok(Box::new(move || {
        let h = layer_norm(&x, &g, &b)?;
        (gelu(&h)? + &x).map(drop)
    }))
}

fn mlp_train_step(dev: &Device) -> Result<Step> {
    let dims = [784usize, 1024, 1024, 10];
    let mut vars = Vec::new();
    for i in 0..3 {
        let w = (randn(&[dims[i], dims[i + 1]], dev)? * (1.0 / dims[i] as f64).sqrt())?;
        vars.push(Var::from_tensor(&w)?);
        vars.push(Var::zeros(dims[i + 1], DType::F32, dev)?);
    }
    let x = randn(&[256, 784], dev)?;
    let labels: Vec<u32> = (0..256).map(|i| (i * 7 % 10) as u32).collect();
    let y = Tensor::new(labels.as_slice(), dev)?;
    Ok(Box::new(move || {
        let mut h = x.clone();
        for i in 0..3 {
            h = h
                .matmul(vars[2 * i].as_tensor())?
                .broadcast_add(vars[2 * i + 1].as_tensor())?;
            if i < 2 {
                h = h.relu()?;
            }
        }
        let loss = candle_nn::loss::cross_entropy(&h, &y)?;
        let grads = loss.backward()?;
        for v in &vars {
            if let Some(g) = grads.get(v) {
                v.set(&(v.as_tensor() - (g * 0.01)?)?)?;
            }
        }
        loss.to_scalar::<f32>().map(drop)
    }))
}

fn adam_200_small(dev: &Device) -> Result<Step> {
    let n = 200;
    let mut p: Vec<Tensor> = (0..n)
        .map(|_| randn(&[64, 64], dev))
        .collect::<Result<_>>()?;
    let g: Vec<Tensor> = (0..n)
        .map(|_| randn(&[64, 64], dev)? * 0.01)
        .collect::<Result<_>>()?;
    let mut m: Vec<Tensor> = (0..n)
        .map(|_| Tensor::zeros((64, 64), DType::F32, dev))
        .collect::<Result<_>>()?;
    let mut v = m.clone();
    let mut t = 0i32;
    Ok(Box::new(move || {
        t += 1;
        let (b1, b2, lr, eps, wd) = (0.9f64, 0.999f64, 1e-3, 1e-8, 0.01);
        for i in 0..n {
            m[i] = ((&m[i] * b1)? + (&g[i] * (1.0 - b1))?)?;
            v[i] = ((&v[i] * b2)? + ((&g[i] * &g[i])? * (1.0 - b2))?)?;
            let mh = (&m[i] / (1.0 - b1.powi(t)))?;
            let vh = (&v[i] / (1.0 - b2.powi(t)))?;
            let upd = ((mh / (vh.sqrt()? + eps)?)? + (&p[i] * wd)?)?;
            p[i] = (&p[i] - (upd * lr)?)?;
        }
        Ok(())
    }))
}

fn linear(i: usize, o: usize, dev: &Device) -> Result<Linear> {
    // candle's Linear holds the weight as [out, in] and multiplies by its
    // transpose, as PyTorch does.
    let w = (randn(&[o, i], dev)? * (1.0 / i as f64).sqrt())?;
    Ok(Linear::new(w, Some(Tensor::zeros(o, DType::F32, dev)?)))
}

fn transformer_block_fwd(dev: &Device) -> Result<Step> {
    let (b, t, c, nh) = (8usize, 128usize, 256usize, 4usize);
    let hd = c / nh;
    let x = randn(&[b, t, c], dev)?;
    let (qkv, proj) = (linear(c, 3 * c, dev)?, linear(c, c, dev)?);
    let (fc1, fc2) = (linear(c, 4 * c, dev)?, linear(4 * c, c, dev)?);
    let (g, beta) = (
        Tensor::ones(c, DType::F32, dev)?,
        Tensor::zeros(c, DType::F32, dev)?,
    );
    let mask: Vec<u8> = (0..t * t).map(|i| u8::from(i % t > i / t)).collect();
    let mask = Tensor::from_slice(&mask, (t, t), dev)?;
    let neg_inf = Tensor::new(f32::NEG_INFINITY, dev)?;
    Ok(Box::new(move || {
        let h = layer_norm(&x, &g, &beta)?;
        let qkv = qkv.forward(&h)?;
        let heads = |k: usize| {
            qkv.narrow(2, k * c, c)?
                .reshape((b, t, nh, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let att = mask
            .broadcast_as(att.shape())?
            .where_cond(&neg_inf.broadcast_as(att.shape())?, &att)?;
        let att = ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
        let x1 = (&x + proj.forward(&y)?)?;
        let h2 = layer_norm(&x1, &g, &beta)?;
        let y2 = fc2.forward(&gelu(&fc1.forward(&h2)?)?)?;
        (x1 + y2).map(drop)
    }))
}

/// One decoder layer's weights.
struct Layer {
    ln1: (Tensor, Tensor),
    qkv: Linear,
    proj: Linear,
    ln2: (Tensor, Tensor),
    fc1: Linear,
    fc2: Linear,
}

fn decode_kv(dev: &Device) -> Result<Step> {
    let (vocab, c, nh, layers, ctx, new) = (512usize, 256usize, 4usize, 2usize, 128usize, 96usize);
    let hd = c / nh;
    let w = |dims: &[usize]| randn(dims, dev)? * 0.02;
    let lin = |i: usize, o: usize| -> Result<Linear> {
        Ok(Linear::new(
            w(&[o, i])?,
            Some(Tensor::zeros(o, DType::F32, dev)?),
        ))
    };
    let ones = Tensor::ones(c, DType::F32, dev)?;
    let zeros = Tensor::zeros(c, DType::F32, dev)?;
    let (wte, wpe) = (w(&[vocab, c])?, w(&[ctx, c])?);
    let head = Linear::new(w(&[vocab, c])?, None);
    let ls: Vec<Layer> = (0..layers)
        .map(|_| {
            Ok(Layer {
                ln1: (ones.clone(), zeros.clone()),
                qkv: lin(c, 3 * c)?,
                proj: lin(c, c)?,
                ln2: (ones.clone(), zeros.clone()),
                fc1: lin(c, 4 * c)?,
                fc2: lin(4 * c, c)?,
            })
        })
        .collect::<Result<_>>()?;
    let dev = dev.clone();
    let neg_inf = Tensor::new(f32::NEG_INFINITY, &dev)?;
    // Logits of the last position for `ids` at `pos0`, growing `cache`.
    let forward = move |ids: &[u32],
                        pos0: usize,
                        cache: &mut Vec<Option<(Tensor, Tensor)>>|
          -> Result<Tensor> {
        let t = ids.len();
        let ids = Tensor::new(ids, &dev)?;
        let mut x = wte.index_select(&ids, 0)?.add(&wpe.narrow(0, pos0, t)?)?;
        for (li, l) in ls.iter().enumerate() {
            let h = layer_norm(&x, &l.ln1.0, &l.ln1.1)?;
            let qkv = l.qkv.forward(&h)?;
            let heads = |k: usize| {
                qkv.narrow(1, k * c, c)?
                    .reshape((t, nh, hd))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (q, mut k, mut v) = (heads(0)?, heads(1)?, heads(2)?);
            if let Some((pk, pv)) = &cache[li] {
                k = Tensor::cat(&[pk, &k], 1)?;
                v = Tensor::cat(&[pv, &v], 1)?;
            }
            cache[li] = Some((k.clone(), v.clone()));
            let s = k.dim(1)?;
            let mut att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
            if t > 1 {
                let m: Vec<u8> = (0..t * s)
                    .map(|i| u8::from(i % s > i / s + s - t))
                    .collect();
                let m = Tensor::from_slice(&m, (t, s), &dev)?.broadcast_as(att.shape())?;
                att = m.where_cond(&neg_inf.broadcast_as(att.shape())?, &att)?;
            }
            let y = ops::softmax_last_dim(&att)?
                .matmul(&v)?
                .transpose(0, 1)?
                .reshape((t, c))?;
            x = (&x + l.proj.forward(&y)?)?;
            let h2 = layer_norm(&x, &l.ln2.0, &l.ln2.1)?;
            x = (&x + l.fc2.forward(&gelu(&l.fc1.forward(&h2)?)?)?)?;
        }
        head.forward(&layer_norm(&x.narrow(0, t - 1, 1)?, &ones, &zeros)?)
    };
    let mut it = 0usize;
    Ok(Box::new(move || {
        let p = 8 + (7 * it) % 24;
        let ids: Vec<u32> = (0..p).map(|j| ((3 * j + it) % vocab) as u32).collect();
        it += 1;
        let mut cache = vec![None; layers];
        let mut logits = forward(&ids, 0, &mut cache)?;
        for pos in p..p + new {
            let tok = logits.argmax(D::Minus1)?.squeeze(0)?.to_scalar::<u32>()?;
            logits = forward(&[tok], pos, &mut cache)?;
        }
        Ok(())
    }))
}
