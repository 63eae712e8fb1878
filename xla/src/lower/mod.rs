//! StableHLO lowering: one fusion [`Region`] becomes one MLIR module in
//! StableHLO's generic text syntax, which XLA's PJRT plugin compiles.
//!
//! Generic syntax (`"stablehlo.add"(%a, %b) : (T, T) -> T`) is used for every
//! op because it is uniform and stable across StableHLO versions. Each op
//! carries a `loc("op @ file:line:col")` naming the user line that recorded
//! it, so an XLA diagnostic points at user code. Implicit NumPy broadcasting
//! of the IR becomes explicit `broadcast_in_dim`.

mod contract;
mod emit;
mod fold;
mod index;
mod leading;
mod ops;

use crate::spmd::SpmdLayout;
use emit::Emitter;
use lazyfuse_fusion::Region;
use lazyfuse_ir::Graph;

/// Lowers `region` of `graph` to a StableHLO module with one public `@main`.
///
/// `@main` takes the buffer parameters (`%arg<i>`, `i` the parameter's
/// index), then one rank-1 argument per scalar pack (`%pack<j>`), each
/// lifted scalar being a slice of its pack (see [`Region::scalar_packs`]).
pub fn lower_region(graph: &Graph, region: &Region) -> String {
    lower(graph, region, None)
}

/// Lowers `region` as one SPMD program over `layout`'s mesh: the module
/// declares the mesh (`sdy.mesh`), and every parameter and result carries
/// its `#sdy.sharding` (scalar packs replicated). XLA's Shardy partitioner
/// inserts the collectives; the parameters of `layout.aliases` are
/// donated to their outputs.
pub(crate) fn lower_region_spmd(graph: &Graph, region: &Region, layout: &SpmdLayout) -> String {
    lower(graph, region, Some(layout))
}

/// The SPMD program that moves an array of `shape` and `dtype` from
/// sharding `from` to `to` (same mesh): an identity whose parameter and
/// result shardings differ, so XLA inserts the all-gather, all-to-all or
/// slicing between them.
pub(crate) fn reshard_module(
    shape: &lazyfuse_ir::Shape,
    dtype: lazyfuse_ir::DType,
    from: &crate::spmd::Sharding,
    to: &crate::spmd::Sharding,
) -> String {
    let t = emit::ty(shape, dtype);
    let mesh = from.mesh();
    format!(
        "module @lazyfuse_reshard attributes {{mhlo.num_partitions = {} : i32, \
         mhlo.num_replicas = 1 : i32}} {{\n  {}\n  func.func public @main(%arg0: {t} \
         {{sdy.sharding = {}}}) -> ({t} {{sdy.sharding = {}}}) {{\n    \"func.return\"(%arg0) \
         : ({t}) -> ()\n  }}\n}}\n",
        mesh.size(),
        crate::spmd::sdy_mesh(mesh),
        from.sdy(),
        to.sdy()
    )
}

/// A sharding constraint: in an SPMD program `sdy.sharding_constraint`
/// with the split propagation gives it (see
/// [`crate::spmd::constraint_axes`]), so Shardy keeps the value split so;
/// on one device, its operand.
pub(super) fn sharding_constraint(
    e: &mut emit::Emitter<'_>,
    node: &lazyfuse_ir::Node,
    split: &lazyfuse_ir::SplitAxes,
) -> String {
    let x = e.value(node.inputs[0]);
    let Some(mesh) = e.mesh.clone() else {
        return x;
    };
    let axes = crate::spmd::constraint_axes(split, &node.shape, &mesh);
    let sharding = crate::spmd::Sharding::from_axes(&mesh, axes).sdy();
    let t = emit::ty(&node.shape, node.dtype);
    e.op(
        "sdy.sharding_constraint",
        &[(&x, t.clone())],
        &format!("sharding = {sharding}"),
        &t,
    )
}

fn lower(graph: &Graph, region: &Region, layout: Option<&SpmdLayout>) -> String {
    let mut e = Emitter::new(graph);
    e.spmd = layout.is_some();
    e.mesh = layout.map(|l| l.mesh.clone());
    let mut params: Vec<String> = Vec::with_capacity(region.params.len());
    for (i, &p) in region.params.iter().enumerate() {
        if region.is_lifted(i) {
            continue;
        }
        let n = graph.node(p);
        let name = format!("%arg{i}");
        e.bind(p, name.clone());
        // A donated parameter: XLA may write this output into its buffer.
        let alias = match layout {
            Some(l) => match l.aliases.iter().find(|(k, _)| *k == i) {
                Some((_, j)) => format!(
                    " {{sdy.sharding = {}, tf.aliasing_output = {j} : i32}}",
                    l.params[i].sdy()
                ),
                None => format!(" {{sdy.sharding = {}}}", l.params[i].sdy()),
            },
            None => match region.aliases.iter().find(|(k, _)| *k == i) {
                Some((_, j)) => format!(" {{tf.aliasing_output = {j} : i32}}"),
                None => String::new(),
            },
        };
        params.push(format!("{name}: {}{alias}", emit::ty(&n.shape, n.dtype)));
    }
    for (j, pack) in region.scalar_packs().iter().enumerate() {
        let name = format!("%pack{j}");
        let n = pack.params.len();
        let packed = lazyfuse_ir::Shape::new(&[n]);
        let replicated = match layout {
            Some(_) => " {sdy.sharding = #sdy.sharding<@mesh, [{}]>}",
            None => "",
        };
        params.push(format!(
            "{name}: {}{replicated}",
            emit::ty(&packed, pack.dtype)
        ));
        for (slot, &k) in pack.params.iter().enumerate() {
            let p = region.params[k];
            e.set_loc("constant", graph.node(p).origin);
            let v = e.unpack(&name, n, slot, pack.dtype);
            e.bind(p, v);
        }
    }
    let results: Vec<String> = region
        .outputs
        .iter()
        .map(|&o| {
            let n = graph.node(o);
            emit::ty(&n.shape, n.dtype)
        })
        .collect();
    for &id in &region.nodes {
        ops::lower_node(&mut e, id);
    }
    let rets: Vec<String> = region.outputs.iter().map(|&o| e.value(o)).collect();
    let mut s = String::with_capacity(e.body.len() + 256);
    let signature = match layout {
        None => results.join(", "),
        Some(l) => results
            .iter()
            .zip(&l.outputs)
            .map(|(t, sh)| format!("{t} {{sdy.sharding = {}}}", sh.sdy()))
            .collect::<Vec<_>>()
            .join(", "),
    };
    match layout {
        None => s.push_str("module @lazyfuse_region {\n"),
        Some(l) => {
            s.push_str(&format!(
                "module @lazyfuse_region attributes {{mhlo.num_partitions = {} : i32, \
                 mhlo.num_replicas = 1 : i32}} {{\n  {}\n",
                l.mesh.size(),
                crate::spmd::sdy_mesh(&l.mesh)
            ));
        }
    }
    s.push_str(&format!(
        "  func.func public @main({}) -> ({}) {{\n",
        params.join(", "),
        signature
    ));
    s.push_str(&e.body);
    s.push_str(&format!(
        "    \"func.return\"({}) : ({}) -> ()\n  }}\n}}\n",
        rets.join(", "),
        results.join(", ")
    ));
    s
}

#[cfg(test)]
mod tests;
