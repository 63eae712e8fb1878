//! The compiler's floor under `decode_kv`: the matrix-vector products of
//! one generated token (the two blocks' QKV, output, MLP up and down
//! projections and the head, at `decode_kv`'s sizes: 6.8 MB of f32
//! weights), chained as one region, with the next token read on the host
//! as a decode step reads it. Whatever else a token costs (attention,
//! layer norms, recording, launch) comes on top, so this time bounds how
//! fast `decode_kv` can run with the plugin's dot kernels; BENCHMARKS.md
//! compares it with torch's, which sets the `decode_kv` target.
//!
//! Beside it, the same products on the host with the `gemm` crate (its
//! AVX-512 kernels), on one core and on both: what the weights' 6.8 MB
//! cost to stream through a core here, whoever computes the product.

use criterion::{criterion_group, criterion_main, Criterion};
use lazyfuse::{Device, FusionGuard, Result, Tensor};

const C: usize = 256;
const VOCAB: usize = 512;

/// One block's weights: QKV [C, 3C], output [C, C], MLP [C, 4C] and [4C, C].
type Block = (Tensor, Tensor, Tensor, Tensor);

fn weight(dims: &[usize], seed: u64, dev: &Device) -> Result<Tensor> {
    let w = Tensor::randn(dims, seed, dev)?.mul(0.02)?;
    w.realize()?;
    Ok(w)
}

/// The token after `x` through the blocks' projections and the head.
fn token(x: &Tensor, blocks: &[Block], head: &Tensor) -> Result<i64> {
    let mut h = x.clone();
    for (qkv, out, up, down) in blocks {
        let v = h.matmul(qkv)?.narrow(-1, 2 * C, C)?;
        let a = h.add(&v.matmul(out)?)?;
        h = a.add(&a.matmul(up)?.tanh()?.matmul(down)?)?;
    }
    Ok(h.matmul(head)?.argmax(-1, false)?.to_vec::<i64>()?[0])
}

fn bench_decode_floor(c: &mut Criterion) {
    let dev = Device::cpu().expect("XLA CPU plugin");
    let _fused = FusionGuard::new(true);
    let blocks: Vec<Block> = (0..2u64)
        .map(|l| {
            Ok((
                weight(&[C, 3 * C], 10 * l + 1, &dev)?,
                weight(&[C, C], 10 * l + 2, &dev)?,
                weight(&[C, 4 * C], 10 * l + 3, &dev)?,
                weight(&[4 * C, C], 10 * l + 4, &dev)?,
            ))
        })
        .collect::<Result<_>>()
        .expect("weights");
    let head = weight(&[C, VOCAB], 100, &dev).expect("head");
    let x = weight(&[1, C], 0, &dev).expect("input");
    let mut g = c.benchmark_group("decode_floor");
    g.bench_function("dots_of_one_decode_kv_token", |b| {
        b.iter(|| token(&x, &blocks, &head).expect("token"))
    });
    let host: Vec<(usize, usize, Vec<f32>)> = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]
        .iter()
        .cycle()
        .take(8)
        .chain(std::iter::once(&(C, VOCAB)))
        .enumerate()
        .map(|(i, &(k, n))| {
            let w = (0..k * n)
                .map(|j| ((j * 31 + i) % 97) as f32 * 1e-3)
                .collect();
            (k, n, w)
        })
        .collect();
    for (name, par) in [
        ("host_gemm_one_core", gemm::Parallelism::None),
        ("host_gemm_two_cores", gemm::Parallelism::Rayon(2)),
    ] {
        g.bench_function(name, |b| b.iter(|| host_token(&host, par)));
    }
    g.finish();
}

/// The products of [`token`] as `[1, k] x [k, n]` host GEMMs, each input
/// the last output's first `k` values (a chain, as the blocks are).
fn host_token(weights: &[(usize, usize, Vec<f32>)], par: gemm::Parallelism) -> f32 {
    let mut h = vec![0.01f32; 4 * C];
    let mut y = vec![0f32; 4 * C];
    for (k, n, w) in weights {
        let (k, n) = (*k, *n);
        // SAFETY: h holds k values, w k * n, y n: every address the
        // strides reach is inside them.
        unsafe {
            gemm::gemm(
                1,
                n,
                k,
                y.as_mut_ptr(),
                1,
                n as isize,
                false,
                h.as_ptr(),
                1,
                k as isize,
                w.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            )
        }
        h[..n].copy_from_slice(&y[..n]);
        h[n..].iter_mut().for_each(|v| *v = 0.01);
    }
    h[0]
}

criterion_group!(benches, bench_decode_floor);
criterion_main!(benches);
