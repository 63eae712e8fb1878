//! The key/value cache: a fixed capacity per sequence, so that a decode
//! step has the same shapes at every position and compiles once. The
//! positions written so far, and each sequence's left padding, are host
//! state; they reach the device as the step's attention mask and rotary
//! tables (inputs, not constants, so they never cause a recompile).

use lazyfuse::Tensor;

/// Keys and values of every layer for `batch` sequences, `capacity`
/// columns each (`[batch, kv_heads, capacity, head_dim]` per layer).
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
    capacity: usize,
    /// Leading padding columns of each sequence (left-padded prompts).
    pads: Vec<usize>,
}

impl KvCache {
    pub(crate) fn new(
        k: Vec<Tensor>,
        v: Vec<Tensor>,
        capacity: usize,
        pads: Vec<usize>,
    ) -> KvCache {
        KvCache {
            k,
            v,
            len: 0,
            capacity,
            pads,
        }
    }

    /// Columns written so far (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Columns it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sequences it holds.
    pub fn batch(&self) -> usize {
        self.pads.len()
    }

    /// Layer `i`'s keys and values.
    pub(crate) fn layer_mut(&mut self, i: usize) -> (&mut Tensor, &mut Tensor) {
        (&mut self.k[i], &mut self.v[i])
    }

    /// `t` more columns were written.
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// The rotary position of each of the next `t` columns, per sequence:
    /// counted from its first real token (padding columns get 0; they are
    /// never attended to).
    pub(crate) fn positions(&self, t: usize) -> Vec<Vec<usize>> {
        self.pads
            .iter()
            .map(|&pad| {
                (self.len..self.len + t)
                    .map(|c| c.saturating_sub(pad))
                    .collect()
            })
            .collect()
    }

    /// `[batch, 1, t, capacity]` flattened: true where query column
    /// `len + q` must not see key column `k` (a later column, or padding).
    pub(crate) fn masked(&self, t: usize) -> Vec<bool> {
        let mut m = Vec::with_capacity(self.batch() * t * self.capacity);
        for &pad in &self.pads {
            for q in self.len..self.len + t {
                m.extend((0..self.capacity).map(|k| k > q || k < pad));
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_positions_follow_padding() {
        let c = KvCache::new(vec![], vec![], 4, vec![0, 2]);
        assert_eq!(c.positions(3), vec![vec![0, 1, 2], vec![0, 0, 0]]);
        let m = c.masked(1);
        // Sequence 0, query column 0: sees key 0 only.
        assert_eq!(&m[0..4], &[false, true, true, true]);
        // Sequence 1 (two padding columns), query 0: sees nothing real.
        assert_eq!(&m[4..8], &[true, true, true, true]);
    }
}
