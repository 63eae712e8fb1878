//! Convolutions over 1, 2 or 3 spatial dims (channels first, PyTorch's
//! layout and arguments), recorded as the IR's one convolution op
//! ([`Op::Conv`]), which lowers to StableHLO's `convolution`: XLA's own
//! convolution kernels, not an im2col matrix per call. Transposed
//! convolutions are the same op with a dilated input and a flipped kernel,
//! as their gradients are.
//!
//! Every argument is validated up front, so a bad call is an `Err` naming
//! the op and the caller's line, with nothing recorded.

use super::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::{Axes, ConvSpec, Op, Origin, Spatial};

/// One per-spatial-dim argument: a single value for every dim, or one each.
fn per_dim(
    name: &str,
    what: &str,
    v: &[usize],
    d: usize,
) -> std::result::Result<Spatial<usize>, String> {
    match v.len() {
        1 => Ok(Spatial::from_elem(v[0], d)),
        n if n == d => Ok(Spatial::from_slice(v)),
        n => Err(format!(
            "{name}: {what} needs 1 or {d} values (one per spatial dim), got {n}"
        )),
    }
}

impl Tensor {
    /// The raw convolution op: `self [n, c, spatial..]` convolved with
    /// `weight [o, c / feature_groups, taps..]` exactly as `spec` says
    /// (StableHLO's `convolution` in channels-first layout: strides,
    /// padding that may be negative, input and kernel dilation, feature and
    /// batch groups). The PyTorch-style methods below are built on it; it
    /// is public for what they do not cover (asymmetric "same" padding,
    /// gradient formulas), like `jax.lax.conv_general_dilated`.
    #[track_caller]
    pub fn convolution(&self, weight: &Tensor, spec: &ConvSpec) -> Result<Tensor> {
        Tensor::apply(
            Op::Conv(Box::new(spec.clone())),
            &[self, weight],
            crate::site::caller(),
        )
    }

