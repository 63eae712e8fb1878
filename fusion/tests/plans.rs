//! Golden plan tests: the planner's decisions pinned as readable text and as
//! region counts (in the manner of kernel-count tests). Pure graph code: no XLA.

use lazyfuse_fusion::{plan, plan_with_donation, Plan, PlanOptions, RepeatOptions};
use lazyfuse_ir::{Axes, BinaryOp, DType, Graph, Literal, NodeId, Op, ReduceOp, Shape, UnaryOp};
use std::panic::Location;

/// A tiny graph builder over `Graph::push`.
struct G(Graph);

impl G {
    fn new() -> Self {
        G(Graph::new())
    }
    fn push(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.0
            .push(op, inputs, Location::caller())
            .expect("valid test graph")
    }
    fn input(&mut self, dims: &[usize]) -> NodeId {
        self.push(
            Op::Input {
                shape: Shape::new(dims),
                dtype: DType::F32,
            },
            &[],
        )
    }
    fn scalar(&mut self, v: f64) -> NodeId {
        self.push(
            Op::Constant {
                value: Literal::Float(v),
                shape: Shape::scalar(),
                dtype: DType::F32,
            },
            &[],
        )
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.push(Op::Binary(op), &[a, b])
    }
    fn bin_s(&mut self, op: BinaryOp, a: NodeId, v: f64) -> NodeId {
        let c = self.scalar(v);
        self.bin(op, a, c)
    }
    fn un(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        self.push(Op::Unary(op), &[a])
    }
    fn mean_last(&mut self, a: NodeId) -> NodeId {
        let r = self.0.node(a).shape.rank();
        self.push(
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: Axes::from_slice(&[r - 1]),
                keepdim: true,
            },
            &[a],
        )
    }
    fn layer_norm(&mut self, x: NodeId) -> NodeId {
        let mu = self.mean_last(x);
        let c = self.bin(BinaryOp::Sub, x, mu);
        let sq = self.bin(BinaryOp::Mul, c, c);
        let var = self.mean_last(sq);
        let ve = self.bin_s(BinaryOp::Add, var, 1e-5);
        let sd = self.un(UnaryOp::Sqrt, ve);
        self.bin(BinaryOp::Div, c, sd)
    }
    fn plan(&self, live: &[NodeId]) -> Plan {
        plan(&self.0, live, &PlanOptions::default())
    }
}

fn gelu(g: &mut G, x: NodeId) -> NodeId {
    let x2 = g.bin(BinaryOp::Mul, x, x);
    let x3 = g.bin(BinaryOp::Mul, x2, x);
    let k = g.bin_s(BinaryOp::Mul, x3, 0.044715);
    let i = g.bin(BinaryOp::Add, x, k);
    let a = g.bin_s(BinaryOp::Mul, i, 0.7978845608028654);
    let t = g.un(UnaryOp::Tanh, a);
    let t1 = g.bin_s(BinaryOp::Add, t, 1.0);
    let h = g.bin_s(BinaryOp::Mul, x, 0.5);
    g.bin(BinaryOp::Mul, h, t1)
}

#[test]
fn elementwise_chain_is_one_region_with_lifted_scalars() {
    let mut g = G::new();
    let x = g.input(&[1024]);
    let y = gelu(&mut g, x);
    let p = g.plan(&[y]);
    assert_eq!(p.regions.len(), 1);
    let expected = "\
region 0 (4 params, 10 nodes, 1 outputs)
  p0: f32[1024]
  p1: f32[]
  p2: f32[]
  p3: f32[]
  n0 = mul(p0, p0) : f32[1024]
  n1 = mul(n0, p0) : f32[1024]
  n2 = mul(n1, p1) : f32[1024]
  n3 = add(p0, n2) : f32[1024]
  n4 = mul(n3, p2) : f32[1024]
  n5 = tanh(n4) : f32[1024]
  n6 = constant() : f32[]
  n7 = add(n5, n6) : f32[1024]
  n8 = mul(p0, p3) : f32[1024]
  n9 = mul(n8, n7) : f32[1024]
  return n9
";
    assert_eq!(p.dump(&g.0), expected);
}

#[test]
fn layernorm_is_one_region_and_dead_nodes_are_pruned() {
    let mut g = G::new();
    let x = g.input(&[4, 8]);
    let y = g.layer_norm(x);
    let _dead = g.un(UnaryOp::Exp, x);
    let p = g.plan(&[y]);
    let expected = "\
region 0 (2 params, 7 nodes, 1 outputs)
  p0: f32[4, 8]
  p1: f32[]
  n0 = mean(p0) : f32[4, 1]
  n1 = sub(p0, n0) : f32[4, 8]
  n2 = mul(n1, n1) : f32[4, 8]
  n3 = mean(n2) : f32[4, 1]
  n4 = add(n3, p1) : f32[4, 1]
  n5 = sqrt(n4) : f32[4, 1]
  n6 = div(n1, n5) : f32[4, 8]
  return n6
";
    assert_eq!(p.dump(&g.0), expected);
    let _ = _dead;
}

