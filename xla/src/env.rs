//! The environment variables the XLA backend reads: which plugin to load,
//! where plugins are provisioned, the CUDA client's options and strict
//! floating point. The core's `config` module lists these beside its own, so
//! the set a user can set is still written down in one place.
//!
//! Every name is `LAZYFUSE_*`; a few have the seed's `TPU_*` spelling as an
//! alias, read only when the `LAZYFUSE_*` name is unset.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `LAZYFUSE_PJRT_PLUGIN` (alias `TPU_PJRT_PLUGIN`): a PJRT plugin to load
/// instead of the provisioned CPU one.
pub const PJRT_PLUGIN: &str = "LAZYFUSE_PJRT_PLUGIN";
/// `LAZYFUSE_CACHE`: where the CPU and CUDA plugins are provisioned.
pub const PLUGIN_CACHE: &str = "LAZYFUSE_CACHE";
/// `LAZYFUSE_GPU_MEMORY_FRACTION`: fraction of GPU memory the CUDA client may use.
pub const GPU_MEMORY_FRACTION: &str = "LAZYFUSE_GPU_MEMORY_FRACTION";
/// `LAZYFUSE_GPU_PREALLOCATE`: `0` makes the CUDA client allocate on demand.
pub const GPU_PREALLOCATE: &str = "LAZYFUSE_GPU_PREALLOCATE";
/// `LAZYFUSE_GPU_ALLOCATOR`: the CUDA client's allocator (`bfc`, `cuda_async`, ...).
pub const GPU_ALLOCATOR: &str = "LAZYFUSE_GPU_ALLOCATOR";
/// `LAZYFUSE_STRICT_FP=1`: compile without fused multiply-add, so fused
/// results equal unfused ones bit for bit (slower elementwise code).
pub const STRICT_FP: &str = "LAZYFUSE_STRICT_FP";
/// XLA's own log threshold (0 info, 1 warnings, 2 errors), read by the
/// plugin when it first logs; lazyfuse sets 1 when it is unset.
pub const XLA_LOG_LEVEL: &str = "TF_CPP_MIN_LOG_LEVEL";

/// The seed's `TPU_*` spelling of this crate's variables that had one,
/// read when the `LAZYFUSE_*` name is unset (the core's `config` keeps the
/// aliases of its own variables).
pub fn alias(name: &str) -> Option<&'static str> {
    (name == PJRT_PLUGIN).then_some("TPU_PJRT_PLUGIN")
}

/// The value of `name`, or of its `TPU_*` alias when `name` is unset; set
/// but empty counts as unset, so `VAR= cmd` disables an override.
pub fn non_empty(name: &str) -> Option<OsString> {
    let get = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty());
    get(name).or_else(|| alias(name).and_then(get))
}

/// A boolean variable (`0`, `false`, `off`, `no` are false), if set.
pub fn flag(name: &str) -> Option<bool> {
    non_empty(name).map(|v| {
        let v = v.to_string_lossy();
        !matches!(v.trim(), "0" | "false" | "off" | "no")
    })
}

/// [`PJRT_PLUGIN`], read when a default device is asked for.
pub fn plugin_override() -> Option<PathBuf> {
    non_empty(PJRT_PLUGIN).map(PathBuf::from)
}

/// The user cache root for provisioning: `LAZYFUSE_CACHE`, else
/// `$XDG_CACHE_HOME/lazyfuse` (absolute values only, as the XDG spec says),
/// else `$HOME/.cache/lazyfuse`.
pub fn plugin_cache_root() -> Option<PathBuf> {
    if let Some(dir) = non_empty(PLUGIN_CACHE) {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME").map(PathBuf::from) {
        if dir.is_absolute() {
            return Some(dir.join("lazyfuse"));
        }
    }
    non_empty("HOME").map(|h| PathBuf::from(h).join(".cache").join("lazyfuse"))
}

/// A CUDA client option variable's trimmed value, if set and non-empty.
pub fn gpu_option(name: &str) -> Option<String> {
    non_empty(name).map(|v| v.to_string_lossy().trim().to_string())
}

/// [`STRICT_FP`]: no multiply-add contraction in compiled code. Read once:
/// it is part of every executable's compile options.
pub fn strict_fp() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| flag(STRICT_FP).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_variable_keeps_its_seed_spelling() {
        assert_eq!(alias(PJRT_PLUGIN), Some("TPU_PJRT_PLUGIN"));
        assert_eq!(alias(PLUGIN_CACHE), None);
    }
}
