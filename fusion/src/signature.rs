//! Structure signatures and region descriptions: why did a region recompile?
//!
//! A region's [`crate::RegionKey`] covers everything that changes the
//! executable: ops, attributes, wiring, shapes, dtypes and donation. When a
//! key misses the cache, the useful question is "what changed since last
//! time?". To answer it, a region is split into two parts:
//!
//! * its [`Signature`]: the op kinds and the wiring between them, with shapes,
//!   dtypes and attributes erased. Two regions with one signature are "the
//!   same code" recorded on differently typed data or with other attributes;
//! * its [`Description`]: everything the signature erases (parameter types,
//!   per-node attributes, shapes and dtypes, donation), plus the user line that
//!   recorded it. [`Description::diff`] compares two descriptions of one
//!   signature and names each [`Difference`] with its [`Cause`].
//!
//! Pure graph logic: nothing here knows about XLA or caches.

use crate::Region;
use lazyfuse_ir::Origin;
use lazyfuse_ir::{stable_hasher, DType, Graph, NodeId, Op, Shape};
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};

/// The op structure of a region with shapes, dtypes and attributes erased.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature(pub u64);

/// Why a region with a known signature got a new key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// An input's shape changed.
    Shape,
    /// An input's dtype changed.
    DType,
    /// An op attribute changed (axes, a constant's value, a target dtype...).
    Attribute,
    /// Anything else (buffer donation, an internal shape or dtype).
    Other,
}

impl Cause {
    /// Every cause, in report order (also precedence: the first that
    /// applies is the cause of a recompile).
    pub const ALL: [Cause; 4] = [Cause::Shape, Cause::DType, Cause::Attribute, Cause::Other];

    /// Name used in reports and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Shape => "shape",
            Cause::DType => "dtype",
            Cause::Attribute => "attribute",
            Cause::Other => "other",
        }
    }
}

/// One thing that differs between two descriptions of one signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// Its kind.
    pub cause: Cause,
    /// Human-readable, e.g. `input 0 shape [3, 29] -> [3, 31]`.
    pub text: String,
}

/// A computed node of a region, as far as a recompile explanation cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDescription {
    /// Op name (`exp`, `sum`, ...).
    pub op: &'static str,
    /// The op with its attributes (`Debug` form), e.g. `Reduce { op: Sum, axes: [1], keepdim: false }`.
    pub attributes: String,
    /// The attributes with any shape they carry erased (a constant's or
    /// reshape's target shape): equal to the old one when only a shape changed.
    pub shape_free_attributes: String,
    /// Result shape.
    pub shape: Shape,
    /// Result dtype.
    pub dtype: DType,
    /// The user line that recorded it.
    pub origin: Origin,
}

/// What a region's [`Signature`] erases, plus where it was recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Description {
    /// Parameter types, in order.
    pub params: Vec<(Shape, DType)>,
    /// Computed nodes, in order.
    pub nodes: Vec<NodeDescription>,
    /// Buffer donation pairs `(param, output)`.
    pub aliases: Vec<(usize, usize)>,
}

/// Computes the signature and description of `region` of `graph`.
pub fn describe(graph: &Graph, region: &Region) -> (Signature, Description) {
    let local: HashMap<NodeId, usize> = region
        .params
        .iter()
        .chain(&region.nodes)
        .enumerate()
        .map(|(i, &n)| (n, i))
        .collect();
    let slot = |n: &NodeId| local.get(n).copied().unwrap_or(usize::MAX);
    let mut h = stable_hasher();
    region.params.len().hash(&mut h);
    region.nodes.len().hash(&mut h);
    let mut nodes = Vec::with_capacity(region.nodes.len());
    for &id in &region.nodes {
        let n = graph.node(id);
        n.op.name().hash(&mut h);
        std::mem::discriminant(&n.op).hash(&mut h);
        n.inputs.len().hash(&mut h);
        for i in &n.inputs {
            slot(i).hash(&mut h);
        }
        nodes.push(NodeDescription {
            op: n.op.name(),
            attributes: format!("{:?}", n.op),
            shape_free_attributes: format!("{:?}", erase_shape(&n.op)),
            shape: n.shape.clone(),
            dtype: n.dtype,
            origin: n.origin,
        });
    }
    for o in &region.outputs {
        slot(o).hash(&mut h);
    }
    let params = region
        .params
        .iter()
        .map(|&p| {
            let n = graph.node(p);
            (n.shape.clone(), n.dtype)
        })
        .collect();
    (
        Signature(h.finish()),
        Description {
            params,
            nodes,
            aliases: region.aliases.clone(),
        },
    )
}

