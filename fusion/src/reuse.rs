//! Plan reuse: a loop flushes the same graph structure every iteration, so
//! its plan is computed once and replayed, the way a jit cache replays a
//! trace instead of tracing again.
//!
//! A plan is a function of the graph's structure ([`Graph::structure`]: each
//! node's structural hash and wiring, liftable scalar values left out), the
//! nodes wanted, the inputs dying and the options. Liftable scalars are
//! region parameters whose values the launch reads from the graph, so a
//! replayed plan is right for every value; a wanted constant is computed by
//! its region (its value is part of that region's key), so wanted constants'
//! values are part of the key here. Pure graph logic, deterministic.

use crate::plan::{plan_with_donation, Plan, PlanOptions};
use lazyfuse_ir::{stable_hasher, Graph, NodeId, Op};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Everything a plan depends on, hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    len: usize,
    structure: u64,
    /// Wanted nodes (in order), wanted constants' values, dying inputs, options.
    rest: u64,
}

impl PlanKey {
    fn new(graph: &Graph, wanted: &[NodeId], dying: &[NodeId], opts: &PlanOptions) -> PlanKey {
        let mut h = stable_hasher();
        wanted.len().hash(&mut h);
        for &w in wanted {
            w.index().hash(&mut h);
            if let op @ Op::Constant { .. } = &graph.node(w).op {
                op.hash(&mut h);
            }
        }
        dying.len().hash(&mut h);
        for &d in dying {
            d.index().hash(&mut h);
        }
        opts.fuse.hash(&mut h);
        opts.max_region_cost.hash(&mut h);
        opts.detect_repeats.hash(&mut h);
        let r = &opts.repeat;
        (
            r.min_block,
            r.max_block,
            r.max_candidates,
            r.max_batch,
            r.max_chained,
        )
            .hash(&mut h);
        PlanKey {
            len: graph.len(),
            structure: graph.structure(),
            rest: h.finish(),
        }
    }
}

/// The plans of recent flushes, by what they depend on.
///
/// Bounded: at most `capacity` plans, the least recently used evicted
/// first, so a program whose structure never repeats (shapes that change
/// every step) costs a hash per flush and no memory growth.
#[derive(Debug)]
pub struct PlanCache {
    plans: HashMap<PlanKey, (Arc<Plan>, u64)>,
    capacity: usize,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl Default for PlanCache {
    fn default() -> Self {
        PlanCache::new(64)
    }
}

impl PlanCache {
    /// An empty cache holding at most `capacity` plans (0 disables reuse).
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            plans: HashMap::new(),
            capacity,
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The plan of this flush ([`plan_with_donation`]'s answer), replayed
    /// when an earlier flush had the same key; the flag says whether it was.
    pub fn plan(
        &mut self,
        graph: &Graph,
        wanted: &[NodeId],
        dying: &[NodeId],
        opts: &PlanOptions,
    ) -> (Arc<Plan>, bool) {
        self.clock += 1;
        if self.capacity == 0 {
            self.misses += 1;
            return (
                Arc::new(plan_with_donation(graph, wanted, dying, opts)),
                false,
            );
        }
        let key = PlanKey::new(graph, wanted, dying, opts);
        if let Some((plan, used)) = self.plans.get_mut(&key) {
            *used = self.clock;
            self.hits += 1;
            return (plan.clone(), true);
        }
        self.misses += 1;
        let plan = Arc::new(plan_with_donation(graph, wanted, dying, opts));
        if self.plans.len() >= self.capacity {
            let oldest = self
                .plans
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.plans.remove(&k);
            }
        }
        self.plans.insert(key, (plan.clone(), self.clock));
        (plan, false)
    }

