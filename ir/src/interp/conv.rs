//! The convolution, by its definition: every output element is the sum,
//! over the input channels of its group and the kernel taps, of input times
//! weight, where a tap reads the dilated, padded input. A tap over padding
//! or a dilation hole adds no term. (XLA's kernels differ there: some skip
//! such taps, others multiply a zero, so with an infinite or NaN weight on
//! such a tap XLA may give NaN where this gives a number; and it runs a
//! grouped convolution as a larger one with a zero-masked kernel, so a
//! non-finite value in one group may give NaN in another. Those are the
//! latitudes the differential fuzzer's oracle grants a convolution.) Floats
//! accumulate in f64 in (channel, tap) row-major order and round once, like
//! the matrix product.

use super::elementwise::Values;
use crate::{ConvSpec, HostTensor, Shape};

/// Row-major multi-indices of `dims`, in order (one empty index for rank 0).
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![Vec::with_capacity(dims.len())];
    for &d in dims {
        all = all
            .into_iter()
            .flat_map(|p| {
                (0..d).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    all
}

/// Flat offset of `idx` in a row-major tensor of `dims`.
fn flat(dims: &[usize], idx: impl Iterator<Item = usize>) -> usize {
    dims.iter().zip(idx).fold(0, |acc, (&d, i)| acc * d + i)
}

/// `lhs` convolved with `rhs` as `spec` says, producing `shape` (inferred).
pub(crate) fn conv(
    spec: &ConvSpec,
    lhs: &HostTensor,
    rhs: &HostTensor,
    shape: Shape,
) -> HostTensor {
    let (Values::F(x), Values::F(w)) = (Values::of(lhs), Values::of(rhs)) else {
        unreachable!("infer admits float operands only")
    };
    let (l, r, out) = (lhs.shape.dims(), rhs.shape.dims(), shape.dims());
    let (o, cg) = (r[0], r[1]);
    let per_fgroup = o / spec.feature_groups;
    let per_bgroup = o / spec.batch_groups;
    let nb = out[0];
    let taps = indices(&r[2..]);
    let mut values = Vec::with_capacity(shape.numel());
    for b in 0..nb {
        for oc in 0..o {
            let chan0 = (oc / per_fgroup) * cg;
            let batch = (oc / per_bgroup) * nb + b;
            for y in indices(&out[2..]) {
                let mut sum = 0.0;
                for ci in 0..cg {
                    for k in &taps {
                        // The input element under tap `k`, if any.
                        let mut at = Vec::with_capacity(k.len());
                        for (i, (&yi, &ki)) in y.iter().zip(k).enumerate() {
                            let p = (yi * spec.stride[i] + ki * spec.rhs_dilation[i]) as i64
                                - spec.padding[i].0;
                            let ld = spec.lhs_dilation[i] as i64;
                            if p < 0 || p % ld != 0 || (p / ld) as usize >= l[i + 2] {
                                break;
                            }
                            at.push((p / ld) as usize);
                        }
                        if at.len() < k.len() {
                            continue;
                        }
                        let xi = flat(l, [batch, chan0 + ci].into_iter().chain(at));
                        let wi = flat(r, [oc, ci].into_iter().chain(k.iter().copied()));
                        sum += x[xi] * w[wi];
                    }
                }
                values.push(sum);
            }
        }
    }
    Values::F(values).encode(shape, lhs.dtype)
}
