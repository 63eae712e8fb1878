//! Program-level shrinking: from a failing program to the smallest one that
//! still fails.
//!
//! Shrinking genes (proptest, [`super::gen::shrink`]) cannot do this alone: a
//! gene picks its operands among the values alive when it runs, so removing
//! one gene rewires every later step, and a step the failure does not need
//! often survives because removing it changes what the others compute. This
//! shrinker edits the [`Program`] itself, renumbering value ids, and keeps an
//! edit exactly when the result is still well typed and still `fails`:
//!
//! 1. remove sync events (reads, drops, reads on threads, syncs);
//! 2. remove values nothing uses (with their events), last first;
//! 3. bypass a step whose operand has its shape and dtype (`neg(x)` -> `x`);
//! 4. replace a computed value by an input holding its reference value, which
//!    cuts it loose from its ancestors (then removed by 2);
//! 5. shrink shapes: an input or `full` axis to length 1, then half, and
//!    axes of length 1 away (fewer elements, smaller ranks);
//! 6. simplify values: input elements and scalar operands to 0, then 1.
//!
//! The passes repeat until none changes the program or `budget` checks are
//! spent. The result is locally minimal: no single edit above keeps it
//! failing. [`shrink`] is the gene-level shrinker for drivers without
//! proptest (the cargo-fuzz target), run before this one.

use super::gen::Gene;
use super::oracle::{run, step_op};
use super::program::{Program, Step};
use super::values::literal_for;
use lazyfuse::ir::{infer, DType, HostTensor, Op, Shape};
use lazyfuse::Device;

/// Shrinks `program` with at most `budget` calls of `fails` (which must
/// hold for `program` itself). Returns the smallest failing program found.
pub fn shrink_program(
    program: &Program,
    budget: usize,
    fails: &mut dyn FnMut(&Program) -> bool,
) -> Program {
    let mut s = Shrinker {
        cur: program.clone(),
        budget,
        fails,
    };
    loop {
        let before = s.cur.clone();
        s.remove_events();
        s.remove_dead_values();
        s.bypass_steps();
        s.inline_as_inputs();
        s.shrink_shapes();
        s.simplify_values();
        if s.cur == before || s.budget == 0 {
            return s.cur;
        }
    }
}

struct Shrinker<'f> {
    cur: Program,
    budget: usize,
    fails: &'f mut dyn FnMut(&Program) -> bool,
}

