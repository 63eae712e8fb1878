//! The CPU plugins lazyfuse knows by name: where each comes from, the exact
//! wheel and library it accepts, and which XLA is inside.
//!
//! Why a table: `LAZYFUSE_PJRT_PLUGIN` takes a path, which makes the user
//! find, download and trust a plugin themselves. A short name instead
//! (`LAZYFUSE_PJRT_PLUGIN=jax-cpu`) gets a plugin lazyfuse has tested,
//! installed the way the default one is: one pinned wheel from PyPI, its
//! SHA-256 checked by pip, the library's own SHA-256 checked again before
//! every load ([`super::verify`]). The official `xla-cpu-pjrt` wheel is the
//! default; the others carry a newer XLA (faster dots through YNNPACK),
//! packaged by third parties for their own projects, which is why each
//! entry states its provenance.

use super::fetch::PinnedWheel;

/// One plugin lazyfuse can install and load by name.
#[derive(Clone, Copy, Debug)]
pub struct CatalogPlugin {
    /// The short name `LAZYFUSE_PJRT_PLUGIN` accepts.
    pub name: &'static str,
    /// The wheel on PyPI (name, exact version, SHA-256 of the file).
    pub(crate) wheel: PinnedWheel,
    /// Where the library sits inside the wheel.
    pub so_in_wheel: &'static str,
    /// SHA-256 of the library itself, checked before it is loaded.
    pub so_sha256: &'static str,
    /// The cache layout: `<cache>/<dir>/<so_name>`.
    pub dir: &'static str,
    /// The library's file name in the cache.
    pub so_name: &'static str,
    /// The PJRT C API version the library reports (`major`, `minor`).
    pub pjrt_api: (i32, i32),
    /// Download size of the wheel, for the one-time notice.
    pub download_mb: u32,
    /// Where the build comes from, in a sentence.
    pub provenance: &'static str,
}

impl CatalogPlugin {
    /// `name==version`, as pip spells a pinned requirement.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.wheel.name, self.wheel.version)
    }

    /// SHA-256 of the wheel file pip must accept.
    pub fn wheel_sha256(&self) -> &'static str {
        self.wheel.sha256
    }

    /// The command that fetches this plugin's wheel by hand (what lazyfuse
    /// runs itself on first use), for error messages.
    pub fn install_command(&self) -> String {
        format!(
            "python3 -m pip download --no-deps --only-binary=:all: {} -d <dir> \
             (the wheel's SHA-256 is {}; the library is {} inside it)",
            self.requirement(),
            self.wheel.sha256,
            self.so_in_wheel
        )
    }
}

/// The default plugin: OpenXLA's official CPU plugin wheel.
pub const DEFAULT: &CatalogPlugin = &CATALOG[0];

/// Every plugin lazyfuse installs by name; the first is the default.
pub const CATALOG: &[CatalogPlugin] = &[
    CatalogPlugin {
        name: "xla-cpu",
        wheel: PinnedWheel {
            name: "xla-cpu-pjrt",
            version: "0.0.1",
            sha256: "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
        },
        so_in_wheel: "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
        so_sha256: "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc",
        dir: "xla-cpu-pjrt-0.0.1",
        so_name: "xla_cpu_pjrt.so",
        pjrt_api: (0, 81),
        download_mb: 63,
        provenance: "OpenXLA's official CPU plugin wheel (xla-cpu-pjrt 0.0.1 on PyPI)",
    },
    CatalogPlugin {
        name: "jax-cpu",
        wheel: PinnedWheel {
            name: "lammps-jax-pjrt-cpu",
            version: "0.11.2",
            sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
        },
        so_in_wheel: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
        so_sha256: "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2",
        dir: "lammps-jax-pjrt-cpu-0.11.2",
        so_name: "pjrt_c_api_cpu_plugin.so",
        pjrt_api: (0, 115),
        download_mb: 63,
        provenance: "XLA's CPU PJRT plugin that its wheel states is built from the XLA of jaxlib 0.11.2, packaged on \
                     PyPI by the lammps-jax project (Apache-2.0)",
    },
    CatalogPlugin {
        name: "zml-cpu",
        wheel: PinnedWheel {
            name: "fastatomstruct-xla-cpu",
            version: "2026.6.23",
            sha256: "88b1c430b341b4bea40a37420311c9c75db6e22b46d2ff95b6986577bee6afe9",
        },
        so_in_wheel: "fastatomstruct_xla_cpu/libpjrt_cpu.so",
        so_sha256: "0a0fe56ca17be9efc7b942e89e534e5e0ad4a0f1e369b66d27b62184509015b9",
        dir: "fastatomstruct-xla-cpu-2026.6.23",
        so_name: "libpjrt_cpu.so",
        pjrt_api: (0, 106),
        download_mb: 64,
        provenance: "the unmodified pjrt-cpu_linux-amd64 build of 2026-06-23 from \
                     zml/pjrt-artifacts, packaged on PyPI by the fastatomstruct project \
                     (Apache-2.0)",
    },
];

/// The catalog entry called `name` (case-insensitive), if any.
pub fn find(name: &str) -> Option<&'static CatalogPlugin> {
    CATALOG
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(name.trim()))
}

/// The catalog's names, comma-separated, for messages.
pub fn names() -> String {
    CATALOG
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for p in CATALOG {
            assert_eq!(find(p.name).unwrap().name, p.name);
            assert_eq!(find(&p.name.to_uppercase()).unwrap().name, p.name);
            assert_eq!(p.so_sha256.len(), 64);
            assert_eq!(p.wheel.sha256.len(), 64);
        }
        assert!(find("no-such-plugin").is_none());
        assert_eq!(DEFAULT.name, "xla-cpu");
        assert_eq!(names(), "xla-cpu, jax-cpu, zml-cpu");
    }
}
