//! Recompile explanations: when a region misses the compile cache but one
//! with the same op structure was compiled before, say what differed and
//! which user line recorded it.
//!
//! Strategy: keep, per structure [`Signature`] (ops and wiring, types and
//! attributes erased), the [`Description`] of the last region compiled with
//! it. On the next compile of that signature, diff the two; the first
//! difference decides the cause (`shape`, `dtype`, `attribute`, `other`),
//! counted in the metrics. The explanation is logged through `tracing` at
//! warn level and kept (the most recent [`MAX_KEPT`]) for
//! [`crate::metrics::report`]. Only compiles pay for this; cache hits never
//! reach it.

use lazyfuse_fusion::{describe, primary_cause, summarize, Cause, Description, Region, Signature};
use lazyfuse_ir::Graph;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};

/// Explanations kept for [`recent`].
pub const MAX_KEPT: usize = crate::metrics::RECENT_RECOMPILES_KEPT;
/// Signatures remembered (the map is cleared when it grows past this).
const MAX_SIGNATURES: usize = 16_384;

/// One recompile: a region whose structure was compiled before with other
/// types or attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recompile {
    /// The new region key.
    pub key: String,
    /// What decided it.
    pub cause: Cause,
    /// `file:line` that recorded the region.
    pub origin: String,
    /// What differed, old -> new.
    pub what: String,
}

impl std::fmt::Display for Recompile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recompile of region {} (recorded at {}), cause {}: {}",
            self.key,
            self.origin,
            self.cause.name(),
            self.what
        )
    }
}

struct State {
    last: HashMap<Signature, Description>,
    recent: VecDeque<Recompile>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Called before `region` is compiled: explains it if its structure was
/// compiled before with other types or attributes.
pub(crate) fn on_compile(graph: &Graph, region: &Region) {
    let (sig, desc) = describe(graph, region);
    let mut guard = STATE.lock();
    let st = guard.get_or_insert_with(|| State {
        last: HashMap::new(),
        recent: VecDeque::new(),
    });
    let old = st.last.get(&sig);
    let event = match old {
        Some(old) if *old != desc => {
            let diffs = desc.diff(old);
            let cause = primary_cause(&diffs);
            Some(Recompile {
                key: region.key.to_string(),
                cause,
                origin: desc
                    .origin()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_else(|| "unknown".into()),
                what: summarize(&diffs, 4),
            })
        }
        _ => None,
    };
    if st.last.len() >= MAX_SIGNATURES {
        st.last.clear();
    }
    st.last.insert(sig, desc);
    if let Some(r) = event {
        crate::metrics::recompiled(r.cause as usize, r.to_string());
        tracing::warn!(region = %r.key, cause = r.cause.name(), origin = %r.origin, "{r}");
        if st.recent.len() >= MAX_KEPT {
            st.recent.pop_front();
        }
        st.recent.push_back(r);
    }
}

/// Recompiles so far by cause, in [`Cause::ALL`] order.
pub fn counts() -> [u64; 4] {
    crate::metrics::recompile_counts()
}

/// The most recent recompile explanations, oldest first.
pub fn recent() -> Vec<Recompile> {
    STATE
        .lock()
        .as_ref()
        .map(|s| s.recent.iter().cloned().collect())
        .unwrap_or_default()
}
