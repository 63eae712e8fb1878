//! Where the core records an op: the caller's source location, or the site
//! a binding declares for the ops it records on the user's behalf (a
//! Python frame: see [`with_origin`]). Every recording path, and every
//! error it returns, takes its [`Origin`] from [`caller`], so a program
//! driven through a binding gets its own lines in errors, output
//! prediction and dynamic-shape sites, not the binding's.

use lazyfuse_ir::Origin;
use std::cell::Cell;

thread_local! {
    /// The origin declared by the innermost [`with_origin`] on this thread.
    static DECLARED: Cell<Option<Origin>> = const { Cell::new(None) };
}

/// Runs `f` with every op it records, and every error it returns, located
/// at `origin` instead of the Rust caller (for a binding: the user's
/// frame, `Origin::site(file, line, column, op)`). Nests; the previous
/// origin returns when `f` ends, even by a panic.
pub fn with_origin<R>(origin: Origin, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Origin>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DECLARED.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DECLARED.with(|d| d.replace(Some(origin))));
    f()
}

/// The origin of an op being recorded: the declared one inside
/// [`with_origin`], else the caller's location (through every
/// `#[track_caller]`).
#[track_caller]
#[inline(always)]
pub(crate) fn caller() -> Origin {
    match DECLARED.with(Cell::get) {
        Some(o) => o,
        None => Origin::caller(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_origin_wins_until_its_scope_ends() {
        let py = Origin::site("model.py", 7, 0, "aten::add");
        let inner = Origin::site("model.py", 8, 0, "aten::mul");
        let (here, line) = (caller(), line!());
        assert_eq!(here.line(), line);
        with_origin(py, || {
            assert_eq!(caller(), py);
            with_origin(inner, || assert_eq!(caller(), inner));
            assert_eq!(caller(), py);
        });
        let after = std::panic::catch_unwind(|| with_origin(py, || panic!("unwinds")));
        assert!(after.is_err());
        assert!(caller().registered().is_none(), "restored after a panic");
    }
}
