//! The general convolution op's attributes and shape rule.
//!
//! One op covers every convolution a model or its gradient needs, in the
//! form of StableHLO's `convolution` with a fixed channels-first layout:
//! `lhs [n, c, s_1..s_d] x rhs [o, c / feature_groups, k_1..k_d] ->
//! [n / batch_groups, o, y_1..y_d]`. Forward convolutions use stride,
//! padding, dilation and feature groups; a transposed convolution and the
//! input gradient dilate the lhs; the weight gradient of a grouped
//! convolution needs batch groups. Keeping them one op means one reference
//! definition, one lowering and one gradient rule.

use crate::{DType, Shape};
use smallvec::SmallVec;

/// Per-spatial-dim integers, inline up to three dims (conv1d..conv3d).
pub type Spatial<T> = SmallVec<[T; 3]>;

/// The attributes of [`crate::Op::Conv`]: everything but the operands.
///
/// Along spatial dim `i` the lhs is first dilated (`lhs_dilation[i] - 1`
/// zeros between neighbours), then padded with `padding[i]` zeros before
/// and after (negative padding removes elements), and the kernel, itself
/// dilated by `rhs_dilation[i]`, slides over it in steps of `stride[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvSpec {
    /// Window steps, one per spatial dim (positive).
    pub stride: Spatial<usize>,
    /// `(before, after)` padding per spatial dim; may be negative.
    pub padding: Spatial<(i64, i64)>,
    /// Input dilation (positive); > 1 for transposed convolutions.
    pub lhs_dilation: Spatial<usize>,
    /// Kernel dilation (positive).
    pub rhs_dilation: Spatial<usize>,
    /// Channel groups: `c` and `o` split into this many independent groups.
    pub feature_groups: usize,
    /// Batch groups: the lhs batch and `o` split into this many groups,
    /// each output channel seeing its group's batch slice (weight
    /// gradients of grouped convolutions). At most one of the two group
    /// counts is above 1.
    pub batch_groups: usize,
}

impl ConvSpec {
    /// A plain convolution over `d` spatial dims: stride 1, no padding, no
    /// dilation, one group.
    pub fn plain(d: usize) -> ConvSpec {
        ConvSpec {
            stride: SmallVec::from_elem(1, d),
            padding: SmallVec::from_elem((0, 0), d),
            lhs_dilation: SmallVec::from_elem(1, d),
            rhs_dilation: SmallVec::from_elem(1, d),
            feature_groups: 1,
            batch_groups: 1,
        }
    }

    /// Number of spatial dims.
    pub fn spatial_rank(&self) -> usize {
        self.stride.len()
    }

    /// The output length of spatial dim `i` for an lhs of length `len` and
    /// a kernel of `k` taps, or `None` when the kernel does not fit once.
    pub fn out_len(&self, i: usize, len: usize, k: usize) -> Option<usize> {
        let dilated = if len == 0 {
            0
        } else {
            (len as i64 - 1) * self.lhs_dilation[i] as i64 + 1
        };
        let padded = dilated + self.padding[i].0 + self.padding[i].1;
        let span = if k == 0 {
            0
        } else {
            (k as i64 - 1) * self.rhs_dilation[i] as i64 + 1
        };
        if padded < span || padded < 0 {
            return None;
        }
        Some(((padded - span) / self.stride[i] as i64 + 1) as usize)
    }
}

/// Why the operands do not fit (inference wraps it in its error type).
fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

/// The result type of a convolution, or why the operands do not fit.
pub(crate) fn infer_conv(
    spec: &ConvSpec,
    (ls, ld): (&Shape, DType),
    (rs, rd): (&Shape, DType),
) -> Result<(Shape, DType), String> {
    let d = spec.spatial_rank();
    if spec.padding.len() != d || spec.lhs_dilation.len() != d || spec.rhs_dilation.len() != d {
        return err("stride, padding and dilations must have one entry per spatial dim");
    }
    if ls.rank() != d + 2 || rs.rank() != d + 2 {
        return err(format!(
            "a convolution over {d} spatial dim(s) takes rank-{} input and weight, got ranks {} and {}",
            d + 2,
            ls.rank(),
            rs.rank()
        ));
    }
    if !ld.is_float() || ld != rd {
        return err(format!(
            "input and weight must be float tensors of one dtype, got {ld} and {rd}"
        ));
    }
    let positive = |v: &[usize]| v.iter().all(|&x| x > 0);
    if !positive(&spec.stride) || !positive(&spec.lhs_dilation) || !positive(&spec.rhs_dilation) {
        return err("strides and dilations must be positive");
    }
    let (fg, bg) = (spec.feature_groups, spec.batch_groups);
    if fg == 0 || bg == 0 || (fg > 1 && bg > 1) {
        return err(format!(
            "group counts must be positive and at most one above 1, got feature {fg}, batch {bg}"
        ));
    }
    let (l, r) = (ls.dims(), rs.dims());
    let (n, c, o, ci) = (l[0], l[1], r[0], r[1]);
    if c % fg != 0 || o % fg != 0 || ci * fg != c {
        return err(format!(
            "with {fg} group(s) the input's {c} channels and the weight's {o} outputs must split evenly, \
             and the weight must take c / groups = {} input channels, not {ci}",
            c / fg
        ));
    }
    if n % bg != 0 || o % bg != 0 {
        return err(format!(
            "with {bg} batch group(s) the batch ({n}) and outputs ({o}) must split evenly"
        ));
    }
    let mut out = vec![n / bg, o];
    for i in 0..d {
        match spec.out_len(i, l[i + 2], r[i + 2]) {
            Some(y) => out.push(y),
            None => {
                return err(format!(
                    "spatial dim {i}: the kernel ({} taps, dilation {}) does not fit the \
                     input ({} elements, dilation {}, padding {:?})",
                    r[i + 2],
                    spec.rhs_dilation[i],
                    l[i + 2],
                    spec.lhs_dilation[i],
                    spec.padding[i]
                ))
            }
        }
    }
    Ok((Shape::new(&out), ld))
}
