//! Tensor shapes and NumPy broadcasting.

use smallvec::SmallVec;
use std::fmt;

/// Dimension list of a tensor; rank 0 is a scalar. Stored inline up to rank 4,
/// so recording an op on ordinary tensors allocates nothing for shapes.
#[derive(PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Shape(pub SmallVec<[usize; 4]>);

impl Clone for Shape {
    /// A copy of the dimensions. An inline shape (rank 4 or less) is copied
    /// through a fixed-size buffer: a copy of variable length calls the C
    /// library's `memcpy`, and the derived clone extends element by
    /// element, both measurable on the recording hot path (two clones per op).
    #[inline]
    fn clone(&self) -> Self {
        Shape(copy_inline(&self.0, 0))
    }
}

/// `src` as a small vector: when it fits inline, copied through a
/// fixed-size buffer (the unused slots hold `fill`), since a copy of
/// variable length calls the C library's `memcpy`; on the recording hot
/// path (shapes and operand lists of every op).
#[inline]
pub(crate) fn copy_inline<T: Copy, const N: usize>(src: &[T], fill: T) -> SmallVec<[T; N]> {
    let n = src.len();
    if n > N {
        return SmallVec::from_slice(src);
    }
    let mut buf = [fill; N];
    for (i, b) in buf.iter_mut().enumerate() {
        if i < n {
            *b = src[i];
        }
    }
    SmallVec::from_buf_and_len(buf, n)
}

impl Shape {
    /// Builds a shape from a dimension slice.
    pub fn new(dims: &[usize]) -> Self {
        Shape(SmallVec::from_slice(dims))
    }

    /// The rank-0 (scalar) shape. Inlined: every scalar operand recorded
    /// builds two, and an out-of-line call left the lifted constant's op
    /// half-written on the stack, to be copied back with stalled loads.
    #[inline]
    pub fn scalar() -> Self {
        Shape(SmallVec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar, 0 when any dimension is 0).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> SmallVec<[usize; 4]> {
        let mut s: SmallVec<[usize; 4]> = SmallVec::from_elem(0, self.rank());
        let mut acc = 1;
        for i in (0..self.rank()).rev() {
            s[i] = acc;
            acc *= self.0[i];
        }
        s
    }

    /// NumPy broadcast of two shapes, or `None` when they are incompatible.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out: SmallVec<[usize; 4]> = SmallVec::with_capacity(rank);
        for i in 0..rank {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            let d = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
            out.push(d);
        }
        Some(Shape(out))
    }

    /// True when `self` broadcasts to `target` under NumPy rules.
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        if self.rank() > target.rank() {
            return false;
        }
        let off = target.rank() - self.rank();
        self.0
            .iter()
            .enumerate()
            .all(|(i, &d)| d == 1 || d == target.0[i + off])
    }
}

fn dim_from_right(s: &Shape, k: usize) -> usize {
    if k < s.rank() {
        s.0[s.rank() - 1 - k]
    } else {
        1
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape::new(d)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape::new(&d)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(SmallVec::from_vec(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed-buffer copy of inline shapes and the spilled copy of long
    /// ones both give the same dimensions (ranks 0 to 6).
    #[test]
    fn a_clone_has_the_same_dims_at_every_rank() {
        for rank in 0..=6 {
            let dims: Vec<usize> = (0..rank).map(|i| 3 + 5 * i).collect();
            let s = Shape::new(&dims);
            let c = s.clone();
            assert_eq!(c.dims(), &dims[..]);
            assert_eq!(c, s);
        }
    }

    #[test]
    fn broadcast_rules() {
        let s = |d: &[usize]| Shape::new(d);
        assert_eq!(Shape::broadcast(&s(&[3, 1]), &s(&[4])), Some(s(&[3, 4])));
        assert_eq!(Shape::broadcast(&s(&[]), &s(&[2, 0])), Some(s(&[2, 0])));
        assert_eq!(Shape::broadcast(&s(&[1, 0]), &s(&[5, 1])), Some(s(&[5, 0])));
        assert_eq!(Shape::broadcast(&s(&[3]), &s(&[4])), None);
        assert!(s(&[3, 1]).broadcasts_to(&s(&[2, 3, 4])));
        assert!(!s(&[3, 2]).broadcasts_to(&s(&[3, 4])));
        assert_eq!(s(&[2, 3, 4]).strides().as_slice(), &[12, 4, 1]);
    }
}
