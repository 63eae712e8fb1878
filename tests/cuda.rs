//! `Device::cuda`: the missing-GPU error, option checks, and (opt-in, it
//! downloads about 1.1 GB) provisioning the CUDA plugin into a clean cache.
//!
//! Tests that need a GPU print why they are skipped where none is present;
//! on a machine with one they run a program on it and compare it with the
//! reference interpreter. Tests that set `LAZYFUSE_CACHE` hold one lock, so
//! they never see each other's cache.

use lazyfuse::xla::plugin::cuda::{self, CudaOptions};
use lazyfuse::{DType, Device, Tensor};
use std::path::PathBuf;

/// Serialises the tests that set `LAZYFUSE_CACHE` (the environment is
/// process-wide and the provisioner reads it at every call).
fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// A scratch directory under the target directory, removed first.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn cuda_device_or_one_clear_error() {
    let _env = env_lock();
    match cuda::visible_gpus() {
        Err(reason) => {
            // No GPU: one Err naming what is missing, and nothing fetched.
            let cache = scratch("cuda_no_gpu_cache");
            std::env::set_var("LAZYFUSE_CACHE", &cache);
            let e = Device::cuda(0).unwrap_err().to_string();
            eprintln!("Device::cuda(0) without a GPU: {e}");
            assert!(e.contains(&reason), "{e}");
            assert!(
                e.contains("libcuda.so.1") || e.contains("cuInit") || e.contains("no CUDA device"),
                "the error must name what is missing: {e}"
            );
            assert_eq!(
                std::fs::read_dir(&cache).unwrap().count(),
                0,
                "nothing may be downloaded on a machine without a GPU"
            );
            // The same answer every time, from every thread.
            let again = std::thread::spawn(|| Device::cuda(1).unwrap_err().to_string())
                .join()
                .unwrap();
            assert!(again.contains(&reason), "{again}");
        }
        Ok(gpus) => {
            eprintln!("GPUs: {gpus:?}");
            let dev = Device::cuda(0).unwrap();
            assert_eq!(format!("{dev:?}"), "cuda:0");
            // The same program on the GPU and on the reference interpreter.
            let program = |d: &Device| -> f32 {
                let x = Tensor::arange(0.0, 12.0, DType::F32, d).unwrap();
                let y = x.exp().and_then(|e| e.mul(0.5)).unwrap();
                y.sum([-1], false).unwrap().item::<f32>().unwrap()
            };
            let (g, w) = (program(&dev), program(&Device::interpreter()));
            assert!((g - w).abs() <= 1e-5 * w.abs(), "{g} vs {w}");
            let n = gpus.len();
            let e = Device::cuda(n).unwrap_err().to_string();
            assert!(e.contains("does not exist"), "{e}");
        }
    }
}

#[test]
fn bad_options_are_errs_before_anything_loads() {
    let bad = CudaOptions {
        memory_fraction: Some(0.0),
        ..CudaOptions::default()
    };
    let e = Device::cuda_with(0, &bad).unwrap_err().to_string();
    assert!(e.contains("memory fraction 0 is not in (0, 1]"), "{e}");
    let bad = CudaOptions {
        allocator: Some("arena".into()),
        ..CudaOptions::default()
    };
    let e = Device::cuda_with(0, &bad).unwrap_err().to_string();
    assert!(e.contains("\"arena\"") && e.contains("bfc"), "{e}");
}

/// Downloads the pinned plugin and NVIDIA wheels into a fresh cache (about
/// 1.1 GB, so only with `LAZYFUSE_TEST_CUDA_PROVISION=1`), checks every
/// file the plugin loads is in place, and loads the plugin. Without a GPU
/// its client then fails with the plugin's own error, never an abort.
#[test]
fn provisioning_from_a_clean_cache() {
    if std::env::var("LAZYFUSE_TEST_CUDA_PROVISION").as_deref() != Ok("1") {
        eprintln!(
            "skipped provisioning_from_a_clean_cache: it downloads about 1.1 GB; set \
             LAZYFUSE_TEST_CUDA_PROVISION=1 to run it"
        );
        return;
    }
    let _env = env_lock();
    let cache = scratch("cuda_provision_cache");
    // The provisioner reads the cache root at call time; this test is the
    // only one that runs with the variable pointing here.
    std::env::set_var("LAZYFUSE_CACHE", &cache);
    let t0 = std::time::Instant::now();
    let install = cuda::provision().unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "provisioned {} in {:.1?}",
        install.root.display(),
        t0.elapsed()
    );
    assert!(install.root.starts_with(&cache));
    assert_eq!(install.missing(), Vec::<PathBuf>::new());
    install.verify_loadable().unwrap();
    // Provisioning again is a lookup.
    let t1 = std::time::Instant::now();
    assert_eq!(cuda::provision().unwrap(), install);
    assert!(t1.elapsed().as_secs() < 5);

    let plugin = lazyfuse::xla::pjrt::Plugin::load(&install.plugin()).unwrap();
    // A newer plugin than the CPU one (whose header the binding is generated
    // from): same major version, a later minor, and it loads.
    let (major, minor) = plugin.api_version();
    eprintln!("plugin API version {major}.{minor}");
    assert!(major == 0 && minor >= 81, "{major}.{minor}");
    // The multi-process options, typed as the plugin validates them
    // (`node_id`, `num_nodes` Int64) with the key-value callbacks: the
    // plugin accepts them and fails only where every client fails without
    // a GPU (a wrong type would be its "type mismatch" error instead).
    let distributed = CudaOptions {
        distributed: Some(lazyfuse::Distributed::new(
            0,
            2,
            std::sync::Arc::new(lazyfuse::InMemoryKeyValueStore::new()),
        )),
        ..CudaOptions::default()
    };
    let with_store = lazyfuse::xla::pjrt::Client::with_store(
        plugin.clone(),
        &distributed.create_options().unwrap(),
        &[],
        distributed.distributed.as_ref().map(|d| d.store.clone()),
    );
    if cuda::visible_gpus().is_err() {
        let e = with_store.expect_err("a client without a GPU");
        assert!(e.to_string().contains("No visible GPU devices"), "{e}");
    }
    let created = lazyfuse::xla::pjrt::Client::with_options(
        plugin,
        &CudaOptions::default().create_options().unwrap(),
        &[],
    );
    match (cuda::visible_gpus(), created) {
        (Err(_), Err(e)) => {
            eprintln!("client without a GPU: {e}");
            assert!(e.to_string().contains("No visible GPU devices"), "{e}");
        }
        (Ok(_), Ok(c)) => assert!(c.addressable_device_count() >= 1),
        (gpus, c) => panic!("driver says {gpus:?}, client creation says {:?}", c.err()),
    }
    // 1.7 GB unpacked: give the space back.
    let _ = std::fs::remove_dir_all(&cache);
}
