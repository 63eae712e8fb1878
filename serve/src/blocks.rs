//! Which KV-cache blocks are free, which sequences hold which, and which
//! hold a known token prefix (prefix caching).
//!
//! A full block's contents depend only on the tokens up to its end, so a
//! block is named by a hash chained over every block before it: two
//! prompts that share their first `k` blocks of tokens share those `k`
//! blocks of keys and values. A block whose last holder finishes keeps its
//! contents and its name, on an eviction list (least recently released
//! first), until a new block is needed and no never-used one is left.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// The pool's bookkeeping (block 0, the scratch block, is never handed out).
pub struct BlockPool {
    block_size: usize,
    free: Vec<u32>,
    refs: Vec<u32>,
    /// Released blocks that still hold a named prefix, oldest first.
    evictable: VecDeque<u32>,
    by_hash: HashMap<u64, u32>,
    hash_of: Vec<Option<u64>>,
    /// Blocks reused from the prefix cache, and tokens they saved.
    pub hits: u64,
}

/// The name of the block after `parent` holding `tokens`.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockPool {
    /// `num_blocks` blocks of `block_size` positions, block 0 reserved.
    pub fn new(num_blocks: usize, block_size: usize) -> BlockPool {
        BlockPool {
            block_size,
            free: (1..num_blocks as u32).rev().collect(),
            refs: vec![0; num_blocks],
            evictable: VecDeque::new(),
            by_hash: HashMap::new(),
            hash_of: vec![None; num_blocks],
            hits: 0,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks a sequence could be given now (never used or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    /// Blocks a sequence can ever hold (all but the scratch block).
    pub fn capacity(&self) -> usize {
        self.refs.len() - 1
    }

    /// A block for a new holder: a never-used one, else the least recently
    /// released cached one (forgetting its prefix).
    pub fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.evictable.pop_front()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// The cached blocks holding `tokens`' leading full blocks, taken for a
    /// new holder; stops at the first block not cached. At most `max_blocks`.
    pub fn lookup(&mut self, tokens: &[u32], max_blocks: usize) -> (Vec<u32>, Vec<u64>) {
        let (mut blocks, mut hashes) = (Vec::new(), Vec::new());
        let mut parent = 0;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let h = chain_hash(parent, chunk);
            let Some(&b) = self.by_hash.get(&h) else {
                break;
            };
            if self.refs[b as usize] == 0 {
                self.evictable.retain(|&e| e != b);
            }
            self.refs[b as usize] += 1;
            blocks.push(b);
            hashes.push(h);
            parent = h;
        }
        self.hits += blocks.len() as u64;
        (blocks, hashes)
    }

    /// Names `block` (full, holding the tokens `hash` chains over) so later
    /// prompts with that prefix can reuse it. A name already held by
    /// another block keeps its first block.
    pub fn register(&mut self, block: u32, hash: u64) {
        if self.hash_of[block as usize].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.by_hash.insert(hash, block);
        self.hash_of[block as usize] = Some(hash);
    }

    /// One holder lets go of `blocks`.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks {
            let r = &mut self.refs[b as usize];
            debug_assert!(*r > 0, "block {b} released twice");
            *r = r.saturating_sub(1);
            if *r == 0 {
                if self.hash_of[b as usize].is_some() {
                    self.evictable.push_back(b);
                } else {
                    self.free.push(b);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_prefix_is_reused_then_evicted_when_space_runs_out() {
        let mut p = BlockPool::new(4, 2);
        assert_eq!(p.capacity(), 3);
        let toks = [1, 2, 3, 4, 5];
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        let h0 = chain_hash(0, &toks[0..2]);
        let h1 = chain_hash(h0, &toks[2..4]);
        p.register(a, h0);
        p.register(b, h1);
        p.release(&[a, b]);
        assert_eq!((p.used(), p.available()), (0, 3));
        let (got, _) = p.lookup(&toks, 8);
        assert_eq!(got, vec![a, b]);
        assert_eq!(p.used(), 2);
        // A different second block: only the first is shared.
        let (got2, _) = p.lookup(&[1, 2, 9, 9], 8);
        assert_eq!(got2, vec![a]);
        p.release(&got);
        p.release(&got2);
        // Three allocations: the never-used block, then the oldest released.
        let mut taken: Vec<u32> = (0..3).map(|_| p.allocate().unwrap()).collect();
        taken.sort();
        assert_eq!(taken, vec![1, 2, 3]);
        assert!(p.allocate().is_none());
        assert!(p.lookup(&toks, 8).0.is_empty());
    }
}
