//! Index mapping and the layout ops. Layout ops move raw element bytes without
//! looking at them, so every dtype (NaN payloads and -0.0 included) is copied
//! bit for bit.

use crate::{HostTensor, Shape};
use smallvec::SmallVec;

type Dims = SmallVec<[usize; 4]>;

/// Source element indices of a strided view, in the view's row-major order:
/// the element at multi-index `i` of a view with dimensions `dims` is source
/// element `offset + sum(i[d] * strides[d])`. Empty when any dim is 0; a rank-0
/// view yields `offset` once. Broadcasting is a stride of 0.
#[derive(Clone, Debug)]
pub(crate) struct StridedIndex {
    dims: Dims,
    strides: Dims,
    counter: Dims,
    next: Option<usize>,
}

impl StridedIndex {
    /// A view of `dims` with element `strides`, starting at `offset`.
    pub(crate) fn new(dims: &[usize], strides: &[usize], offset: usize) -> Self {
        debug_assert_eq!(dims.len(), strides.len());
        let empty = dims.contains(&0);
        StridedIndex {
            dims: Dims::from_slice(dims),
            strides: Dims::from_slice(strides),
            counter: Dims::from_elem(0, dims.len()),
            next: (!empty).then_some(offset),
        }
    }

    /// Indices into a row-major tensor of shape `from` that realise its NumPy
    /// broadcast to `to` (which it must broadcast to).
    pub(crate) fn broadcast(from: &Shape, to: &Shape) -> Self {
        debug_assert!(from.broadcasts_to(to), "{from} does not broadcast to {to}");
        let lead = to.rank() - from.rank();
        let src = from.strides();
        let strides: Dims = (0..to.rank())
            .map(|i| match i.checked_sub(lead) {
                Some(j) if from.dims()[j] != 1 => src[j],
                _ => 0,
            })
            .collect();
        Self::new(to.dims(), &strides, 0)
    }
}

impl Iterator for StridedIndex {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        // Advance the odometer from the last dimension.
        let mut pos = current;
        self.next = None;
        for d in (0..self.dims.len()).rev() {
            self.counter[d] += 1;
            pos += self.strides[d];
            if self.counter[d] < self.dims[d] {
                self.next = Some(pos);
                break;
            }
            pos -= self.strides[d] * self.dims[d];
            self.counter[d] = 0;
        }
        Some(current)
    }
}

/// A tensor of `shape` whose elements are `src`'s elements at `indices`, copied as bytes.
pub(crate) fn gather(
    src: &HostTensor,
    shape: Shape,
    indices: impl Iterator<Item = usize>,
) -> HostTensor {
    let size = src.dtype.size_in_bytes();
    let mut bytes = Vec::with_capacity(shape.numel() * size);
    for i in indices {
        bytes.extend_from_slice(&src.bytes[i * size..(i + 1) * size]);
    }
    debug_assert_eq!(bytes.len(), shape.numel() * size);
    HostTensor {
        shape,
        dtype: src.dtype,
        bytes,
    }
}

/// Same bytes, new row-major shape.
pub(crate) fn reshape(x: &HostTensor, to: &Shape) -> HostTensor {
    HostTensor {
        shape: to.clone(),
        dtype: x.dtype,
        bytes: x.bytes.clone(),
    }
}

/// Output dim `i` is input dim `perm[i]`.
pub(crate) fn permute(x: &HostTensor, perm: &[usize]) -> HostTensor {
    let src = x.shape.strides();
    let dims: Dims = perm.iter().map(|&p| x.shape.dims()[p]).collect();
    let strides: Dims = perm.iter().map(|&p| src[p]).collect();
    gather(
        x,
        Shape(dims.clone()),
        StridedIndex::new(&dims, &strides, 0),
    )
}

/// `x` with the order of elements along each of `axes` reversed.
pub(crate) fn reverse(x: &HostTensor, axes: &[usize]) -> HostTensor {
    let dims = x.shape.dims();
    let strides = x.shape.strides();
    let indices = StridedIndex::new(dims, &strides, 0).map(|i| {
        let mut src = i;
        for &a in axes {
            let at = (i / strides[a]) % dims[a];
            src = src + (dims[a] - 1 - at) * strides[a] - at * strides[a];
        }
        src
    });
    gather(x, x.shape.clone(), indices)
}

/// NumPy broadcast of `x` to `to`.
pub(crate) fn broadcast_to(x: &HostTensor, to: &Shape) -> HostTensor {
    gather(x, to.clone(), StridedIndex::broadcast(&x.shape, to))
}

