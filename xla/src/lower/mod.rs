//! StableHLO lowering: one fusion [`Region`] becomes one MLIR module in
//! StableHLO's generic text syntax, which XLA's PJRT plugin compiles.
//!
//! Generic syntax (`"stablehlo.add"(%a, %b) : (T, T) -> T`) is used for every
//! op because it is uniform and stable across StableHLO versions. Each op
//! carries a `loc("op @ file:line:col")` naming the user line that recorded
//! it, so an XLA diagnostic points at user code. Implicit NumPy broadcasting
//! of the IR becomes explicit `broadcast_in_dim`.

mod contract;
mod conv;
mod elementwise;
mod emit;
mod fold;
mod host;
mod index;
mod leading;
mod ops;
mod shardy;

pub use host::{HOST_KERNEL_ATTR, HOST_TARGET};
pub use shardy::{mesh_decl, reshard_module, sharding, ShardSpec, SpmdLowering};

use emit::Emitter;
use lazyfuse_fusion::Region;
use lazyfuse_ir::Graph;

/// What a lowering is asked beyond the region itself.
#[derive(Debug, Default)]
pub struct Options<'a> {
    /// Lower one SPMD program (see [`SpmdLowering`]); `None`: one device.
    pub spmd: Option<&'a SpmdLowering>,
    /// Emit an op XLA rejects before every op of this name, so a test can
    /// make a real compile fail at a chosen op (lazyfuse's fault hooks).
    pub sabotage: Option<&'a str>,
}

/// Lowers `region` of `graph` to a StableHLO module with one public `@main`.
///
/// `@main` takes the buffer parameters (`%arg<i>`, `i` the parameter's
/// index), then one rank-1 argument per scalar pack (`%pack<j>`), each
/// lifted scalar being a slice of its pack (see [`Region::scalar_packs`]).
pub fn lower_region(graph: &Graph, region: &Region) -> String {
    lower(graph, region, &Options::default())
}

/// Lowers `region` as [`lower_region`] does, with `options`: as one SPMD
/// program, the module declares the mesh (`sdy.mesh`), and every
/// parameter and result carries its `#sdy.sharding` (scalar packs
/// replicated); XLA's Shardy partitioner inserts the collectives, and the
/// parameters of the layout's aliases are donated to their outputs.
pub fn lower_region_with(graph: &Graph, region: &Region, options: &Options<'_>) -> String {
    lower(graph, region, options)
}

/// A sharding constraint: in an SPMD program `sdy.sharding_constraint`
/// with the split the caller's propagation gave it
/// ([`SpmdLowering::constraints`]), so Shardy keeps the value split so; on
/// one device, its operand.
pub(super) fn sharding_constraint(
    e: &mut emit::Emitter<'_>,
    id: lazyfuse_ir::NodeId,
    node: &lazyfuse_ir::Node,
) -> String {
    let x = e.value(node.inputs[0]);
    let Some(layout) = e.layout else {
        return x;
    };
    let spec = layout
        .constraints
        .iter()
        .find(|(n, _)| *n == id)
        .map(|(_, s)| s.as_slice())
        .unwrap_or(&[]);
    let sharding = if spec.is_empty() {
        shardy::sharding(&vec![None; node.shape.rank()])
    } else {
        shardy::sharding(spec)
    };
    let t = emit::ty(&node.shape, node.dtype);
    e.op(
        "sdy.sharding_constraint",
        &[(&x, t.clone())],
        &format!("sharding = {sharding}"),
        &t,
    )
}

fn lower(graph: &Graph, region: &Region, options: &Options<'_>) -> String {
    let layout = options.spmd;
    let mut e = Emitter::new(graph);
    e.spmd = layout.is_some();
    e.layout = layout;
    e.sabotage = options.sabotage;
    let mut params = param_decls(&mut e, graph, region, layout);
    params.extend(scalar_pack_decls(&mut e, graph, region, layout.is_some()));
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
    let mut text = module_text(&params, &results, &rets, &e.body, layout);
    if !e.funcs.is_empty() {
        // Custom kernels' functions go inside the module, after `@main`.
        let end = text.rfind('}').expect("a module ends with a brace");
        let funcs: Vec<&str> = e.funcs.iter().map(|(_, f)| f.as_str()).collect();
        text.insert_str(end, &format!("{}\n", funcs.join("\n")));
    }
    text
}

/// The declarations of the region's tensor parameters (lifted scalars
/// travel in packs), each bound to its node, with its donation and, under
/// SPMD, its sharding.
fn param_decls(
    e: &mut Emitter<'_>,
    graph: &Graph,
    region: &Region,
    layout: Option<&SpmdLowering>,
) -> Vec<String> {
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
                    shardy::sharding(&l.params[i])
                ),
                None => format!(" {{sdy.sharding = {}}}", shardy::sharding(&l.params[i])),
            },
            None => match region.aliases.iter().find(|(k, _)| *k == i) {
                Some((_, j)) => format!(" {{tf.aliasing_output = {j} : i32}}"),
                None => String::new(),
            },
        };
        params.push(format!("{name}: {}{alias}", emit::ty(&n.shape, n.dtype)));
    }
    params
}

/// The declarations of the region's packs of lifted scalars (one 1-D
/// parameter per dtype), each scalar unpacked and bound to its node.
fn scalar_pack_decls(
    e: &mut Emitter<'_>,
    graph: &Graph,
    region: &Region,
    spmd: bool,
) -> Vec<String> {
    let mut decls = Vec::new();
    for (j, pack) in region.scalar_packs().iter().enumerate() {
        let name = format!("%pack{j}");
        let n = pack.params.len();
        let packed = lazyfuse_ir::Shape::new(&[n]);
        let replicated = if spmd {
            " {sdy.sharding = #sdy.sharding<@mesh, [{}]>}"
        } else {
            ""
        };
        decls.push(format!(
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
    decls
}

/// The module around the function body: its attributes (the mesh under
/// SPMD), the signature with the results' shardings, and the return.
fn module_text(
    params: &[String],
    results: &[String],
    rets: &[String],
    body: &str,
    layout: Option<&SpmdLowering>,
) -> String {
    let mut s = String::with_capacity(body.len() + 256);
    let signature = match layout {
        None => results.join(", "),
        Some(l) => results
            .iter()
            .zip(&l.outputs)
            .map(|(t, sh)| format!("{t} {{sdy.sharding = {}}}", shardy::sharding(sh)))
            .collect::<Vec<_>>()
            .join(", "),
    };
    match layout {
        None => s.push_str("module @lazyfuse_region {\n"),
        Some(l) => {
            s.push_str(&format!(
                "module @lazyfuse_region attributes {{mhlo.num_partitions = {} : i32, \
                 mhlo.num_replicas = 1 : i32}} {{\n  {}\n",
                l.partitions,
                shardy::mesh_decl(&l.mesh_axes)
            ));
        }
    }
    s.push_str(&format!(
        "  func.func public @main({}) -> ({}) {{\n",
        params.join(", "),
        signature
    ));
    s.push_str(body);
    s.push_str(&format!(
        "    \"func.return\"({}) : ({}) -> ()\n  }}\n}}\n",
        rets.join(", "),
        results.join(", ")
    ));
    s
}

#[cfg(test)]
mod tests;
