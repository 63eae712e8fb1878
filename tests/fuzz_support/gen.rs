//! From genes to well-typed programs.
//!
//! A [`Gene`] is a handful of raw numbers. [`build`] reads each gene as "do
//! an action of this kind, choosing operands and attributes with these
//! numbers", repairing choices so the step is well typed (operands of the
//! right dtype and a broadcast-compatible shape are picked among the live
//! values, or created as fresh inputs) and skipping a step that still fails
//! shape/dtype inference. So *every* gene list is a valid program: proptest
//! (and libFuzzer, through `arbitrary`) can drop and simplify genes freely,
//! which is what makes shrinking work.

#[path = "gen_extra.rs"]
mod extra;

pub use extra::random_genes;

use super::program::{Program, Step};
use super::values::{
    any_input, float_input, literal_for, numeric_input, random_data, random_dim, random_dims,
    random_dtype, scalar_candidates, Rng, FLOAT_SPECIALS,
};
use lazyfuse::ir::{infer, Axes, BinaryOp, CmpOp, DType, Op, ReduceOp, Shape, UnaryOp};

/// The raw material of one step. Smaller numbers give simpler steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gene {
    /// Which action (see [`Action`]), modulo the weighted action table.
    pub kind: u8,
    /// Chooses the first operand.
    pub a: u16,
    /// Chooses the op within its family, or a second operand.
    pub b: u16,
    /// Chooses attributes (axes, keepdim, ...) or another operand.
    pub c: u16,
    /// Seeds new data and shapes.
    pub seed: u32,
}

/// What a gene does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Input,
    Full,
    Arange,
    Unary,
    Binary,
    Scalar,
    Compare,
    Select,
    Convert,
    Reduce,
    ArgMax,
    Reshape,
    Permute,
    Broadcast,
    Slice,
    Concat,
    MatMul,
    Conv,
    Flip,
    IndexAdd,
    IndexSelect,
    /// A conversion to a float type and, right after it, arithmetic on the
    /// converted value (what fusion merges: `convert` then `mul`/`add`...).
    CastArith,
    /// Two scalar ops in a row on one value, one with a special value
    /// (NaN, ±Inf, ±0, subnormal) and one with an ordinary, lifted one.
    ScalarChain,
    Read,
    Drop,
    ReadOnThread,
    Sync,
}

/// Weighted action table, indexed by `kind % 64`.
const ACTIONS: [(Action, usize); 27] = [
    (Action::Input, 3),
    (Action::Full, 2),
    (Action::Arange, 1),
    (Action::Unary, 6),
    (Action::Binary, 7),
    (Action::Scalar, 4),
    (Action::Compare, 3),
    (Action::Select, 3),
    (Action::Convert, 4),
    (Action::Reduce, 5),
    (Action::ArgMax, 2),
    (Action::Reshape, 3),
    (Action::Permute, 3),
    (Action::Broadcast, 2),
    (Action::Slice, 3),
    (Action::Concat, 2),
    (Action::MatMul, 3),
    (Action::Conv, 2),
    (Action::Flip, 1),
    (Action::IndexAdd, 2),
    (Action::IndexSelect, 2),
    (Action::CastArith, 4),
    (Action::ScalarChain, 3),
    (Action::Read, 3),
    (Action::Drop, 2),
    (Action::ReadOnThread, 2),
    (Action::Sync, 1),
];

fn action(kind: u8) -> Action {
    let total: usize = ACTIONS.iter().map(|a| a.1).sum();
    let mut k = kind as usize % total;
    for &(a, w) in &ACTIONS {
        if k < w {
            return a;
        }
        k -= w;
    }
    unreachable!()
}

#[derive(Clone)]
struct Val {
    shape: Shape,
    dtype: DType,
    alive: bool,
}

struct Builder {
    vals: Vec<Val>,
    steps: Vec<Step>,
    rng: Rng,
}

/// Builds the well-typed program the genes describe (deterministic).
pub fn build(genes: &[Gene]) -> Program {
    let mut b = Builder {
        vals: Vec::new(),
        steps: Vec::new(),
        rng: Rng::new(0),
    };
    for g in genes {
        b.rng = Rng::new(
            (g.seed as u64) << 32
                ^ (g.kind as u64) << 24
                ^ (g.a as u64) << 12
                ^ g.b as u64
                ^ (g.c as u64) << 44,
        );
        b.gene(g);
    }
    Program { steps: b.steps }
}

