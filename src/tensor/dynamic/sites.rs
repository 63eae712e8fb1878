//! Automatic dynamic axes: what each recording site produced last time.
//!
//! A site is a source line and an op kind. When a site's call produces a
//! result whose size differs in one length from the same call one
//! step earlier (along one axis, or along every axis that had that length:
//! a square attention mask) (a `cat` that grows a cache, a prompt of a new length, a
//! batch of a new size; a step is what runs between two host reads or
//! `sync()` calls; `realize()` does not end one), that
//! change is exactly what would compile a new executable: the axis is
//! marked dynamic for that site from then on. A `narrow` whose start
//! changes the same way gets a run-time start.
//! Marks are sticky, so decisions never oscillate. The table is per
//! thread, so the decisions depend only on the program that thread ran,
//! never on timing or on other threads.

use lazyfuse_ir::Origin;
use lazyfuse_ir::{Op, Shape};
use std::cell::RefCell;
use std::collections::HashMap;

/// The op kinds that can start a dynamic axis.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Kind {
    /// `from_slice` and the other uploads.
    Upload,
    /// `arange`.
    Arange,
    /// `cat`.
    Cat,
    /// `narrow` (the result length and the start).
    Narrow,
    /// `broadcast_to`.
    Broadcast,
    /// `rand_uniform` (device draws).
    Random,
}

/// Calls remembered per site and step (a site called more often than this
/// in one step compares only its first calls).
const CALLS_PER_STEP: usize = 64;

#[derive(Default)]
struct Site {
    /// Result dims and start of each call in the previous step.
    prev: Vec<(Shape, usize)>,
    /// The same for the current step.
    cur: Vec<(Shape, usize)>,
    /// The sync-point clock of the current step.
    clock: u64,
    /// Axes marked dynamic.
    mask: u32,
    /// The start is marked run-time.
    runtime_start: bool,
    /// The capacities this site has given each dynamic axis (axis,
    /// capacity): its warm buckets.
    warm: Vec<(usize, usize)>,
    /// `explain` was told why a size that changed here stayed static.
    told_static: bool,
}

thread_local! {
    static SITES: RefCell<HashMap<(usize, Kind), Site>> = RefCell::new(HashMap::new());
}

/// What a site has learnt, after seeing this call's result `dims` (and
/// slice `start`): the dynamic axes and whether the start is run-time.
/// The k-th call of a site in a step (the calls between two sync points)
/// is compared with its k-th call in the previous step in which it ran, so
/// one helper called at several sizes within every step (a convolution's
/// slices, an initialiser's uploads) stays static, while a value that
/// grows from step to step becomes dynamic. Off (nothing dynamic) with
/// `LAZYFUSE_AUTO_DYNAMIC=0` or [`crate::set_auto_dynamic`]`(false)`.
pub(crate) fn observe(loc: Origin, kind: Kind, dims: &[usize], start: usize) -> (u32, bool) {
    if !crate::config::auto_dynamic() {
        return (0, false);
    }
    let key = (loc.id(), kind);
    let clock = crate::lazy::sync_points();
    SITES.with(|s| {
        let mut s = s.borrow_mut();
        let site = s.entry(key).or_default();
        if site.clock != clock {
            if !site.cur.is_empty() {
                // Swapped, not reallocated: recording stays allocation-free.
                std::mem::swap(&mut site.prev, &mut site.cur);
                site.cur.clear();
            }
            site.clock = clock;
        }
        let k = site.cur.len();
        if let Some((was, was_start)) = site.prev.get(k) {
            let mut marked = None;
            if was.rank() == dims.len() {
                let new = one_changed_length(was.dims(), dims) & !site.mask;
                if new != 0 {
                    site.mask |= new;
                    let a = new.trailing_zeros() as usize;
                    marked = Some(format!(
                        "axis {a} of {kind:?} ({} -> {}){}",
                        was.dims()[a],
                        dims[a],
                        if new.count_ones() > 1 {
                            " and the axes with the same length"
                        } else {
                            ""
                        }
                    ));
                }
            }
            if *was_start != start && !site.runtime_start {
                site.runtime_start = true;
                marked = Some(format!("start of {kind:?} ({was_start} -> {start})"));
            }
            let changed = was.dims() != dims;
            if marked.is_none() && changed && !site.told_static && crate::metrics::explaining() {
                site.told_static = true;
                crate::metrics::dynamic_static(format!(
                    "{kind:?} at {}:{} changed {was} -> {} on axes that moved to different lengths (not one length that moved): compiled per shape",
                    loc.file(),
                    loc.line(),
                    Shape::new(dims)
                ));
            }
            if let Some(what) = marked {
                crate::metrics::add(&crate::metrics::COUNTERS.dynamic_marks, 1);
                if crate::metrics::explaining() {
                    let at = format!("{}:{}", loc.file(), loc.line());
                    crate::metrics::dynamic_marked(format!("{what} at {at}"));
                }
            }
        }
        if k < CALLS_PER_STEP {
            site.cur.push((Shape::new(dims), start));
        }
        let sole = site.mask & sole_length_axes(dims);
        if sole != 0 && !site.told_static && crate::metrics::explaining() {
            site.told_static = true;
            let a = sole.trailing_zeros() as usize;
            crate::metrics::dynamic_static(format!(
                "axis {a} of {kind:?} at {}:{} stays exact at length {}: the only length its capacity holds",
                loc.file(),
                loc.line(),
                dims[a]
            ));
        }
        (site.mask & !sole, site.runtime_start)
    })
}

