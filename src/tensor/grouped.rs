//! Ops for grouped (mixture-of-experts) computation, composed from
//! primitives: running sums, top-k, stable grouping of ids, and the ragged
//! (grouped) matrix product.
//!
//! All of them keep static shapes: what they depend on at run time (which
//! expert a token picked, how many tokens an expert got) reaches the
//! compiled code as data, so a decode loop or a batch of changing mix
//! compiles once and never syncs to the host. Like every composite they
//! fuse with their neighbours and autograd differentiates them through the
//! primitives they record.

use super::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::DType;

#[track_caller]
fn op_err(op: &'static str, detail: impl std::fmt::Display, operands: String) -> Error {
    Error::op(op, detail, operands, crate::site::caller())
}

/// `[0, n)` as i64 `[n]`.
#[track_caller]
fn iota(n: usize, t: &Tensor) -> Result<Tensor> {
    Tensor::arange(0.0, n as f64, DType::I64, t.device())
}

/// The rows a tile of the ragged product covers: one when there are no
/// more rows than groups (each row its own item, reading only its group's
/// matrix), else about `rows / groups`, at most 128, so the padding work of
/// the tiles a group boundary splits stays small against the whole.
fn tile_rows(rows: usize, groups: usize) -> usize {
    if rows <= groups {
        1
    } else {
        rows.div_ceil(groups).next_power_of_two().min(128)
    }
}

impl Tensor {
    /// Running sum along `axis` (`torch.cumsum`): `out[i] = x[0] + .. + x[i]`.
    ///
    /// A log-depth scan (each step adds the sums shifted by a power of two),
    /// so `n` elements cost `log2 n` fused adds, not an `n x n` product.
    /// Integer sums are exact; float sums associate differently from a
    /// left-to-right loop.
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Result<Tensor> {
        let a = self.axis("cumsum", axis, self.rank(), crate::site::caller())?;
        if !self.dtype().is_numeric() {
            return Err(op_err("cumsum", "needs a numeric tensor", self.describe()));
        }
        let n = self.dims()[a];
        let mut x = self.clone();
        let mut step = 1;
        while step < n {
            let mut zd = self.dims().to_vec();
            zd[a] = step;
            let zeros = Tensor::zeros(&zd, self.dtype(), self.device())?;
            let shifted = Tensor::cat(&[&zeros, &x.narrow(a as isize, 0, n - step)?], a as isize)?;
            x = x.add(&shifted)?;
            step *= 2;
        }
        Ok(x)
    }

    /// The `k` largest elements along the last axis, in descending order,
    /// and their indices (i64) (`torch.topk(x, k)`).
    ///
    /// Equal values come out lowest index first; NaN counts as the largest
    /// value, as in `argmax`; no index is picked twice, even when the rest
    /// are all `-inf`. Gradients flow to the picked elements. `k` rounds
    /// of `argmax`, so it suits small `k` (routing, beam search).
    #[track_caller]
    pub fn topk(&self, k: usize) -> Result<(Tensor, Tensor)> {
        let n = *self.dims().last().unwrap_or(&0);
        if self.rank() == 0 || k == 0 || k > n || !self.dtype().is_float() {
            return Err(op_err(
                "topk",
                format!(
                    "needs a float tensor of rank >= 1 and 1 <= k <= the last axis, got k = {k}"
                ),
                self.describe(),
            ));
        }
        let classes = iota(n, self)?;
        let plain = self.stop_gradient(crate::site::caller())?;
        let mut rest = plain.clone();
        let mut taken = classes.lt(0.0)?;
        let mut picked = Vec::with_capacity(k);
        for _ in 0..k {
            // When every untaken value is -inf, argmax could land on a taken
            // (masked) index: take the first untaken one instead.
            let best = rest.argmax(-1, true)?;
            let all_low = rest.max([-1], true)?.eq(f64::NEG_INFINITY)?;
            let first_free = taken.to_dtype(DType::F32)?.neg()?.argmax(-1, true)?;
            let idx = all_low.where_cond(&first_free, &best)?;
            let hit = idx.eq(&classes)?;
            taken = taken.where_cond(&taken, &hit)?;
            rest = rest.masked_fill(&hit, f64::NEG_INFINITY)?;
            picked.push(idx);
        }
        let refs: Vec<&Tensor> = picked.iter().collect();
        let idx = Tensor::cat(&refs, -1)?;
        Ok((self.gather(-1, &idx)?, idx))
    }

