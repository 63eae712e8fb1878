//! Golden plan tests: the planner's decisions pinned as readable text (files
//! under `tests/golden/`, one per test, regenerated with `LAZYFUSE_BLESS=1`)
//! and as region counts (in the manner of kernel-count tests). Pure graph
//! code: no XLA.

use lazyfuse_fusion::{plan, plan_with_donation, Plan, PlanOptions, RepeatOptions};
use lazyfuse_ir::testutil::GraphBuilder;
use lazyfuse_ir::{golden, BinaryOp, NodeId, UnaryOp};

/// Planning straight from the builder (the ir crate knows nothing of plans).
trait PlanExt {
    /// The plan for `live` with default options.
    fn plan(&self, live: &[NodeId]) -> Plan;
}

impl PlanExt for GraphBuilder {
    fn plan(&self, live: &[NodeId]) -> Plan {
        plan(self.graph(), live, &PlanOptions::default())
    }
}

fn gelu(g: &mut GraphBuilder, x: NodeId) -> NodeId {
    let x2 = g.binary(BinaryOp::Mul, x, x);
    let x3 = g.binary(BinaryOp::Mul, x2, x);
    let k = g.binary_scalar(BinaryOp::Mul, x3, 0.044715);
    let i = g.binary(BinaryOp::Add, x, k);
    let a = g.binary_scalar(BinaryOp::Mul, i, 0.7978845608028654);
    let t = g.unary(UnaryOp::Tanh, a);
    let t1 = g.binary_scalar(BinaryOp::Add, t, 1.0);
    let h = g.binary_scalar(BinaryOp::Mul, x, 0.5);
    g.binary(BinaryOp::Mul, h, t1)
}

#[test]
fn elementwise_chain_is_one_region_with_lifted_scalars() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[1024]);
    let y = gelu(&mut g, x);
    let p = g.plan(&[y]);
    assert_eq!(p.regions.len(), 1);
    golden!(
        "elementwise_chain_is_one_region_with_lifted_scalars",
        p.dump(g.graph())
    );
}

#[test]
fn layernorm_is_one_region_and_dead_nodes_are_pruned() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[4, 8]);
    let y = g.layer_norm(x, 1e-5);
    let _dead = g.unary(UnaryOp::Exp, x);
    let p = g.plan(&[y]);
    golden!(
        "layernorm_is_one_region_and_dead_nodes_are_pruned",
        p.dump(g.graph())
    );
    let _ = _dead;
}

/// One AdamW update of a parameter, as the workload writes it.
fn adamw(
    g: &mut GraphBuilder,
    p: NodeId,
    grad: NodeId,
    m: NodeId,
    v: NodeId,
    bc1: f64,
    bc2: f64,
) -> [NodeId; 3] {
    let m1 = g.binary_scalar(BinaryOp::Mul, m, 0.9);
    let gm = g.binary_scalar(BinaryOp::Mul, grad, 0.1);
    let m2 = g.binary(BinaryOp::Add, m1, gm);
    let v1 = g.binary_scalar(BinaryOp::Mul, v, 0.999);
    let gg = g.binary(BinaryOp::Mul, grad, grad);
    let gv = g.binary_scalar(BinaryOp::Mul, gg, 0.001);
    let v2 = g.binary(BinaryOp::Add, v1, gv);
    let mh = g.binary_scalar(BinaryOp::Div, m2, bc1);
    let vh = g.binary_scalar(BinaryOp::Div, v2, bc2);
    let sq = g.unary(UnaryOp::Sqrt, vh);
    let den = g.binary_scalar(BinaryOp::Add, sq, 1e-8);
    let r = g.binary(BinaryOp::Div, mh, den);
    let wd = g.binary_scalar(BinaryOp::Mul, p, 0.01);
    let u = g.binary(BinaryOp::Add, r, wd);
    let lu = g.binary_scalar(BinaryOp::Mul, u, 1e-3);
    let p2 = g.binary(BinaryOp::Sub, p, lu);
    [p2, m2, v2]
}

fn adam_graph(n: usize, bc1: f64, bc2: f64) -> (GraphBuilder, Vec<NodeId>) {
    let mut g = GraphBuilder::new();
    let mut live = Vec::new();
    for _ in 0..n {
        let p = g.input_f32(&[64, 64]);
        let gr = g.input_f32(&[64, 64]);
        let m = g.input_f32(&[64, 64]);
        let v = g.input_f32(&[64, 64]);
        live.extend(adamw(&mut g, p, gr, m, v, bc1, bc2));
    }
    (g, live)
}

