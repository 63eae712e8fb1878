//! The program-order clock of a thread: how many step boundaries it has
//! reached. Never timing; it tells one step of a loop from the next.

use std::cell::Cell;

thread_local! {
    static SYNC_POINTS: Cell<u64> = const { Cell::new(0) };
}

/// Counts a step boundary of this thread: a host read or a `sync()`/
/// `flush()` (not a `realize()`: initialisers realize each parameter, and
/// must not look like the steps of a loop).
pub(crate) fn count_sync_point() {
    SYNC_POINTS.with(|c| c.set(c.get() + 1));
}

/// How many step boundaries this thread has reached.
pub(crate) fn sync_points() -> u64 {
    SYNC_POINTS.with(|c| c.get())
}