    /// A stable sort of integer ids `[m]` by value, each in `[0, groups)`
    /// (others are clamped into range): `order [m]` (the position in
    /// `self` of each sorted element), `positions [m]` (where each element
    /// went: `order[positions[i]] == i`) and the group sizes `[groups]`,
    /// all i64. With a token's expert choices as ids, `index_select(order)`
    /// puts each expert's tokens side by side for [`Tensor::ragged_dot`],
    /// and `index_select(positions)` brings the results back.
    #[track_caller]
    pub fn group_by(&self, groups: usize) -> Result<(Tensor, Tensor, Tensor)> {
        if self.rank() != 1 || !self.dtype().is_int() || groups == 0 {
            return Err(op_err(
                "group_by",
                format!("needs 1-D integer ids and at least one group, got {groups} groups"),
                self.describe(),
            ));
        }
        let m = self.dims()[0];
        let ids = self
            .to_dtype(DType::I64)?
            .maximum(0.0)?
            .minimum(groups as f64 - 1.0)?;
        let onehot = ids
            .reshape(&[m, 1])?
            .eq(&iota(groups, self)?.reshape(&[1, groups])?)?
            .to_dtype(DType::I64)?;
        let sizes = onehot.sum([0], false)?;
        // An element's place: its group's start plus the elements of its
        // group before it.
        let before = onehot.cumsum(0)?.sub(&onehot)?;
        let starts = sizes.cumsum(0)?.sub(&sizes)?.reshape(&[1, groups])?;
        let positions = before.add(&starts)?.mul(&onehot)?.sum([1], false)?;
        let order = positions
            .reshape(&[1, m])?
            .eq(&iota(m, self)?.reshape(&[m, 1])?)?
            .to_dtype(DType::I32)?
            .argmax(-1, false)?;
        Ok((order, positions, sizes))
    }

