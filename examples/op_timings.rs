//! Common ops one at a time, the 10th percentile of 60 timed runs each
//! (ms), to find ops whose lowering falls off a cliff that a workload
//! total hides (a float max reduction that ran as a scalar loop took 30
//! times the row sum). `scripts/op_timings.py` times the same ops under
//! jax.jit and prints the same lines, for a side-by-side `paste`:
//!
//! ```text
//! cargo run --release --example op_timings > lf.txt
//! python3 scripts/op_timings.py > jax.txt
//! paste lf.txt jax.txt
//! ```

use lazyfuse::{DType, Device, FusionGuard, Result, Tensor};
use std::time::Instant;

const RUNS: usize = 60;

/// The 10th percentile of `RUNS` timed calls of `f` (after 5 untimed), ms.
fn p10(mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    for _ in 0..5 {
        f()?.realize()?;
    }
    let mut ts = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t0 = Instant::now();
        f()?.realize()?;
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[RUNS / 10])
}

fn main() -> Result<()> {
    let dev = Device::cpu()?;
    let _fused = FusionGuard::new(true);
    let ready = |t: Tensor| -> Result<Tensor> {
        t.realize()?;
        Ok(t)
    };
    let a = ready(Tensor::randn(&[1024, 1024], 1, &dev)?)?;
    let g = ready(Tensor::randn(&[1024], 2, &dev)?)?;
    let perm: Vec<i64> = (0..1024).map(|i| (i * 7919 % 1024) as i64).collect();
    let idx = ready(Tensor::from_slice(&perm, &[1024], &dev)?)?;
    let idx2 = ready(idx.reshape(&[1024, 1])?)?;
    let labels: Vec<i64> = (0..1024).map(|i| (i * 31 % 1000) as i64).collect();
    let t = ready(Tensor::from_slice(&labels, &[1024], &dev)?)?;
    // Attention scores at transformer_block_fwd's shapes.
    let q = ready(Tensor::randn(&[8, 4, 128, 64], 3, &dev)?)?;
    let k = ready(Tensor::randn(&[8, 4, 128, 64], 4, &dev)?)?;
    let v = ready(Tensor::randn(&[8, 4, 128, 64], 5, &dev)?)?;
    let s = ready(q.matmul(&k.transpose(-2, -1)?)?)?;
    // The dots of mlp_train_step's middle layer: forward, input gradient
    // and weight gradient.
    let h = ready(Tensor::randn(&[256, 1024], 6, &dev)?)?;
    let dy = ready(Tensor::randn(&[256, 1024], 7, &dev)?)?;
    type Case<'a> = (&'a str, Box<dyn Fn() -> Result<Tensor> + 'a>);
    let cases: Vec<Case> = vec![
        ("sum_rows", Box::new(|| a.sum([-1], true))),
        ("sum_cols", Box::new(|| a.sum([0], true))),
        ("max_rows", Box::new(|| a.max([-1], true))),
        ("max_cols", Box::new(|| a.max([0], true))),
        ("mean_all", Box::new(|| a.mean(.., false))),
        ("softmax", Box::new(|| a.softmax(-1))),
        ("log_softmax", Box::new(|| a.log_softmax(-1))),
        (
            "layer_norm",
            Box::new(|| a.layer_norm(Some(&g), Some(&g), 1e-5)),
        ),
        ("argmax_rows", Box::new(|| a.argmax(-1, false))),
        ("xent", Box::new(|| a.cross_entropy(&t, None))),
        ("index_select", Box::new(|| a.index_select(0, &idx))),
        ("gather", Box::new(|| a.gather(1, &idx2))),
        ("transpose", Box::new(|| a.transpose(0, 1)?.add(1.0))),
        ("cat", Box::new(|| Tensor::cat(&[&a, &a], 0))),
        ("clamp", Box::new(|| a.clamp(-1.0, 1.0))),
        ("relu", Box::new(|| a.relu())),
        ("gelu_exact", Box::new(|| a.gelu_exact())),
        ("to_bf16", Box::new(|| a.to_dtype(DType::BF16))),
        ("sigmoid", Box::new(|| a.sigmoid())),
        ("masked_fill", Box::new(|| a.masked_fill(&a.gt(0.0)?, 0.0))),
        ("att_rowmax", Box::new(|| s.max([-1], true))),
        ("att_softmax", Box::new(|| s.softmax(-1))),
        (
            "attention",
            Box::new(|| {
                q.matmul(&k.transpose(-2, -1)?)?
                    .mul(0.125)?
                    .softmax(-1)?
                    .matmul(&v)
            }),
        ),
        ("mm_fwd", Box::new(|| h.matmul(&a))),
        ("mm_dx", Box::new(|| dy.matmul(&a.transpose(0, 1)?))),
        ("mm_dw", Box::new(|| h.transpose(0, 1)?.matmul(&dy))),
    ];
    for (name, f) in &cases {
        println!("{name:14} {:.3}", p10(f)?);
    }
    Ok(())
}
