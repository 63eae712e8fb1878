//! The shapes the engine runs: rows per decode step, tokens per prefill
//! chunk and blocks attended, each from a short ladder of powers of two,
//! so a warm-up can compile every one and a changing batch never does.

/// The ladders, and the limits they are cut to.
#[derive(Clone, Debug)]
pub struct Buckets {
    /// Positions per KV-cache block.
    pub block_size: usize,
    /// Longest sequence (prompt and generated tokens).
    pub max_model_len: usize,
    /// Prompt tokens (chunks, padding included) run between two decode
    /// steps: at least one chunk.
    pub prefill_budget: usize,
    rows: Vec<usize>,
    chunks: Vec<usize>,
    blocks: Vec<usize>,
}

/// `1, 2, 4, ...` below `max`, then `max`.
fn ladder(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..)
        .map(|i| 1usize << i)
        .take_while(|&x| x < max)
        .collect();
    v.push(max.max(1));
    v
}

impl Buckets {
    /// Ladders for up to `max_batch` decoding rows, prefill chunks of up to
    /// `chunk` tokens (rounded down to whole blocks, at least one) and
    /// sequences of up to `max_model_len` tokens.
    pub fn new(max_batch: usize, block_size: usize, max_model_len: usize, chunk: usize) -> Buckets {
        let max_blocks = max_model_len.div_ceil(block_size).max(1);
        let chunk_blocks = (chunk / block_size).clamp(1, max_blocks);
        // Rows: powers of two to 8, then every 4 to 16, then every 8, so a
        // batch pads by at most half of 8 rows once it is past 8.
        let max_batch = max_batch.max(1);
        let mut rows: Vec<usize> = ladder(max_batch.min(8));
        let mut r = 8;
        while r < max_batch {
            r += if r < 16 { 4 } else { 8 };
            rows.push(r.min(max_batch));
        }
        rows.dedup();
        Buckets {
            block_size,
            max_model_len,
            prefill_budget: chunk.max(1),
            rows,
            chunks: ladder(chunk_blocks)
                .into_iter()
                .map(|c| c * block_size)
                .collect(),
            blocks: ladder(max_blocks),
        }
    }

    /// Most rows a decode step runs.
    pub fn max_batch(&self) -> usize {
        *self.rows.last().expect("non-empty ladder")
    }

    /// Most blocks one sequence attends to.
    pub fn max_blocks(&self) -> usize {
        *self.blocks.last().expect("non-empty ladder")
    }

    /// Rows of the step that runs `k` decoding sequences.
    pub fn rows(&self, k: usize) -> usize {
        up(&self.rows, k)
    }

    /// Blocks of a step whose furthest row reaches `span` positions.
    pub fn blocks_for(&self, span: usize) -> usize {
        up(&self.blocks, span.div_ceil(self.block_size))
    }

    /// `(tokens, real tokens)` of the next prefill chunk at `start` (a
    /// block boundary) with `pending` prompt tokens left: the smallest
    /// chunk holding them (or the largest there is), shrunk to fit the
    /// context.
    pub fn chunk(&self, start: usize, pending: usize) -> (usize, usize) {
        let room = self.max_blocks() * self.block_size - start;
        let fits: Vec<usize> = self.chunks.iter().copied().filter(|&c| c <= room).collect();
        let t = fits
            .iter()
            .copied()
            .find(|&c| c >= pending)
            .or_else(|| fits.last().copied())
            .unwrap_or(self.block_size);
        (t, pending.min(t))
    }

    /// Every `(rows, tokens, blocks)` shape a step can have.
    pub fn all_shapes(&self) -> Vec<(usize, usize, usize)> {
        let mut v = vec![];
        for &b in &self.rows {
            for &n in &self.blocks {
                v.push((b, 1, n));
            }
        }
        for &t in &self.chunks {
            for &n in &self.blocks {
                if t <= n * self.block_size {
                    v.push((1, t, n));
                }
            }
        }
        v
    }
}

fn up(ladder: &[usize], k: usize) -> usize {
    ladder
        .iter()
        .copied()
        .find(|&x| x >= k)
        .unwrap_or(*ladder.last().expect("non-empty ladder"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladders_cover_every_step_the_engine_can_ask_for() {
        assert_eq!(
            Buckets::new(32, 16, 64, 64).rows,
            vec![1, 2, 4, 8, 12, 16, 24, 32]
        );
        assert_eq!(Buckets::new(6, 16, 64, 64).rows, vec![1, 2, 4, 6]);
        let b = Buckets::new(12, 16, 200, 64);
        assert_eq!(b.rows, vec![1, 2, 4, 8, 12]);
        assert_eq!(b.blocks, vec![1, 2, 4, 8, 13]);
        assert_eq!(b.chunks, vec![16, 32, 64]);
        assert_eq!(b.rows(5), 8);
        assert_eq!(b.rows(9), 12);
        assert_eq!(b.blocks_for(17), 2);
        assert_eq!(b.chunk(0, 5), (16, 5));
        assert_eq!(b.chunk(0, 100), (64, 64));
        // Near the end of the context the chunk shrinks to fit.
        assert_eq!(b.chunk(176, 30), (32, 30));
        assert_eq!(b.chunk(192, 30), (16, 16));
        let shapes = b.all_shapes();
        for start in (0..200).step_by(16) {
            for pending in 1..(200 - start) {
                let (t, _) = b.chunk(start, pending);
                assert!(shapes.contains(&(1, t, b.blocks_for(start + t))));
            }
        }
    }
}
