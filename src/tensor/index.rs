//! Indexed reads and accumulation, and seeded random tensors, recorded as
//! graph ops so they fuse with their neighbours (embedding lookups and their
//! gradients, dropout masks).

use super::Tensor;
use crate::{Device, Error, Key, Result};
use lazyfuse_ir::{DType, Literal, Op, Shape};

impl Tensor {
    /// Slices of `self` along `axis` picked by the 1-D integer tensor `idx`
    /// (repeats allowed): dim `axis` of the result has `idx`'s length.
    /// Out-of-range indices clamp to the nearest edge (XLA's gather rule);
    /// check indices on the host when they come from there.
    #[track_caller]
    pub fn index_select(&self, axis: isize, idx: &Tensor) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("index_select", axis, self.rank(), loc)?;
        Tensor::apply(Op::IndexSelect { axis }, &[self, idx], loc)
    }

    /// `self` with slice `j` of `src` added to slice `idx[j]` along `axis`
    /// (PyTorch's `index_add`; repeated indices accumulate, out-of-range
    /// ones clamp like [`Tensor::index_select`]). `src` has `self`'s shape
    /// with `idx.len()` along `axis`. One scatter: the gradient of a lookup
    /// and the sparse update of a large table (a donated table is updated in
    /// place, only the indexed rows touched).
    #[track_caller]
    pub fn index_add(&self, axis: isize, idx: &Tensor, src: &Tensor) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("index_add", axis, self.rank(), loc)?;
        Tensor::apply(Op::ScatterAdd { axis }, &[self, idx, src], loc)
    }

    /// `len` elements along `axis` from the run-time `start` (an integer
    /// scalar tensor, clamped into `0..=dim - len` as in XLA): the start is
    /// data, so a loop whose start moves compiles once. [`Tensor::narrow`]
    /// is the same read at a host start.
    #[track_caller]
    pub fn dynamic_slice(&self, axis: isize, start: &Tensor, len: usize) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("dynamic_slice", axis, self.rank(), loc)?;
        Tensor::apply(Op::DynamicSlice { axis, len }, &[self, start], loc)
    }

    /// `self` with `update` (`self`'s shape, shorter along `axis`) written
    /// along `axis` from the run-time `start` (an integer scalar tensor,
    /// clamped into `0..=dim - update_dim`). Writing a decode step's keys
    /// into a fixed-capacity cache is this op: the start is data, and XLA
    /// writes in place when the old buffer is donated.
    #[track_caller]
    pub fn dynamic_update_slice(
        &self,
        update: &Tensor,
        axis: isize,
        start: &Tensor,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let axis = self.axis("dynamic_update_slice", axis, self.rank(), loc)?;
        Tensor::apply(Op::DynamicUpdateSlice { axis }, &[self, update, start], loc)
    }

    /// Uniform `[0, 1)` values of a float `dtype`, drawn on `device` from a
    /// counter-based generator keyed by `key` (an explicit [`Key`], a `u64`
    /// seed, or `device.next_key()`): the same key gives the same numbers
    /// fused, unfused and in the interpreter. The key is recorded as a
    /// rank-0 region parameter, so a new key never recompiles.
    #[track_caller]
    pub fn rand_uniform(
        dims: &[usize],
        dtype: DType,
        key: impl Into<Key>,
        device: &Device,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let op = Op::RandomUniform {
            shape: Shape::new(dims),
            dtype,
        };
        // Validated before the key is recorded: an `Err` records nothing.
        lazyfuse_ir::infer(&op, &[(&Shape::scalar(), DType::I64)])
            .map_err(|e| Error::op("rand_uniform", e, format!("{dtype}{:?}", dims), loc))?;
        let key = Op::Constant {
            value: Literal::Int(key.into().bits() as i64),
            shape: Shape::scalar(),
            dtype: DType::I64,
        };
        let key = Tensor::apply_nullary("rand_uniform", key, device, loc)?;
        Tensor::apply(op, &[&key], loc)
    }
}
