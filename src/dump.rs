//! `TPU_DUMP_DIR=dir`: write each compiled region's StableHLO for inspection.

use lazyfuse_fusion::RegionKey;
use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> Option<&'static PathBuf> {
    static D: OnceLock<Option<PathBuf>> = OnceLock::new();
    D.get_or_init(|| {
        let d = PathBuf::from(std::env::var_os("TPU_DUMP_DIR")?);
        std::fs::create_dir_all(&d).ok()?;
        Some(d)
    })
    .as_ref()
}

/// Writes `text` as `<dir>/region-<key>.mlir` when dumping is on. Best effort:
/// a dump failure is logged, never an error of the computation.
pub(crate) fn region_text(key: RegionKey, text: &str) {
    if let Some(d) = dir() {
        let p = d.join(format!("region-{key}.mlir"));
        if let Err(e) = std::fs::write(&p, text) {
            tracing::warn!("cannot write {}: {e}", p.display());
        }
    }
}
