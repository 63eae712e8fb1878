//! XLA's CUDA PJRT plugin: which one, how it is provisioned, and how its
//! client is made.
//!
//! The plugin is JAX's `jax-cuda13-pjrt` (the PJRT plugin JAX itself runs
//! on NVIDIA GPUs), not OpenXLA's `xla-cuda12-pjrt==0.0.1`, because:
//! - the JAX plugin links no CUDA library at load time (each is dlopened on
//!   first use through its `RPATH`, `$ORIGIN/../../nvidia/...`), so it loads
//!   on any machine and reports a missing GPU as a `PJRT_Error`; the OpenXLA
//!   wheel names `libcuda.so`, cuDNN and cuPTI as hard dependencies and does
//!   not even load without them;
//! - it is released with JAX, so it is maintained and is the plugin an
//!   H200 image with JAX carries (the one the device checks run on);
//! - its CUDA 13 build needs driver 580 or newer; a CUDA 12 plugin
//!   (`jax-cuda12-pjrt`) can be used through `LAZYFUSE_PJRT_PLUGIN` instead.
//!
//! Provisioning is as for the CPU plugin: exact wheels with pinned SHA-256s
//! from PyPI, fetched once by `pip download --require-hashes` into the user
//! cache and unpacked in the layout pip would give them in `site-packages`
//! (`jax_plugins/xla_cuda13/xla_cuda_plugin.so` next to `nvidia/cu13/...`),
//! which is what the plugin's `RPATH` and XLA's CUDA-root search expect.
//! Only what lazyfuse's programs need is fetched (about 1.1 GB): the CUDA
//! runtime, cuBLAS, cuDNN with the nvrtc it loads, nvJitLink and `ptxas`
//! (PTX to GPU code) and `libdevice` (the math library XLA links into
//! every kernel); not cuFFT, cuSOLVER, cuSPARSE, NCCL or NVSHMEM.
//!
//! Create options are the plugin's own (`pjrt_c_api_gpu_internal.cc`
//! validates names and types: an unknown name or wrong type is an error,
//! not ignored): `platform_name` (string), `allocator` (string),
//! `memory_fraction` (float), `preallocate` (bool); lazyfuse sends only
//! those, typed as the plugin reads them.

use super::fetch::{self, PinnedWheel, TempDir};
use super::ProvisionError;
use crate::pjrt::{CompileOverride, CreateOption, NamedValue};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::env::{
    gpu_option, GPU_ALLOCATOR as ALLOCATOR_ENV, GPU_MEMORY_FRACTION as MEMORY_FRACTION_ENV,
    GPU_PREALLOCATE as PREALLOCATE_ENV,
};

/// The allocators the plugin accepts (any other name is refused by it).
const ALLOCATORS: &[&str] = &["default", "platform", "bfc", "cuda_async", "vmm", "address"];

/// The pinned plugin wheel.
const PLUGIN_WHEEL: PinnedWheel = PinnedWheel {
    name: "jax-cuda13-pjrt",
    version: "0.12.0.1",
    sha256: "5899bb6177eda86ea532afb9a26794f2bdd04966f6a01f9028266b16c2b6cf90",
};
/// Where the plugin sits inside its wheel, and so inside the install.
const PLUGIN_IN_WHEEL: &str = "jax_plugins/xla_cuda13/xla_cuda_plugin.so";

/// The NVIDIA wheels, each with the members lazyfuse unpacks from it.
const RUNTIME_WHEELS: &[(PinnedWheel, &[&str])] = &[
    (
        PinnedWheel {
            name: "nvidia-cuda-runtime",
            version: "13.0.96",
            sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
        },
        &["nvidia/cu13/lib/libcudart.so"],
    ),
    (
        PinnedWheel {
            name: "nvidia-cublas",
            version: "13.0.2.14",
            sha256: "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c",
        },
        &["nvidia/cu13/lib/"],
    ),
    (
        PinnedWheel {
            name: "nvidia-cudnn-cu13",
            version: "9.12.0.46",
            sha256: "f3befad533e234069eb61ae0d12cb7aa8af0ccf36f28c1d4273cc0005d990de0",
        },
        &["nvidia/cudnn/lib/"],
    ),
    (
        PinnedWheel {
            name: "nvidia-cuda-nvrtc",
            version: "13.0.88",
            sha256: "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
        },
        &["nvidia/cu13/lib/"],
    ),
    (
        PinnedWheel {
            name: "nvidia-nvjitlink",
            version: "13.0.88",
            sha256: "13a74f429e23b921c1109976abefacc69835f2f433ebd323d3946e11d804e47b",
        },
        &["nvidia/cu13/lib/"],
    ),
    (
        PinnedWheel {
            name: "nvidia-cuda-nvcc",
            version: "13.0.88",
            sha256: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
        },
        &["nvidia/cu13/bin/ptxas", "nvidia/cu13/bin/nvlink"],
    ),
    (
        PinnedWheel {
            name: "nvidia-nvvm",
            version: "13.0.88",
            sha256: "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
        },
        &["nvidia/cu13/nvvm/libdevice/"],
    ),
];

