//! SGD for sparse-gradient embedding tables: each lookup's row gradients
//! are added into the looked-up rows, `table.index_add(0, ids, -lr * g)`,
//! so the work and memory are in the rows read, not the table's size.
//! (PyTorch's `optim.SGD` over `sparse=True` embeddings.)

use crate::autograd::NoGradGuard;
use crate::nn::EmbeddingBag;
use crate::Result;

/// Plain SGD on the rows a sparse [`EmbeddingBag`] looked up.
pub struct SparseSgd {
    /// The learning rate.
    pub lr: f64,
}

impl SparseSgd {
    /// SGD with learning rate `lr`.
    pub fn new(lr: f64) -> SparseSgd {
        SparseSgd { lr }
    }

    /// Applies the gradients of every lookup since the last step to
    /// `tables` (sparse ones; a dense table is the dense optimizers' job
    /// and is skipped). Repeated ids accumulate, as the dense gradient
    /// would. The updates stay pending until the next read or step.
    pub fn step(&self, tables: &[&EmbeddingBag]) -> Result<()> {
        let _ng = NoGradGuard::new();
        for t in tables.iter().filter(|t| t.is_sparse()) {
            let mut w = t.weight.tensor();
            for (ids, g) in t.take_sparse_grads() {
                w = w.index_add(0, &ids, &g.mul(-self.lr)?)?;
            }
            t.weight.set_frozen(w)?;
        }
        Ok(())
    }
}
