//! `LAZYFUSE_DUMP_DIR=dir`: write each compiled region's StableHLO, and a flush
//! log mapping every region of every flush to the user lines that recorded
//! its ops, for inspection.
//!
//! Layout: `region-<key>.mlir` per region (written when the region is first
//! needed by this process, so also for regions loaded from the persistent
//! cache), and `flush-log.txt`, appended at each flush:
//!
//! ```text
//! flush 3: 12 nodes, 2 regions
//!   region 0 key 5f0c... (2 params, 4 nodes, 1 outputs) file region-5f0c....mlir
//!     exp @ src/main.rs:12
//!     sum @ src/main.rs:13
//!     left out, not written: exp f32[64] @ src/main.rs:12 (the last 2 tensors recorded here were dropped unread)
//!   left out, not computed: mul f32[64] @ src/main.rs:15 (...)
//! ```
//!
//! A region's extra lines say which live tensors it computed without
//! writing them, and which tensors left out earlier it computes now
//! (recomputes); the flush's say which live tensors no region computed.
//!
//! Dumping is best effort: a write failure is logged, never an error of the
//! computation.

use lazyfuse_fusion::{Plan, RegionKey};
use lazyfuse_ir::{Graph, Op};
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Name of the flush log inside the dump directory.
pub const FLUSH_LOG: &str = "flush-log.txt";

fn dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| {
        let d = crate::config::dump_dir()?.clone();
        std::fs::create_dir_all(&d).ok()?;
        Some(d)
    })
    .as_ref()
}

/// Whether dumping is on (`LAZYFUSE_DUMP_DIR` names a usable directory).
pub(crate) fn enabled() -> bool {
    dir().is_some()
}

/// Writes `text` as `<dir>/region-<key>.mlir` when dumping is on.
pub(crate) fn region_text(key: RegionKey, text: &str) {
    if let Some(d) = dir() {
        let p = d.join(format!("region-{key}.mlir"));
        if let Err(e) = std::fs::write(&p, text) {
            tracing::warn!("cannot write {}: {e}", p.display());
        }
    }
}

/// Appends one flush's plan to `<dir>/flush-log.txt` when dumping is on:
/// each region's key, its StableHLO file and the ops with their recording
/// lines (constants omitted), then `region_notes[i]` under region `i` and
/// `flush_notes` under the flush (output decisions: `executor::notes`).
pub(crate) fn flush_log(
    graph: &Graph,
    plan: &Plan,
    region_notes: &[Vec<String>],
    flush_notes: &[String],
) {
    let Some(d) = dir() else { return };
    static SEQ: Mutex<u64> = Mutex::new(0);
    let mut seq = SEQ.lock();
    *seq += 1;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "flush {}: {} nodes, {} regions",
        *seq,
        graph.len(),
        plan.regions.len()
    );
    for (i, r) in plan.regions.iter().enumerate() {
        let _ = writeln!(
            s,
            "  region {i} key {} ({} params, {} nodes, {} outputs) file region-{}.mlir",
            r.key,
            r.params.len(),
            r.nodes.len(),
            r.outputs.len(),
            r.key
        );
        for &n in &r.nodes {
            let node = graph.node(n);
            if matches!(node.op, Op::Constant { .. }) {
                continue;
            }
            let o = node.origin;
            let _ = writeln!(s, "    {} @ {}:{}", node.op.name(), o.file(), o.line());
        }
        for line in region_notes.get(i).into_iter().flatten() {
            let _ = writeln!(s, "    {line}");
        }
    }
    for line in flush_notes {
        let _ = writeln!(s, "  {line}");
    }
    for &n in &plan.constants {
        let o = graph.node(n).origin;
        let _ = writeln!(s, "  live scalar uploaded @ {}:{}", o.file(), o.line());
    }
    let p = d.join(FLUSH_LOG);
    // One write per flush under the lock: entries never interleave.
    let r = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .and_then(|mut f| f.write_all(s.as_bytes()));
    if let Err(e) = r {
        tracing::warn!("cannot write {}: {e}", p.display());
    }
}
