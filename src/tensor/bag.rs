//! Embedding bags (`torch.nn.functional.embedding_bag`): the rows of a
//! table picked by a flat id list, summed or averaged per bag, where bags
//! are runs of the list starting at the given offsets. Composed of two
//! scatters and a scan, so the work is in the number of ids, never in the
//! table's rows: the lookup is one gather, each id's bag number is a
//! cumulative sum of bag starts, and the reduction one `index_add` into
//! `[bags, dim]`. Its gradient reaches the table as one `index_add` too.

use super::Tensor;
use crate::{Error, Result};
use lazyfuse_ir::DType;

impl Tensor {
    /// The bags of rows of `self` (a `[rows, dim]` float table): `ids` is
    /// a 1-D integer list, `offsets` the 1-D integer start of each bag in it
    /// (ascending, the first 0; bag `b` runs to the next start, the last to
    /// the end); each row is scaled by `per_sample_weights[j]` (`[n]`, sum
    /// mode only) when given. The result is `[bags, dim]`: each bag's sum,
    /// or its mean with `mean` (an empty bag is zeros, as in PyTorch).
    /// Ids clamp into the table like [`Tensor::index_select`].
    #[track_caller]
    pub fn embedding_bag(
        &self,
        ids: &Tensor,
        offsets: &Tensor,
        per_sample_weights: Option<&Tensor>,
        mean: bool,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let err = |d: &str| {
            let mut operands = format!(
                "{}, {}, {}",
                self.describe(),
                ids.describe(),
                offsets.describe()
            );
            if let Some(w) = per_sample_weights {
                operands += &format!(", {}", w.describe());
            }
            Error::op("embedding_bag", d, operands, loc)
        };
        if self.rank() != 2 || !self.dtype().is_float() {
            return Err(err("the table must be a float [rows, dim] tensor"));
        }
        let one_d_int = |t: &Tensor| t.rank() == 1 && t.dtype().is_int();
        if !one_d_int(ids) || !one_d_int(offsets) {
            return Err(err("ids and offsets must be 1-D integer tensors"));
        }
        let n = ids.dims()[0];
        if let Some(w) = per_sample_weights {
            if w.dims() != [n] || w.dtype() != self.dtype() || mean {
                return Err(err(
                    "per_sample_weights must be [n ids] of the table's dtype, in sum mode",
                ));
            }
        }
        if self.dims()[0] == 0 && n > 0 {
            return Err(err("cannot look up ids in a table of no rows"));
        }
        self.index_select(0, ids)?
            .bags(offsets, per_sample_weights, mean)
    }

    /// [`Tensor::embedding_bag`] of rows already looked up: `self` is
    /// `[n, dim]`, one row per id, reduced into `[bags, dim]` by `offsets`.
    /// A sparse-gradient embedding (`nn::EmbeddingBag`) differentiates the
    /// rows, not the table, through this.
    #[track_caller]
    pub fn bags(
        &self,
        offsets: &Tensor,
        per_sample_weights: Option<&Tensor>,
        mean: bool,
    ) -> Result<Tensor> {
        let loc = crate::site::caller();
        let err = |d: &str| {
            Error::op(
                "bags",
                d,
                format!("{}, {}", self.describe(), offsets.describe()),
                loc,
            )
        };
        if self.rank() != 2 || !self.dtype().is_float() {
            return Err(err("the rows must be a float [n, dim] tensor"));
        }
        if offsets.rank() != 1 || !offsets.dtype().is_int() {
            return Err(err("offsets must be a 1-D integer tensor"));
        }
        let (n, bags, dim) = (self.dims()[0], offsets.dims()[0], self.dims()[1]);
        if let Some(w) = per_sample_weights {
            if w.dims() != [n] || w.dtype() != self.dtype() || mean {
                return Err(err(
                    "per_sample_weights must be [n ids] of the rows' dtype, in sum mode",
                ));
            }
        }
        let (dt, dev) = (self.dtype(), self.device());
        let mut rows = self.clone();
        if let Some(w) = per_sample_weights {
            rows = rows.mul(&w.reshape(&[n, 1])?)?;
        }
        // Bag of each id: the number of bag starts at or before it, less 1.
        // Starts are marked in an [n + 1] vector so one at the end (an empty
        // last bag) lands past the ids instead of clamping onto the last.
        let ones = Tensor::ones(&[bags], DType::I64, dev)?;
        let starts = Tensor::zeros(&[n + 1], DType::I64, dev)?
            .index_add(0, offsets, &ones)?
            .narrow(0, 0, n)?;
        let bag = starts.cumsum(0)?.sub(1.0)?;
        let sums = Tensor::zeros(&[bags, dim], dt, dev)?.index_add(0, &bag, &rows)?;
        if !mean {
            return Ok(sums);
        }
        let counts =
            Tensor::zeros(&[bags], dt, dev)?.index_add(0, &bag, &Tensor::ones(&[n], dt, dev)?)?;
        sums.div(&counts.maximum(1.0)?.reshape(&[bags, 1])?)
    }
}
