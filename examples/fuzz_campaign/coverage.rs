//! What a campaign exercised: every computed value counted by op, dtype,
//! the special-value classes among its operands and how many fused
//! neighbours it had, so a combination the generator never builds shows.
//!
//! - *Special-value class*: of each operand element, float: `nan`, `inf`,
//!   `neg_zero`, `zero`, `subnormal`, `normal`; integer: `zero`, `extreme`
//!   (the type's min or max), `normal`; bool: `normal`. Operand values come
//!   from the reference interpreter; a scalar method's scalar counts too.
//! - *Fused neighbours*: operands computed in the same flush segment (no
//!   read or sync between them) plus users in that segment, i.e. the ops the
//!   planner could put in the same region; bucketed `0`, `1`, `2`, `3+`.
//!   The neighbour-pair table counts producer -> consumer op pairs within a
//!   segment (`to_dtype -> mul` is a cast next to arithmetic).

use super::fuzz_support::oracle::{run, step_op};
use super::fuzz_support::{Program, Step};
use lazyfuse::ir::{infer, BinaryOp, CmpOp, DType, HostTensor, Op, ReduceOp, Shape, UnaryOp};
use lazyfuse::Device;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

const CLASSES: [&str; 7] = [
    "nan",
    "inf",
    "neg_zero",
    "zero",
    "subnormal",
    "extreme",
    "normal",
];
const BUCKETS: [&str; 4] = ["0", "1", "2", "3+"];

/// Per op × dtype: counts by special-value class and by neighbour bucket.
type ByOp<'a> = BTreeMap<(String, DType), (BTreeMap<&'a str, u64>, BTreeMap<&'a str, u64>)>;

/// Counts over op × dtype × class × neighbour bucket, plus neighbour pairs.
#[derive(Default)]
pub struct Coverage {
    programs: u64,
    cells: BTreeMap<(String, DType, &'static str, &'static str), u64>,
    pairs: BTreeMap<(String, String), u64>,
}

/// The name a step is counted under: the op's name, `_scalar` for the typed
/// scalar methods, the target for conversions.
fn op_label(step: &Step) -> Option<String> {
    Some(match step {
        Step::Apply {
            op: Op::Convert(to),
            ..
        } => format!("to_{}", to.name()),
        Step::Apply { op, .. } => op.name().to_string(),
        Step::Scalar { op, .. } => format!("{}_scalar", op.name()),
        Step::Full { .. } => "full".into(),
        Step::Arange { .. } => "arange".into(),
        _ => return None,
    })
}

fn classes_of(h: &HostTensor, into: &mut BTreeSet<&'static str>) {
    if h.dtype.is_float() {
        for x in h.to_f64_vec() {
            let c = match x {
                x if x.is_nan() => "nan",
                x if x.is_infinite() => "inf",
                x if x == 0.0 && x.is_sign_negative() => "neg_zero",
                0.0 => "zero",
                x if subnormal(x, h.dtype) => "subnormal",
                _ => "normal",
            };
            into.insert(c);
        }
    } else if h.dtype == DType::Bool {
        into.insert("normal");
    } else {
        let (lo, hi) = match h.dtype {
            DType::U8 => (0, 255),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        };
        for x in h.to_i64_vec() {
            into.insert(match x {
                0 => "zero",
                x if x == lo || x == hi => "extreme",
                _ => "normal",
            });
        }
    }
}

fn subnormal(x: f64, dtype: DType) -> bool {
    let min_normal = match dtype {
        DType::F16 => 6.103_515_625e-5,
        DType::F64 => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    };
    x.abs() < min_normal
}

fn bucket(n: usize) -> &'static str {
    BUCKETS[n.min(3)]
}

