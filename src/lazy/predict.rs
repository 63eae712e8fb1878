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
//! weakly, and strongly only for the moment it binds each one; a watched
//! tensor's count is read outside that moment ([`Latch::outside_binding`]),
//! so when a tensor dies is decided by the program alone.
//! Each thread's graph learns on its own, so the same program makes the same
//! decisions, and the same region keys, on every run and every thread.

use super::value::TensorInner;
use crate::executor::Latch;
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
    let line = node.origin as *const _ as u64;
    node.hash ^ line.rotate_left(29).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The site of a node holding a value with dynamic axes (`mask`): its
/// line, op, dtype and rank, but not its shapes, so what the program does
/// with a value is learnt once for every capacity bucket, not per bucket.
pub(crate) fn dynamic_site_of(node: &Node, mask: u32) -> Site {
    use std::hash::{Hash, Hasher};
    let mut h = lazyfuse_ir::stable_hasher();
    (node.origin as *const _ as u64).hash(&mut h);
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
}

impl Default for SiteStats {
    fn default() -> Self {
        SiteStats {
            unread: 0,
            threshold: LEAVE_OUT_AFTER,
            leave_out: false,
        }
    }
}

/// Bound on remembered sites (cleared past it, like the other caches).
const MAX_SITES: usize = 1 << 16;

/// A tensor computed only because it was live.
struct Watched {
    tensor: Weak<TensorInner>,
    site: Site,
    /// Set when the program reads or uses it.
    used: Arc<AtomicBool>,
    /// The job computing it ([`Predictor::computed_by`]), whose executor
    /// holds it for a moment while binding it.
    job: Option<Arc<Latch>>,
}

impl Watched {
    /// Whether the program holds the tensor no more: a count taken outside
    /// its job's binding, so the executor's passing handle never counts.
    fn dead(&self) -> bool {
        let count = || self.tensor.strong_count();
        match &self.job {
            Some(job) => job.outside_binding(count) == 0,
            None => count() == 0,
        }
    }
}

/// One thread graph's learned decisions and the tensors it is watching.
#[derive(Default)]
pub(crate) struct Predictor {
    sites: HashMap<Site, SiteStats, BuildHasherDefault<ahash::AHasher>>,
    watched: Vec<Watched>,
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
                ..SiteStats::default()
            });
            return s.leave_out;
        }
        self.sites.get(&site).is_some_and(|s| s.leave_out)
    }

    /// Starts watching `t`, computed only because it was live.
    pub(crate) fn watch(&mut self, t: &Arc<TensorInner>, site: Site) {
        self.watched.push(Watched {
            tensor: Arc::downgrade(t),
            site,
            used: t.watch_cell(),
            job: None,
        });
    }

    /// The tensors watched since the last call are computed by the job of
    /// `latch` (called before the graph is released, so no flush observes
    /// them in between).
    pub(crate) fn computed_by(&mut self, latch: &Arc<Latch>) {
        for w in self.watched.iter_mut().rev() {
            if w.job.is_some() {
                break;
            }
            w.job = Some(latch.clone());
        }
    }

    /// Settles watched tensors: used ones confirm their site, dead unread
    /// ones count against it; the rest stay watched.
    pub(crate) fn observe(&mut self) {
        let sites = &mut self.sites;
        if sites.len() > MAX_SITES {
            sites.clear();
        }
        self.watched.retain(|w| {
            // Liveness first: once dead, the cell is final.
            let dead = w.dead();
            if w.used.load(Relaxed) {
                sites.entry(w.site).or_default().unread = 0;
                return false;
            }
            if !dead {
                return true;
            }
            let s = sites.entry(w.site).or_default();
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
        s.unread = 0;
        s.threshold = s.threshold.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lazy::value::TensorState;
    use lazyfuse_ir::{DType, Shape};
    use std::sync::mpsc;
    use std::time::Duration;

    /// A watched tensor and the job computing it, as a flush leaves them.
    fn watched(p: &mut Predictor, site: Site) -> (Arc<TensorInner>, Arc<Latch>) {
        let state = TensorState::Failed(Box::new(crate::Error::internal("unused")));
        let dev = crate::Device::interpreter();
        let t = Arc::new(TensorInner::new(Shape::scalar(), DType::F32, &dev, state));
        p.watch(&t, site);
        let job = Arc::new(Latch::default());
        p.computed_by(&job);
        (t, job)
    }

    /// Plays the executor binding `t`: holds it strongly inside the job's
    /// binding section until told to go on, then a while longer, so a flush
    /// observing meanwhile meets the executor's handle.
    fn bind_slowly(
        job: Arc<Latch>,
        t: &Arc<TensorInner>,
    ) -> (std::thread::JoinHandle<()>, mpsc::Sender<()>) {
        let weak = Arc::downgrade(t);
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            job.binding(|| {
                let held = weak.upgrade().expect("the program holds it");
                held_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                std::thread::sleep(Duration::from_millis(50));
                drop(held);
            })
        });
        held_rx.recv().unwrap();
        (worker, go_tx)
    }

    /// The program drops a watched tensor while the executor is binding it:
    /// the next flush counts the drop, as it would had the worker finished
    /// earlier. The decision does not depend on where the worker was.
    #[test]
    fn a_tensor_dropped_while_its_job_binds_it_counts_as_dropped() {
        let mut p = Predictor::default();
        let (t, job) = watched(&mut p, 7);
        let (worker, go) = bind_slowly(job, &t);
        drop(t);
        go.send(()).unwrap();
        p.observe();
        assert_eq!(p.sites.get(&7).map(|s| s.unread), Some(1));
        assert!(p.watched.is_empty());
        worker.join().unwrap();
    }

    /// The same moment with the program still holding the tensor: it stays
    /// watched, and nothing counts against its site.
    #[test]
    fn a_tensor_held_while_its_job_binds_it_stays_watched() {
        let mut p = Predictor::default();
        let (t, job) = watched(&mut p, 9);
        let (worker, go) = bind_slowly(job, &t);
        go.send(()).unwrap();
        p.observe();
        assert!(p.sites.get(&9).is_none_or(|s| s.unread == 0));
        assert_eq!(p.watched.len(), 1);
        worker.join().unwrap();
        drop(t);
        p.observe();
        assert_eq!(p.sites.get(&9).map(|s| s.unread), Some(1));
    }
}
