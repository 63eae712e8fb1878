//! The one random-number convention: every random function takes a [`Key`].
//! A key is either explicit (JAX's style: `Key::new(seed)`, split or folded
//! for each use, so a program's randomness is a pure function of its keys)
//! or drawn from a device's seeded generator (PyTorch's style:
//! `device.manual_seed(s)` once, then `device.next_key()` per use). The
//! same key gives the same numbers fused, unfused and in the interpreter.

use lazyfuse_ir::{splitmix64, SplitMix64};
use parking_lot::Mutex;

/// A random key: 64 bits from which a random function derives all its
/// numbers. Cheap to copy; `From<u64>`, so a plain seed is a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u64);

impl Key {
    /// The key of `seed` (the same as `Key::from(seed)`).
    pub const fn new(seed: u64) -> Key {
        Key(seed)
    }

    /// A new key for the `data`-th use of this one (a step number, a layer
    /// index): distinct `data` give independent keys, the same `data` the
    /// same key.
    pub fn fold_in(self, data: u64) -> Key {
        Key(splitmix64(
            self.0 ^ splitmix64(data.wrapping_add(SplitMix64::GAMMA)),
        ))
    }

    /// Two independent keys from this one (JAX's `split`).
    pub fn split(self) -> (Key, Key) {
        (self.fold_in(0), self.fold_in(1))
    }

    /// The key's 64 bits (what the generators are seeded with).
    pub fn bits(self) -> u64 {
        self.0
    }
}

impl From<u64> for Key {
    fn from(seed: u64) -> Key {
        Key(seed)
    }
}

/// A device's seeded generator: key `n` after `manual_seed(s)` is
/// `Key::new(s).fold_in(n)`, so a program that seeds once and draws in
/// order is reproducible, and reseeding restarts the stream.
pub(crate) struct Generator {
    /// The seed and the number of keys drawn since it was set.
    state: Mutex<(u64, u64)>,
}

impl Generator {
    /// A generator seeded with 0 (a fresh process is reproducible unseeded).
    pub(crate) fn new() -> Generator {
        Generator {
            state: Mutex::new((0, 0)),
        }
    }

    /// Restarts the stream from `seed`.
    pub(crate) fn manual_seed(&self, seed: u64) {
        *self.state.lock() = (seed, 0);
    }

    /// The next key of the stream.
    pub(crate) fn next_key(&self) -> Key {
        let mut s = self.state.lock();
        let key = Key::new(s.0).fold_in(s.1);
        s.1 += 1;
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fold_and_split_deterministically() {
        let k = Key::new(7);
        assert_eq!(k.fold_in(3), Key::new(7).fold_in(3));
        assert_ne!(k.fold_in(3), k.fold_in(4));
        assert_ne!(k.fold_in(0), Key::new(8).fold_in(0));
        let (a, b) = k.split();
        assert_ne!(a, b);
        assert_eq!(Key::from(7u64), k);
    }

    #[test]
    fn a_reseeded_generator_repeats_its_stream() {
        let g = Generator::new();
        g.manual_seed(5);
        let first: Vec<Key> = (0..3).map(|_| g.next_key()).collect();
        g.manual_seed(5);
        let again: Vec<Key> = (0..3).map(|_| g.next_key()).collect();
        assert_eq!(first, again);
        assert_eq!(first[1], Key::new(5).fold_in(1));
        assert_ne!(first[0], first[1]);
    }
}
