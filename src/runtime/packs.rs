//! The runtime's cache of uploaded scalar packs (a region's lifted scalars
//! of one dtype, one rank-1 buffer).
//!
//! Cached by content, so a loop whose scalars repeat (a constant learning
//! rate, a GELU's coefficients) transfers nothing, and the regions of one
//! flush that share their scalars share one transfer. A scalar with a new
//! value every step (Adam's bias correction, a learning-rate schedule)
//! makes a new pack every step: packs unused for [`IDLE_FLUSHES`] flushes
//! are dropped at the next flush, so a loop's cached packs stay at a
//! steady count instead of piling up to a bound and being cleared (a
//! sawtooth of live buffers that a 10,000-step run showed as growth).

use lazyfuse_ir::{DType, Literal};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// A pack's identity: its values, their dtype and the device it is on.
pub(crate) type PackKey = (SmallVec<[Literal; 8]>, DType, usize);

/// Flushes a cached pack may go unused before it is dropped: more than a
/// training step's flushes (a loss read, then the optimizer's sync), so a
/// pack used once a step is kept.
pub(crate) const IDLE_FLUSHES: u64 = 16;

/// Bound on cached packs: past it, new packs are uploaded uncached (a
/// single flush with more distinct packs than this gains little from
/// caching them).
const MAX_PACKS: usize = 1024;

/// Uploaded packs (`V`: a device buffer) with the flush that last used each.
pub(crate) struct PackCache<V> {
    packs: HashMap<PackKey, (V, u64), BuildHasherDefault<ahash::AHasher>>,
    /// Flushes begun so far.
    flush: u64,
}

impl<V> Default for PackCache<V> {
    fn default() -> Self {
        PackCache {
            packs: HashMap::default(),
            flush: 0,
        }
    }
}

impl<V: Clone> PackCache<V> {
    /// The cached pack for `key`, marked as used by this flush.
    pub(crate) fn get(&mut self, key: &PackKey) -> Option<V> {
        let flush = self.flush;
        self.packs.get_mut(key).map(|(v, used)| {
            *used = flush;
            v.clone()
        })
    }

    /// Caches `value` for `key` (unless the cache is full).
    pub(crate) fn insert(&mut self, key: PackKey, value: V) {
        if self.packs.len() < MAX_PACKS {
            self.packs.insert(key, (value, self.flush));
        }
    }

    /// A new flush begins: drops the packs no flush used in the last
    /// [`IDLE_FLUSHES`] flushes.
    pub(crate) fn next_flush(&mut self) {
        self.flush += 1;
        let flush = self.flush;
        self.packs
            .retain(|_, (_, used)| flush - *used <= IDLE_FLUSHES);
    }

    /// Packs cached now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.packs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: f64) -> PackKey {
        (SmallVec::from_slice(&[Literal::Float(v)]), DType::F32, 0)
    }

    #[test]
    fn a_pack_used_every_flush_stays_and_a_new_value_each_flush_does_not_pile_up() {
        let mut c: PackCache<u32> = PackCache::default();
        for step in 0..200u32 {
            c.next_flush();
            if c.get(&key(0.5)).is_none() {
                c.insert(key(0.5), 7);
            }
            let lr = 1.0 / f64::from(step + 3);
            assert!(c.get(&key(lr)).is_none(), "a new value is a miss");
            c.insert(key(lr), step);
            if step > 20 {
                // The constant pack plus one per recent flush.
                assert_eq!(c.len(), 1 + IDLE_FLUSHES as usize + 1);
            }
        }
        assert_eq!(c.get(&key(0.5)), Some(7));
    }

    #[test]
    fn a_pack_used_once_every_few_flushes_is_kept() {
        let mut c: PackCache<u32> = PackCache::default();
        c.next_flush();
        c.insert(key(2.0), 1);
        for _ in 0..10 {
            for _ in 0..IDLE_FLUSHES {
                c.next_flush();
            }
            assert_eq!(c.get(&key(2.0)), Some(1));
        }
        for _ in 0..=IDLE_FLUSHES {
            c.next_flush();
        }
        assert_eq!(c.get(&key(2.0)), None, "idle past the bound: dropped");
    }

    #[test]
    fn a_full_cache_uploads_uncached_instead_of_clearing() {
        let mut c: PackCache<u32> = PackCache::default();
        c.next_flush();
        for i in 0..MAX_PACKS + 10 {
            c.insert(key(i as f64), i as u32);
        }
        assert_eq!(c.len(), MAX_PACKS);
        assert_eq!(c.get(&key(0.0)), Some(0));
    }
}