#[test]
fn adamw_over_200_params_is_200_runs_of_one_region() {
    let (g, live) = adam_graph(200, 0.1, 0.001);
    // One update per region (no batching of independent copies).
    let single = PlanOptions {
        repeat: RepeatOptions {
            max_batch: 1,
            ..RepeatOptions::default()
        },
        ..PlanOptions::default()
    };
    let p = plan(g.graph(), &live, &single);
    assert_eq!(p.regions.len(), 200, "one region per parameter update");
    let key = p.regions[0].key;
    assert!(
        p.regions.iter().all(|r| r.key == key),
        "all updates share one key"
    );
    let first = Plan {
        regions: vec![p.regions[0].clone()],
        constants: Vec::new(),
    };
    golden!(
        "adamw_over_200_params_is_200_runs_of_one_region",
        first.dump(g.graph())
    );
    // A different step (other bias corrections) plans to the same keys.
    let (g2, live2) = adam_graph(200, 0.19, 0.002);
    assert!(
        plan(g2.graph(), &live2, &single)
            .regions
            .iter()
            .all(|r| r.key == key),
        "lifted scalars keep the key"
    );
    // A different parameter count still reuses the same update region.
    let (g3, live3) = adam_graph(37, 0.1, 0.001);
    assert!(plan(g3.graph(), &live3, &single)
        .regions
        .iter()
        .all(|r| r.key == key));
}

#[test]
fn independent_copies_are_batched_by_a_fitting_divisor_or_with_a_remainder() {
    // By default independent copies (no copy reads another) run several per
    // region: a divisor of the count from 32 to 64 when there is one (all
    // regions share one executable), else 64 per region and the rest in one
    // more (two executables: a prime count is not one region per copy). A
    // run of at most 64 copies is one region.
    for (n, regions, keys) in [
        (200, 4, 1),
        (300, 5, 1),
        (48, 1, 1),
        (7, 1, 1),
        (113, 2, 2),
        (67, 2, 2),
    ] {
        let (g, live) = adam_graph(n, 0.1, 0.001);
        let p = g.plan(&live);
        assert_eq!(p.regions.len(), regions, "{n} parameters");
        let distinct: std::collections::BTreeSet<_> = p.regions.iter().map(|r| r.key).collect();
        assert_eq!(distinct.len(), keys, "{n} parameters: distinct executables");
    }
}

#[test]
fn batched_copies_pack_their_scalars_one_pack_per_copy() {
    // 4 regions of 50 updates: each update's lifted scalars are one pack,
    // at the same offsets in every copy (so the copies' code is identical).
    let (g, live) = adam_graph(200, 0.1, 0.001);
    let p = g.plan(&live);
    let r = &p.regions[0];
    let packs = r.scalar_packs();
    assert_eq!(packs.len(), 50, "one pack per copy");
    let per_copy = packs[0].params.len();
    assert!(per_copy > 1);
    assert!(packs.iter().all(|k| k.params.len() == per_copy));
    assert_eq!(r.lifted.len(), 50 * per_copy);
    // Unbatched, a region's scalars of one dtype are one pack.
    let (g1, live1) = adam_graph(1, 0.1, 0.001);
    let p1 = g1.plan(&live1);
    assert_eq!(p1.regions[0].scalar_packs().len(), 1);
}

/// A transformer-like block: layernorm, two matmuls with a residual.
fn block(g: &mut GraphBuilder, x: NodeId, w1: NodeId, w2: NodeId) -> NodeId {
    let h = g.layer_norm(x, 1e-5);
    let a = g.matmul(h, w1);
    let a = gelu(g, a);
    let b = g.matmul(a, w2);
    g.binary(BinaryOp::Add, x, b)
}

/// `n` stacked [`block`]s on a dropped input, then `tanh`, planned with donation.
fn stacked_blocks(n: usize) -> (GraphBuilder, Plan) {
    let mut g = GraphBuilder::new();
    let x0 = g.input_f32(&[2, 16, 32]);
    let mut x = x0;
    for _ in 0..n {
        let w1 = g.input_f32(&[32, 64]);
        let w2 = g.input_f32(&[64, 32]);
        x = block(&mut g, x, w1, w2);
    }
    let out = g.unary(UnaryOp::Tanh, x);
    // The caller dropped the model input: it dies in the first region, and
    // each region's input dies in that region, so every region donates it.
    let p = plan_with_donation(g.graph(), &[out], &[x0], &PlanOptions::default());
    (g, p)
}

#[test]
fn stacked_identical_blocks_share_one_region() {
    // 12 layers: groups of 4 (`RepeatOptions::max_chained`), one executable.
    let (g, p) = stacked_blocks(12);
    let keys: Vec<_> = p.regions.iter().map(|r| r.key).collect();
    assert_eq!(
        p.regions.len(),
        4,
        "3 groups of 4 blocks + the tail:\n{}",
        p.dump(g.graph())
    );
    assert!(
        keys[..3].iter().all(|&k| k == keys[0]),
        "the 3 groups share one key"
    );
    assert_ne!(keys[3], keys[0]);
    // The whole plan, donations included (each group donates its input;
    // the tail is `tanh` donating its input).
    golden!(
        "stacked_identical_blocks_share_one_region",
        p.dump(g.graph())
    );
}

