//! Output prediction: which live tensors a flush computes beyond what its
//! sync point needs.
//!
//! Rust keeps named locals, shadowed names and statement temporaries alive
//! until the end of their scope, so "every live tensor is an output" writes
//! several times what a computation needs. Instead, each live tensor that
//! the sync point does not need is judged by its *site*: the structural hash
//! of its node (op, attributes, operand structure, type) and the line that
//! recorded it. A site starts out kept (computed, then watched), or left out
//! when its first tensor was marked cold (a gradient an optimizer step keeps
//! readable: `TensorInner::set_cold`). A watched
//! tensor that dies without being read or used counts against its site;
//! [`LEAVE_OUT_AFTER`] such drops in a row and the site's tensors are left
//! out: they stay pending (their recorded slice and its input buffers are
//! retained), and are computed only if the program reads or uses them after
//! all. That is a recompute and a misprediction: the site goes back to being
//! kept, and needs twice as many unread drops before it is left out again,
//! so a program whose use of a site alternates settles instead of
//! oscillating.
//!
//! Deterministic: decisions depend only on what the recording thread's
//! program did (reads, uses, drops of its handles, observed at its own
//! flushes), never on timing. The executor holds the tensors it computes
//! weakly, and strongly only for the moment it binds each one, before its
//! job finishes; a flush that observes first waits for the jobs queued
//! before it ([`crate::executor::Executor::wait_earlier`]), so when a
//! watched tensor dies is decided by the program alone.
//! Each thread's graph learns on its own, so the same program makes the same
//! decisions, and the same region keys, on every run and every thread.

use super::value::TensorInner;
use lazyfuse_ir::Node;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};

/// Unread drops in a row after which a site's tensors are left out (the
/// first time; every misprediction doubles it).
pub(crate) const LEAVE_OUT_AFTER: u32 = 2;

/// The identity of a recording site.
pub(crate) type Site = u64;

/// The site of a node: its structural hash and recording line.
pub(crate) fn site_of(node: &Node) -> Site {
    let line = node.origin.id() as u64;
    node.hash ^ line.rotate_left(29).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The site of a node holding a value with dynamic axes (`mask`): its
/// line, op, dtype and rank, but not its shapes, so what the program does
/// with a value is learnt once for every capacity bucket, not per bucket.
pub(crate) fn dynamic_site_of(node: &Node, mask: u32) -> Site {
    use std::hash::{Hash, Hasher};
    let mut h = lazyfuse_ir::stable_hasher();
    (node.origin.id() as u64).hash(&mut h);
    node.op.name().hash(&mut h);
    node.dtype.hash(&mut h);
    (node.shape.rank(), mask).hash(&mut h);
    h.finish()
}

#[derive(Clone, Copy, Debug)]
struct SiteStats {
    /// Unread drops in a row.
    unread: u32,
    /// Drops needed before leaving out.
    threshold: u32,
    leave_out: bool,
    /// Left out from the start (its first tensor was cold) and never read
    /// since: the reason `explain` gives differs.
    cold: bool,
}

impl Default for SiteStats {
    fn default() -> Self {
        SiteStats {
            unread: 0,
            threshold: LEAVE_OUT_AFTER,
            leave_out: false,
            cold: false,
        }
    }
}

/// Bound on remembered sites (cleared past it, like the other caches).
const MAX_SITES: usize = 1 << 16;

/// One thread graph's learned decisions and the tensors it is watching.
#[derive(Default)]
pub(crate) struct Predictor {
    sites: HashMap<Site, SiteStats, BuildHasherDefault<ahash::AHasher>>,
    /// Tensors computed only because they were live, and their sites.
    watched: Vec<(Weak<TensorInner>, Site, Arc<AtomicBool>)>,
}

impl Predictor {
    /// Whether a live tensor of `site` the sync point does not need is left
    /// out. A site first seen with a `cold` tensor starts out left out.
    pub(crate) fn leave_out(&mut self, site: Site, cold: bool) -> bool {
        if cold {
            if self.sites.len() > MAX_SITES {
                self.sites.clear();
            }
            let s = self.sites.entry(site).or_insert(SiteStats {
                leave_out: true,
                cold: true,
                ..SiteStats::default()
            });
            return s.leave_out;
        }
        self.sites.get(&site).is_some_and(|s| s.leave_out)
    }

    /// Starts watching `t`, computed only because it was live.
    pub(crate) fn watch(&mut self, t: &Arc<TensorInner>, site: Site) {
        self.watched.push((Arc::downgrade(t), site, t.watch_cell()));
    }

    /// Settles watched tensors: used ones confirm their site, dead unread
    /// ones count against it; the rest stay watched.
    pub(crate) fn observe(&mut self) {
        let sites = &mut self.sites;
        if sites.len() > MAX_SITES {
            sites.clear();
        }
        self.watched.retain(|(w, site, used)| {
            // Liveness first: once dead, the cell is final.
            let dead = w.strong_count() == 0;
            if used.load(Relaxed) {
                sites.entry(*site).or_default().unread = 0;
                return false;
            }
            if !dead {
                return true;
            }
            let s = sites.entry(*site).or_default();
            s.unread += 1;
            if s.unread >= s.threshold {
                s.leave_out = true;
            }
            false
        });
    }

    /// A left-out tensor of `site` was read or used after all.
    pub(crate) fn mispredicted(&mut self, site: Site) {
        let s = self.sites.entry(site).or_default();
        s.leave_out = false;
        s.cold = false;
        s.unread = 0;
        s.threshold = s.threshold.saturating_mul(2);
    }

    /// Why the tensors of `site` are left out, in words (for the flush log
    /// and `explain`).
    pub(crate) fn why(&self, site: Site) -> String {
        match self.sites.get(&site) {
            Some(s) if s.cold => {
                "a gradient kept readable by an optimizer step, not read since".to_string()
            }
            Some(s) => format!(
                "the last {} tensors recorded here were dropped unread",
                s.threshold
            ),
            None => "not seen before".to_string(),
        }
    }
}
