//! Sharding propagation: the sharding of every value a region computes,
//! from its parameters' shardings, by per-op rules. Deterministic (a
//! function of the graph and the parameter shardings, so it is part of a
//! region's compile key), and declared to XLA on the results: Shardy then
//! inserts whatever collectives make the program meet it.
//!
//! The rules keep a dimension split where the op maps it one to one to a
//! result dimension (elementwise ops through broadcasting, permutes, the
//! untouched dimensions of slices and reductions, the free dimensions of a
//! matmul, reshapes that keep a dimension or split off its major part), and
//! replicate it otherwise (a reduced or contracted dimension: XLA sums the
//! partial results across devices).

use super::mesh::{Mesh, Sharding};
use lazyfuse_fusion::Region;
use lazyfuse_ir::{Graph, NodeId, Op, Shape, SplitAxes};
use std::collections::HashMap;

/// Per dimension, the mesh axis it is split over.
type Axes = Vec<Option<usize>>;

/// The shardings of `region`'s outputs, given those of its parameters
/// (`params[i]` for `region.params[i]`).
pub(crate) fn output_shardings(
    graph: &Graph,
    region: &Region,
    mesh: &Mesh,
    params: &[Sharding],
) -> Vec<Sharding> {
    let mut known: HashMap<NodeId, Axes> = HashMap::with_capacity(region.nodes.len());
    for (&p, s) in region.params.iter().zip(params) {
        known.insert(p, s.axes().to_vec());
    }
    for &id in &region.nodes {
        let axes = node_axes(graph, id, mesh, &known);
        known.insert(id, axes);
    }
    hint_backward(graph, region, &mut known);
    region
        .outputs
        .iter()
        .map(|o| Sharding::from_axes(mesh, known[o].clone()))
        .collect()
}

/// Gives an unsplit value computed in the region the split of an
/// elementwise op of the same shape that consumes it, walking back from
/// the results: a gradient that updates a split parameter (`w - lr * g`,
/// or through an optimizer's moments) is then returned split like it, and
/// XLA reduce-scatters it instead of all-reducing a full copy to every
/// device. A result's sharding is a layout choice, never a change of value.
fn hint_backward(graph: &Graph, region: &Region, known: &mut HashMap<NodeId, Axes>) {
    let params: std::collections::HashSet<NodeId> = region.params.iter().copied().collect();
    for &id in region.nodes.iter().rev() {
        let node = graph.node(id);
        let elementwise = matches!(
            node.op,
            Op::Unary(_) | Op::Convert(_) | Op::Binary(_) | Op::Compare(_) | Op::Select
        );
        let split = known[&id].clone();
        if !elementwise || split.iter().all(Option::is_none) {
            continue;
        }
        for &i in &node.inputs {
            let computed = !params.contains(&i);
            let same = graph.node(i).shape == node.shape;
            if computed && same && known[&i].iter().all(Option::is_none) {
                known.insert(i, split.clone());
            }
        }
    }
}

/// The sharding rule of node `id`, its operands' shardings in `known`.
fn node_axes(graph: &Graph, id: NodeId, mesh: &Mesh, known: &HashMap<NodeId, Axes>) -> Axes {
    let node = graph.node(id);
    let out = &node.shape;
    let of = |k: usize| -> (&Axes, &Shape) {
        let i = node.inputs[k];
        (&known[&i], &graph.node(i).shape)
    };
    let none = || vec![None; out.rank()];
    let axes = match &node.op {
        Op::Unary(_) | Op::Convert(_) => of(0).0.clone(),
        Op::Binary(_) | Op::Compare(_) | Op::Select | Op::BroadcastTo(_) => {
            let ops: Vec<(&Axes, &Shape)> = (0..node.inputs.len()).map(of).collect();
            elementwise(out, &ops)
        }
        Op::Reduce { axes, keepdim, .. } => reduce(of(0).0, axes, *keepdim),
        Op::ArgMax { axis, keepdim } => reduce(of(0).0, &[*axis], *keepdim),
        Op::Permute(perm) => perm.iter().map(|&p| of(0).0[p]).collect(),
        Op::Reverse(_) => of(0).0.clone(),
        // Data parallelism: the batch keeps its split (batch groups mix it).
        Op::Conv(spec) => {
            let mut a = none();
            if spec.batch_groups == 1 {
                a[0] = of(0).0[0];
            }
            a
        }
        Op::ShardingConstraint(split) => return constraint_axes(split, out, mesh),
        Op::Reshape(_) => {
            let (a, s) = of(0);
            reshape(a, s, out)
        }
        Op::Slice { axis, .. }
        | Op::ScatterAdd { axis }
        | Op::DynamicSlice { axis, .. }
        | Op::Concat { axis }
        | Op::DynamicUpdateSlice { axis } => {
            let mut a = of(0).0.clone();
            a[*axis] = None;
            a
        }
        Op::IndexSelect { axis } => {
            let mut a = of(0).0.clone();
            a[*axis] = of(1).0[0];
            a
        }
        Op::MatMul => {
            let ((a, sa), (b, sb)) = (of(0), of(1));
            matmul(out, (a, sa), (b, sb))
        }
        // A custom kernel's result is replicated: its function is opaque.
        Op::Input { .. }
        | Op::Constant { .. }
        | Op::Arange { .. }
        | Op::RandomUniform { .. }
        | Op::Custom(_) => none(),
    };
    legal(axes, out, mesh)
}

/// The split a sharding constraint gives a value of `shape` on `mesh`:
/// its axes, less any the mesh does not have or that do not divide their
/// dimension. The lowering declares exactly this to XLA.
pub(crate) fn constraint_axes(split: &SplitAxes, shape: &Shape, mesh: &Mesh) -> Axes {
    let n = mesh.axes().count();
    let axes = split
        .iter()
        .map(|a| a.map(usize::from).filter(|&a| a < n))
        .collect();
    legal(axes, shape, mesh)
}