/// Files an install must hold, relative to its root: what the plugin and
/// XLA look up by these names.
const REQUIRED: &[&str] = &[
    PLUGIN_IN_WHEEL,
    "nvidia/cu13/lib/libcudart.so.13",
    "nvidia/cu13/lib/libcublas.so.13",
    "nvidia/cu13/lib/libcublasLt.so.13",
    "nvidia/cu13/lib/libnvJitLink.so.13",
    "nvidia/cu13/lib/libnvrtc.so.13",
    "nvidia/cudnn/lib/libcudnn.so.9",
    "nvidia/cu13/bin/ptxas",
    "nvidia/cu13/nvvm/libdevice/libdevice.10.bc",
];

/// Cache layout: `<cache>/<INSTALL_DIR>/` is a `site-packages`-like tree.
const INSTALL_DIR: &str = "jax-cuda13-pjrt-0.12.0.1-cu13.0";

/// A provisioned CUDA plugin with the NVIDIA libraries it loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaInstall {
    /// The install's root (a `site-packages`-like directory).
    pub root: PathBuf,
}

impl CudaInstall {
    /// The plugin shared library.
    pub fn plugin(&self) -> PathBuf {
        self.root.join(PLUGIN_IN_WHEEL)
    }

    /// The CUDA root XLA is pointed at (`xla_gpu_cuda_data_dir`): where it
    /// finds `nvvm/libdevice/libdevice.10.bc` and `bin/ptxas`.
    pub fn cuda_data_dir(&self) -> PathBuf {
        self.root.join("nvidia/cu13")
    }

    /// Loads (and unloads) each NVIDIA library of the install, so that a
    /// library whose own dependencies do not resolve is found here rather
    /// than at the plugin's first use of it; `ptxas` must be executable.
    /// Needs no driver or GPU.
    pub fn verify_loadable(&self) -> Result<(), String> {
        for f in REQUIRED
            .iter()
            .filter(|f| f.contains(".so.") && **f != PLUGIN_IN_WHEEL)
        {
            let path = self.root.join(f);
            // SAFETY: NVIDIA's libraries have no load-time preconditions; the
            // handle is dropped at once and nothing from it is kept.
            unsafe { libloading::Library::new(&path) }
                .map_err(|e| format!("{} does not load: {e}", path.display()))?;
        }
        let ptxas = self.cuda_data_dir().join("bin/ptxas");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&ptxas)
            .map_err(|e| format!("{}: {e}", ptxas.display()))?
            .permissions()
            .mode();
        if mode & 0o100 == 0 {
            return Err(format!("{} is not executable", ptxas.display()));
        }
        Ok(())
    }

    /// The required files that are missing (empty for a complete install).
    pub fn missing(&self) -> Vec<PathBuf> {
        REQUIRED
            .iter()
            .map(|f| self.root.join(f))
            .filter(|p| !p.is_file())
            .collect()
    }
}

/// Options for the CUDA client: the plugin's create options, where set.
/// `None` keeps the plugin's default (preallocate 75% of memory with its
/// BFC allocator, as JAX does).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaOptions {
    /// Fraction of the GPU's memory the client may take, in (0, 1].
    pub memory_fraction: Option<f32>,
    /// Whether that memory is reserved at client creation.
    pub preallocate: Option<bool>,
    /// The allocator: `default`, `platform`, `bfc`, `cuda_async`, `vmm` or `address`.
    pub allocator: Option<String>,
    /// This process's place in a multi-process run (`node_id`, `num_nodes`
    /// and the key-value store the plugin exchanges NCCL ids through).
    pub distributed: Option<super::Distributed>,
}

