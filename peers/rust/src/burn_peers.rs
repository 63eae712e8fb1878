//! The workloads in burn 0.18 on its `ndarray` CPU backend (autodiff for
//! the training step), after `../shared/peers/workloads.py`'s torch
//! versions: same shapes and math, the decode loop growing its KV cache
//! with `cat`, layers as `burn::nn::Linear`.

use crate::Step;
use burn::backend::{Autodiff, NdArray};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::{log_softmax, relu, softmax};
use burn::tensor::{backend::Backend, Bool, Distribution, Int, Tensor, TensorData};

type B = NdArray<f32>;
type A = Autodiff<B>;
type Result<T> = std::result::Result<T, String>;

const GELU_C: f32 = 0.797_884_6;

/// The step of workload `name`, or `None` for one this file lacks.
pub fn build(name: &str) -> Result<Option<Step>> {
    let dev = Default::default();
    Ok(Some(match name {
        "gelu_chain" => gelu_chain(&dev),
        "layernorm_gelu" => layernorm_gelu(&dev),
        "mlp_train_step" => mlp_train_step(&dev),
        "adam_200_small" => adam_200_small(&dev),
        "transformer_block_fwd" => transformer_block_fwd(&dev),
        "decode_kv" => decode_kv(&dev),
        _ => return Ok(None),
    }))
}

type Device = <B as Backend>::Device;

fn gelu<Bk: Backend, const D: usize>(x: Tensor<Bk, D>) -> Tensor<Bk, D> {
    let x3 = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + x3.mul_scalar(0.044715)).mul_scalar(GELU_C);
    x.mul_scalar(0.5) * inner.tanh().add_scalar(1.0)
}

fn layer_norm<const D: usize>(h: Tensor<B, D>, g: &Tensor<B, 1>, b: &Tensor<B, 1>) -> Tensor<B, D> {
    let mu = h.clone().mean_dim(D - 1);
    let c = h - mu;
    let var = (c.clone() * c.clone()).mean_dim(D - 1);
    c / var.add_scalar(1e-5).sqrt() * g.clone().unsqueeze::<D>() + b.clone().unsqueeze::<D>()
}

fn randn<const D: usize>(dims: [usize; D], dev: &Device) -> Tensor<B, D> {
    Tensor::random(dims, Distribution::Normal(0.0, 1.0), dev)
}

fn gelu_chain(dev: &Device) -> Step {
    let x = randn([1 << 20], dev);
    Box::new(move || {
        let _ = gelu(x.clone()).into_data();
        Ok(())
    })
}

fn layernorm_gelu(dev: &Device) -> Step {
    let (x, g, b) = (
        randn([512, 1024], dev),
        randn([1024], dev),
        randn([1024], dev),
    );
    Box::new(move || {
        let h = layer_norm(x.clone(), &g, &b);
        let _ = (gelu(h) + x.clone()).into_data();
        Ok(())
    })
}

fn mlp_train_step(dev: &Device) -> Step {
    let dims = [784usize, 1024, 1024, 10];
    let mut ps: Vec<Tensor<A, 2>> = Vec::new();
    for i in 0..3 {
        let w = randn([dims[i], dims[i + 1]], dev).mul_scalar((1.0 / dims[i] as f32).sqrt());
        ps.push(Tensor::from_inner(w).require_grad());
        ps.push(Tensor::<A, 2>::zeros([1, dims[i + 1]], dev).require_grad());
    }
    let x: Tensor<A, 2> = Tensor::from_inner(randn([256, 784], dev));
    let labels: Vec<i64> = (0..256).map(|i| (i * 7 % 10) as i64).collect();
    let y = Tensor::<A, 1, Int>::from_data(TensorData::new(labels, [256]), dev);
    Box::new(move || {
        let mut h = x.clone();
        for i in 0..3 {
            h = h.matmul(ps[2 * i].clone()) + ps[2 * i + 1].clone();
            if i < 2 {
                h = relu(h);
            }
        }
        let picked = log_softmax(h, 1).gather(1, y.clone().reshape([256, 1]));
        let loss = picked.mean().neg();
        let grads = loss.backward();
        for p in ps.iter_mut() {
            let g = p.grad(&grads).ok_or("no gradient")?;
            *p = Tensor::from_inner(p.clone().inner() - g.mul_scalar(0.01)).require_grad();
        }
        let _ = loss.into_scalar();
        Ok(())
    })
}

fn adam_200_small(dev: &Device) -> Step {
    let n = 200;
    let mut p: Vec<Tensor<B, 2>> = (0..n).map(|_| randn([64, 64], dev)).collect();
    let g: Vec<Tensor<B, 2>> = (0..n)
        .map(|_| randn([64, 64], dev).mul_scalar(0.01))
        .collect();
    let mut m: Vec<Tensor<B, 2>> = (0..n).map(|_| Tensor::zeros([64, 64], dev)).collect();
    let mut v = m.clone();
    let mut t = 0i32;
    Box::new(move || {
        t += 1;
        let (b1, b2, lr, eps, wd) = (0.9f32, 0.999f32, 1e-3f32, 1e-8f32, 0.01f32);
        for i in 0..n {
            m[i] = m[i].clone().mul_scalar(b1) + g[i].clone().mul_scalar(1.0 - b1);
            v[i] = v[i].clone().mul_scalar(b2) + (g[i].clone() * g[i].clone()).mul_scalar(1.0 - b2);
            let mh = m[i].clone().div_scalar(1.0 - b1.powi(t));
            let vh = v[i].clone().div_scalar(1.0 - b2.powi(t));
            let upd = mh / vh.sqrt().add_scalar(eps) + p[i].clone().mul_scalar(wd);
            p[i] = p[i].clone() - upd.mul_scalar(lr);
        }
        let _ = p[n - 1].clone().into_data();
        Ok(())
    })
}

