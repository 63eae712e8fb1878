//! The values of one job's nodes as it runs, and the steps that fill or
//! empty them outside the regions: its inputs read, the dying inputs no
//! region reads released, and the live host scalars uploaded.

use super::Input;
use crate::metrics::{self, COUNTERS as C};
use crate::runtime::{DeviceBuffer, Runtime};
use crate::{Error, Result};
use lazyfuse_fusion::{Plan, Region};
use lazyfuse_ir::{Graph, NodeId};
use std::collections::HashMap;
use std::sync::Arc;

/// Computed buffers by node, or why not.
pub(super) struct Values {
    pub(super) bufs: Vec<Option<Arc<DeviceBuffer>>>,
    /// Why a value is missing, for the few that failed (sparse: a dense
    /// vector of errors was half a megabyte to fill and drop per flush of
    /// a 5,800-node graph).
    failed: HashMap<NodeId, Error>,
}

impl Values {
    /// No values yet for a graph of `len` nodes.
    pub(super) fn new(len: usize) -> Values {
        Values {
            bufs: vec![None; len],
            failed: HashMap::new(),
        }
    }

    /// Node `n`'s buffer, its error, or `None` when nothing computed it.
    pub(super) fn get(&self, n: NodeId) -> Option<Result<&Arc<DeviceBuffer>>> {
        match &self.bufs[n.index()] {
            Some(b) => Some(Ok(b)),
            None => self.failed.get(&n).map(|e| Err(e.clone())),
        }
    }

    fn set(&mut self, n: NodeId, r: Result<Arc<DeviceBuffer>>) {
        match r {
            Ok(b) => self.bufs[n.index()] = Some(b),
            Err(e) => {
                self.failed.insert(n, e);
            }
        }
    }

    /// `region` failed: each of its outputs carries `e`.
    pub(super) fn fail_region(&mut self, region: &Region, e: Error) {
        metrics::add(&C.region_failures, 1);
        tracing::error!(region = %region.key, "{e}");
        for o in &region.outputs {
            self.bufs[o.index()] = None;
            self.failed.insert(*o, e.clone());
        }
    }

    /// Step 1: reads the graph's inputs (futures were computed by earlier
    /// jobs, in submission order) and returns those whose buffer only this
    /// job holds: they die here and are donated.
    pub(super) fn read_inputs(&mut self, inputs: Vec<(NodeId, Input)>) -> Vec<NodeId> {
        for (n, input) in inputs {
            let r = match input {
                Input::Buffer(b) => Ok(b),
                Input::Future(s) => s.read(),
            };
            self.set(n, r);
        }
        self.bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.as_ref().is_some_and(|b| Arc::strong_count(b) == 1))
            .map(|(i, _)| NodeId::new(i))
            .collect()
    }

    /// Drops the dying inputs that no region reads and no output is:
    /// buffers only the slices of dead left-out tensors read (an optimizer
    /// step's old weights, kept for gradients the program then dropped
    /// unread). Freed before the regions run, they do not add to this
    /// job's peak.
    ///
    /// The flush prunes a job's inputs too (`keep_inputs_read_by` in
    /// `lazy::flush`), but only when it retains slices, and by a walk of
    /// the graph from the outputs. This covers every job, from the plan's
    /// region parameters it already has: an input only nodes the plan
    /// pruned read (dead ones) no longer lives for the job's duration.
    pub(super) fn release_unread(&mut self, plan: &Plan, wanted: &[NodeId], dying: &[NodeId]) {
        if dying.is_empty() {
            return;
        }
        let mut read = vec![false; self.bufs.len()];
        for region in &plan.regions {
            for &p in &region.params {
                read[p.index()] = true;
            }
        }
        for &w in wanted {
            read[w.index()] = true;
        }
        for &d in dying {
            if !read[d.index()] {
                self.bufs[d.index()] = None;
            }
        }
    }

    /// The live host scalars no region computes (`Plan::constants`),
    /// uploaded from their values: computed in a region, each value would
    /// be part of its key, and a scalar made fresh every step would
    /// recompile it.
    pub(super) fn upload_constants(
        &mut self,
        rt: &Runtime,
        ordinal: usize,
        graph: &Graph,
        plan: &Plan,
    ) {
        for &id in &plan.constants {
            let r = lazyfuse_ir::interp::eval_op(&graph.node(id).op, &[])
                .map_err(|e| Error::internal(format!("invalid live scalar: {e}")))
                .and_then(|host| rt.upload(&host, ordinal));
            self.set(id, r);
        }
    }
}