impl CudaOptions {
    /// The options named by `LAZYFUSE_GPU_MEMORY_FRACTION`,
    /// `LAZYFUSE_GPU_PREALLOCATE` and `LAZYFUSE_GPU_ALLOCATOR`; a value that
    /// does not parse is an `Err` naming the variable.
    pub fn from_env() -> Result<CudaOptions, String> {
        let var = gpu_option;
        let memory_fraction = match var(MEMORY_FRACTION_ENV) {
            None => None,
            Some(v) => Some(v.parse::<f32>().map_err(|_| {
                format!("{MEMORY_FRACTION_ENV}={v:?} is not a number (use e.g. 0.5)")
            })?),
        };
        let preallocate = match var(PREALLOCATE_ENV).as_deref() {
            None => None,
            Some("1" | "true" | "True") => Some(true),
            Some("0" | "false" | "False") => Some(false),
            Some(v) => return Err(format!("{PREALLOCATE_ENV}={v:?}: use 0 or 1")),
        };
        let o = CudaOptions {
            memory_fraction,
            preallocate,
            allocator: var(ALLOCATOR_ENV).map(|v| v.to_ascii_lowercase()),
            distributed: None,
        };
        o.create_options()?;
        Ok(o)
    }

    /// The create options sent to the plugin, checked first so that a bad
    /// value is an `Err` here and never reaches the plugin.
    pub fn create_options(&self) -> Result<Vec<CreateOption>, String> {
        let mut v = vec![CreateOption::new(
            "platform_name",
            NamedValue::Str("cuda".into()),
        )];
        if let Some(f) = self.memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!("GPU memory fraction {f} is not in (0, 1]"));
            }
            v.push(CreateOption::new("memory_fraction", NamedValue::Float(f)));
        }
        if let Some(p) = self.preallocate {
            v.push(CreateOption::new("preallocate", NamedValue::Bool(p)));
        }
        if let Some(a) = &self.allocator {
            if !ALLOCATORS.contains(&a.as_str()) {
                return Err(format!(
                    "GPU allocator {a:?} is not one the plugin knows ({})",
                    ALLOCATORS.join(", ")
                ));
            }
            v.push(CreateOption::new("allocator", NamedValue::Str(a.clone())));
        }
        if let Some(d) = &self.distributed {
            v.extend(d.gpu_create_options()?);
        }
        Ok(v)
    }
}

/// The driver's view, or a sentence naming what is missing (no driver
/// library, `cuInit` failing, no device).
pub fn driver_info() -> Result<super::driver::DriverInfo, String> {
    super::driver::probe().map_err(|p| p.message())
}

/// The GPUs the NVIDIA driver sees, as "name (compute capability x.y)",
/// or the sentence [`crate::Device::cuda`] would fail with: lets tests and
/// tools skip GPU work with a reason, without creating a client.
pub fn visible_gpus() -> Result<Vec<String>, String> {
    let info = driver_info()?;
    Ok(info
        .names
        .iter()
        .map(|(n, major, minor)| format!("{n} (compute capability {major}.{minor})"))
        .collect())
}

/// Debug options a CUDA client compiles with: the CUDA root of `install`
/// (XLA would otherwise look in `/usr/local/cuda` first), and NaN-propagating
/// `max`/`min` in GPU kernels, as on the CPU.
pub fn compile_overrides(install: Option<&CudaInstall>) -> Vec<CompileOverride> {
    let mut v = vec![CompileOverride::Bool(
        "xla_gpu_enable_fast_min_max".into(),
        false,
    )];
    if let Some(i) = install {
        v.push(CompileOverride::Str(
            "xla_gpu_cuda_data_dir".into(),
            i.cuda_data_dir().to_string_lossy().into_owned(),
        ));
    }
    v
}

/// The provisioned CUDA plugin, downloading it (and the NVIDIA libraries it
/// needs) on first use: about 1.1 GB, once per cache directory. Blocking.
/// Works on a machine without a GPU (only running needs one), so it can be
/// provisioned ahead of time.
pub fn provision() -> Result<CudaInstall, ProvisionError> {
    let cache = super::cache_dir()?;
    let install = CudaInstall {
        root: cache.join(INSTALL_DIR),
    };
    if install.root.is_dir() && install.missing().is_empty() {
        return Ok(install);
    }
    static PROVISIONING: Mutex<()> = Mutex::new(());
    let _guard = PROVISIONING.lock().unwrap_or_else(|p| p.into_inner());
    if install.root.is_dir() && install.missing().is_empty() {
        return Ok(install);
    }
    provision_into(&cache, &install).map_err(|e| step(e, &install.root))?;
    Ok(install)
}