impl Shrinker<'_> {
    /// Adopts `candidate` when it is well typed and still fails.
    fn try_adopt(&mut self, candidate: Program) -> bool {
        if self.budget == 0 || candidate == self.cur || !well_typed(&candidate) {
            return false;
        }
        self.budget -= 1;
        if (self.fails)(&candidate) {
            self.cur = candidate;
            true
        } else {
            false
        }
    }

    fn remove_events(&mut self) {
        let mut i = self.cur.steps.len();
        while i > 0 {
            i -= 1;
            if i < self.cur.steps.len() && !self.cur.steps[i].defines_value() {
                let mut c = self.cur.clone();
                c.steps.remove(i);
                self.try_adopt(c);
            }
        }
    }

    fn remove_dead_values(&mut self) {
        let mut v = self.cur.num_values();
        while v > 0 {
            v -= 1;
            if let Some(c) = remove_value(&self.cur, v, None) {
                self.try_adopt(c);
            }
        }
    }

    fn bypass_steps(&mut self) {
        let mut v = self.cur.num_values();
        while v > 0 {
            v -= 1;
            let Some(types) = value_types(&self.cur) else {
                return;
            };
            let Some(step) = self.cur.steps.get(def_index(&self.cur, v)) else {
                continue;
            };
            let args = match step {
                Step::Apply { args, .. } => args.clone(),
                Step::Scalar { arg, .. } => vec![*arg],
                _ => continue,
            };
            for a in args {
                if types[a] == types[v] {
                    if let Some(c) = remove_value(&self.cur, v, Some(a)) {
                        if self.try_adopt(c) {
                            break;
                        }
                    }
                }
            }
        }
    }

    fn inline_as_inputs(&mut self) {
        let Ok(values) = run(&self.cur, &Device::interpreter(), false) else {
            return;
        };
        for v in (0..self.cur.num_values()).rev() {
            let at = def_index(&self.cur, v);
            if !matches!(
                self.cur.steps.get(at),
                Some(Step::Apply { .. } | Step::Scalar { .. })
            ) {
                continue;
            }
            let Some(Some(h)) = values.get(v) else {
                continue;
            };
            let mut c = self.cur.clone();
            c.steps[at] = Step::Input(h.clone());
            self.try_adopt(c);
        }
    }

    fn shrink_shapes(&mut self) {
        for v in 0..self.cur.num_values() {
            let at = def_index(&self.cur, v);
            let dims = match &self.cur.steps[at] {
                Step::Input(h) => h.shape.dims().to_vec(),
                Step::Full { dims, .. } => dims.clone(),
                Step::Arange { len, .. } => vec![*len],
                _ => continue,
            };
            for axis in (0..dims.len()).rev() {
                let d = self.dims_of(at)[axis];
                for to in [1, d / 2] {
                    if to < d && to > 0 {
                        let c = self.with_axis(at, axis, Some(to));
                        if self.try_adopt(c) {
                            break;
                        }
                    }
                }
                if self.dims_of(at).get(axis) == Some(&1) {
                    let c = self.with_axis(at, axis, None);
                    self.try_adopt(c);
                }
            }
        }
    }

    fn dims_of(&self, at: usize) -> Vec<usize> {
        match &self.cur.steps[at] {
            Step::Input(h) => h.shape.dims().to_vec(),
            Step::Full { dims, .. } => dims.clone(),
            Step::Arange { len, .. } => vec![*len],
            _ => vec![],
        }
    }

    /// The program with the leaf at step `at` cut to `len` along `axis`
    /// (its first `len` entries), or with that axis of length 1 removed.
    fn with_axis(&self, at: usize, axis: usize, len: Option<usize>) -> Program {
        let mut c = self.cur.clone();
        match &mut c.steps[at] {
            Step::Input(h) => *h = cut_axis(h, axis, len),
            Step::Full { dims, .. } => match len {
                Some(n) => dims[axis] = n,
                None => {
                    dims.remove(axis);
                }
            },
            Step::Arange { len: l, .. } => *l = len.unwrap_or(*l),
            _ => {}
        }
        c
    }

    fn simplify_values(&mut self) {
        for at in 0..self.cur.steps.len() {
            match self.cur.steps[at].clone() {
                Step::Input(h) => {
                    let float = h.dtype.is_float();
                    for e in 0..h.numel() {
                        for simple in [0.0, 1.0] {
                            let Step::Input(now) = &self.cur.steps[at] else {
                                break;
                            };
                            let cur = element(now, e);
                            if cur == simple && (!float || cur.is_sign_positive()) {
                                break;
                            }
                            let mut c = self.cur.clone();
                            c.steps[at] = Step::Input(set_element(now, e, simple));
                            if self.try_adopt(c) {
                                break;
                            }
                        }
                    }
                }
                Step::Scalar { op, arg, value } => {
                    for simple in [0.0, 1.0] {
                        if value == simple && value.is_sign_positive() {
                            break;
                        }
                        let mut c = self.cur.clone();
                        c.steps[at] = Step::Scalar {
                            op: op.clone(),
                            arg,
                            value: simple,
                        };
                        if self.try_adopt(c) {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// The index in `p.steps` of the step defining value `v`.
fn def_index(p: &Program, v: usize) -> usize {
    p.steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.defines_value())
        .nth(v)
        .map_or(p.steps.len(), |(i, _)| i)
}

/// The program without value `v`: its events go, later ids move down by one.
/// With `replacement`, uses of `v` read that (earlier) value instead;
/// without, `None` when anything computes from `v`.
fn remove_value(p: &Program, v: usize, replacement: Option<usize>) -> Option<Program> {
    let at = def_index(p, v);
    let mut steps = Vec::with_capacity(p.steps.len());
    let remap = |i: usize| -> Option<usize> {
        match i.cmp(&v) {
            std::cmp::Ordering::Less => Some(i),
            std::cmp::Ordering::Equal => replacement,
            std::cmp::Ordering::Greater => Some(i - 1),
        }
    };
    for (k, step) in p.steps.iter().enumerate() {
        if k == at {
            continue;
        }
        let s = match step {
            Step::Apply { op, args } => Step::Apply {
                op: op.clone(),
                args: args.iter().map(|&a| remap(a)).collect::<Option<_>>()?,
            },
            Step::Scalar { op, arg, value } => Step::Scalar {
                op: op.clone(),
                arg: remap(*arg)?,
                value: *value,
            },
            Step::Read(i) | Step::Drop(i) | Step::ReadOnThread(i) if *i == v => continue,
            Step::Read(i) => Step::Read(remap(*i)?),
            Step::Drop(i) => Step::Drop(remap(*i)?),
            Step::ReadOnThread(i) => Step::ReadOnThread(remap(*i)?),
            other => other.clone(),
        };
        steps.push(s);
    }
    Some(Program { steps })
}

/// Shape and dtype of every value, or `None` when a step is ill typed, uses
/// an undefined or dropped value, or an event names one.
pub fn value_types(p: &Program) -> Option<Vec<(Shape, DType)>> {
    let mut types: Vec<(Shape, DType)> = Vec::new();
    let mut alive: Vec<bool> = Vec::new();
    let usable = |alive: &[bool], i: usize| alive.get(i).copied().unwrap_or(false);
    for step in &p.steps {
        match step {
            Step::Read(i) | Step::ReadOnThread(i) => {
                if !usable(&alive, *i) {
                    return None;
                }
            }
            Step::Drop(i) => {
                if !usable(&alive, *i) {
                    return None;
                }
                alive[*i] = false;
            }
            Step::Sync => {}
            Step::Scalar { op, arg, value } => {
                if !usable(&alive, *arg) {
                    return None;
                }
                let (shape, dtype) = types[*arg].clone();
                let rhs = Op::Constant {
                    value: literal_for(*value, dtype),
                    shape: Shape::scalar(),
                    dtype,
                };
                infer(&rhs, &[]).ok()?;
                let operands = [(&shape, dtype), (&Shape::scalar(), dtype)];
                types.push(infer(op, &operands).ok()?);
                alive.push(true);
            }
            _ => {
                let (op, args) = step_op(step)?;
                if !args.iter().all(|&a| usable(&alive, a)) {
                    return None;
                }
                let operands: Vec<(&Shape, DType)> =
                    args.iter().map(|&a| (&types[a].0, types[a].1)).collect();
                types.push(infer(&op, &operands).ok()?);
                alive.push(true);
            }
        }
    }
    Some(types)
}

/// Whether every step of `p` is well typed and uses live values.
pub fn well_typed(p: &Program) -> bool {
    value_types(p).is_some()
}

fn element(h: &HostTensor, e: usize) -> f64 {
    if h.dtype.is_float() {
        h.to_f64_vec()[e]
    } else {
        h.to_i64_vec()[e] as f64
    }
}

fn set_element(h: &HostTensor, e: usize, v: f64) -> HostTensor {
    if h.dtype.is_float() {
        let mut x = h.to_f64_vec();
        x[e] = v;
        HostTensor::from_f64(&x, h.shape.clone(), h.dtype)
    } else {
        let mut x = h.to_i64_vec();
        x[e] = v as i64;
        HostTensor::from_i64(&x, h.shape.clone(), h.dtype)
    }
}

/// `h`'s first `len` entries along `axis`, or `h` without that axis (of
/// length 1) when `len` is `None`.
fn cut_axis(h: &HostTensor, axis: usize, len: Option<usize>) -> HostTensor {
    let dims = h.shape.dims();
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let mut new_dims = dims.to_vec();
    let keep = match len {
        Some(n) => {
            new_dims[axis] = n;
            n
        }
        None => {
            new_dims.remove(axis);
            1
        }
    };
    let pick = |o: usize, k: usize, i: usize| (o * dims[axis] + k) * inner + i;
    let order: Vec<usize> = (0..outer)
        .flat_map(|o| (0..keep).flat_map(move |k| (0..inner).map(move |i| pick(o, k, i))))
        .collect();
    let shape = Shape::new(&new_dims);
    if h.dtype.is_float() {
        let x = h.to_f64_vec();
        let v: Vec<f64> = order.iter().map(|&j| x[j]).collect();
        HostTensor::from_f64(&v, shape, h.dtype)
    } else {
        let x = h.to_i64_vec();
        let v: Vec<i64> = order.iter().map(|&j| x[j]).collect();
        HostTensor::from_i64(&v, shape, h.dtype)
    }
}

/// Greedy shrinking for drivers without proptest (the cargo-fuzz target):
/// drops genes, then zeroes their fields, keeping each change that still
/// `fails`. Returns a locally minimal failing gene list.
pub fn shrink(genes: &[Gene], fails: &mut dyn FnMut(&[Gene]) -> bool) -> Vec<Gene> {
    let mut cur = genes.to_vec();
    let mut changed = true;
    while changed {
        changed = false;
        for i in (0..cur.len()).rev() {
            let mut next = cur.clone();
            next.remove(i);
            if !next.is_empty() && fails(&next) {
                cur = next;
                changed = true;
            }
        }
        for i in 0..cur.len() {
            for field in 0..4 {
                let mut next = cur.clone();
                let g = &mut next[i];
                let slot = match field {
                    0 => &mut g.a,
                    1 => &mut g.b,
                    2 => &mut g.c,
                    _ => {
                        if g.seed == 0 {
                            continue;
                        }
                        g.seed = 0;
                        if fails(&next) {
                            cur = next;
                            changed = true;
                        }
                        continue;
                    }
                };
                if *slot == 0 {
                    continue;
                }
                *slot = 0;
                if fails(&next) {
                    cur = next;
                    changed = true;
                }
            }
        }
    }
    cur
}