impl Builder {
    fn live(&self, pred: &dyn Fn(&Val) -> bool) -> Vec<usize> {
        (0..self.vals.len())
            .filter(|&i| self.vals[i].alive && pred(&self.vals[i]))
            .collect()
    }

    /// A live value satisfying `pred`, chosen by `sel`.
    fn pick(&self, sel: u16, pred: &dyn Fn(&Val) -> bool) -> Option<usize> {
        let c = self.live(pred);
        (!c.is_empty()).then(|| c[sel as usize % c.len()])
    }

    fn input(&mut self, dims: &[usize], dtype: DType) -> usize {
        let h = random_data(&mut self.rng, dims, dtype);
        self.steps.push(Step::Input(h));
        self.define(Shape::new(dims), dtype)
    }

    fn define(&mut self, shape: Shape, dtype: DType) -> usize {
        self.vals.push(Val {
            shape,
            dtype,
            alive: true,
        });
        self.vals.len() - 1
    }

    /// A live value satisfying `pred` or else a fresh input of `dims`/`dtype`.
    fn pick_or_input(
        &mut self,
        sel: u16,
        pred: &dyn Fn(&Val) -> bool,
        make: impl FnOnce(&mut Rng) -> (Vec<usize>, DType),
    ) -> usize {
        match self.pick(sel, pred) {
            Some(i) => i,
            None => {
                let (d, t) = make(&mut self.rng);
                self.input(&d, t)
            }
        }
    }

    /// Records `op` on `args` if inference accepts it.
    fn apply(&mut self, op: Op, args: Vec<usize>) -> Option<usize> {
        let operands: Vec<(&Shape, DType)> = args
            .iter()
            .map(|&i| (&self.vals[i].shape, self.vals[i].dtype))
            .collect();
        let (shape, dtype) = infer(&op, &operands).ok()?;
        self.steps.push(Step::Apply { op, args });
        Some(self.define(shape, dtype))
    }

    /// Records the typed scalar method `op` of `value` on `x` if inference
    /// accepts it.
    fn scalar(&mut self, x: usize, op: Op, value: f64) -> Option<usize> {
        let dtype = self.vals[x].dtype;
        let c = Op::Constant {
            value: literal_for(value, dtype),
            shape: Shape::scalar(),
            dtype,
        };
        let scalar = Shape::scalar();
        infer(&c, &[]).ok()?;
        let (shape, out) = infer(&op, &[(&self.vals[x].shape, dtype), (&scalar, dtype)]).ok()?;
        self.steps.push(Step::Scalar { op, arg: x, value });
        Some(self.define(shape, out))
    }

    /// A shape that broadcasts with `dims`: some dims set to 1, leading dims
    /// dropped or one added.
    fn broadcast_partner(&mut self, dims: &[usize]) -> Vec<usize> {
        let mut d: Vec<usize> = dims
            .iter()
            .map(|&x| if self.rng.one_in(3) { 1 } else { x })
            .collect();
        if !d.is_empty() && self.rng.one_in(3) {
            let k = self.rng.below(d.len() + 1);
            d.drain(..k);
        } else if d.len() < 4 && self.rng.one_in(6) {
            d.insert(0, self.rng.pick(&[1, 2, 3]));
        }
        d
    }

    /// Second operand of a broadcasting op with first operand `x`.
    fn partner(&mut self, x: usize, sel: u16) -> usize {
        let (xs, xd) = (self.vals[x].shape.clone(), self.vals[x].dtype);
        let fresh = sel % 4 == 0;
        let compatible = |v: &Val| {
            v.dtype == xd && Shape::broadcast(&v.shape, &xs).is_some_and(|s| s.rank() <= 4)
        };
        match (!fresh).then(|| self.pick(sel / 4, &compatible)).flatten() {
            Some(y) => y,
            None => {
                let d = self.broadcast_partner(xs.dims());
                self.input(&d, xd)
            }
        }
    }

    /// An integer operand for one op in four of the kinds that take them:
    /// live values are mostly floats (most ops make them), so integer
    /// scalar, unary and binary ops were almost never built otherwise.
    fn maybe_int(&mut self, sel: u16, pred: &dyn Fn(&Val) -> bool) -> Option<usize> {
        if sel % 4 != 3 {
            return None;
        }
        let int = |v: &Val| matches!(v.dtype, DType::I32 | DType::I64 | DType::U8) && pred(v);
        Some(self.pick_or_input(sel / 4, &int, |rng| {
            let d = rng.pick(&[DType::I32, DType::I64, DType::U8]);
            (random_dims(rng), d)
        }))
    }