impl Description {
    /// The user line that recorded the region: that of its first op that is
    /// not a constant (constants are often recorded by library code).
    pub fn origin(&self) -> Option<Origin> {
        self.nodes
            .iter()
            .find(|n| n.op != "constant")
            .or(self.nodes.first())
            .map(|n| n.origin)
    }

    /// What changed from `old` to `self` (two descriptions of one
    /// signature), most telling first: input shapes, input dtypes, op
    /// attributes, then anything else. Empty when they are equal.
    pub fn diff(&self, old: &Description) -> Vec<Difference> {
        let mut out = Vec::new();
        for (i, ((s1, d1), (s0, d0))) in self.params.iter().zip(&old.params).enumerate() {
            if s1 != s0 {
                add(
                    &mut out,
                    Cause::Shape,
                    format!("input {i} shape {s0} -> {s1}"),
                );
            }
            if d1 != d0 {
                add(
                    &mut out,
                    Cause::DType,
                    format!("input {i} dtype {d0} -> {d1}"),
                );
            }
        }
        let mut internal = Vec::new();
        for (i, (n1, n0)) in self.nodes.iter().zip(&old.nodes).enumerate() {
            let at = format!(
                "{} (op {i}, {}:{})",
                n1.op,
                n1.origin.file(),
                n1.origin.line()
            );
            if n1.attributes != n0.attributes
                && n1.shape_free_attributes == n0.shape_free_attributes
            {
                add(
                    &mut out,
                    Cause::Shape,
                    format!("{at} shape {} -> {}", n0.shape, n1.shape),
                );
            } else if n1.attributes != n0.attributes {
                add(
                    &mut out,
                    Cause::Attribute,
                    format!("{at} attributes {} -> {}", n0.attributes, n1.attributes),
                );
            } else if n1.shape != n0.shape || n1.dtype != n0.dtype {
                internal.push(format!(
                    "{at} result {}{} -> {}{}",
                    n0.dtype, n0.shape, n1.dtype, n1.shape
                ));
            }
        }
        if self.aliases != old.aliases {
            add(
                &mut out,
                Cause::Other,
                format!("buffer donation {:?} -> {:?}", old.aliases, self.aliases),
            );
        }
        // Result types that changed only follow from changed inputs or
        // attributes; they explain something on their own only otherwise.
        if out.is_empty() {
            for t in internal {
                add(&mut out, Cause::Other, t);
            }
        }
        if self.params.len() != old.params.len() || self.nodes.len() != old.nodes.len() {
            add(&mut out, Cause::Other, "region size changed".to_string());
        }
        out.sort_by_key(|d| d.cause);
        out
    }
}

/// `op` without the shape it carries as an attribute, if any.
fn erase_shape(op: &Op) -> Op {
    match op.clone() {
        Op::Constant { value, dtype, .. } => Op::Constant {
            value,
            shape: Shape::scalar(),
            dtype,
        },
        Op::Arange {
            start, step, dtype, ..
        } => Op::Arange {
            start,
            step,
            len: 0,
            dtype,
        },
        Op::Reshape(_) => Op::Reshape(Shape::scalar()),
        Op::BroadcastTo(_) => Op::BroadcastTo(Shape::scalar()),
        other => other,
    }
}