    /// Convolution (cross-correlation, as in PyTorch) of `self`
    /// `[n, c_in, spatial..]` with `weight` `[c_out, c_in / groups, taps..]`
    /// and an optional `bias` `[c_out]`, over as many spatial dims as the
    /// weight has (1 to 3). `stride`, `padding` (zeros, both sides) and
    /// `dilation` take one value for every dim or one per dim; each output
    /// length is `(len + 2 pad - dilation (k - 1) - 1) / stride + 1`.
    /// `groups` splits the channels into independent groups
    /// (`groups = c_in` is a depthwise convolution).
    #[track_caller]
    pub fn conv(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: &[usize],
        padding: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv",
            weight,
            bias,
            (stride, padding, dilation, groups),
            crate::site::caller(),
        )
    }

    /// 1-D convolution of `[n, c_in, len]` (see [`Tensor::conv`]).
    #[track_caller]
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv1d",
            weight,
            bias,
            (&[stride], &[padding], &[dilation], groups),
            crate::site::caller(),
        )
    }

    /// 2-D convolution of NCHW `[n, c_in, h, w]` with `weight`
    /// `[c_out, c_in / groups, kh, kw]` (see [`Tensor::conv`]).
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv2d",
            weight,
            bias,
            (
                &[stride.0, stride.1],
                &[padding.0, padding.1],
                &[dilation.0, dilation.1],
                groups,
            ),
            crate::site::caller(),
        )
    }

    /// 3-D convolution of `[n, c_in, d, h, w]` (see [`Tensor::conv`]).
    #[track_caller]
    pub fn conv3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 3],
        padding: [usize; 3],
        dilation: [usize; 3],
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv3d",
            weight,
            bias,
            (&stride, &padding, &dilation, groups),
            crate::site::caller(),
        )
    }

    /// Transposed convolution (PyTorch's `conv_transpose{1,2,3}d`, the
    /// gradient of a convolution with respect to its input) of `self`
    /// `[n, c_in, spatial..]` with `weight` `[c_in, c_out / groups, taps..]`
    /// and an optional `bias` `[c_out]`. Each output length is
    /// `(len - 1) stride - 2 pad + dilation (k - 1) + output_padding + 1`;
    /// `output_padding` (smaller than the stride or the dilation) picks
    /// among the lengths a strided convolution maps to the same size.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn conv_transpose(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: &[usize],
        padding: &[usize],
        output_padding: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let name = "conv_transpose";
        let err = |d: String| Error::op(name, d, describe(self, weight, bias), loc);
        let d = weight.rank().saturating_sub(2);
        check_operands(self, weight, d).map_err(err)?;
        let (x, k) = (self.dims(), weight.dims());
        let (c_in, og) = (k[0], k[1]);
        if groups == 0 || c_in % groups != 0 || x[1] != c_in {
            return Err(err(format!(
                "the weight [c_in, c_out / groups, ..] must have the input's {} channels \
                 first, split evenly into {groups} group(s); it has {c_in}",
                x[1]
            )));
        }
        let s = per_dim(name, "stride", stride, d).map_err(err)?;
        let p = per_dim(name, "padding", padding, d).map_err(err)?;
        let op = per_dim(name, "output_padding", output_padding, d).map_err(err)?;
        let dl = per_dim(name, "dilation", dilation, d).map_err(err)?;
        if s.contains(&0) || dl.contains(&0) {
            return Err(err("stride and dilation must be positive".into()));
        }
        let mut spec = ConvSpec::plain(d);
        for i in 0..d {
            if op[i] >= s[i] && op[i] >= dl[i] {
                return Err(err(format!(
                    "output_padding ({}) must be smaller than the stride ({}) or the dilation ({})",
                    op[i], s[i], dl[i]
                )));
            }
            let edge = (dl[i] * (k[i + 2].max(1) - 1)) as i64 - p[i] as i64;
            let len = (x[i + 2] as i64 - 1) * s[i] as i64 - 2 * p[i] as i64
                + (dl[i] * (k[i + 2].max(1) - 1)) as i64
                + op[i] as i64
                + 1;
            if x[i + 2] == 0 || k[i + 2] == 0 || len <= 0 {
                return Err(err(format!(
                    "spatial dim {i}: the output would have {len} elements"
                )));
            }
            spec.padding[i] = (edge, edge + op[i] as i64);
            spec.lhs_dilation[i] = s[i];
            spec.rhs_dilation[i] = dl[i];
        }
        spec.feature_groups = groups;
        let c_out = og * groups;
        check_bias(bias, c_out, self).map_err(err)?;
        // [c_in, og, taps] -> [g, c_in/g, og, taps] -> [g, og, c_in/g, taps]
        // -> [c_out, c_in/g, taps], taps reversed.
        let mut grouped = vec![groups, c_in / groups, og];
        grouped.extend_from_slice(&k[2..]);
        let mut perm: Vec<usize> = vec![0, 2, 1];
        perm.extend(3..3 + d);
        let mut flat = vec![c_out, c_in / groups];
        flat.extend_from_slice(&k[2..]);
        let w = weight
            .reshape_at(&grouped, loc)?
            .permute_at(&perm, loc)?
            .reshape_at(&flat, loc)?
            .flip_at(&(2..2 + d).collect::<Vec<_>>(), loc)?;
        let y = Tensor::apply(Op::Conv(Box::new(spec)), &[self, &w], loc)?;
        add_bias(y, bias, loc)
    }

    /// `self` with the element order along `axes` reversed (PyTorch's
    /// `flip`; negative axes count from the end).
    #[track_caller]
    pub fn flip(&self, axes: &[isize]) -> Result<Tensor> {
        let loc = crate::site::caller();
        let mut a = axes
            .iter()
            .map(|&x| self.axis("flip", x, self.rank(), loc))
            .collect::<Result<Vec<usize>>>()?;
        a.sort_unstable();
        a.dedup();
        self.flip_at(&a, loc)
    }

    fn flip_at(&self, axes: &[usize], loc: Origin) -> Result<Tensor> {
        Tensor::apply(Op::Reverse(Axes::from_slice(axes)), &[self], loc)
    }

    fn reshape_at(&self, dims: &[usize], loc: Origin) -> Result<Tensor> {
        Tensor::apply(Op::Reshape(lazyfuse_ir::Shape::new(dims)), &[self], loc)
    }

    fn permute_at(&self, perm: &[usize], loc: Origin) -> Result<Tensor> {
        Tensor::apply(Op::Permute(Axes::from_slice(perm)), &[self], loc)
    }

    /// The shared body of the forward convolutions.
    fn conv_at(
        &self,
        name: &'static str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (stride, padding, dilation, groups): (&[usize], &[usize], &[usize], usize),
        loc: Origin,
    ) -> Result<Tensor> {
        let err = |d: String| Error::op(name, d, describe(self, weight, bias), loc);
        let spec =
            forward_spec(self, weight, (stride, padding, dilation, groups), name).map_err(err)?;
        check_bias(bias, weight.dims()[0], self).map_err(err)?;
        let y = Tensor::apply(Op::Conv(Box::new(spec)), &[self, weight], loc)?;
        add_bias(y, bias, loc)
    }
}