/// The axes to mark when a call's result changed from `was` to `dims`:
/// those that changed, when they all changed from one length to one other
/// length (one length that moved: a prompt of a new length along one axis,
/// or along both axes of a square attention mask). Axes that changed to
/// different lengths (an initialiser uploading weights of many shapes at
/// one line) mark nothing.
fn one_changed_length(was: &[usize], dims: &[usize]) -> u32 {
    let mut change = None;
    let mut mask = 0u32;
    for (a, (&w, &n)) in was
        .iter()
        .zip(dims)
        .enumerate()
        .filter(|(_, (w, n))| w != n)
    {
        if a >= 32 || change.is_some_and(|c| c != (w, n)) {
            return 0;
        }
        change = Some((w, n));
        mask |= 1 << a;
    }
    mask
}

/// The axes of `dims` whose length is the only one its capacity holds
/// (length 1, and 2 with power-of-two buckets): padded, such an axis would
/// have no padding, and no other length could share its executables, so
/// this call's value keeps it static. A decode step's one-token axis then
/// records ordinary ops instead of padded ones (the same compiles: one per
/// capacity either way), while the site stays marked for longer lengths.
fn sole_length_axes(dims: &[usize]) -> u32 {
    dims.iter()
        .enumerate()
        .take(32)
        .filter(|&(_, &n)| super::bucket(n) == n && (n <= 1 || super::bucket(n - 1) != n))
        .fold(0, |m, (a, _)| m | (1 << a))
}

/// The capacity of a length `len` on dynamic `axis` of the result of the
/// site (`loc`, `kind`): its bucket, unless that bucket is cold at this
/// site and the next bucket up is warm, which it then shares. A loop whose
/// lengths came down from longer ones (prompts of 9..32 tokens, then one
/// of 8) so runs the executables it already has instead of compiling a
/// smaller bucket (at most twice the padding of its own bucket). Warm
/// buckets are per site and thread, like the marks, so the choice depends
/// only on the program's own order of calls.
pub(crate) fn capacity(loc: Origin, kind: Kind, axis: usize, len: usize) -> usize {
    let own = super::bucket(len);
    if !crate::config::auto_dynamic() {
        return own;
    }
    let key = (loc.id(), kind);
    SITES.with(|s| {
        let mut s = s.borrow_mut();
        let site = s.entry(key).or_default();
        let is_warm = |c: usize| site.warm.contains(&(axis, c));
        let up = super::bucket(own + 1);
        let cap = if !is_warm(own) && is_warm(up) {
            up
        } else {
            own
        };
        if !is_warm(cap) {
            site.warm.push((axis, cap));
        }
        cap
    })
}

/// The site kind of `op` and its start, for the ops that can start a
/// dynamic axis.
fn kind_of(op: &Op) -> Option<(Kind, usize)> {
    Some(match op {
        Op::Concat { .. } => (Kind::Cat, 0),
        Op::Slice { start, .. } => (Kind::Narrow, *start),
        Op::BroadcastTo(_) => (Kind::Broadcast, 0),
        Op::Arange { .. } => (Kind::Arange, 0),
        Op::RandomUniform { .. } => (Kind::Random, 0),
        _ => return None,
    })
}

/// What the site of `op` (recorded at `loc`, logical result `shape`) has
/// learnt, for the ops that can start a dynamic axis; nothing for the rest.
pub(crate) fn for_op(op: &Op, shape: &Shape, loc: Origin) -> (u32, bool) {
    match kind_of(op) {
        Some((kind, start)) => observe(loc, kind, shape.dims(), start),
        None => (0, false),
    }
}

/// Forgets what this thread's sites learnt (tests that need a fresh start).
pub fn reset_dynamic_sites() {
    SITES.with(|s| s.borrow_mut().clear());
}

#[cfg(test)]
mod one_length_tests {
    use super::one_changed_length;

    #[test]
    fn one_length_that_moved_marks_every_axis_it_was_on() {
        assert_eq!(one_changed_length(&[4, 8], &[4, 9]), 0b10);
        assert_eq!(one_changed_length(&[19, 19], &[26, 26]), 0b11);
        assert_eq!(
            one_changed_length(&[2, 19, 19, 16], &[2, 26, 26, 16]),
            0b110
        );
        // Different lengths (weights of other shapes at one line): nothing.
        assert_eq!(one_changed_length(&[784, 1024], &[1024, 10]), 0);
        assert_eq!(one_changed_length(&[3, 5], &[4, 6]), 0);
        assert_eq!(one_changed_length(&[3, 5], &[3, 5]), 0);
    }
}