fn linear(i: usize, o: usize, dev: &Device) -> Linear<B> {
    LinearConfig::new(i, o).init(dev)
}

fn transformer_block_fwd(dev: &Device) -> Step {
    let (b, t, c, nh) = (8usize, 128usize, 256usize, 4usize);
    let hd = c / nh;
    let x = randn([b, t, c], dev);
    let (qkv, proj) = (linear(c, 3 * c, dev), linear(c, c, dev));
    let (fc1, fc2) = (linear(c, 4 * c, dev), linear(4 * c, c, dev));
    let (g, beta) = (
        Tensor::<B, 1>::ones([c], dev),
        Tensor::<B, 1>::zeros([c], dev),
    );
    // True above the diagonal: the future positions.
    let mask = Tensor::<B, 2, Bool>::tril_mask([t, t], 0, dev)
        .unsqueeze::<4>()
        .expand([b, nh, t, t]);
    Box::new(move || {
        let h = layer_norm(x.clone(), &g, &beta);
        let qkv = qkv.forward(h);
        let heads = |k: usize| {
            qkv.clone()
                .slice([0..b, 0..t, k * c..(k + 1) * c])
                .reshape([b, t, nh, hd])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let att = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(1.0 / (hd as f32).sqrt());
        let att = softmax(att.mask_fill(mask.clone(), f32::NEG_INFINITY), 3);
        let y = att.matmul(v).swap_dims(1, 2).reshape([b, t, c]);
        let x1 = x.clone() + proj.forward(y);
        let y2 = fc2.forward(gelu(fc1.forward(layer_norm(x1.clone(), &g, &beta))));
        let _ = (x1 + y2).into_data();
        Ok(())
    })
}

/// One decoder layer's weights.
struct Layer<Bk: Backend> {
    qkv: Linear<Bk>,
    proj: Linear<Bk>,
    fc1: Linear<Bk>,
    fc2: Linear<Bk>,
}

fn decode_kv(dev: &Device) -> Step {
    let (vocab, c, nh, layers, ctx, new) = (512usize, 256usize, 4usize, 2usize, 128usize, 96usize);
    let hd = c / nh;
    let w = |dims: [usize; 2]| randn(dims, dev).mul_scalar(0.02);
    let (wte, wpe, head) = (w([vocab, c]), w([ctx, c]), w([c, vocab]));
    let (ones, zeros) = (
        Tensor::<B, 1>::ones([c], dev),
        Tensor::<B, 1>::zeros([c], dev),
    );
    let ls: Vec<Layer<B>> = (0..layers)
        .map(|_| Layer {
            qkv: linear(c, 3 * c, dev),
            proj: linear(c, c, dev),
            fc1: linear(c, 4 * c, dev),
            fc2: linear(4 * c, c, dev),
        })
        .collect();
    let dev = *dev;
    type Cache = Vec<Option<(Tensor<B, 3>, Tensor<B, 3>)>>;
    // Logits of the last position for `ids` at `pos0`, growing `cache`.
    let forward = move |ids: &[i64], pos0: usize, cache: &mut Cache| -> Tensor<B, 2> {
        let t = ids.len();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(ids.to_vec(), [t]), &dev);
        let mut x = wte.clone().select(0, idx) + wpe.clone().narrow(0, pos0, t);
        for (li, l) in ls.iter().enumerate() {
            let qkv = l.qkv.forward(layer_norm(x.clone(), &ones, &zeros));
            let heads = |k: usize| {
                qkv.clone()
                    .narrow(1, k * c, c)
                    .reshape([t, nh, hd])
                    .swap_dims(0, 1)
            };
            let (q, mut k, mut v) = (heads(0), heads(1), heads(2));
            if let Some((pk, pv)) = cache[li].take() {
                k = Tensor::cat(vec![pk, k], 1);
                v = Tensor::cat(vec![pv, v], 1);
            }
            cache[li] = Some((k.clone(), v.clone()));
            let s = k.dims()[1];
            let mut att = q
                .matmul(k.swap_dims(1, 2))
                .mul_scalar(1.0 / (hd as f32).sqrt());
            if t > 1 {
                let m = Tensor::<B, 2, Bool>::tril_mask([t, s], (s - t) as i64, &dev)
                    .unsqueeze::<3>()
                    .expand([nh, t, s]);
                att = att.mask_fill(m, f32::NEG_INFINITY);
            }
            let y = softmax(att, 2).matmul(v).swap_dims(0, 1).reshape([t, c]);
            x = x + l.proj.forward(y);
            let h2 = layer_norm(x.clone(), &ones, &zeros);
            x = x.clone() + l.fc2.forward(gelu(l.fc1.forward(h2)));
        }
        layer_norm(x.narrow(0, t - 1, 1), &ones, &zeros).matmul(head.clone())
    };
    let mut it = 0usize;
    Box::new(move || {
        let p = 8 + (7 * it) % 24;
        let ids: Vec<i64> = (0..p).map(|j| ((3 * j + it) % vocab) as i64).collect();
        it += 1;
        let mut cache: Cache = vec![None; layers];
        let mut logits = forward(&ids, 0, &mut cache);
        for pos in p..p + new {
            let tok: i64 = logits.argmax(1).into_scalar();
            logits = forward(&[tok], pos, &mut cache);
        }
        Ok(())
    })
}
