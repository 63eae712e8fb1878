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
mod index;
mod ops;

use emit::Emitter;
use lazyfuse_fusion::Region;
use lazyfuse_ir::Graph;

/// Lowers `region` of `graph` to a StableHLO module with one public `@main`.
pub fn lower_region(graph: &Graph, region: &Region) -> String {
    let mut e = Emitter::new(graph);
    let params: Vec<String> = region
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let n = graph.node(p);
            let name = format!("%arg{i}");
            e.bind(p, name.clone());
            // A donated parameter: XLA may write this output into its buffer.
            let alias = match region.aliases.iter().find(|(k, _)| *k == i) {
                Some((_, j)) => format!(" {{tf.aliasing_output = {j} : i32}}"),
                None => String::new(),
            };
            format!("{name}: {}{alias}", emit::ty(&n.shape, n.dtype))
        })
        .collect();
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
    s.push_str("module @lazyfuse_region {\n");
    s.push_str(&format!(
        "  func.func public @main({}) -> ({}) {{\n",
        params.join(", "),
        results.join(", ")
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