impl Coverage {
    /// Counts the computed values of `p` (its values come from the reference
    /// interpreter; a program it rejects is counted by structure only).
    pub fn add(&mut self, p: &Program) {
        self.programs += 1;
        let values = run(p, &Device::interpreter(), false).ok();
        // Per value: segment (sync events before it), whether computed, label
        // and dtype (of its last operand: the data of a `where_cond`, the
        // source of a conversion; its own for leaves).
        let (mut seg, mut computed, mut labels, mut dtypes) = (vec![], vec![], vec![], vec![]);
        let mut args_of: Vec<Vec<usize>> = vec![];
        let mut segment = 0;
        for step in &p.steps {
            match step {
                Step::Read(_) | Step::ReadOnThread(_) | Step::Sync => segment += 1,
                Step::Drop(_) => {}
                _ => {
                    let (_, args) = step_op(step).expect("a value-defining step");
                    seg.push(segment);
                    computed.push(!matches!(step, Step::Input(_)));
                    labels.push(op_label(step));
                    dtypes.push(match (&values, args.last()) {
                        (Some(v), Some(&a)) => v[a].as_ref().map(|h| h.dtype),
                        (Some(v), None) => v[seg.len() - 1].as_ref().map(|h| h.dtype),
                        _ => None,
                    });
                    args_of.push(args);
                }
            }
        }
        let mut users = vec![0usize; seg.len()];
        for (v, args) in args_of.iter().enumerate() {
            for &a in args {
                if computed[a] && seg[a] == seg[v] {
                    users[a] += 1;
                    if let (Some(from), Some(to)) = (&labels[a], &labels[v]) {
                        *self.pairs.entry((from.clone(), to.clone())).or_default() += 1;
                    }
                }
            }
        }
        let defining = p.steps.iter().filter(|s| s.defines_value());
        for (v, step) in defining.enumerate() {
            let (Some(label), Some(dtype)) = (&labels[v], dtypes[v]) else {
                continue;
            };
            let fused_operands = args_of[v]
                .iter()
                .filter(|&&a| computed[a] && seg[a] == seg[v])
                .count();
            let nb = bucket(fused_operands + users[v]);
            let mut classes = BTreeSet::new();
            if let Some(vals) = &values {
                for &a in &args_of[v] {
                    if let Some(h) = &vals[a] {
                        classes_of(h, &mut classes);
                    }
                }
                if let Step::Scalar { value, .. } = step {
                    let h = HostTensor::from_f64(&[*value], Shape::scalar(), dtype);
                    classes_of(&h, &mut classes);
                }
            }
            if classes.is_empty() {
                classes.insert("normal");
            }
            for c in classes {
                *self.cells.entry((label.clone(), dtype, c, nb)).or_default() += 1;
            }
        }
    }

    pub fn merge(&mut self, other: Coverage) {
        self.programs += other.programs;
        for (k, n) in other.cells {
            *self.cells.entry(k).or_default() += n;
        }
        for (k, n) in other.pairs {
            *self.pairs.entry(k).or_default() += n;
        }
    }