#[test]
fn a_few_stacked_blocks_are_one_region_with_what_surrounds_them() {
    // Two layers (a small decoder): one launch per step beats one per
    // layer, so the run is not cut, and the tail joins it.
    let (g, p) = stacked_blocks(2);
    assert_eq!(p.regions.len(), 1, "{}", p.dump(g.graph()));
    let (g, p) = stacked_blocks(4);
    assert_eq!(p.regions.len(), 1, "{}", p.dump(g.graph()));
    // Five are more than `max_chained`: groups of 4 and 1, then the tail.
    let (g, p) = stacked_blocks(5);
    assert_eq!(p.regions.len(), 3, "{}", p.dump(g.graph()));
}

#[test]
fn a_chain_of_identical_ops_stays_fused() {
    let mut g = GraphBuilder::new();
    let mut x = g.input_f32(&[8]);
    for _ in 0..500 {
        x = g.binary_scalar(BinaryOp::Mul, x, 1.01);
    }
    assert_eq!(g.plan(&[x]).regions.len(), 1);
}

#[test]
fn keys_ignore_identity_and_creation_order() {
    // Same computation on different inputs, recorded in different orders.
    let mut a = GraphBuilder::new();
    let x = a.input_f32(&[3]);
    let y = a.input_f32(&[3]);
    let s = a.binary(BinaryOp::Add, x, y);
    let ka = a.plan(&[s]).regions[0].key;
    let mut b = GraphBuilder::new();
    let _unused = b.input_f32(&[7]);
    let y2 = b.input_f32(&[3]);
    let x2 = b.input_f32(&[3]);
    let s2 = b.binary(BinaryOp::Add, x2, y2);
    assert_eq!(b.plan(&[s2]).regions[0].key, ka);
    // `x + x` is a different program from `x + y`.
    let mut c = GraphBuilder::new();
    let x3 = c.input_f32(&[3]);
    let s3 = c.binary(BinaryOp::Add, x3, x3);
    assert_ne!(c.plan(&[s3]).regions[0].key, ka);
    // A different shape is a different key.
    let mut d = GraphBuilder::new();
    let x4 = d.input_f32(&[4]);
    let y4 = d.input_f32(&[4]);
    let s4 = d.binary(BinaryOp::Add, x4, y4);
    assert_ne!(d.plan(&[s4]).regions[0].key, ka);
}

#[test]
fn fusion_off_is_one_region_per_op_with_constants_inlined() {
    let mut g = GraphBuilder::new();
    let x = g.input_f32(&[4]);
    let a = g.binary_scalar(BinaryOp::Add, x, 1.0);
    let b = g.unary(UnaryOp::Exp, a);
    let opts = PlanOptions {
        fuse: false,
        ..PlanOptions::default()
    };
    let p = plan(g.graph(), &[b], &opts);
    assert_eq!(p.regions.len(), 2);
    assert_eq!(
        p.regions[0].outputs,
        vec![a],
        "a crosses into the next region"
    );
    assert_eq!(p.regions[1].params, vec![a]);
}

#[test]
fn the_cost_cap_splits_large_flushes() {
    let mut g = GraphBuilder::new();
    let mut x = g.input_f32(&[8]);
    for i in 0..100 {
        x = if i % 2 == 0 {
            g.unary(UnaryOp::Exp, x)
        } else {
            g.unary(UnaryOp::Tanh, x)
        };
    }
    let opts = PlanOptions {
        max_region_cost: 30,
        ..PlanOptions::default()
    };
    let p = plan(g.graph(), &[x], &opts);
    assert_eq!(p.regions.len(), 4);
    assert_eq!(p.regions[0].nodes.len(), 30);
    assert_eq!(p.regions[3].outputs, vec![x]);
}

#[test]
fn live_scalars_are_uploaded_not_computed_so_their_value_is_not_in_a_key() {
    // A scalar the program holds (`Tensor::full(lr, &[])`, autograd's copy
    // of a scalar `mul` constant) and reads again in a later graph.
    let keyed = |v: f64, fuse: bool| {
        let mut g = GraphBuilder::new();
        let x = g.input_f32(&[4]);
        let s = g.scalar(v);
        let y = g.binary(BinaryOp::Mul, x, s);
        let z = g.unary(UnaryOp::Exp, y);
        let opts = PlanOptions {
            fuse,
            ..PlanOptions::default()
        };
        let p = plan(g.graph(), &[s, z], &opts);
        assert_eq!(p.constants, vec![s], "fuse {fuse}");
        for r in &p.regions {
            assert!(!r.nodes.contains(&s) && !r.outputs.contains(&s));
        }
        let reader = p.regions.iter().find(|r| r.params.contains(&s)).unwrap();
        let k = reader.params.iter().position(|&q| q == s).unwrap();
        assert!(reader.is_lifted(k), "its reader takes it lifted");
        let keys: Vec<_> = p.regions.iter().map(|r| r.key).collect();
        (keys, p.dump(g.graph()))
    };
    for fuse in [true, false] {
        let (a, dump) = keyed(0.5, fuse);
        let (b, _) = keyed(0.25, fuse);
        assert_eq!(a, b, "fuse {fuse}: the same keys for every value");
        assert!(dump.ends_with("constant f32[] (uploaded)\n"), "{dump}");
    }
}
