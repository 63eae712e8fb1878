//! Automatic dynamic axes: what each recording site produced last time.
//!
//! A site is a source line and an op kind. When the same site produces a
//! result whose size differs from its previous call along exactly one axis
//! (a `cat` that grows a cache, a prompt of a new length, a batch of a new
//! size), with a sync point in between (so the call is a new step of a
//! loop, not the next weight of an initialiser), that change is exactly
//! what would compile a new executable: the axis is marked dynamic for
//! that site from then on. A `narrow` whose start changes the same way gets
//! a run-time start.
//! Marks are sticky, so decisions never oscillate. The table is per
//! thread, so the decisions depend only on the program that thread ran,
//! never on timing or on other threads.

use lazyfuse_ir::{Op, Shape};
use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::Location;

/// The op kinds that can start a dynamic axis.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Kind {
    /// `from_slice` and the other uploads.
    Upload,
    /// `full`, `zeros`, `ones`.
    Full,
    /// `arange`.
    Arange,
    /// `cat`.
    Cat,
    /// `narrow` (the result length and the start).
    Narrow,
    /// `broadcast_to`.
    Broadcast,
}

#[derive(Default)]
struct Site {
    dims: Vec<usize>,
    start: usize,
    /// The thread's sync-point clock at the previous call.
    clock: u64,
    /// Axes marked dynamic.
    mask: u32,
    /// The start is marked run-time.
    runtime_start: bool,
}

thread_local! {
    static SITES: RefCell<HashMap<(usize, Kind), Site>> = RefCell::new(HashMap::new());
}

/// What a site has learnt, after seeing this call's result `dims` (and
/// slice `start`): the dynamic axes and whether the start is run-time.
/// Off (nothing dynamic) with `LAZYFUSE_AUTO_DYNAMIC=0`.
pub(crate) fn observe(
    loc: &'static Location<'static>,
    kind: Kind,
    dims: &[usize],
    start: usize,
) -> (u32, bool) {
    if !crate::config::auto_dynamic() {
        return (0, false);
    }
    let key = (loc as *const Location<'static> as usize, kind);
    let clock = crate::lazy::sync_points();
    SITES.with(|s| {
        let mut s = s.borrow_mut();
        let site = s.entry(key).or_insert_with(|| Site {
            dims: dims.to_vec(),
            start,
            clock,
            ..Site::default()
        });
        let new_step = site.clock != clock;
        if new_step && site.dims.len() == dims.len() {
            let mut changed = site
                .dims
                .iter()
                .zip(dims)
                .enumerate()
                .filter(|(_, (w, n))| w != n);
            if let (Some((a, _)), None) = (changed.next(), changed.next()) {
                if a < 32 {
                    site.mask |= 1 << a;
                }
            }
        }
        if new_step && site.start != start {
            site.runtime_start = true;
        }
        site.dims.clear();
        site.dims.extend_from_slice(dims);
        site.start = start;
        site.clock = clock;
        (site.mask, site.runtime_start)
    })
}

/// What the site of `op` (recorded at `loc`, logical result `shape`) has
/// learnt, for the ops that can start a dynamic axis; nothing for the rest.
pub(crate) fn for_op(op: &Op, shape: &Shape, loc: &'static Location<'static>) -> (u32, bool) {
    let (kind, start) = match op {
        Op::Concat { .. } => (Kind::Cat, 0),
        Op::Slice { start, .. } => (Kind::Narrow, *start),
        Op::BroadcastTo(_) => (Kind::Broadcast, 0),
        Op::Arange { .. } => (Kind::Arange, 0),
        Op::Constant { .. } if shape.rank() > 0 => (Kind::Full, 0),
        _ => return (0, false),
    };
    observe(loc, kind, shape.dims(), start)
}

/// Forgets what this thread's sites learnt (tests that need a fresh start).
pub fn reset_dynamic_sites() {
    SITES.with(|s| s.borrow_mut().clear());
}
