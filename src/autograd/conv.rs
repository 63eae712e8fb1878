//! The gradient of the convolution op, as two more convolutions.
//!
//! With `lhs [n, c, s..]`, `rhs [o, c / g, k..]` and the output gradient
//! `gy [n, o, y..]`, along each spatial dim an output `y` reads the dilated
//! input at `y * stride + t * rhs_dilation - pad_lo` for tap `t`. So
//! - the input gradient is `gy` (dilated by the stride) convolved with the
//!   kernel flipped and its in/out channels swapped per group, read at every
//!   `lhs_dilation`-th position (the convolution's stride), with
//!   `pad_lo' = (k - 1) rhs_dilation - pad_lo`;
//! - the weight gradient convolves the input, batch and channels swapped,
//!   with `gy`, batch and channels swapped, as the kernel: the old kernel
//!   dilation becomes the stride, the old stride the kernel dilation, and
//!   the groups become batch groups.
//!
//! Both paddings are chosen so the result has the operand's exact length.

use crate::tensor::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::ConvSpec;

/// Gradients of `conv(lhs, rhs)` for the operands in `need`.
pub(super) fn conv_grads(
    spec: &ConvSpec,
    lhs: &Tensor,
    rhs: &Tensor,
    g: &Tensor,
    need: &[bool],
) -> Result<[Option<Tensor>; 2]> {
    if spec.batch_groups > 1 {
        return Err(Error::internal(
            "the gradient of a batch-grouped convolution (itself a weight gradient) is not \
             implemented: differentiate a convolution at most twice",
        ));
    }
    let zero_sized = [lhs, rhs, g].iter().any(|t| t.numel() == 0);
    let zeros = |t: &Tensor| Tensor::zeros(t.dims(), t.dtype(), t.device());
    let d = spec.spatial_rank();
    let (l, r, y) = (lhs.dims(), rhs.dims(), g.dims());
    let fg = spec.feature_groups;
    let mut out = [None, None];
    if need[0] {
        out[0] = Some(if zero_sized {
            zeros(lhs)?
        } else {
            let (c, o) = (l[1], r[0]);
            // [o, c/g, k] -> [g, o/g, c/g, k] -> [g, c/g, o/g, k] -> [c, o/g, k], flipped.
            let mut grouped = vec![fg, o / fg, c / fg];
            grouped.extend_from_slice(&r[2..]);
            let mut perm = vec![0, 2, 1];
            perm.extend(3..3 + d);
            let mut flat = vec![c, o / fg];
            flat.extend_from_slice(&r[2..]);
            let taps: Vec<isize> = (2..2 + d as isize).collect();
            let w = rhs
                .reshape(&grouped)?
                .permute_axes(&perm)?
                .reshape(&flat)?
                .flip(&taps)?;
            let mut s = ConvSpec::plain(d);
            s.feature_groups = fg;
            for i in 0..d {
                let (k, rd) = (r[i + 2] as i64, spec.rhs_dilation[i] as i64);
                let (st, ld) = (spec.stride[i] as i64, spec.lhs_dilation[i] as i64);
                let lo = spec.padding[i].0;
                let (len, ylen) = (l[i + 2] as i64, y[i + 2] as i64);
                s.padding[i] = ((k - 1) * rd - lo, (len - 1) * ld - (ylen - 1) * st + lo);
                s.lhs_dilation[i] = spec.stride[i];
                s.rhs_dilation[i] = spec.rhs_dilation[i];
                s.stride[i] = spec.lhs_dilation[i];
            }
            g.convolution(&w, &s)?
        });
    }
    if need[1] {
        out[1] = Some(if zero_sized {
            zeros(rhs)?
        } else {
            let mut swap: Vec<usize> = vec![1, 0];
            swap.extend(2..2 + d);
            let xt = lhs.permute_axes(&swap)?;
            let gt = g.permute_axes(&swap)?;
            let mut s = ConvSpec::plain(d);
            s.batch_groups = fg;
            for i in 0..d {
                let (k, rd) = (r[i + 2] as i64, spec.rhs_dilation[i] as i64);
                let (st, ld) = (spec.stride[i] as i64, spec.lhs_dilation[i] as i64);
                let lo = spec.padding[i].0;
                let (len, ylen) = (l[i + 2] as i64, y[i + 2] as i64);
                s.padding[i] = (lo, (k - 1) * rd + (ylen - 1) * st - (len - 1) * ld - lo);
                s.stride[i] = spec.rhs_dilation[i];
                s.lhs_dilation[i] = spec.lhs_dilation[i];
                s.rhs_dilation[i] = spec.stride[i];
            }
            // [c/g, o, k] -> [o, c/g, k].
            xt.convolution(&gt, &s)?.permute_axes(&swap)?
        });
    }
    Ok(out)
}