    fn gene(&mut self, g: &Gene) {
        let numeric = |v: &Val| v.dtype.is_numeric();
        let any = |_: &Val| true;
        match action(g.kind) {
            Action::Input => {
                let (d, t) = any_input(&mut self.rng);
                self.input(&d, t);
            }
            Action::Full => {
                let (dims, dtype) = any_input(&mut self.rng);
                let cands = scalar_candidates(dtype);
                let value = cands[g.b as usize % cands.len()];
                let op = Op::Constant {
                    value: literal_for(value, dtype),
                    shape: Shape::new(&dims),
                    dtype,
                };
                if infer(&op, &[]).is_ok() {
                    self.steps.push(Step::Full {
                        value,
                        dims: dims.clone(),
                        dtype,
                    });
                    self.define(Shape::new(&dims), dtype);
                }
            }
            Action::Arange => {
                let dtype = random_dtype(&mut self.rng);
                let start = self.rng.pick(&[0.0, -3.0, 2.0, 0.5]);
                let step = self.rng.pick(&[1.0, -1.0, 3.0, 0.5, 0.25]);
                let len = random_dim(&mut self.rng) + self.rng.below(4);
                let op = Op::Arange {
                    start: literal_for(start, dtype),
                    step: literal_for(step, dtype),
                    len,
                    dtype,
                };
                if infer(&op, &[]).is_ok() {
                    self.steps.push(Step::Arange {
                        start,
                        step,
                        len,
                        dtype,
                    });
                    self.define(Shape::new(&[len]), dtype);
                }
            }
            Action::Unary => {
                let u = UnaryOp::ALL[g.b as usize % UnaryOp::ALL.len()];
                let x = if matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu) {
                    match self.maybe_int(g.c, &numeric) {
                        Some(i) => i,
                        None => self.pick_or_input(g.a, &numeric, any_input),
                    }
                } else {
                    self.pick_or_input(g.a, &|v| v.dtype.is_float(), float_input)
                };
                self.apply(Op::Unary(u), vec![x]);
            }
            Action::Binary | Action::Compare => {
                let x = match self.maybe_int(g.c >> 9, &any) {
                    Some(i) => i,
                    None if action(g.kind) == Action::Binary => {
                        self.pick_or_input(g.a, &numeric, numeric_input)
                    }
                    None => self.pick_or_input(g.a, &any, any_input),
                };
                let y = self.partner(x, g.c);
                let args = if g.c & 0x100 != 0 {
                    vec![y, x]
                } else {
                    vec![x, y]
                };
                let op = if action(g.kind) == Action::Binary {
                    let b = BinaryOp::ALL[g.b as usize % BinaryOp::ALL.len()];
                    Op::Binary(b)
                } else {
                    Op::Compare(CmpOp::ALL[g.b as usize % CmpOp::ALL.len()])
                };
                self.apply(op, args);
            }
            Action::Scalar => {
                let x = match self.maybe_int(g.c >> 8, &any) {
                    Some(i) => i,
                    None => self.pick_or_input(g.a, &any, any_input),
                };
                let dtype = self.vals[x].dtype;
                let op = if g.b % 2 == 0 && dtype.is_numeric() {
                    Op::Binary(BinaryOp::ALL[(g.b / 2) as usize % BinaryOp::ALL.len()])
                } else {
                    Op::Compare(CmpOp::ALL[(g.b / 2) as usize % CmpOp::ALL.len()])
                };
                let cands = scalar_candidates(dtype);
                self.scalar(x, op, cands[g.c as usize % cands.len()]);
            }
            Action::CastArith => {
                let x = match self.pick(g.a / 2, &|v| v.dtype == DType::Bool) {
                    Some(b) if g.a % 2 == 0 => b,
                    _ => self.pick_or_input(g.a / 2, &any, any_input),
                };
                let to = [DType::F32, DType::F64, DType::F16, DType::BF16][g.b as usize % 4];
                let Some(f) = self.apply(Op::Convert(to), vec![x]) else {
                    return;
                };
                let b = BinaryOp::ALL[(g.b / 4) as usize % BinaryOp::ALL.len()];
                if g.c % 3 == 0 {
                    let y = self.partner(f, g.c / 3);
                    self.apply(Op::Binary(b), vec![f, y]);
                } else {
                    let cands = scalar_candidates(to);
                    self.scalar(f, Op::Binary(b), cands[g.c as usize % cands.len()]);
                }
            }
            Action::ScalarChain => {
                let x = self.pick_or_input(g.a, &|v| v.dtype.is_float(), float_input);
                let specials = &FLOAT_SPECIALS;
                let special = specials[g.c as usize % specials.len()];
                let plain = [0.5, 2.0, -3.0, 1e-3][(g.c >> 8) as usize % 4];
                let (first, second) = if g.c & 0x80 != 0 {
                    (special, plain)
                } else {
                    (plain, special)
                };
                let op = |k: u16| Op::Binary(BinaryOp::ALL[k as usize % BinaryOp::ALL.len()]);
                if let Some(y) = self.scalar(x, op(g.b), first) {
                    self.scalar(y, op(g.b >> 8), second);
                }
            }
            Action::Select => {
                let x = self.pick_or_input(g.b, &any, any_input);
                let y = self.partner(x, g.c);
                let xs = self.vals[x].shape.clone();
                let cond = match self.pick(g.a, &|v: &Val| {
                    v.dtype == DType::Bool && Shape::broadcast(&v.shape, &xs).is_some()
                }) {
                    Some(c) if g.a % 3 != 0 => c,
                    _ => {
                        let d = self.broadcast_partner(xs.dims());
                        self.input(&d, DType::Bool)
                    }
                };
                self.apply(Op::Select, vec![cond, x, y]);
            }
            Action::Convert => {
                let x = self.pick_or_input(g.a, &any, any_input);
                self.apply(Op::Convert(DType::ALL[g.b as usize % 8]), vec![x]);
            }
            Action::Reduce => {
                let mut r = ReduceOp::ALL[g.b as usize % ReduceOp::ALL.len()];
                let x = self.pick_or_input(g.a, &numeric, numeric_input);
                let v = self.vals[x].clone();
                if r == ReduceOp::Mean && !v.dtype.is_float() {
                    r = ReduceOp::Sum;
                }
                let axes: Axes = (0..v.shape.rank()).filter(|i| g.c >> i & 1 == 1).collect();
                let zero_axis = axes.iter().any(|&a| v.shape.dims()[a] == 0);
                if zero_axis && matches!(r, ReduceOp::Max | ReduceOp::Min) {
                    r = ReduceOp::Sum;
                }
                let keepdim = g.c & 0x10 != 0;
                self.apply(
                    Op::Reduce {
                        op: r,
                        axes,
                        keepdim,
                    },
                    vec![x],
                );
            }
            Action::ArgMax => {
                let x = self.pick_or_input(
                    g.a,
                    &|v| v.dtype.is_numeric() && v.shape.numel() > 0 && v.shape.rank() > 0,
                    |rng| {
                        let mut d = random_dims(rng);
                        d.retain(|&x| x > 0);
                        d.push(3);
                        (d, DType::F32)
                    },
                );
                let rank = self.vals[x].shape.rank();
                self.apply(
                    Op::ArgMax {
                        axis: g.c as usize % rank.max(1),
                        keepdim: g.b % 2 == 1,
                    },
                    vec![x],
                );
            }
            Action::Reshape => {
                let x = self.pick_or_input(g.a, &any, any_input);
                let dims = self.vals[x].shape.dims().to_vec();
                let n: usize = dims.iter().product();
                let to: Vec<usize> = match g.b % 5 {
                    0 => vec![n],
                    1 => dims.iter().rev().copied().collect(),
                    2 => dims.iter().copied().filter(|&d| d != 1).collect(),
                    3 if dims.len() < 4 => {
                        let mut d = dims.clone();
                        d.insert(g.c as usize % (d.len() + 1), 1);
                        d
                    }
                    _ if dims.len() >= 2 => {
                        let k = g.c as usize % (dims.len() - 1);
                        let mut d = dims.clone();
                        let m = d.remove(k + 1);
                        d[k] *= m;
                        d
                    }
                    _ => vec![n, 1],
                };
                self.apply(Op::Reshape(Shape::new(&to)), vec![x]);
            }
            Action::Permute => {
                let x = self.pick_or_input(g.a, &|v| v.shape.rank() >= 2, |rng| {
                    let (mut d, t) = any_input(rng);
                    while d.len() < 2 {
                        d.push(random_dim(rng));
                    }
                    (d, t)
                });
                let rank = self.vals[x].shape.rank();
                let mut perm: Axes = (0..rank).collect();
                for i in (1..rank).rev() {
                    let j = self.rng.below(i + 1);
                    perm.swap(i, j);
                }
                self.apply(Op::Permute(perm), vec![x]);
            }
            Action::Broadcast => {
                let x = self.pick_or_input(g.a, &|v| v.shape.rank() < 4, any_input);
                let mut to: Vec<usize> = self.vals[x]
                    .shape
                    .dims()
                    .iter()
                    .map(|&d| if d == 1 { self.rng.pick(&[1, 2, 3]) } else { d })
                    .collect();
                if to.len() < 4 && g.c % 2 == 0 {
                    to.insert(0, self.rng.pick(&[1, 2, 3, 0]));
                }
                self.apply(Op::BroadcastTo(Shape::new(&to)), vec![x]);
            }
            Action::Slice => {
                let x = self.pick_or_input(g.a, &|v| v.shape.rank() >= 1, |rng| {
                    let (mut d, t) = any_input(rng);
                    d.push(4);
                    (d, t)
                });
                let dims = self.vals[x].shape.dims().to_vec();
                let axis = g.c as usize % dims.len();
                let start = self.rng.below(dims[axis] + 1);
                let len = self.rng.below(dims[axis] - start + 1);
                self.apply(Op::Slice { axis, start, len }, vec![x]);
            }
            Action::Concat => {
                let x = self.pick_or_input(g.a, &|v| v.shape.rank() >= 1, |rng| {
                    let (mut d, t) = any_input(rng);
                    d.push(2);
                    (d, t)
                });
                let v = self.vals[x].clone();
                let axis = g.c as usize % v.shape.rank();
                let compatible = self.live(&|w| {
                    w.dtype == v.dtype
                        && w.shape.rank() == v.shape.rank()
                        && (0..v.shape.rank())
                            .all(|i| i == axis || w.shape.dims()[i] == v.shape.dims()[i])
                });
                let mut args = vec![x];
                for _ in 0..g.b % 3 {
                    args.push(compatible[self.rng.below(compatible.len())]);
                }
                self.apply(Op::Concat { axis }, args);
            }
            Action::MatMul => {
                let x = self.pick_or_input(
                    g.a,
                    &|v| v.dtype.is_numeric() && v.shape.rank() >= 2,
                    |rng| {
                        let d = random_dtype(rng);
                        let d = if d.is_numeric() { d } else { DType::F32 };
                        let (mut s, _) = any_input(rng);
                        while s.len() < 2 {
                            s.insert(0, random_dim(rng));
                        }
                        (s, d)
                    },
                );
                let v = self.vals[x].clone();
                let r = v.shape.rank();
                let k = v.shape.dims()[r - 1];
                let batch = &v.shape.dims()[..r - 2];
                let fits = |w: &Val| {
                    w.dtype == v.dtype
                        && w.shape.rank() >= 2
                        && w.shape.dims()[w.shape.rank() - 2] == k
                        && Shape::broadcast(
                            &Shape::new(&w.shape.dims()[..w.shape.rank() - 2]),
                            &Shape::new(batch),
                        )
                        .is_some()
                };
                let y = match (g.c % 3 != 0).then(|| self.pick(g.c / 3, &fits)).flatten() {
                    Some(y) => y,
                    None => {
                        let mut d = self.broadcast_partner(batch);
                        d.push(k);
                        d.push(random_dim(&mut self.rng));
                        self.input(&d, v.dtype)
                    }
                };
                self.apply(Op::MatMul, vec![x, y]);
            }
            Action::Conv => self.conv(g),
            Action::Flip => self.flip(g),
            Action::IndexAdd => self.index_add(g),
            Action::IndexSelect => self.index_select(g),
            Action::Read | Action::Drop | Action::ReadOnThread => {
                if let Some(i) = self.pick(g.a, &any) {
                    self.steps.push(match action(g.kind) {
                        Action::Read => Step::Read(i),
                        Action::Drop => {
                            self.vals[i].alive = false;
                            Step::Drop(i)
                        }
                        _ => Step::ReadOnThread(i),
                    });
                }
            }
            Action::Sync => self.steps.push(Step::Sync),
        }
    }
}