fn add(out: &mut Vec<Difference>, cause: Cause, text: String) {
    out.push(Difference { cause, text });
}

/// The cause of a recompile given its differences: the first in
/// [`Cause::ALL`] order, or [`Cause::Other`] when nothing visible differs.
pub fn primary_cause(diffs: &[Difference]) -> Cause {
    diffs.iter().map(|d| d.cause).min().unwrap_or(Cause::Other)
}

/// One line summarising `diffs` (at most `max` of them, then a count).
pub fn summarize(diffs: &[Difference], max: usize) -> String {
    if diffs.is_empty() {
        return "no visible difference (same types and attributes)".to_string();
    }
    let mut s = String::new();
    for (i, d) in diffs.iter().take(max).enumerate() {
        if i > 0 {
            s.push_str("; ");
        }
        s.push_str(&d.text);
    }
    if diffs.len() > max {
        let _ = write!(s, "; and {} more", diffs.len() - max);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, PlanOptions};
    use lazyfuse_ir::testutil::GraphBuilder;
    use lazyfuse_ir::{Literal, ReduceOp, UnaryOp};

    fn region_for(dims: &[usize], dtype: DType, axis: usize) -> (Signature, Description) {
        let mut g = GraphBuilder::new();
        let x = g.input(dims, dtype);
        let e = g.unary(UnaryOp::Exp, x);
        let s = g.reduce(ReduceOp::Sum, e, &[axis], false);
        let p = plan(g.graph(), &[s], &PlanOptions::default());
        assert_eq!(p.regions.len(), 1);
        describe(g.graph(), &p.regions[0])
    }

    #[test]
    fn shape_change_keeps_the_signature_and_names_the_input() {
        let (s0, d0) = region_for(&[3, 29], DType::F32, 1);
        let (s1, d1) = region_for(&[3, 31], DType::F32, 1);
        assert_eq!(s0, s1);
        let diffs = d1.diff(&d0);
        assert_eq!(primary_cause(&diffs), Cause::Shape);
        assert_eq!(diffs[0].text, "input 0 shape [3, 29] -> [3, 31]");
        assert_eq!(diffs.len(), 1, "{diffs:?}");
        assert!(d1.diff(&d1).is_empty());
    }

    #[test]
    fn a_constant_of_another_shape_is_a_shape_change() {
        let region_with_zeros = |n: usize| {
            let mut g = GraphBuilder::new();
            let c = g.constant(Literal::Float(0.0), &[n], DType::F32);
            let e = g.unary(UnaryOp::Exp, c);
            let p = plan(g.graph(), &[e], &PlanOptions::default());
            describe(g.graph(), &p.regions[0])
        };
        let (s0, d0) = region_with_zeros(64);
        let (s1, d1) = region_with_zeros(768);
        assert_eq!(s0, s1);
        let diffs = d1.diff(&d0);
        assert_eq!(primary_cause(&diffs), Cause::Shape, "{diffs:?}");
        assert!(diffs[0].text.ends_with("shape [64] -> [768]"), "{diffs:?}");
    }

    #[test]
    fn dtype_and_attribute_changes_are_named() {
        let (s0, d0) = region_for(&[4, 5], DType::F32, 1);
        let (s1, d1) = region_for(&[4, 5], DType::F64, 1);
        let (s2, d2) = region_for(&[4, 5], DType::F32, 0);
        assert_eq!(s0, s1);
        assert_eq!(s0, s2);
        let by_dtype = d1.diff(&d0);
        assert_eq!(primary_cause(&by_dtype), Cause::DType);
        assert_eq!(by_dtype[0].text, "input 0 dtype f32 -> f64");
        let by_attr = d2.diff(&d0);
        assert_eq!(primary_cause(&by_attr), Cause::Attribute, "{by_attr:?}");
        assert!(by_attr[0].text.starts_with("sum (op 1, "), "{by_attr:?}");
    }
}
