//! Resizing the spatial dims of channels-first tensors, PyTorch's
//! `interpolate`: nearest (`mode="nearest"`) and bilinear
//! (`mode="bilinear"`, either corner convention). Each axis is a gather of
//! source rows at host-computed indices (and for bilinear a blend of two
//! with host-computed weights), so it fuses with its neighbours, and the
//! gradient is the gathers' own: one scatter per axis.

use super::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::DType;

impl Tensor {
    /// Nearest-neighbour resize of every dim after the first two to `size`
    /// (one entry per spatial dim): output index `i` reads source index
    /// `floor(i * in / out)`, as PyTorch does when given sizes.
    #[track_caller]
    pub fn upsample_nearest(&self, size: &[usize]) -> Result<Tensor> {
        let loc = crate::site::caller();
        if self.rank() < 3 || size.len() != self.rank() - 2 || size.contains(&0) {
            return Err(Error::op(
                "upsample_nearest",
                format!(
                    "needs [n, c, spatial..] and one positive size per spatial dim, got {size:?}"
                ),
                self.describe(),
                loc,
            ));
        }
        let mut x = self.clone();
        for (i, &out) in size.iter().enumerate() {
            let axis = i + 2;
            let n = self.dims()[axis];
            let idx: Vec<i64> = (0..out)
                .map(|j| ((j as f64 * n as f64 / out as f64).floor() as usize).min(n - 1) as i64)
                .collect();
            let idx = Tensor::from_slice(&idx, &[out], self.device())?;
            x = x.index_select(axis as isize, &idx)?;
        }
        Ok(x)
    }

    /// Bilinear resize of an NCHW float tensor to `size` (PyTorch's
    /// `interpolate(mode="bilinear", align_corners=...)`): with
    /// `align_corners` the corner pixels of input and output coincide
    /// (source `i * (in - 1) / (out - 1)`), without it the pixel areas do
    /// (source `(i + 0.5) * in / out - 0.5`, clamped at 0).
    #[track_caller]
    pub fn upsample_bilinear(&self, size: (usize, usize), align_corners: bool) -> Result<Tensor> {
        let loc = crate::site::caller();
        if self.rank() != 4 || !self.dtype().is_float() || size.0 == 0 || size.1 == 0 {
            return Err(Error::op(
                "upsample_bilinear",
                format!("needs a float NCHW tensor and a positive size, got {size:?}"),
                self.describe(),
                loc,
            ));
        }
        self.linear_axis(2, size.0, align_corners)?
            .linear_axis(3, size.1, align_corners)
    }

    /// Linear interpolation along `axis` to `out` elements.
    fn linear_axis(&self, axis: usize, out: usize, align_corners: bool) -> Result<Tensor> {
        let n = self.dims()[axis];
        let (mut i0, mut i1, mut w1) = (Vec::new(), Vec::new(), Vec::new());
        for j in 0..out {
            let src = if align_corners {
                if out > 1 {
                    j as f64 * (n - 1) as f64 / (out - 1) as f64
                } else {
                    0.0
                }
            } else {
                ((j as f64 + 0.5) * n as f64 / out as f64 - 0.5).max(0.0)
            };
            let lo = (src.floor() as usize).min(n - 1);
            i0.push(lo as i64);
            i1.push((lo + 1).min(n - 1) as i64);
            w1.push(src - lo as f64);
        }
        let dev = self.device();
        let a = self.index_select(axis as isize, &Tensor::from_slice(&i0, &[out], dev)?)?;
        let b = self.index_select(axis as isize, &Tensor::from_slice(&i1, &[out], dev)?)?;
        let mut shape = vec![1; self.rank()];
        shape[axis] = out;
        let w = Tensor::from_slice(&w1, &[out], dev)?
            .to_dtype(self.dtype())?
            .reshape(&shape)?;
        let w0 = Tensor::ones(&[], DType::F64, dev)?
            .to_dtype(self.dtype())?
            .sub(&w)?;
        a.mul(&w0)?.add(&b.mul(&w)?)
    }
}