/// `len` elements from `start` along `axis`.
pub(crate) fn slice(x: &HostTensor, axis: usize, start: usize, len: usize) -> HostTensor {
    let strides = x.shape.strides();
    let mut shape = x.shape.clone();
    shape.0[axis] = len;
    let indices = StridedIndex::new(shape.dims(), &strides, start * strides[axis]);
    gather(x, shape, indices)
}

/// The clamped run-time start of a dynamic slice or update (XLA's rule:
/// into `0..=dim - len`).
fn clamped_start(start: &HostTensor, dim: usize, len: usize) -> usize {
    let s = start.to_i64_vec()[0];
    s.clamp(0, (dim - len) as i64) as usize
}

/// `len` elements along `axis` from the clamped run-time `start`.
pub(crate) fn dynamic_slice(
    x: &HostTensor,
    start: &HostTensor,
    axis: usize,
    len: usize,
) -> HostTensor {
    let s = clamped_start(start, x.shape.dims()[axis], len);
    slice(x, axis, s, len)
}

/// `x` with `update` written along `axis` from the clamped run-time `start`:
/// the blocks before, the update and the blocks after, joined.
pub(crate) fn dynamic_update_slice(
    x: &HostTensor,
    update: &HostTensor,
    start: &HostTensor,
    axis: usize,
) -> HostTensor {
    let dim = x.shape.dims()[axis];
    let u = update.shape.dims()[axis];
    let s = clamped_start(start, dim, u);
    let before = slice(x, axis, 0, s);
    let after = slice(x, axis, s + u, dim - s - u);
    concat(&[&before, update, &after], axis, x.shape.clone())
}

/// Concatenation along `axis`: for every index of the dims before `axis`, each
/// input contributes one contiguous block of `dim(axis) * inner` elements.
pub(crate) fn concat(xs: &[&HostTensor], axis: usize, shape: Shape) -> HostTensor {
    let first = xs[0];
    let size = first.dtype.size_in_bytes();
    let outer: usize = first.shape.dims()[..axis].iter().product();
    let inner: usize = first.shape.dims()[axis + 1..].iter().product();
    let mut bytes = Vec::with_capacity(shape.numel() * size);
    for o in 0..outer {
        for x in xs {
            let block = x.shape.dims()[axis] * inner * size;
            bytes.extend_from_slice(&x.bytes[o * block..(o + 1) * block]);
        }
    }
    HostTensor {
        shape,
        dtype: first.dtype,
        bytes,
    }
}

/// `where(cond, on_true, on_false)` with all three broadcast to `shape`; picks
/// whole element byte patterns, so it is exact for every dtype.
pub(crate) fn select(
    cond: &HostTensor,
    on_true: &HostTensor,
    on_false: &HostTensor,
    shape: Shape,
) -> HostTensor {
    let size = on_true.dtype.size_in_bytes();
    let mut bytes = Vec::with_capacity(shape.numel() * size);
    let c = StridedIndex::broadcast(&cond.shape, &shape);
    let t = StridedIndex::broadcast(&on_true.shape, &shape);
    let f = StridedIndex::broadcast(&on_false.shape, &shape);
    for ((c, t), f) in c.zip(t).zip(f) {
        let (src, i) = if cond.bytes[c] != 0 {
            (on_true, t)
        } else {
            (on_false, f)
        };
        bytes.extend_from_slice(&src.bytes[i * size..(i + 1) * size]);
    }
    HostTensor {
        shape,
        dtype: on_true.dtype,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_index_walks_views() {
        let all = |s: StridedIndex| s.collect::<Vec<_>>();
        assert_eq!(all(StridedIndex::new(&[], &[], 7)), vec![7]);
        assert_eq!(
            all(StridedIndex::new(&[2, 0], &[1, 1], 0)),
            Vec::<usize>::new()
        );
        assert_eq!(
            all(StridedIndex::new(&[2, 3], &[1, 2], 0)),
            vec![0, 2, 4, 1, 3, 5]
        );
        assert_eq!(
            all(StridedIndex::new(&[2, 2], &[3, 1], 1)),
            vec![1, 2, 4, 5]
        );
        let b = StridedIndex::broadcast(&Shape::new(&[3, 1]), &Shape::new(&[2, 3, 2]));
        assert_eq!(all(b), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        let b = StridedIndex::broadcast(&Shape::scalar(), &Shape::new(&[3]));
        assert_eq!(all(b), vec![0, 0, 0]);
    }
}