    /// `(op, dtype)` totals with their class and neighbour counts.
    fn by_op(&self) -> ByOp<'_> {
        let mut out = ByOp::new();
        for ((op, dt, c, nb), &n) in &self.cells {
            let e = out.entry((op.clone(), *dt)).or_default();
            *e.0.entry(c).or_default() += n;
            *e.1.entry(nb).or_default() += n;
        }
        out
    }

    /// The human-readable summary: one line per op × dtype, then what was
    /// never built.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let by_op = self.by_op();
        let _ = writeln!(
            s,
            "coverage over {} programs: {} op x dtype x class x neighbour cells hit, {} op x dtype pairs, {} fused neighbour pairs",
            self.programs,
            self.cells.len(),
            by_op.len(),
            self.pairs.len()
        );
        for ((op, dt), (classes, nbs)) in &by_op {
            let c: Vec<String> = classes.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let b: Vec<String> = BUCKETS
                .iter()
                .map(|k| format!("{k}:{}", nbs.get(k).copied().unwrap_or(0)))
                .collect();
            let _ = writeln!(
                s,
                "  {op:<14} {:<5} classes [{}] neighbours [{}]",
                dt.name(),
                c.join(", "),
                b.join(" ")
            );
        }
        let never = self.never_built(&by_op);
        let _ = writeln!(s, "never built ({}):", never.len());
        for line in never {
            let _ = writeln!(s, "  {line}");
        }
        let mut pairs: Vec<_> = self.pairs.iter().collect();
        pairs.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = pairs
            .iter()
            .take(12)
            .map(|((a, b), n)| format!("{a}->{b} {n}"))
            .collect();
        let _ = writeln!(s, "most frequent fused neighbour pairs: {}", top.join(", "));
        s
    }

    /// Valid op × dtype pairs never built, and for those built: special
    /// classes their operands never held and neighbour buckets never seen.
    fn never_built(&self, by_op: &ByOp<'_>) -> Vec<String> {
        let mut out = Vec::new();
        for (name, op, arity) in canonical_ops() {
            for dt in DType::ALL {
                if !valid(&op, arity, dt) {
                    continue;
                }
                let Some((classes, nbs)) = by_op.get(&(name.clone(), dt)) else {
                    out.push(format!("{name} {}: never", dt.name()));
                    continue;
                };
                let wanted: &[&str] = if dt.is_float() {
                    &["nan", "inf", "neg_zero", "subnormal"]
                } else if dt == DType::Bool {
                    &[]
                } else {
                    &["zero", "extreme"]
                };
                let missing: Vec<&str> = wanted
                    .iter()
                    .copied()
                    .filter(|c| !classes.contains_key(c))
                    .collect();
                let lonely = !nbs.keys().any(|&k| k != "0");
                if !missing.is_empty() || lonely {
                    let mut line = format!("{name} {}:", dt.name());
                    if !missing.is_empty() {
                        let _ = write!(line, " no {} operands", missing.join("/"));
                    }
                    if lonely {
                        line.push_str(" never with a fused neighbour");
                    }
                    out.push(line);
                }
            }
        }
        out
    }

    /// The cell table as JSON (`[{op, dtype, class, neighbours, count}]`).
    pub fn to_json(&self) -> String {
        let cells: Vec<serde_json::Value> = self
            .cells
            .iter()
            .map(|((op, dt, c, nb), n)| {
                serde_json::json!({"op": op, "dtype": dt.name(), "class": c,
                    "neighbours": nb, "count": n})
            })
            .collect();
        let pairs: Vec<serde_json::Value> = self
            .pairs
            .iter()
            .map(|((a, b), n)| serde_json::json!({"producer": a, "consumer": b, "count": n}))
            .collect();
        let doc = serde_json::json!({"programs": self.programs, "classes": CLASSES,
            "cells": cells, "neighbour_pairs": pairs});
        serde_json::to_string_pretty(&doc).expect("JSON of plain values")
    }
}

/// One representative of each op the generator can build, with its label
/// and arity, so ops it never builds are listed too.
fn canonical_ops() -> Vec<(String, Op, usize)> {
    let mut v: Vec<(String, Op, usize)> = Vec::new();
    for &u in UnaryOp::ALL {
        v.push((Op::Unary(u).name().into(), Op::Unary(u), 1));
    }
    for &b in BinaryOp::ALL {
        v.push((Op::Binary(b).name().into(), Op::Binary(b), 2));
        let scalar = format!("{}_scalar", Op::Binary(b).name());
        v.push((scalar, Op::Binary(b), 2));
    }
    for &c in CmpOp::ALL {
        v.push((Op::Compare(c).name().into(), Op::Compare(c), 2));
        let scalar = format!("{}_scalar", Op::Compare(c).name());
        v.push((scalar, Op::Compare(c), 2));
    }
    for to in DType::ALL {
        v.push((format!("to_{}", to.name()), Op::Convert(to), 1));
    }
    for &r in ReduceOp::ALL {
        let op = Op::Reduce {
            op: r,
            axes: [0].into_iter().collect(),
            keepdim: false,
        };
        v.push((op.name().into(), op, 1));
    }
    let layout = [
        Op::ArgMax {
            axis: 0,
            keepdim: false,
        },
        Op::Reshape(Shape::new(&[4])),
        Op::Permute([1, 0].into_iter().collect()),
        Op::BroadcastTo(Shape::new(&[2, 2, 2])),
        Op::Slice {
            axis: 0,
            start: 0,
            len: 1,
        },
        Op::Concat { axis: 0 },
        Op::MatMul,
        Op::Select,
    ];
    for op in layout {
        let arity = match op {
            Op::Concat { .. } | Op::MatMul => 2,
            Op::Select => 3,
            _ => 1,
        };
        v.push((op.name().into(), op, arity));
    }
    v
}

/// Whether `op` accepts `arity` operands of `dtype` and shape `[2, 2]` (a
/// bool condition first for `select`).
fn valid(op: &Op, arity: usize, dtype: DType) -> bool {
    let s = Shape::new(&[2, 2]);
    let mut operands: Vec<(&Shape, DType)> = vec![(&s, dtype); arity];
    if let Op::Select = op {
        operands[0].1 = DType::Bool;
    }
    infer(op, &operands).is_ok()
}
