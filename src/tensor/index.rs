//! Indexed reads and seeded random tensors, recorded as graph ops so they fuse
//! with their consumers (embedding lookups, dropout masks).

use super::Tensor;
use crate::{Device, Result};
use lazyfuse_ir::{DType, Op, Shape};
use std::panic::Location;

impl Tensor {
    /// Slices of `self` along `axis` picked by the 1-D integer tensor `idx`
    /// (repeats allowed): dim `axis` of the result has `idx`'s length.
    /// Out-of-range indices clamp to the nearest edge (XLA's gather rule);
    /// check indices on the host when they come from there.
    #[track_caller]
    pub fn index_select(&self, axis: isize, idx: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let axis = self.axis("index_select", axis, self.rank(), loc)?;
        Tensor::apply(Op::IndexSelect { axis }, &[self, idx], loc)
    }

    /// Uniform `[0, 1)` values of a float `dtype`, drawn on the device from a
    /// counter-based generator keyed by `seed` (an i64 scalar tensor): the same
    /// seed gives the same numbers fused, unfused and in the interpreter, and
    /// a new seed value never recompiles.
    #[track_caller]
    pub fn rand_uniform(seed: &Tensor, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let op = Op::RandomUniform {
            shape: Shape::new(dims),
            dtype,
        };
        Tensor::apply(op, &[seed], Location::caller())
    }

    /// An i64 scalar seed tensor for [`Tensor::rand_uniform`] (uploaded, so it
    /// enters graphs as an input rather than a compiled-in constant).
    pub fn seed(seed: i64, device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&[seed], &[], device)
    }
}