    /// Plans held now.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// True when no plan is held.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Flushes whose plan was replayed.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Flushes that were planned afresh.
    pub fn misses(&self) -> u64 {
        self.misses
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazyfuse_ir::{BinaryOp, DType, Literal, Shape, UnaryOp};

    /// `exp(x * c) + x` with a scalar `c`; returns the graph and its result.
    fn scaled(c: f64, extra: bool) -> (Graph, NodeId) {
        scaled_by(c, Shape::scalar(), extra)
    }

    /// [`scaled`] with `c` a constant of `shape` (of rank 1: baked into
    /// the code, not lifted).
    fn scaled_by(c: f64, shape: Shape, extra: bool) -> (Graph, NodeId) {
        let here = lazyfuse_ir::Origin::caller();
        let mut g = Graph::new();
        let x = g
            .push(
                Op::Input {
                    shape: Shape::new(&[4, 4]),
                    dtype: DType::F32,
                },
                &[],
                here,
            )
            .unwrap();
        let k = g
            .push(
                Op::Constant {
                    value: Literal::Float(c),
                    shape,
                    dtype: DType::F32,
                },
                &[],
                here,
            )
            .unwrap();
        let m = g.push(Op::Binary(BinaryOp::Mul), &[x, k], here).unwrap();
        let e = g.push(Op::Unary(UnaryOp::Exp), &[m], here).unwrap();
        let a = if extra { x } else { e };
        let r = g.push(Op::Binary(BinaryOp::Add), &[e, a], here).unwrap();
        (g, r)
    }

    #[test]
    fn a_lifted_scalar_value_reuses_the_plan() {
        let mut cache = PlanCache::new(4);
        let opts = PlanOptions::default();
        let (g1, r1) = scaled(0.5, false);
        let (p1, hit1) = cache.plan(&g1, &[r1], &[], &opts);
        assert!(!hit1);
        // 1, -1 and 0 too: a value that reaches one of them mid-loop does
        // not change the code.
        for c in [0.25, 1.0, -1.0, 0.0] {
            let (g2, r2) = scaled(c, false);
            let (p2, hit2) = cache.plan(&g2, &[r2], &[], &opts);
            assert!(hit2, "{c}");
            assert_eq!(*p2, plan_with_donation(&g2, &[r2], &[], &opts));
            assert!(Arc::ptr_eq(&p1, &p2));
        }
    }

    #[test]
    fn wiring_wanted_dying_and_baked_constants_are_part_of_the_key() {
        let opts = PlanOptions::default();
        let mut cache = PlanCache::new(8);
        let (g, r) = scaled(0.5, false);
        // Same ops, other wiring.
        let (w, rw) = scaled(0.5, true);
        assert_eq!(g.len(), w.len());
        assert_ne!(g.structure(), w.structure());
        // A constant of rank 1 is baked into the code, not lifted: its
        // value is part of the key.
        let (b, rb) = scaled_by(0.5, Shape::new(&[1]), false);
        let (b2, rb2) = scaled_by(0.25, Shape::new(&[1]), false);
        let x = NodeId::new(0);
        let e = NodeId::new(3);
        assert!(!cache.plan(&g, &[r], &[], &opts).1);
        assert!(!cache.plan(&w, &[rw], &[], &opts).1);
        assert!(!cache.plan(&b, &[rb], &[], &opts).1);
        assert!(!cache.plan(&b2, &[rb2], &[], &opts).1);
        assert!(!cache.plan(&g, &[r, e], &[], &opts).1);
        assert!(!cache.plan(&g, &[r], &[x], &opts).1);
        let unfused = PlanOptions {
            fuse: false,
            ..PlanOptions::default()
        };
        assert!(!cache.plan(&g, &[r], &[], &unfused).1);
        assert!(cache.plan(&g, &[r], &[x], &opts).1);
        assert_eq!(cache.misses(), 7);
    }

    #[test]
    fn the_cache_is_bounded() {
        let opts = PlanOptions::default();
        let mut cache = PlanCache::new(2);
        let graphs = [
            scaled(0.5, false),
            scaled(0.5, true),
            scaled_by(0.5, Shape::new(&[1]), false),
        ];
        for (g, r) in &graphs {
            cache.plan(g, &[*r], &[], &opts);
        }
        let (g, r) = &graphs[0];
        cache.plan(g, &[*r, NodeId::new(3)], &[], &opts);
        assert_eq!(cache.len(), 2);
        assert!(!PlanCache::new(0).plan(g, &[*r], &[], &opts).1);
    }
}