/// A provisioning failure, with the ways out.
fn step(what: impl std::fmt::Display, root: &Path) -> ProvisionError {
    ProvisionError::new(format!(
        "could not provision the CUDA PJRT plugin ({}=={} and NVIDIA's CUDA 13 wheels) into {}: \
         {what}\nTo fix this, do one of:\n  \
         - install python3 with pip and make sure PyPI is reachable, then retry;\n  \
         - set {}=/path/to/xla_cuda_plugin.so to use a CUDA PJRT plugin you already have \
         (e.g. from an installed jax-cuda13-pjrt or jax-cuda12-pjrt)",
        PLUGIN_WHEEL.name,
        PLUGIN_WHEEL.version,
        root.display(),
        super::PLUGIN_ENV,
    ))
}

fn provision_into(cache: &Path, install: &CudaInstall) -> Result<(), String> {
    fs::create_dir_all(cache)
        .map_err(|e| format!("cannot create cache directory {}: {e}", cache.display()))?;
    let tmp = TempDir::create_in(cache).map_err(|e| {
        format!(
            "cannot create a temporary directory in {}: {e}",
            cache.display()
        )
    })?;
    tracing::info!(
        cache = %install.root.display(),
        "lazyfuse: downloading the CUDA PJRT plugin ({}=={}) and NVIDIA's CUDA 13 libraries (~1.1 GB) from PyPI; this happens once",
        PLUGIN_WHEEL.name, PLUGIN_WHEEL.version
    );
    let mut wheels = vec![PLUGIN_WHEEL];
    wheels.extend(RUNTIME_WHEELS.iter().map(|(w, _)| *w));
    let files = fetch::download(&wheels, &tmp.path)?;
    let staged = tmp.path.join("site");
    fetch::extract_tree(&files[0], &staged, &[PLUGIN_IN_WHEEL])?;
    for ((_, members), file) in RUNTIME_WHEELS.iter().zip(&files[1..]) {
        fetch::extract_tree(file, &staged, members)?;
        // The wheel is no longer needed: free its space before the next.
        let _ = fs::remove_file(file);
    }
    let check = CudaInstall {
        root: staged.clone(),
    };
    let missing = check.missing();
    if !missing.is_empty() {
        return Err(format!(
            "the wheels unpacked, but these files are missing: {}",
            missing
                .iter()
                .map(|p| p.strip_prefix(&staged).unwrap_or(p).display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if install.root.exists() {
        // An incomplete earlier install (interrupted, or older pins).
        fs::remove_dir_all(&install.root)
            .map_err(|e| format!("cannot remove {}: {e}", install.root.display()))?;
    }
    match fs::rename(&staged, &install.root) {
        Ok(()) => {}
        // Another process finished first: its install is as good.
        Err(_) if install.missing().is_empty() => {}
        Err(e) => {
            return Err(format!(
                "cannot move {} into place at {}: {e}",
                staged.display(),
                install.root.display()
            ))
        }
    }
    tracing::info!(path = %install.root.display(), "lazyfuse: CUDA PJRT plugin installed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_typed_and_checked() {
        let o = CudaOptions {
            memory_fraction: Some(0.5),
            preallocate: Some(false),
            allocator: Some("bfc".into()),
            distributed: None,
        };
        let v = o.create_options().unwrap();
        assert_eq!(
            v[0],
            CreateOption::new("platform_name", NamedValue::Str("cuda".into()))
        );
        assert!(v.contains(&CreateOption::new(
            "memory_fraction",
            NamedValue::Float(0.5)
        )));
        assert!(v.contains(&CreateOption::new("preallocate", NamedValue::Bool(false))));
        assert!(v.contains(&CreateOption::new(
            "allocator",
            NamedValue::Str("bfc".into())
        )));
        let bad = CudaOptions {
            memory_fraction: Some(1.5),
            ..CudaOptions::default()
        };
        assert!(bad.create_options().unwrap_err().contains("(0, 1]"));
        let bad = CudaOptions {
            allocator: Some("mine".into()),
            ..CudaOptions::default()
        };
        assert!(bad.create_options().unwrap_err().contains("cuda_async"));
        assert_eq!(CudaOptions::default().create_options().unwrap().len(), 1);
    }

    #[test]
    fn every_required_file_comes_from_a_pinned_wheel() {
        for f in REQUIRED {
            let from_plugin = *f == PLUGIN_IN_WHEEL;
            let from_runtime = RUNTIME_WHEELS
                .iter()
                .any(|(_, members)| members.iter().any(|m| f.starts_with(m)));
            assert!(from_plugin || from_runtime, "{f} is unpacked from no wheel");
        }
    }
}