/// Each axis used at most once, and only on a dimension it divides.
fn legal(mut axes: Axes, shape: &Shape, mesh: &Mesh) -> Axes {
    for d in 0..axes.len() {
        if let Some(a) = axes[d] {
            let reused = axes[..d].contains(&Some(a));
            if reused || shape.dims()[d] % mesh.axis_size(a) != 0 {
                axes[d] = None;
            }
        }
    }
    axes
}

/// NumPy broadcasting: a result dimension takes the axis of the first
/// operand whose aligned dimension has the result's size.
fn elementwise(out: &Shape, ops: &[(&Axes, &Shape)]) -> Axes {
    let r = out.rank();
    (0..r)
        .map(|d| {
            ops.iter().find_map(|(a, s)| {
                let k = s.rank();
                let od = (d + k).checked_sub(r)?;
                (s.dims()[od] == out.dims()[d]).then_some(a[od]).flatten()
            })
        })
        .collect()
}

/// Reduced dimensions are dropped (or kept unsplit with `keepdim`).
fn reduce(a: &Axes, reduced: &[usize], keepdim: bool) -> Axes {
    a.iter()
        .enumerate()
        .filter_map(|(d, &x)| match (reduced.contains(&d), keepdim) {
            (false, _) => Some(x),
            (true, true) => Some(None),
            (true, false) => None,
        })
        .collect()
}

/// `[.., m, k] x [.., k, n]`: `m` from the left operand, `n` from the
/// right, batch dimensions broadcast; `k` is contracted (summed across
/// devices when split).
fn matmul(out: &Shape, (a, sa): (&Axes, &Shape), (b, sb): (&Axes, &Shape)) -> Axes {
    let r = out.rank();
    let batch = |x: &Axes, s: &Shape| -> (Axes, Shape) {
        let n = s.rank() - 2;
        (x[..n].to_vec(), Shape::new(&s.dims()[..n]))
    };
    let (ba, bsa) = batch(a, sa);
    let (bb, bsb) = batch(b, sb);
    let bout = Shape::new(&out.dims()[..r - 2]);
    let mut axes = elementwise(&bout, &[(&ba, &bsa), (&bb, &bsb)]);
    axes.push(a[sa.rank() - 2]);
    axes.push(b[sb.rank() - 1]);
    axes
}

/// A reshape keeps the split of a dimension that survives whole, or that
/// is the major part of a group of dimensions merged or split apart.
fn reshape(a: &Axes, from: &Shape, to: &Shape) -> Axes {
    let mut out = vec![None; to.rank()];
    let (f, t) = (from.dims(), to.dims());
    let (mut i, mut j) = (0, 0);
    while i < f.len() && j < t.len() {
        // One group: the shortest runs f[i..i2], t[j..j2] of equal product.
        let (i0, j0) = (i, j);
        let (mut pf, mut pt) = (f[i], t[j]);
        i += 1;
        j += 1;
        while pf != pt {
            if pf < pt && i < f.len() {
                pf *= f[i];
                i += 1;
            } else if j < t.len() {
                pt *= t[j];
                j += 1;
            } else {
                break;
            }
        }
        // The group's major input dimension, split, goes to its major
        // output dimension (`legal` drops it if that does not divide).
        if let Some(x) = a[i0] {
            out[j0] = Some(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh::build(0, 8, &[("dp", 2), ("tp", 4)]).unwrap()
    }

    #[test]
    fn reshape_keeps_whole_and_major_dimensions() {
        let s = |d: &[usize]| Shape::new(d);
        // [8, 6] split on dp -> [2, 4, 6]: the major part of dim 0.
        assert_eq!(
            reshape(&vec![Some(0), None], &s(&[8, 6]), &s(&[2, 4, 6])),
            vec![Some(0), None, None]
        );
        // [4, 2, 6] with dim 0 on tp -> [8, 6].
        assert_eq!(
            reshape(&vec![Some(1), None, None], &s(&[4, 2, 6]), &s(&[8, 6])),
            vec![Some(1), None]
        );
        // A minor dimension merged away is not kept.
        assert_eq!(
            reshape(&vec![None, Some(0)], &s(&[3, 4]), &s(&[12])),
            vec![None]
        );
    }

    #[test]
    fn elementwise_broadcasting_and_matmul() {
        let s = |d: &[usize]| Shape::new(d);
        let out = s(&[4, 8]);
        let a: Axes = vec![Some(0), None];
        let b: Axes = vec![Some(1)];
        assert_eq!(
            elementwise(&out, &[(&a, &s(&[4, 8])), (&b, &s(&[8]))]),
            vec![Some(0), Some(1)]
        );
        // A broadcast (size 1) dimension lends no axis.
        let c: Axes = vec![Some(0), None];
        assert_eq!(elementwise(&out, &[(&c, &s(&[1, 8]))]), vec![None, None]);
        // Row-split x times column-split w: rows and columns stay split.
        let x: Axes = vec![Some(0), None];
        let w: Axes = vec![None, Some(1)];
        assert_eq!(
            matmul(&s(&[4, 8]), (&x, &s(&[4, 3])), (&w, &s(&[3, 8]))),
            vec![Some(0), Some(1)]
        );
        // The same axis twice, or one that does not divide, is dropped.
        assert_eq!(
            legal(vec![Some(0), Some(0)], &out, &mesh()),
            vec![Some(0), None]
        );
        assert_eq!(
            legal(vec![None, Some(1)], &s(&[4, 6]), &mesh()),
            vec![None, None]
        );
    }
}