fn describe(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> String {
    let mut s = format!("{}, {}", x.describe(), w.describe());
    if let Some(b) = b {
        s += &format!(", {}", b.describe());
    }
    s
}

/// Ranks and dtypes shared by every convolution.
fn check_operands(x: &Tensor, w: &Tensor, d: usize) -> std::result::Result<(), String> {
    if !(1..=3).contains(&d) || x.rank() != d + 2 {
        return Err(format!(
            "input must be [n, c, spatial..] and weight [out, in, taps..] over 1 to 3 spatial dims, \
             got ranks {} and {}",
            x.rank(),
            w.rank()
        ));
    }
    if !x.dtype().is_float() || w.dtype() != x.dtype() {
        return Err("input and weight must be float tensors of the same dtype".into());
    }
    Ok(())
}

fn check_bias(b: Option<&Tensor>, c_out: usize, x: &Tensor) -> std::result::Result<(), String> {
    match b {
        Some(b) if b.dims() != [c_out] || b.dtype() != x.dtype() => Err(format!(
            "bias must be [{c_out}] (c_out) of the input's dtype"
        )),
        _ => Ok(()),
    }
}

/// The op attributes of a forward convolution, or why the call is invalid.
fn forward_spec(
    x: &Tensor,
    w: &Tensor,
    (stride, padding, dilation, groups): (&[usize], &[usize], &[usize], usize),
    name: &str,
) -> std::result::Result<ConvSpec, String> {
    let d = w.rank().saturating_sub(2);
    check_operands(x, w, d)?;
    let (xd, k) = (x.dims(), w.dims());
    let (c_in, c_out) = (xd[1], k[0]);
    if groups == 0 || c_in % groups != 0 || c_out % groups != 0 {
        return Err(format!(
            "groups ({groups}) must be positive and divide both c_in ({c_in}) and c_out ({c_out})"
        ));
    }
    if k[1] * groups != c_in {
        return Err(format!(
            "weight has {} input channels per group, but c_in / groups = {c_in} / {groups} = {}",
            k[1],
            c_in / groups
        ));
    }
    let s = per_dim(name, "stride", stride, d)?;
    let p = per_dim(name, "padding", padding, d)?;
    let dl = per_dim(name, "dilation", dilation, d)?;
    if s.contains(&0) || dl.contains(&0) || k[2..].contains(&0) {
        return Err(format!(
            "kernel ({:?}), stride ({s:?}) and dilation ({dl:?}) must be positive",
            &k[2..]
        ));
    }
    let mut spec = ConvSpec::plain(d);
    for i in 0..d {
        let span = dl[i] * (k[i + 2] - 1) + 1;
        let padded = xd[i + 2] + 2 * p[i];
        if span > padded {
            return Err(format!(
                "spatial dim {i}: the kernel spans {span} (kernel {}, dilation {}) \
                 but the padded input is only {padded} ({} + 2 * {})",
                k[i + 2],
                dl[i],
                xd[i + 2],
                p[i]
            ));
        }
        spec.padding[i] = (p[i] as i64, p[i] as i64);
    }
    spec.stride = s;
    spec.rhs_dilation = dl;
    spec.feature_groups = groups;
    Ok(spec)
}

/// `y + bias` broadcast over the channel dim.
fn add_bias(y: Tensor, bias: Option<&Tensor>, loc: Origin) -> Result<Tensor> {
    let Some(b) = bias else { return Ok(y) };
    let mut dims = vec![1; y.rank()];
    dims[1] = b.dims()[0];
    let b = b.reshape_at(&dims, loc)?;
    Tensor::apply(Op::Binary(lazyfuse_ir::BinaryOp::Add), &[&y, &b], loc)
}