    /// The ragged (grouped) matrix product (`jax.lax.ragged_dot`): rows of
    /// `self` `[m, k]` come in consecutive groups of `group_sizes[g]` rows
    /// (`[groups]`, integer, on the device), and group `g`'s rows are
    /// multiplied by `rhs[g]` (`rhs` `[groups, k, n]`); `[m, n]`. Rows past
    /// the sum of the sizes are zero.
    ///
    /// The sizes are data, so the shapes are static: the rows are cut into
    /// tiles, each (tile, group) pair that shares rows becomes one item of
    /// a batched product (at most `tiles + groups - 1` items, each reading
    /// its group's matrix), and every row is read back from its own item.
    /// The work is the real rows' plus at most one tile per group boundary,
    /// where multiplying every row by every group (the masked dense form)
    /// does `groups` times the real work.
    #[track_caller]
    pub fn ragged_dot(&self, rhs: &Tensor, group_sizes: &Tensor) -> Result<Tensor> {
        let ok = self.rank() == 2
            && rhs.rank() == 3
            && group_sizes.rank() == 1
            && group_sizes.dtype().is_int()
            && self.dtype() == rhs.dtype()
            && self.dtype().is_float()
            && rhs.dims()[1] == self.dims()[1]
            && group_sizes.dims()[0] == rhs.dims()[0];
        if !ok {
            return Err(op_err(
                "ragged_dot",
                "needs float lhs [m, k], rhs [groups, k, n] of its dtype and integer group sizes [groups]",
                format!(
                    "{}, {}, {}",
                    self.describe(),
                    rhs.describe(),
                    group_sizes.describe()
                ),
            ));
        }
        let (m, k) = (self.dims()[0], self.dims()[1]);
        let (groups, n) = (rhs.dims()[0], rhs.dims()[2]);
        if m == 0 || groups == 0 {
            return Tensor::zeros(&[m, n], self.dtype(), self.device());
        }
        #[cfg(feature = "xla")]
        if let Some(y) = super::grouped_host::ragged_dot(self, rhs, group_sizes)? {
            return Ok(y);
        }
        let t = tile_rows(m, groups);
        let tiles = m.div_ceil(t);
        let items = tiles + (groups - 1).min(tiles * (t - 1));
        let sizes = group_sizes.to_dtype(DType::I64)?.maximum(0.0)?;
        let ends = sizes.cumsum(0)?;
        let starts = ends.sub(&sizes)?;
        // [tiles, groups]: whether group g has rows in tile i.
        let lo = iota(tiles, self)?.mul(t as f64)?.reshape(&[tiles, 1])?;
        let hi = lo.add(t as f64)?;
        let row = |v: &Tensor| v.reshape(&[1, groups]);
        let i64 = |b: Tensor| b.to_dtype(DType::I64);
        let shares = i64(row(&starts)?.lt(&hi)?)?
            .mul(&i64(row(&ends)?.gt(&lo)?)?)?
            .mul(&i64(row(&sizes)?.gt(0.0)?)?)?
            .reshape(&[tiles * groups])?;
        // Item number of each sharing pair, in (tile, group) order, and
        // the pair of each item (an unused item computes pair 0, unread).
        let item_of_pair = shares.cumsum(0)?.sub(&shares)?;
        let pair_of_item = item_of_pair
            .reshape(&[1, tiles * groups])?
            .eq(&iota(items, self)?.reshape(&[items, 1])?)?
            .to_dtype(DType::I32)?
            .mul(&shares.reshape(&[1, tiles * groups])?.to_dtype(DType::I32)?)?
            .argmax(-1, false)?;
        let tile_of_pair = iota(tiles, self)?
            .reshape(&[tiles, 1])?
            .broadcast_to(&[tiles, groups])?
            .reshape(&[tiles * groups])?;
        let group_of_pair = iota(groups, self)?
            .reshape(&[1, groups])?
            .broadcast_to(&[tiles, groups])?
            .reshape(&[tiles * groups])?;
        let item_tile = tile_of_pair.index_select(0, &pair_of_item)?;
        let item_group = group_of_pair.index_select(0, &pair_of_item)?;
        let padded = if tiles * t == m {
            self.clone()
        } else {
            let pad = Tensor::zeros(&[tiles * t - m, k], self.dtype(), self.device())?;
            Tensor::cat(&[self, &pad], 0)?
        };
        // Each item's tile and group matrix gathered, then one batched
        // product. (Per-item 2-D products over `dynamic_slice`d or
        // narrowed operands measured slower on the CPU plugin.)
        let lhs = padded
            .reshape(&[tiles, t, k])?
            .index_select(0, &item_tile)?;
        let w = rhs.index_select(0, &item_group)?;
        let products = lhs.matmul(&w)?.reshape(&[items * t, n])?;

        // Each row's group (groups ending at or before it), its item, and
        // its offset in the item's tile.
        let r = iota(m, self)?;
        let group_of_row = row(&ends)?
            .le(&r.reshape(&[m, 1])?)?
            .to_dtype(DType::I64)?
            .sum([1], false)?;
        let valid = group_of_row.lt(groups as f64)?;
        let tile_of_row = iota(tiles, self)?
            .reshape(&[tiles, 1])?
            .broadcast_to(&[tiles, t])?
            .reshape(&[tiles * t])?
            .narrow(0, 0, m)?;
        let pair = tile_of_row
            .mul(groups as f64)?
            .add(&group_of_row.minimum(groups as f64 - 1.0)?)?;
        let within = iota(t, self)?
            .reshape(&[1, t])?
            .broadcast_to(&[tiles, t])?
            .reshape(&[tiles * t])?
            .narrow(0, 0, m)?;
        let at = item_of_pair
            .index_select(0, &pair)?
            .mul(t as f64)?
            .add(&within)?;
        let zero = Tensor::zeros(&[], self.dtype(), self.device())?;
        valid
            .reshape(&[m, 1])?
            .where_cond(&products.index_select(0, &at)?, &zero)
    }
}