/// One AdamW update of a parameter, as the workload writes it.
fn adamw(
    g: &mut G,
    p: NodeId,
    grad: NodeId,
    m: NodeId,
    v: NodeId,
    bc1: f64,
    bc2: f64,
) -> [NodeId; 3] {
    let m1 = g.bin_s(BinaryOp::Mul, m, 0.9);
    let gm = g.bin_s(BinaryOp::Mul, grad, 0.1);
    let m2 = g.bin(BinaryOp::Add, m1, gm);
    let v1 = g.bin_s(BinaryOp::Mul, v, 0.999);
    let gg = g.bin(BinaryOp::Mul, grad, grad);
    let gv = g.bin_s(BinaryOp::Mul, gg, 0.001);
    let v2 = g.bin(BinaryOp::Add, v1, gv);
    let mh = g.bin_s(BinaryOp::Div, m2, bc1);
    let vh = g.bin_s(BinaryOp::Div, v2, bc2);
    let sq = g.un(UnaryOp::Sqrt, vh);
    let den = g.bin_s(BinaryOp::Add, sq, 1e-8);
    let r = g.bin(BinaryOp::Div, mh, den);
    let wd = g.bin_s(BinaryOp::Mul, p, 0.01);
    let u = g.bin(BinaryOp::Add, r, wd);
    let lu = g.bin_s(BinaryOp::Mul, u, 1e-3);
    let p2 = g.bin(BinaryOp::Sub, p, lu);
    [p2, m2, v2]
}

