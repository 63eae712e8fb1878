//! Convolution, `flip`, `index_add` and `index_select` steps for the generator (the ops
//! with the most attributes, drawn here so `gen.rs` keeps the common
//! families), and random gene lists for drivers without proptest.

use super::super::values::{random_dim, Rng};
use super::{Builder, Gene};
use lazyfuse::ir::{Axes, ConvSpec, DType, HostTensor, Op, Shape};

/// Dims of a fresh convolution input: `[n, c, 1 to 3 spatial dims]`, small.
fn conv_dims(rng: &mut Rng) -> Vec<usize> {
    let d = 1 + rng.below(3);
    let mut dims = vec![1 + rng.below(3), 1 + rng.below(4)];
    for _ in 0..d {
        dims.push(1 + rng.below(if d == 3 { 4 } else { 7 }));
    }
    dims
}

impl Builder {
    /// A convolution of a float value of rank 3 to 5 with a fresh weight:
    /// strides, padding (negative too), both dilations and either feature or
    /// batch groups drawn at random; a draw the kernel does not fit is
    /// skipped like any ill-typed step.
    pub(super) fn conv(&mut self, g: &Gene) {
        let x = self.pick_or_input(
            g.a,
            &|v| v.dtype.is_float() && (3..=5).contains(&v.shape.rank()),
            |rng| {
                let dt = rng.pick(&[DType::F32, DType::F32, DType::F64, DType::BF16, DType::F16]);
                (conv_dims(rng), dt)
            },
        );
        let v = self.vals[x].clone();
        let dims = v.shape.dims().to_vec();
        let d = dims.len() - 2;
        let (n, c) = (dims[0], dims[1]);
        // Divisors of `m` (just 1 for an empty dim).
        let divisors = |m: usize| {
            let mut v: Vec<usize> = (1..=m).filter(|k| m % k == 0).collect();
            if v.is_empty() {
                v.push(1);
            }
            v
        };
        let mut spec = ConvSpec::plain(d);
        let rng = &mut self.rng;
        if g.c % 4 == 3 {
            let opts = divisors(n);
            spec.batch_groups = opts[rng.below(opts.len())];
        } else {
            let opts = divisors(c);
            spec.feature_groups = opts[g.b as usize % opts.len()];
        }
        let mut taps = Vec::with_capacity(d);
        for i in 0..d {
            spec.stride[i] = 1 + rng.below(if g.c % 3 == 0 { 1 } else { 3 });
            spec.rhs_dilation[i] = 1 + rng.below(if g.c % 5 == 0 { 3 } else { 1 });
            spec.lhs_dilation[i] = 1 + rng.below(if g.c % 7 == 0 { 3 } else { 1 });
            let pad = |rng: &mut Rng| rng.below(4) as i64 - 1;
            spec.padding[i] = (pad(rng), pad(rng));
            taps.push(1 + rng.below(3.min(dims[i + 2] + 1)));
        }
        let groups = spec.feature_groups.max(spec.batch_groups);
        let o = groups * (1 + self.rng.below(2));
        let mut w = vec![o, c / spec.feature_groups];
        w.extend(taps);
        let operands = [
            (&v.shape, v.dtype),
            (&lazyfuse::ir::Shape::new(&w), v.dtype),
        ];
        if lazyfuse::ir::infer(&Op::Conv(Box::new(spec.clone())), &operands).is_err() {
            return;
        }
        let wi = self.input(&w, v.dtype);
        self.apply(Op::Conv(Box::new(spec)), vec![x, wi]);
    }

    /// A fresh 1-D index list into a dim of `n` (`n > 0`), i32 or i64 as
    /// `g.b` says: up to `2n + 1` ids with repeats, some out of range (past
    /// the end, and -1 when `g.b % 4 == 0`) to test clamping. Returns its
    /// value and length.
    fn fresh_ids(&mut self, g: &Gene, n: usize) -> (usize, usize) {
        let k = self.rng.below(2 * n + 2);
        let ids: Vec<i64> = (0..k)
            .map(|_| self.rng.below(n + 2) as i64 - if g.b % 4 == 0 { 1 } else { 0 })
            .collect();
        let idt = if g.b % 2 == 0 { DType::I64 } else { DType::I32 };
        self.steps.push(super::Step::Input(HostTensor::from_i64(
            &ids,
            Shape::new(&[k]),
            idt,
        )));
        (self.define(Shape::new(&[k]), idt), k)
    }

    /// `index_add` into a numeric value of rank >= 1: a fresh i32 or i64
    /// index list (repeats, and a few out of range to test clamping) and a
    /// fresh source.
    pub(super) fn index_add(&mut self, g: &Gene) {
        let x = self.pick_or_input(
            g.a,
            &|v| v.dtype.is_numeric() && v.shape.rank() >= 1,
            |rng| {
                let (mut d, t) = super::numeric_input(rng);
                if d.is_empty() {
                    d.push(random_dim(rng));
                }
                (d, t)
            },
        );
        let v = self.vals[x].clone();
        let axis = g.c as usize % v.shape.rank();
        let n = v.shape.dims()[axis];
        if n == 0 {
            return;
        }
        let (i, k) = self.fresh_ids(g, n);
        let mut sd = v.shape.dims().to_vec();
        sd[axis] = k;
        let s = self.input(&sd, v.dtype);
        self.apply(Op::ScatterAdd { axis }, vec![x, i, s]);
    }

    /// `index_select` of any value of rank >= 1 along a random axis: a fresh
    /// i32 or i64 index list (repeats, empty, a few out of range to test
    /// clamping). Embedding lookups, upsampling and bags are this gather.
    pub(super) fn index_select(&mut self, g: &Gene) {
        let x = self.pick_or_input(g.a, &|v| v.shape.rank() >= 1, |rng| {
            let (mut d, t) = super::any_input(rng);
            if d.is_empty() {
                d.push(random_dim(rng));
            }
            (d, t)
        });
        let v = self.vals[x].clone();
        let axis = g.c as usize % v.shape.rank();
        let n = v.shape.dims()[axis];
        if n == 0 {
            return;
        }
        let (i, _) = self.fresh_ids(g, n);
        self.apply(Op::IndexSelect { axis }, vec![x, i]);
    }

    /// `flip` of any value along a random subset of its axes.
    pub(super) fn flip(&mut self, g: &Gene) {
        let x = self.pick_or_input(g.a, &|v| v.shape.rank() >= 1, |rng| {
            let (mut d, t) = super::any_input(rng);
            if d.is_empty() {
                d.push(random_dim(rng));
            }
            (d, t)
        });
        let rank = self.vals[x].shape.rank();
        let axes: Axes = (0..rank).filter(|i| g.c >> i & 1 == 1).collect();
        self.apply(Op::Reverse(axes), vec![x]);
    }
}

/// `n` genes drawn from `rng`: how drivers without proptest (the campaign,
/// the shrinker's tests) make random programs.
pub fn random_genes(rng: &mut Rng, n: usize) -> Vec<Gene> {
    (0..n)
        .map(|_| {
            let x = rng.next_u64();
            Gene {
                kind: x as u8,
                a: (x >> 8) as u16,
                b: (x >> 24) as u16,
                c: (x >> 40) as u16,
                seed: rng.next_u64() as u32,
            }
        })
        .collect()
}
