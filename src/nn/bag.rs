//! `EmbeddingBag`: a table looked up in bags (recommendation models' sparse
//! features), with PyTorch's `sparse=True` gradients available: in sparse
//! mode the table records no tape; each lookup's rows become a leaf of
//! their own, and the optimizer crate's `SparseSgd` adds their gradients back into
//! the indexed rows with one scatter. No table-sized gradient is ever made,
//! and the update writes the table in place (its old buffer is donated).

use super::{join, Module, Param};
use crate::{Device, Error, Key, Result, Tensor};
use parking_lot::Mutex;

/// A `[rows, dim]` embedding table reduced per bag (sum or mean).
pub struct EmbeddingBag {
    /// The `[rows, dim]` table (frozen in sparse mode: no dense gradient).
    pub weight: Param,
    /// Average each bag (`false`: sum).
    pub mean: bool,
    sparse: bool,
    /// Sparse mode: `(ids, rows)` of each lookup since the optimizer's last
    /// step, `rows` being the leaf the gradient reaches.
    lookups: Mutex<Vec<(Tensor, Tensor)>>,
}

impl EmbeddingBag {
    /// A table of `rows x dim` uniform in `±sqrt(1 / rows)` (the reference
    /// DLRM's initialisation), from `key`; `sparse` selects sparse
    /// gradients.
    #[track_caller]
    pub fn new(
        rows: usize,
        dim: usize,
        mean: bool,
        sparse: bool,
        key: impl Into<Key>,
        dev: &Device,
    ) -> Result<EmbeddingBag> {
        let b = (1.0 / rows.max(1) as f64).sqrt();
        let w = Tensor::rand(&[rows, dim], key, dev)?.mul(2.0 * b)?.sub(b)?;
        EmbeddingBag::from_tensor(w, mean, sparse)
    }

    /// A bag module over a loaded `[rows, dim]` float table.
    #[track_caller]
    pub fn from_tensor(weight: Tensor, mean: bool, sparse: bool) -> Result<EmbeddingBag> {
        if weight.rank() != 2 || !weight.dtype().is_float() {
            return Err(Error::op(
                "EmbeddingBag",
                "the table must be a float [rows, dim] tensor",
                weight.describe(),
                crate::site::caller(),
            ));
        }
        Ok(EmbeddingBag {
            weight: if sparse {
                Param::frozen(weight)?
            } else {
                Param::new(weight)?
            },
            mean,
            sparse,
            lookups: Mutex::new(Vec::new()),
        })
    }

    /// Whether gradients are sparse (see the module doc).
    pub fn is_sparse(&self) -> bool {
        self.sparse
    }

    /// The bags of `ids` starting at `offsets` (see
    /// [`Tensor::embedding_bag`]), `[bags, dim]`.
    #[track_caller]
    pub fn forward_bags(
        &self,
        ids: &Tensor,
        offsets: &Tensor,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        let table = self.weight.tensor();
        if !self.sparse || !crate::is_grad_enabled() {
            return table.embedding_bag(ids, offsets, per_sample_weights, self.mean);
        }
        // Untracked whatever the table is marked: the rows are the leaf.
        let rows = crate::no_grad(|| table.index_select(0, ids))?;
        rows.set_requires_grad(true)?;
        let out = rows.bags(offsets, per_sample_weights, self.mean)?;
        self.lookups.lock().push((ids.clone(), rows));
        Ok(out)
    }

    /// Sparse mode: the `(ids, row gradients)` of the lookups since the
    /// last call (lookups whose rows got no gradient are dropped).
    pub(crate) fn take_sparse_grads(&self) -> Vec<(Tensor, Tensor)> {
        std::mem::take(&mut *self.lookups.lock())
            .into_iter()
            .filter_map(|(ids, rows)| rows.grad().map(|g| (ids, g)))
            .collect()
    }
}

impl Module for EmbeddingBag {
    /// One bag per id (`x` a 1-D id list): each row on its own.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.dims().first().copied().unwrap_or(0);
        let offsets = Tensor::arange(0.0, n as f64, lazyfuse_ir::DType::I64, x.device())?;
        self.forward_bags(x, &offsets, None)
    }

    fn visit_params(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((join(prefix, "weight"), self.weight.clone()));
    }
}
