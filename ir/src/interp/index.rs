//! Indexed reads (`index_select`) and accumulation (`index_add`), and the
//! counter-based random generator. Selection copies element bytes, the
//! generator is integer arithmetic followed by one exact scaling, and the
//! accumulation adds exactly and rounds once.

use super::elementwise::Values;
use super::layout::gather;
use crate::{DType, HostTensor, Shape};

/// `x` with dim `axis` replaced by `idx.len()`, slice `j` taken from slice
/// `clamp(idx[j], 0, dim - 1)` of `x` (XLA's gather clamps the same way).
pub(crate) fn index_select(
    x: &HostTensor,
    idx: &HostTensor,
    axis: usize,
    shape: Shape,
) -> HostTensor {
    let dims = x.shape.dims();
    let n = dims[axis] as i64;
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let picks: Vec<usize> = idx
        .to_i64_vec()
        .into_iter()
        .map(|i| i.clamp(0, (n - 1).max(0)) as usize)
        .collect();
    let len = dims[axis];
    let indices = (0..outer).flat_map(|o| {
        picks
            .iter()
            .flat_map(move |&p| (0..inner).map(move |i| (o * len + p) * inner + i))
    });
    gather(x, shape, indices)
}

/// `x` with slice `j` of `src` added to slice `clamp(idx[j], 0, dim - 1)`
/// along `axis`. Floats add exactly (in f64, in index order) and round
/// once per element; integers wrap.
pub(crate) fn scatter_add(
    x: &HostTensor,
    idx: &HostTensor,
    src: &HostTensor,
    axis: usize,
) -> HostTensor {
    let dims = x.shape.dims();
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let k = idx.numel();
    let picks: Vec<usize> = idx
        .to_i64_vec()
        .into_iter()
        .map(|i| i.clamp(0, (n as i64 - 1).max(0)) as usize)
        .collect();
    let target = |o: usize, j: usize, i: usize| (o * n + picks[j]) * inner + i;
    let source = |o: usize, j: usize, i: usize| (o * k + j) * inner + i;
    let out = match (Values::of(x), Values::of(src)) {
        (Values::F(mut v), Values::F(s)) => {
            for o in 0..outer {
                for j in 0..k {
                    for i in 0..inner {
                        v[target(o, j, i)] += s[source(o, j, i)];
                    }
                }
            }
            Values::F(v)
        }
        (Values::I(mut v), Values::I(s)) => {
            for o in 0..outer {
                for j in 0..k {
                    for i in 0..inner {
                        let t = target(o, j, i);
                        v[t] = v[t].wrapping_add(s[source(o, j, i)]);
                    }
                }
            }
            Values::I(v)
        }
        _ => unreachable!("infer checks that x and src share a dtype"),
    };
    out.encode(x.shape.clone(), x.dtype)
}

/// One round of the `lowbias32` integer hash (a bijection on u32).
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The 32 random bits of element `i` for `seed`:
/// `key = mix(lo ^ mix(hi + 0x9E3779B9))` over the seed's low and high words,
/// then `mix(mix(i ^ key) + key)`. Defined on u32 so StableHLO can compute it
/// with `xor`, `shift_right_logical`, `multiply` and `add` on `ui32`.
pub fn random_bits(seed: i64, i: u32) -> u32 {
    let (lo, hi) = (seed as u64 as u32, ((seed as u64) >> 32) as u32);
    let key = mix32(lo ^ mix32(hi.wrapping_add(0x9e37_79b9)));
    mix32(mix32(i ^ key).wrapping_add(key))
}

/// Uniform `[0, 1)`: the top 24 bits of [`random_bits`] times `2^-24`
/// (exact in f32), rounded once to `dtype` (bf16/f16 may round up to 1.0).
pub(crate) fn random_uniform(seed: &HostTensor, shape: Shape, dtype: DType) -> HostTensor {
    let s = seed.to_i64_vec()[0];
    let v: Vec<f64> = (0..shape.numel() as u32)
        .map(|i| (random_bits(s, i) >> 8) as f64 * 2f64.powi(-24))
        .collect();
    HostTensor::from_f64(&v, shape, dtype)
}