fn adam_graph(n: usize, bc1: f64, bc2: f64) -> (G, Vec<NodeId>) {
    let mut g = G::new();
    let mut live = Vec::new();
    for _ in 0..n {
        let p = g.input(&[64, 64]);
        let gr = g.input(&[64, 64]);
        let m = g.input(&[64, 64]);
        let v = g.input(&[64, 64]);
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
    let p = plan(&g.0, &live, &single);
    assert_eq!(p.regions.len(), 200, "one region per parameter update");
    let key = p.regions[0].key;
    assert!(
        p.regions.iter().all(|r| r.key == key),
        "all updates share one key"
    );
    let first = Plan {
        regions: vec![p.regions[0].clone()],
    };
    let expected = "\
region 0 (13 params, 16 nodes, 3 outputs)
  p0: f32[64, 64]
  p1: f32[]
  p2: f32[64, 64]
  p3: f32[]
  p4: f32[64, 64]
  p5: f32[]
  p6: f32[]
  p7: f32[]
  p8: f32[]
  p9: f32[]
  p10: f32[64, 64]
  p11: f32[]
  p12: f32[]
  n0 = mul(p0, p1) : f32[64, 64]
  n1 = mul(p2, p3) : f32[64, 64]
  n2 = add(n0, n1) : f32[64, 64]
  n3 = mul(p4, p5) : f32[64, 64]
  n4 = mul(p2, p2) : f32[64, 64]
  n5 = mul(n4, p6) : f32[64, 64]
  n6 = add(n3, n5) : f32[64, 64]
  n7 = div(n2, p7) : f32[64, 64]
  n8 = div(n6, p8) : f32[64, 64]
  n9 = sqrt(n8) : f32[64, 64]
  n10 = add(n9, p9) : f32[64, 64]
  n11 = div(n7, n10) : f32[64, 64]
  n12 = mul(p10, p11) : f32[64, 64]
  n13 = add(n11, n12) : f32[64, 64]
  n14 = mul(n13, p12) : f32[64, 64]
  n15 = sub(p10, n14) : f32[64, 64]
  return n2, n6, n15
";
    assert_eq!(first.dump(&g.0), expected);
    // A different step (other bias corrections) plans to the same keys.
    let (g2, live2) = adam_graph(200, 0.19, 0.002);
    assert!(
        plan(&g2.0, &live2, &single)
            .regions
            .iter()
            .all(|r| r.key == key),
        "lifted scalars keep the key"
    );
    // A different parameter count still reuses the same update region.
    let (g3, live3) = adam_graph(37, 0.1, 0.001);
    assert!(plan(&g3.0, &live3, &single)
        .regions
        .iter()
        .all(|r| r.key == key));
}

#[test]
fn independent_copies_are_batched_by_the_largest_fitting_divisor() {
    // By default independent copies (no copy reads another) run several per
    // region: the largest divisor of the count up to 16, so all regions of
    // the run still share one executable.
    for (n, regions) in [(200, 20), (48, 3), (37, 37), (7, 1)] {
        let (g, live) = adam_graph(n, 0.1, 0.001);
        let p = g.plan(&live);
        assert_eq!(p.regions.len(), regions, "{n} parameters");
        let key = p.regions[0].key;
        assert!(
            p.regions.iter().all(|r| r.key == key),
            "{n} parameters share one key"
        );
    }
}

/// A transformer-like block: layernorm, two matmuls with a residual.
fn block(g: &mut G, x: NodeId, w1: NodeId, w2: NodeId) -> NodeId {
    let h = g.layer_norm(x);
    let a = g.push(Op::MatMul, &[h, w1]);
    let a = gelu(g, a);
    let b = g.push(Op::MatMul, &[a, w2]);
    g.bin(BinaryOp::Add, x, b)
}

#[test]
fn stacked_identical_blocks_share_one_region() {
    let mut g = G::new();
    let x0 = g.input(&[2, 16, 32]);
    let mut x = x0;
    for _ in 0..4 {
        let w1 = g.input(&[32, 64]);
        let w2 = g.input(&[64, 32]);
        x = block(&mut g, x, w1, w2);
    }
    let out = g.un(UnaryOp::Tanh, x);
    // The caller dropped the model input: it dies in block 1, and each
    // block's input dies in that block, so every block donates its input.
    let p = plan_with_donation(&g.0, &[out], &[x0], &PlanOptions::default());
    let keys: Vec<_> = p.regions.iter().map(|r| r.key).collect();
    assert_eq!(p.regions.len(), 5, "4 blocks + the tail:\n{}", p.dump(&g.0));
    assert!(
        keys[..4].iter().all(|&k| k == keys[0]),
        "the 4 blocks share one key"
    );
    assert_ne!(keys[4], keys[0]);
    let dump = p.dump(&g.0);
    assert!(dump.starts_with("region 0 (7 params, 20 nodes, 1 outputs)\n  p0: f32[2, 16, 32]\n  p1: f32[]\n  p2: f32[32, 64]\n"), "{dump}");
    assert!(
        dump.contains("  return n19\n  donate p0 -> n19\nregion 1"),
        "{dump}"
    );
    assert!(dump.ends_with("region 4 (1 params, 1 nodes, 1 outputs)\n  p0: f32[2, 16, 32]\n  n0 = tanh(p0) : f32[2, 16, 32]\n  return n0\n  donate p0 -> n0\n"), "{dump}");
}

#[test]
fn a_chain_of_identical_ops_stays_fused() {
    let mut g = G::new();
    let mut x = g.input(&[8]);
    for _ in 0..500 {
        x = g.bin_s(BinaryOp::Mul, x, 1.01);
    }
    assert_eq!(g.plan(&[x]).regions.len(), 1);
}

#[test]
fn keys_ignore_identity_and_creation_order() {
    // Same computation on different inputs, recorded in different orders.
    let mut a = G::new();
    let x = a.input(&[3]);
    let y = a.input(&[3]);
    let s = a.bin(BinaryOp::Add, x, y);
    let ka = a.plan(&[s]).regions[0].key;
    let mut b = G::new();
    let _unused = b.input(&[7]);
    let y2 = b.input(&[3]);
    let x2 = b.input(&[3]);
    let s2 = b.bin(BinaryOp::Add, x2, y2);
    assert_eq!(b.plan(&[s2]).regions[0].key, ka);
    // `x + x` is a different program from `x + y`.
    let mut c = G::new();
    let x3 = c.input(&[3]);
    let s3 = c.bin(BinaryOp::Add, x3, x3);
    assert_ne!(c.plan(&[s3]).regions[0].key, ka);
    // A different shape is a different key.
    let mut d = G::new();
    let x4 = d.input(&[4]);
    let y4 = d.input(&[4]);
    let s4 = d.bin(BinaryOp::Add, x4, y4);
    assert_ne!(d.plan(&[s4]).regions[0].key, ka);
}

#[test]
fn fusion_off_is_one_region_per_op_with_constants_inlined() {
    let mut g = G::new();
    let x = g.input(&[4]);
    let a = g.bin_s(BinaryOp::Add, x, 1.0);
    let b = g.un(UnaryOp::Exp, a);
    let opts = PlanOptions {
        fuse: false,
        ..PlanOptions::default()
    };
    let p = plan(&g.0, &[b], &opts);
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
    let mut g = G::new();
    let mut x = g.input(&[8]);
    for i in 0..100 {
        x = if i % 2 == 0 {
            g.un(UnaryOp::Exp, x)
        } else {
            g.un(UnaryOp::Tanh, x)
        };
    }
    let opts = PlanOptions {
        max_region_cost: 30,
        ..PlanOptions::default()
    };
    let p = plan(&g.0, &[x], &opts);
    assert_eq!(p.regions.len(), 4);
    assert_eq!(p.regions[0].nodes.len(), 30);
    assert_eq!(p.regions[3].outputs, vec![x]);
}
