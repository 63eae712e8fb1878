//! 2-D pooling (NCHW), composed from primitives like the training ops of
//! `composite.rs`: padding is a `cat` with constants, each of the `kh * kw`
//! window taps is a (strided) window cut with `narrow` and `reshape`, the
//! taps are stacked into an im2col tensor, and pooling is a `max` or `mean`
//! over the taps. So the reference interpreter defines them through the
//! primitives, autograd differentiates them with the primitives' rules, and
//! they fuse with their neighbours. (Convolution is an op of its own:
//! `conv.rs`.)
//!
//! Every argument is validated up front, so a bad call is an `Err` naming
//! `max_pool2d` / `avg_pool2d` and the caller's line, with nothing recorded.

use super::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::DType;

/// The sliding-window geometry of one spatial dim.
#[derive(Clone, Copy, Debug)]
struct Dim {
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    out: usize,
}

impl Dim {
    /// Validates one dim and computes its output size with PyTorch's formula
    /// `(size + 2 pad - dilation (kernel - 1) - 1) / stride + 1`.
    fn new(
        name: &str,
        size: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
    ) -> std::result::Result<Dim, String> {
        if kernel == 0 || stride == 0 || dilation == 0 {
            return Err(format!(
                "{name}: kernel ({kernel}), stride ({stride}) and dilation ({dilation}) must be positive"
            ));
        }
        let span = dilation * (kernel - 1) + 1;
        let padded = size + 2 * pad;
        if span > padded {
            return Err(format!(
                "{name}: the kernel spans {span} (kernel {kernel}, dilation {dilation}) \
                 but the padded input is only {padded} ({size} + 2 * {pad})"
            ));
        }
        let out = (padded - span) / stride + 1;
        Ok(Dim {
            size,
            kernel,
            stride,
            pad,
            dilation,
            out,
        })
    }

    /// Zeros to add after the bottom/right padding so that every tap's window
    /// of `out * stride` elements fits (the strided pick reshapes it to
    /// `[out, stride]` and keeps column 0; the extra elements are never read).
    fn extra(&self) -> usize {
        ((self.kernel - 1) * self.dilation + self.out * self.stride)
            .saturating_sub(self.size + 2 * self.pad)
    }
}

impl Tensor {
    /// `self` with `before` / `after` elements of `value` added along `axis`.
    #[track_caller]
    fn pad_axis(&self, axis: usize, before: usize, after: usize, value: f64) -> Result<Tensor> {
        if before == 0 && after == 0 {
            return Ok(self.clone());
        }
        // No closure here: `full` and `cat` must see the caller's location.
        let mut d = self.dims().to_vec();
        d[axis] = before;
        let b = Tensor::full(value, &d, self.dtype(), self.device())?;
        d[axis] = after;
        let a = Tensor::full(value, &d, self.dtype(), self.device())?;
        let parts: Vec<&Tensor> = [&b, self, &a]
            .into_iter()
            .filter(|t| t.dims()[axis] > 0)
            .collect();
        Tensor::cat(&parts, axis as isize)
    }

    /// The im2col tensor of an NCHW input: `[n, c, kh * kw, h_out, w_out]`,
    /// tap `(i, j)` at index `i * kw + j` holding
    /// `padded[n, c, i * dh + y * sh, j * dw + x * sw]`, where `padded` has
    /// `value` around the input.
    #[track_caller]
    fn patches(&self, h: Dim, w: Dim, value: f64) -> Result<Tensor> {
        let (n, c) = (self.dims()[0], self.dims()[1]);
        let xp = self
            .pad_axis(2, h.pad, h.pad + h.extra(), value)?
            .pad_axis(3, w.pad, w.pad + w.extra(), value)?;
        let mut taps = Vec::with_capacity(h.kernel * w.kernel);
        for i in 0..h.kernel {
            for j in 0..w.kernel {
                let mut t = xp.narrow(2, i * h.dilation, h.out * h.stride)?.narrow(
                    3,
                    j * w.dilation,
                    w.out * w.stride,
                )?;
                if h.stride > 1 || w.stride > 1 {
                    t = t
                        .reshape(&[n, c, h.out, h.stride, w.out, w.stride])?
                        .narrow(3, 0, 1)?
                        .narrow(5, 0, 1)?;
                }
                taps.push(t.reshape(&[n, c, 1, h.out, w.out])?);
            }
        }
        let refs: Vec<&Tensor> = taps.iter().collect();
        Tensor::cat(&refs, 2)
    }

    /// Checks a pooling call and returns its geometry.
    #[track_caller]
    fn pool_geometry(
        &self,
        op: &'static str,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<(Dim, Dim)> {
        let loc = crate::site::caller();
        let err = |d: String| Error::op(op, d, self.describe(), loc);
        if self.rank() != 4 {
            return Err(err(format!(
                "input must be NCHW (rank 4), got rank {}",
                self.rank()
            )));
        }
        if !self.dtype().is_float() {
            return Err(err("input must be a float tensor".into()));
        }
        // PyTorch's rule: padding at most half the kernel, so no window is
        // made of padding only.
        if 2 * padding.0 > kernel.0 || 2 * padding.1 > kernel.1 {
            return Err(err(format!(
                "padding {padding:?} must be at most half the kernel {kernel:?}"
            )));
        }
        let d = self.dims();
        let h = Dim::new("height", d[2], kernel.0, stride.0, padding.0, 1).map_err(err)?;
        let w = Dim::new("width", d[3], kernel.1, stride.1, padding.1, 1).map_err(err)?;
        Ok((h, w))
    }

    /// 2-D max pooling of an NCHW float input over `kernel` windows moved by
    /// `stride`, with `padding` of `-inf` (at most half the kernel, as in
    /// PyTorch). Output size `(h + 2 pad - kernel) / stride + 1`. Tied
    /// maxima share the gradient evenly.
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor> {
        let (h, w) = self.pool_geometry("max_pool2d", kernel, stride, padding)?;
        self.patches(h, w, f64::NEG_INFINITY)?.max([2], false)
    }

    /// [`Tensor::max_pool2d`] that also returns, per output, the index
    /// `y * w + x` in its input plane of the window's first maximum (i64),
    /// as PyTorch's `max_pool2d_with_indices`; that element alone gets the
    /// output's gradient, as in PyTorch (where `max_pool2d` shares it among
    /// tied maxima).
    #[track_caller]
    pub fn max_pool2d_with_indices(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<(Tensor, Tensor)> {
        let (h, w) = self.pool_geometry("max_pool2d_with_indices", kernel, stride, padding)?;
        let taps = self.patches(h, w, f64::NEG_INFINITY)?;
        let first = taps.argmax(2, true)?;
        let values = taps.gather(2, &first)?.squeeze(2)?;
        // The same windows over each element's own flat index (-1 in the padding).
        let plane = Tensor::arange(0.0, (h.size * w.size) as f64, DType::F64, self.device())?
            .reshape(&[1, 1, h.size, w.size])?
            .patches(h, w, -1.0)?
            .broadcast_to(taps.dims())?;
        let indices = plane.gather(2, &first)?.squeeze(2)?.to_dtype(DType::I64)?;
        Ok((values, indices))
    }

    /// 2-D average pooling of an NCHW float input over `kernel` windows moved
    /// by `stride`, with zero `padding` (at most half the kernel) counted in
    /// the average (PyTorch's default `count_include_pad=True`).
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor> {
        let (h, w) = self.pool_geometry("avg_pool2d", kernel, stride, padding)?;
        self.patches(h, w, 0.0)?.mean([2], false)
    }
}
