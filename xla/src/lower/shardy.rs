//! Shardy's spelling of SPMD layouts: the mesh declaration, per-value
//! shardings, and the reshard program. The caller (the core's SPMD layer)
//! decides the shardings; this module only writes them the way XLA's
//! Shardy partitioner reads them.

use super::emit;
use lazyfuse_ir::{DType, NodeId, Shape};

/// One value's sharding: for each dimension, the mesh axis it is split
/// over (`None`: not split).
pub type ShardSpec = Vec<Option<String>>;

/// How one region is laid out as an SPMD program: the mesh, and the
/// sharding of each parameter (`region.params` order; lifted scalars are
/// replicated) and result.
#[derive(Clone, Debug, Default)]
pub struct SpmdLowering {
    /// The number of partitions (devices of the mesh).
    pub partitions: usize,
    /// The mesh's axes, in order, with their sizes.
    pub mesh_axes: Vec<(String, usize)>,
    /// Each region parameter's sharding.
    pub params: Vec<ShardSpec>,
    /// Each region output's sharding.
    pub outputs: Vec<ShardSpec>,
    /// `(parameter, output)` pairs whose shards XLA writes in place.
    pub aliases: Vec<(usize, usize)>,
    /// The sharding each `ShardingConstraint` node of the region keeps.
    pub constraints: Vec<(NodeId, ShardSpec)>,
}

/// The Shardy mesh declaration, `sdy.mesh @mesh = <["dp"=4]>`.
pub fn mesh_decl(axes: &[(String, usize)]) -> String {
    let axes: Vec<String> = axes.iter().map(|(a, s)| format!("\"{a}\"={s}")).collect();
    format!("sdy.mesh @mesh = <[{}]>", axes.join(", "))
}

/// The Shardy attribute spelling, `#sdy.sharding<@mesh, [{"dp"}, {}]>`.
pub fn sharding(spec: &[Option<String>]) -> String {
    let dims: Vec<String> = spec
        .iter()
        .map(|a| {
            a.as_ref()
                .map_or("{}".to_string(), |a| format!("{{\"{a}\"}}"))
        })
        .collect();
    format!("#sdy.sharding<@mesh, [{}]>", dims.join(", "))
}

/// The SPMD program that moves an array of `shape` and `dtype` from
/// sharding `from` to `to` over one mesh: an identity whose parameter and
/// result shardings differ, so XLA inserts the all-gather, all-to-all or
/// slicing between them.
pub fn reshard_module(
    shape: &Shape,
    dtype: DType,
    partitions: usize,
    mesh_axes: &[(String, usize)],
    from: &[Option<String>],
    to: &[Option<String>],
) -> String {
    let t = emit::ty(shape, dtype);
    format!(
        "module @lazyfuse_reshard attributes {{mhlo.num_partitions = {partitions} : i32, \
         mhlo.num_replicas = 1 : i32}} {{\n  {}\n  func.func public @main(%arg0: {t} \
         {{sdy.sharding = {}}}) -> ({t} {{sdy.sharding = {}}}) {{\n    \"func.return\"(%arg0) \
         : ({t}) -> ()\n  }}\n}}\n",
        mesh_decl(mesh_axes),
        sharding(from),
        sharding(to)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shardings_and_meshes_are_spelled_as_shardy_reads_them() {
        let axes = vec![("dp".to_string(), 2), ("tp".to_string(), 4)];
        assert_eq!(mesh_decl(&axes), "sdy.mesh @mesh = <[\"dp\"=2, \"tp\"=4]>");
        assert_eq!(
            sharding(&[Some("dp".into()), None]),
            "#sdy.sharding<@mesh, [{\"dp\"}, {}]>"
        );
        let m = reshard_module(
            &Shape::new(&[4, 8]),
            DType::F32,
            8,
            &axes,
            &[Some("dp".into()), None],
            &[None, None],
        );
        assert!(m.contains("mhlo.num_partitions = 8"), "{m}");
        assert!(
            m.contains("tensor<4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}"),
            "{m}"
        );
    }
}
