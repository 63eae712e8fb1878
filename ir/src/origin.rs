//! Where an op was recorded, as data: a Rust call site (the `Location` that
//! `#[track_caller]` gives) or a site registered at run time (a Python
//! frame's file and line, and the op it records there). Output prediction,
//! dynamic-shape sites, error messages and the lowering's `loc(...)` all key
//! on it, so a program recorded through a binding gets the same learning
//! and the same `file:line` errors as a Rust one.
//!
//! An [`Origin`] is one word, copied with every recorded node: a Rust site
//! is the `Location`'s address (no lookup on the recording path); a
//! registered site is the address of its interned [`SiteInfo`], tagged in
//! the low bit (both are 8-byte aligned). The same site always gives the
//! same word, which is its identity.

use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::sync::{Mutex, OnceLock};

/// A site registered at run time (see [`Origin::site`]). Interned: one per
/// distinct site for the life of the process.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SiteInfo {
    /// The source file.
    pub file: &'static str,
    /// The 1-based line.
    pub line: u32,
    /// The 1-based column, or 0 where the frame has none.
    pub column: u32,
    /// What is recorded there, to tell apart the ops of one line when there
    /// is no column (a Python frame): the op's name, or empty.
    pub label: &'static str,
}

/// Where an op was recorded: a Rust call site or a registered one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin(usize);

// The tag of a registered site's word needs the low bit of both pointers
// free.
const _: () = assert!(std::mem::align_of::<Location<'static>>() >= 2);
const _: () = assert!(std::mem::align_of::<SiteInfo>() >= 2);

/// Either form, decoded.
enum Site {
    Rust(&'static Location<'static>),
    Registered(&'static SiteInfo),
}

impl Origin {
    /// The caller's source location (through every `#[track_caller]`).
    #[track_caller]
    #[inline(always)]
    pub fn caller() -> Origin {
        Origin::from(Location::caller())
    }

    /// The interned origin of `file:line:column` recording `label` (an op
    /// name, or empty): the same arguments give the same origin. Each
    /// distinct site is kept for the life of the process (a program has
    /// as many as it has recording lines).
    pub fn site(file: &str, line: u32, column: u32, label: &str) -> Origin {
        type Table = Mutex<HashMap<(String, u32, u32, String), &'static SiteInfo>>;
        static SITES: OnceLock<Table> = OnceLock::new();
        let mut sites = SITES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (file.to_string(), line, column, label.to_string());
        let info = *sites.entry(key).or_insert_with(|| {
            Box::leak(Box::new(SiteInfo {
                file: Box::leak(file.into()),
                line,
                column,
                label: Box::leak(label.into()),
            }))
        });
        Origin(info as *const SiteInfo as usize | 1)
    }

    #[inline(always)]
    fn decode(self) -> Site {
        if self.0 & 1 == 0 {
            // SAFETY: an untagged word is only ever made from a
            // `&'static Location<'static>` (`From` below).
            Site::Rust(unsafe { &*(self.0 as *const Location<'static>) })
        } else {
            // SAFETY: a tagged word is only ever made from a leaked,
            // never-freed `SiteInfo` (`Origin::site`).
            Site::Registered(unsafe { &*((self.0 & !1) as *const SiteInfo) })
        }
    }

    /// The source file.
    pub fn file(self) -> &'static str {
        match self.decode() {
            Site::Rust(l) => l.file(),
            Site::Registered(s) => s.file,
        }
    }

    /// The 1-based line.
    pub fn line(self) -> u32 {
        match self.decode() {
            Site::Rust(l) => l.line(),
            Site::Registered(s) => s.line,
        }
    }

    /// The 1-based column (0 for a registered site without one).
    pub fn column(self) -> u32 {
        match self.decode() {
            Site::Rust(l) => l.column(),
            Site::Registered(s) => s.column,
        }
    }

    /// The registered site's details (`None` for a Rust call site).
    pub fn registered(self) -> Option<&'static SiteInfo> {
        match self.decode() {
            Site::Rust(_) => None,
            Site::Registered(s) => Some(s),
        }
    }

    /// The origin's identity as a number (what sites and predictors key on).
    #[inline(always)]
    pub fn id(self) -> usize {
        self.0
    }
}

impl From<&'static Location<'static>> for Origin {
    #[inline(always)]
    fn from(l: &'static Location<'static>) -> Origin {
        Origin(l as *const Location<'static> as usize)
    }
}

impl fmt::Display for Origin {
    /// `file:line:column`, or `file:line` where there is no column.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.column() {
            0 => write!(f, "{}:{}", self.file(), self.line()),
            c => write!(f, "{}:{}:{}", self.file(), self.line(), c),
        }
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.registered() {
            Some(s) if !s.label.is_empty() => write!(f, "{self} ({})", s.label),
            _ => write!(f, "{self}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rust_site_is_its_location() {
        let (a, line) = (Origin::caller(), line!());
        assert_eq!((a.file(), a.line()), (file!(), line));
        assert!(a.registered().is_none());
        let b = Origin::caller();
        assert_ne!(a, b, "two call sites");
        let same = || Origin::caller();
        assert_eq!(same(), same(), "one call site");
    }

    #[test]
    fn registered_sites_are_interned() {
        let a = Origin::site("train.py", 12, 0, "aten::add");
        let b = Origin::site("train.py", 12, 0, "aten::add");
        let c = Origin::site("train.py", 12, 0, "aten::mul");
        assert_eq!(a, b);
        assert_ne!(a, c, "two ops of one line");
        assert_eq!((a.file(), a.line(), a.column()), ("train.py", 12, 0));
        assert_eq!(a.to_string(), "train.py:12");
        assert_eq!(format!("{c:?}"), "train.py:12 (aten::mul)");
        assert_eq!(Origin::site("m.py", 3, 7, "").to_string(), "m.py:3:7");
        assert_ne!(a.id(), Origin::caller().id());
    }
}
